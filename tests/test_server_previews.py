"""Live previews: the worker's leader writes the pipeline's preview images as WebP beside the results, the
job view, the SSE stream and both APIs serve them; a finished job's is the middle frame of its video. One
real server (uvicorn, torchrun, 2 gloo ranks) running the FAKE INSTANT PIPELINE (testing/fake_pipeline.py: a
32×48 gradient after every step, slowed by ITHACA_FAKE_STEP_S); the sweep and the writer on their own."""

from __future__ import annotations

import io
import json
import os

import httpx
import numpy as np
import pytest
from PIL import Image

from dit.video import read_mp4
from server import videos
from server.store import JobStore
from server.writers import PreviewWriter
from testing.server_process import FAKE, ServerProcess, wait_until

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

STEPS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("previews"), "--pipeline-module", FAKE,
                        env={"ITHACA_FAKE_STEP_S": "0.3"})  # fmt: skip
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _preview(srv: ServerProcess, path: str) -> tuple[int, np.ndarray]:
    r = srv.client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/webp" and r.headers["cache-control"] == "no-store"
    assert len(r.content) <= 50_000
    return len(r.content), np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))


def test_previews_grow_with_the_steps_and_stay_after_the_job(server, tmp_path):
    job = server.submit(prompt="fox", num_inference_steps=STEPS)
    job_id = job["id"]
    assert job["preview_step"] is None and job["preview_url"] is None
    r = server.client.get(f"/jobs/{job_id}/preview")
    assert r.status_code == 404 and "no preview yet" in r.json()["detail"]  # the native error shape
    r = server.client.get(f"/v1/videos/{job_id}/content", params={"variant": "thumbnail"})
    assert r.status_code == 404 and "no preview yet" in r.json()["error"]["message"]  # OpenAI's shape

    seen = []

    def previewed():
        view = server.client.get(f"/jobs/{job_id}").json()
        if view["preview_step"] is not None and view["status"] == "in_progress":
            seen.append(view)
        return len({v["preview_step"] for v in seen}) >= 2 or view["status"] == "completed"

    wait_until(previewed, 60, "two previews while the job runs")
    assert seen and seen[0]["preview_url"] == f"/jobs/{job_id}/preview"
    steps = [v["preview_step"] for v in seen]
    assert steps == sorted(steps) and all(1 <= s <= STEPS for s in steps)
    size, early = _preview(server, f"/jobs/{job_id}/preview")
    assert early.shape == (32, 48, 3)

    done = server.wait_job(job_id)
    assert done["status"] == "completed" and done["preview_step"] == STEPS
    _, last = _preview(server, f"/jobs/{job_id}/preview")
    _, thumb = _preview(server, f"/v1/videos/{job_id}/content?variant=thumbnail")
    assert np.array_equal(thumb, last)
    r = server.client.get(f"/v1/videos/{job_id}/content")
    assert r.headers["content-type"] == "video/mp4"
    (tmp_path / "v.mp4").write_bytes(r.content)
    frames = read_mp4(tmp_path / "v.mp4").frames  # the fake's frames are noise: each unlike the others
    distance = [np.abs(last.astype(int) - frame.astype(int)).mean() for frame in frames]
    print(f"finished preview vs each frame: {np.round(distance, 1)}")
    assert last.shape == frames.shape[1:] and int(np.argmin(distance)) == len(frames) // 2  # its middle frame
    r = server.client.get(f"/v1/videos/{job_id}/content", params={"variant": "spritesheet"})
    assert r.status_code == 422 and "error" in r.json()
    print(f"preview of 32x48: {size} bytes")


def test_the_event_stream_carries_preview_events(server):
    job_id = server.submit(prompt="fox", num_inference_steps=STEPS)["id"]
    events = []
    with server.client.stream("GET", f"/jobs/{job_id}/events", timeout=60) as r:
        assert r.status_code == 200
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, json.loads(line.removeprefix("data: "))))
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and "progress" in kinds
    *previews, video = [data for kind, data in events if kind == "preview"]
    assert len(previews) >= 2, kinds
    assert all(p == {"step": p["step"], "url": f"/jobs/{job_id}/preview"} for p in previews)
    steps = [p["step"] for p in previews]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    assert events[-1][1]["preview_step"] == STEPS
    # the video's middle frame in its place, said before `done` (it came with no event)
    assert events[-2] == ("preview", {"step": STEPS, "url": f"/jobs/{job_id}/preview", "video": True})


def test_delete_removes_the_preview(server):
    folder = os.path.join(server.data_dir, "videos")
    done = server.wait_job(server.submit(prompt="fox", num_inference_steps=2)["id"])
    assert os.path.exists(videos.preview_path(folder, done["id"]))
    assert server.client.delete(f"/v1/videos/{done['id']}").status_code == 200
    assert not os.path.exists(videos.preview_path(folder, done["id"]))

    running = server.submit(prompt="fox", num_inference_steps=STEPS)["id"]
    path = videos.preview_path(folder, running)
    wait_until(lambda: os.path.exists(path), 30, "a first preview")
    assert server.client.delete(f"/v1/videos/{running}").status_code == 200
    store = JobStore(os.path.join(server.data_dir, "jobs.db"))
    wait_until(lambda: store.get(running, include_deleted=True).terminal, 30, "the deleted job ends")
    wait_until(lambda: not os.path.exists(path), 10, "the worker removes a preview written after the delete")
    assert not os.listdir(os.path.dirname(path)) or all(
        not n.startswith(running) for n in os.listdir(os.path.dirname(path))
    )
    assert httpx.get(f"{server.url}/jobs/{running}/preview").status_code == 404


def test_the_writer_keeps_a_256_px_preview_small_and_logs_a_failure(tmp_path, caplog):
    store = JobStore(str(tmp_path / "jobs.db"))
    job, _ = store.create({"prompt": "a"})
    store.claim("w", "box")
    writer = PreviewWriter(store, str(tmp_path / "videos"), "w")
    noise = np.random.default_rng(0).integers(0, 256, (256, 256, 3), np.uint8)  # the worst case for WebP
    writer.submit(job.id, 3, noise)
    assert writer.flush(10)
    size = os.path.getsize(videos.preview_path(str(tmp_path / "videos"), job.id))
    print(f"preview of 256x256 noise: {size} bytes")
    assert size < 50_000 and store.get(job.id).preview_step == 3
    writer.submit(job.id, 4, np.zeros((0, 5, 3), np.uint8))  # Pillow cannot encode it: logged, left out
    assert writer.flush(10)
    assert store.get(job.id).preview_step == 3 and "not written" in caplog.text


def test_sweep_removes_the_previews_of_deleted_and_unknown_jobs(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    folder = str(tmp_path / "videos")
    done, gone, running = (store.create({"prompt": p})[0] for p in "abc")
    for _ in range(3):
        store.claim("w", "box")
    store.finish(done.id, "w", "completed", video=f"{done.id}.mp4")
    store.cancel(gone.id, delete=True)
    unknown = "0" * 32
    for job_id in (done.id, gone.id, running.id):
        videos.write_preview(folder, job_id, b"webp")
    lost = JobStore(str(tmp_path / "lost.db"))  # a store that holds no jobs: its previews are left alone
    videos.write_preview(folder, unknown, b"webp")
    assert videos.sweep(lost, folder) == []
    assert sorted(videos.sweep(store, folder)) == sorted([f"{gone.id}.webp", f"{unknown}.webp"])
    assert sorted(os.listdir(os.path.join(folder, "previews"))) == sorted(
        [f"{done.id}.webp", f"{running.id}.webp"]
    )
