"""`ithaca serve --warmup`: one short generation per video size before a worker group reports ready, so the
first real job of that size does not pay for what a size's first run does once (with --compile, Inductor's
graphs for it; on GPUs, the attention and convolution kernels chosen for its shapes).

Every rank of the replica runs the same warm-ups in the same order (each is a collective generation). Two
steps: the first and a later one take the same graphs, and guided when the model's defaults guide, so both
passes of a step exist (as many as a fixed, distilled, schedule allows).
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger("ithaca.warmup")
STEPS = 2


def warm_up(pipe, sizes, request_type) -> list[dict]:
    """Generate once at each (height, width, frames) of `sizes` with `pipe`; `request_type`: the pipeline
    module's GenerationRequest. [{"size": "HxWxF", "seconds": s}] in order, each also logged; a size given
    twice is warmed up once (a second run would only delay the ready)."""
    done = []
    for size in dict.fromkeys(sizes):
        start = time.perf_counter()
        pipe.generate(warmup_request(pipe.limits, size, request_type))
        seconds = round(time.perf_counter() - start, 3)
        name = "x".join(map(str, size))  # HxWxF
        log.info("warm-up %s: %.2f s", name, seconds)
        done.append(dict(size=name, seconds=seconds))
    return done


def warmup_request(limits, size: tuple[int, int, int], request_type):
    """The warm-up's request at (height, width, frames) under a model's `limits`: an image-to-video model's
    first frame a grey one of the video's size (its pixels change no shape the run compiles or tunes)."""
    height, width, frames = size
    steps = min(max(STEPS, limits.min_steps), limits.max_steps)
    image = np.full((height, width, 3), 128, np.uint8) if limits.image else None
    return request_type("warm-up", num_frames=frames, height=height, width=width, num_inference_steps=steps,
                        image=image)  # fmt: skip
