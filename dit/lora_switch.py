"""A LoRA set per job (`GenerationRequest.loras`): applied to the raw transformer(s) before the job, the base
weights restored exactly before the next job with another set.

How: the first time a set touches a parameter, its base value is copied to host memory (kept for good: a
parameter costs its size once, however many sets touch it). A switch copies the previous set's parameters
back from those copies, bit for bit, then adds the new set with `dit.lora.merge`, the very float32 add a load
with `--lora` does: a job with LoRA X gives the latents of a pipeline loaded with X merged, and a job without
LoRA the base pipeline's. The last `keep` sets' file tensors (factors, not deltas) stay in host memory, so a
switch back reads no file.

Why not subtract to unmerge: in bf16 W + Δ − Δ does not round back to W. Measured (bench/lora_switch.py,
2-core CPU, 2026-11-25, tiny-random, rank-4 LoRAs on every block linear layer): one round trip of two LoRAs
changes 2 % of the bf16 weights (up to 2.3e-3 of a tensor's range, 4.8e-3 after 16) and a job's latents by
1.8e-2 relative (2.2e-2 after 16); fp32 drifts 1e-6. Restoring from the kept copies drifts 0, and a switch
costs 0.1 ms (restore) to 1.6 ms (read + merge) there. Unmerged low-rank branches were not tried: they cost
every step of every job and are not bit-equal to a load with the LoRA merged.

Under `--quant fp8` a LoRA cannot be added to a float8 weight without rounding it twice, so the load keeps a
host copy of each FP8 layer's weight in the model dtype as it quantises it (`unquantised`): a switch merges
the set into those copies on the device and quantises the sums into the layers, as a load with `--lora X
--quant fp8` merges then quantises (the same bytes), and the base comes back by quantising the copies again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from dit import lora
from dit.failures import GenerationFailed, alike
from dit.loading import lora_resolver
from dit.lora_catalogue import FileId, LoraCatalogue
from dit.settings import PipelineConfig
from dit.weights import host_copy

LoraSet = tuple[tuple[str, float], ...]


class LoraSwitch:
    """Applies `catalogue`'s LoRAs to `models` (the raw transformers, the high-noise expert first; the same
    Parameter objects the wrapped, parallelised and compiled pipeline runs)."""

    def __init__(
        self,
        catalogue: LoraCatalogue,
        models: Sequence[nn.Module],
        keep: int,
        unquantised: Sequence[dict[str, torch.Tensor]] | None = None,
    ):
        """`unquantised`: per model, its FP8 layers' weights in the model dtype by parameter name
        (dit.fp8_linear.quantise's `keep`)."""
        self.catalogue, self.models, self.keep = catalogue, list(models), keep
        self.unquantised = list(unquantised) if unquantised else [{} for _ in self.models]
        self.base: list[dict[str, torch.Tensor]] = [{} for _ in self.models]  # name → host copy
        self.applied: tuple[LoraSet, tuple[FileId, ...]] = ((), ())
        self._changed: list[set[str]] = [set() for _ in self.models]  # what the applied set changed
        self._tensors: OrderedDict[tuple[FileId, ...], dict] = OrderedDict()  # recent sets' file tensors
        self.switches = 0  # how many times the applied set changed
        self.last_switch_s: float | None = None

    def apply(self, loras: LoraSet, group=None) -> None:
        """Make `loras` (validated: `dit.request.check_loras`) the applied set; nothing when it already is.
        A set that cannot be applied (a file changed or gone since the catalogue read it) leaves the base
        weights and raises GenerationFailed, on every rank of `group` (the replica) alike when any failed:
        the job fails, the group goes on."""
        try:
            alike(partial(self._apply, loras), group, _device(self.models[0]), (Exception,))
        except GenerationFailed as failed:
            self._restore()  # a rank that applied the set goes back to the base too
            _sync(self.models)
            raise GenerationFailed(f"loras: the set could not be applied: {failed}") from failed

    def _apply(self, loras: LoraSet) -> None:
        plans, files = self.catalogue.plans(loras)
        if (loras, files) == self.applied:
            return
        start = time.perf_counter()
        try:
            self._restore()
            if loras:
                tensors = self._read(files, plans)
                for i, merges in enumerate(plans):
                    self._changed[i].update(lora.touched(merges))
                    fp8 = self._changed[i] & self.unquantised[i].keys()
                    _keep_base(self.models[i], self.base[i], self._changed[i] - fp8)
                    for layer, part in _by_fp8_layer(merges, fp8):
                        _set_fp8(self.models[i], self.unquantised[i], layer, part, tensors)
            self.applied = (loras, files)
        except BaseException:
            self._restore()
            raise
        finally:
            _sync(self.models)
        self.switches += 1
        self.last_switch_s = time.perf_counter() - start

    @torch.no_grad()
    def _restore(self) -> None:
        for model, base, unquantised, changed in zip(
            self.models, self.base, self.unquantised, self._changed, strict=True
        ):
            params = dict(model.named_parameters())
            for name in changed - unquantised.keys():
                params[name].copy_(base[name], non_blocking=True)
            for name in changed & unquantised.keys():
                _set_fp8(model, unquantised, name)
            changed.clear()
        self.applied = ((), ())

    def _read(self, files: tuple[FileId, ...], plans: list[list[lora.Merge]]) -> dict:
        """path → its tensors, from the cache of recent sets or the files."""
        key = tuple(sorted(set(files)))  # the set's files, whatever its strengths
        tensors = self._tensors.pop(key, None)
        if tensors is None:
            tensors = {m.path: lora.read(m) for m in {m.path: m for ms in plans for m in ms}.values()}
        if self.keep > 0:
            self._tensors[key] = tensors
            while len(self._tensors) > self.keep:
                self._tensors.popitem(last=False)
        return tensors


def check_lora_dir(config: PipelineConfig) -> None:
    """The LoRA-per-request settings `load_pipeline` (and `dit.preflight`) refuse, before any weight loads."""
    if config.lora_dir is None:
        return
    if config.lora_cache < 0:
        raise ValueError(f"--lora-cache must be 0 or more, got {config.lora_cache}")
    if not Path(config.lora_dir).is_dir():
        raise ValueError(f"--lora-dir {config.lora_dir}: no such folder")


def lora_switch(
    config: PipelineConfig, raw: Sequence[tuple[nn.Module, str, dict[str, torch.Tensor]]]
) -> LoraSwitch | None:
    """The pipeline's switch over `config.lora_dir` (None without one); `raw`: each raw transformer, what
    it loaded from (its LoRA keys resolve as that checkpoint's) and its FP8 layers' unquantised weights."""
    if config.lora_dir is None:
        return None
    catalogue = LoraCatalogue(config.lora_dir, [(model, lora_resolver(source)) for model, source, _ in raw])
    models, unquantised = [model for model, _, _ in raw], [weights for _, _, weights in raw]
    return LoraSwitch(catalogue, models, config.lora_cache, unquantised)


@torch.no_grad()
def _keep_base(model: nn.Module, base: dict[str, torch.Tensor], names: set[str]) -> None:
    """Host copies of the parameters not yet kept (pinned when they live on a GPU: faster restores)."""
    for name, param in model.named_parameters():
        if name in names and name not in base:
            base[name] = host_copy(param)


def _by_fp8_layer(merges: Sequence[lora.Merge], fp8: set[str]) -> list[tuple[str | None, list[lora.Merge]]]:
    """The plans split by the FP8 layer weight each module changes (None: the modules that change none), each
    part's files in the plans' order, so every weight gets its adds in the order a load merges them."""
    parts: dict[str | None, dict[int, list]] = {}
    for index, m in enumerate(merges):
        for module in m.modules:
            weight = module.targets.get("weight", (None,))[0]
            parts.setdefault(weight if weight in fp8 else None, {}).setdefault(index, []).append(module)
    return [
        (layer, [replace(merges[index], modules=modules) for index, modules in files.items()])
        for layer, files in parts.items()
    ]


@torch.no_grad()
def _set_fp8(model, unquantised: dict[str, torch.Tensor], layer: str | None, merges=(), tensors=None) -> None:
    """FP8 layer weight `layer` quantised from a device copy of its unquantised weight, with `merges` added to
    the copy first (`layer` None: `merges` change no FP8 layer). One layer's copy at a time: the device
    never holds the model's weights twice."""
    sums = {} if layer is None else {layer: unquantised[layer].to(_device(model), copy=True)}
    lora.merge(model, merges, tensors, instead=sums)
    for name, weight in sums.items():
        model.get_submodule(name.removesuffix(".weight")).requantise(weight)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _sync(models: Sequence[nn.Module]) -> None:
    for model in models:
        device = _device(model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
