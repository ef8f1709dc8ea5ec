"""Wan2.2 A14B's two experts: a high-noise transformer for the early timesteps and a low-noise one (diffusers'
`transformer_2`) for those below `boundary_ratio` × 1000, each with its own guidance scale. Both are
sequence-parallel like any DiT; with `offload_idle_expert` the one not running waits in host memory
(`dit.sampling.HostOffload`).

A pipeline folder has two experts when it holds `transformer_2/`; its `model_index.json` gives the boundary
(Wan2.2 T2V: 0.875, I2V: 0.9). A preset named in `PRESET_BOUNDARIES` pairs its config with a second set of
random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

PRESET_BOUNDARIES = {"wan2.2-t2v-a14b": 0.875, "tiny-moe-random": 0.5}


def boundary_ratio(model: str, folder: Path | None) -> float | None:
    """The model's boundary ratio, None for a one-expert model."""
    if folder is None:
        return PRESET_BOUNDARIES.get(model)
    if not (folder / "transformer_2").is_dir():
        return None
    index = folder / "model_index.json"
    ratio = json.loads(index.read_text()).get("boundary_ratio") if index.is_file() else None
    if not isinstance(ratio, int | float) or not 0 < ratio < 1:
        raise ValueError(f"{folder}: transformer_2/ needs a boundary_ratio in (0, 1) in model_index.json")
    return float(ratio)


def second_source(model: str, folder: Path | None) -> tuple[str, int]:
    """(what `dit.load_transformer` loads the low-noise expert from, its random-weight seed)."""
    return (str(folder / "transformer_2"), 0) if folder is not None else (model, 1)
