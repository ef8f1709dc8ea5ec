"""Triton helpers the FP8 kernels share (imported only where Triton is: CUDA builds of torch, or the tests
under TRITON_INTERPRET=1)."""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreted() -> bool:
    """Whether the kernels run under Triton's CPU interpreter (the tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_e4m3(x):
    """x >= 0 rounded to e4m3's grid to nearest even, in fp32: the interpreter's fp32→e4m3 cast (Triton 3.9)
    drops a round-up's carry into the exponent (31.5 → 16); on an exact value it is right."""
    bits = x.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)  # 3 of 23 bits
    return tl.where(x < 0.015625, (x + 24576.0) - 24576.0, normal)  # below 2^-6: multiples of 2^-9


@triton.jit
def to_e4m3(y, ROUND: tl.constexpr):
    """y (|y| ≤ 448, fp32) cast to e4m3; with ROUND (the interpreter) rounded on e4m3's grid first."""
    if ROUND:
        y = tl.where(y < 0, -round_e4m3(-y), round_e4m3(y))
    return y.to(tl.float8e4nv)
