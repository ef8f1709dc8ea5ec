"""`load_transformer`: preset name or checkpoint folder → model, dispatched on config.json's `_class_name`.

Model families register themselves (`register_family`) when their package is imported; the packages listed in
`FAMILY_PACKAGES` are imported on first use, so adding a family is one entry there plus its own package.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dit import lora
from dit.presets import PRESETS, SHIPPED, resolve
from dit.weights import (
    Resolver,
    checkpoint_files,
    checkpoint_keys,
    load_safetensors,
    materialize,
    random_init,
)

FAMILY_PACKAGES = ("dit.wan", "dit.hunyuan")


@dataclass(frozen=True)
class Family:
    class_name: str  # config.json `_class_name`
    parse_config: Callable[[dict], Any]  # config.json dict → the family's config dataclass
    build: Callable[[Any], nn.Module]  # config → model (called on the meta device)
    resolver: Callable[[Any], Resolver]  # config → checkpoint key resolver (see dit.weights)
    keep_fp32: tuple[str, ...] = ()  # parameter-name fragments kept float32 in lower-precision loads
    # config → resolver of the weight names LoRA files use (see dit.lora); None: `resolver`'s
    lora_resolver: Callable[[Any], Resolver] | None = None
    # (config.json dict, the checkpoint's key names) → the dict completed with what only the weights tell
    # (Wan2.2 I2V's original config reads as Wan2.1 I2V's but has no image embedder); None: as it is
    complete_config: Callable[[dict, set[str]], dict] | None = None


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    _FAMILIES[family.class_name] = family


def _import_families() -> None:
    for package in FAMILY_PACKAGES:
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as e:
            if e.name != package:
                raise


def presets() -> dict[str, dict]:
    """Every preset (config.json form), the families' own included."""
    _import_families()
    return PRESETS


def model_names() -> list[str]:
    """Every name a model can be given by: the shipped models' and the presets', sorted."""
    return sorted([*SHIPPED, *presets()])


def family_for(class_name: str | None) -> Family:
    _import_families()
    if class_name not in _FAMILIES:
        raise ValueError(f"unknown model class {class_name!r}; known: {sorted(_FAMILIES)}")
    return _FAMILIES[class_name]


def _checkpoint_dir(path: Path) -> Path:
    """A transformer folder, or a whole pipeline folder holding one in `transformer/`."""
    if (path / "transformer" / "config.json").is_file():
        return path / "transformer"
    if (path / "config.json").is_file():
        return path
    raise FileNotFoundError(
        f"{path}: no config.json (expected a transformer or pipeline folder, or a preset)"
    )


def load_transformer(
    path_or_preset: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    seed: int = 0,
    loras: Sequence[lora.Lora] = (),
) -> nn.Module:
    """A shipped model's name ("tiny": trained weights), a preset name ("tiny-random", "wan2.1-1.3b",
    "wan2.1-14b": random weights from `seed`), a diffusers `transformer/` folder, a whole pipeline folder, or
    an original Wan checkpoint folder → eval-mode model. `loras`: (safetensors file, strength) pairs merged
    into the weights as they load (dit.lora: the key layouts accepted, the scale)."""
    folder, config_json = _source(path_or_preset)
    family, config, model = build_empty(config_json, dtype, device)
    # every LoRA key and shape is checked before the checkpoint is read
    merges = lora.plan(model, loras, (family.lora_resolver or family.resolver)(config))
    if folder is None:
        random_init(model, seed)
    else:
        load_safetensors(model, checkpoint_files(folder), family.resolver(config))
    return lora.merge(model, merges).eval().requires_grad_(False)


def check_loras(path_or_preset: str | Path, loras: Sequence[lora.Lora]) -> None:
    """What `load_transformer(..., loras=loras)` checks first, without allocating or reading any weight
    (the model on the meta device, the LoRA files' headers): FileNotFoundError or ValueError naming the file
    and the keys that do not fit."""
    _, config_json = _source(path_or_preset)
    family, config, model = build_empty(config_json, torch.float32, "meta")
    lora.plan(model, loras, (family.lora_resolver or family.resolver)(config))


def _source(path_or_preset: str | Path) -> tuple[Path | None, dict]:
    """(checkpoint folder or None for a preset, its config.json)."""
    path_or_preset = resolve(path_or_preset)
    if isinstance(path_or_preset, str) and path_or_preset in presets():
        return None, PRESETS[path_or_preset]
    folder = _checkpoint_dir(Path(path_or_preset))
    config_json = json.loads((folder / "config.json").read_text())
    complete = family_for(config_json.get("_class_name")).complete_config
    return folder, config_json if complete is None else complete(config_json, checkpoint_keys(folder))


def build_random(
    config_json: dict, *, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0
) -> nn.Module:
    """Any config (config.json form, `_class_name` included) with deterministic random weights."""
    _, _, model = build_empty(config_json, dtype, device)
    return random_init(model, seed).eval().requires_grad_(False)


def build_empty(config_json: dict, dtype: torch.dtype, device):
    """(family, config, model with uninitialised parameters allocated in dtype on device)."""
    family = family_for(config_json.get("_class_name"))
    config = family.parse_config(config_json)
    with torch.device("meta"):
        model = family.build(config)
    materialize(model, dtype=dtype, device=torch.device(device), keep_fp32=family.keep_fp32)
    return family, config, model
