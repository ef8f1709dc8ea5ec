"""The server end to end on the joint-attention family: `--preset tiny-joint` (HunyuanVideo-1.5 architecture)
on a real 2-rank CPU worker group, Ulysses 2, so every block's text path runs head-sliced + all-gathered; the
exchange is `--comm auto`'s (the default): timed at start-up, published on /ready and /metrics. With
`--max-batch 2`, jobs queued together share forwards (texts of different lengths padded) and each batched
job's video equals the one it makes alone."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from testing.server_process import ServerProcess


@pytest.mark.slow  # a real server
def test_tiny_joint_serves_a_video(tmp_path):
    srv = ServerProcess(
        tmp_path / "data", "--preset", "tiny-joint", "--nproc", "2", "--ulysses", "2", "--max-batch", "2"
    )
    try:
        srv.wait()
        comm = srv.client.get("/ready").json()["comm"]
        probed = {row["mode"]: row for row in comm["probe"]}
        # exact modes only by default, each plain and in 2 overlapped head chunks (2 heads a rank)
        assert list(probed) == ["alltoall", "p2p", "alltoall+overlap2", "p2p+overlap2"]
        assert comm["mode"] in probed
        assert all(row["ms"] > 0 and row["error"] is None for row in probed.values()), comm
        metrics = srv.client.get("/metrics").text
        assert (
            f'ithaca_comm_mode{{mode="{comm["mode"]}"}} 1' in metrics
            and 'ithaca_comm_probe_ms{mode="p2p"}' in metrics
        )
        assert "exchange: " in srv.log()
        limits = srv.client.post("/generate", json={"prompt": "x", "height": 40}).json()
        assert "height" in str(limits["detail"])  # the joint family's VAE wants multiples of 16
        size = dict(num_frames=5, height=32, width=48, num_inference_steps=3)
        specs = [dict(prompt='a sign that says "open"', seed=3, **size), dict(prompt="a cat", seed=4, **size),
                 dict(prompt="rain on a window at night", seed=5, **size)]  # fmt: skip
        jobs = [srv.submit(**spec) for spec in specs]  # the second and third at least wait: a batch of 2
        done = [srv.wait_job(job["id"]) for job in jobs]
        assert all(d["status"] == "completed" and d["step"] == 3 for d in done), done
        # on the first attempt: a rank that dies after the leader closed its files is re-run unseen
        assert "ithaca_worker_restarts_total 0" in srv.client.get("/metrics").text, srv.log()[-3000:]
        batched = [j for j, d in enumerate(done) if d["batch"] == 2]
        assert len(batched) >= 2, done
        for j in batched:
            alone = srv.wait_job(srv.submit(**specs[j])["id"])
            assert alone["batch"] == 1
            frames = [_frames(srv, tmp_path, d["id"]) for d in (done[j], alone)]
            assert frames[0].shape == (5, 32, 48, 3) and np.array_equal(*frames)
    finally:
        srv.stop()


def _frames(srv, tmp_path, job_id: str) -> np.ndarray:
    r = srv.client.get(f"/jobs/{job_id}/video")
    assert r.status_code == 200
    (tmp_path / f"{job_id}.mp4").write_bytes(r.content)
    return iio.imread(tmp_path / f"{job_id}.mp4")
