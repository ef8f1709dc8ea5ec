"""Reads a generated video back into the tiny language's words, to score it against its prompt: the object's
pixels (brighter than half the frame's peak), their mean colour → the nearest colour word, their centroid's
path → the direction, and the object's width profile from top to bottom → the shape (a triangle widens
downwards; a square is as wide near its top and bottom as in its middle, a circle about 70 % as wide). The
profile survives the soft edges of a decoded video, where the share of the bounding box filled does not."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dit.tiny.language import COLORS, Scene

_MIN_PIXELS = 6  # fewer lit pixels than this in a frame: no object in it
_MIN_TRAVEL = 4.0  # pixels from first to last frame: less is standing still


@dataclass(frozen=True)
class Reading:
    color: str | None
    shape: str | None
    direction: str | None
    taper: float  # width near the top / width near the bottom (median over frames): a triangle's is small
    flat: float  # the narrower of those two widths / the width in the middle: a square's is near 1
    travel: tuple[float, float]  # centroid displacement (x, y) over the clip, in pixels

    def matches(self, scene: Scene) -> dict[str, bool]:
        return {
            "color": self.color == scene.color,
            "shape": self.shape == scene.shape,
            "direction": self.direction == scene.direction,
        }


def _shape(taper: float, flat: float) -> str:
    if taper < 0.7:
        return "triangle"
    return "square" if flat > 0.88 else "circle"


def _profile(mask: np.ndarray) -> tuple[float, float]:
    """(taper, flat) of one frame's mask from its rows' widths within the bounding box."""
    widths = mask.sum(1)
    widths = widths[widths > 0].astype(np.float32)
    h = len(widths)
    band = lambda lo, hi: widths[int(lo * h) : max(int(hi * h), int(lo * h) + 1)].mean()  # noqa: E731
    top, mid, bottom = band(0.1, 0.3), band(0.4, 0.6), band(0.7, 0.9)
    return top / bottom, min(top, bottom) / mid


def _direction(dx: float, dy: float) -> str | None:
    if max(abs(dx), abs(dy)) < _MIN_TRAVEL:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def read(frames: np.ndarray) -> Reading:
    """uint8 frames `[F, H, W, 3]` → what they show."""
    video = frames.astype(np.float32)
    peak = video.max(-1)  # [F, H, W]: brightest channel per pixel
    colors, centroids, profiles = [], [], []
    ys, xs = np.mgrid[: frames.shape[1], : frames.shape[2]]
    for f in range(len(frames)):
        top = peak[f].max()
        mask = peak[f] > top / 2
        if top < 60 or mask.sum() < _MIN_PIXELS:
            continue
        colors.append(video[f][mask].mean(0))
        centroids.append((xs[mask].mean(), ys[mask].mean()))
        profiles.append(_profile(mask))
    if len(centroids) < 2:
        return Reading(None, None, None, 0.0, 0.0, (0.0, 0.0))
    rgb = np.mean(colors, 0)
    palette = np.array(list(COLORS.values()), dtype=np.float32)
    color = list(COLORS)[int(np.argmin(((palette - rgb) ** 2).sum(1)))]
    # the path's slope by least squares over frames × frame count: steadier than last − first
    path = np.array(centroids)
    t = np.linspace(0, 1, len(path))
    dx, dy = (np.polyfit(t, path[:, k], 1)[0] for k in (0, 1))
    taper, flat = (float(v) for v in np.median(profiles, 0))
    return Reading(color, _shape(taper, flat), _direction(dx, dy), taper, flat, (float(dx), float(dy)))
