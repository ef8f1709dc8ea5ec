"""The tiny model's latent space, written down rather than learned: what each 8×8-pixel cell of each group of
four frames holds (Wan's VAE compression: ×4 in time, ×8 in space; the first latent frame is frame 0 alone,
as in Wan's causal VAE). Training the VAE's decoder to render these latents, and its encoder to produce
them, is plain regression: far quicker on a CPU than an autoencoder finding its own code.

Channels (16, Wan's latent width): for each of the 4 frames, the cell's lit share and its first moments along
x and y (where in the cell the object sits), 12; the clip's colour (RGB of the lit pixels), 3; the clip's
fill, 1: how much of its bounding box the object covers (a square 1, a circle π/4, a triangle 1/2). Shape
lives in the cells' shares too, but there a square and a circle differ only in a few corner cells by a
few %: the DiT's small errors wash that out (every generated square read as a circle), and a clip-wide
channel, like the colour, survives them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CELL, GROUP, CHANNELS = 8, 4, 16


def describe(video: torch.Tensor) -> torch.Tensor:
    """Clips `[B, 3, 1 + 4k, H, W]` in [-1, 1] → latents `[B, 16, 1 + k, H/8, W/8]`."""
    B, _, T, H, W = video.shape
    rgb = (video + 1) / 2
    lit = rgb.amax(1)  # [B, T, H, W]: a pixel's brightest channel, 0 on the black background
    # frame 0 alone makes the first group: repeat it, as if it were still for four frames
    frames = torch.cat([lit[:, :1].expand(B, GROUP, H, W), lit[:, 1:]], 1)  # [B, 4(1 + k), H, W]
    offset = (torch.arange(CELL, dtype=video.dtype, device=video.device) + 0.5) / CELL * 2 - 1
    dx = offset.repeat(W // CELL).view(1, 1, 1, W)
    dy = offset.repeat(H // CELL).view(1, 1, H, 1)
    pool = lambda x: F.avg_pool2d(x.flatten(0, 1), CELL).view(B, -1, GROUP, H // CELL, W // CELL)  # noqa: E731
    # moments × 4: the same scale as the shares, so no channel is lost in the decoder's first conv
    share, mx, my = pool(frames), 4 * pool(frames * dx), 4 * pool(frames * dy)  # [B, 1 + k, 4, h, w] each
    per_frame = torch.cat([share, mx, my], 2).transpose(1, 2)  # [B, 12, 1 + k, h, w]
    weight = lit.sum((1, 2, 3)).clamp_min(1e-6)
    color = (rgb * lit[:, None]).sum((2, 3, 4)) / weight[:, None] * 2 - 1  # [B, 3] in [-1, 1]
    full = 4 * (fill(lit)[:, None] - 0.75)  # [B, 1]: centred and spread like the shares
    # the clip-wide channels, the same in every cell of every latent frame
    clip_wide = torch.cat([color, full], 1)[:, :, None, None, None].expand(-1, -1, *per_frame.shape[2:])
    return torch.cat([per_frame, clip_wide], 1)


def fill(lit: torch.Tensor) -> torch.Tensor:
    """Brightness `[B, T, H, W]` → the object's area over its bounding box's, mean over frames `[B]`. The
    area counts partly covered pixels by their share; the box spans the pixels over half the frame's peak
    (where an anti-aliased edge crosses the shape's true border)."""
    norm = lit / lit.amax((2, 3), keepdim=True).clamp_min(1e-6)
    mask = norm > 0.5
    box = mask.any(3).sum(2) * mask.any(2).sum(2)  # [B, T]: rows × columns
    return (norm.sum((2, 3)) / box.clamp_min(1)).mean(1)
