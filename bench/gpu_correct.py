"""The GPU kit's correctness sections: each check is an error figure against an independent reference and a
limit. Heavy imports (dit, diffusers, the server) happen inside the sections, so a missing package skips the
sections that need it and no other."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time

import torch

from bench.common import rel_diff
from bench.gpu_kit import Kit, Report, Skip, fmt
from parallel import fp8, local_attention
from parallel.kernels import flash_attn_func

TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-3}  # relative, vs float64 attention
NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
# (name, key mask, causal, LSE): the calls the DiTs (mask: joint text) and the ring (LSE, causal) make
CASES = (
    ("plain", False, False, False),
    ("key mask", True, False, False),
    ("causal", False, True, False),
    ("causal + key mask", True, True, False),
    ("LSE", False, False, True),
    ("LSE + key mask", True, False, True),
    ("LSE causal", False, True, True),
)


def attention_reference(q, k, v, key_mask, causal):
    """softmax(q kᵀ/√D) v and its log-sum-exp in float64 on the CPU, written out here (not the kernels'
    `math` path, which is one of the backends under test)."""
    q, k, v = (t.detach().cpu().double().transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(s.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if key_mask is not None:
        allowed = allowed & key_mask.cpu()[:, None, None, :]
    s = s.masked_fill(~allowed, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2), s.logsumexp(-1).transpose(1, 2)


def attention_backends(kit: Kit) -> list[str]:
    if not kit.cuda:
        return ["sdpa", "math"]
    return (["flash"] if flash_attn_func is not None else []) + ["cudnn", "sdpa", "math"]


def _case_inputs(kit: Kit, g: torch.Generator, shape, dtype, masked: bool):
    """q, k, v of `shape` and, when `masked`, random real keys (the first always real: causal rows keep
    one)."""
    q, k, v = (torch.randn(*shape, generator=g, device=kit.device, dtype=dtype) for _ in "qkv")
    mask = None
    if masked:
        mask = torch.rand(shape[:2], generator=g, device=kit.device) < 0.7
        mask[:, 0] = True
    return q, k, v, mask


def attention(kit: Kit, report: Report) -> None:
    """`parallel.local_attention` on every backend present, per dtype and case, vs float64."""
    B, S, H, D = kit.pick((2, 300, 4, 64), (2, 40, 2, 16))
    g = torch.Generator(device=kit.device).manual_seed(0)
    for backend in attention_backends(kit):
        for dtype in (torch.bfloat16, torch.float32):
            for case, masked, causal, lse in CASES:
                what = f"{backend} {NAMES[dtype]} {case}"
                if backend == "flash" and dtype == torch.float32:
                    report.skip_check(what, "flash-attn takes fp16/bf16 only")
                    continue
                q, k, v, mask = _case_inputs(kit, g, (B, S, H, D), dtype, masked)
                got = local_attention(q, k, v, key_mask=mask, causal=causal, backend=backend, return_lse=lse)
                want_out, want_lse = attention_reference(q, k, v, mask, causal)
                err = rel_diff(got[0], want_out) if lse else rel_diff(got, want_out)
                if lse:
                    err = max(err, rel_diff(got[1], want_lse))
                report.check(what + (" (out and LSE)" if lse else ""), err, TOL[dtype])
    if "flash" not in attention_backends(kit):
        report.note("flash-attn is not installed: its rows are absent (auto uses cuDNN on Hopper).")


def fp8_attention(kit: Kit, report: Report) -> None:
    """backend fp8 (e4m3 Q, K, V and P) per case vs float64, and on CUDA the Triton kernel vs the emulation
    of the same quantised bytes (only fp32 summation order and exp2's rounding differ)."""
    from parallel.fp8_attention import emulate
    from parallel.fp8_attention_format import quantize_qkv

    B, S, H, D = kit.pick((2, 300, 4, 64), (2, 40, 2, 16))
    g = torch.Generator(device=kit.device).manual_seed(0)
    for case, masked, causal, lse in CASES:
        q, k, v, mask = _case_inputs(kit, g, (B, S, H, D), torch.bfloat16, masked)
        out, got_lse = local_attention(q, k, v, key_mask=mask, causal=causal, backend="fp8", return_lse=True)
        want_out, want_lse = attention_reference(q, k, v, mask, causal)
        err = max(rel_diff(out, want_out), rel_diff(got_lse, want_lse) if lse else 0.0)
        report.check(f"fp8 bf16 {case} vs float64" + (" (out and LSE)" if lse else ""), err, 0.08)
        if not kit.cuda:
            continue
        from parallel import fp8_attention_kernel, fp8_qkv_kernel

        z = quantize_qkv(q, k, v, mask)
        fused = fp8_qkv_kernel.quantize_qkv(q, k, v, mask)
        differ = sum(_bytes(getattr(fused, f.name)).ne(_bytes(getattr(z, f.name))).sum().item()
                     for f in dataclasses.fields(z))  # fmt: skip
        report.check(f"fused (Triton) vs torch Q/K/V quantiser, {case}: bytes that differ", differ, 0)
        kernel = fp8_attention_kernel.attend(z, S, mask, causal, torch.float32)
        emulated = emulate(z, S, mask, causal, torch.float32)
        err = max(rel_diff(a, b) for a, b in zip(kernel, emulated, strict=True))
        report.check(f"fp8 Triton kernel vs its emulation, {case} (out and LSE)", err, 1e-3)
    if not kit.cuda:
        report.skip_check("fp8 Triton kernel (and fused quantiser) vs the emulation", "the kernels need CUDA")
        return
    _fp8_accumulation(kit, report, g)


def _fp8_accumulation(kit: Kit, report: Report, g: torch.Generator, S: int = 32760) -> None:
    """The kernel vs its emulation over Wan2.1-14B's 32760 keys (256 key blocks), V with a mean of 1 so the
    output grows as every block adds to it: with two-level accumulation (the default) each block's P·V
    reaches the fp32 output as the emulation adds it; with the MMA's own, the output passes through the FP8
    accumulator 256 times: compared also with the emulation's model of a 13-bit one
    (bench/fp8_accumulation.py)."""
    from parallel import fp8_attention_kernel
    from parallel.fp8_attention import emulate
    from parallel.fp8_attention_format import quantize_qkv

    q, k, v, _ = _case_inputs(kit, g, (1, S, 2, 128), torch.bfloat16, False)
    z = quantize_qkv(q, k, v + 1)
    exact, model = (emulate(z, S, dtype=torch.float32, mma_bits=bits)[0] for bits in (23, 13))
    two_level = fp8_attention_kernel.attend(z, S, dtype=torch.float32)[0]
    report.check(f"fp8 Triton kernel vs its emulation, S={S}, two-level", rel_diff(two_level, exact), 1e-3)
    mma = fp8_attention_kernel.attend(z, S, dtype=torch.float32, two_level=False)[0]
    report.note(
        f"fp8 Triton kernel at S={S} with the MMA's accumulation: {rel_diff(mma, exact):.2e} from the "
        f"emulation (signed mean {((mma - exact).sum() / exact.abs().sum()).item():+.2e}), "
        f"{rel_diff(mma, model):.2e} from its 13-bit accumulator model"
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def fp8_wire(kit: Kit, report: Report) -> None:
    """The FP8 wire format on one rank's Wan-14B QKV send buffer at P=8: fused vs eager, round trip; then the
    FP8 layer's input quantiser (Triton vs torch) and its GEMM (bench/fp8_linear.py's rows)."""
    shape = kit.pick((8, 3, 1, 4095, 5, 128), (8, 3, 1, 16, 1, 32))  # pack_qkv's [P, 3, B, L, H/P, D]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(kit.device, kit.dtype)
    eager = fp8.pack(x, compiled=False)
    back = fp8.unpack(eager, x.shape, torch.float32)
    err = rel_diff(back, x)
    report.check(f"round trip ‖unpack(pack(x)) − x‖/‖x‖, {NAMES[kit.dtype]} on {kit.device.type}", err, 0.05)
    cpu = rel_diff(fp8.unpack(fp8.pack(x.cpu()), x.shape, torch.float32), x.cpu())
    report.check(f"round trip here vs on the CPU ({cpu:.4f}): |difference|", abs(err - cpu), 1e-3)
    if not kit.cuda:
        report.skip_check("fused vs eager pack", "fp8.pack fuses CUDA tensors only")
        report.skip_check("FP8 layer input quantiser, Triton vs torch", "the kernel needs CUDA")
    else:
        fused = fp8.pack(x, compiled=True)
        differ = (fused != eager).sum().item()  # counted exactly: the Triton kernel gives the eager bytes
        report.check(f"fused (Triton) vs eager pack: bytes that differ, of {eager.numel()}", differ, 0)
        _fp8_layer_input(kit, report)
    _fp8_gemm(kit, report)


def _fp8_gemm(kit: Kit, report: Report) -> None:
    """bench/fp8_linear.py's `_scaled_mm` rows at the 14B FFN's first layer (32760 tokens): the GEMM with and
    without fast accumulation, and with the input's quantisation, beside bf16."""
    from bench.fp8_linear import rows_for

    k, n, m = kit.pick((5120, 13824, 32760), (80, 216, 64))
    rows = rows_for("ffn up", k, n, m, kit.device, kit.pick(10, 1), others=False)
    cells = [[r["variant"], f"{r['ms']:.3f}", fmt(r["tflops"]), f"{r['error']:.2e}"] if "ms" in r
             else [r["variant"], r["note"], "–", "–"] for r in rows]  # fmt: skip
    report.table(
        f"FP8 GEMM, {m} × {k} → {n}: ‖y − fp32 product‖/‖·‖", ["variant", "ms", "TFLOP/s", "error"], cells
    )


def _fp8_layer_input(kit: Kit, report: Report) -> None:
    """An FP8 layer's per-token input quantiser (dit.fp8_linear) at the 14B FFN's input, 32760 × 5120 bf16:
    the Triton kernel eager layers run against the torch ops, byte for byte, and both timed."""
    from dit import fp8_rows_kernel
    from dit.fp8_linear import quantise_rows

    x = torch.randn(32760, 5120, generator=torch.Generator().manual_seed(1)).to(kit.device, torch.bfloat16)
    (q, scale), (want_q, want_scale) = fp8_rows_kernel.quantise_rows(x), quantise_rows(x)
    differ = (q.view(torch.uint8) != want_q.view(torch.uint8)).sum() + (scale != want_scale).sum()
    report.check("FP8 layer input quantiser, Triton vs torch: bytes and scales that differ", differ.item(), 0)
    quantisers = (("torch", quantise_rows), ("Triton", fp8_rows_kernel.quantise_rows))
    timed = {name: kit.time(lambda f=f: f(x), warmup=3, iters=10)[0] * 1e3 for name, f in quantisers}
    report.note(
        f"FP8 layer input quantiser at 32760 × 5120 bf16: torch {timed['torch']:.3f} ms, Triton "
        f"{timed['Triton']:.3f} ms (an eager layer runs the Triton one; a compiled one Inductor's fusion)"
    )


def _vs_diffusers(report: Report, name: str, build, kit: Kit) -> None:
    """`build(dtype)` → (diffusers' forward, ours), argument-free closures over the same weights and inputs.
    Ours in the kit's dtype vs diffusers in float32 (the reference), beside diffusers' own error there."""
    with torch.inference_mode():
        ref, ours = build(kit.dtype)
        want = ref() if kit.dtype == torch.float32 else build(torch.float32)[0]()
        own, err = rel_diff(ref(), want), rel_diff(ours(), want)
    low = NAMES[kit.dtype]
    limit = max(2 * own, 1e-4 if kit.dtype == torch.float32 else 1e-2)
    report.check(
        f"{name}: ours {low} vs diffusers fp32 (diffusers {low}: {own:.2e}; limit max(2×that, tol))",
        err,
        limit,
    )


def models(kit: Kit, report: Report) -> None:
    """Wan and HunyuanVideo-1.5 forwards at small configs vs diffusers' models with the same weights."""
    from bench.forward import SMALL, diffusers_model, ours_from, wan_inputs
    from bench.hunyuan import SMALL as HY_SMALL
    from bench.hunyuan import hunyuan_inputs
    from bench.hunyuan import models as hunyuan_models
    from dit.hunyuan.config import PRESETS as HY_PRESETS
    from dit.presets import PRESETS

    dev = kit.device
    wan_cfg = kit.pick(SMALL, PRESETS["tiny-random"])
    wan_size = kit.pick((17, 128, 128, 64), (5, 32, 32, 16))

    def wan(dtype):
        ref = diffusers_model(wan_cfg, dtype, dev, seed=0)
        ours = ours_from(ref, wan_cfg, dtype, dev)
        inputs = tuple(t.to(dtype) for t in wan_inputs(ref.config, *wan_size, dev, torch.float32)[0])
        return lambda: ref(*inputs, return_dict=False)[0], lambda: ours(*inputs)

    _vs_diffusers(report, "Wan", wan, kit)
    hy_cfg = kit.pick(HY_SMALL, HY_PRESETS["tiny-joint"])
    hy_size = kit.pick((9, 128, 128, 64, 24), (5, 64, 64, 16, 8))

    def hunyuan(dtype):
        ref, ours = hunyuan_models(hy_cfg, dtype, dev)
        inputs = hunyuan_inputs(hy_cfg, *hy_size, dev, torch.float32)[0]
        kw = {k: t.to(dtype) if t.is_floating_point() else t for k, t in inputs.items()}
        return lambda: ref(**kw, return_dict=False)[0], lambda: ours(**kw)

    _vs_diffusers(report, "HunyuanVideo-1.5", hunyuan, kit)


def pipeline(kit: Kit, report: Report) -> None:
    """The tiny pipeline end to end here vs the same request on the CPU (float32 both)."""
    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline

    req = GenerationRequest(
        "a red fox running through snow", num_frames=9, height=64, width=64, num_inference_steps=4
    )
    runs = {}
    # cuDNN convolutions (the patch embedding, the VAE) default to TF32 on CUDA: off here, so the check
    # compares float32 with float32
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for device in dict.fromkeys([kit.device.type, "cpu"]):
            pipe = load_pipeline(PipelineConfig(model="tiny", device=device))
            latents = pipe.denoise(req)
            runs[device] = latents, pipe.decode(latents)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    (lat, frames), (lat_cpu, frames_cpu) = runs[kit.device.type], runs["cpu"]
    report.check(f"tiny pipeline on {kit.device.type}: final latents vs CPU", rel_diff(lat, lat_cpu), 1e-4)
    diff = (torch.from_numpy(frames).int() - torch.from_numpy(frames_cpu).int()).abs()
    report.check(
        f"decoded frames {tuple(frames.shape)} vs CPU: mean |Δ| in uint8 levels",
        diff.float().mean().item(),
        0.5,
    )


def serve(kit: Kit, report: Report) -> None:
    """`ithaca serve --device D --nproc 1` (real uvicorn, a 1-rank worker group, the tiny model) answers one
    job with an MP4."""
    missing = [
        m
        for m in ("fastapi", "uvicorn", "python_multipart", "imageio_ffmpeg")
        if not importlib.util.find_spec(m)
    ]
    if missing:
        raise Skip(f"{', '.join(missing)} not installed")
    from testing.server_process import ServerProcess

    start = time.monotonic()
    srv = ServerProcess(
        kit.tmp / "serve", "--device", kit.device.type, "--nproc", "1", "--log-level", "warning"
    )
    try:
        srv.wait(timeout=min(180.0, max(30.0, kit.left() - 30)))
        ready = time.monotonic()
        job = srv.submit(
            prompt="a paper boat on a pond", num_inference_steps=2, num_frames=5, height=32, width=32
        )
        done = srv.wait_job(job["id"], timeout=120)
        finished = time.monotonic()
        video = srv.client.get(f"/jobs/{job['id']}/video")
    finally:
        srv.stop()
    # each a resolver timeout spent at start where DNS does not answer (README, "Start-up without DNS")
    lookups = sum(srv.log().count(w) for w in ("cannot be retrieved", "Unable to resolve hostname"))
    report.expect(f"job {done['status']}", done["status"] == "completed", done.get("error") or "")
    mp4 = video.status_code == 200 and video.content[4:8] == b"ftyp"
    report.expect("GET /jobs/ID/video is an MP4", mp4, f"HTTP {video.status_code}")
    report.table(
        "tiny model, 5×32×32, 2 steps",
        ["start → /ready s", "submit → completed s", "MP4 bytes", "host-name lookups that failed"],
        [[f"{ready - start:.1f}", f"{finished - ready:.2f}", len(video.content), lookups]],
    )
