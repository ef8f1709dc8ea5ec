"""Concurrent clients against a real server and worker group (2 CPU ranks as two data-parallel replicas)
running the FAKE INSTANT PIPELINE (testing/fake_pipeline.py: the real request checks, callback and cancel
broadcast, no model work), so the test exercises the server, the job store and the worker loop, not the model.
API key off."""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testing.server_process import FAKE, ServerProcess

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # --ulysses 1 on 2 ranks: two data-parallel replicas of one rank, claiming from one queue side by side
    srv = ServerProcess(
        tmp_path_factory.mktemp("load"), "--pipeline-module", FAKE, "--max-queue", "200", "--ulysses", "1"
    )
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def test_50_submissions_and_1000_polls_from_20_threads(server):
    submitted: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_thread(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client(base_url=server.url, timeout=30) as client:  # no Authorization: the key is off
            for i in range(53):  # 20 threads × 53 requests: 50 submissions in all, 1010 polls
                try:
                    if i % 20 == 0 and (k * 3 + i // 20) < 50:
                        r = client.post("/generate", json={"prompt": f"t{k} #{i}", "num_inference_steps": 2})
                        assert r.status_code == 202, r.text
                        with lock:
                            submitted.append(r.json()["id"])
                    else:
                        with lock:
                            target = rng.choice(submitted) if submitted else None
                        r = client.get(f"/jobs/{target}" if target else "/jobs")
                        assert r.status_code == 200, r.text
                except Exception as e:  # noqa: BLE001 - collected and asserted below
                    errors.append(repr(e))

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(client_thread, range(20)))
    assert errors == []
    assert len(submitted) == 50 and len(set(submitted)) == 50
    jobs = [server.wait_job(job_id) for job_id in submitted]
    assert all(j["status"] == "completed" and j["attempts"] == 1 for j in jobs)  # each ran exactly once
    assert {j["worker"].rsplit("/", 1)[1] for j in jobs} == {"replica0", "replica1"}
    listed = server.client.get("/jobs", params={"limit": 100}).json()["data"]
    assert {j["id"] for j in listed} == set(submitted)
    folder = os.path.join(server.data_dir, "videos")
    videos = [n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n))]  # previews/ beside
    assert sorted(videos) == sorted(f"{i}.mp4" for i in submitted)
    assert sorted(os.listdir(os.path.join(folder, "previews"))) == sorted(f"{i}.webp" for i in submitted)
