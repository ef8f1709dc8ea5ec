"""Flow-matching sampling with Wan's timestep shift, fixed (distilled) schedules, classifier-free guidance
(optionally CFG-parallel), and the per-step callback that can stop every rank of a replica at the same
step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise

import torch

import parallel
from dit.cache import Evaluations, StepCache, attached, real_tokens
from dit.callbacks import RowAnswers, goes_on
from dit.denoise_state import Checkpointing, DenoiseState, capture, capture_rows, restore
from dit.failures import GenerationCancelled, GenerationFailed
from dit.flow_schedulers import FlowMatchEulerScheduler, FlowScheduler, UniPCFlowScheduler

# Ithaca's schedulers (dit.flow_schedulers: torch only, diffusers' numbers) by their `--sampler` name; a
# pipeline folder's `scheduler/` must be of the diffusers class one of them equals (SCHEDULERS).
_CLASSES: dict[str, type[FlowScheduler]] = {
    "unipc": UniPCFlowScheduler,
    "euler": FlowMatchEulerScheduler,
    "renoise": FlowMatchEulerScheduler,
}
SCHEDULERS: dict[str, str] = {name: cls.DIFFUSERS_CLASS for name, cls in _CLASSES.items()}
SAMPLERS = tuple(SCHEDULERS)
# A sampler's config without a folder's: UniPC in flow-prediction mode as Wan publishes it; flow-match Euler.
_DEFAULT_CONFIG = {
    "unipc": {"prediction_type": "flow_prediction", "use_flow_sigmas": True},
    "euler": {},
    "renoise": {},
}
# What makes a sampler itself over any config of its class. euler steps along the predicted velocity; renoise
# (diffusers' `stochastic_sampling`) takes the predicted clean latents and noises them afresh to the next
# sigma: the step of LightX2V's step-distilled Wan2.1 (WanStepDistillScheduler), ComfyUI's "lcm".
_OWN_CONFIG = {"unipc": {}, "euler": {"stochastic_sampling": False}, "renoise": {"stochastic_sampling": True}}
# The samplers that take a fixed schedule: they step from each given sigma to the next, one evaluation each.
FIXED_SCHEDULE_SAMPLERS = ("euler", "renoise")
NUM_TRAIN_TIMESTEPS = 1000  # Wan's, LightX2V's and the schedulers' default: timestep = 1000 · sigma
_TIMESTEPS_RULE = (
    f"timesteps must be integers in (0, {NUM_TRAIN_TIMESTEPS}], strictly decreasing, separated by commas, "
    "e.g. 1000,750,500,250"
)
Callback = Callable[[int, int], "bool | None"]
# A guidance scale: one for the whole batch, or a float32 tensor [B, 1, 1, 1, 1] of each row's (dit.batch)
Guidance = float | torch.Tensor


@dataclass(frozen=True)
class FixedSchedule:
    """The timesteps a step-distilled model was trained to sample with, e.g. LightX2V's 4-step Wan2.1:
    1000, 750, 500, 250 with shift 5. Integers in (0, 1000], strictly decreasing (LightX2V's
    `denoising_step_list`); a run takes exactly these steps, the last one to sigma 0.

    Timestep t is the unshifted sigma s = t / 1000; the scheduler shifts it to shift·s / (1 + (shift − 1)·s)
    and the model sees 1000 × that (diffusers' `FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas=...)`).
    This is LightX2V's definition: its WanStepDistillScheduler shifts linspace(1, 0, 1001)[:-1] the same way
    and takes entry 1000 − t. With shift 5 the LightX2V list gives sigmas 1, 0.9375, 0.8333, 0.625."""

    timesteps: tuple[int, ...]

    def __post_init__(self):
        ts = self.timesteps
        if (
            not isinstance(ts, tuple | list)
            or not ts
            or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 < t <= NUM_TRAIN_TIMESTEPS for t in ts
            )
            or any(a <= b for a, b in pairwise(ts))
        ):
            raise ValueError(f"{_TIMESTEPS_RULE}; got {ts!r}")
        object.__setattr__(self, "timesteps", tuple(ts))  # a JSON list from a folder's config

    @classmethod
    def parse(cls, text: str) -> FixedSchedule:
        """From the command line's or the environment's form, "1000,750,500,250"."""
        try:
            return cls(tuple(int(part) for part in text.split(",")))
        except ValueError:
            raise ValueError(f"{_TIMESTEPS_RULE}; got {text!r}") from None

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    @property
    def sigmas(self) -> list[float]:
        """The unshifted sigmas t / 1000, for `set_timesteps(sigmas=...)` (the scheduler shifts them)."""
        return [t / NUM_TRAIN_TIMESTEPS for t in self.timesteps]

    def __str__(self) -> str:
        return ",".join(map(str, self.timesteps))


def make_scheduler(
    sampler: str = "unipc", flow_shift: float = 3.0, config: dict | None = None
) -> FlowScheduler:
    """`sampler`'s scheduler from `config` (a pipeline folder's scheduler config of that class; None: the
    sampler's default config) with `flow_shift` set; an option value it does not support is a ValueError."""
    base = _DEFAULT_CONFIG[sampler] if config is None else config
    cls = scheduler_class(sampler)
    return cls({**base, **_OWN_CONFIG[sampler], cls.SHIFT_KEY: flow_shift})


def config_shift(sampler: str, config: dict) -> float:
    """The shift a scheduler config of `sampler`'s class samples with, read as diffusers reads it: the class's
    own key, else the class's default (1.0 for both classes)."""
    cls = scheduler_class(sampler)
    return config.get(cls.SHIFT_KEY, cls.DEFAULTS[cls.SHIFT_KEY])


def scheduler_class(sampler: str) -> type[FlowScheduler]:
    """`sampler`'s scheduler class."""
    return _CLASSES[sampler]


def sampler_of(config: dict) -> str | None:
    """The sampler a scheduler config (a folder's `scheduler_config.json`) describes: its `_class_name`, and
    for flow-match Euler its `stochastic_sampling` (diffusers' default: off); None for another class."""
    for name, class_name in SCHEDULERS.items():
        own = _OWN_CONFIG[name].items()
        if config.get("_class_name") == class_name and all(config.get(k, False) == v for k, v in own):
            return name
    return None


def unguided(guidance: Guidance) -> bool:
    """A scale of 1: the unconditional pass would be multiplied by zero (a batch's per-row scales are all
    guided: `dit.batch` passes 1.0 for an unguided batch)."""
    return not isinstance(guidance, torch.Tensor) and guidance == 1.0


def guided_noise(
    model, x, t, cond: dict, uncond: dict | None, guidance: Guidance, mesh, cache: StepCache | None = None
) -> torch.Tensor:
    """One guided prediction; `cond`/`uncond` are the model's text keyword arguments. CFG-parallel (cfg_size
    2): cfg rank 0 runs the prompt, cfg rank 1 the negative prompt, and one all-gather gives both to every
    rank. Otherwise both passes run here, one after the other (not batched, so that every layout reduces in
    the same order and gives the same numbers). A step cache (`dit.cache`) hears which pass runs."""

    def evaluate(which: str) -> torch.Tensor:
        if cache is not None:
            cache.current = which
        return model(x, t, **(cond if which == "cond" else uncond)).float()

    if mesh.cfg_size == 2:
        cond_pred, uncond_pred = parallel.cfg_all_gather(evaluate(("cond", "uncond")[mesh.cfg_rank]), mesh)
    elif unguided(guidance):
        return evaluate("cond")
    else:
        cond_pred, uncond_pred = evaluate("cond"), evaluate("uncond")
    if unguided(guidance):
        return cond_pred
    return uncond_pred + guidance * (cond_pred - uncond_pred)


def passes_per_step(mesh, guidance: Guidance) -> int:
    """Transformer passes `guided_noise` runs per step over the replica: the prompt's, and the negative
    prompt's when guided or on CFG-parallel's cfg rank 1."""
    return 2 if mesh.cfg_size == 2 or not unguided(guidance) else 1


def should_continue(callback: Callback | None, step: int, total: int, mesh) -> bool:
    """Ask the callback on the replica leader; every rank of the replica gets the same answer."""
    return after_step(callback, None, step, total, mesh)[0]


def after_step(
    callback: Callback | None, checkpoints: Checkpointing | None, step: int, total: int, mesh
) -> tuple[bool, bool]:
    """(go on, take a checkpoint now), asked on the replica leader: its callback and its `checkpoints`;
    every rank of the replica gets the same answers, in one broadcast. A batch's callback answers
    `RowAnswers`, one go-on per row, passed on as it is."""
    keep, due, raised = True, False, None
    if mesh.is_replica_leader:
        try:  # a callback that raises ends the run on every rank: the others wait in the broadcast
            answer = True if callback is None else callback(step, total)
            keep = answer if isinstance(answer, RowAnswers) else goes_on(answer)
            due = checkpoints is not None and checkpoints.due(step, total)
        except Exception as e:
            raised = e
    keep, due, failed = mesh.broadcast_object((keep, due, raised is not None))
    if raised is not None:
        raise raised
    if failed:
        raise GenerationFailed(f"the callback raised on the replica leader (rank {mesh.replica_leader})")
    return keep, due


@dataclass
class SecondExpert:
    """Wan2.2's low-noise expert: it replaces the first model at the timesteps below `boundary` (diffusers:
    boundary_ratio × 1000), with its own guidance scale. `enter(model)` hears which expert is about to run
    (host-memory offload moves the idle one out)."""

    model: object
    guidance: float
    boundary: float
    enter: Callable[[object], None] = lambda model: None


class HostOffload:
    """Keeps the expert about to run on `device` and the other in host memory (`enter` each time one
    starts); both stay resident when the device is the host."""

    def __init__(self, experts: tuple, device: torch.device):
        self.experts, self.device = experts, device

    def __call__(self, running) -> None:
        for expert in self.experts:
            if expert is not running:
                expert.to("cpu")
        running.to(self.device)


@torch.no_grad()
def denoise(
    model,
    latents: torch.Tensor,
    *,
    cond: dict[str, torch.Tensor] | None,
    uncond: dict[str, torch.Tensor] | None,
    scheduler: FlowScheduler,
    steps: int,
    guidance: Guidance,
    mesh,
    callback: Callback | None = None,
    sigmas: list[float] | None = None,
    generator: torch.Generator | None = None,
    cache: StepCache | None = None,
    second: SecondExpert | None = None,
    evaluations: Evaluations | None = None,
    on_x0: Callable[[int, torch.Tensor], None] | None = None,
    resume: DenoiseState | None = None,
    checkpoints: Checkpointing | None = None,
    on_rows: Callable[[int, list[int]], None] | None = None,
) -> torch.Tensor:
    """Run `steps` denoising steps from `latents` (float32) and return the final latents (float32, the same on
    every rank). The model sees its own dtype; the scheduler works in float32. A renoise scheduler draws its
    fresh noise from `generator`: a CPU generator seeded alike on every rank keeps the ranks identical. A
    `cache` (dit.cache) lets the model skip its later blocks at steps where its first block's output barely
    moved; it counts the evaluations run and skipped, else `evaluations` counts the passes run. `second`: a
    two-expert model's low-noise expert, taking over at its boundary. `on_x0(step, x0)`, when given, hears
    the current estimate of the clean latents after each step (1-based; the caller passes it on the ranks that
    want it: it runs no collective): every sampler here predicts a flow-matching velocity v, so
    x0 = x_t − σ_t · v, as diffusers' stochastic flow-match Euler computes it. It reads, never changes, the
    latents. `resume` (dit.denoise_state, on every rank) goes on from a checkpoint's step: its latents,
    scheduler and generator state replace `latents` and the generator's, this rank's residuals the cache's;
    `checkpoints` (the replica leader's) hears the state when due, each rank of a cached replica adding its
    residuals.

    A batch (dit.batch; no cache or resume) holds one job per row of `latents`, `cond` and `uncond`:
    `guidance` (and `second.guidance`) may be a tensor of each row's scale, `generator` a list of each row's
    generator, `callback` answers a list of each row's go-on, and `checkpoints` hears a list of each row's
    state (before that step's rows leave). Rows told to stop leave the batch (their latents, text, scales,
    generators and the scheduler's history) and `on_rows(step, rows)` hears, on every rank, the rows that
    stay; GenerationCancelled when none does."""
    dtype = next(model.parameters()).dtype
    if sigmas is None:
        scheduler.set_timesteps(steps, device=latents.device)
    else:  # an explicit schedule (a fixed one, HunyuanVideo-1.5's linspace(1, 0)), shifted by the scheduler
        scheduler.set_timesteps(sigmas=sigmas, device=latents.device)
    counts = cache.stats if cache is not None else evaluations
    start = 0 if resume is None else resume.step
    if resume is not None:
        rank = mesh.rank - mesh.replica_leader  # this rank's step-cache entry
        latents = restore(resume, scheduler, generator, counts, latents.device, cache, rank)

    def expert_at(t) -> tuple[object, float]:
        return (
            (model, guidance) if second is None or t >= second.boundary else (second.model, second.guidance)
        )

    # the expert whose residuals the cache holds: after a resume past the switch, the second one
    cached_for = model if start == 0 else expert_at(scheduler.timesteps[start - 1])[0]
    running = None
    with attached(model, cache), attached(second.model if second else None, cache):
        for i, t in enumerate(scheduler.timesteps):
            if i < start:
                continue
            expert, g = expert_at(t)
            if expert is not running:
                if expert is not cached_for and cache is not None:
                    cache.restart(real_tokens(expert))  # the residuals it keeps are the other expert's
                if second is not None:
                    second.enter(expert)
                running = cached_for = expert
            timestep = t.expand(latents.shape[0])
            noise = guided_noise(expert, latents.to(dtype), timestep, cond, uncond, g, mesh, cache)
            if cache is None and evaluations is not None:
                evaluations.evaluated += passes_per_step(mesh, g)
            if on_x0 is not None:  # σ of this step: the schedule begins at index 0, one index a step
                x0 = latents - scheduler.sigmas[i].to(latents.device, torch.float32) * noise.float()
            latents = scheduler.step(noise, latents, generator)
            if on_x0 is not None:
                on_x0(i + 1, x0)
            keep, due = after_step(callback, checkpoints, i + 1, steps, mesh)
            if due:  # a batch's generator is a list, one per row: one state per row (capture_rows)
                take = capture_rows if isinstance(generator, list) else capture
                snapshot = partial(take, i + 1, latents, scheduler, generator, counts)
                _checkpoint(checkpoints, snapshot, cache, mesh)
            if isinstance(keep, list):  # a batch's rows
                rows = [row for row, go_on in enumerate(keep) if go_on]
                if rows and len(rows) < len(keep):
                    latents, cond, uncond, guidance, generator = (
                        take_rows(x, rows) for x in (latents, cond, uncond, guidance, generator)
                    )
                    if second is not None:
                        second = replace(second, guidance=take_rows(second.guidance, rows))
                    scheduler.take_rows(rows)
                    on_rows(i + 1, rows)
                keep = bool(rows)
            if not keep:
                raise GenerationCancelled(i + 1, steps)
    return latents


def take_rows(x, rows: list[int]):
    """Rows `rows` of a batch's tensor, of each tensor of a dict, of a list (each row's generator); a
    number (a scale shared by the batch) or None as it is."""
    if isinstance(x, torch.Tensor):
        return x[torch.tensor(rows, device=x.device)]
    if isinstance(x, dict):
        return {name: take_rows(t, rows) for name, t in x.items()}
    return [x[row] for row in rows] if isinstance(x, list) else x


def _checkpoint(checkpoints: Checkpointing | None, snapshot, cache: StepCache | None, mesh) -> None:
    """A due checkpoint, on every rank of the replica: `snapshot(cache states)` goes to the leader's
    `checkpoints`, each rank of a cached replica handing its step cache's residuals to it first."""

    def gathered():
        return None if cache is None else mesh.gather_object(cache.state())

    if checkpoints is not None:
        checkpoints.take(lambda: snapshot(gathered()))
    else:
        gathered()
