"""LoRA files merged into a model's weights at load: W += strength · (alpha / rank) · B @ A.

Each delta is computed in float32 on the weight's device and written back in the weight's own dtype, one
target tensor at a time, so no second copy of the model ever exists. A LoRA names checkpoint weights, in any
naming the family's LoRA resolver knows (Wan: diffusers' or the original repository's), in one of the layouts
trainers write:

  diffusers / PEFT  [transformer. | diffusion_model. | base_model.model.]PATH.lora_A.weight, .lora_B.weight
                    (.lora_B.bias: PEFT's lora_bias), optional PATH.alpha
  kohya / ComfyUI   lora_unet_PATH_WITH_UNDERSCORES.lora_down.weight, .lora_up.weight, .alpha
  original Wan      diffusion_model.PATH.lora_down.weight, .lora_up.weight, optional .alpha (LightX2V's), and
                    full differences added times the strength: PATH.diff (weight, or the parameter PATH
                    itself such as a modulation table), PATH.diff_b (bias), PATH.diff_m (PATH.modulation)

alpha defaults to the rank. `plan` checks every key and shape of every file before any weight is read; keys
that name no weight of the model are a ValueError listing them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dit.weights import Resolver, Target, read_safetensors

Lora = tuple[str | Path, float]  # (safetensors file, strength)

_PREFIXES = ("base_model.model.", "transformer.", "model.diffusion_model.", "diffusion_model.")
_KOHYA = "lora_unet_"
# key ending → role; each role changes one parameter of its module (_PARAM)
_ROLES = {"lora_A.weight": "down", "lora_down.weight": "down", "lora_B.weight": "up",
          "lora_up.weight": "up", "lora_B.bias": "up_b", "alpha": "alpha", "diff": "diff", "diff_b": "diff_b",
          "diff_m": "diff_m"}  # fmt: skip
_PARAM = {"down": "weight", "up": "weight", "alpha": "weight", "diff": "weight", "up_b": "bias",
          "diff_b": "bias", "diff_m": "modulation"}  # fmt: skip
_DIFFS = ("diff", "diff_b", "diff_m")
_SHOWN = 20  # unknown keys listed in the error


def parse_spec(spec: str) -> tuple[str, float]:
    """PATH[:STRENGTH] → (path, strength), strength 1 by default. Paths may hold ':', so the text after the
    last ':' is the strength only when it is a number."""
    path, sep, tail = spec.rpartition(":")
    try:
        strength = float(tail) if sep else None
    except ValueError:
        strength = None
    if strength is None:
        path, strength = spec, 1.0
    if not path:
        raise ValueError(f"LoRA {spec!r}: no file path (expected PATH[:STRENGTH])")
    if not math.isfinite(strength):
        raise ValueError(f"LoRA {spec!r}: the strength must be a finite number")
    return path, strength


def parse_specs(text: str) -> tuple[tuple[str, float], ...]:
    """A list of PATH[:STRENGTH] separated by ',' or ';' (ITHACA_LORA); blanks are ignored."""
    return tuple(parse_spec(s.strip()) for s in re.split("[,;]", text) if s.strip())


@dataclass
class _Module:
    """One module a LoRA file changes: its keys by role, and the target of each parameter it changes."""

    keys: dict[str, str]  # role → key
    targets: dict[str, Target]  # "weight" | "bias" | "modulation" → (our parameter, part, parts)


@dataclass
class Merge:
    """One LoRA file's checked plan: what `merge` adds where."""

    path: str
    strength: float
    modules: list[_Module]


def _split(key: str) -> tuple[str, str] | None:
    """key → (module path, role); kohya paths keep their underscores. None: not a LoRA key layout."""
    for prefix in _PREFIXES:
        key = key.removeprefix(prefix)
    for ending, role in _ROLES.items():
        if key.endswith("." + ending):
            return key[: -len(ending) - 1], role
    return None


def _readings(module: str) -> list[str]:
    """The dotted paths a module path may stand for: in kohya's, each '_' may be a '.' (blocks_0_ffn_0)."""
    if not module.startswith(_KOHYA):
        return [module]
    parts = module.removeprefix(_KOHYA).split("_")
    return [
        "".join(itertools.chain.from_iterable(zip(parts, seps, strict=False))) + parts[-1]
        for seps in itertools.product("._", repeat=len(parts) - 1)
    ]


def _resolve(resolve: Resolver, params: dict, module: str, param: str) -> Target | None:
    for name in (f"{module}.{param}", module):  # the module's parameter, or the module path as a parameter
        try:
            target = resolve(name)
        except KeyError:
            continue
        if target is not None and target[0] in params:
            return target
    return None


def _targets(resolve: Resolver, params: dict, module: str, roles) -> dict[str, Target] | None:
    """The targets of the parameters the roles change, under the one reading of the module path that resolves
    them all; None when no reading (or readings that disagree) does."""
    found = []
    for path in _readings(module):
        targets = {_PARAM[r]: _resolve(resolve, params, path, _PARAM[r]) for r in roles}
        if all(targets.values()):
            found.append(targets)
    return found[0] if found and all(t == found[0] for t in found) else None


def _check(module: str, keys: dict[str, str], shapes: dict, targets: dict, params: dict) -> list[str]:
    """Why the module's tensors cannot be merged (an empty list when they can)."""
    pair = {"down", "up"} & keys.keys()
    if len(pair) == 1 or (not pair and keys.keys() & {"alpha", "up_b"}):
        return [f"{module}: a LoRA needs both its down (A) and up (B) matrix, got {sorted(keys)}"]
    shape = {role: shapes[key] for role, key in keys.items()}
    deltas = {role: shape[role] for role in keys if role in ("up_b", *_DIFFS)}  # added as they are
    if pair:
        down, up = shape["down"], shape["up"]
        if len(up) < 2 or down[0] != up[1]:
            return [f"{module}: A {down} and B {up} do not share a rank"]
        deltas["up"] = (up[0], math.prod(down[1:]))  # B @ A, a conv kernel flattened
    errors = []
    for role, delta in deltas.items():
        name, part, parts = targets[_PARAM[role]]
        dst = params[name].chunk(parts, 0)[part]
        if delta not in (tuple(dst.shape), (dst.shape[0], dst[0].numel())):
            whole = tuple(params[name].shape)
            fused = "" if parts == 1 else f", part {part + 1} of {parts} of the fused {whole}"
            errors.append(f"{keys[role]}: delta {delta} does not fit {name} {tuple(dst.shape)}{fused}")
    return errors


def _plan_file(path: str, strength: float, params: dict, resolve: Resolver) -> Merge:
    with read_safetensors(path) as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    if not shapes:  # merged as nothing, silently: an export that went wrong
        raise ValueError(f"LoRA {path}: it holds no tensors")
    groups: dict[str, dict[str, str]] = {}  # module path → role → key
    unknown, errors = [], []
    for key in shapes:
        split = _split(key)
        if split is None:
            unknown.append(key)
        elif split[1] in groups.setdefault(split[0], {}):
            errors.append(f"{key}: a second {split[1]} tensor for {split[0]}")
        else:
            groups[split[0]][split[1]] = key
    modules = []
    for module, keys in groups.items():
        targets = _targets(resolve, params, module, keys)
        if targets is None:
            unknown += keys.values()
            continue
        errors += _check(module, keys, shapes, targets, params)
        modules.append(_Module(keys, targets))
    if unknown:
        more = f", … ({len(unknown) - _SHOWN} more)" if len(unknown) > _SHOWN else ""
        errors.insert(
            0, f"{len(unknown)} key(s) name no weight of the model: {', '.join(unknown[:_SHOWN])}{more}"
        )
    if errors:
        raise ValueError(f"LoRA {path}: " + "; ".join(errors))
    return Merge(path, strength, modules)


def not_a_file(path: str | Path) -> str | None:
    """Why `path` is no LoRA file to read (a folder was said to be "no such file"), or None. A file whose
    `:STRENGTH` is no number (`parse_spec` kept it in the path) is said so: "no such file" blamed the file."""
    if Path(path).is_file():
        return None
    if Path(path).is_dir():
        return "a folder, not a LoRA file"
    head, sep, tail = str(path).rpartition(":")
    if sep and Path(head).is_file():
        return f"no such file; {head} is one, but {tail!r} after its ':' is no strength (a number)"
    return "no such file"


def plan(model: nn.Module, loras: Sequence[Lora], resolve: Resolver) -> list[Merge]:
    """Every file's keys and shapes checked against the model (allocated, its weights need not be loaded yet)
    before any tensor is read: a ValueError names each key that does not fit."""
    params = dict(model.named_parameters())
    merges = []
    for path, strength in loras:
        missing = not_a_file(path)
        if missing:
            raise FileNotFoundError(f"LoRA {path}: {missing}")
        merges.append(_plan_file(str(path), float(strength), params, resolve))
    return merges


def _add(params: dict, target: Target, delta: torch.Tensor) -> None:
    name, part, parts = target
    dst = params[name].chunk(parts, 0)[part]
    dst.copy_(dst.float().add_(delta.reshape(dst.shape)))  # float32 sum, written back in dst's dtype


def _merge_module(get: Callable[[str], torch.Tensor], module: _Module, strength: float, params: dict) -> None:
    device = params[next(iter(module.targets.values()))[0]].device

    def tensor(role: str) -> torch.Tensor:
        return get(module.keys[role]).to(device, torch.float32)

    if "down" in module.keys:
        down, up = tensor("down"), tensor("up")
        rank = down.shape[0]
        scale = strength * (tensor("alpha").item() if "alpha" in module.keys else rank) / rank
        _add(params, module.targets["weight"], scale * (up.flatten(1) @ down.flatten(1)))
        if "up_b" in module.keys:
            _add(params, module.targets["bias"], scale * tensor("up_b"))
    for role in _DIFFS:
        if role in module.keys:
            _add(params, module.targets[_PARAM[role]], strength * tensor(role))


def read(m: Merge) -> dict[str, torch.Tensor]:
    """The tensors a plan adds (its factors and differences, as stored), read from its file."""
    with read_safetensors(m.path) as f:
        return {key: f.get_tensor(key) for module in m.modules for key in module.keys.values()}


def touched(merges: Sequence[Merge]) -> set[str]:
    """The names of the parameters the plans change."""
    return {target[0] for m in merges for module in m.modules for target in module.targets.values()}


@torch.no_grad()
def merge(
    model: nn.Module,
    merges: Sequence[Merge],
    tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    instead: Mapping[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Add each planned LoRA to the loaded weights, one target tensor at a time. `tensors`: each plan's
    tensors by its path, already `read` (else they are read from the files as they are added). `instead`:
    tensors the adds go to in place of the parameters of those names (dit.lora_switch: an FP8 layer's
    unquantised weight)."""
    params = {**dict(model.named_parameters()), **(instead or {})}
    for m in merges:
        with contextlib.nullcontext(tensors[m.path]) if tensors else read_safetensors(m.path) as f:
            get = f.__getitem__ if tensors else f.get_tensor
            for module in m.modules:
                _merge_module(get, module, m.strength, params)
    return model
