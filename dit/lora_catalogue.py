"""The LoRAs a request may name (`PipelineConfig.lora_dir`): the `.safetensors` files of one folder, by name.

    DIR/NAME.safetensors              → NAME
    DIR/SUB/NAME.safetensors          → SUB/NAME (sub-folders of plain files, any depth, '/' between parts)
    DIR/NAME/high_noise.safetensors   → NAME: a two-expert model's (Wan2.2 A14B) pair, the first file for the
    DIR/NAME/low_noise.safetensors      high-noise expert (`transformer`), the second for `transformer_2`

The pair may also be named high_noise_model/low_noise_model (the Wan2.2 repository's expert folders) or
transformer/transformer_2 (diffusers' components, which its `load_lora_weights(..., load_into_transformer_2)`
fills). A file NAME.safetensors wins over a folder NAME; names starting with '.' are skipped. A pair does
not fit a one-expert model; a plain file on a two-expert model is added to both experts (LoRAs trained on
Wan2.1 are used so; the two experts share one architecture).

Each file's fit is checked against the loaded model(s) from its header alone (`dit.lora.plan`) and kept by
(path, mtime, size): a rescan reads no header twice, and files added to the folder later appear without a
restart (every rank scans its own copy of the folder: each host serving the model needs the same files).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from safetensors import SafetensorError
from torch import nn

from dit import lora
from dit.weights import Resolver

SUFFIX = ".safetensors"
EXPERT_FILES = (("high_noise", "low_noise"), ("high_noise_model", "low_noise_model"),
                ("transformer", "transformer_2"))  # fmt: skip
FileId = tuple[str, int, int]  # (path, mtime_ns, size): a file as it is now


def scan(folder: Path) -> dict[str, tuple[Path, ...]]:
    """name → its file, or a two-expert pair (high noise, low noise); sorted by name."""
    found: dict[str, tuple[Path, ...]] = {}
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(here)
        where = here.relative_to(folder)
        stems = {f.removesuffix(SUFFIX) for f in files if f.endswith(SUFFIX) and not f.startswith(".")}
        pair = next((p for p in EXPERT_FILES if set(p) <= stems), None) if where.parts else None
        if pair is not None:
            found.setdefault(where.as_posix(), tuple(here / (stem + SUFFIX) for stem in pair))
            stems -= set(pair)
        for stem in sorted(stems):
            found.setdefault((where / stem).as_posix(), (here / (stem + SUFFIX),))
    return dict(sorted(found.items()))


def file_id(path: Path) -> FileId:
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


class LoraCatalogue:
    """The folder's LoRAs checked against the pipeline's transformer(s): `experts` holds (raw model, how its
    LoRA keys resolve), the high-noise expert first."""

    def __init__(self, folder: str | Path, experts: Sequence[tuple[nn.Module, Resolver]]):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"--lora-dir {folder}: no such folder")
        self.experts = list(experts)
        self._plans: dict[tuple[int, FileId], lora.Merge | str] = {}  # strength 1; str: why it does not fit
        self._lock = threading.Lock()  # a server may list while a job validates

    def entries(self) -> list[dict]:
        """Every name, JSON-safe: [{"name": str, "experts": bool (a high/low-noise pair), "fits": bool,
        "error": str | None (why it does not fit this model)}], sorted by name."""
        listed = []
        for name, files in scan(self.folder).items():
            try:
                self._fit(name, files)
                error = None
            except ValueError as e:
                error = str(e).removeprefix("loras: ")
            listed.append({"name": name, "experts": len(files) == 2, "fits": error is None, "error": error})
        return listed

    def plans(self, loras: Sequence[tuple[str, float]]) -> tuple[list[list[lora.Merge]], tuple[FileId, ...]]:
        """(per expert, the plans that add the set at its strengths; the files it reads, as they are now).
        ValueError starting "loras" for a name not in the folder or a file that does not fit."""
        found = scan(self.folder) if loras else {}
        per_expert: list[list[lora.Merge]] = [[] for _ in self.experts]
        ids: list[FileId] = []
        for name, strength in loras:
            if name not in found:
                raise ValueError(f"loras: no LoRA named {name!r} in the catalogue")
            for i, (merge, fid) in enumerate(self._fit(name, found[name])):
                per_expert[i].append(replace(merge, strength=strength))
                ids.append(fid)
        return per_expert, tuple(ids)

    def _fit(self, name: str, files: tuple[Path, ...]) -> list[tuple[lora.Merge, FileId]]:
        """Each expert's plan of the entry (strength 1) with the file it reads."""
        if len(files) > len(self.experts):
            raise ValueError(
                f"loras: {name} is a pair of expert files (high/low noise) for a two-expert model; this "
                "model has one"
            )
        return [self._plan(i, files[i % len(files)]) for i in range(len(self.experts))]

    def _plan(self, expert: int, path: Path) -> tuple[lora.Merge, FileId]:
        try:
            fid = file_id(path)
        except FileNotFoundError:
            raise ValueError(f"loras: {path.relative_to(self.folder)} is gone") from None
        with self._lock:
            plan = self._plans.get((expert, fid))
            if plan is None:
                model, resolve = self.experts[expert]
                try:
                    plan = lora.plan(model, [(path, 1.0)], resolve)[0]
                except (ValueError, OSError, SafetensorError) as e:  # a misfit, or not a safetensors file
                    name = path.relative_to(self.folder)  # clients see this: no path of the server's
                    said = str(e).removeprefix(f"LoRA {path}: ").replace(str(path), "it")
                    plan = f"{name}: {said}"
                self._plans[expert, fid] = plan
        if isinstance(plan, str):
            raise ValueError(f"loras: {plan}")
        return plan, fid
