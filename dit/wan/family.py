"""The Wan family's record (`dit.families.ModelFamily`): Wan2.1 and Wan2.2 in diffusers' and the original
repository's checkpoint formats; UMT5 (or the tiny encoder), dit.wan.vae (×4 time, ×8 space; Wan2.2
TI2V-5B's ×16), UniPC flow sampling unless the folder's scheduler is flow-match Euler; image-to-video models
take an image (dit.wan.i2v), Wan2.2 A14B has two experts (dit.wan.experts)."""

from __future__ import annotations

from pathlib import Path

from dit.families import TINY_LIMITS, Limits, ModelFamily, WeightFormat
from dit.sampling import SAMPLERS
from dit.sequence_parallel import parallelize_by_contract
from dit.wan import experts, i2v
from dit.wan import vae as wan_vae
from dit.wan.config import WanConfig, complete_original
from dit.wan.model import FP32_PARAMS, WanModel
from dit.wan.state_dict import lora_resolver, resolver
from dit.wan.umt5 import load_text_encoder, load_tokenizer


def _wan_limits(folder: Path | None, preset: str) -> Limits:
    return TINY_LIMITS if folder is None and preset.startswith("tiny-") else Limits()  # tiny-*-random


def parallelize_wan(model, mesh, comm, backend):
    """Wan follows `dit.parallelize`'s contract; in the image-to-video adapter, its transformer does."""
    inner = model.transformer if isinstance(model, i2v.WanI2V) else model
    parallelize_by_contract(inner, mesh, comm, backend)
    return model


FAMILY = ModelFamily(
    name="wan",
    formats=(
        WeightFormat(
            "WanTransformer3DModel",
            WanConfig.from_diffusers,
            WanModel,
            lambda c: resolver(c, "diffusers"),
            FP32_PARAMS,
            lora_resolver,
        ),
        WeightFormat(  # an original Wan checkpoint folder
            "WanModel",
            WanConfig.from_original,
            WanModel,
            lambda c: resolver(c, "original"),
            FP32_PARAMS,
            lora_resolver,
            complete_original,
        ),
    ),
    parallelize=parallelize_wan,
    parallel_models=(WanModel, i2v.WanI2V),
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
    takes_image=lambda config, folder, model: i2v.is_i2v(config),
    image_condition=i2v.latent_condition,
    vae_compression=wan_vae.compression,
    expand_timesteps=i2v.expand_timesteps,
    first_frame=i2v.frame_latents,
    boundary_ratio=experts.boundary_ratio,
    second_source=experts.second_source,
)
