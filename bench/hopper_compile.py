"""Every Triton kernel of Ithaca compiled for Hopper (sm_90) at the shapes a Wan2.1-14B job gives it, on any
machine with Triton installed (no GPU needed): registers a thread, bytes spilled to the stack, shared memory
a block, byte-sized global accesses and asynchronous copies, each loop's size, FP8 tensor-core instructions
and where their sums go to fp32. The FP8 attention kernel at each of bench/gpu.py's timed launches and at
its defaults with a key mask, its Q/K/V quantiser, an FP8 layer's input quantiser and the FP8 wire packer.
Prints a table (--json: the rows, for tests/test_hopper_compile.py; --sweep: 24 more attention launches).

    python bench/hopper_compile.py            # the GPU image has Triton 3.6.0: setup.sh installs that one
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.entry import run_main  # noqa: E402
from bench.gpu_speed import FP8_LAUNCHES, WAN_14B_SHAPE, attend_settings  # noqa: E402
from testing.hopper_compile import compile_only, float_arguments, fp8_mmas, loops, memory, usage  # noqa: E402

FFN_DIM = 13824  # Wan2.1-14B's FFN width (its model width is 5120)
# --sweep: queries a program, warps, pipelining stages, two-level accumulation
SWEEP = tuple(itertools.product((128, 64), (8, 4), (2, 3, 4), (True, False)))


def _launches(compiled: list, attention: tuple) -> list[tuple[str, str, int]]:
    """Launch each kernel inside `compile_only`, the attention kernel at each of `attention` (FP8_LAUNCHES'
    form): (case, launch settings, how many kernels it compiled)."""
    from dit import fp8_rows_kernel
    from parallel import fp8_attention_kernel, fp8_kernel, fp8_qkv_kernel

    S, H, D = WAN_14B_SHAPE
    meta = dict(dtype=torch.bfloat16, device="meta")
    qkv, mask = torch.empty(1, S, H, D, **meta), torch.ones(1, S, dtype=torch.bool, device="meta")
    done = []

    def launch(case: str, settings: str, call):
        before = len(compiled)
        result = call()
        done.append((case, settings, len(compiled) - before))
        return result

    z = launch(f"Q/K/V quantiser, S={S} H={H} D={D}", "", lambda: fp8_qkv_kernel.quantize_qkv(qkv, qkv, qkv))
    case = f"Q/K/V quantiser, S={S} H={H} D={D}, key mask"
    launch(case, "", lambda: fp8_qkv_kernel.quantize_qkv(qkv, qkv, qkv, mask))
    for at in map(attend_settings, attention):
        launch(
            f"attention, S={S} H={H} D={D}",
            json.dumps(at),
            lambda at=at: fp8_attention_kernel.attend(z, S, **at),
        )
    defaults = {k: p.default for k, p in inspect.signature(fp8_attention_kernel.attend).parameters.items()}
    at = {k: defaults[k] for k in attend_settings(FP8_LAUNCHES[0])}
    launch(
        f"attention, S={S} H={H} D={D}, key mask",
        json.dumps(at),
        lambda: fp8_attention_kernel.attend(z, S, mask),
    )
    for width in (5120, FFN_DIM):
        x = torch.empty(S, width, **meta)
        launch(f"FP8 layer input, {S} x {width}", "", lambda x=x: fp8_rows_kernel.quantise_rows(x))
    share = torch.empty(8, 3, 1, 4095, 5, 128, **meta)  # one rank's Q/K/V share at P=8
    launch("FP8 wire packer, one rank's share at P=8", "", lambda: fp8_kernel.pack(share))
    return done


def rows(attention: tuple = FP8_LAUNCHES) -> list[dict]:
    """One row a compiled kernel, in launch order."""
    with compile_only() as compiled:
        done = _launches(compiled, attention)
    out, at = [], 0
    for case, settings, n in done:
        for c in compiled[at : at + n]:
            meta = c.binary.metadata
            row = dict(
                kernel=c.kernel, case=case, launch=settings, warps=meta.num_warps, stages=meta.num_stages
            )
            row |= dict(loops=loops(c.binary)) | usage(c.binary) | memory(c.binary) | fp8_mmas(c.binary)
            out.append(row | float_arguments(c.binary))
        at += n
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--sweep", action="store_true", help="the attention kernel at every launch of SWEEP too")
    args = p.parse_args()
    import triton

    table = rows(FP8_LAUNCHES + SWEEP if args.sweep else FP8_LAUNCHES)
    if args.json:
        print(json.dumps(dict(triton=triton.__version__, rows=table)))
        return
    print(f"Triton {triton.__version__}, target sm_90 (compiled here, not run)\n")
    head = "kernel | case | launch | warps | stages | registers | spilled B | shared KiB | byte ld/st | "
    head += "16-B async copies | loop bodies | e4m3 wgmma | fp32 after"
    print(f"| {head} |\n|" + " --- |" * 3 + " ---: |" * 9 + " --- |")
    for r in table:
        after = ", ".join("never" if n >= 2**30 else str(n) for n in r["imprecise_acc"]) or "–"
        at = json.loads(r["launch"] or "{}")
        launch = "–"
        if at:
            launch = f"block_m {at['block_m']}, " + ("two-level" if at["two_level"] else "MMA accumulation")
        cells = [r["kernel"], r["case"], launch, r["warps"], r["stages"], r["registers"], r["spilled"]]
        cells += [f"{r['shared'] / 1024:.1f}", r["byte_accesses"], r["async_copies"]]
        loop = ", ".join(
            f"{x['instructions']}" + (f" ({x['stack']} on the stack)" if x["stack"] else "")
            for x in r["loops"]
        )
        cells += [loop or "–", r["e4m3_wgmma"], after]
        print("| " + " | ".join(map(str, cells)) + " |")
    print("\nfp32 after: per product (Q·Kᵀ, then P·V), how many FP8 products the MMA sums before registers")
    print("take over in fp32; never: the MMA's accumulator throughout (Q·Kᵀ starts from zero at every key")
    print("block, so its 128 are all). Loop bodies: machine instructions (SASS) an iteration of each loop")
    print("issues; in brackets, how many of them load or store spilled registers.")


if __name__ == "__main__":
    run_main(main)
