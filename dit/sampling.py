"""Flow-matching sampling with Wan's timestep shift, classifier-free guidance (optionally CFG-parallel), and
the per-step callback that can stop every rank of a replica at the same step."""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, SchedulerMixin, UniPCMultistepScheduler

import parallel

# The schedulers Ithaca samples with, by their `--sampler` name; a pipeline folder's `scheduler/` must be one
# of these classes.
SCHEDULERS: dict[str, type[SchedulerMixin]] = {
    "unipc": UniPCMultistepScheduler,
    "euler": FlowMatchEulerDiscreteScheduler,
}
SAMPLERS = tuple(SCHEDULERS)
_SHIFT_KEY = {"unipc": "flow_shift", "euler": "shift"}  # each class's name for the flow shift
# A sampler's config without a folder's: UniPC in flow-prediction mode as Wan publishes it; flow-match Euler.
_DEFAULT_CONFIG = {"unipc": {"prediction_type": "flow_prediction", "use_flow_sigmas": True}, "euler": {}}
Callback = Callable[[int, int], "bool | None"]


class GenerationCancelled(RuntimeError):
    """Raised on every rank of the replica when the callback asked to stop; `step` = steps completed."""

    def __init__(self, step: int, total: int):
        super().__init__(f"generation cancelled after step {step} of {total}")
        self.step, self.total = step, total


def make_scheduler(
    sampler: str = "unipc", flow_shift: float = 3.0, config: dict | None = None
) -> SchedulerMixin:
    """`sampler`'s scheduler from `config` (a pipeline folder's scheduler config of that class; None: the
    sampler's default config) with `flow_shift` set."""
    base = _DEFAULT_CONFIG[sampler] if config is None else config
    return SCHEDULERS[sampler].from_config({**base, _SHIFT_KEY[sampler]: flow_shift})


def guided_noise(model, x, t, cond: dict, uncond: dict | None, guidance: float, mesh) -> torch.Tensor:
    """One guided prediction; `cond`/`uncond` are the model's text keyword arguments. CFG-parallel (cfg_size
    2): cfg rank 0 runs the prompt, cfg rank 1 the negative prompt, and one all-gather gives both to every
    rank. Otherwise both passes run here, one after the other (not batched, so that every layout reduces in
    the same order and gives the same numbers)."""
    if mesh.cfg_size == 2:
        mine = model(x, t, **(cond if mesh.cfg_rank == 0 else uncond)).float()
        cond_pred, uncond_pred = parallel.cfg_all_gather(mine, mesh)
    elif guidance == 1.0:  # no guidance: the unconditional pass would be multiplied by zero
        return model(x, t, **cond).float()
    else:
        cond_pred, uncond_pred = model(x, t, **cond).float(), model(x, t, **uncond).float()
    if guidance == 1.0:
        return cond_pred
    return uncond_pred + guidance * (cond_pred - uncond_pred)


def should_continue(callback: Callback | None, step: int, total: int, mesh) -> bool:
    """Ask the callback on the replica leader; every rank of the replica gets the same answer."""
    keep = True
    if mesh.is_replica_leader and callback is not None:
        keep = callback(step, total) is not False
    return mesh.broadcast_object(keep)


@torch.no_grad()
def denoise(
    model,
    latents: torch.Tensor,
    *,
    cond: dict[str, torch.Tensor] | None,
    uncond: dict[str, torch.Tensor] | None,
    scheduler: SchedulerMixin,
    steps: int,
    guidance: float,
    mesh,
    callback: Callback | None = None,
    sigmas: list[float] | None = None,
) -> torch.Tensor:
    """Run `steps` denoising steps from `latents` (float32) and return the final latents (float32, the same on
    every rank). The model sees its own dtype; the scheduler works in float32."""
    dtype = next(model.parameters()).dtype
    if sigmas is None:
        scheduler.set_timesteps(steps, device=latents.device)
    else:  # an explicit schedule (HunyuanVideo-1.5's linspace(1, 0)), shifted by the scheduler
        scheduler.set_timesteps(sigmas=sigmas, device=latents.device)
    # Begin at the first timestep by position, as diffusers' WanPipeline does: a large shift with many steps
    # repeats a timestep (UniPC's integer ones start 999, 999), and a lookup by value takes the second match.
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(0)
    for i, t in enumerate(scheduler.timesteps):
        timestep = t.expand(latents.shape[0])
        noise = guided_noise(model, latents.to(dtype), timestep, cond, uncond, guidance, mesh)
        latents = scheduler.step(noise, t, latents, return_dict=False)[0]
        if not should_continue(callback, i + 1, steps, mesh):
            raise GenerationCancelled(i + 1, steps)
    return latents
