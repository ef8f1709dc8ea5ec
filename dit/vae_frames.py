"""What every family's VAE shares: the fit check at load, and its decoded video as uint8 frames, decoded in
bands of rows across a group (`dit.vae_parallel`). Family-free: the families' VAE modules import it."""

from __future__ import annotations

import numpy as np
import torch


def check_vae(vae, channels: int, expected_channels: int, compression, expected_compression):
    """The VAE in eval mode; ValueError if it does not fit the DiT (channels) or the latents (compression)."""
    if channels != expected_channels:
        raise ValueError(f"the VAE has {channels} latent channels but the DiT expects {expected_channels}")
    if tuple(compression) != tuple(expected_compression):
        raise ValueError(
            f"the VAE compresses (time, space) by {tuple(compression)}; "
            f"this pipeline expects {tuple(expected_compression)}"
        )
    return vae.eval()


def decode_frames(vae, z: torch.Tensor, group=None, on_frames=None) -> np.ndarray | None:
    """The VAE's own latents `z` (float32, on its device) → uint8 frames `[F, H, W, 3]`. With a group, every
    rank of it decodes a band of rows and its rank 0 gets the frames (None elsewhere). `on_frames` (that
    rank) gets them as they are decoded, in pieces `[n, H, W, 3]` where the VAE decodes chunk by chunk."""
    from dit import vae_parallel  # the families' VAE layers are registered by then

    on_chunk = None if on_frames is None else lambda chunk: on_frames(frames(chunk))
    return frames(vae_parallel.decode(vae, z, group, finish=quantize, on_chunk=on_chunk))


def quantize(video: torch.Tensor) -> torch.Tensor:
    """A decoded video (or band of one) in [-1, 1] → uint8 levels, the same layout."""
    return ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def frames(video: torch.Tensor | None) -> np.ndarray | None:
    """uint8 `[1, 3, F, H, W]` → frames `[F, H, W, 3]` on the host (None stays None: not the leader)."""
    return None if video is None else video[0].permute(1, 2, 3, 0).cpu().numpy()


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """A decoded video `[1, 3, F, H, W]` in [-1, 1] → uint8 frames `[F, H, W, 3]`."""
    return frames(quantize(video))
