"""`load_transformer`: preset name or checkpoint folder → model, dispatched on config.json's `_class_name`
to the weight format of a registered family (`dit.families`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dit import lora
from dit.families import presets, weight_format
from dit.fp8_checkpoint import StoredFp8
from dit.presets import PRESETS, resolve
from dit.weights import (
    Resolver,
    checkpoint_files,
    checkpoint_keys,
    load_safetensors,
    materialize,
    random_init,
)


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
    quant: str = "none",
) -> nn.Module:
    """A shipped model's name ("tiny": trained weights), a preset name ("tiny-random", "wan2.1-1.3b",
    "wan2.1-14b": random weights from `seed`), a diffusers `transformer/` folder, a whole pipeline folder, or
    an original Wan checkpoint folder → eval-mode model. `loras`: (safetensors file, strength) pairs merged
    into the weights as they load (dit.lora: the key layouts accepted, the scale). A pre-quantised checkpoint
    (float8 weights and scales, dit.fp8_checkpoint) keeps its float8 layers as stored with `quant="fp8"` and
    no LoRAs, and is dequantised into `dtype` otherwise."""
    folder, config_json = _source(path_or_preset)
    files = [] if folder is None else checkpoint_files(folder)
    stored = StoredFp8.scan(files)
    keep = quant == "fp8" and not loras  # a LoRA merges into dequantised weights
    weights, config, model = build_empty(config_json, dtype, device, stored if keep else None)
    # every LoRA key and shape is checked before the checkpoint is read
    merges = lora.plan(model, loras, _lora_resolver(weights, config))
    if folder is None:
        random_init(model, seed)
    else:
        load_safetensors(model, files, stored.resolver(weights.resolver(config)), stored.prepare)
    return lora.merge(model, merges).eval().requires_grad_(False)


def check_loras(path_or_preset: str | Path, loras: Sequence[lora.Lora]) -> None:
    """What `load_transformer(..., loras=loras)` checks first, without allocating or reading any weight
    (the model on the meta device, the LoRA files' headers): FileNotFoundError or ValueError naming the file
    and the keys that do not fit."""
    _, config_json = _source(path_or_preset)
    weights, config, model = build_empty(config_json, torch.float32, "meta")
    lora.plan(model, loras, _lora_resolver(weights, config))


def lora_resolver(path_or_preset: str | Path) -> Resolver:
    """How LoRA files name the weights of the model `load_transformer(path_or_preset)` builds."""
    _, config_json = _source(path_or_preset)
    weights = weight_format(config_json.get("_class_name"))
    return _lora_resolver(weights, weights.parse_config(config_json))


def _lora_resolver(weights, config) -> Resolver:
    return (weights.lora_resolver or weights.resolver)(config)


def _source(path_or_preset: str | Path) -> tuple[Path | None, dict]:
    """(checkpoint folder or None for a preset, its config.json)."""
    path_or_preset = resolve(path_or_preset)
    if isinstance(path_or_preset, str) and path_or_preset in presets():
        return None, PRESETS[path_or_preset]
    folder = _checkpoint_dir(Path(path_or_preset))
    config_json = json.loads((folder / "config.json").read_text())
    complete = weight_format(config_json.get("_class_name")).complete_config
    return folder, config_json if complete is None else complete(config_json, checkpoint_keys(folder))


def build_random(
    config_json: dict, *, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0
) -> nn.Module:
    """Any config (config.json form, `_class_name` included) with deterministic random weights."""
    _, _, model = build_empty(config_json, dtype, device)
    return random_init(model, seed).eval().requires_grad_(False)


def build_empty(config_json: dict, dtype: torch.dtype, device, stored: StoredFp8 | None = None):
    """(weight format, config, model with uninitialised parameters allocated in dtype on device; the layers
    `stored` keeps in float8 allocated in float8)."""
    weights = weight_format(config_json.get("_class_name"))
    config = weights.parse_config(config_json)
    with torch.device("meta"):
        model = weights.build(config)
    if stored is not None:
        stored.swap(model, weights.resolver(config))
    materialize(model, dtype=dtype, device=torch.device(device), keep_fp32=weights.keep_fp32)
    return weights, config, model
