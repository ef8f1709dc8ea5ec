"""The FP8 attention forward as one Triton kernel (flash-attention style): each program holds BLOCK_M queries
and walks the keys KEY_BLOCK at a time with an online softmax; Q·Kᵀ and P·V are FP8 `tl.dot`s accumulating
in fp32 (Hopper's FP8 wgmma). Its arithmetic is `fp8_attention.emulate`'s, step for step, on the bytes
`fp8_attention_format.quantize_qkv` wrote. Imported only on CUDA (Triton ships with CUDA builds of torch);
under TRITON_INTERPRET=1 it also runs on CPU tensors, which is how the tests check it against the emulation.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from parallel.e4m3_kernel import interpreted, round_e4m3
from parallel.fp8_attention_format import KEY_BLOCK, LOG2E, P_SCALE, QuantisedQKV


@triton.jit
def _block(q, row_scale, m, row_sum, acc, j, b, bh, rows, keys, cols, live_d, k_ptr, v_ptr, ks_ptr, mask_ptr,
           Sk, Sk_pad, D, n_kblocks, mask_sb, p_log2, p_inv, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
           ROUND_P: tl.constexpr, BLOCK_N: tl.constexpr, IMPRECISE_ACC: tl.constexpr,
           MASKED: tl.constexpr):  # fmt: skip
    """One online-softmax step over key block j: (m, row_sum, acc) updated. MASKED: some of its keys may be
    past Sk, dropped by the mask or in the future (causal); otherwise every score counts."""
    n = j * BLOCK_N + keys
    k = tl.load(k_ptr + (bh * Sk_pad + n)[None, :] * D + cols[:, None], mask=live_d[:, None], other=0.0)
    # the scores' scale (a positive factor per row) goes into the exponent, after the max it commutes with:
    # a multiply a score fewer than scaling them first (the max of the scaled scores is the same number)
    c = row_scale * tl.load(ks_ptr + bh * n_kblocks + j)
    s = tl.dot(q, k)
    if MASKED:
        keep = (n < Sk)[None, :]
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptr + b * mask_sb + n, mask=n < Sk, other=0) != 0)[None, :]
        if CAUSAL:
            keep = keep & (rows[:, None] >= n[None, :])
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1) * c)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp2(-inf) = 0, not NaN
    p8 = tl.math.exp2(s * c[:, None] - (m_safe - p_log2)[:, None])  # P · P_SCALE: log2 of it off the max
    alpha = tl.math.exp2(m - m_safe)
    row_sum = row_sum * alpha + tl.sum(p8, 1) * p_inv
    v = tl.load(v_ptr + (bh * D + cols)[None, :] * Sk_pad + n[:, None], mask=live_d[None, :], other=0.0)
    if ROUND_P:
        p8 = round_e4m3(p8)
    # IMPRECISE_ACC = BLOCK_N: this block's P·V sums in the MMA, then adds to acc in fp32 registers
    acc = tl.dot(p8.to(v.dtype), v, acc * alpha[:, None], max_num_imprecise_acc=IMPRECISE_ACC)
    return m_new, row_sum, acc


# The kernels' float arguments are constexpr: a kernel torch.compile captures gets its float arguments from
# Inductor as fp64 (Triton's own launch passes fp32), which made the arithmetic fp64 and `div_rn` refuse it.
@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, qs_ptr, ks_ptr, vs_ptr, mask_ptr, open_ptr, o_ptr, lse_ptr,
            H, Sq, Sk, D, Sk_pad, n_kblocks, o_sb, o_ss, o_sh, mask_sb, sm_scale: tl.constexpr,
            p_log2: tl.constexpr, p_inv: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
            ROUND_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            IMPRECISE_ACC: tl.constexpr):  # fmt: skip
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    keys = tl.arange(0, BLOCK_N)
    live_d = cols < D
    q = tl.load(q_ptr + (bh * Sq + rows)[:, None] * D + cols[None, :],
                mask=(rows < Sq)[:, None] & live_d[None, :], other=0.0)  # fmt: skip
    row_scale = tl.load(qs_ptr + bh * Sq + rows, mask=rows < Sq, other=0.0) * sm_scale
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the leading blocks every key of which counts skip the masking (a compare and a select per score, and
    # the mask's bytes): without a mask all whole blocks; with one, as many as `attend` counted (on device)
    if CAUSAL:
        n_open = 0
    elif HAS_MASK:
        n_open = tl.load(open_ptr + b)
    else:
        n_open = Sk // BLOCK_N
    at = (b, bh, rows, keys, cols, live_d, k_ptr, v_ptr, ks_ptr, mask_ptr, Sk, Sk_pad, D, n_kblocks, mask_sb,
          p_log2, p_inv)  # fmt: skip
    for j in range(0, n_open):
        m, row_sum, acc = _block(q, row_scale, m, row_sum, acc, j, *at, HAS_MASK, CAUSAL, ROUND_P, BLOCK_N,
                                 IMPRECISE_ACC, False)  # fmt: skip
    for j in range(n_open, n_kblocks):
        m, row_sum, acc = _block(q, row_scale, m, row_sum, acc, j, *at, HAS_MASK, CAUSAL, ROUND_P, BLOCK_N,
                                 IMPRECISE_ACC, True)  # fmt: skip
    l_safe = tl.where(row_sum == 0.0, 1.0, row_sum)  # a query with no key left: out 0, lse -inf
    v_scale = tl.load(vs_ptr + bh * D + cols, mask=live_d, other=0.0) * p_inv
    out = acc / l_safe[:, None] * v_scale[None, :]
    o = o_ptr + b * o_sb + h * o_sh + rows.to(tl.int64)[:, None] * o_ss + cols[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=(rows < Sq)[:, None] & live_d[None, :])
    tl.store(lse_ptr + bh * Sq + rows, (m + tl.math.log2(row_sum)) * 0.6931471805599453, mask=rows < Sq)


def _open_blocks(key_mask: torch.Tensor, Sk: int) -> torch.Tensor:
    """int32 [B]: how many leading key blocks of each sequence hold only real keys (computed where the mask
    is, without a host sync). Joint attention's image keys come first, its padded text last."""
    whole = key_mask[:, : Sk // KEY_BLOCK * KEY_BLOCK].reshape(key_mask.shape[0], -1, KEY_BLOCK).all(-1)
    return whole.int().cumprod(1).sum(1, dtype=torch.int32)


def check_device(t: torch.Tensor) -> None:
    if interpreted():
        return
    if not t.is_cuda:
        raise RuntimeError("the FP8 attention kernel needs CUDA (on the CPU, backend fp8 runs the emulation)")
    props = torch.cuda.get_device_properties(t.device)  # not capability: dynamo folds properties to constants
    if (props.major, props.minor) < (8, 9):
        raise RuntimeError("the FP8 attention kernel needs FP8 tensor cores: compute capability >= 8.9")


def attend(z: QuantisedQKV, Sk: int, key_mask=None, causal=False, dtype=torch.bfloat16, block_m: int = 128,
           warps: int = 8, stages: int = 3, two_level: bool = True):  # fmt: skip
    """(out [B, Sq, H, D] in `dtype`, lse [B, Sq, H] fp32) of `z` over its first Sk keys; `block_m` queries
    a program, `warps` and `stages` (software pipelining depth) Triton's launch settings (bench/gpu.py's
    attention-speed section times a few). `two_level`: each key block's P·V is summed by the FP8 MMA and
    added to the output in fp32, as the emulation does. Without it the output itself rides through every
    block's MMA, whose accumulator on Hopper (and Ada) keeps 13 bits of mantissa and truncates the rest
    (SageAttention2 measured it): at 32760 keys, 256 truncations of the running output. Costs registers:
    bench/hopper_compile.py prints them."""
    check_device(z.q)
    B, H, Sq, D = z.q.shape
    out = torch.empty(B, Sq, H, D, dtype=dtype, device=z.q.device)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=z.q.device)
    mask = None if key_mask is None else key_mask.to(torch.int8).contiguous()
    # the mask and the count of open blocks, or any pointer when there is no mask
    masks = (out, out) if mask is None else (mask, _open_blocks(key_mask, Sk))
    grid = (triton.cdiv(Sq, block_m), B * H)
    _attend[grid](z.q, z.k, z.v_t, z.q_scale, z.k_scale, z.v_scale, *masks, out, lse, H, Sq, Sk, D,
                  z.k.shape[2], z.k_scale.shape[-1], *out.stride()[:3], 0 if mask is None else mask.stride(0),
                  D**-0.5 * LOG2E, math.log2(P_SCALE), 1 / P_SCALE, HAS_MASK=mask is not None, CAUSAL=causal,
                  ROUND_P=interpreted(), BLOCK_M=block_m, BLOCK_N=KEY_BLOCK,
                  BLOCK_D=max(32, triton.next_power_of_2(D)), IMPRECISE_ACC=KEY_BLOCK if two_level else None,
                  num_warps=warps, num_stages=stages)  # fmt: skip
    return out, lse.transpose(1, 2)
