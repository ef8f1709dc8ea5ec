"""Batches of compatible jobs: several requests share every transformer forward, one row of the latents each.

Requests may share a batch when `batch_key` gives them the same key: the same size, frames, steps, guidance
on or off (per expert), LoRA set, the step cache off and no image (the sampler and schedule are the
pipeline's). Each job keeps its own seed (its own CPU generator draws its initial and renoise noise, as its
solo run does), prompt, negative prompt, guidance scale (a per-row scale in the guidance combine), progress
callback, preview and cancel: a job whose callback says stop leaves the batch at that step and the others go
on. Each job's latents equal its solo run's (README, "Batches": the layers that would round a batch
differently run per sample). Checkpoints are each job's own, to resume alone. A server claims jobs of one
key and hands them here; a failure raises for the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from dit.cache import Evaluations
from dit.callbacks import DecodeCallback, FramesCallback, PhaseCallback, RowAnswers, enter_phase, goes_on
from dit.denoise_state import Checkpointing, DenoiseState, request_key
from dit.failures import GenerationCancelled, GenerationFailed
from dit.preview import PreviewCallback
from dit.request import GenerationRequest
from dit.sampling import Callback, denoise


@dataclass(frozen=True)
class BatchKey:
    """What the requests of one batch share (of requests as `Pipeline.validate` returns them)."""

    height: int
    width: int
    num_frames: int
    num_inference_steps: int
    guided: bool  # guidance_scale != 1: the negative prompt's pass runs
    guided_2: bool  # the same for a two-expert model's low-noise expert
    cache: str  # must be "off"
    loras: tuple[tuple[str, float], ...]
    image: bool  # must be False: an image-to-video job runs alone


_GUIDANCE = {"guided": "guidance_scale", "guided_2": "guidance_scale_2"}  # a key field → the request's


def batch_key(req: GenerationRequest) -> BatchKey:
    """The key of a validated request: requests with equal keys may share a batch (when `runs_alone` is
    None)."""
    return BatchKey(
        req.height, req.width, req.num_frames, req.num_inference_steps, req.guidance_scale != 1.0,
        req.guidance_scale_2 not in (None, 1.0), req.cache, req.loras, req.image is not None,
    )  # fmt: skip


def runs_alone(key: BatchKey) -> str | None:
    """Why a request with this key cannot join a batch (the field first), or None."""
    if key.cache != "off":
        return f"cache: a batch runs with the step cache off, got {key.cache}"
    if key.image:
        return "image: a request with an image runs alone"
    return None


def check_batch(requests: list[GenerationRequest]) -> None:
    """ValueError naming the field when validated `requests` cannot share a batch."""
    if not requests:
        raise ValueError("a batch needs at least one request")
    keys = [batch_key(req) for req in requests]
    if (reason := runs_alone(keys[0])) is not None:
        raise ValueError(reason)
    for key in keys[1:]:
        for field in fields(BatchKey):
            mine, first = getattr(key, field.name), getattr(keys[0], field.name)
            if mine != first and field.name in _GUIDANCE:  # the request's field, not the key's
                raise ValueError(f"{_GUIDANCE[field.name]}: guided (not 1) and unguided (1) requests differ "
                                 "within the batch")  # fmt: skip
            if mine != first:
                raise ValueError(f"{field.name} differs within the batch ({first!r} and {mine!r})")


@dataclass
class BatchJob:
    """One job of a batch: its request and its own callbacks (`Pipeline.generate`'s meaning for each;
    `on_phase` hears "decoding" as this job's own decode begins: the batch decodes its jobs in turn).
    `on_end` hears the job's outcome as soon as it is known, before the batch's other jobs end: its
    GenerationCancelled as it leaves the batch, and in `generate_batch` its frames (or its decode's
    GenerationFailed, or the DecodeCancelled of its `decode_callback`) once decoded."""

    request: GenerationRequest
    callback: Callback | None = None
    on_preview: PreviewCallback | None = None
    on_frames: FramesCallback | None = None
    on_phase: PhaseCallback | None = None
    on_end: Callable[[Any], None] | None = None
    decode_callback: DecodeCallback | None = None

    def ended(self, outcome):
        """`outcome`, told to `on_end`."""
        if self.on_end is not None:
            self.on_end(outcome)
        return outcome


def denoise_batch(
    pipe,
    jobs: list[BatchJob],
    on_phase: PhaseCallback | None = None,
    checkpoints: Checkpointing | None = None,
) -> list[torch.Tensor | GenerationCancelled]:
    """Each job's final latents `[1, ...]` (float32, the same on every rank), or the GenerationCancelled of a
    job that left the batch, in the jobs' order. `pipe`: a `dit.pipeline.Pipeline` (not imported here: its
    `generate_batch` calls this module). `on_phase` hears "encoding" and "denoising" once. `checkpoints`
    (the replica leader's): when due, its `save` hears `[(job index, DenoiseState)]`, each job still in the
    batch with its own state, from which it resumes alone (`Pipeline.generate(resume=)`)."""
    if not isinstance(jobs, list | tuple) or not all(isinstance(job, BatchJob) for job in jobs):
        raise TypeError(f"generate_batch takes a list of BatchJob, got {_kinds(jobs)}")
    requests = []
    for i, job in enumerate(jobs):  # which job: a batch's message named none
        try:
            requests.append(pipe.validate(job.request))
        except (TypeError, ValueError) as e:
            raise type(e)(f"job {i}: {e}") from None
    check_batch(requests)
    first = requests[0]
    pipe.apply_loras(first.loras)  # the batch's one set
    enter_phase(on_phase, "encoding")
    texts = [pipe.conditioning(req) for req in requests]  # each job's (cond, uncond), one broadcast each
    cond = _stack([c for c, _ in texts])
    uncond = None if texts[0][1] is None else _stack([u for _, u in texts])
    enter_phase(on_phase, "denoising")
    generators = [torch.Generator("cpu").manual_seed(req.seed) for req in requests]
    latents = torch.cat([pipe.initial_noise(req, g) for req, g in zip(requests, generators, strict=True)])
    steps, live = first.num_inference_steps, list(range(len(jobs)))  # live: the job of each row
    outcomes: list = [None] * len(jobs)
    second = pipe.second_expert(first)
    if second is not None:
        second.guidance = _scales(requests, "guidance_scale_2", latents.device)

    def callback(step: int, total: int) -> RowAnswers:  # the replica leader's: each live job's answer
        return RowAnswers(jobs[j].callback is None or goes_on(jobs[j].callback(step, total)) for j in live)

    def on_rows(step: int, rows: list[int]) -> None:
        for j in sorted(set(live) - {live[row] for row in rows}):
            outcomes[j] = jobs[j].ended(GenerationCancelled(step, steps))
        live[:] = [live[row] for row in rows]

    previews = [pipe.preview_hook(steps, cond, job.on_preview) for job in jobs]

    def on_x0(step: int, x0: torch.Tensor) -> None:
        for row, j in enumerate(live):
            if previews[j] is not None:
                previews[j](step, x0[row : row + 1])

    if checkpoints is not None:  # the loop's states are its rows': each goes with the job of its row
        per_job, keys = checkpoints.save, [request_key(req) for req in requests]

        def save(states: list[DenoiseState]) -> None:
            per_job(
                [(live[row], replace(state, request=keys[live[row]])) for row, state in enumerate(states)]
            )

        checkpoints = replace(checkpoints, save=save)
    counted = Evaluations()
    pipe.evaluations = None
    try:
        latents = denoise(
            pipe.model, latents, cond=cond, uncond=uncond, scheduler=pipe.scheduler, steps=steps,
            guidance=_scales(requests, "guidance_scale", latents.device), mesh=pipe.mesh, callback=callback,
            sigmas=pipe.sigmas(steps), generator=generators, second=second, evaluations=counted,
            on_x0=on_x0 if any(previews) else None, on_rows=on_rows, checkpoints=checkpoints,
        )  # fmt: skip
    except GenerationCancelled as stop:  # the last jobs left together
        for j in live:
            outcomes[j] = jobs[j].ended(stop)
        return outcomes
    pipe.evaluations = counted
    for row, j in enumerate(live):
        outcomes[j] = latents[row : row + 1]
    return outcomes


def generate_batch(
    pipe,
    jobs: list[BatchJob],
    on_phase: PhaseCallback | None = None,
    checkpoints: Checkpointing | None = None,
) -> list[np.ndarray | None | GenerationCancelled | GenerationFailed]:
    """Each job's frames on the replica leader (None on the other ranks), or its GenerationCancelled (a
    DecodeCancelled when it stopped during its decode), or the GenerationFailed of its decode (every rank
    alike; the other jobs go on), in the jobs' order; each finished job's `on_frames` hears its frames as
    they decode, in turn (`decode_in_turn`: a job cancelled as it waits for its turn ends at once).
    `on_phase` hears "encoding", "denoising" and "decoding" once; `checkpoints` as `denoise_batch`'s.
    Collective over the replica, as `generate`."""
    outcomes = denoise_batch(pipe, jobs, on_phase, checkpoints)
    ready = [j for j, out in enumerate(outcomes) if isinstance(out, torch.Tensor)]
    if ready:
        enter_phase(on_phase, "decoding")
    steps = pipe.validate(jobs[0].request).num_inference_steps
    return decode_in_turn(jobs, outcomes, ready, steps, lambda j, job: _decode(pipe, outcomes[j], job))


def decode_in_turn(jobs: list[BatchJob], outcomes: list, ready: list[int], steps: int, decode) -> list:
    """`outcomes` with each `ready` job's (in turn) told to its `on_end` and put in its place: `decode(j,
    job)` decodes job j with `job`'s callbacks (its frames, or the GenerationCancelled or GenerationFailed
    that stopped it). The replica leader asks each job still waiting `decode_callback(0, frames)` at each
    chunk of the decodes before its own: a cancel ends it then (it stayed in progress for minutes), a
    GenerationCancelled after its last step; its turn still comes on every rank, and stops at its first
    chunk. Shared with the server tests' fake pipeline."""
    waiting, left = list(ready), {}

    def asked(ask: DecodeCallback | None) -> DecodeCallback | None:
        def ask_all(decoded: int, frames: int):
            for j in waiting:  # decoded nothing yet: cancelled?
                ask_j = jobs[j].decode_callback
                if j not in left and ask_j is not None and not goes_on(ask_j(0, frames)):
                    left[j] = jobs[j].ended(GenerationCancelled(steps, steps))
            return ask is None or goes_on(ask(decoded, frames))

        return ask_all if any(job.decode_callback for job in jobs) else ask

    while waiting:
        j = waiting.pop(0)
        if j in left:
            decode(j, BatchJob(jobs[j].request, decode_callback=lambda *chunk: False))
            outcomes[j] = left[j]
        else:
            outcomes[j] = jobs[j].ended(
                decode(j, replace(jobs[j], decode_callback=asked(jobs[j].decode_callback)))
            )
    return outcomes


def _kinds(jobs) -> str:
    if isinstance(jobs, list | tuple):
        return f"a {type(jobs).__name__} of {', '.join(sorted({type(job).__name__ for job in jobs}))}"
    return type(jobs).__name__


def _decode(pipe, latents: torch.Tensor, job: BatchJob) -> np.ndarray | None | RuntimeError:
    enter_phase(job.on_phase, "decoding")
    try:
        return pipe._own(pipe.decode, latents, job.on_frames, job.decode_callback)  # inside generate_batch
    except (GenerationFailed, GenerationCancelled) as stop:
        return stop


def _scales(requests: list[GenerationRequest], name: str, device: torch.device) -> float | torch.Tensor:
    """The guidance the loop takes: 1.0 for an unguided batch, else each row's scale, [B, 1, 1, 1, 1]."""
    scales = [getattr(req, name) for req in requests]
    if scales[0] in (None, 1.0):  # the batch key makes every row unguided alike
        return 1.0
    return torch.tensor(scales, dtype=torch.float32, device=device).view(-1, 1, 1, 1, 1)


def _stack(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each job's text keyword arguments `[1, ...]` as one batch's (Wan pads each text to the encoder's full
    length and HunyuanVideo-1.5's come with their masks at the same length, so the rows line up)."""
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
