"""Wan2.1 and Wan2.2's pipeline parts for the shared pipeline (`dit.pipeline`), registered for both of its
checkpoint formats' `_class_name`s."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dit.families import TINY_LIMITS, Limits, PipelineFamily, register_pipeline_family
from dit.sampling import SAMPLERS
from dit.wan import i2v
from dit.wan import vae as wan_vae
from dit.wan.umt5 import load_text_encoder, load_tokenizer


def _wan_limits(folder: Path | None, preset: str) -> Limits:
    return TINY_LIMITS if folder is None and preset.startswith("tiny-") else Limits()  # tiny-*-random


# Wan2.1 and Wan2.2: UMT5 (or the tiny encoder), AutoencoderKLWan (×4 time, ×8 space; Wan2.2 TI2V-5B's ×16),
# UniPC flow sampling unless the folder's scheduler is flow-match Euler; image-to-video models take an image
# (dit.wan.i2v).
WAN = PipelineFamily(
    class_name="WanTransformer3DModel",
    compression=wan_vae.WAN_COMPRESSION,
    default_shift=3.0,  # Wan's 480p value
    default_sampler="unipc",
    wrap=lambda transformer, folder, model: i2v.wrap(transformer),
    tokenizer=load_tokenizer,
    text_encoder=lambda folder, model, tokenizer, dtype, device: load_text_encoder(
        folder, tokenizer, dim=model.config.text_dim, dtype=dtype, device=device
    ),
    vae=lambda folder, channels, device: wan_vae.load_vae(folder, z_dim=channels, device=device),
    decode=wan_vae.decode,
    limits=_wan_limits,
    samplers=SAMPLERS,
    image_encoder=i2v.load_image_encoder,
    image_condition=i2v.latent_condition,
    vae_compression=wan_vae.compression,
    expand_timesteps=i2v.expand_timesteps,
    first_frame=i2v.frame_latents,
)
register_pipeline_family(WAN)
register_pipeline_family(replace(WAN, class_name="WanModel"))  # an original Wan checkpoint folder
