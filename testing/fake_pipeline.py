"""A fake instant pipeline with the `dit.pipeline` surface, for server tests and bench/server_overhead.py.

No model work: `generate` sleeps `ITHACA_FAKE_STEP_S` seconds per step and `ITHACA_FAKE_DECODE_S` in its
decode (defaults 0; spread over its latent frames, each asking `decode_callback`), and its load
`ITHACA_FAKE_LOAD_S` (then raises ValueError(`ITHACA_FAKE_LOAD_ERROR`) where it is set), and returns small
random frames; on the replica leader it calls `on_preview` after every step with a 32×48 gradient that
brightens with the step; it resumes from a checkpoint's step and hands `checkpoints` a state (its step, zero
latents, no scheduler) when one is due. Everything else is the real thing: the request/limits dataclasses and
`validate` of `dit.pipeline` (tiny limits), the per-step callback and cancel broadcast of `dit.sampling`, the
real mesh. `ITHACA_FAKE_I2V=1` makes it an image-to-video model: every request needs an image (the real
`validate` says so), and the video's first frame is that image fitted to its size, its second the image as the
leader got it squeezed to the frame (what tells the image as given, which Wan's CLIP sees, from the fitted
one). With `--lora-dir` its catalogue is every `NAME.safetensors` there, each fitting (no file is read), and a
job of another LoRA set than the last counts a switch. `generate_batch` runs a batch's steps once, each job's
frames its solo run's. Selected with `--pipeline-module testing.fake_pipeline`."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from dit.batch import check_batch, decode_in_turn
from dit.cache import Evaluations
from dit.callbacks import RowAnswers, enter_phase, goes_on
from dit.denoise_state import capture
from dit.image import fit
from dit.pipeline import (
    TINY_LIMITS,
    DecodeCancelled,
    GenerationCancelled,
    GenerationFailed,
    GenerationRequest,
    Pipeline,
    PipelineConfig,
)
from dit.sampling import passes_per_step, should_continue

__all__ = ["GenerationCancelled", "GenerationFailed", "GenerationRequest", "PipelineConfig", "load_pipeline"]


_SCHEDULER = SimpleNamespace(config={})  # a checkpoint's: no attributes, no config


class _WordCounter:
    max_tokens = TINY_LIMITS.max_prompt_tokens

    def count_tokens(self, text: str) -> int:
        return len(text.split())


class _Catalogue:
    """`dit.lora_catalogue.LoraCatalogue`'s surface over a folder's file names: every one fits."""

    def __init__(self, folder: str):
        self.folder = folder

    def entries(self) -> list[dict]:
        names = sorted(
            f.removesuffix(".safetensors") for f in os.listdir(self.folder) if f.endswith(".safetensors")
        )
        return [{"name": name, "experts": False, "fits": True, "error": None} for name in names]

    def plans(self, loras) -> None:
        known = {entry["name"] for entry in self.entries()}
        for name, _ in loras:
            if name not in known:
                raise ValueError(f"loras: no LoRA named {name!r} in the catalogue")


class FakePipeline:
    validate = Pipeline.validate  # the real request checks (self.limits, self.tokenizer, self.boundary)

    def __init__(self, mesh, config: PipelineConfig):
        self.mesh, self.config, self.tokenizer = mesh, config, _WordCounter()
        self.lora_catalogue = _Catalogue(config.lora_dir) if config.lora_dir else None
        self.lora_switches, self.lora_switch_seconds, self._applied = 0, None, ()
        self.limits = replace(TINY_LIMITS, image=os.environ.get("ITHACA_FAKE_I2V") == "1")
        self.boundary = None  # one expert
        self.evaluations: Evaluations | None = None  # as the real pipeline's: every pass counted, none cached
        self.step_s = float(os.environ.get("ITHACA_FAKE_STEP_S", "0"))
        self.decode_s = float(os.environ.get("ITHACA_FAKE_DECODE_S", "0"))
        self.batches = 0  # batches run (generate_batch)

    def latent_shape(self, req: GenerationRequest) -> tuple[int, ...]:
        return (1,)  # the zero latents its checkpoints hold

    def choose_comm(self, allow_lossy: bool, timeout_s: float) -> None:
        """No exchange to time: it keeps the configured one."""
        return None

    def generate(
        self,
        req: GenerationRequest,
        callback=None,
        on_phase=None,
        on_preview=None,
        resume=None,
        checkpoints=None,
        on_frames=None,
        decode_callback=None,
    ):
        req = self.validate(req)
        if req.loras != self._applied:
            self.lora_switches, self.lora_switch_seconds, self._applied = (
                self.lora_switches + 1,
                0.0,
                req.loras,
            )
        on_phase = on_phase or (lambda phase: None)
        on_phase("encoding")
        on_phase("denoising")
        for step in range(1 + (resume.step if resume else 0), req.num_inference_steps + 1):
            time.sleep(self.step_s)
            if checkpoints is not None and checkpoints.due(step, req.num_inference_steps):
                checkpoints.take(partial(capture, step, torch.zeros(1), _SCHEDULER, None, None))
            if not should_continue(callback, step, req.num_inference_steps, self.mesh):
                raise GenerationCancelled(step, req.num_inference_steps)
            if on_preview is not None and self.mesh.is_replica_leader:
                on_preview(step, _preview(step, req.num_inference_steps))
        passes = passes_per_step(self.mesh, req.guidance_scale)
        self.evaluations = Evaluations(evaluated=passes * req.num_inference_steps)
        on_phase("decoding")  # as the real pipeline: every rank decodes a band, the leader gets the frames
        return self._decode(req, on_frames, decode_callback)

    def generate_batch(self, jobs, on_phase=None, checkpoints=None):
        """`Pipeline.generate_batch`'s surface: the batch's steps once (one cancel broadcast a step, each job
        its answer; `checkpoints` hears each job's state, as `generate`'s), each job's frames as its solo
        run's; `self.batches` counts the batches run."""
        requests = [self.validate(job.request) for job in jobs]
        check_batch(requests)
        self.batches += 1
        on_phase = on_phase or (lambda phase: None)
        on_phase("encoding")
        on_phase("denoising")
        total, live, outcomes = requests[0].num_inference_steps, list(range(len(jobs))), [None] * len(jobs)
        for step in range(1, total + 1):
            time.sleep(self.step_s)
            if checkpoints is not None and checkpoints.due(step, total):
                state = partial(capture, step, torch.zeros(1), _SCHEDULER, None, None)
                checkpoints.take(lambda state=state: [(j, state()) for j in live])
            answers = RowAnswers(
                jobs[j].callback is None or goes_on(jobs[j].callback(step, total)) for j in live
            )
            keep = should_continue(lambda *_, said=answers: said, step, total, self.mesh)
            for j, go in zip(list(live), keep, strict=True):
                if not go:  # told at once, as the real batch tells it
                    outcomes[j] = jobs[j].ended(GenerationCancelled(step, total))
                    live.remove(j)
            for j in live:
                if jobs[j].on_preview is not None and self.mesh.is_replica_leader:
                    jobs[j].on_preview(step, _preview(step, total))
        self.evaluations = Evaluations(
            evaluated=passes_per_step(self.mesh, requests[0].guidance_scale) * total
        )
        on_phase("decoding")

        def decode(j: int, job):
            enter_phase(job.on_phase, "decoding")
            try:
                return self._decode(requests[j], job.on_frames, job.decode_callback)
            except (GenerationFailed, GenerationCancelled) as stop:  # as the real batch: the others go on
                return stop

        return decode_in_turn(jobs, outcomes, live, total, decode)

    def _decode(self, req: GenerationRequest, on_frames, decode_callback):
        """The request's frames (seeded by it) on the replica leader, handed to `on_frames` as they come, in
        Wan's chunks (the first frame, then 4 a latent frame), `decode_callback` asked at each as the real
        decode asks it (DecodeCancelled on every rank when it says stop)."""
        frames = np.random.default_rng(req.seed).integers(
            0, 255, (req.num_frames, req.height, req.width, 3), np.uint8
        )
        if req.image is not None:
            frames[0] = fit(req.image, req.height, req.width)  # as the real one fits it
            frames[1] = np.array(Image.fromarray(req.image).resize((req.width, req.height)))
        latent_frames = (req.num_frames - 1) // 4 + 1
        for done, at in enumerate(range(0, len(frames), 4), 1):
            time.sleep(self.decode_s / latent_frames)
            if not should_continue(decode_callback, done, latent_frames, self.mesh):
                raise DecodeCancelled(done, latent_frames)
            if on_frames is not None and self.mesh.is_replica_leader:
                on_frames(frames[max(at - 3, 0) : at + 1])
        return frames if self.mesh.is_replica_leader else None


def _preview(step: int, total: int) -> np.ndarray:
    """A 32×48 RGB gradient, brighter at each step (the last one reaches full brightness)."""
    ramp = np.linspace(0.25, 1.0, 48)[None, :, None] * np.linspace(0.5, 1.0, 32)[:, None, None]
    return np.broadcast_to(ramp * 255 * step / total, (32, 48, 3)).astype(np.uint8)


def load_pipeline(config: PipelineConfig, mesh) -> FakePipeline:
    time.sleep(float(os.environ.get("ITHACA_FAKE_LOAD_S", "0")))  # a large model's load
    if said := os.environ.get("ITHACA_FAKE_LOAD_ERROR"):  # a mistake in the model's files, found as it loads
        raise ValueError(said)
    return FakePipeline(mesh, config)
