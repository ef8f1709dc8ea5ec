"""Batches of compatible jobs (dit/batch.py): jobs per minute when N jobs share every forward, N = 1, 2, 4.

    python bench/batch.py                                   # tiny-random, CPU, 1 and 2 ranks (gloo, Ulysses)
    python bench/batch.py --model wan2.1-1.3b --device cuda --dtype bfloat16 --ranks 1 \\
        --request height=480 --request width=832 --request num_frames=33     # a GPU (random weights)

Each rank count starts its ranks once; for each N a warm-up batch (generated whole), then --iters turns of
--jobs jobs run N at a time through `Pipeline.generate_batch` (text encoding, denoising and each job's
decode: what a job costs a worker); jobs per minute from the median turn. `rel` is the largest difference of
a batch's latents from the same jobs run alone (max |batch − solo| / max |solo|, over the first N jobs),
measured once per N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least, max_rel  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.batch import BatchJob, denoise_batch  # noqa: E402
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from dit.preflight import check_settings  # noqa: E402
from dit.shape import request_limits  # noqa: E402
from parallel import init_parallel  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402

PROMPTS = ("a red circle moving right", "a blue square", "green waves at sea", "a yellow star at night")


def requests_for(count: int, request: dict) -> list[GenerationRequest]:
    """`count` different jobs: their own prompts, seeds and guidance scales."""
    return [
        GenerationRequest(**{"guidance_scale": 4.0 + j, **request}, prompt=PROMPTS[j % 4], seed=j)
        for j in range(count)
    ]


def _rank(model: str, config: dict, request: dict, sizes: list[int], jobs: int, iters: int, out: str) -> None:
    mesh = init_parallel(backend="gloo" if config.get("device", "cpu") == "cpu" else None)
    pipe = load_pipeline(PipelineConfig(**{"preview_every": 0, **config, "model": model}), mesh)
    reqs = requests_for(jobs, request)
    solo = [pipe.denoise(req) for req in reqs[: max(sizes)]]
    rows = []
    for n in sizes:
        got = denoise_batch(pipe, [BatchJob(req) for req in reqs[:n]])
        pipe.generate_batch([BatchJob(req) for req in reqs[:n]])  # the warm-up, decode included
        rel = max(max_rel(g, s) for g, s in zip(got, solo, strict=False))
        turns = []
        for _ in range(iters):
            start = time.perf_counter()
            for first in range(0, jobs, n):
                pipe.generate_batch([BatchJob(req) for req in reqs[first : first + n]])
            turns.append(time.perf_counter() - start)
        seconds = statistics.median(turns)
        rows.append({"ranks": mesh.world_size, "batch": n, "jobs_per_min": 60 * jobs / seconds, "rel": rel})
    if mesh.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[1, 2])
    p.add_argument("--sizes", type=at_least(1), nargs="+", default=[1, 2, 4], help="jobs per batch")
    p.add_argument("--jobs", type=at_least(1), default=4, help="jobs per turn (a multiple of every size)")
    p.add_argument("--iters", type=at_least(1), default=3)
    p.add_argument("--request", action="append", default=[], help="KEY=VALUE of GenerationRequest (JSON)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if any(args.jobs % n for n in args.sizes):
        p.error(f"--jobs {args.jobs} must be a multiple of every size {args.sizes}")
    try:  # before any rank starts: a traceback through the spawn, a torch error file left in /tmp
        request_limits(args.model)
        checked = PipelineConfig(model=args.model, device=args.device, dtype=args.dtype)
        check_settings(checked, max(args.ranks))
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    request = dict(num_frames=9, height=64, width=64, num_inference_steps=4)
    for pair in args.request:
        key, value = pair.split("=", 1)
        request[key] = json.loads(value)
    settings = {"device": args.device, "dtype": args.dtype}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        for n in args.ranks:
            spawn_local(_rank, n, args.model, settings, request, args.sizes, args.jobs, args.iters, out)
            with open(out) as f:
                rows += json.load(f)
    if args.json:
        print(json.dumps({"model": args.model, "request": request, "rows": rows}))
    else:
        print(f"{args.model}, {request}, {args.device}, {args.dtype}")
        print("| ranks | jobs per batch | jobs per minute | vs batch 1 | rel vs solo |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            base = next(b for b in rows if b["ranks"] == r["ranks"] and b["batch"] == args.sizes[0])
            speedup = r["jobs_per_min"] / base["jobs_per_min"]
            print(
                f"| {r['ranks']} | {r['batch']} | {r['jobs_per_min']:.1f} | {speedup:.2f}× | {r['rel']:.1e} |"
            )
    return rows


if __name__ == "__main__":
    run_main(main)
