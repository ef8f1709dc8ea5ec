"""HunyuanVideo-1.5's VAE (diffusers `AutoencoderKLHunyuanVideo15`: ×4 time, ×16 space, 32 channels) from a
pipeline folder's `vae/`, or a tiny random one of the same compression for `tiny-joint`. Encodes (an
image-to-video model's first frame) in float32, decodes in its decoder's dtype (`--vae-dtype`, float32 by
default; as `dit.wan.vae` does for Wan), a latent frame at a time (`dit.hunyuan.vae_chunks`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dit import vae_parallel
from dit.hunyuan.vae_chunks import streamed
from dit.vae_frames import check_vae, decode_frames

if TYPE_CHECKING:  # diffusers loads when a VAE is made
    from diffusers import AutoencoderKLHunyuanVideo15

COMPRESSION = (4, 16)


def tiny_vae(latent_channels: int, *, seed: int = 0) -> AutoencoderKLHunyuanVideo15:
    """The published compression (5 levels: ×16 space, ×4 time) with 8 channels per level."""
    from diffusers import AutoencoderKLHunyuanVideo15

    _register_layers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLHunyuanVideo15(
            latent_channels=latent_channels, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1
        )
    return vae.eval()


def load_vae(folder: Path | None, channels: int, device) -> AutoencoderKLHunyuanVideo15:
    if folder is not None and (folder / "vae").is_dir():
        from diffusers import AutoencoderKLHunyuanVideo15

        _register_layers()
        vae = AutoencoderKLHunyuanVideo15.from_pretrained(Path(folder) / "vae", torch_dtype=torch.float32)
    else:
        vae = tiny_vae(channels)
    cfg = vae.config
    found = (cfg.temporal_compression_ratio, cfg.spatial_compression_ratio)
    return streamed(check_vae(vae, cfg.latent_channels, channels, found, COMPRESSION)).to(device)


def _register_layers() -> None:
    """diffusers' decoder layers for the banded decode (`dit.vae_parallel`): all row-local but the attention
    block (causal over all frames, within the whole frame) and the causal convolution, which pads rows in
    its own `pad_mode` (F.pad's order: W, W, H, H, T, 0)."""
    from diffusers.models.autoencoders import autoencoder_kl_hunyuanvideo15 as hy

    def causal_padding(conv) -> vae_parallel.RowPadding:
        p = conv.time_causal_padding
        unpadded = (*p[:2], 0, 0, *p[4:])
        return vae_parallel.RowPadding("time_causal_padding", unpadded, p[2], p[3], conv.pad_mode, conv.conv)

    vae_parallel.register(
        row_local=(hy.HunyuanVideo15Decoder3D, hy.HunyuanVideo15MidBlock, hy.HunyuanVideo15UpBlock3D,
                   hy.HunyuanVideo15ResnetBlock, hy.HunyuanVideo15Upsample, hy.HunyuanVideo15RMS_norm),
        gathered=(hy.HunyuanVideo15AttnBlock,),
        padded={hy.HunyuanVideo15CausalConv3d: causal_padding},
    )  # fmt: skip


@torch.no_grad()
def encode(vae: AutoencoderKLHunyuanVideo15, video: torch.Tensor) -> torch.Tensor:
    """Pixels `[1, 3, F, H, W]` in [-1, 1] → the DiT's latents, float32: the distribution's mode ×
    scaling_factor, as the reference's `_get_image_latents`."""
    z = vae.encode(video.to(next(vae.parameters()).device, torch.float32)).latent_dist.mode()
    return z * vae.config.scaling_factor


@torch.no_grad()
def decode(
    vae: AutoencoderKLHunyuanVideo15, latents: torch.Tensor, group=None, on_frames=None, go_on=None
) -> np.ndarray | None:
    """Latents `[1, C, f, h, w]` (the DiT's space: the VAE's latents × scaling_factor) → uint8 frames; with a
    group, decoded in bands across it (`dit.vae_frames.decode_frames`); `on_frames` gets them a latent
    frame's at a time, as they decode (the VAE `load_vae` gives: `dit.hunyuan.vae_chunks`), and `go_on` may
    stop the decode at each."""
    z = latents.to(next(vae.parameters()).device, torch.float32) / vae.config.scaling_factor
    return decode_frames(vae, z, group, on_frames, go_on)
