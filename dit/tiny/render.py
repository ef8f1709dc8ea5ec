"""Draws a `Scene` as a clip: one shape of one colour on black, moving in a straight line at a steady speed,
anti-aliased (4×4 supersampling), every sample of it from the given generator."""

from __future__ import annotations

import math

import torch

from dit.tiny.language import COLORS, Scene

_STEP = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # image y grows downwards
_SUPER = 4


def _mask(shape: str, cx: torch.Tensor, cy: torch.Tensor, r: float, xs: torch.Tensor, ys: torch.Tensor):
    """Coverage of `shape` centred at (cx[f], cy[f]) with half-size r on the sample grid → [F, H, W] bool."""
    dx, dy = xs[None] - cx[:, None, None], ys[None] - cy[:, None, None]
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        side = r * 0.9  # the same area as the circle, roughly: neither looks bigger
        return (dx.abs() <= side) & (dy.abs() <= side)
    # an equilateral triangle pointing up, circumradius 1.2 r, centred on its centroid
    R = r * 1.2
    top, base = -R, R / 2
    half = (dy - top) / math.sqrt(3)  # half-width at height dy: 0 at the apex, widest at the base
    return (dy >= top) & (dy <= base) & (dx.abs() <= half)


def render(scene: Scene, frames: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """The clip as float32 `[3, frames, height, width]` in [-1, 1] (the VAE's range)."""
    g = lambda: torch.rand((), generator=generator).item()  # noqa: E731
    lo, hi = {"small": (0.10, 0.13), "big": (0.17, 0.20), None: (0.11, 0.19)}[scene.size]
    r = (lo + g() * (hi - lo)) * min(height, width)
    ux, uy = _STEP[scene.direction]
    extent = width if ux else height
    travel = (0.35 + 0.2 * g()) * extent  # the whole clip's path, start to end
    margin = r * 1.25
    along_start = margin + g() * max(extent - 2 * margin - travel, 0.0)
    across = (height if ux else width) - 2 * margin
    across_pos = margin + g() * max(across, 0.0)
    t = torch.linspace(0, 1, frames)
    along = along_start + t * travel
    if ux < 0 or uy < 0:
        along = extent - along
    cx, cy = (along, torch.full_like(t, across_pos)) if ux else (torch.full_like(t, across_pos), along)
    xs = (torch.arange(width * _SUPER) + 0.5) / _SUPER
    ys = (torch.arange(height * _SUPER) + 0.5) / _SUPER
    ys, xs = torch.meshgrid(ys, xs, indexing="ij")
    cover = _mask(scene.shape, cx, cy, r, xs, ys).float()
    cover = torch.nn.functional.avg_pool2d(cover[:, None], _SUPER)[:, 0]  # [F, H, W] in [0, 1]
    rgb = torch.tensor(COLORS[scene.color], dtype=torch.float32) / 255
    video = cover[None] * rgb[:, None, None, None]
    return video * 2 - 1
