"""A fast first request (issue 28 §3): `ithaca serve` from its start to `/ready`, the first job's latency
against the last of N, then the same after a restart on the same --data-dir (inductor's compile cache kept
there).

    python bench/first_job.py [--model-path DIR] [--compile] [--jobs 10] [--flags "--warmup 64x64x17"]
                              [--request KEY=VALUE ...] [--json]

Default: the trained tiny model on the CPU, one rank, its default video; any local model folder with
--model-path (on a GPU box add `--flags "--device cuda --dtype bfloat16"`). A job's latency is the client's:
from its submit to the completed status polled every 50 ms, one job at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from bench.job import _fields  # noqa: E402
from dit.request import GenerationRequest  # noqa: E402
from testing.server_process import ServerProcess  # noqa: E402


def one_start(data_dir: str, flags: list[str], jobs: int, request: dict, timeout: float) -> dict:
    """Start the server, time it to /ready, run `jobs` jobs one after the other, stop it."""
    start = time.perf_counter()
    srv = ServerProcess(data_dir, *flags)
    try:
        srv.wait(timeout=timeout)
        ready = time.perf_counter() - start
        latencies = []
        for i in range(jobs):
            sent = time.perf_counter()
            job = srv.submit(prompt=f"a red fox running through snow {i}", **request)
            done = srv.wait_job(job["id"], timeout=timeout, done=("completed", "failed", "cancelled"))
            if done["status"] != "completed":
                raise RuntimeError(f"job {i}: {done['status']}: {done.get('error')}")
            latencies.append(time.perf_counter() - sent)
        warmup = srv.client.get("/ready").json().get("warmup")
    finally:
        srv.stop()
    return dict(ready_s=ready, first_s=latencies[0], last_s=latencies[-1], warmup=warmup)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", help="a local model folder (default: the trained tiny model)")
    p.add_argument("--compile", action="store_true", help="serve with --compile")
    p.add_argument("--jobs", type=at_least(1), default=10, help="jobs after each start (first vs last)")
    p.add_argument("--flags", default="", help="more `ithaca serve` flags, one string")
    p.add_argument("--request", nargs="*", default=[], metavar="KEY=VALUE", help="fields of every job")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for the start and for each job")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    flags = ["--model-path", args.model_path] if args.model_path else []
    flags += ["--compile"] * args.compile + shlex.split(args.flags)
    request = _fields([GenerationRequest], args.request, "--request", p, reserved=("prompt",))[0]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="ithaca-first-job-") as data_dir:
        for start in ("first start", "restart, same --data-dir"):
            try:
                rows[start] = one_start(data_dir, flags, args.jobs, request, args.timeout)
            except RuntimeError as e:  # `ithaca serve` refused a flag: its one line, not our traceback
                if not str(e).startswith("server exited with 2:"):
                    raise
                print(str(e).strip().splitlines()[-1], file=sys.stderr)
                return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    command = shlex.join(["ithaca", "serve", *flags])
    print(f"`{command}`, {args.jobs} jobs {request or '(model defaults)'} per start")
    print(f"| start | to /ready s | job 1 s | job {args.jobs} s | job 1 / job {args.jobs} | warm-up |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for start, r in rows.items():
        warm = ", ".join(f"{w['size']} {w['seconds']:.2f} s" for w in r["warmup"] or []) or "–"
        ratio = r["first_s"] / r["last_s"]
        seconds = [f"{r['ready_s']:.2f}", f"{r['first_s']:.3f}", f"{r['last_s']:.3f}", f"{ratio:.2f}"]
        print("| " + " | ".join([start, *seconds, warm]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
