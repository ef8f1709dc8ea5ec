"""Live previews: the current estimate of the clean latents → a small RGB image, cheaply, while a job
denoises.

A map from one latent pixel to the mean colour of the pixels it decodes to: a 3 × C matrix and a bias,
and, for a VAE whose colour is a product of channels, the channels' pairwise products too. A VAE folder may
ship its map (`vae/latent_preview.json`, `read_preview`): the trained tiny model's VAE draws a pixel as a
cell's lit share times the clip's colour (dit.tiny.latents), which no linear map can do (a linear one gives
every object one olive tint), so it ships a map with products (dit.tiny.preview_map). Otherwise a linear map
is fitted once at load by least squares: smooth random latents (the DiT's normalised space, where x0 lives)
decoded by the pipeline's own VAE (`family.decode`, so no family needs a hook), each latent pixel regressed
on the decoded colour pooled to the latent grid. The preview is the map applied to the middle latent frame,
bilinearly upsampled to the decoded size and capped at `MAX_SIDE` on the long side.

Decoding beats encoding here: regressing on the encoder's latents of synthetic scenes (shapes of known
colours) gave 3–14 dB on the trained tiny model against 15–17 dB (its x0 lies where the decoder reads it, not
where the encoder puts synthetic images, and the fit is unstable off those few directions), and it needs each
family's encode, where decoding uses the `decode` every family has.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

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
MAP_FILE = "latent_preview.json"  # a VAE folder's own map, beside its config.json


@dataclass
class LatentPreview:
    """`weight` [3, C], `bias` [3] and `quadratic` [3, C(C+1)/2] (the products of channels i ≤ j; None: a
    linear map) map one latent pixel to RGB in [-1, 1]; `scale` is the VAE's spatial compression (a preview
    is at most the decoded size)."""

    weight: torch.Tensor
    bias: torch.Tensor
    scale: int
    quadratic: torch.Tensor | None = None

    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents `[1, C, f, h, w]` → float RGB `[3, h, w]` in [-1, 1] of the middle latent frame."""
        frame = latents[0, :, latents.shape[2] // 2].to("cpu", torch.float32)
        c, h, w = frame.shape
        pixels = frame.reshape(c, h * w)
        rgb = torch.addmm(self.bias[:, None], self.weight, pixels)
        if self.quadratic is not None:
            rgb += self.quadratic @ pair_products(pixels)
        return rgb.reshape(3, h, w).clamp(-1, 1)

    def size(self, h: int, w: int) -> tuple[int, int]:
        """The preview's (height, width) for a latent grid h × w: the decoded size, `preview_size`."""
        return preview_size(h * self.scale, w * self.scale)

    def __call__(self, latents: torch.Tensor) -> np.ndarray:
        """Latents `[1, C, f, h, w]` → uint8 RGB `[H, W, 3]` of the video's middle frame."""
        rgb = self.rgb(latents)
        image = F.interpolate(rgb[None], size=self.size(*rgb.shape[1:]), mode="bilinear", align_corners=False)
        return ((image[0].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()


def preview_size(height: int, width: int) -> tuple[int, int]:
    """A preview's (height, width) for a video's: shrunk, aspect kept, to at most `MAX_SIDE` on its long
    side."""
    shrink = min(1.0, MAX_SIDE / max(height, width))
    return max(1, round(height * shrink)), max(1, round(width * shrink))


def frame_preview(frames: np.ndarray) -> np.ndarray:
    """A finished video's preview: its middle frame (of uint8 `[F, H, W, 3]`, the frame live previews
    show), at `preview_size` (area-averaged when shrunk)."""
    frame = torch.from_numpy(np.ascontiguousarray(frames[len(frames) // 2])).permute(2, 0, 1)[None].float()
    image = F.interpolate(frame, size=preview_size(*frame.shape[-2:]), mode="area")
    return image[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def pair_products(pixels: torch.Tensor) -> torch.Tensor:
    """Channels × pixels `[C, N]` → the products of every channel pair i ≤ j `[C(C+1)/2, N]`."""
    i, j = torch.triu_indices(len(pixels), len(pixels))
    return pixels[i] * pixels[j]


def fit_rows(latents: torch.Tensor, frames: np.ndarray, time_compression: int) -> tuple[torch.Tensor, ...]:
    """Fit rows from latents `[1, C, f, h, w]` and their decode, uint8 `[F, H, W, 3]`: each decoded frame
    mean-pooled to the latent grid (RGB in [-1, 1]) beside the latent frame it came from (the first alone,
    then `time_compression` each, as Wan's causal VAE) → (latent pixels [N, C], colours [N, 3])."""
    z = latents[0].to("cpu", torch.float32)
    c, _, h, w = z.shape
    pixels = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1
    colours = F.adaptive_avg_pool2d(pixels, (h, w))  # [F, 3, h, w]
    source = [(t + time_compression - 1) // time_compression for t in range(len(frames))]
    xs = z[:, source].permute(1, 2, 3, 0).reshape(-1, c)
    return xs, colours.permute(0, 2, 3, 1).reshape(-1, 3)


def solve(x: torch.Tensor, y: torch.Tensor, scale: int, *, quadratic: bool = False) -> LatentPreview:
    """The least-squares map (with a bias) from latent pixels `x` [N, C] to colours `y` [N, 3]."""
    x = x.double()
    features = [x, torch.ones(len(x), 1, dtype=x.dtype)]
    if quadratic:
        features.append(pair_products(x.T).T)
    solution = torch.linalg.lstsq(torch.cat(features, 1), y.double()).solution.T.float()  # [3, features]
    c = x.shape[1]
    return LatentPreview(
        solution[:, :c].contiguous(),
        solution[:, c].contiguous(),
        scale,
        solution[:, c + 1 :].contiguous() if quadratic else None,
    )


@torch.no_grad()
def fit_preview(
    decode: Callable[[torch.Tensor], np.ndarray],
    channels: int,
    scale: int,
    *,
    samples: int = FIT_SAMPLES,
    seed: int = 0,
) -> LatentPreview:
    """Fit a linear map for a VAE: `decode(latents [1, C, 1, h, w])` → uint8 frames `[1, H, W, 3]` (the
    family's decode bound to its VAE), `scale` its spatial compression. Smooth random latents (one latent
    frame: one decoded frame) are decoded, the frames mean-pooled to the latent grid, and RGB regressed on
    the latents (least squares, with a bias)."""
    generator = torch.Generator("cpu").manual_seed(seed)
    h, w = FIT_SIZE
    rows = []
    for i in range(samples):
        coarse = torch.randn(1, channels, FIT_COARSE, FIT_COARSE, generator=generator)
        z = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)
        z = (z * FIT_AMPLITUDES[i % len(FIT_AMPLITUDES)])[:, :, None]  # [1, C, 1, h, w]
        rows.append(fit_rows(z, decode(z), 1))
    return solve(torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows]), scale)


_FITTED: dict[tuple, LatentPreview] = {}  # (the VAE's weights' digest, channels, scale) → its fitted map


def vae_preview(vae: torch.nn.Module, decode: Callable, channels: int, scale: int) -> LatentPreview:
    """`fit_preview` of `decode(vae, latents)`, fitted once per process for the same weights: the fit decodes
    `FIT_SAMPLES` images (seconds on a CPU), and a process that loads one model again (the tests, their
    reused ranks) would pay it at every load."""
    key = (_digest(vae), channels, scale)
    if key not in _FITTED:
        _FITTED[key] = fit_preview(partial(decode, vae), channels, scale)
    return _FITTED[key]


def _digest(module: torch.nn.Module) -> str:
    """A digest of the module's type, weights and their devices (a fit on another device may round apart)."""
    digest = hashlib.sha256(type(module).__qualname__.encode())
    for name, tensor in module.state_dict().items():
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)} {tensor.device}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_preview(vae_folder: Path, preview: LatentPreview) -> None:
    """Ship `preview` with a VAE: `vae_folder`/latent_preview.json (what `read_preview` loads)."""
    maps = {"weight": preview.weight, "bias": preview.bias, "quadratic": preview.quadratic}
    data = {name: None if value is None else value.tolist() for name, value in maps.items()}
    (vae_folder / MAP_FILE).write_text(json.dumps(data) + "\n")


def read_preview(folder: Path | None, scale: int) -> LatentPreview | None:
    """The map a pipeline folder's VAE ships (`vae/latent_preview.json`), else None."""
    path = None if folder is None else folder / "vae" / MAP_FILE
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    tensor = lambda name: None if data.get(name) is None else torch.tensor(data[name])  # noqa: E731
    return LatentPreview(tensor("weight"), tensor("bias"), scale, tensor("quadratic"))
