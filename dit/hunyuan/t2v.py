"""HunyuanVideo-1.5 text-to-video and image-to-video for the shared pipeline (`dit.pipeline`): the model
adapters and the pipeline family (text encoders, VAE, image encoder, flow-match Euler schedule, limits)
registered for its `_class_name`.

HunyuanVideo-1.5's input is `[noisy latent, conditioning latent, mask]` along channels (2C+1); for
text-to-video the last two are zero, and there are no image tokens (the reference passes all-zero image
embeddings, which it treats as padding); image-to-video fills them from the first frame (`dit.hunyuan.i2v`).
The text arrives with its real masks: Qwen2.5-VL's states with `encoder_attention_mask` and ByT5's glyph
states with `encoder_attention_mask_2`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dit.families import TINY_LIMITS, Limits, PipelineFamily, folder_config, register_pipeline_family
from dit.hunyuan import i2v, vae
from dit.hunyuan.config import DIFFUSERS_CLASS_NAME, PRESETS
from dit.hunyuan.model import HunyuanVideo15Transformer
from dit.hunyuan.text import BYT5_MAX_TOKENS, MLLM_MAX_TOKENS, load_text_encoders, load_tokenizer


@dataclass(frozen=True)
class T2VConfig:
    """The config fields the shared pipeline reads."""

    in_channels: int  # latent channels the pipeline samples
    text_dim: int
    patch_size: tuple[int, int, int]


class HunyuanT2V(nn.Module):
    def __init__(self, transformer: HunyuanVideo15Transformer):
        super().__init__()
        cfg = transformer.config
        if cfg.in_channels != 2 * cfg.out_channels + 1:
            raise ValueError(f"in_channels={cfg.in_channels} is not 2*out_channels+1 ({cfg.out_channels})")
        self.transformer = transformer
        self.config = T2VConfig(cfg.out_channels, cfg.text_embed_dim, cfg.patch)

    def forward(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_hidden_states_2: torch.Tensor | None = None,
        encoder_attention_mask_2: torch.Tensor | None = None,
        condition: torch.Tensor | None = None,
        encoder_hidden_states_image: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`condition` (the conditioning latent and mask) and `encoder_hidden_states_image` (SigLIP features)
        are image-to-video's (`HunyuanI2V`); without them: zero conditioning latent and mask, no image."""
        if condition is None:
            b, c, f, h, w = latents.shape
            condition = latents.new_zeros(b, c + 1, f, h, w)
        return self.transformer(
            torch.cat([latents, condition.to(latents.dtype)], dim=1),
            timestep,
            encoder_hidden_states,
            encoder_attention_mask,
            encoder_hidden_states_2=encoder_hidden_states_2,
            encoder_attention_mask_2=encoder_attention_mask_2,
            image_embeds=encoder_hidden_states_image,
        )


class HunyuanI2V(HunyuanT2V):
    """The image-to-video model: every request carries a first frame (`Limits.image`)."""

    takes_image = True


def wrap(transformer: HunyuanVideo15Transformer, folder: Path | None, model: str) -> HunyuanT2V:
    return (HunyuanI2V if i2v.is_i2v(folder, model) else HunyuanT2V)(transformer)


def _limits(folder: Path | None, preset: str) -> Limits:
    # image-to-video: a request with no size takes the image's (`i2v.video_size`), as the reference's does
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


FAMILY = PipelineFamily(
    class_name=DIFFUSERS_CLASS_NAME,
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
    image_condition=i2v.latent_condition,
    video_size=i2v.video_size,
)
register_pipeline_family(FAMILY)
