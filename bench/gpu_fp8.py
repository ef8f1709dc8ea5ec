"""The FP8 rows of the GPU kit's Wan forward sections (issue 27 §3): our model of the bf16 rows again with
`--attn-backend fp8` (parallel.fp8_attention), `--quant fp8` (dit.fp8_linear) and both, each timed in the
bf16 row's fastest mode, with its peak memory and its output's error against our bf16 output."""

from __future__ import annotations

import torch

from bench.gpu_kit import Kit, gib
from bench.gpu_timing import time_built

# (row, --quant, --attn-backend); quantised rows last: `quantise` makes the layers FP8 in place, for good
VARIANTS = (
    ("ours, attn fp8", "none", "fp8"),
    ("ours, quant fp8", "fp8", "auto"),
    ("ours, quant + attn fp8", "fp8", "fp8"),
)
BOTH = VARIANTS[-1][0]


def unavailable(kit: Kit) -> str | None:
    """Why this device cannot run the FP8 rows, or None (the CPU can: `_scaled_mm` and the attention's
    emulation run there)."""
    if not kit.cuda:
        return None
    major, minor = torch.cuda.get_device_capability(kit.device)
    if (major, minor) < (8, 9):
        return f"FP8 GEMMs and attention need compute capability ≥ 8.9, this GPU's is {major}.{minor}"
    return None


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |out − ref| / max |ref|, mean |out − ref|), in float64."""
    out, ref = out.double(), ref.double()
    delta = (out - ref).abs()
    return (delta.max() / ref.abs().max()).item(), delta.mean().item()


def fp8_rows(kit: Kit, model, call, mode: str, reference: torch.Tensor, diffusers_s: float):
    """Time `model` (ours, its bf16 rows done) with each of VARIANTS in `mode` ("compile": regionally, as
    its bf16 row; each variant recompiles the block once). Rows [row, mode, s, vs diffusers, peak GiB,
    max |Δ| / max |bf16|, mean |Δ|] against `reference` (ours bf16, same mode), and {row: seconds}."""
    from dit.fp8_linear import quantise
    from dit.sequence_parallel import parallelize
    from parallel import ParallelMesh

    why = unavailable(kit)
    if why:
        return [[name, mode, f"skipped: {why}", "–", "–", "–", "–"] for name, *_ in VARIANTS], {}
    one_rank = ParallelMesh(device=kit.device)
    rows, seconds, quantised = [], {}, False
    with torch.inference_mode():  # as the model was built and its bf16 rows ran (bench.gpu_speed._forwards)
        for name, quant, attn in VARIANTS:
            if quant == "fp8" and not quantised:
                quantise(model)
                quantised = True
            parallelize(model, one_rank, backend=attn)  # one rank: sets the self- and cross-attention kernel
            timings, peak = time_built(kit, model, model, call, [mode])
            sec, out = timings[mode]
            seconds[name] = sec
            gap = errors(out, reference)
            rows.append([name, mode, f"{sec:.3f}", f"{sec / diffusers_s:.3f}×", gib(peak), *gap])
    return rows, seconds
