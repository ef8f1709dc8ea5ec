"""The server end to end on the joint-attention family: `--preset tiny-joint` (HunyuanVideo-1.5 architecture)
on a real 2-rank CPU worker group, Ulysses 2, so every block's text path runs head-sliced + all-gathered; the
exchange is `--comm auto`'s (the default): timed at start-up, published on /ready and /metrics."""

from __future__ import annotations

import imageio.v3 as iio
import pytest

from testing.server_process import ServerProcess


@pytest.mark.slow  # a real server
def test_tiny_joint_serves_a_video(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--preset", "tiny-joint", "--nproc", "2", "--ulysses", "2")
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
        job = srv.submit(prompt='a sign that says "open"', num_frames=5, height=32, width=48,
                         num_inference_steps=3, seed=3)  # fmt: skip
        done = srv.wait_job(job["id"])
        assert done["status"] == "completed", done
        assert done["step"] == 3
        r = srv.client.get(f"/jobs/{job['id']}/video")
        assert r.status_code == 200
        (tmp_path / "v.mp4").write_bytes(r.content)
        frames = iio.imread(tmp_path / "v.mp4")
        assert frames.shape[0] == 5 and frames.shape[1:3] == (32, 48)
    finally:
        srv.stop()
