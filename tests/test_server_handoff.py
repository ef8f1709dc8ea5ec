"""The worker hands each job's MP4 off once its frames are with ffmpeg (server.writers.VideoCloser) and
claims its next job at once. The worker's job loop in this process (one rank, the fake pipeline, the real
writers and SQLite store), every close held by an event: the next job runs while the last file closes; a
job completes only once its file is in place; a cancel meanwhile leaves no file; a close that fails fails
its job, and so does a write that fails mid-decode; a job whose file never closed (its group died) is
re-queued by the group-death path, never completed. And the loop's pace: an idle leader polls the queue
slower after a second without a job, and fast again after one."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dit.video import read_mp4
from server import videos
from server.config import ServeConfig
from server.store import JobStore, StoreBusy
from server.supervisor import group_ready
from server.worker import IDLE_AFTER_S, IDLE_POLL_S, Worker
from server.writers import StreamedVideo
from testing import fake_ffmpeg, fake_pipeline
from testing.server_process import wait_until

MESH = SimpleNamespace(is_replica_leader=True, dp_rank=0, dp_size=1, world_size=1, sp_size=1, ulysses_size=1,
                       ring_size=1, cfg_size=1, broadcast_object=lambda message: message)  # fmt: skip
SPEC = {"prompt": "a red circle", "num_inference_steps": 2, "num_frames": 9, "height": 32, "width": 32}
WAIT_S = 30


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A worker serving in a thread; `gate`: set it to let the closes go on; `fail`: job ids whose close
    raises; `finished`: (status, was its MP4 in place) when `finish` was called, per job."""
    gate, fail, finished = threading.Event(), set(), {}
    real_close = StreamedVideo.close

    def held_close(video: StreamedVideo, frames, stopped=None):
        assert gate.wait(WAIT_S)
        if os.path.basename(video.path).split(".")[0] in fail:
            raise OSError("No space left on device")
        return real_close(video, frames, stopped)

    monkeypatch.setattr(StreamedVideo, "close", held_close)
    config = ServeConfig(data_dir=str(tmp_path), checkpoint_every="off")
    worker = Worker(config, "group", MESH, fake_pipeline.load_pipeline(config.pipeline, MESH), fake_pipeline)
    real_finish = worker.store.raw.finish

    def finish(job_id, worker_name, status, **kwargs):
        finished[job_id] = (status, os.path.exists(_mp4(config, job_id)))
        return real_finish(job_id, worker_name, status, **kwargs)

    monkeypatch.setattr(worker.store.raw, "finish", finish)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    store = JobStore(config.store_url)
    yield SimpleNamespace(config=config, worker=worker, thread=thread, store=store, gate=gate, fail=fail,
                          finished=finished)  # fmt: skip
    worker.stopping.set()
    gate.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def _mp4(config: ServeConfig, job_id: str) -> str:
    return os.path.join(config.videos_dir, f"{job_id}.mp4")


def _files(config: ServeConfig, job_id: str) -> list[str]:
    return sorted(n for n in os.listdir(config.videos_dir) if n.startswith(job_id))


def _at(s, job_id: str, what, phase: str | None = None):
    """Wait until the job is `what` (a status), or in progress in `phase`; the job."""

    def reached():
        job = s.store.get(job_id)
        return job.status == what if phase is None else (job.status, job.phase) == ("in_progress", phase)

    wait_until(reached, WAIT_S, f"job {job_id} {what} {phase or ''}")
    return s.store.get(job_id)


def test_the_next_job_runs_while_the_last_mp4_closes_and_completes_once_it_is_in_place(served, monkeypatch):
    s = served
    removed = []  # (job, its MP4 in place) as its checkpoint goes: kept until then, a run killed while the
    # file closed resumes from it (it was removed before the close, and the next run did every step again)
    monkeypatch.setattr(
        videos,
        "remove_checkpoint",
        lambda folder, job_id: removed.append((job_id, os.path.exists(_mp4(s.config, job_id)))),
    )
    first, _ = s.store.create(SPEC)
    second, _ = s.store.create(SPEC | {"seed": 1})
    _at(s, second.id, "in_progress", "writing")  # claimed, denoised and decoded: the first file is still held
    held = s.store.get(first.id)
    assert (held.status, held.phase, held.video) == ("in_progress", "writing", None)
    partial = [f"{first.id}.1{videos.PARTIAL_SUFFIX}"]  # ffmpeg makes it once it has started: a loaded box
    wait_until(lambda: _files(s.config, first.id) == partial, WAIT_S, "the held job's partial MP4")  # is slow
    s.gate.set()
    done = [_at(s, job.id, "completed") for job in (first, second)]
    assert s.finished == {job.id: ("completed", True) for job in (first, second)}  # the file, then the job
    assert done[0].finished_at > done[1].started_at  # the second ran before the first was done
    for job in done:
        assert read_mp4(_mp4(s.config, job.id)).frames.shape == (9, 32, 32, 3)
        assert job.video == f"{job.id}.mp4" and job.timings["writing_s"] > 0
    assert sorted(removed) == sorted([(first.id, True), (second.id, True)])  # closed side by side


def test_a_cancel_while_the_mp4_closes_leaves_no_file_and_a_cancelled_job(served):
    s = served
    job, _ = s.store.create(SPEC)
    _at(s, job.id, "in_progress", "writing")
    s.store.cancel(job.id)
    s.gate.set()
    cancelled = _at(s, job.id, "cancelled")
    assert cancelled.video is None and "not kept" in cancelled.error
    wait_until(lambda: s.worker.ending.flush(0), WAIT_S, "the close")
    assert _files(s.config, job.id) == []


def test_a_cancel_during_the_decode_stops_it_at_its_next_latent_frame(served):
    """The decode records its progress at each latent frame and reads the cancel flag back: a cancel stops it
    there (seconds sooner than the decode's end), with no file, the job cancelled in its decoding phase."""
    s = served
    s.worker.pipe.decode_s = 18.0  # 33 frames: 9 latent frames of 2 s each
    job, _ = s.store.create(SPEC | {"num_frames": 33})
    wait_until(lambda: s.store.get(job.id).progress > 90, WAIT_S, "the decode's progress")
    asked = time.monotonic()
    s.store.cancel(job.id)
    cancelled = _at(s, job.id, "cancelled")
    assert time.monotonic() - asked < 12  # ≤ one latent frame's 2 s and the poll; the decode had ≥ 12 s left
    assert (cancelled.error, cancelled.phase, cancelled.step) == ("cancelled while decoding", "decoding", 2)
    assert 90 < cancelled.progress < 97 and cancelled.video is None
    assert _files(s.config, job.id) == [] and s.finished[job.id] == ("cancelled", False)


def test_a_stalled_close_holds_no_other_job_and_its_cancel_ends_it_at_once(
    served, monkeypatch, tmp_path_factory
):
    """A close that a stalled disk held (its ffmpeg finishing nothing, for up to 120 s) held every close after
    it, each job's `writing_s` that wait, and a DELETE waited it out to see the job end failed."""
    s = served
    stalled, _ = s.store.create(SPEC)
    ffmpeg = fake_ffmpeg.fake_ffmpeg(tmp_path_factory.mktemp("bin"), fake_ffmpeg.STALLS, stalled.id)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", ffmpeg)
    after, _ = s.store.create(SPEC | {"seed": 1})
    s.gate.set()
    done = _at(s, after.id, "completed")
    assert s.store.get(stalled.id).phase == "writing" and done.timings["writing_s"] < 5
    s.store.cancel(stalled.id)
    asked = time.monotonic()
    cancelled = _at(s, stalled.id, "cancelled")
    assert time.monotonic() - asked < 5 and cancelled.video is None
    assert cancelled.error == "cancelled while its MP4 was written; no video was kept"
    wait_until(lambda: s.worker.ending.flush(0), WAIT_S, "the close")
    assert _files(s.config, stalled.id) == []


def test_a_close_that_fails_fails_its_job_and_the_worker_goes_on(served):
    s = served
    broken, _ = s.store.create(SPEC)
    s.fail.add(broken.id)
    after, _ = s.store.create(SPEC)
    s.gate.set()
    failed = _at(s, broken.id, "failed")
    assert failed.error == "the MP4 was not written: OSError: No space left on device"
    assert failed.timings["writing_s"] is not None and _files(s.config, broken.id) == []
    _at(s, after.id, "completed")
    assert _files(s.config, after.id) == [f"{after.id}.mp4"]


def test_a_write_that_fails_mid_decode_fails_its_job_at_the_close_and_the_worker_goes_on(
    served, monkeypatch, tmp_path_factory
):
    s = served
    broken, _ = s.store.create(SPEC)
    # its pipe breaks after the first frame: ffmpeg died of a full disk
    ffmpeg = fake_ffmpeg.fake_ffmpeg(tmp_path_factory.mktemp("bin"), fake_ffmpeg.DIES_MID_WRITE, broken.id)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", ffmpeg)
    monkeypatch.setattr("shutil.disk_usage", lambda folder: SimpleNamespace(free=4096))
    after, _ = s.store.create(SPEC)
    s.gate.set()
    failed = _at(s, broken.id, "failed")  # the decode went on: no group to restart, no other attempt
    # the folder is not named to the clients who read the job
    assert failed.error == "the MP4 was not written: its disk is full (4 KiB free in the results folder)"
    assert failed.attempts == 1 and _files(s.config, broken.id) == []
    _at(s, after.id, "completed")
    assert _files(s.config, after.id) == [f"{after.id}.mp4"]


def test_a_job_whose_mp4_never_closed_is_re_queued_never_completed(served):
    s = served
    job, _ = s.store.create(SPEC)
    _at(s, job.id, "in_progress", "writing")
    s.worker.stopping.set()  # no more claims: the job stays queued once re-queued
    # the group dies here: the supervisor re-queues what its workers were running (_group_exited)
    running = s.store.in_progress(worker_prefix=f"{s.config.instance}/group/")
    assert [j.id for j in running] == [job.id]
    s.store.requeue_or_fail(running[0], max_attempts=3, reason="the worker group exited")
    # ... or its heartbeats were lost while it lived on, and the run after it has put its file in place
    Path(_mp4(s.config, job.id)).write_bytes(b"the next run's MP4")
    s.gate.set()  # a close that ends after all finds the job no longer its own
    s.thread.join(WAIT_S)
    again = s.store.get(job.id)
    assert (again.status, again.attempts, again.video) == ("queued", 1, None)
    assert job.id not in s.finished and _files(s.config, job.id) == [f"{job.id}.mp4"]  # its partial gone
    assert Path(_mp4(s.config, job.id)).read_bytes() == b"the next run's MP4"  # replaced, then removed before


def test_a_preview_waits_out_a_store_outage_past_the_grace_and_the_newest_is_recorded(
    tmp_path, caplog, monkeypatch
):
    """Past the grace a preview's step was dropped with a warning (the whole connection error) and the job's
    preview_step stayed at the outage's start."""
    config = ServeConfig(data_dir=str(tmp_path), store_outage_grace=0.05)
    worker = Worker(config, "group", MESH, fake_pipeline.load_pipeline(config.pipeline, MESH), fake_pipeline)
    job, _ = worker.store.create(SPEC)
    worker.store.claim(worker.name, config.instance)
    down, real = threading.Event(), type(worker.store.raw).set_preview

    def set_preview(store, *args):
        if down.is_set():
            raise StoreBusy("the job store is unreachable (connection refused)")
        return real(store, *args)

    monkeypatch.setattr(type(worker.store.raw), "set_preview", set_preview)
    down.set()
    for step in (1, 2):
        worker.previews.submit(job.id, step, np.zeros((8, 8, 3), np.uint8))
    wait_until(lambda: worker.store.outage.since is not None, WAIT_S, "the outage")
    start = time.monotonic()
    worker._flush()  # a run's end does not wait for the preview meanwhile (each decode took 5 s longer)
    assert time.monotonic() - start < 1
    threading.Timer(0.5, down.clear).start()
    assert worker.previews.flush(WAIT_S)
    assert JobStore(config.store_url).get(job.id).preview_step == 2
    assert not [r for r in caplog.records if "not written" in r.getMessage()]


def test_an_idle_leader_polls_the_queue_slower_and_fast_again_after_a_job(tmp_path, monkeypatch):
    """--poll-interval's 5 ms in the first second after a job (or the start), then IDLE_POLL_S's 50 ms; the
    bounds leave a loaded box 4× slack (5 ms polls: 200 a second; 50 ms ones: 20)."""
    config = ServeConfig(data_dir=str(tmp_path), checkpoint_every="off")
    worker = Worker(config, "group", MESH, fake_pipeline.load_pipeline(config.pipeline, MESH), fake_pipeline)
    polls, has_queued = [], worker.store.raw.has_queued
    counted = lambda: polls.append(time.monotonic()) or has_queued()  # noqa: E731
    monkeypatch.setattr(worker.store.raw, "has_queued", counted)
    within = lambda start, seconds: sum(start <= t < start + seconds for t in polls)  # noqa: E731
    start = time.monotonic()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        time.sleep(IDLE_AFTER_S + 1.2)
        assert within(start, 0.8 * IDLE_AFTER_S) >= 40, polls  # fast: the first second
        assert within(start + IDLE_AFTER_S + 0.1, 1.0) <= 1.0 / IDLE_POLL_S + 5, polls  # idle: 20 a second
        store = JobStore(config.store_url)
        job, _ = store.create(SPEC)
        wait_until(lambda: store.get(job.id).status == "completed", WAIT_S, f"job {job.id} completed")
        time.sleep(0.5)
        assert within(worker.last_job, 0.4) >= 20, polls  # fast again after the job
    finally:
        worker.stopping.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_run_removes_the_partial_files_of_the_attempts_before_it(tmp_path):
    """A run killed while its file closed left `<id>.1.partial.mp4` beside the next run's finished MP4 until
    the next start-up."""
    job_id = "ab" * 16
    earlier = [tmp_path / f"{job_id}.{attempt}{videos.PARTIAL_SUFFIX}" for attempt in (1, 2)]
    for path in earlier:
        path.write_bytes(b"part of an MP4")
    video = StreamedVideo(str(tmp_path), job_id, attempt=3, fps=8)
    assert not any(path.exists() for path in earlier) and video.path.endswith(f"{job_id}.3.partial.mp4")


def test_a_resumed_run_cancelled_names_the_jobs_step(tmp_path):
    """A run that went on from a checkpoint counted its own steps: "cancelled after step 1" of a job stopped
    at step 7."""
    from server.job_run import JobRun

    finished = {}
    worker = SimpleNamespace(
        config=SimpleNamespace(videos_dir=str(tmp_path)),
        module=fake_pipeline,
        _flush=lambda: None,
        ending=SimpleNamespace(over=lambda run, status, **fields: finished.update(status=status, **fields)),
        torn_down=lambda: False,  # a cancel, not its group going
        steps=SimpleNamespace(start=lambda job_id: None),
    )
    run = JobRun(worker, {"id": "ab" * 16, "spec": {"fps": 8}, "attempt": 2})
    run.step_times = [0.1]  # this run's one step: it resumed after step 6
    run.ended(fake_pipeline.GenerationCancelled(7, 10), None)
    assert finished == {"status": "cancelled", "error": "cancelled after step 7"}


def test_a_replica_sent_sigterm_says_it_is_stopping_within_a_heartbeat(served):
    """A SIGTERM (a drain, or the launcher ending the group as another rank died) takes the replica out of
    /ready at its next heartbeat; it read ready until the group was gone (up to the 30 s the launcher
    gives its ranks)."""
    wait_until(lambda: group_ready(served.store), WAIT_S, "the replica ready")
    served.worker.terminated.set()
    wait_until(lambda: served.store.workers()[0]["state"] == "stopping", 5, "the replica stopping")
    assert not group_ready(served.store)


def test_a_draining_replica_says_it_is_stopping_while_its_last_mp4_closes(served):
    """Its server's drain (through the store: no signal) takes it out of /ready too, at once; it read ready
    while it finished its work (here: a close held)."""
    job, _ = served.store.create(SPEC)
    _at(served, job.id, "in_progress", "writing")
    served.worker.stopping.set()  # what the drain request does (`Worker._should_stop`)
    wait_until(lambda: served.store.workers()[0]["state"] == "stopping", 5, "the replica stopping")
    assert not group_ready(served.store)
