"""Model families: one `ModelFamily` record per family package (`dit/wan/`, `dit/hunyuan/`), registered by
one `register_family` call when the package is imported, and found by the `_class_name` of a model folder's
`transformer/config.json` or a preset's. The record holds what differs between families: the weight formats
it loads (config parsing, model class, checkpoint key mapping), its sequence-parallel step, and the pipeline's
parts (text encoders, VAE, image conditioning, scheduler, limits, a second expert).

A family's model is called as `model(latents, timestep, **text)` where `text` is what its text encoder's
`condition(prompt)` returns (Wan: `encoder_hidden_states`; HunyuanVideo-1.5: the states and masks of both of
its encoders), so the shared pipeline needs no per-family switch; only the replica leader loads the text
encoder, and the pipeline broadcasts `text` to the replica's other ranks. The packages in `FAMILY_PACKAGES`
are imported on first use: adding a family is one package plus one entry there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from dit.model_card import apply_card
from dit.parts import read_json
from dit.presets import PRESETS, SHIPPED, register_preset, resolve
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
    from dit.flow_schedulers import FlowScheduler
    from dit.weights import Resolver

FAMILY_PACKAGES = ("dit.wan", "dit.hunyuan")


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
class WeightFormat:
    """One checkpoint layout a family loads, named by its config.json `_class_name` (Wan: diffusers' and the
    original repository's)."""

    class_name: str  # config.json `_class_name`
    parse_config: Callable[[dict], Any]  # config.json dict → the family's config dataclass
    build: Callable[[Any], nn.Module]  # config → model (called on the meta device)
    resolver: Callable[
        [Any], Resolver
    ]  # config → the key mapping: checkpoint key → our parameter (dit.weights)
    keep_fp32: tuple[str, ...] = ()  # parameter-name fragments kept float32 in lower-precision loads
    # config → resolver of the weight names LoRA files use (see dit.lora); None: `resolver`'s
    lora_resolver: Callable[[Any], Resolver] | None = None
    # (config.json dict, the checkpoint's key names) → the dict completed with what only the weights tell
    # (Wan2.2 I2V's original config reads as Wan2.1 I2V's but has no image embedder); None: as it is
    complete_config: Callable[[dict, set[str]], dict] | None = None


@dataclass(frozen=True)
class ModelFamily:
    name: str  # its package's: "wan", "hunyuan"
    formats: tuple[WeightFormat, ...]  # the checkpoint layouts it loads, one per `_class_name`
    # (model, mesh, comm, backend) → the model made sequence-parallel in place (`dit.parallelize`), for the
    # models of `parallel_models` (the transformers and pipeline adapters it makes)
    parallelize: Callable[..., nn.Module]
    parallel_models: tuple[type, ...]
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
    # (vae, latents, group or None, on_frames, go_on) → uint8 frames [F, H, W, 3], decoded in bands of rows
    # across the group (dit.vae_parallel): on its rank 0, None on the others
    decode: Callable[[nn.Module, torch.Tensor, Any], np.ndarray | None]
    limits: Callable[[Path | None, str], Limits]  # (folder or None, preset name) → limits before compression
    samplers: tuple[str, ...]  # the `dit.sampling.SCHEDULERS` names it samples with (`pick_scheduler`)
    # steps → the schedule to set (None: the scheduler's default)
    sigmas: Callable[[int], list[float] | None] = lambda steps: None
    # (folder or None, wrapped model, dtype, device) → the image-to-video model's image encoder, or None (no
    # image features); only the replica leader loads one
    image_encoder: Callable[..., Any] = lambda folder, model, dtype, device: None
    # (transformer's parsed config, folder or None, preset name) → whether the model is image-to-video: every
    # request carries a first frame (`Limits.image`); known from configs, before any weight loads
    takes_image: Callable[[Any, Path | None, str], bool] = lambda config, folder, model: False
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
    # (the image's height, width, target size) → the video's (height, width) for a request that gives none
    # (limits' `image_target_size`); the API answers with it too before a worker has the job
    video_size: Callable[[int, int, int], tuple[int, int]] | None = None
    # the prompt tokens the DiT attends to (padded, or the most kept) and whether they join the
    # self-attention (else cross-attention): the layout planner's FLOPs (`dit.shape.model_shape`)
    text_tokens: int = 512
    joint_text: bool = False
    # (preset name, folder or None) → the boundary ratio of a two-expert model (Wan2.2 A14B: the low-noise
    # expert takes the timesteps below it × 1000), None for one expert
    boundary_ratio: Callable[[str, Path | None], float | None] = lambda model, folder: None
    # (preset name, folder or None) → (what `dit.load_transformer` loads the second expert from, its seed)
    second_source: Callable[[str, Path | None], tuple[str, int]] | None = None
    presets: Mapping[str, dict] = field(default_factory=dict)  # its presets (config.json form), by name

    def compression_of(self, folder: Path | None, channels: int) -> tuple[int, int]:
        """The (time, space) compression of the VAE the family loads for `folder` (or a preset's channels)."""
        return self.compression if self.vae_compression is None else self.vae_compression(folder, channels)


_FAMILIES: dict[str, ModelFamily] = {}  # by each weight format's `_class_name`


def register_family(family: ModelFamily) -> None:
    """Make `family` the one its formats' `_class_name`s name, and its presets loadable."""
    for weights in family.formats:
        _FAMILIES[weights.class_name] = family
    for name, config in family.presets.items():
        register_preset(name, config)


def _import_families() -> None:
    for package in FAMILY_PACKAGES:
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as e:
            if e.name != package:
                raise


def families() -> list[ModelFamily]:
    """Every registered family, once each."""
    _import_families()
    return list({id(family): family for family in _FAMILIES.values()}.values())


def presets() -> dict[str, dict]:
    """Every preset (config.json form), the families' own included."""
    _import_families()
    return PRESETS


def model_names() -> list[str]:
    """Every name a model can be given by: the shipped models' and the presets', sorted."""
    return sorted([*SHIPPED, *presets()])


def family_for(class_name: str | None, unknown: str = "unknown model class") -> ModelFamily:
    """The family of a transformer `_class_name`; ValueError starting with `unknown` if none."""
    _import_families()
    if class_name not in _FAMILIES:
        raise ValueError(f"{unknown} {class_name!r}; known: {sorted(_FAMILIES)}")
    return _FAMILIES[class_name]


def weight_format(class_name: str | None) -> WeightFormat:
    """The weight format a transformer `_class_name` names."""
    return next(w for w in family_for(class_name).formats if w.class_name == class_name)


def model_class_name(model: str) -> str | None:
    """The transformer `_class_name` of a preset, a shipped model or a pipeline/transformer folder."""
    model = resolve(model)
    if model in presets():
        return presets()[model].get("_class_name")
    root = Path(model)
    for config in (root / "transformer" / "config.json", root / "config.json"):
        if config.is_file():
            return read_json(config).get("_class_name")
    raise FileNotFoundError(f"{model}: neither a model name ({', '.join(model_names())}) nor a model folder")


def model_family(model: str) -> ModelFamily:
    """The family of a preset, a shipped model or a folder."""
    return family_for(model_class_name(model), "no pipeline for model class")


def folder_config(folder: Path | None, component: str, file: str) -> dict:
    """A diffusers pipeline folder's `component/file` JSON, or {} when absent; ValueError naming the file
    when it is not JSON."""
    path = folder / component / file if folder is not None else None
    return read_json(path) if path is not None and path.is_file() else {}


# A folder's fixed schedule: a list of timesteps under this key (LightX2V's name for it) in its
# `scheduler/scheduler_config.json`, beside the class and shift it is sampled with.
SCHEDULE_KEY = "denoising_step_list"


def pick_scheduler(
    family: ModelFamily,
    folder: Path | None,
    sampler: str | None = None,
    flow_shift: float | None = None,
    timesteps: str | None = None,
) -> tuple[str, float, FlowScheduler, FixedSchedule | None]:
    """(sampler, flow shift, scheduler, fixed schedule or None) of a pipeline: `pick_sampling`'s choice with
    its scheduler made."""
    sampler, flow_shift, own, schedule = pick_sampling(family, folder, sampler, flow_shift, timesteps)
    return sampler, flow_shift, make_scheduler(sampler, flow_shift, own), schedule


def pick_sampling(
    family: ModelFamily,
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
    asked = sampler  # the caller's; None: the folder's, else the family's
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
        takes = " or ".join(map(repr, family.samplers))
        if asked is None:  # no one asked for it but the folder's config
            raise ValueError(
                f"{folder / 'scheduler' / 'scheduler_config.json'} samples with {sampler!r}, which this "
                f"model does not take: pick a sampler, {takes}"
            )
        raise ValueError(f"sampler must be {takes}, got {sampler!r}")
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
        # a folder's own schedule is named as such: with `--sampler unipc` the message named no file
        whose = (
            ""
            if timesteps is not None
            else f"{folder / 'scheduler' / 'scheduler_config.json'}: its {SCHEDULE_KEY} "
        )
        raise ValueError(
            f"{whose}fixed timesteps {schedule} are sampled with {' or '.join(FIXED_SCHEDULE_SAMPLERS)}, not "
            f"{sampler}; pick one of those samplers"
        )
    own = config if class_name == SCHEDULERS[sampler] else None
    if flow_shift is None and own is not None:  # a shift the config leaves out is its class's, as diffusers
        flow_shift = config_shift(sampler, own)
    elif flow_shift is None:
        flow_shift = config.get("flow_shift", config.get("shift", family.default_shift))
    if own is not None:  # an option value the scheduler does not support is refused before any model loads
        try:
            make_scheduler(sampler, flow_shift, own)
        except ValueError as e:
            raise ValueError(f"{folder / 'scheduler' / 'scheduler_config.json'}: {e}") from None
    return sampler, flow_shift, own, schedule


def model_limits(
    family: ModelFamily, folder: Path | None, model: str, config, channels: int, patch: tuple[int, ...]
) -> Limits:
    """A model's request limits as its configs tell them, before any weight loads (`load_pipeline` adds
    what its tokenizer and weights tell): the family's, under the folder's own card (`dit.model_card`), the
    frames in the VAE's time steps, the sizes in multiples of its space compression × the patch, and
    whether it takes a first-frame image. `config`: the transformer's parsed config."""
    base = apply_card(family.limits(folder, model), folder)
    t, s = family.compression_of(folder, channels)
    size_multiple = s * max(patch[1:])
    return replace(
        base,
        frame_step=t,
        min_size=-(-base.min_size // size_multiple) * size_multiple,  # the smallest multiple allowed
        size_multiple=size_multiple,
        image=family.takes_image(config, folder, model),
        image_optional=family.expand_timesteps(folder, model),
        two_experts=family.boundary_ratio(model, folder) is not None,
    )
