"""`dit.fp8_linear.quantise_rows` as one Triton kernel on CUDA: an FP8 layer's input quantised per token.

Eager torch runs the quantiser as six passes over an fp32 copy of the input (cast, abs, max, divide, clamp,
cast): at Wan2.1-14B's 32760 tokens of 5120 channels about 4 GB of memory traffic a layer by count
(bench/gpu.py times both). This kernel reads each row in its own dtype twice (its absmax, then its bytes)
and writes its e4m3 bytes and fp32 scale: the same bytes (the same fp32 absmax, scale = absmax clamped at
1e-12 divided by 448, a correctly rounded division, clamped to ±448, cast to nearest even). `Fp8Linear`
runs it outside torch.compile (inside, Inductor fuses the torch quantiser itself). Imported only on CUDA;
under TRITON_INTERPRET=1 the tests run it on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parallel.e4m3 import FP8, FP8_MAX
from parallel.e4m3_kernel import interpreted, to_e4m3

BLOCK_K = 1024  # a row's channels per load


@triton.jit
def _quantise_rows(x_ptr, out_ptr, scale_ptr, K, x_stride, e4m3_max: tl.constexpr, ROUND: tl.constexpr,
                   BLOCK_K: tl.constexpr):  # fmt: skip
    # e4m3_max constexpr: Inductor passes a float argument as fp64 (parallel.fp8_attention_kernel)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * x_stride + k + cols, mask=k + cols < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-12), e4m3_max)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * x_stride + k + cols, mask=k + cols < K, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -e4m3_max), e4m3_max)
        tl.store(out_ptr + row * K + k + cols, to_e4m3(y, ROUND), mask=k + cols < K)
    tl.store(scale_ptr + row, scale)


def quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`dit.fp8_linear.quantise_rows(x)` for x [M, K] on CUDA (or under the interpreter): (e4m3 [M, K], fp32
    scales [M, 1]), the same bytes."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    M, K = x.shape
    out = torch.empty(M, K, dtype=FP8, device=x.device)
    scale = torch.empty(M, 1, dtype=torch.float32, device=x.device)
    block = min(BLOCK_K, triton.next_power_of_2(K))
    _quantise_rows[(M,)](x, out, scale, K, x.stride(0), FP8_MAX, ROUND=interpreted(), BLOCK_K=block)
    return out, scale
