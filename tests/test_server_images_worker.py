"""The worker's side of a first-frame image: one real server running the FAKE PIPELINE as an image-to-video
model (ITHACA_FAKE_I2V=1) reads the image kept beside the job and hands the pixels to every rank; the
inputs of failed, deleted and cancelled jobs; the real HunyuanVideo-1.5 I2V pipeline on a 2-rank group."""

from __future__ import annotations

import os

import pytest

from dit.video import read_mp4
from server import videos
from server.store import JobStore
from testing.images import DESCRIBED, PNG, data_url
from testing.server_process import FAKE, ServerProcess, wait_until

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

# -- a real server: the worker reads the image and every rank gets it ----------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("images")
    srv = ServerProcess(
        data_dir,
        "--pipeline-module",
        FAKE,
        env={"ITHACA_FAKE_I2V": "1", "ITHACA_FAKE_DECODE_S": "0.5"},  # time to delete a job mid-decode
    )
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def test_the_video_starts_from_the_fitted_image(server, tmp_path):
    """The fake's first frame is the image it got: the stripes cropped to their green middle at 64×64; its
    second, the image the leader got squeezed to the frame: the whole stripes, red on the left (the leader
    keeps the image as given, for Wan's CLIP). The job completes, so the replica's other rank got it too (the
    fake refuses a request without one)."""
    r = server.client.post("/generate", data={"prompt": "fox"}, files={"image": ("a.png", PNG)})
    assert r.status_code == 202, r.text
    job = server.wait_job(r.json()["id"])
    assert job["status"] == "completed", job
    assert job["request"]["image"] == DESCRIBED and job["request"]["height"] == 64  # the defaults filled in
    (tmp_path / "v.mp4").write_bytes(server.client.get(f"/jobs/{job['id']}/video").content)
    first, second = read_mp4(tmp_path / "v.mp4").frames[:2].astype(int)
    assert first.shape == (64, 64, 3) and first[..., 1].min() > 200 and first[..., [0, 2]].max() < 60
    assert second[:, :12, 0].mean() > 200 and second[:, :12, 1:].mean() < 60, second[:, :12].mean((0, 1))


def test_openai_input_reference_end_to_end(server):
    files = {"input_reference": ("a.png", PNG)}
    r = server.client.post("/v1/videos", data={"prompt": "fox", "seconds": "1"}, files=files)
    assert r.status_code == 200, r.text
    assert server.wait_job(r.json()["id"])["status"] == "completed"
    assert server.client.delete(f"/v1/videos/{r.json()['id']}").status_code == 200
    assert not os.path.exists(videos.input_path(os.path.join(server.data_dir, "videos"), r.json()["id"]))


def test_a_missing_or_corrupt_input_fails_the_job_not_the_group(server):
    store = JobStore(os.path.join(server.data_dir, "jobs.db"))
    folder = os.path.join(server.data_dir, "videos")
    restarts = server.client.get("/ready").json()["restarts"]
    corrupt = "c" * 32
    videos.write_input(folder, corrupt, b"not a png", "image/png")
    store.create({"prompt": "fox", "image": DESCRIBED}, job_id=corrupt)
    missing, _ = store.create({"prompt": "fox", "image": DESCRIBED})
    for job_id, says in ((corrupt, "the data is not an image"), (missing.id, "No such file")):
        job = server.wait_job(job_id)
        assert job["status"] == "failed", job
        assert (
            job["error"].startswith(f"invalid request: cannot read {folder}/inputs/{job_id}.png: ")
            and says in job["error"]
        )
    ok = server.client.post("/generate", json={"prompt": "fox", "image": data_url(PNG)}).json()
    assert server.wait_job(ok["id"])["status"] == "completed"
    assert server.client.get("/ready").json()["restarts"] == restarts


def test_a_job_deleted_while_it_runs_loses_its_input_when_it_ends(server):
    job_id = server.client.post("/generate", json={"prompt": "fox", "image": data_url(PNG)}).json()["id"]
    path = videos.input_path(os.path.join(server.data_dir, "videos"), job_id)
    wait_until(lambda: server.client.get(f"/jobs/{job_id}").json()["phase"] == "decoding", 30, "decoding")
    assert server.client.delete(f"/v1/videos/{job_id}").status_code == 200
    assert os.path.exists(path)  # still running (a 0.5 s decode): the file stays until the job is over
    wait_until(lambda: not os.path.exists(path), 30, "the worker removes the input of the deleted job")
    store = JobStore(os.path.join(server.data_dir, "jobs.db"))
    assert store.get(job_id, include_deleted=True).status == "cancelled"


def test_a_real_image_to_video_model_serves_a_job(tmp_path):
    """The real pipeline (`tiny-joint-i2v`, HunyuanVideo-1.5) on a 2-rank Ulysses group: the leader encodes
    the image, both ranks denoise with its conditioning, and the published limits ask for an image. A request
    without a size takes the image's (the stripes' 1:4 at target size 64: 32×128), and the job shows it."""
    srv = ServerProcess(tmp_path, "--preset", "tiny-joint-i2v", "--nproc", "2")
    try:
        srv.wait()
        assert srv.client.get("/openapi.json").status_code == 200
        assert "height" not in srv.client.get("/limits").json()["defaults"]  # the image's, not one default
        r = srv.client.post("/generate", json={"prompt": "a red fox", "num_frames": 5})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "image", r.text
        fields = {"prompt": "a red fox", "num_frames": "5", "num_inference_steps": "2", "seed": "3"}
        r = srv.client.post("/generate", data=fields, files={"image": ("a.png", PNG)})
        assert r.status_code == 202, r.text
        job = srv.wait_job(r.json()["id"])
        assert job["status"] == "completed" and job["timings"]["evaluated"] == 4, job
        assert (job["request"]["height"], job["request"]["width"]) == (32, 128)
        (tmp_path / "v.mp4").write_bytes(srv.client.get(f"/jobs/{job['id']}/video").content)
        assert read_mp4(tmp_path / "v.mp4").frames.shape[:3] == (5, 32, 128)
    finally:
        srv.stop()
