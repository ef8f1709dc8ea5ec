"""Where a job's time goes: seconds of the text encoding, the denoising, the VAE decode and writing the MP4,
measured as the server measures them (server.phases.PhaseClock on the replica leader, fed by the pipeline's
phase callback), for the tiny models at 1, 2 and 4 CPU ranks (gloo, Ulysses over every rank).

    python bench/job.py [--models tiny tiny-random] [--ranks 1 2 4] [--iters 3] [--json]
    python bench/job.py --config comm=fp8 --request num_inference_steps=4    # PipelineConfig / request fields
    python bench/job.py --vary parallel_decode=false --vary cache=fbcache    # rows with one field changed

Each row is the job of median total among --iters jobs after one warm-up job, with the model's default
request unless --request changes it; `total` is the wall time from the pipeline call to the written MP4. The
MP4 is encoded while the VAE decodes, as the server does (`write` is the time after the last frame);
--write-after writes it after the decode instead, the way it was before (compare the two).
--config and --request take any field of `dit.pipeline.PipelineConfig` and `GenerationRequest` (values read
as JSON, else as text), so options the pipeline gains are benchmarked without changes here. Each --vary
KEY=VALUE (a field of either) adds the same rows with that one field changed, beside the baseline's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from dit.video import Mp4Writer, write_mp4  # noqa: E402
from parallel import init_parallel  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402
from server.phases import PhaseClock  # noqa: E402
from server.store import TIMED_PHASES  # noqa: E402

PROMPT = "a red circle moving right"
COLUMNS = dict(zip(TIMED_PHASES, ("encode", "denoise", "decode", "write"), strict=True))


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
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--iters", type=int, default=3, help="timed jobs per row, after one warm-up job")
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
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    (config,) = _fields([PipelineConfig], args.config, "--config", p, reserved=("model",))
    (request,) = _fields([GenerationRequest], args.request, "--request", p)
    classes = [PipelineConfig, GenerationRequest]
    variants = [("", {}, {})] + [
        (pair, *_fields(classes, [pair], "--vary", p, reserved=("model",))) for pair in args.vary
    ]
    rows = run(args.models, args.ranks, args.iters, config, request, variants, args.write_after)
    if args.json:
        print(json.dumps({"config": config, "iters": args.iters, "torch": torch.__version__, "rows": rows}))
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
        req = r["request"]
        job = f"{req['num_frames']}×{req['width']}×{req['height']}, {req['num_inference_steps']} steps"
        cells = [f"{r[key]:.3f}" for key in (*COLUMNS, "total")]
        changed = r["variant"] or "–"
        print(f"| {r['model']} | {job} | {changed} | {r['ranks']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
