"""Denoising checkpoints (`dit.denoise_state`): what saving one costs against a denoising step.

    python bench/checkpoint.py         # the trained tiny model at its defaults, and a Wan2.1-14B-shaped state

The worker's leader pays `capture` inside the step (a copy of the latents and the sampler's state); the file
is written by another thread (`save_file`: torch.save, then a rename), beside the step. Rows: the tiny model's
step (a denoise over its steps, prompt encoding included, divided by the steps), capture and write of its
UniPC state after a generation; the same for a UniPC state of Wan2.1-14B's 480p latent (16 × 21 × 60 × 104)
after 3 steps, on this machine's CPU (on a GPU, capture adds the copy to the host). Times: the median of
--iters after a warm-up. `auto` (the server's default) saves whenever the steps since the last save took 100×
what a save costs (capture + write): the interval and the steps it spans at the step time given. Then the
whole cost on the tiny model, where the writing thread shares this machine's cores with the steps: a denoise
with checkpoints every step, every 5 steps and auto (handed to the server's `CheckpointWriter`, waited for
at the end) against one without, runs interleaved, the median of --runs each.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least
from bench.entry import run_main  # noqa: E402
from bench.preview import WAN14B_LATENT, median_s
from dit.denoise_state import Checkpointing, capture, save_file
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.sampling import make_scheduler
from server.writers import CheckpointWriter

# Wan2.1-14B 480p/81 frames, s/step on 8 H100s without CFG: bench/gpu.py's modelled figure (bench/RESULTS.md)
WAN14B_STEP_S = 0.37


def state_mb(state) -> float:
    tensors = [state.latents, state.generator] + [
        t for v in state.scheduler.values() for t in (v if isinstance(v, list) else [v]) if torch.is_tensor(t)
    ]
    return sum(t.nbytes for t in tensors) / 2**20


def costs(scheduler, latents, folder: str, iters: int) -> tuple[float, float, float]:
    """(capture s, write s, MB) of `scheduler`'s state with `latents`."""
    take = lambda: capture(3, latents, scheduler, torch.Generator(), None)  # noqa: E731
    state = take()
    path = str(Path(folder) / "bench.pt")
    write = median_s(lambda: save_file(path, state, {"bench": 1}), iters)
    return median_s(take, iters), write, state_mb(state)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=at_least(1), default=20)
    p.add_argument("--runs", type=at_least(1), default=9)
    args = p.parse_args()

    pipe = load_pipeline(PipelineConfig(model="tiny", device="cpu"))
    req = pipe.validate(GenerationRequest(prompt="a red ball moving right"))
    step_s = median_s(lambda: pipe.denoise(req), args.iters) / req.num_inference_steps
    latents = pipe.denoise(req)
    scheduler = make_scheduler("unipc")
    scheduler.set_timesteps(50)
    big = torch.randn(WAN14B_LATENT)
    for _ in range(3):
        big = scheduler.step(torch.randn_like(big), big)
    with tempfile.TemporaryDirectory() as folder:
        tiny = costs(pipe.scheduler, latents, folder, args.iters)
        wan = costs(scheduler, big, folder, args.iters)
        walls = job_walls(pipe, req, folder, (None, 1, 5, 0), args.runs)

    threads = torch.get_num_threads()
    print(f"Checkpoint cost (CPU, torch threads: {threads}); auto: a save per 100× its cost")
    head = ("MB", 6), ("capture ms", 11), ("write ms", 9), ("auto: s", 8), ("step s", 7), ("steps", 6)
    print(f"  {'state':<34} " + " ".join(f"{name:>{w}}" for name, w in head))
    for name, (cap, write, mb), step in (
        (f"tiny, {req.height}x{req.width}x{req.num_frames}, measured step", tiny, step_s),
        (f"Wan2.1-14B {WAN14B_LATENT[1:]}, 8 GPUs", wan, WAN14B_STEP_S),
    ):
        interval = (cap + write) * 100
        steps = math.ceil(interval / step)
        cells = f"{mb:>6.2f} {cap * 1e3:>11.2f} {write * 1e3:>9.2f} {interval:>8.2f} {step:>7.3f} {steps:>6}"
        print(f"  {name:<34} {cells}")
    print(f"\nTiny denoise, {req.num_inference_steps} steps, with the writing thread (median of {args.runs})")
    print(f"  {'checkpoints':<12} {'saves':>6} {'s':>7} {'vs off':>8}")
    for n, (wall, saves) in walls.items():
        name = "off" if n is None else "auto" if n == 0 else f"every {n}"
        print(f"  {name:<12} {saves:>6.1f} {wall:>7.3f} {wall / walls[None][0] - 1:>+8.2%}")


def job_walls(pipe, req, folder: str, cadences, runs: int) -> dict:
    """{every: (median seconds, mean saves) of a denoise with checkpoints every that many steps (0: auto,
    None: none)}, interleaved; one writer throughout, as a worker keeps one, so auto knows the last cost."""
    writer = CheckpointWriter(folder)

    def run(every: int | None) -> tuple[float, int]:
        saves = []
        hook = None
        if every is not None:
            save = lambda s: saves.append(writer.submit("bench", s.step, (s, {"bench": 1})))  # noqa: E731
            hook = Checkpointing(every, save, write_cost=lambda: writer.write_s)
        t0 = time.perf_counter()
        pipe.denoise(req, checkpoints=hook)
        writer.flush(60)
        return time.perf_counter() - t0, len(saves)

    times: dict = {n: [] for n in cadences}
    for n in times:
        run(n)  # warm-up
    for _ in range(runs):
        for n in times:
            times[n].append(run(n))
    return {
        n: (statistics.median(t for t, _ in r), statistics.mean(k for _, k in r)) for n, r in times.items()
    }


if __name__ == "__main__":
    run_main(main)
