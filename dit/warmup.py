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

log = logging.getLogger("ithaca.warmup")
STEPS = 2


def warm_up(pipe, sizes, request_type) -> list[dict]:
    """Generate once at each (height, width, frames) of `sizes` with `pipe`; `request_type`: the pipeline
    module's GenerationRequest. [{"size": "HxWxF", "seconds": s}] in order, each also logged."""
    done = []
    for height, width, frames in sizes:
        limits = pipe.limits
        steps = min(max(STEPS, limits.min_steps), limits.max_steps)
        request = request_type("warm-up", num_frames=frames, height=height, width=width,
                               num_inference_steps=steps)  # fmt: skip
        start = time.perf_counter()
        pipe.generate(request)
        seconds = round(time.perf_counter() - start, 3)
        size = f"{height}x{width}x{frames}"
        log.info("warm-up %s: %.2f s", size, seconds)
        done.append(dict(size=size, seconds=seconds))
    return done
