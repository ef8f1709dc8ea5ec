"""FP8 attention (`backend="fp8"`): Q, K, V in float8_e4m3 with fp32 scales, both products on FP8 inputs with
fp32 accumulation, the softmax in fp32. Lossy, so `auto` never picks it.

Scales (all from `fp8.quantize`, absmax / 448, computed by `fp8_attention_format.quantize_qkv`; on CUDA by
its fused twin `parallel.fp8_qkv_kernel`, the same bytes, so the kernel and the emulation read alike):
- Q one per (batch, head, token): a row scale costs the kernel nothing (it multiplies S's rows with the
  softmax scale) and a token's scale never depends on which rank holds it;
- K one per (batch, head, block of KEY_BLOCK keys): one scalar per S tile; keys the mask drops count as 0;
- V one per (batch, head, channel) over the keys: it leaves P·V's sum and scales the output's columns;
- P (in [0, 1] after the running max) is taken times the fixed 448 before its cast, so small weights keep
  e4m3's mantissa instead of flushing to 0: log2(448) comes off the max in the exponent (no multiply per
  weight); the row sum comes from that fp32 P, times 1/448.

`emulate` is the specification: the kernel's online softmax step for step (one step per key block, exp2
with log2(e) folded into the scales, P quantised against the running max), in plain torch. CUDA tensors run
the Triton kernel (`parallel.fp8_attention_kernel`); elsewhere the emulation runs (as slow as `math`: it is
the CPU path of the tests and the quality tables, not a fast path).
"""

from __future__ import annotations

import math

import torch

from parallel.e4m3 import FP8
from parallel.fp8_attention_format import KEY_BLOCK, LOG2E, P_SCALE, QuantisedQKV, quantize_qkv


def _keep(key_mask, causal, Sq, start, stop, device):
    """bool [B or 1, 1, Sq, n] of the keys start:stop each query may see, or None for all."""
    keep = None
    if key_mask is not None:
        keep = key_mask[:, None, None, start:stop]
    if causal:
        seen = torch.arange(Sq, device=device)[:, None] >= torch.arange(start, stop, device=device)
        keep = seen if keep is None else keep & seen
    return keep


def emulate(z: QuantisedQKV, Sk: int, key_mask=None, causal=False, dtype=torch.float32, mma_bits: int = 23):
    """The kernel's arithmetic in torch: (out [B, Sq, H, D] in `dtype`, lse [B, Sq, H] fp32, natural log).
    `mma_bits` < 23 models the kernel without two-level accumulation: the running output truncated to that
    many mantissa bits after each block, as an FP8 MMA accumulator keeps them (Hopper's: 13, SageAttention2
    measured)."""
    B, H, Sq, D = z.q.shape
    q, k, v_t = z.q.float(), z.k.float(), z.v_t.float()  # widened once: slices of e4m3 widen slowly
    row_scale = z.q_scale * (D**-0.5 * LOG2E)  # S in log2 units, as the kernel's exp2 wants it
    m = q.new_full((B, H, Sq), float("-inf"))
    row_sum = q.new_zeros(B, H, Sq)
    acc = q.new_zeros(B, H, Sq, D)
    for j, start in enumerate(range(0, Sk, KEY_BLOCK)):
        stop = min(start + KEY_BLOCK, Sk)
        s = (q @ k[:, :, start:stop].transpose(-1, -2)) * (row_scale * z.k_scale[..., j, None])[..., None]
        keep = _keep(key_mask, causal, Sq, start, stop, q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # no key yet: exp2(-inf) = 0, not NaN
        p8 = torch.exp2(s - (m_safe - math.log2(P_SCALE))[..., None])  # P · P_SCALE: log2 of it off the max
        alpha = torch.exp2(m - m_safe)
        row_sum = row_sum * alpha + p8.sum(-1) * (1 / P_SCALE)
        pv = p8.to(FP8).float() @ v_t[..., start:stop].transpose(-1, -2)
        acc = acc * alpha[..., None] + pv
        if mma_bits < 23:
            acc = (acc.view(torch.int32) & -(1 << (23 - mma_bits))).view(torch.float32)
        m = m_new
    l_safe = row_sum.masked_fill(row_sum == 0, 1.0)  # a query with no key left: out 0, lse -inf
    out = acc / l_safe[..., None] * (z.v_scale * (1 / P_SCALE))[:, :, None, :]
    lse = (m + torch.log2(row_sum)) * math.log(2)
    return out.transpose(1, 2).to(dtype), lse.transpose(1, 2)


def fp8_attention(q, k, v, *, key_mask=None, causal=False):
    """`local_attention` for backend="fp8": (out [B, Sq, H, D] in q's dtype, lse [B, Sq, H] fp32)."""
    if q.is_cuda:  # inside torch.compile, dynamo captures the Triton kernels as they are
        from parallel import fp8_attention_kernel, fp8_qkv_kernel  # Triton: CUDA builds of torch only

        z = fp8_qkv_kernel.quantize_qkv(q, k, v, key_mask)
        return fp8_attention_kernel.attend(z, k.shape[1], key_mask, causal, q.dtype)
    return emulate(quantize_qkv(q, k, v, key_mask), k.shape[1], key_mask, causal, q.dtype)
