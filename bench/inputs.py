"""What large request bodies cost the API process (`ithaca serve --no-workers`: the API alone, uvicorn, the
SQLite store; an image-to-video model's limits published as a worker would, so images are taken).

    python bench/inputs.py [--bodies 4] [--mb 27] [--rounds 20] [--side 6000] [--json]

- big bodies: `--rounds` bursts of N concurrent POSTs (curl) to /generate of a JSON body of `--mb` MB
  without an image (a long prompt), while one client polls /health: its p50/p99/max latency, the replies,
  the API's peak RSS growth.
- big image bodies: the same with an image in each (a noise PNG of 3/4 of `--mb`, as a data URL).
- big image: one `--side`×`--side` JPEG (noise: a camera photo's size) to /generate: the API's CPU
  seconds (user + system, from /proc) for the request, and the bytes it keeps on disk for the job.

Targets (issue 25): /health p99 ≤ 100 ms during 4 concurrent 27 MB bodies; ≤ 3 s of API CPU and ≤ 2× the
upload's bytes on disk for a 6000×6000 JPEG.
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.entry import run_main  # noqa: E402
from dit.pipeline import TINY_LIMITS  # noqa: E402
from server import limits  # noqa: E402
from server.store import JobStore  # noqa: E402
from testing.server_process import ServerProcess  # noqa: E402


def _publish_i2v(data_dir: str) -> None:
    described = limits.describe(dataclasses.replace(TINY_LIMITS, image=True))
    info = {"limits": described, "defaults": limits.defaults(described), "model": "tiny-random"}
    JobStore(os.path.join(data_dir, "jobs.db")).heartbeat(
        "bench/g/replica0", instance="bench", group_id="g", state="ready", info=info
    )


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _noise_png(megabytes: float) -> bytes:
    side = int((megabytes * 1e6 / 3) ** 0.5)  # noise does not compress: 3 bytes a pixel
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), np.uint8)).save(out, "PNG")
    return out.getvalue()


def _burst(srv: ServerProcess, bodies: int, path: str) -> list[int]:
    curls = [
        subprocess.Popen(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "content-type: application/json"]
            + ["-H", "Expect:"]  # send the body at once, not after a 100 Continue (the worst case)
            + ["--data-binary", f"@{path}", f"{srv.url}/generate"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(bodies)
    ]
    return [int(p.communicate()[0] or 0) for p in curls]


def big_bodies(
    srv: ServerProcess, bodies: int, mb: float, data_dir: str, image: bool = False, rounds: int = 1
) -> dict:
    """The bodies go from `curl` processes, so this process's GIL times only /health. `image`: each body
    carries an image of `mb` × 3/4 MB as a data URL (taken: 202), not a long prompt."""
    path = os.path.join(data_dir, "body.json")
    with open(path, "wb") as f:
        if image:
            url = b"data:image/png;base64," + base64.b64encode(_noise_png(mb * 0.75))
            f.write(b'{"prompt": "a photo", "image": "' + url + b'"}')
        else:
            f.write(b'{"prompt": "' + b"x" * int(mb * 1e6) + b'"}')
    base_rss, peak = _rss_mb(srv.proc.pid), [0.0]
    done, latencies = threading.Event(), []

    def watch() -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            while not done.is_set():
                start = time.perf_counter()
                c.get("/health")
                latencies.append(time.perf_counter() - start)
                peak[0] = max(peak[0], _rss_mb(srv.proc.pid))
                time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start, statuses = time.perf_counter(), []
    for _ in range(rounds):
        statuses += _burst(srv, bodies, path)
    elapsed = time.perf_counter() - start
    done.set()
    watcher.join()
    ms = sorted(1000 * s for s in latencies)
    return {
        "bodies": bodies,
        "rounds": rounds,
        "body_mb": os.path.getsize(path) / 1e6,
        "statuses": dict(collections.Counter(statuses)),
        "seconds": round(elapsed, 2),
        "health_polls": len(ms),
        "health_ms_p50": round(statistics.median(ms), 1),
        "health_ms_p99": round(statistics.quantiles(ms, n=100, method="inclusive")[98], 1),
        "health_ms_max": round(ms[-1], 1),
        "rss_growth_mb": round(peak[0] - base_rss, 1),
    }


def big_image(srv: ServerProcess, side: int) -> dict:
    noise = np.random.default_rng(0).integers(0, 256, (side // 8, side // 8, 3), np.uint8)
    photo = Image.fromarray(noise).resize((side, side), Image.Resampling.BILINEAR)  # smooth-ish noise
    out = io.BytesIO()
    photo.save(out, format="JPEG", quality=97)  # 17 MB at 6000×6000, as the photo
    jpeg = out.getvalue()
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    before, start = _cpu_s(srv.proc.pid), time.perf_counter()
    r = srv.client.post("/generate", json={"prompt": "a photo", "image": url}, timeout=300)
    wall, cpu = time.perf_counter() - start, _cpu_s(srv.proc.pid) - before
    assert r.status_code == 202, r.text
    inputs = os.path.join(srv.data_dir, "videos", "inputs")
    job = r.json()["id"]
    stored = sum(os.path.getsize(os.path.join(inputs, n)) for n in os.listdir(inputs) if n.startswith(job))
    return {
        "side": side,
        "upload_mb": round(len(jpeg) / 1e6, 2),
        "api_cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "stored_mb": round(stored / 1e6, 2),
        "stored_over_upload": round(stored / len(jpeg), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=4)
    parser.add_argument("--mb", type=float, default=27.0)
    parser.add_argument("--rounds", type=int, default=20, help="bursts of big bodies without an image")
    parser.add_argument("--side", type=int, default=6000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        _publish_i2v(data_dir)
        srv = ServerProcess(data_dir, "--no-workers", "--max-queue", "1000")
        try:
            srv.wait("/health")
            srv.client.post("/generate", json={"prompt": "warm up"})  # loads the tokenizer (imports torch)
            results = {
                "big_bodies": big_bodies(srv, args.bodies, args.mb, data_dir, rounds=args.rounds),
                "big_image_bodies": big_bodies(srv, args.bodies, args.mb, data_dir, image=True),
                "big_image": big_image(srv, args.side),
            }
        finally:
            srv.stop()
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    run_main(main)
