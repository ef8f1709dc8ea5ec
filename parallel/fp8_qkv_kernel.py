"""`fp8_attention_format.quantize_qkv` as Triton kernels on CUDA, for FP8 attention's every call.

The torch quantiser is a dozen elementwise passes over fp32 copies of Q, K and V (cast, abs, max, divide,
cast, transpose): about 5 GB of memory traffic at Wan2.1-14B's S=32760 and 40 heads by count (bench/gpu.py
times both), beside an attention of ~25 ms at the 900 TFLOP/s target. Here each tensor is read once in its
model dtype (V twice: its per-channel scales span every key) and written once as e4m3 in the attention
kernel's layout. Bitwise equal to the torch quantiser: the same fp32 absmax, scale (absmax times the fp32
1/448, at least 1e-12), correctly rounded division and round-to-nearest-even cast. Imported only on CUDA;
under TRITON_INTERPRET=1 the tests run it on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parallel.e4m3 import FP8, FP8_MAX
from parallel.e4m3_kernel import interpreted, to_e4m3
from parallel.fp8_attention_format import KEY_BLOCK, QuantisedQKV
from parallel.fp8_attention_kernel import check_device

ROWS = 32  # Q rows (tokens) and V keys per program
# float arguments constexpr: fp8_attention_kernel says why


@triton.jit
def _load_rows(x_ptr, mask_ptr, b, h, s, cols, S, D, x_sb, x_ss, x_sh, mask_sb, HAS_MASK: tl.constexpr):
    """x[b, s, h, :D] as fp32 [len(s), BLOCK_D]: 0 past S or D, and for keys the mask drops."""
    keep = s < S
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b * mask_sb + s, mask=s < S, other=0) != 0)
    at = x_ptr + b * x_sb + h * x_sh + s.to(tl.int64)[:, None] * x_ss + cols[None, :]
    return tl.load(at, mask=keep[:, None] & (cols < D)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _quantise_q(x_ptr, out_ptr, scale_ptr, H, S, D, x_sb, x_ss, x_sh, inverse_max: tl.constexpr,
                ROUND: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """One scale per (token, head): out [B, H, S, D], scales [B, H, S]."""
    bh = tl.program_id(1).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    x = _load_rows(x_ptr, x_ptr, bh // H, bh % H, s, cols, S, D, x_sb, x_ss, x_sh, 0, False)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) * inverse_max, 1e-12)
    q = to_e4m3(tl.math.div_rn(x, scale[:, None]), ROUND)
    tl.store(
        out_ptr + (bh * S + s)[:, None] * D + cols[None, :], q, mask=(s < S)[:, None] & (cols < D)[None, :]
    )
    tl.store(scale_ptr + bh * S + s, scale, mask=s < S)


@triton.jit
def _quantise_k(x_ptr, mask_ptr, out_ptr, scale_ptr, H, S, D, x_sb, x_ss, x_sh, mask_sb,
                inverse_max: tl.constexpr, HAS_MASK: tl.constexpr, ROUND: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr):  # fmt: skip
    """One scale per head and block of BLOCK_N keys: out [B, H, n_blocks·BLOCK_N, D] (zero past S), scales
    [B, H, n_blocks]."""
    bh = tl.program_id(1).to(tl.int64)
    j = tl.program_id(0)
    s = j * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    x = _load_rows(x_ptr, mask_ptr, bh // H, bh % H, s, cols, S, D, x_sb, x_ss, x_sh, mask_sb, HAS_MASK)
    scale = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0) * inverse_max, 1e-12)
    q = to_e4m3(tl.math.div_rn(x, scale), ROUND)
    rows = bh * tl.num_programs(0) * BLOCK_N + s
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], q, mask=(cols < D)[None, :])
    tl.store(scale_ptr + bh * tl.num_programs(0) + j, scale)


@triton.jit
def _v_amax(x_ptr, mask_ptr, out_ptr, H, S, D, x_sb, x_ss, x_sh, mask_sb, HAS_MASK: tl.constexpr,
            BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Each channel's absmax over one span of BLOCK_S keys: out [B, H, n_spans, D]."""
    bh = tl.program_id(1).to(tl.int64)
    span = tl.program_id(0)
    s = span * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    x = _load_rows(x_ptr, mask_ptr, bh // H, bh % H, s, cols, S, D, x_sb, x_ss, x_sh, mask_sb, HAS_MASK)
    at = out_ptr + (bh * tl.num_programs(0) + span) * D + cols
    tl.store(at, tl.max(tl.abs(x), axis=0), mask=cols < D)


@triton.jit
def _quantise_v(x_ptr, mask_ptr, scale_ptr, out_ptr, H, S, D, x_sb, x_ss, x_sh, mask_sb,
                HAS_MASK: tl.constexpr, ROUND: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_D: tl.constexpr):  # fmt: skip
    """One scale per head and channel (given): out [B, H, D, num_programs(0)·BLOCK_S], keys contiguous,
    zero past S."""
    bh = tl.program_id(1).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    x = _load_rows(x_ptr, mask_ptr, bh // H, bh % H, s, cols, S, D, x_sb, x_ss, x_sh, mask_sb, HAS_MASK)
    scale = tl.load(scale_ptr + bh * D + cols, mask=cols < D, other=1.0)
    q = to_e4m3(tl.math.div_rn(x, scale[None, :]), ROUND)
    row = tl.num_programs(0) * BLOCK_S  # a multiple of BLOCK_S: Triton may store 16 bytes at once
    tl.store(out_ptr + (bh * D + cols)[None, :] * row + s[:, None], q, mask=(cols < D)[None, :])


def quantize_qkv(q, k, v, key_mask=None) -> QuantisedQKV:
    """`fp8_attention_format.quantize_qkv` (same arguments, the same bytes) on CUDA tensors."""
    check_device(q)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    (B, Sq, H, D), Sk = q.shape, k.shape[1]
    blocks, spans = triton.cdiv(Sk, KEY_BLOCK), triton.cdiv(Sk, ROWS)
    e4m3, fp32 = dict(dtype=FP8, device=q.device), dict(dtype=torch.float32, device=q.device)
    qp, qs = torch.empty(B, H, Sq, D, **e4m3), torch.empty(B, H, Sq, **fp32)
    kp, ks = torch.empty(B, H, blocks * KEY_BLOCK, D, **e4m3), torch.empty(B, H, blocks, **fp32)
    vp, amax = torch.empty(B, H, D, blocks * KEY_BLOCK, **e4m3), torch.empty(B, H, spans, D, **fp32)
    mask = None if key_mask is None else key_mask.to(torch.int8).contiguous()
    # the key mask's pointer and batch stride (any pointer and 0 without one)
    keys = (k, 0) if mask is None else (mask, mask.stride(0))
    block_d, rounding = max(16, triton.next_power_of_2(D)), interpreted()
    common = dict(HAS_MASK=mask is not None, BLOCK_D=block_d)
    _quantise_q[(triton.cdiv(Sq, ROWS), B * H)](
        q, qp, qs, H, Sq, D, *_strides(q), 1 / FP8_MAX, ROUND=rounding, BLOCK_S=ROWS, BLOCK_D=block_d
    )
    _quantise_k[(blocks, B * H)](
        k, keys[0], kp, ks, H, Sk, D, *_strides(k), keys[1], 1 / FP8_MAX, ROUND=rounding, BLOCK_N=KEY_BLOCK,
        **common,
    )  # fmt: skip
    _v_amax[(spans, B * H)](v, keys[0], amax, H, Sk, D, *_strides(v), keys[1], BLOCK_S=ROWS, **common)
    vs = (amax.amax(2) * (1 / FP8_MAX)).clamp_min(1e-12)  # the torch quantiser's own scale arithmetic
    _quantise_v[(blocks * KEY_BLOCK // ROWS, B * H)](  # V's rows padded with zeros as K is
        v, keys[0], vs, vp, H, Sk, D, *_strides(v), keys[1], ROUND=rounding, BLOCK_S=ROWS, **common
    )
    return QuantisedQKV(qp, kp, vp, qs, ks, vs)


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    """x [B, S, H, D]'s batch, token and head strides (its channels contiguous)."""
    return x.stride(0), x.stride(1), x.stride(2)
