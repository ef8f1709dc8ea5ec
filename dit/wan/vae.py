"""Wan's video VAE (diffusers `AutoencoderKLWan`): real weights from a pipeline folder, or a tiny random one.

The VAE stays in float32 whatever the DiT runs in (as in diffusers' Wan examples): decoding is a small part of
the run time and bf16 decoding visibly bands the output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dit.vae_frames import check_vae, decode_frames

if TYPE_CHECKING:  # diffusers loads when a VAE is made, not when the pipeline's modules are imported
    from diffusers import AutoencoderKLWan

# Wan2.1's VAE compresses time ×4 (frames = 4k+1) and space ×8: the family's default, and diffusers' when a
# VAE config gives no scale factors.
WAN_COMPRESSION = (4, 8)
# Wan2.2's VAE (TI2V-5B): residual blocks on 2×2-patchified pixels (12 channels in and out) and 48 latent
# channels; space ×16 (×8 by the decoder, ×2 by the patches). The published config's layout keys.
WAN22_Z_DIM = 48
WAN22_LAYOUT = dict(is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16)


def tiny_vae(z_dim: int, *, seed: int = 0) -> AutoencoderKLWan:
    """Wan's VAE layout and compression with a few channels, random weights from a fixed seed: Wan2.2's for
    its 48 latent channels, Wan2.1's (time ×4, space ×8) otherwise."""
    from diffusers import AutoencoderKLWan

    layout = WAN22_LAYOUT if z_dim == WAN22_Z_DIM else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(
            base_dim=8,
            z_dim=z_dim,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim,
            latents_std=[1.0] * z_dim,
            **layout,
        )
    return vae.eval()


def compression(folder: str | Path | None, z_dim: int) -> tuple[int, int]:
    """The (time, space) compression of the VAE `load_vae` gives, known before it loads (it sizes the
    latents on every rank): the scale factors of the folder's `vae/config.json`, else the tiny VAE's."""
    if folder is not None and (Path(folder) / "vae").is_dir():
        config = json.loads((Path(folder) / "vae" / "config.json").read_text())
    else:
        config = WAN22_LAYOUT if z_dim == WAN22_Z_DIM else {}
    time, space = WAN_COMPRESSION
    return config.get("scale_factor_temporal", time), config.get("scale_factor_spatial", space)


def load_vae(folder: str | Path | None, *, z_dim: int, device: torch.device | str) -> AutoencoderKLWan:
    """`folder/vae` when present, otherwise the tiny VAE with the DiT's latent channels; ValueError unless its
    layers compress as its config's scale factors say (`compression`)."""
    if folder is not None and (Path(folder) / "vae").is_dir():
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(Path(folder) / "vae", torch_dtype=torch.float32)
    else:
        vae = tiny_vae(z_dim)
    cfg = vae.config
    found = (2 ** sum(cfg.temperal_downsample), 2 ** (len(cfg.dim_mult) - 1) * (cfg.patch_size or 1))
    return check_vae(vae, cfg.z_dim, z_dim, found, compression(folder, z_dim)).to(device)


@torch.no_grad()
def decode(vae: AutoencoderKLWan, latents: torch.Tensor, group=None) -> np.ndarray | None:
    """Latents `[1, C, f, h, w]` (the DiT's normalised space) → uint8 frames `[F, H, W, 3]`. With a group,
    every rank of it decodes a band of rows (`dit.vae_frames.decode_frames`)."""
    cfg = vae.config
    shape = (1, cfg.z_dim, 1, 1, 1)
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(shape)
    std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(shape)
    device = next(vae.parameters()).device
    z = latents.to(device, torch.float32) * std.to(device) + mean.to(device)
    return decode_frames(vae, z, group)


@torch.no_grad()
def encode(vae: AutoencoderKLWan, video: torch.Tensor) -> torch.Tensor:
    """A video `[1, 3, F, H, W]` in [-1, 1] → its latents' mode in the DiT's normalised space (as diffusers'
    Wan image-to-video conditions on the first frame), float32 on the VAE's device."""
    cfg = vae.config
    shape = (1, cfg.z_dim, 1, 1, 1)
    device = next(vae.parameters()).device
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float32, device=device).view(shape)
    std = torch.tensor(cfg.latents_std, dtype=torch.float32, device=device).view(shape)
    z = vae.encode(video.to(device, torch.float32)).latent_dist.mode()
    return (z - mean) / std
