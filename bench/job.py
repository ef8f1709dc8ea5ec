"""Where a job's time goes: seconds of the text encoding, the denoising, the VAE decode and writing the MP4,
measured as the server measures them (server.phases.PhaseClock on the replica leader, fed by the pipeline's
phase callback), for the tiny models at 1, 2 and 4 CPU ranks (gloo, Ulysses over every rank).

    python bench/job.py [--models tiny tiny-random] [--ranks 1 2 4] [--iters 3] [--json]
    python bench/job.py --config comm=fp8 --request num_inference_steps=4    # PipelineConfig / request fields
    python bench/job.py --vary parallel_decode=false --vary cache=fbcache    # rows with one field changed
    python bench/job.py --models tiny --queued 8 --ranks 1                   # and jobs per minute (below)

Each row is the job of median total among --iters jobs after one warm-up job, with the model's default
request unless --request changes it; `total` is the wall time from the pipeline call to the written MP4. The
MP4 is encoded while the VAE decodes, as the server does (`write` is the time after the last frame);
--write-after writes it after the decode instead, the way it was before (compare the two).
--config and --request take any field of `dit.pipeline.PipelineConfig` and `GenerationRequest` (values read
as JSON, else as text), so options the pipeline gains are benchmarked without changes here. Each --vary
KEY=VALUE (a field of either) adds the same rows with that one field changed, beside the baseline's.

The throughput rows (--queued N, 0: none): the server's own worker loop (`server.worker`: one rank started as
the served group's are, its real writers and SQLite store) runs N queued jobs after a warm-up job, once
waiting for each MP4 to be closed before the next claim (as it used to) and once handing it off, the two in
turns --iters times; jobs per minute from the first claim to the last completion, the median of the turns.
--max-batch N... adds rows whose worker runs up to N compatible queued jobs as one batch (serve's flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from dit.request import check_numbers  # noqa: E402
from dit.shape import request_limits  # noqa: E402
from dit.video import Mp4Writer, write_mp4  # noqa: E402
from parallel import init_parallel  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402
from server.config import ServeConfig, serve_pipeline  # noqa: E402
from server.phases import PhaseClock  # noqa: E402
from server.store import TIMED_PHASES  # noqa: E402
from server.worker import Worker, _start  # noqa: E402
from server.writers import VideoCloser  # noqa: E402

PROMPT = "a red circle moving right"
COLUMNS = dict(zip(TIMED_PHASES, ("encode", "denoise", "decode", "write"), strict=True))
# the throughput rows: (waits for each MP4?, --max-batch); batched rows join with --max-batch
WORKERS = {"waits for the file": (True, 1), "hands it off": (False, 1)}


def _rank(
    model: str, variants: list[tuple[str, dict, dict]], iters: int, out: str, after: bool = False
) -> None:
    """One rank, every variant in turn (one process start for all): a warm-up job, then `iters` timed ones;
    the leader writes each variant's median job to `out`."""
    mesh = init_parallel(backend="gloo")
    rows = []
    for name, config, request in variants:
        # preview_every 0 unless asked: no job here takes previews, so no VAE decodes to fit their colour map
        config = {"device": "cpu", "preview_every": 0, **config, "model": model}
        pipe = load_pipeline(PipelineConfig(**config), mesh)
        req = pipe.validate(GenerationRequest(**{"prompt": PROMPT, **request}))
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(1 + iters):
                clock, start = PhaseClock(), time.perf_counter()
                path = os.path.join(tmp, "job.mp4")
                streamed = mesh.is_replica_leader and not after  # encoded while the VAE decodes, as served
                with Mp4Writer(path, req.height, req.width, req.fps) if streamed else nullcontext() as writer:
                    frames = pipe.generate(
                        req, None, clock.enter, on_frames=writer.write if streamed else None
                    )
                    clock.enter("writing")  # streamed: the time after the last frame
                if mesh.is_replica_leader and after:
                    write_mp4(frames, path, req.fps)
                clock.enter(None)
                runs.append(clock.seconds | {"total": time.perf_counter() - start})
        row = sorted(runs[1:], key=lambda r: r["total"])[iters // 2]  # its parts add up, as medians' need not
        rows.append({"model": model, "ranks": mesh.world_size, **row, "request": dataclasses.asdict(req)})
        rows[-1]["variant"] = name
    if mesh.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def run(
    models: list[str],
    ranks: list[int],
    iters: int,
    config: dict,
    request: dict,
    variants=(("", {}, {}),),
    after: bool = False,
) -> list[dict]:
    """Rows for every model × variant × rank count; a variant is (name, config fields, request fields) laid
    over `config` and `request`."""
    rows = []
    laid = [
        (name, config | vary_config, request | vary_request) for name, vary_config, vary_request in variants
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        for model in models:
            by_ranks = []
            for n in ranks:
                spawn_local(_rank, n, model, laid, iters, out, after)
                with open(out) as f:
                    by_ranks.append(json.load(f))
            rows += [row for at_variant in zip(*by_ranks, strict=True) for row in at_variant]
    return rows


class _WaitingCloser(VideoCloser):
    """The worker as it was: each job's MP4 closed and the job completed before the loop's next claim."""

    def submit(self, job_id: str, close) -> None:
        close()


def _throughput(
    model: str, config: dict, request: dict, queued: int, iters: int, out: str, batches: list[int]
) -> None:
    """One rank: the worker loop over `queued` jobs a turn (the module's doc says how); the rows to `out`."""
    workers = WORKERS | {f"hands it off, --max-batch {n}": (False, n) for n in batches if n > 1}
    rates = {name: [] for name in workers}
    with tempfile.TemporaryDirectory() as tmp:

        def serve(name: str, max_batch: int = 1) -> ServeConfig:
            folder = os.path.join(tmp, name)
            pipeline = serve_pipeline(**config)
            return ServeConfig(data_dir=folder, preset=model, pipeline=pipeline, max_batch=max_batch)

        started = _start(serve("warm-up"), "bench")  # as a served group's rank starts
        _jobs_per_minute(started, request, 1)
        for turn in range(iters):
            for name, (waits, max_batch) in workers.items():
                served = serve(f"{turn}-{len(rates[name])}-{max_batch}-{waits}", max_batch)
                worker = Worker(served, "bench", started.mesh, started.pipe, started.module)
                if waits:
                    worker.ending.closer = _WaitingCloser()
                rates[name].append(_jobs_per_minute(worker, request, queued))
    req = dataclasses.asdict(started.pipe.validate(GenerationRequest(**{"prompt": PROMPT, **request})))
    rows = [{"model": model, "queued": queued, "worker": name, "request": req, "jobs_per_min": median}
            for name, median in ((name, sorted(r)[iters // 2]) for name, r in rates.items())]  # fmt: skip
    with open(out, "w") as f:
        json.dump(rows, f)


def _jobs_per_minute(worker: Worker, request: dict, queued: int) -> float:
    """`queued` jobs through the worker's loop, each completed with its MP4 in place."""
    store = worker.store.raw
    ids = [store.create({"prompt": PROMPT, **request})[0].id for _ in range(queued)]
    loop = threading.Thread(target=worker.run, daemon=True)
    loop.start()
    deadline = time.monotonic() + 600
    while not all(store.get(job_id).terminal for job_id in ids):
        assert time.monotonic() < deadline, "the queued jobs did not end within 600 s"
        time.sleep(0.02)
    worker.stopping.set()
    loop.join(60)
    jobs = [store.get(job_id) for job_id in ids]
    for job in jobs:
        assert job.status == "completed", job
        assert os.path.exists(os.path.join(worker.config.videos_dir, job.video)), job
    return 60 * queued / (max(j.finished_at for j in jobs) - min(j.started_at for j in jobs))


def _fields(classes, pairs: list[str], flag: str, parser: argparse.ArgumentParser, reserved=()) -> list[dict]:
    """KEY=VALUE pairs → one {field: value} per dataclass of `classes`, each KEY going to the first class
    that has the field; a VALUE that is not JSON stays text."""
    names = [[f.name for f in dataclasses.fields(cls) if f.name not in reserved] for cls in classes]
    fields = [{} for _ in classes]
    for pair in pairs:
        key, sep, value = pair.partition("=")
        owner = next((i for i, n in enumerate(names) if key in n), None)
        if not sep or owner is None:
            known = ", ".join(sorted({k for n in names for k in n}))
            parser.error(f"{flag} {pair!r}: expected KEY=VALUE with KEY one of {known}")
        try:
            fields[owner][key] = json.loads(value)
        except ValueError:
            fields[owner][key] = value
    return fields


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "tiny-random"])
    p.add_argument("--ranks", type=at_least(1), nargs="+", default=[1, 2, 4])
    p.add_argument("--iters", type=at_least(1), default=3, help="timed jobs per row, after one warm-up job")
    p.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="a PipelineConfig field"
    )
    p.add_argument("--request", action="append", default=[], metavar="KEY=VALUE", help="a request field")
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also the rows with this PipelineConfig or request field changed",
    )
    p.add_argument(
        "--write-after",
        action="store_true",
        help="write the MP4 after the decode (the old way) instead of encoding it while the VAE decodes",
    )
    p.add_argument(
        "--queued",
        type=at_least(0),
        default=8,
        help="jobs per throughput row (0: none), the worker loop on 1 rank",
    )
    p.add_argument(
        "--max-batch", type=at_least(1), nargs="+", default=[], metavar="N",
        help="also throughput rows whose worker runs up to N compatible queued jobs as one batch",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    (config,) = _fields([PipelineConfig], args.config, "--config", p, reserved=("model",))
    (request,) = _fields([GenerationRequest], args.request, "--request", p)
    classes = [PipelineConfig, GenerationRequest]
    variants = [("", {}, {})] + [
        (pair, *_fields(classes, [pair], "--vary", p, reserved=("model",))) for pair in args.vary
    ]
    for model in args.models:  # each job's request against the model's limits, before any model loads
        try:
            limits = request_limits(model)
        except FileNotFoundError as e:  # neither a model name nor a folder: its traceback
            p.error(f"--models: {e}")
        for name, _, changed in variants:
            try:
                check_numbers(GenerationRequest(**{"prompt": PROMPT, **request, **changed}), limits)
            except ValueError as e:
                p.error(f"{model}{', --vary ' + name if name else ''}: {e}")
    rows = run(args.models, args.ranks, args.iters, config, request, variants, args.write_after)
    throughput = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models if args.queued else ():
            out = os.path.join(tmp, "throughput.json")
            spawn_local(_throughput, 1, model, config, request, args.queued, args.iters, out, args.max_batch)
            with open(out) as f:
                throughput += json.load(f)
    if args.json:
        print(json.dumps({"config": config, "iters": args.iters, "torch": torch.__version__, "rows": rows,
                          "throughput": throughput}))  # fmt: skip
        return
    where = f"CPU ({os.cpu_count()} cores), gloo, torch {torch.__version__}"
    print(
        f"{where}, the median of {args.iters} timed jobs after a warm-up"
        + "".join(f", {k}={v}" for k, v in config.items())
    )
    print(
        "| model | job | changed | ranks | " + " | ".join(f"{c} s" for c in COLUMNS.values()) + " | total s |"
    )
    print("| --- | --- | --- | ---: |" + " ---: |" * (len(COLUMNS) + 1))
    for r in rows:
        job = _job(r["request"])
        cells = [f"{r[key]:.3f}" for key in (*COLUMNS, "total")]
        changed = r["variant"] or "–"
        print(f"| {r['model']} | {job} | {changed} | {r['ranks']} | " + " | ".join(cells) + " |")
    if throughput:
        print(f"\nthe worker loop on 1 rank, {args.queued} queued jobs, the median of {args.iters} turns")
        print("| model | job | worker | jobs per minute |\n| --- | --- | --- | ---: |")
    for r in throughput:
        print(f"| {r['model']} | {_job(r['request'])} | {r['worker']} | {r['jobs_per_min']:.1f} |")


def _job(req: dict) -> str:
    return f"{req['num_frames']}×{req['height']}×{req['width']}, {req['num_inference_steps']} steps"  # HxW


if __name__ == "__main__":
    run_main(main)
