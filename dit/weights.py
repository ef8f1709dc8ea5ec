"""Weight loading shared by every model family: build on the meta device, allocate each parameter directly in
its target dtype/device, then stream safetensors one tensor at a time into it (no full fp32 copy ever exists).

A family describes its checkpoint with `resolve(key) -> (param, part, parts) | None`: the tensor fills slice
`part` of `parts` equal slices along dim 0 of our parameter (fused projections), or None to skip a key the
reference ignores. Unknown keys raise KeyError; every error is reported before any tensor is read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

Target = tuple[str, int, int]
Resolver = Callable[[str], "Target | None"]
Prepare = Callable[[str, torch.Tensor], torch.Tensor]


def checkpoint_keys(folder: str | Path) -> set[str]:
    """The tensor names of a checkpoint folder, read from the files' headers (no tensor is loaded)."""
    keys: set[str] = set()
    for path in checkpoint_files(folder):
        with read_safetensors(path) as f:
            keys.update(f.keys())
    return keys


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the sharded index's files, else the single file."""
    folder = Path(folder)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = json.loads(indexes[0].read_text())["weight_map"]
        return [folder / name for name in dict.fromkeys(weight_map.values())]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


def materialize(model: nn.Module, *, dtype: torch.dtype, device, keep_fp32: Iterable[str] = ()) -> nn.Module:
    """Replace meta parameters by uninitialised ones in `dtype` on `device`; names containing one of
    `keep_fp32` stay float32 (small precision-critical tensors, like diffusers' `_keep_in_fp32_modules`), and
    those a module lists in `stored_dtypes` keep theirs (a pre-quantised layer's float8 weight and scales)."""
    keep_fp32 = tuple(keep_fp32)
    for mod_name, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            full = f"{mod_name}.{name}" if mod_name else name
            want = torch.float32 if any(k in f".{full}" for k in keep_fp32) else dtype
            want = p.dtype if name in getattr(module, "stored_dtypes", ()) else want
            setattr(
                module,
                name,
                nn.Parameter(torch.empty(p.shape, dtype=want, device=device), requires_grad=False),
            )
        if any(b.is_meta for b in module.buffers(recurse=False)):
            raise ValueError(f"{mod_name}: meta buffers cannot be loaded; compute such tables in forward")
    return model


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` copied to host memory, pinned when `t` lives on a GPU (so copying it back is fast)."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda).copy_(t)


def complete_slots(slots: set[tuple[int, int]]) -> bool:
    parts = next(iter(slots), (0, 1))[1]
    return slots == {(i, parts) for i in range(parts)}


def _plan(model: nn.Module, keys: Iterable[str], resolve: Resolver) -> dict[str, Target]:
    params = dict(model.named_parameters())
    plan, unexpected, filled = {}, [], {}
    for key in keys:
        try:
            target = resolve(key)
        except KeyError:
            unexpected.append(key)
            continue
        if target is None:
            continue
        name, part, parts = target
        if name not in params:
            unexpected.append(f"{key} (→ {name})")
            continue
        plan[key] = target
        filled.setdefault(name, set()).add((part, parts))
    missing = [n for n in params if not complete_slots(filled.get(n, set()))]
    if unexpected or missing:
        raise ValueError(
            f"checkpoint does not match the model: {len(unexpected)} unexpected key(s) {unexpected[:8]}, "
            f"{len(missing)} missing parameter(s) {missing[:8]}"
        )
    return plan


def _copy(params: dict, key: str, target: Target, tensor: torch.Tensor) -> None:
    name, part, parts = target
    dst = params[name].chunk(parts, 0)[part]
    if dst.shape != tensor.shape:
        raise ValueError(
            f"{key}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(dst.shape)} ({name})"
        )
    dst.copy_(tensor)


def _as_stored(key: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@torch.no_grad()
def load_safetensors(
    model: nn.Module, files: Iterable[str | Path], resolve: Resolver, prepare: Prepare = _as_stored
) -> nn.Module:
    """Stream every tensor of `files` into the (materialised) model, one tensor in memory at a time;
    `prepare(key, tensor)` gives what is copied (dit.fp8_checkpoint: dequantised weights, whole scales)."""
    files = [str(f) for f in files]
    keys = {}
    for f in files:
        with read_safetensors(f) as sf:
            keys.update(dict.fromkeys(sf.keys(), f))
    plan = _plan(model, keys, resolve)
    params = dict(model.named_parameters())
    for f in files:
        with read_safetensors(f) as sf:
            for key in sf.keys():
                if key in plan:
                    _copy(params, key, plan[key], prepare(key, sf.get_tensor(key)))
    return model


@contextlib.contextmanager
def read_safetensors(path: str | Path):
    """`safe_open(path)` for torch; a damaged file (cut short in a copy, or not safetensors at all) is a
    ValueError naming it, a mistake said in one line, not safetensors' traceback."""
    try:
        with safe_open(str(path), framework="pt") as f:
            yield f
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None


@torch.no_grad()
def load_state(model: nn.Module, state: dict[str, torch.Tensor], resolve: Resolver) -> nn.Module:
    """Same as `load_safetensors` for an in-memory state dict (e.g. a live diffusers model's)."""
    plan = _plan(model, state, resolve)
    params = dict(model.named_parameters())
    for key, target in plan.items():
        _copy(params, key, target, state[key])
    return model


_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)


@torch.no_grad()
def random_init(model: nn.Module, seed: int = 0, on_device: bool = False) -> nn.Module:
    """Deterministic random weights: the same seed gives the same weights on every rank and every device
    (drawn from a CPU generator, then copied: CUDA's generator draws other numbers), so a random preset makes
    the same video on a GPU as on the CPU. Linear/conv weights ~ N(0, 1/fan_in), biases ~ N(0, 0.02²), norm
    weights ~ 1 + N(0, 0.02²), other tables ~ N(0, 1/last_dim) (diffusers' scale_shift_table init).
    `on_device` draws on the parameters' own device instead: not the CPU's numbers, but a GPU fills a 14B
    model in a second where the CPU generator takes over a minute (benchmarks that only time the model)."""
    device = next(model.parameters()).device if on_device else torch.device("cpu")
    gen = torch.Generator(device).manual_seed(seed)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32, device=device).to(p.device)
            if isinstance(module, _WEIGHTED) and name == "weight":
                p.copy_(noise * (p[0].numel() ** -0.5))
            elif name == "bias":
                p.copy_(noise * 0.02)
            elif isinstance(module, _NORMS) or "norm" in name:
                p.copy_(1 + noise * 0.02)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)
    return model
