"""The GPU kit's plumbing: where a section runs (`Kit`), what it reports (`Report`), and how it times."""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from unittest import mock

import torch

from bench.common import timed

GIB = 1024**3


def drawn_on_device():
    """While it holds, a random preset's weights are drawn by their device's generator: the CPU's takes over
    a minute to fill 14B weights, a GPU's a second (for sections that time a model or compare it with
    itself, not with the CPU's numbers)."""
    from dit.weights import random_init

    return mock.patch("dit.loading.random_init", partial(random_init, on_device=True))


class Skip(Exception):  # noqa: N818 - a section's way of saying "skipped: <why>", not an error
    """Raised by a section that cannot run here; the message is the reason."""


@dataclass
class Kit:
    device: torch.device
    smoke: bool  # toy sizes on the CPU: the numbers prove the code runs, not how fast
    tmp: Path  # scratch space for this run
    deadline: float  # time.monotonic() by which the whole kit must be done
    figures: dict = field(default_factory=dict)  # numbers later sections use (the modelled table)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cuda else torch.float32

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def pick(self, full, smoke):
        """The real-size value on CUDA, the toy one under --cpu-smoke."""
        return smoke if self.smoke else full

    def time(self, fn, warmup: int = 2, iters: int = 5) -> tuple[float, object, float | None]:
        """(median seconds, last output, peak GiB allocated during the calls or None on the CPU); the smoke
        run does one warm-up and one timed call."""
        if self.smoke:
            warmup, iters = 1, 1
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        sec, out = timed(fn, warmup, iters, self.device)
        return sec, out, (torch.cuda.max_memory_allocated() / GIB if self.cuda else None)

    def free(self) -> None:
        """Give cached GPU memory back between models, so each peak is that model's own."""
        gc.collect()  # a compiled model sits in reference cycles: without this its weights outlive it
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


@dataclass
class Report:
    """One section's findings: checks (pass/fail with an error figure), carried targets (met/missed),
    tables and notes."""

    smoke: bool
    checks: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, what: str, value: float, limit: float) -> bool:
        ok = math.isfinite(value) and value <= limit  # NaN never passes
        self.checks.append(dict(what=what, value=value, limit=limit, ok=ok))
        return ok

    def expect(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(dict(what=what, value=detail, ok=ok))
        return ok

    def skip_check(self, what: str, why: str) -> None:
        self.checks.append(dict(what=what, ok=None, why=why))

    def target(self, what: str, value: float | None, limit: float, unit: str, higher: bool = False) -> None:
        """A carried performance target; at toy sizes it is not judged."""
        if value is None or self.smoke:
            met = None
        else:
            met = value >= limit if higher else value <= limit
        self.targets.append(dict(what=what, value=value, limit=limit, unit=unit, higher=higher, met=met))

    def table(self, title: str, columns: list[str], rows: list[list]) -> None:
        self.tables.append(dict(title=title, columns=columns, rows=rows))

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def failed(self) -> bool:
        return any(c["ok"] is False for c in self.checks)


def fmt(value) -> str:
    """A table cell: floats to 4 significant digits, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3e}" if value and (abs(value) < 1e-3 or abs(value) >= 1e5) else f"{value:.4g}"
    return str(value)


def gib(peak: float | None) -> str:
    return "–" if peak is None else f"{peak:.1f}"
