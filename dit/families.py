"""Pipeline families: the parts that differ between model families (text encoders, VAE, scheduler, limits),
picked from the model folder's `transformer/config.json` `_class_name` or the preset's.

A family's model is called as `model(latents, timestep, **text)` where `text` is what its text encoder's
`condition(prompt)` returns (Wan: `encoder_hidden_states`; HunyuanVideo-1.5: the states and masks of both of
its encoders), so the shared pipeline needs no per-family switch; only the replica leader loads the text
encoder, and the pipeline broadcasts `text` to the replica's other ranks. Families register here when their
package is imported (`dit.loading.FAMILY_PACKAGES`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from dit.loading import model_names, presets
from dit.model_card import apply_card
from dit.presets import resolve
from dit.sampling import (
    FIXED_SCHEDULE_SAMPLERS,
    SAMPLERS,
    SCHEDULERS,
    FixedSchedule,
    config_shift,
    make_scheduler,
    sampler_of,
)

if TYPE_CHECKING:
    from diffusers import SchedulerMixin


@dataclass(frozen=True)
class Limits:
    """Allowed ranges and defaults. Frames are `frame_step`·k + 1 (the VAE's time compression); height and
    width are multiples of `size_multiple` (the VAE's space compression × the DiT's patch size)."""

    min_frames: int = 5
    max_frames: int = 129
    default_frames: int = 81
    frame_step: int = 4
    min_size: int = 16
    max_size: int = 1280
    size_multiple: int = 16
    default_height: int = 480
    default_width: int = 832
    min_steps: int = 1
    max_steps: int = 100
    default_steps: int = 50
    min_guidance: float = 1.0
    max_guidance: float = 20.0
    default_guidance: float = 5.0
    max_prompt_tokens: int = 512
    min_fps: int = 1
    max_fps: int = 60
    default_fps: int = 16
    schedule: FixedSchedule | None = None  # a fixed (distilled) schedule: every run takes exactly its steps
    # the model is conditioned on a first-frame image (image-to-video): every request carries one, and a
    # text-to-video model (False) refuses one unless `image_optional`
    image: bool = False
    # the model takes a first-frame image but needs none (Wan2.2 TI2V-5B: text, or text and image, to video)
    image_optional: bool = False
    # two experts (Wan2.2 A14B, dit.wan.experts): a request may give the low-noise expert's `guidance_scale_2`
    two_experts: bool = False
    # a request with an image and neither height nor width takes the size the family's `video_size` makes
    # of the image at this target size (HunyuanVideo-1.5 image-to-video, as diffusers'); None: the defaults,
    # which then stand for a 16:9 image only (the layout planner's size)
    image_target_size: int | None = None

    def with_schedule(self, schedule: FixedSchedule | None) -> Limits:
        """These limits under a fixed schedule: exactly its step count, and guidance 1 by default (a
        distilled model runs without the unconditional pass; a request may still ask for guidance)."""
        if schedule is None:
            return self
        n = schedule.steps
        return replace(
            self, min_steps=n, max_steps=n, default_steps=n, default_guidance=1.0, schedule=schedule
        )


# Tiny presets run on a CPU in seconds: a short, small video with few steps.
TINY_LIMITS = Limits(
    max_frames=33,
    default_frames=9,
    max_size=256,
    default_height=64,
    default_width=64,
    max_steps=50,
    default_steps=8,
)


@dataclass(frozen=True)
class PipelineFamily:
    class_name: str  # the transformer's config.json `_class_name`
    compression: tuple[int, int]  # the VAE's (time, space) compression, unless `vae_compression` says
    # flow shift when neither the user nor the folder's scheduler/ gives one (a scheduler/ of the class
    # sampled gives its class's default when its config leaves the shift out)
    default_shift: float
    default_sampler: str
    # (transformer, folder or None, preset name) → model(latents, timestep, **text) with `.config.in_channels`
    # (latent channels sampled); the folder or preset tells a task the transformer's config does not
    # (HunyuanVideo-1.5 image-to-video)
    wrap: Callable[[nn.Module, Path | None, str], nn.Module]
    # folder or None → the prompt tokenizer: `count_tokens(text)`, `max_tokens`; small, loaded on every rank
    tokenizer: Callable[[Path | None], Any]
    # (folder or None, wrapped model, tokenizer, dtype, device) → text encoder: `condition(text)` (the model's
    # text keyword arguments); only the replica leader loads one
    text_encoder: Callable[..., nn.Module]
    # (folder or None, latent channels, device) → VAE; every rank loads one
    vae: Callable[..., nn.Module]
    # (vae, latents, group or None) → uint8 frames [F, H, W, 3], decoded in bands of rows across the group
    # (dit.vae_parallel): on its rank 0, None on the others
    decode: Callable[[nn.Module, torch.Tensor, Any], np.ndarray | None]
    limits: Callable[[Path | None, str], Limits]  # (folder or None, preset name) → limits before compression
    samplers: tuple[str, ...]  # the `dit.sampling.SCHEDULERS` names it samples with (`pick_scheduler`)
    # steps → the schedule to set (None: the scheduler's default)
    sigmas: Callable[[int], list[float] | None] = lambda steps: None
    # (folder or None, wrapped model, dtype, device) → the image-to-video model's image encoder, or None (no
    # image features); only the replica leader loads one
    image_encoder: Callable[..., Any] = lambda folder, model, dtype, device: None
    # (vae, image uint8 [H, W, 3] at the video's size, frames) → the image-to-video model's conditioning
    # volume, its keyword argument `condition` (the model's `takes_image`)
    image_condition: Callable[..., torch.Tensor] | None = None
    # (folder or None, latent channels) → the model's VAE compression where it varies within the family
    # (Wan2.2 TI2V-5B's VAE: space ×16); None: `compression`
    vae_compression: Callable[[Path | None, int], tuple[int, int]] | None = None
    # (folder or None, preset name) → whether the model samples as diffusers' `expand_timesteps` pipelines
    # (Wan2.2 TI2V-5B, dit.first_frame.FirstFrame): per-token timesteps, an optional image as the first
    # latent frame
    expand_timesteps: Callable[[Path | None, str], bool] = lambda folder, model: False
    # (vae, image uint8 [H, W, 3] at the video's size) → the latents `[1, C, 1, h, w]` such a model takes as
    # its first latent frame
    first_frame: Callable[..., torch.Tensor] | None = None
    # (image: PIL or uint8 [H, W, 3], target size) → the video's (height, width) for a request that gives none
    # (limits' `image_target_size`)
    video_size: Callable[[Any, int], tuple[int, int]] | None = None
    # the prompt tokens the DiT attends to (padded, or the most kept) and whether they join the
    # self-attention (else cross-attention): the layout planner's FLOPs (`dit.shape.model_shape`)
    text_tokens: int = 512
    joint_text: bool = False

    def compression_of(self, folder: Path | None, channels: int) -> tuple[int, int]:
        """The (time, space) compression of the VAE the family loads for `folder` (or a preset's channels)."""
        return self.compression if self.vae_compression is None else self.vae_compression(folder, channels)


_PIPELINE_FAMILIES: dict[str, PipelineFamily] = {}


def register_pipeline_family(family: PipelineFamily) -> None:
    _PIPELINE_FAMILIES[family.class_name] = family


def model_class_name(model: str) -> str | None:
    """The transformer `_class_name` of a preset, a shipped model or a pipeline/transformer folder."""
    model = resolve(model)
    if model in presets():
        return presets()[model].get("_class_name")
    root = Path(model)
    for config in (root / "transformer" / "config.json", root / "config.json"):
        if config.is_file():
            return json.loads(config.read_text()).get("_class_name")
    raise FileNotFoundError(f"{model}: neither a model name ({', '.join(model_names())}) nor a model folder")


def pipeline_family(model: str) -> PipelineFamily:
    name = model_class_name(model)
    if name not in _PIPELINE_FAMILIES:
        raise ValueError(f"no pipeline for model class {name!r}; known: {sorted(_PIPELINE_FAMILIES)}")
    return _PIPELINE_FAMILIES[name]


def folder_config(folder: Path | None, component: str, file: str) -> dict:
    """A diffusers pipeline folder's `component/file` JSON, or {} when absent."""
    path = folder / component / file if folder is not None else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


# A folder's fixed schedule: a list of timesteps under this key (LightX2V's name for it) in its
# `scheduler/scheduler_config.json`, beside the class and shift it is sampled with.
SCHEDULE_KEY = "denoising_step_list"


def pick_scheduler(
    family: PipelineFamily,
    folder: Path | None,
    sampler: str | None = None,
    flow_shift: float | None = None,
    timesteps: str | None = None,
) -> tuple[str, float, SchedulerMixin, FixedSchedule | None]:
    """(sampler, flow shift, scheduler, fixed schedule or None) of a pipeline: `pick_sampling`'s choice with
    its scheduler made (diffusers loads here)."""
    sampler, flow_shift, own, schedule = pick_sampling(family, folder, sampler, flow_shift, timesteps)
    return sampler, flow_shift, make_scheduler(sampler, flow_shift, own), schedule


def pick_sampling(
    family: PipelineFamily,
    folder: Path | None,
    sampler: str | None = None,
    flow_shift: float | None = None,
    timesteps: str | None = None,
) -> tuple[str, float, dict | None, FixedSchedule | None]:
    """(sampler, flow shift, the folder's scheduler config when its class is the one sampled else None, fixed
    schedule or None) of a pipeline, decided here only (from JSON: no scheduler is made). The sampler
    is the user's, else the folder's `scheduler/` class (flow-match Euler with diffusers'
    `stochastic_sampling`: renoise), else the family's; the shift is the user's, else the folder's (UniPC
    calls it `flow_shift`, flow-match Euler `shift`; Wan 480p: 3, 720p: 5), else the family's. When the
    folder's class is the one sampled, its whole config is used, as diffusers does, a shift it leaves out
    included: the class's default, 1.0. A folder class not in
    `dit.sampling.SCHEDULERS` is an error unless the user picks a sampler. The fixed schedule is the user's
    `timesteps` ("1000,750,500,250"), else the folder's `denoising_step_list`; it needs a sampler of
    `dit.sampling.FIXED_SCHEDULE_SAMPLERS`."""
    config = folder_config(folder, "scheduler", "scheduler_config.json")
    folder_steps = config.pop(SCHEDULE_KEY, None)  # ours: kept out of the scheduler class's config
    class_name = config.get("_class_name")
    if sampler is None and class_name is not None:
        sampler = sampler_of(config)
        if sampler is None:
            raise ValueError(
                f"{folder / 'scheduler'}: scheduler class {class_name!r} is not supported; supported: "
                f"{', '.join(dict.fromkeys(SCHEDULERS.values()))}; or pick a sampler "
                f"({' | '.join(SAMPLERS)}) to sample with its default config"
            )
    if sampler is None:
        sampler = family.default_sampler
    if sampler not in family.samplers:
        raise ValueError(f"sampler must be {' or '.join(map(repr, family.samplers))}, got {sampler!r}")
    if timesteps is not None:
        schedule = FixedSchedule.parse(timesteps)
    elif folder_steps is not None:
        try:
            schedule = FixedSchedule(folder_steps)
        except ValueError as e:
            raise ValueError(
                f"{folder / 'scheduler' / 'scheduler_config.json'}: {SCHEDULE_KEY}: {e}"
            ) from None
    else:
        schedule = None
    if schedule is not None and sampler not in FIXED_SCHEDULE_SAMPLERS:
        raise ValueError(
            f"fixed timesteps {schedule} are sampled with {' or '.join(FIXED_SCHEDULE_SAMPLERS)}, not "
            f"{sampler}; pick one of those samplers"
        )
    own = config if class_name == SCHEDULERS[sampler] else None
    if flow_shift is None and own is not None:  # a shift the config leaves out is its class's, as diffusers
        flow_shift = config_shift(sampler, own)
    elif flow_shift is None:
        flow_shift = config.get("flow_shift", config.get("shift", family.default_shift))
    return sampler, flow_shift, own, schedule


def model_limits(
    family: PipelineFamily, folder: Path | None, model: str, channels: int, patch: tuple[int, ...]
) -> Limits:
    """A model's request limits as its configs tell them, before any weight loads (`load_pipeline` adds
    what its tokenizer and weights tell): the family's, under the folder's own card (`dit.model_card`), the
    frames in the VAE's time steps and the sizes in multiples of its space compression × the patch."""
    base = apply_card(family.limits(folder, model), folder)
    t, s = family.compression_of(folder, channels)
    size_multiple = s * max(patch[1:])
    return replace(
        base,
        frame_step=t,
        min_size=-(-base.min_size // size_multiple) * size_multiple,  # the smallest multiple allowed
        size_multiple=size_multiple,
    )
