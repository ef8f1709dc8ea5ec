"""Pre-quantised FP8 checkpoints: transformer weights stored in float8_e4m3fn beside their scales
(weight ≈ stored · scale).

The layouts read:
- LightX2V's FP8 Wan checkpoints (ModelTC/LightX2V: tools/convert/converter.py `quantize_model` with
  tools/convert/quant/quant.py `QuantWeightFP8` write them, lightx2v/common/ops/mm/mm_weight.py reads them):
  `X.weight_scale` beside `X.weight`, shape [out, 1], one scale per output channel (the row's amax / 448),
  the original Wan key names; the 2-D weights of the blocks' self_attn, cross_attn and ffn are float8, every
  other tensor is stored as it was.
- The same converter's ComfyUI mode and ComfyUI's "fp8 scaled" files: `X.scale_weight`, one scale for the
  whole tensor, and a `scaled_fp8` marker tensor (skipped).
- Float8 weights without a scale (plain fp8_e4m3fn files): scale 1; in a file that scales its other float8
  weights, a ValueError naming them (they lost their scales).
A per-tensor scale becomes one per output channel (the same number in every row: exact). Any other scale shape
(block-wise [out/128, in/128], per input channel), a scale no converter writes (non-finite, negative, all
zero) or a float8_e5m2 weight is a ValueError naming the key.

With `--quant fp8` each linear layer whose weight (every part of a fused one) is stored in float8 with a scale
becomes an `Fp8Linear` allocated in float8 and filled with the stored bytes and scales: no copy in the model
dtype ever exists. Otherwise (no `--quant fp8`, LoRAs to merge, no scale) a weight is dequantised, stored ·
scale in float32, into the model dtype as it streams in, like any checkpoint; `--quant fp8` then quantises
those layers again after the merge (the peak of a bf16 load).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dit.fp8_linear import Fp8Linear, replace_module
from dit.weights import Resolver, complete_slots, read_safetensors

MARKER = "scaled_fp8"  # ComfyUI's flag that a file is "fp8 scaled": no weight


def _scale_keys(key: str) -> tuple[str, str]:
    """Where a float8 weight's scale may be: LightX2V's `X.weight_scale`, ComfyUI's `X.scale_weight`."""
    return key + "_scale", key.removesuffix(".weight") + ".scale_weight"


def per_channel(scale: torch.Tensor, shape: list[int], key: str) -> torch.Tensor:
    """A stored scale → float32 [out, 1] for a 2-D weight of `shape` (a scalar for any other weight)."""
    scale = scale.float()
    if scale.numel() == 1:
        return scale.reshape(()).expand(shape[0], 1).clone() if len(shape) == 2 else scale.reshape(())
    if len(shape) == 2 and tuple(scale.shape) in ((shape[0],), (shape[0], 1)):
        return scale.reshape(shape[0], 1)
    raise ValueError(
        f"{key}: a scale of shape {tuple(scale.shape)} for a float8 weight of shape {tuple(shape)} is not "
        "understood: one scale per output channel ([out, 1] or [out]) or one for the whole tensor is; "
        "block-wise and per-input-channel scales are not"
    )


@dataclass
class StoredFp8:
    """The float8 weights of a checkpoint and how they load (see the module's docstring)."""

    scales: dict[str, torch.Tensor] = field(default_factory=dict)  # float8 weight key → `per_channel` scale
    scale_keys: dict[str, str] = field(default_factory=dict)  # scale key → its weight key
    markers: set[str] = field(default_factory=set)
    kept: set[str] = field(default_factory=set)  # weight keys loaded as float8 (`swap`)

    @classmethod
    def scan(cls, files: Iterable[str | Path]) -> StoredFp8:
        """The float8 weights of `files` from their headers; only the (small) scales are read."""
        headers = {}
        for f in files:
            with read_safetensors(f) as sf:
                for key in sf.keys():
                    view = sf.get_slice(key)
                    headers[key] = (str(f), view.get_dtype(), view.get_shape())
        stored, unscaled = cls(), []
        for key, (_, dtype, shape) in headers.items():
            if key.rpartition(".")[2] == MARKER:
                stored.markers.add(key)
            elif dtype == "F8_E5M2":
                raise ValueError(f"{key}: float8_e5m2 weights are not supported (float8_e4m3fn are)")
            elif dtype == "F8_E4M3":
                scale_key = next((k for k in _scale_keys(key) if k in headers), None)
                if scale_key is None:
                    unscaled.append(key)
                    stored.scales[key] = per_channel(torch.ones(()), shape, key)
                    continue
                scale = per_channel(_read(headers[scale_key][0], scale_key), shape, scale_key)
                stored.scales[key], stored.scale_keys[scale_key] = _checked(scale, scale_key), key
        if unscaled and stored.scale_keys:  # a plain float8 file has none: scale 1; these lost theirs
            raise ValueError(
                f"{len(unscaled)} float8 weight(s) have no scale where {len(stored.scale_keys)} others have "
                f"one: {', '.join(sorted(unscaled)[:3])}{', ...' if len(unscaled) > 3 else ''}; read as "
                "scale 1 they made noise: convert the checkpoint again"
            )
        return stored

    def swap(self, model: nn.Module, resolve: Resolver) -> None:
        """On the meta model: each linear layer whose weight is stored in float8 with a scale, every part of
        it, becomes an empty `Fp8Linear` for the stored bytes (keys that do not resolve are left for the
        loader to report)."""
        slots, keys = defaultdict(set), defaultdict(list)
        for key in self.scale_keys.values():
            try:
                target = resolve(key)
            except KeyError:
                continue
            if target is None or not target[0].endswith(".weight"):
                continue
            name, part, parts = target
            module_name = name.removesuffix(".weight")
            slots[module_name].add((part, parts))
            keys[module_name].append(key)
        modules = dict(model.named_modules())
        for name, filled in slots.items():
            module = modules.get(name)
            if isinstance(module, nn.Linear) and complete_slots(filled):
                replace_module(model, name, Fp8Linear(module, stored=True))
                self.kept.update(keys[name])

    def resolver(self, resolve: Resolver) -> Resolver:
        """`resolve` with the scales: a kept weight's scale fills its layer's `weight_scale` (the same part);
        another's is folded into its dequantised weight; the marker is skipped."""

        def resolve_stored(key: str):
            weight = self.scale_keys.get(key)
            if key in self.markers or (weight is not None and weight not in self.kept):
                return None
            if weight is None:
                return resolve(key)
            name, part, parts = resolve(weight)
            return f"{name}_scale", part, parts

        return resolve_stored

    def prepare(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """What a checkpoint tensor loads as: a kept weight's stored bytes, a kept scale as [out, 1] float32,
        any other float8 weight dequantised in float32."""
        if key in self.kept:
            return tensor
        if key in self.scale_keys:
            return self.scales[self.scale_keys[key]]
        scale = self.scales.get(key)
        return tensor if scale is None else tensor.float() * scale


def _checked(scale: torch.Tensor, key: str) -> torch.Tensor:
    """`scale`, or a ValueError naming its key when it holds a value no converter writes (the row's amax /
    448): a non-finite or negative one, or zeros alone (the weights would read as NaN, flipped or all zero,
    and the video as noise)."""
    if not bool(torch.isfinite(scale).all()):
        bad = "non-finite"
    elif bool((scale < 0).any()):
        bad = "negative"
    elif not bool((scale > 0).any()):
        bad = "only zero"
    else:
        return scale
    raise ValueError(f"{key}: {bad} scales: the checkpoint is damaged (convert it again)")


def _read(path: str, key: str) -> torch.Tensor:
    with read_safetensors(path) as sf:
        return sf.get_tensor(key)
