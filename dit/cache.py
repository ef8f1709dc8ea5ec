"""Step caching, training-free: skip all but the first block of the DiT at steps where the first block's
output has barely moved (a first-block residual cache, as ParaAttention's FBCache): if the first block's
residual differs from the one at the last full evaluation by less than `threshold` (relative L1 over the
video's real tokens), the other blocks' residual from that evaluation is added instead of running them.

One decision per step, taken from the prompt's (conditional) pass and followed by the negative prompt's, so
that the two halves of classifier-free guidance always come from the same evaluations. The L1 sums run over
the replica: the sequence-parallel ranks' shards (padding excluded) and, under CFG parallel, both cfg ranks
(the negative prompt's ranks add zeros), so every rank of every layout takes the same decision at every step
(a decision from a rank's own shard would let the ranks diverge, and a collective skipped by some ranks
would hang the others).

A checkpoint (dit.denoise_state) keeps each rank's residuals (`StepCache.state`), so a resumed generation
takes the decisions, and adds the residuals, that the uninterrupted one would have: bit for bit on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class Evaluations:
    """One generation's transformer evaluations (each CFG pass of each step is one, on whichever ranks it
    ran), so every layout of a replica counts the same; the job view and /metrics report them."""

    evaluated: int = 0  # run in full
    skipped: int = 0  # the first block only


@dataclass
class StepCache:
    """One generation's cache. `real(x)` is this rank's real tokens of a block output (its shard without
    padding); `reduce(v)` sums a small float64 vector over the replica. `cfg_parallel`: this rank runs one
    CFG half, and the other half runs on other ranks at the same time."""

    threshold: float
    real: Callable[[torch.Tensor], torch.Tensor]
    reduce: Callable[[torch.Tensor], torch.Tensor]
    cfg_parallel: bool
    stats: Evaluations = field(default_factory=Evaluations)
    current: str = "cond"  # the pass being evaluated: "cond" (the prompt) or "uncond" (the negative)
    _first: torch.Tensor | None = None  # the prompt's first-block residual at its last full evaluation
    _rest: dict = field(default_factory=dict)  # per pass: the other blocks' residual at that evaluation
    _skip: bool = False  # this step's decision, taken by the prompt's pass

    def run(self, x: torch.Tensor, first: Callable, rest: Callable) -> torch.Tensor:
        """The blocks' output for input x: `first(x)` (the first block), then `rest(h)` (all the others) or,
        when the step is skipped, the residual they added last time."""
        h = first(x)
        if self.current == "cond" or self.cfg_parallel:
            self._skip = self._decide(h - x)
        halves = 2 if self.cfg_parallel else 1  # the other CFG half took the same decision elsewhere
        if self._skip:
            self.stats.skipped += halves
            return h + self._rest[self.current]
        self.stats.evaluated += halves
        if self.current == "cond":
            self._first = h - x
        out = rest(h)
        self._rest[self.current] = out - h
        return out

    def state(self) -> dict:
        """This rank's residuals of the last full evaluation, copied to the CPU (a checkpoint's entry)."""
        return {"first": _cpu(self._first), "rest": {name: _cpu(r) for name, r in self._rest.items()}}

    def load(self, state: dict, device) -> None:
        """Go on from `state()` of this rank at a checkpoint (its kinds checked by `malformed_states`; its
        shapes at the next decision, on every rank of the replica at once)."""
        self._first = None if state["first"] is None else state["first"].to(device)
        self._rest = {name: r.to(device) for name, r in state["rest"].items()}

    def restart(self, real: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Another model takes over (its real tokens: `real`): the last full evaluation is forgotten, so the
        next step runs in full."""
        self.real, self._first, self._rest = real, None, {}

    def _decide(self, residual: torch.Tensor) -> bool:
        if not self._rest:  # the first step: every rank of the replica evaluates in full
            return False
        mine = torch.zeros(2, dtype=torch.float64, device=residual.device)
        if not self._fits(residual):  # a resumed checkpoint's residuals do not fit: all ranks evaluate
            mine[0] = float("inf")
        elif self.current == "cond":  # the negative prompt's ranks (CFG parallel) add zeros
            now, last = self.real(residual).double(), self.real(self._first).double()
            mine = torch.stack([(now - last).abs().sum(), last.abs().sum()])
        change, scale = self.reduce(mine).tolist()
        return change < self.threshold * scale

    def _fits(self, residual: torch.Tensor) -> bool:
        """The kept residuals can be compared with and added to this pass's (always, but after a resume from
        a file, which could hold others)."""
        kept = [*self._rest.values(), *([self._first] if self.current == "cond" else [])]
        like = (residual.shape, residual.dtype, residual.device)
        return self.current in self._rest and all(r is not None and (r.shape, r.dtype, r.device) == like
                                                   for r in kept)  # fmt: skip


def malformed_states(states, ranks: int) -> str | None:
    """What in a checkpoint's step-cache states (one `StepCache.state()` per rank of a replica of `ranks`)
    a resume could not load, or None."""
    if not isinstance(states, list) or len(states) != ranks:
        return f"the step cache does not hold one state for each of the {ranks} ranks"
    for state in states:
        if (
            not isinstance(state, dict)
            or state.keys() != {"first", "rest"}
            or not isinstance(state["rest"], dict)
        ):
            return "a step-cache state is not its first block's residual and the others'"
        if not state["rest"] or not state["rest"].keys() <= {"cond", "uncond"}:
            return "a step-cache state holds no residuals of the prompt's or the negative prompt's pass"
        kept = [*state["rest"].values(), *([] if state["first"] is None else [state["first"]])]
        if not all(isinstance(r, torch.Tensor) and r.is_floating_point() for r in kept):
            return "a step-cache residual is not a floating-point tensor"
    return None


def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to("cpu", copy=True)


def _transformer(model):
    """The DiT inside a family's wrapper (HunyuanVideo-1.5's text-to-video adapter), or the model itself."""
    return getattr(model, "transformer", model)


def real_tokens(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """This rank's real tokens of the model's block outputs: its sequence sharding's (Wan's hooks
    `sequence_parallel`, HunyuanVideo-1.5's `sequence`), all of them when the model is not sharded."""
    inner = _transformer(model)
    sharding = getattr(inner, "sequence_parallel", None) or getattr(inner, "sequence", None)
    return sharding.real_tokens if sharding is not None else lambda x: x


@contextmanager
def attached(model, cache: StepCache | None) -> Iterator[None]:
    """`model` runs with `cache` inside the block (nothing changes for None). A model opts in with a
    `step_cache` attribute that its forward consults (dit.wan.model.WanModel, HunyuanVideo15Transformer)."""
    if cache is None or model is None:
        yield
        return
    inner = _transformer(model)
    if not hasattr(inner, "step_cache"):
        raise ValueError(f"step caching is not implemented for {type(inner).__name__}")
    inner.step_cache = cache
    try:
        yield
    finally:
        inner.step_cache = None
