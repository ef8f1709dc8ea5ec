"""cuDNN's own FP8 attention (NVIDIA's cudnn-frontend, PyPI `nvidia-cudnn-frontend`), the first choice issue
27 names, timed in bench/gpu.py beside our Triton kernel: a bench row, not a backend, until a GPU says
whether it serves. cuDNN's FP8 SDPA takes one descale per tensor, so Q, K and V are quantised per tensor
(ours: Q per token, K per block of keys, V per channel); P is scaled by 448 into e4m3 as ours is; fp32
softmax and accumulation; bf16 out. No mask, no LSE here (what the ring and padded texts would also need).
CUDA only: the frontend's graph runs on cuDNN's engines."""

from __future__ import annotations

import torch

from parallel.e4m3 import FP8, FP8_MAX

# the graph's tensors: Q, K, V, the output, their descales and the P (softmax output) scales, O's amax
Q, K, V, OUT, DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O, AMAX_O = range(11)


def per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x → (e4m3 x / scale, the fp32 scale `[1, 1, 1, 1]` = absmax / 448)."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp_min(1e-12).view(1, 1, 1, 1)
    return (x.float() / scale).to(FP8), scale


class CudnnFp8Attention:
    """softmax(q kᵀ/√D) v of `[B, S, H, D]` tensors of one shape, through one built cuDNN graph."""

    def __init__(self, shape: tuple[int, int, int, int], device: torch.device):
        import cudnn  # only where it travelled as a wheel (scripts/gpu_wheels.sh)

        B, S, H, D = shape
        fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32)
        stride = (S * H * D, D, H * D, 1)  # our [B, S, H, D] memory as cuDNN's [B, H, S, D] dims

        def scalar(uid):
            return g.tensor(uid=uid, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)

        q, k, v = (g.tensor(uid=uid, dim=(B, H, S, D), stride=stride, data_type=fp8) for uid in (Q, K, V))
        o, _stats, _amax_s, amax_o = g.sdpa_fp8(
            q=q, k=k, v=v, descale_q=scalar(DESCALE_Q), descale_k=scalar(DESCALE_K),
            descale_v=scalar(DESCALE_V), descale_s=scalar(DESCALE_S), scale_s=scalar(SCALE_S),
            scale_o=scalar(SCALE_O), generate_stats=False, attn_scale=D**-0.5, use_causal_mask=False,
        )  # fmt: skip
        o.set_uid(OUT).set_output(True).set_dim((B, H, S, D)).set_stride(stride)
        o.set_data_type(cudnn.data_type.BFLOAT16)
        amax_o.set_uid(AMAX_O).set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1))
        amax_o.set_data_type(f32)
        g.build([cudnn.heur_mode.A])
        self.graph, self.shape, self.device = g, shape, device
        self.workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=device)
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream(device).cuda_stream)
        one = lambda value: torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=device)  # noqa: E731
        self.fixed = {DESCALE_S: one(1 / FP8_MAX), SCALE_S: one(FP8_MAX), SCALE_O: one(1.0)}
        self.amax = one(0.0)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """bf16 `[B, S, H, D]` out; the per-tensor quantise runs each call (it is part of the cost)."""
        (qp, qs), (kp, ks), (vp, vs) = (per_tensor(t) for t in (q, k, v))
        out = torch.empty(self.shape, dtype=torch.bfloat16, device=self.device)
        pack = {Q: qp, K: kp, V: vp, OUT: out, DESCALE_Q: qs, DESCALE_K: ks, DESCALE_V: vs, AMAX_O: self.amax}
        self.graph.execute(pack | self.fixed, self.workspace, handle=self.handle)
        return out
