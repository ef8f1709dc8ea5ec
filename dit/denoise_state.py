"""Denoising checkpoints: all a sampling loop needs to go on after a step as if it had never stopped.

A `DenoiseState` holds the latents after `step` steps, the scheduler's whole state (every attribute: the
multistep history UniPC keeps, the step index, ...; its class and config apart, to check a resume by), the CPU
generator's state (a renoise sampler's fresh noise comes from it) and the evaluations counted so far. Resumed
with the same model, layout and request, the loop's remaining steps see exactly the numbers they would have
seen: on the CPU the final latents are bit-identical. A cached generation's state also holds every rank's
step-cache residuals (dit.cache, gathered on the replica leader), so it resumes with the decisions it would
have taken. A batch's loop (dit.batch) gives one state per row (`capture_rows`): each job's own, to resume
alone.

Files hold the state with a `key` (a JSON-able description of the model, layout and request) and are read
with `torch.load(weights_only=True)`: plain tensors, numbers and lists, never code. A file whose format or key
differs, that cannot be read, or any of whose fields is not what a resume of the job can use (`Expected`:
its steps, the latents' shape, its ranks) is refused with the reason: it is never trusted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

import numpy as np
import torch

from dit.cache import malformed_states
from dit.files import written

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
    cache: list | None = None  # cached: each rank's StepCache.state(), in the replica's rank order
    # the scheduler's class and config (`sampler_of`): euler and renoise share a class and every attribute,
    # their config apart; None in a state made before it was kept (not checked then)
    sampler: str | None = None
    # the request it was made for (`request_key`); None: made before it was kept, or by hand (not checked)
    request: str | None = None


@dataclass(frozen=True)
class Expected:
    """What a checkpoint of one job must hold beyond its key: a step before the last of `steps`, latents
    of `latents`' shape and, when cached, one step-cache state per rank of its replica (`ranks`)."""

    steps: int
    latents: tuple[int, ...]
    ranks: int = 1
    request: str | None = None  # `request_key` of the job's validated request (None: not checked)


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
    step: int, latents: torch.Tensor, scheduler, generator: torch.Generator | None, counts, cache=None
) -> DenoiseState:
    """A copy of the loop's state after `step` steps (nothing in it is shared with the live loop); `cache`:
    the replica's step-cache states, already copies."""
    return DenoiseState(
        step=step,
        latents=latents.detach().to("cpu", torch.float32, copy=True),
        scheduler={k: _copy(k, v) for k, v in vars(scheduler).items() if k != "config"},
        generator=(generator or torch.Generator()).get_state(),
        evaluated=counts.evaluated if counts is not None else 0,
        skipped=counts.skipped if counts is not None else 0,
        cache=cache,
        sampler=sampler_of(scheduler),
    )


def stamped(checkpoints: Checkpointing | None, key: str) -> Checkpointing | None:
    """`checkpoints` whose states carry `key` as their request (`request_key`)."""
    if checkpoints is None:
        return None
    save = checkpoints.save
    return replace(checkpoints, save=lambda state: save(replace(state, request=key)))


def request_key(req) -> str:
    """A validated request as JSON, what a state made for it is stamped with: every field that moves the
    latents (not `fps`), its image as its pixels' digest. Another request's state of the same size and
    steps resumed without a word, into a video of neither."""
    fields = {name: value for name, value in vars(req).items() if name not in ("fps", "image")}
    if req.image is not None:
        pixels = np.ascontiguousarray(req.image)
        fields["image"] = [list(pixels.shape), hashlib.sha256(pixels.tobytes()).hexdigest()]
    return json.dumps(fields, sort_keys=True)


def sampler_of(scheduler) -> str:
    """The scheduler's class and config as JSON: what makes two samplers of one class differ."""
    return json.dumps({"class": type(scheduler).__name__, **scheduler.config}, sort_keys=True)


def capture_rows(
    step: int, latents: torch.Tensor, scheduler, generators: list[torch.Generator], counts, cache=None
) -> list[DenoiseState]:
    """A batch's state (dit.batch) as one `capture` per row: what that job's solo loop would hold after
    `step` steps (its latents, the scheduler with its row's history alone, its generator), so a job of a
    batch that stopped resumes alone from it. A batch runs without the step cache: `cache` is None."""
    states = []
    for row, generator in enumerate(generators):
        alone = copy.copy(scheduler)  # take_rows replaces the per-row attributes: the batch's stay whole
        alone.take_rows([row])
        states.append(capture(step, latents[row : row + 1], alone, generator, counts))
    return states


def restore(
    state: DenoiseState, scheduler, generator: torch.Generator | None, counts, device, cache=None, rank=0
) -> torch.Tensor:
    """Put `state` back into a scheduler whose timesteps are set, the generator, the counts and the step
    `cache` (this rank's entry, `rank` in its replica); returns the latents on `device`. A state of another
    sampler (its attributes) or schedule (its timesteps and sigmas: another step count, shift or fixed
    schedule) is a ValueError: it went on past the request's last step, or stopped short of it."""
    why = _other_schedule(state, scheduler)
    if why:
        raise ValueError(f"resume: the state does not fit this request: {why}")
    for name, value in state.scheduler.items():
        now = getattr(scheduler, name, None)  # a schedule tensor goes back where set_timesteps put it
        setattr(scheduler, name, _copy(name, value, now.device if isinstance(now, torch.Tensor) else device))
    if generator is not None:
        generator.set_state(state.generator)
    if counts is not None:
        counts.evaluated += state.evaluated
        counts.skipped += state.skipped
    if cache is not None and state.cache is not None:
        cache.load(state.cache[rank], device)
    return state.latents.to(device)


def _other_schedule(state: DenoiseState, scheduler) -> str | None:
    theirs, ours = state.scheduler, {k: v for k, v in vars(scheduler).items() if k != "config"}
    if not ours.keys() <= theirs.keys():  # more is fine: a checkpoint of diffusers' scheduler, before ours
        return "made by another sampler"
    for name in ("timesteps", "sigmas"):
        a, b = theirs[name], ours[name]
        if not (isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a.to(b), b)):
            return f"made for another schedule (its {name}: another step count, shift or fixed schedule)"
    sampler = sampler_of(scheduler)
    if state.sampler is not None and state.sampler != sampler:
        was, now = json.loads(state.sampler), json.loads(sampler)
        differ = ", ".join(f"{k} {was.get(k)!r}, here {now.get(k)!r}" for k in sorted(was.keys() | now.keys())
                           if was.get(k) != now.get(k))  # fmt: skip
        return f"made by another sampler (its {differ})"
    return None


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
    root, ext = os.path.splitext(path)
    with written(path, f"{root}.partial{ext}") as tmp:  # a crash leaves a name of the same kind, for a sweep
        torch.save({"format": FORMAT, "key": json.dumps(key, sort_keys=True), "state": asdict(state)}, tmp)


def load_file(path: str, key: dict, expected: Expected) -> tuple[DenoiseState | None, str | None]:
    """(state, None) when `path` holds a checkpoint made under `key` whose every field a resume of the job
    (`expected`) can use; (None, why not) otherwise, and (None, None) when there is no file."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, None
    except Exception as e:  # a torn or foreign file: start over rather than trust it
        return None, f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None, f"format {data.get('format') if isinstance(data, dict) else '?'} is not {FORMAT}"
    try:
        theirs = json.loads(data["key"])
    except (KeyError, TypeError, ValueError):
        return None, "malformed (no readable key)"
    key = json.loads(json.dumps(key, sort_keys=True))  # tuples read as lists
    if not isinstance(theirs, dict):
        return None, "malformed (no readable key)"
    if theirs != key:
        differ = sorted(k for k in key.keys() | theirs.keys() if key.get(k) != theirs.get(k))
        return None, f"made for another {', '.join(differ)}"
    why = _malformed(data.get("state"), expected)
    return (None, f"malformed ({why})") if why else (DenoiseState(**data["state"]), None)


def unusable(state: DenoiseState, expected: Expected) -> str | None:
    """What a resume of the job `expected` could not use in `state` (the Python API's, not a file's), or
    None: another request's step count or size went on past the last step, or at the state's size."""
    if not isinstance(state, DenoiseState):  # a file's dict, say: load_file reads one into its state
        raise TypeError(f"resume takes a DenoiseState (a checkpoint's, or load_file's), got {state!r:.80}")
    return _malformed(vars(state), expected)


def _malformed(state, expected: Expected) -> str | None:
    """What in a file's state a resume could not use, or None."""
    names = {f.name for f in fields(DenoiseState)}
    required = {f.name for f in fields(DenoiseState) if f.default is MISSING}
    if not isinstance(state, dict) or not required <= state.keys() <= names:
        return (
            f"the state must hold {', '.join(sorted(required))} and no fields but {', '.join(sorted(names))}"
        )
    step, scheduler, generator = state["step"], state["scheduler"], torch.Generator().get_state()
    if not _count(step) or not 0 < step < expected.steps:
        return f"step {step!r} is not 1 to {expected.steps - 1}"
    if not _tensor(state["latents"], torch.float32, expected.latents):
        return f"the latents are not float32 of shape {tuple(expected.latents)}"
    if not _tensor(state["generator"], generator.dtype, generator.shape):
        return "the generator state is not a CPU generator's"
    table = isinstance(scheduler, dict) and all(isinstance(k, str) for k in scheduler)
    if not table or not _plain(list(scheduler.values())):
        return "the scheduler state is not a table of plain values"
    if not all(_count(state.get(name, 0)) for name in ("evaluated", "skipped")):
        return "the evaluation counts are not counts"
    for name in ("sampler", "request"):
        if not isinstance(state.get(name), str | None):
            return f"the {name} is not a string"
    if None not in (state.get("request"), expected.request) and state["request"] != expected.request:
        theirs, ours = json.loads(state["request"]), json.loads(expected.request)
        differ = sorted(name for name in ours.keys() | theirs.keys() if theirs.get(name) != ours.get(name))
        return f"made for another request ({', '.join(differ)} differ)"
    if state.get("cache") is not None:
        return malformed_states(state["cache"], expected.ranks)
    return None


def _tensor(value, dtype: torch.dtype, shape) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == dtype and tuple(value.shape) == tuple(shape)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)
