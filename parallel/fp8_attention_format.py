"""The bytes FP8 attention reads (parallel.fp8_attention): Q, K and V quantised to e4m3 with their fp32
scales, in the layout of the Triton kernel's operands; the kernel and its torch emulation both take a
`QuantisedQKV`, so they compute on the same values. The scales' granularity is fp8_attention's docstring's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from parallel.e4m3 import FP8_MAX
from parallel.fp8 import quantize

KEY_BLOCK = 128  # keys per K scale and per online-softmax step; the kernel's BLOCK_N
P_SCALE = FP8_MAX
LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class QuantisedQKV:
    q: torch.Tensor  # e4m3 [B, H, Sq, D]
    k: torch.Tensor  # e4m3 [B, H, ⌈Sk/KEY_BLOCK⌉·KEY_BLOCK, D], zero past Sk
    v_t: torch.Tensor  # e4m3 [B, H, D, ⌈Sk/KEY_BLOCK⌉·KEY_BLOCK], zero past Sk (keys contiguous: the FP8
    # MMA's operand layout; rows a multiple of 16 bytes, so the kernel loads them in 16-byte copies)
    q_scale: torch.Tensor  # fp32 [B, H, Sq]
    k_scale: torch.Tensor  # fp32 [B, H, ⌈Sk/KEY_BLOCK⌉]
    v_scale: torch.Tensor  # fp32 [B, H, D]


def quantize_qkv(q, k, v, key_mask=None) -> QuantisedQKV:
    """q [B, Sq, H, D], k/v [B, Sk, H, D] (any float dtype); key_mask [B, Sk] bool (True = real key)."""
    B, Sk, H, D = k.shape
    if key_mask is not None:  # dropped keys must not widen a block's or a channel's scale
        k, v = (t.masked_fill(~key_mask[:, :, None, None], 0) for t in (k, v))
    qp, qs = quantize(q.transpose(1, 2))
    pad = -Sk % KEY_BLOCK
    kt = torch.nn.functional.pad(k.transpose(1, 2).float(), (0, 0, 0, pad))
    kp, ks = quantize(kt.reshape(B, H, -1, KEY_BLOCK * D))
    vp, vs = quantize(v.permute(0, 2, 3, 1))
    vp = torch.nn.functional.pad(vp.view(torch.uint8), (0, pad)).view(vp.dtype)  # byte 0 is e4m3's +0
    qp, qs, vs = (t.contiguous() for t in (qp, qs[..., 0], vs[..., 0]))  # the kernel's layout
    return QuantisedQKV(qp, kp.view(B, H, -1, D), vp, qs, ks[..., 0], vs)
