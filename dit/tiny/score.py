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


def generate_and_read(pipe, scenes: list[Scene], batch: int = 1, **request) -> list[Scored]:
    """One video per scene (its canonical prompt; `request` sets steps, guidance, seed, size…) on a
    one-rank pipeline, each read back (its live previews kept when the pipeline makes them). `batch` > 1
    runs that many scenes a batch (`Pipeline.generate_batch`: each video its solo run's, bit for bit; no step
    cache), each video's seconds then its batch's share."""
    from dit.batch import BatchJob
    from dit.pipeline import GenerationRequest

    out = []
    for at in range(0, len(scenes), batch):
        group, start = scenes[at : at + batch], time.perf_counter()
        previews = [{} for _ in group]
        jobs = [
            BatchJob(GenerationRequest(s.prompt, **request), on_preview=p.__setitem__)
            for s, p in zip(group, previews, strict=True)
        ]
        if batch == 1:
            videos = [pipe.generate(jobs[0].request, on_preview=jobs[0].on_preview)]
        else:
            videos = pipe.generate_batch(jobs)
        seconds, stats = (time.perf_counter() - start) / len(group), pipe.evaluations
        skipped = stats.skipped / (stats.evaluated + stats.skipped)
        for scene, frames, shown in zip(group, videos, previews, strict=True):
            if isinstance(frames, Exception):  # a batch hands back a job's failure
                raise frames
            out.append(Scored(scene, read(frames), seconds, frames, skipped, shown))
    return out


def rates(rows: list[Scored]) -> dict[str, float]:
    """Share of videos whose colour / shape / direction / all three match their prompt."""
    hits = [r.reading.matches(r.scene) for r in rows]
    n = max(len(hits), 1)
    out = {k: sum(h[k] for h in hits) / n for k in ("color", "shape", "direction")}
    out["all"] = sum(all(h.values()) for h in hits) / n
    return out
