"""Server overhead with the FAKE INSTANT PIPELINE (testing/fake_pipeline.py: no model work), real everything
else: uvicorn, the SQLite job store, a 2-rank gloo worker group, the real MP4 encoder.

    python bench/server_overhead.py [--jobs 100] [--poll-seconds 5] [--poll-threads 4] [--json]

- submit-to-complete: jobs submitted one at a time; from the job's created_at to its finished_at (server
  clocks), "overhead" subtracts the pipeline call and the MP4 write (`timings.total_s`): what the queue,
  the claim, the broadcast, the per-step and per-phase progress writes and the terminal write cost.
- status polls/s: `GET /jobs/{id}` from N client threads for a fixed time (the clients share the machine).

Targets (issue 4): overhead ≤ 20 ms per job, ≥ 500 polls/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from testing.server_process import FAKE, ServerProcess  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def submit_to_complete(srv: ServerProcess, jobs: int) -> dict:
    total, overhead, client_seen = [], [], []
    for i in range(jobs):
        start = time.perf_counter()
        job = srv.submit(prompt=f"bench {i}", num_inference_steps=2, num_frames=5, height=32, width=32)
        while (state := srv.client.get(f"/jobs/{job['id']}").json())["status"] in ("queued", "in_progress"):
            time.sleep(0.001)
        client_seen.append(time.perf_counter() - start)
        assert state["status"] == "completed", state
        t = state["timings"]
        total.append(state["finished_at"] - state["created_at"])
        overhead.append(total[-1] - t["total_s"])
    ms = lambda xs, q: 1000 * _pct(xs, q)  # noqa: E731
    return {
        "jobs": jobs,
        "overhead_ms_p50": ms(overhead, 50),
        "overhead_ms_p99": ms(overhead, 99),
        "server_total_ms_p50": ms(total, 50),
        "server_total_ms_p99": ms(total, 99),
        "client_seen_ms_p50": ms(client_seen, 50),
        "client_seen_ms_p99": ms(client_seen, 99),
    }


def polls_per_second(srv: ServerProcess, seconds: float, threads: int) -> dict:
    job_id = srv.submit(prompt="polled", num_inference_steps=1)["id"]
    srv.wait_job(job_id)
    counts, errors = [0] * threads, [0] * threads
    deadline = time.perf_counter() + seconds

    def poll(k: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            while time.perf_counter() < deadline:
                ok = client.get(f"/jobs/{job_id}").status_code == 200
                counts[k] += ok
                errors[k] += not ok

    start = time.perf_counter()
    workers = [threading.Thread(target=poll, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    return {"poll_threads": threads, "polls_per_s": sum(counts) / elapsed, "poll_errors": sum(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=at_least(1), default=100)
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--poll-threads", type=at_least(1), default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        srv = ServerProcess(data_dir, "--pipeline-module", FAKE, "--log-level", "warning")
        try:
            srv.wait()
            result = submit_to_complete(srv, args.jobs) | polls_per_second(
                srv, args.poll_seconds, args.poll_threads
            )
        finally:
            srv.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rows = [
        (
            "submit→complete overhead p50 / p99 (ms)",
            f"{result['overhead_ms_p50']:.1f} / {result['overhead_ms_p99']:.1f}",
            "≤ 20",
        ),
        (
            "server-side total p50 / p99 (ms, incl. encode)",
            f"{result['server_total_ms_p50']:.1f} / {result['server_total_ms_p99']:.1f}",
            "",
        ),
        (
            "client-seen total p50 / p99 (ms, 1 ms polling)",
            f"{result['client_seen_ms_p50']:.1f} / {result['client_seen_ms_p99']:.1f}",
            "",
        ),
        (
            f"status polls/s ({result['poll_threads']} client threads)",
            f"{result['polls_per_s']:.0f}",
            "≥ 500",
        ),
    ]
    print(f"| what ({result['jobs']} jobs, fake instant pipeline) | measured | target |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    run_main(main)
