"""HunyuanVideo-1.5 text-to-video and image-to-video for the shared pipeline (`dit.pipeline`): the model
adapters its family record (`dit.hunyuan.family`) wraps the transformer in.

HunyuanVideo-1.5's input is `[noisy latent, conditioning latent, mask]` along channels (2C+1); for
text-to-video the last two are zero, and there are no image tokens (the reference passes all-zero image
embeddings, which it treats as padding); image-to-video fills them from the first frame (`dit.hunyuan.i2v`).
The text arrives with its real masks: Qwen2.5-VL's states with `encoder_attention_mask` and ByT5's glyph
states with `encoder_attention_mask_2`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dit.hunyuan import i2v
from dit.hunyuan.model import HunyuanVideo15Transformer


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
