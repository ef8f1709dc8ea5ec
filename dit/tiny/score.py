"""Scores the tiny model against its language: generate each scene's canonical prompt, read the video with
`detect.read`, count what matches. The tests hold the model to this; `bench/quality.py` prints it per
option."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dit.tiny.detect import Reading, read
from dit.tiny.language import HELD_OUT, Scene


@dataclass(frozen=True)
class Scored:
    scene: Scene
    reading: Reading
    seconds: float  # denoise + decode
    frames: np.ndarray  # uint8 [F, H, W, 3]
    skipped: float = 0.0  # the share of transformer evaluations a step cache skipped
    previews: dict[int, np.ndarray] = field(default_factory=dict)  # the live previews, by step

    @property
    def held_out(self) -> bool:
        return self.scene.combo in HELD_OUT


def generate_and_read(pipe, scenes: list[Scene], **request) -> list[Scored]:
    """One video per scene (its canonical prompt; `request` sets steps, guidance, seed, size…) on a
    one-rank pipeline, each read back (its live previews kept when the pipeline makes them)."""
    from dit.pipeline import GenerationRequest

    out = []
    for scene in scenes:
        start, previews = time.perf_counter(), {}
        frames = pipe.generate(GenerationRequest(scene.prompt, **request), on_preview=previews.__setitem__)
        stats = pipe.evaluations
        skipped = stats.skipped / (stats.evaluated + stats.skipped)
        out.append(Scored(scene, read(frames), time.perf_counter() - start, frames, skipped, previews))
    return out


def rates(rows: list[Scored]) -> dict[str, float]:
    """Share of videos whose colour / shape / direction / all three match their prompt."""
    hits = [r.reading.matches(r.scene) for r in rows]
    n = max(len(hits), 1)
    out = {k: sum(h[k] for h in hits) / n for k in ("color", "shape", "direction")}
    out["all"] = sum(all(h.values()) for h in hits) / n
    return out
