"""What every family's VAE shares: the fit check at load, and its decoded video as uint8 frames, decoded in
bands of rows across a group (`dit.vae_parallel`). Family-free: the families' VAE modules import it."""

from __future__ import annotations

import numpy as np
import torch

from dit import vae_parallel
from dit.failures import GenerationFailed


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


def decode_frames(vae, z: torch.Tensor, group=None, on_frames=None, go_on=None) -> np.ndarray | None:
    """The VAE's own latents `z` (float32, on its device; cast to the decoder's dtype) → uint8 frames
    `[F, H, W, 3]`. With a group, every rank of it decodes a band of rows and its rank 0 gets the frames (None
    elsewhere). `on_frames` (that rank) gets them as they are decoded, in pieces `[n, H, W, 3]` where the VAE
    decodes chunk by chunk; `go_on` (that rank) can stop the decode at a chunk (`vae_parallel.decode`)."""
    on_chunk = None if on_frames is None else lambda chunk: on_frames(frames(chunk))
    z = z.to(decoder_dtype(vae))
    return frames(vae_parallel.decode(vae, z, group, finish=quantize, on_chunk=on_chunk, go_on=go_on))


def cast_decoder(vae, dtype: torch.dtype):
    """The VAE with what its decode runs (`vae_parallel.decoder_parts`) in `dtype` (`--vae-dtype`): the
    encoder stays float32, so an image's latents (image-to-video), and so the video's, do not depend on it."""
    for part in vae_parallel.decoder_parts(vae):
        part.to(dtype)
    return vae


def decoder_dtype(vae) -> torch.dtype:
    """What `cast_decoder` made the decoder (float32 unless cast)."""
    return next(p for part in vae_parallel.decoder_parts(vae) for p in part.parameters()).dtype


def quantize(video: torch.Tensor) -> torch.Tensor:
    """A decoded video (or band of one) in [-1, 1] → uint8 levels, the same layout; rounded in float32
    whatever the decoder's dtype (bfloat16 holds only 8 bits of mantissa: 127.5·x would round off levels).
    GenerationFailed when it holds a non-finite value (a float16 decode's overflow), which the cast would
    make black or white pixels without a word."""
    if not bool(torch.isfinite(video).all()):
        raise GenerationFailed(
            f"the VAE decode in {str(video.dtype).removeprefix('torch.')} gave non-finite values (an "
            "overflow): decode in bfloat16 or float32 (--vae-dtype)"
        )
    return ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def frames(video: torch.Tensor | None) -> np.ndarray | None:
    """uint8 `[1, 3, F, H, W]` → frames `[F, H, W, 3]` on the host (None stays None: not the leader)."""
    return None if video is None else video[0].permute(1, 2, 3, 0).cpu().numpy()


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """A decoded video `[1, 3, F, H, W]` in [-1, 1] → uint8 frames `[F, H, W, 3]`."""
    return frames(quantize(video))
