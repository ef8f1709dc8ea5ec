"""Denoising checkpoints: all a sampling loop needs to go on after a step as if it had never stopped.

A `DenoiseState` holds the latents after `step` steps, the scheduler's whole state (every attribute but its
config: the multistep history UniPC keeps, the step index, ...), the CPU generator's state (a renoise
sampler's fresh noise comes from it) and the evaluations counted so far. Resumed with the same model, layout
and request, the loop's remaining steps see exactly the numbers they would have seen: on the CPU the final
latents are bit-identical. The one exception is the step cache (dit.cache): its residuals are per rank and
are not kept, so a cached generation evaluates the first step after a resume in full.

Files hold the state with a `key` (a JSON-able description of the model, layout and request) and are read
with `torch.load(weights_only=True)`: plain tensors, numbers and lists, never code. A file whose format or key
differs, or that cannot be read, is refused with the reason: it is never trusted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

FORMAT = 1
_PLAIN = (torch.Tensor, int, float, bool, str, type(None))


@dataclass
class DenoiseState:
    step: int  # steps completed
    latents: torch.Tensor  # float32, on the CPU
    scheduler: dict  # the scheduler's attributes but its config
    generator: torch.Tensor  # torch.Generator.get_state() of the CPU generator
    evaluated: int = 0
    skipped: int = 0


@dataclass
class Checkpointing:
    """Where a sampling loop sends its state, and when. `every` > 0: after every `every` steps. `every` = 0
    (auto): whenever the steps since the last save took at least 1/`share` times what a save costs (its
    capture plus `write_cost()`, the writer's last write), so saving stays under `share` of the time; before
    a cost is known the first step saves, and measures it. Never after the last step."""

    every: int
    save: Callable[[DenoiseState], None]
    share: float = 0.01
    write_cost: Callable[[], float] = lambda: 0.0
    _since: float = field(default_factory=time.perf_counter)
    _capture_s: float = 0.0

    def due(self, step: int, steps: int) -> bool:
        if step >= steps:
            return False
        if self.every > 0:
            return step % self.every == 0
        return time.perf_counter() - self._since >= (self._capture_s + self.write_cost()) / self.share

    def take(self, state: Callable[[], DenoiseState]) -> None:
        """Capture the state (`state()`), hand it to `save`, and restart the clock."""
        start = time.perf_counter()
        self.save(state())
        self._since = time.perf_counter()
        self._capture_s = self._since - start


def capture(
    step: int, latents: torch.Tensor, scheduler, generator: torch.Generator | None, counts
) -> DenoiseState:
    """A copy of the loop's state after `step` steps (nothing in it is shared with the live loop)."""
    return DenoiseState(
        step=step,
        latents=latents.detach().to("cpu", torch.float32, copy=True),
        scheduler={k: _copy(k, v) for k, v in vars(scheduler).items() if k != "_internal_dict"},
        generator=(generator or torch.Generator()).get_state(),
        evaluated=counts.evaluated if counts is not None else 0,
        skipped=counts.skipped if counts is not None else 0,
    )


def restore(
    state: DenoiseState, scheduler, generator: torch.Generator | None, counts, device
) -> torch.Tensor:
    """Put `state` back into a scheduler whose timesteps are set, the generator and the counts; returns the
    latents on `device`."""
    for name, value in state.scheduler.items():
        now = getattr(scheduler, name, None)  # a schedule tensor goes back where set_timesteps put it
        setattr(scheduler, name, _copy(name, value, now.device if isinstance(now, torch.Tensor) else device))
    if generator is not None:
        generator.set_state(state.generator)
    if counts is not None:
        counts.evaluated += state.evaluated
        counts.skipped += state.skipped
    return state.latents.to(device)


def _copy(name: str, value, device=None):
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(name, v, device) for v in value)
    if not isinstance(value, _PLAIN):
        raise TypeError(f"scheduler attribute {name!r} is a {type(value).__name__}: not checkpointed")
    if isinstance(value, torch.Tensor):
        return value.detach().to(device or "cpu", copy=True)
    return value


def save_file(path: str, state: DenoiseState, key: dict) -> None:
    """Write `state` with its `key` to `path` through a temporary file and a rename: a crash mid-write leaves
    the previous checkpoint."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    root, ext = os.path.splitext(path)
    tmp = f"{root}.partial{ext}"  # a crash leaves a name of the same kind, for a sweep to find
    torch.save({"format": FORMAT, "key": json.dumps(key, sort_keys=True), "state": asdict(state)}, tmp)
    os.replace(tmp, path)


def load_file(path: str, key: dict) -> tuple[DenoiseState | None, str | None]:
    """(state, None) when `path` holds a checkpoint made under `key`; (None, why not) otherwise, and
    (None, None) when there is no file."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, None
    except Exception as e:  # a torn or foreign file: start over rather than trust it
        return None, f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None, f"format {data.get('format') if isinstance(data, dict) else '?'} is not {FORMAT}"
    theirs, key = json.loads(data["key"]), json.loads(json.dumps(key, sort_keys=True))  # tuples read as lists
    if theirs != key:
        differ = sorted(k for k in key.keys() | theirs.keys() if key.get(k) != theirs.get(k))
        return None, f"made for another {', '.join(differ)}"
    try:
        return DenoiseState(**data["state"]), None
    except TypeError as e:
        return None, f"malformed ({e})"
