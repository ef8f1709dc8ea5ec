"""The HunyuanVideo-1.5 family's record (`dit.families.ModelFamily`): the diffusers
`HunyuanVideo15Transformer3DModel` weight layout, its sequence-parallel step, its pipeline parts (Qwen2.5-VL
and ByT5 text encoders, its VAE, SigLIP image encoder, flow-match Euler schedule, limits) and presets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from dit.families import TINY_LIMITS, Limits, ModelFamily, WeightFormat, folder_config
from dit.hunyuan import i2v, vae
from dit.hunyuan.config import DIFFUSERS_CLASS_NAME, PRESETS, HunyuanVideo15Config
from dit.hunyuan.model import HunyuanVideo15Transformer
from dit.hunyuan.parallelize import parallelize_hunyuan
from dit.hunyuan.state_dict import resolve
from dit.hunyuan.t2v import HunyuanT2V, wrap
from dit.hunyuan.text import BYT5_MAX_TOKENS, MLLM_MAX_TOKENS, load_text_encoders, load_tokenizer


def _limits(folder: Path | None, preset: str) -> Limits:
    # image-to-video: a request with no size takes the image's (`i2v.closest_size`), as the reference's does
    target = PRESETS[preset].target_size if folder is None else _folder_target_size(folder)
    from_image = {"image_target_size": target} if i2v.is_i2v(folder, preset) else {}
    if folder is None and preset in ("tiny-joint", *i2v.PRESETS):
        return replace(TINY_LIMITS, **from_image)
    # The reference's defaults: 121 frames at 24 fps, the 16:9 size closest to the model's target size
    # (480p: 480x848), the guidance its guider/ was published with.
    height, width = i2v.closest_size(9, 16, target)
    guidance = folder_config(folder, "guider", "guider_config.json").get("guidance_scale", 6.0)
    return Limits(
        max_frames=241,
        default_frames=121,
        default_height=height,
        default_width=width,
        default_guidance=guidance,
        default_fps=24,
        **from_image,
    )


def _folder_target_size(folder: Path) -> int:
    return folder_config(folder, "transformer", "config.json").get("target_size", 640)


def _sigmas(steps: int) -> list[float]:
    """The reference's schedule: linspace(1, 0) without the final 0 (the scheduler shifts it)."""
    return np.linspace(1.0, 0.0, steps + 1)[:-1].tolist()


FAMILY = ModelFamily(
    name="hunyuan",
    formats=(
        WeightFormat(
            class_name=DIFFUSERS_CLASS_NAME,
            parse_config=HunyuanVideo15Config.from_dict,
            build=HunyuanVideo15Transformer,
            resolver=lambda config: resolve,
        ),
    ),
    parallelize=parallelize_hunyuan,
    parallel_models=(HunyuanVideo15Transformer, HunyuanT2V),  # HunyuanI2V is a HunyuanT2V
    compression=vae.COMPRESSION,
    default_shift=5.0,  # the 480p text-to-video scheduler's shift
    default_sampler="euler",
    wrap=wrap,
    tokenizer=load_tokenizer,
    text_encoder=load_text_encoders,
    vae=vae.load_vae,
    decode=vae.decode,
    limits=_limits,
    samplers=("euler",),  # its published flow-match Euler
    text_tokens=MLLM_MAX_TOKENS + BYT5_MAX_TOKENS,  # joined to the image tokens, masked
    joint_text=True,
    sigmas=_sigmas,
    image_encoder=i2v.load_image_encoder,
    takes_image=lambda config, folder, model: i2v.is_i2v(folder, model),
    image_condition=i2v.latent_condition,
    video_size=i2v.closest_size,
    presets={
        name: {"_class_name": DIFFUSERS_CLASS_NAME, **config.to_dict()} for name, config in PRESETS.items()
    },
)
