"""What Hopper's FP8 MMA accumulator would do to FP8 attention if the running output rode through it, as a
model on the CPU: `fp8_attention.emulate` with the output truncated to 13 mantissa bits after every key
block (SageAttention2 measured that an mma(f32, e4m3, e4m3, f32) on Ada and Hopper keeps 13 bits of its fp32
accumulator and zeroes the rest), against the exact emulation, which the kernel's default two-level
accumulation follows. bench/gpu.py's fp8-attention section measures the kernel both ways on a GPU. Prints a
table.

    python bench/fp8_accumulation.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import rel_diff  # noqa: E402
from bench.entry import run_main  # noqa: E402
from parallel.fp8_attention import emulate  # noqa: E402
from parallel.fp8_attention_format import KEY_BLOCK, quantize_qkv  # noqa: E402

QUERIES, HEADS, D = 256, 2, 128  # the keys decide the number of truncations; a few queries show it


def main(argv=None) -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)  # --help, and no other option (it ran the benchmark whatever it was given)
    g = torch.Generator().manual_seed(0)
    print(f"{QUERIES} queries, {HEADS} heads, D={D}, bf16 inputs; the 13-bit model vs the exact emulation\n")
    print("| keys | key blocks | V mean | relative difference | signed mean (out − exact) / Σ|exact| |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for keys in (4096, 32760):
        for mean in (0.0, 1.0):
            q = torch.randn(1, QUERIES, HEADS, D, generator=g).bfloat16()
            k = torch.randn(1, keys, HEADS, D, generator=g).bfloat16()
            v = (torch.randn(1, keys, HEADS, D, generator=g) + mean).bfloat16()
            z = quantize_qkv(q, k, v)
            exact, model = (emulate(z, keys, mma_bits=bits)[0] for bits in (23, 13))
            signed = ((model - exact).sum() / exact.abs().sum()).item()
            blocks = -(-keys // KEY_BLOCK)
            print(f"| {keys} | {blocks} | {mean:g} | {rel_diff(model, exact):.2e} | {signed:+.2e} |")


if __name__ == "__main__":
    run_main(main)
