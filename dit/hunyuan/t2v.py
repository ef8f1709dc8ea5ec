"""Text-to-video adapter: lets the shared pipeline (`dit.pipeline`, written around Wan's `model(x, t, text)`
call) drive a HunyuanVideo-1.5 transformer.

HunyuanVideo-1.5's input is `[noisy latent, conditioning latent, mask]` along channels (2C+1); for
text-to-video the last two are zero. The shared text encoders return `[B, T, dim]` with padding rows exactly
zero, which gives the text mask back; no ByT5 or image tokens are used (the reference then treats them as
padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dit.hunyuan.model import HunyuanVideo15Transformer


@dataclass(frozen=True)
class T2VConfig:
    """The config fields the shared pipeline reads, in Wan's terms."""

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

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        b, c, f, h, w = latents.shape
        condition = latents.new_zeros(b, c + 1, f, h, w)  # no image: zero conditioning latent and mask
        text_mask = text.ne(0).any(dim=-1)
        return self.transformer(torch.cat([latents, condition], dim=1), timestep, text, text_mask)
