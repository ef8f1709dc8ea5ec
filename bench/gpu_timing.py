"""Timing a built model in the GPU kit, eager and regionally compiled (the forward sections' and the FP8
rows' one way to time)."""

from __future__ import annotations

import torch

from bench.common import time_modes
from bench.gpu_kit import Kit


def regional(model):
    """Compile the repeated blocks only (one graph serves every block): ours with `dit.compile`, diffusers'
    models with their own `compile_repeated_blocks`, so both pay the same small compile."""
    from dit.compile import compile_blocks

    if hasattr(model, "compile_repeated_blocks"):
        model.compile_repeated_blocks()
    else:
        compile_blocks(model)
    return model


def time_built(kit: Kit, model, fn, call, modes: list[str]) -> tuple[dict, float | None]:
    """Time `call(fn)` of a built `model` in each of `modes` ("eager", "compile") on the kit: {mode: (seconds,
    output on the CPU)} and the peak GiB; "compile" compiles `model`'s blocks in place."""
    kit.free()
    if kit.cuda:
        torch.cuda.reset_peak_memory_stats()
    warmup, iters = kit.pick((1, 3), (0, 1))
    compile_fn = lambda f: (regional(model), f)[1]  # noqa: E731 - compiles the module in place, same fn
    runs = time_modes(fn, call, modes, warmup, iters, kit.device, compile_fn)
    peak = torch.cuda.max_memory_allocated() / 2**30 if kit.cuda else None
    return {mode: (sec, out.float().cpu()) for mode, (sec, out) in runs.items()}, peak
