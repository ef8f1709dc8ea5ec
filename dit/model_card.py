"""A model folder describes itself: `ithaca.json` beside `model_index.json` holds the model's request defaults
and limits (frames, size, steps, guidance, fps), so a copy of the folder, given by `--model-path` or published
to a Hub, keeps the defaults its name had (the trained tiny model: 17 frames of 64×64 in 12 steps, not Wan's
81 frames of 480×832, minutes on a CPU). The family's limits apply where a folder has no card, and to what a
card leaves out; the frame step and size multiple always come from the VAE and patch size, not the card.

Light on purpose (JSON only): `dit.preflight` reads it to check a request before any model code is imported.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

CARD = "ithaca.json"
# The `dit.families.Limits` fields a card may set: whole numbers except guidance.
INT_FIELDS = ("min_frames", "max_frames", "default_frames", "min_size", "max_size", "default_height",
              "default_width", "min_steps", "max_steps", "default_steps", "min_fps", "max_fps",
              "default_fps")  # fmt: skip
FLOAT_FIELDS = ("min_guidance", "max_guidance", "default_guidance")
# (least, default or defaults, most) that must be ordered
RANGES = (("min_frames", ("default_frames",), "max_frames"),
          ("min_size", ("default_height", "default_width"), "max_size"),
          ("min_steps", ("default_steps",), "max_steps"),
          ("min_guidance", ("default_guidance",), "max_guidance"),
          ("min_fps", ("default_fps",), "max_fps"))  # fmt: skip


def read_card(folder: Path | None) -> dict[str, Any]:
    """The folder's card ({} when there is none): ValueError naming the file for an unknown key or a value
    of the wrong type."""
    path = folder / CARD if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(card, dict):
        raise ValueError(f"{path}: expected a JSON object of limits")
    for key, value in card.items():
        if key in INT_FIELDS:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif key in FLOAT_FIELDS:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            raise ValueError(f"{path}: unknown key {key!r}; allowed: {', '.join(INT_FIELDS + FLOAT_FIELDS)}")
        if not ok:
            raise ValueError(f"{path}: {key} must be a number, got {value!r}")
    return card


def apply_card(limits, folder: Path | None):
    """`limits` (a `dit.families.Limits`) with the folder's card laid over it; ValueError when the result's
    ranges are out of order (a default outside its limits)."""
    card = read_card(folder)
    if not card:
        return limits
    limits = replace(limits, **card)
    for low, defaults, high in RANGES:
        for name in defaults:
            least, value, most = getattr(limits, low), getattr(limits, name), getattr(limits, high)
            if not least <= value <= most:
                raise ValueError(f"{folder / CARD}: {name} {value} is outside {low} {least} to {high} {most}")
    return limits


def write_card(folder: Path, limits) -> None:
    """Every card field of `limits` into `folder/ithaca.json` (what the scripts that write shipped folders
    call)."""
    card = {name: getattr(limits, name) for name in INT_FIELDS + FLOAT_FIELDS}
    (folder / CARD).write_text(json.dumps(card, indent=2) + "\n")
