"""The GPU kit's batch section: Wan2.1-1.3B jobs per minute when 1, 2 or 4 jobs share every transformer
forward (dit.batch), at 480p with 33 and 81 frames: where batching pays on a GPU and where a forward is
already big enough. The DiT alone: each job's text encoding and decode cost the same batched or not (the
`vae` and `text` sections time them). Each batched job's latents are checked against its solo run's."""

from __future__ import annotations

from functools import partial

from bench.batch import requests_for
from bench.common import max_rel
from bench.gpu_kit import Kit, Report, drawn_on_device

SIZES = (1, 2, 4)
JOBS = 4  # per timed turn: one turn runs them all, SIZE at a time


def batch_jobs(kit: Kit, report: Report) -> None:
    from dit.batch import BatchJob, denoise_batch
    from dit.pipeline import PipelineConfig, load_pipeline

    model, dtype = kit.pick(("wan2.1-1.3b", "bfloat16"), ("tiny-random", "float32"))
    config = PipelineConfig(model=model, device=kit.device.type, dtype=dtype, preview_every=0)
    with drawn_on_device():
        pipe = load_pipeline(config)
    steps = 2
    rows, worst = [], 0.0
    for frames in kit.pick((33, 81), (5, 9)):
        size = dict(height=kit.pick(480, 32), width=kit.pick(832, 48), num_frames=frames)
        reqs = requests_for(JOBS, {**size, "num_inference_steps": steps})
        warm = requests_for(max(SIZES), {**size, "num_inference_steps": 1})
        solo, base = None, None
        for n in SIZES:
            denoise_batch(pipe, [BatchJob(req) for req in warm[:n]])  # first calls of this shape
            sec, got, _ = kit.time(partial(_turn, pipe, reqs, n), warmup=0, iters=1)
            per_min = 60 * JOBS / sec
            solo, base = solo or got, base or per_min
            rel = max(max_rel(g, s) for g, s in zip(got, solo, strict=True))
            worst = max(worst, rel)
            rows.append([frames, n, f"{per_min:.2f}", f"{per_min / base:.2f}×", f"{rel:.1e}"])
        kit.free()
    # the bar, in bf16 too: the layers that round a batch differently on the CPU run per sample
    # (dit.rowwise); whether the GPU's attention and norms keep a sample's numbers in a batch, this tells
    report.check("largest |batch − solo| / |solo| of a job's latents", worst, 1e-6)
    report.table(
        f"{config.model} {config.dtype}, {size['height']}×{size['width']}, {steps} guided steps, DiT only",
        ["frames", "jobs per batch", "jobs per minute", "vs 1", "rel vs solo"],
        rows,
    )
    del pipe
    kit.free()


def _turn(pipe, reqs: list, n: int) -> list:
    """Every job of `reqs`, `n` at a time: each job's final latents."""
    from dit.batch import BatchJob, denoise_batch

    return [
        out
        for at in range(0, len(reqs), n)
        for out in denoise_batch(pipe, [BatchJob(r) for r in reqs[at : at + n]])
    ]
