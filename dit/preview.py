"""Live previews: the current estimate of the clean latents → a small RGB image, cheaply, while a job
denoises.

A linear map (3 × C matrix + bias) from one latent pixel to the mean colour of the pixels it decodes to,
fitted once per VAE by least squares: smooth random latents (the DiT's normalised space, where x0 lives)
decoded by the pipeline's own VAE (`family.decode`, so no family needs a hook), each latent pixel regressed on
the decoded colour pooled to the latent grid. The preview is the map applied to the middle latent frame,
bilinearly upsampled to the decoded size and capped at `MAX_SIDE` on the long side.

Decoding beats encoding here: regressing on the encoder's latents of synthetic scenes (shapes of known
colours) gave 3–14 dB on the trained tiny model against 15–17 dB (its x0 lies where the decoder reads it, not
where the encoder puts synthetic images, and the fit is unstable off those few directions), and it needs each
family's encode, where decoding uses the `decode` every family has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

MAX_SIDE = 256  # the preview's long side at most, in pixels
FIT_SIZE = (8, 8)  # latent rows × columns of each random latent image decoded for the fit
FIT_SAMPLES = 16  # latent images decoded for the fit: 16 × 64 latent pixels for C + 1 unknowns a colour
# Each fit latent: N(0, 1) on a 3 × 3 grid, upsampled to FIT_SIZE (smooth, as x0 is, so each latent pixel
# decodes to a coherent colour rather than noise that pools to grey) and scaled by one of these in turn (a
# final x0 reaches several σ: a fit on σ = 1 alone is too faint on bright objects). On the trained tiny
# model this lifts the preview's PSNR by ~1 dB over white N(0, 1) latents (bench/preview.py).
FIT_COARSE = 3
FIT_AMPLITUDES = (0.5, 1.0, 2.0, 3.0)

PreviewCallback = Callable[[int, np.ndarray], None]


@dataclass
class LatentPreview:
    """`weight` [3, C] and `bias` [3] map one latent pixel to RGB in [-1, 1]; `scale` is the VAE's spatial
    compression (a preview is at most the decoded size)."""

    weight: torch.Tensor
    bias: torch.Tensor
    scale: int

    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents `[1, C, f, h, w]` → float RGB `[3, h, w]` in [-1, 1] of the middle latent frame."""
        frame = latents[0, :, latents.shape[2] // 2].to("cpu", torch.float32)
        c, h, w = frame.shape
        rgb = torch.addmm(self.bias[:, None], self.weight, frame.reshape(c, h * w))
        return rgb.reshape(3, h, w).clamp(-1, 1)

    def size(self, h: int, w: int) -> tuple[int, int]:
        """The preview's (height, width) for a latent grid h × w: the decoded size, shrunk (aspect kept) to
        at most `MAX_SIDE` on its long side."""
        height, width = h * self.scale, w * self.scale
        shrink = min(1.0, MAX_SIDE / max(height, width))
        return max(1, round(height * shrink)), max(1, round(width * shrink))

    def __call__(self, latents: torch.Tensor) -> np.ndarray:
        """Latents `[1, C, f, h, w]` → uint8 RGB `[H, W, 3]` of the video's middle frame."""
        rgb = self.rgb(latents)
        image = F.interpolate(rgb[None], size=self.size(*rgb.shape[1:]), mode="bilinear", align_corners=False)
        return ((image[0].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()


@torch.no_grad()
def fit_preview(
    decode: Callable[[torch.Tensor], np.ndarray],
    channels: int,
    scale: int,
    *,
    samples: int = FIT_SAMPLES,
    seed: int = 0,
) -> LatentPreview:
    """Fit the map for a VAE: `decode(latents [1, C, 1, h, w])` → uint8 frames `[1, H, W, 3]` (the family's
    decode bound to its VAE), `scale` its spatial compression. Smooth random latents (one latent frame: one
    decoded frame) are decoded, the frames mean-pooled to the latent grid, and RGB regressed on the latents
    (least squares, with a bias)."""
    generator = torch.Generator("cpu").manual_seed(seed)
    h, w = FIT_SIZE
    xs, ys = [], []
    for i in range(samples):
        coarse = torch.randn(1, channels, FIT_COARSE, FIT_COARSE, generator=generator)
        z = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)
        z = (z * FIT_AMPLITUDES[i % len(FIT_AMPLITUDES)])[:, :, None]  # [1, C, 1, h, w]
        frames = decode(z)
        pixels = torch.from_numpy(np.ascontiguousarray(frames[0])).permute(2, 0, 1).float() / 127.5 - 1
        pooled = F.adaptive_avg_pool2d(pixels[None], (h, w))[0]  # [3, h, w]: a latent pixel's colour
        xs.append(z[0, :, 0].reshape(channels, -1).T)
        ys.append(pooled.reshape(3, -1).T)
    x = torch.cat(xs).double()
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    solution = torch.linalg.lstsq(x, torch.cat(ys).double()).solution  # [C + 1, 3]
    return LatentPreview(solution[:-1].T.float().contiguous(), solution[-1].float().contiguous(), scale)
