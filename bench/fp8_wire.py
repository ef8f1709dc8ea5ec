"""The FP8 wire quantiser (`parallel.fp8.pack`) on a GPU: the Triton kernel (`parallel.fp8_kernel`) byte for
byte against the eager quantiser on fresh random inputs of several shapes and dtypes (the output poisoned
first), then eager, torch.compile'd and Triton timed on one rank's Wan-14B QKV share at P=8 beside a plain
copy of the same bytes (the memory-bandwidth floor): device time over back-to-back calls (triton's
do_bench) and one call alone between two events (as bench/gpu.py times, launch cost included). Prints a table.

    python bench/fp8_wire.py            # needs CUDA
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import timed  # noqa: E402
from bench.entry import run_main  # noqa: E402
from parallel import fp8  # noqa: E402

SHAPES = [  # pack_qkv's [P, 3, B, L, H/P, D]
    ((8, 3, 1, 4095, 5, 128), torch.bfloat16),  # Wan2.1-14B, 480p 81 frames, one rank's share at P=8
    ((2, 3, 1, 777, 3, 64), torch.float16),
    ((4, 3, 2, 101, 2, 20), torch.bfloat16),  # D not a power of two
    ((3, 3, 1, 50, 1, 128), torch.float32),
]


def _poison(nbytes: int, device) -> None:
    """Fill and free a block the size of the next output, so an unwritten byte would show."""
    torch.full((nbytes,), 0xA5, dtype=torch.uint8, device=device)


def check(device) -> list[str]:
    from parallel import fp8_kernel

    lines, gen = [], torch.Generator(device=device)
    for i, (shape, dtype) in enumerate(SHAPES):
        gen.manual_seed(i)
        rows = torch.rand(shape[:-1] + (1,), generator=gen, device=device) * 30  # rows of different ranges
        x = (torch.randn(shape, generator=gen, device=device) * rows).to(dtype)
        want = fp8.pack(x)
        _poison(want.numel(), device)
        got = fp8_kernel.pack(x)
        differ = (got != want).sum().item()  # counted exactly (a float mean rounds 63M ones below 1)
        cpu = (fp8.pack(x.cpu()) != want.cpu()).sum().item()
        lines.append(
            f"{str(shape):28s} {str(dtype):15s} {want.numel():>10d} bytes, differing: Triton vs eager "
            f"{differ}, eager here vs on the CPU {cpu}"
        )
        if differ or cpu or got.shape != want.shape:
            print("\n".join(lines))
            raise SystemExit(f"{shape}: the packs differ")
    return lines


def time_share(device) -> list[tuple[str, float, float, float]]:
    from triton.testing import do_bench

    shape, dtype = SHAPES[0]
    xs = [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]  # rotate: 3 × 126 MB > L2
    moved = xs[0].nbytes + fp8.pack(xs[0]).nbytes
    turn = iter(range(10**9))

    def rotate(fn):
        return lambda: fn(xs[next(turn) % len(xs)])

    rows = []
    for name, fn, nbytes in [
        ("copy of the share (bandwidth floor)", torch.clone, 2 * xs[0].nbytes),
        ("eager (fp8.pack)", fp8.pack, moved),
        ("torch.compile of the eager quantiser", torch.compile(fp8._pack, dynamic=False), moved),
        ("one Triton kernel (fp8.pack compiled=True)", lambda x: fp8.pack(x, compiled=True), moved),
    ]:
        ms = do_bench(rotate(fn), warmup=50, rep=300, return_mode="median")
        alone = timed(rotate(fn), 3, 20, device)[0] * 1e3  # as bench/gpu.py times: one call between events
        rows.append((name, ms, nbytes / ms / 1e6, alone))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs CUDA (the Triton kernel runs on NVIDIA GPUs)")
    device = torch.device("cuda")
    for line in check(device):
        print(line)
    print(f"\n{torch.cuda.get_device_name()}: one rank's Wan-14B QKV share at P=8, {SHAPES[0][0]} bf16")
    print(f"| {'quantiser':44s} | {'ms':>7s} | {'GB/s':>7s} | one call alone, ms |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 9}|{'-' * 20}|")
    for name, ms, gbs, alone in time_share(device):
        print(f"| {name:44s} | {ms:7.3f} | {gbs:7.0f} | {alone:18.3f} |")


if __name__ == "__main__":
    run_main(main)
