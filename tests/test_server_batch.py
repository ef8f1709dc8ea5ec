"""`--max-batch`: the worker's job loop in this process (one rank, the fake pipeline, the real writers and
SQLite store, as tests/test_server_handoff.py) claims compatible queued jobs as one batch: each job records
`batch`, its own steps and MP4 (its solo run's frames); an incompatible job runs alone; a cancel ends one job
of the batch and the others complete; a batch that fails leaves every job of it to the group-death re-queue.
Each job's frames equal its solo run's on the real pipeline: tests/test_batch.py."""

from __future__ import annotations

import os
import threading

import numpy as np

from dit.video import read_mp4
from server import videos
from server.config import ServeConfig
from server.store import JobStore
from server.store.retry import LatestStep
from server.worker import Worker
from testing import fake_pipeline
from testing.server_process import wait_until
from tests.test_server_handoff import MESH, SPEC, WAIT_S, _mp4

OTHER = SPEC | {"num_inference_steps": 3}  # another batch key: runs alone


def _queued(tmp_path, max_batch: int, specs: list[dict], checkpoint_every: str = "off"):
    """`specs` queued and a worker for them, not started: (config, store, job ids, worker, its errors)."""
    config = ServeConfig(data_dir=str(tmp_path), checkpoint_every=checkpoint_every, max_batch=max_batch)
    store = JobStore(config.store_url)
    ids = [store.create(spec)[0].id for spec in specs]
    worker = Worker(config, "group", MESH, fake_pipeline.load_pipeline(config.pipeline, MESH), fake_pipeline)
    errors: list[BaseException] = []
    return config, store, ids, worker, errors


def _run(config, store, ids, worker, errors, done):
    """Run the worker's loop until `done` holds for every job (or the loop failed); the jobs."""

    def serve():
        try:
            worker.run()
        except Exception as e:  # the group exits: the supervisor re-queues its jobs
            errors.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    wait_until(lambda: errors or all(done(store.get(i)) for i in ids), WAIT_S, "the jobs")
    worker.stopping.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return [store.get(i) for i in ids]


def _frames(config, job_id: str) -> np.ndarray:
    return read_mp4(_mp4(config, job_id)).frames


def test_compatible_jobs_run_as_one_batch_each_with_its_solo_mp4_and_others_alone(tmp_path):
    specs = [SPEC | {"seed": 1}, OTHER, SPEC | {"seed": 2, "prompt": "a blue square"}, SPEC | {"seed": 3}]
    setup = _queued(tmp_path / "batched", 3, specs)
    jobs = _run(*setup, lambda job: job.terminal)
    assert [(j.status, j.batch, j.step) for j in jobs] == [
        ("completed", 3, 2), ("completed", 1, 3), ("completed", 3, 2), ("completed", 3, 2)]  # fmt: skip
    assert setup[3].pipe.batches == 1  # the three of one key shared their steps; the other ran alone
    assert all(j.timings["writing_s"] > 0 and j.timings["steps"] == j.step for j in jobs)
    solo = _queued(tmp_path / "solo", 1, specs)
    alone = _run(*solo, lambda job: job.terminal)
    assert [j.batch for j in alone] == [1] * 4 and solo[3].pipe.batches == 0
    for batched, single in zip(jobs, alone, strict=True):
        assert np.array_equal(_frames(setup[0], batched.id), _frames(solo[0], single.id))


def test_a_cancel_ends_one_job_of_the_batch_and_the_others_complete(tmp_path, monkeypatch):
    setup = _queued(tmp_path, 3, [SPEC | {"seed": s} for s in range(3)])
    store, ids = setup[1], setup[2]
    real_record = LatestStep.record

    beats, then = [], []

    def record(steps, job_id, step, total):  # the user cancels the middle job after its first step
        if job_id == ids[1] and step == 1:
            setup[3]._beat()  # the worker's heartbeat names the batch's jobs
            beats.append(store.workers()[0]["info"])
            store.cancel(job_id)
        if job_id == ids[0] and step == 2:  # it ended as it left, not when the batch did
            then.append(store.get(ids[1]).status)
        return real_record(steps, job_id, step, total)

    monkeypatch.setattr(LatestStep, "record", record)
    jobs = _run(*setup, lambda job: job.terminal)
    assert [(beat["job"], beat["jobs"]) for beat in beats] == [(ids[0], ids)] and then == ["cancelled"]
    assert [(j.status, j.batch, j.step, j.video is None) for j in jobs] == [
        ("completed", 3, 2, False), ("cancelled", 3, 1, True), ("completed", 3, 2, False)]  # fmt: skip
    assert jobs[1].error == "cancelled after step 1" and not (tmp_path / "videos" / f"{ids[1]}.mp4").exists()


def test_a_job_cancelled_while_it_waits_for_its_decode_ends_before_the_next_decode(tmp_path, monkeypatch):
    setup = _queued(tmp_path, 3, [SPEC | {"seed": s} for s in range(3)])
    store, ids = setup[1], setup[2]
    real_decoded, then = LatestStep.decoded, []

    def decoded(steps, job_id, frames, total):  # the last job is cancelled as the first one decodes
        if job_id == ids[0] and frames == 1:
            store.cancel(ids[2])
        if job_id == ids[1] and frames == 1:  # it stayed in progress until its own decode's turn
            then.append(store.get(ids[2]).status)
        return real_decoded(steps, job_id, frames, total)

    monkeypatch.setattr(LatestStep, "decoded", decoded)
    jobs = _run(*setup, lambda job: job.terminal)
    assert then == ["cancelled"] and [(j.status, j.phase, j.progress) for j in jobs] == [
        ("completed", "writing", 100), ("completed", "writing", 100),
        ("cancelled", "denoising", 90)]  # fmt: skip
    assert jobs[2].error == "cancelled after step 2" and not (tmp_path / "videos" / f"{ids[2]}.mp4").exists()


def test_a_job_that_fails_of_its_own_fails_alone_and_the_worker_goes_on(tmp_path, monkeypatch):
    """A GenerationFailed (raised on every rank alike: a decode that overflowed) fails its job at once, with
    no file and no other attempt, in a batch or alone; the batch's other job and the next job complete."""
    specs = [SPEC | {"seed": 0}, SPEC | {"seed": 1}, OTHER | {"seed": 2}, SPEC | {"seed": 3}]
    setup = _queued(tmp_path, 2, specs)  # 0 and 1 a batch, then 2 and 3 alone (other keys)
    real = fake_pipeline.FakePipeline._decode

    def decode(pipe, req, on_frames, decode_callback):
        if req.seed in (1, 2):
            on_frames(np.zeros((1, req.height, req.width, 3), np.uint8))  # a first chunk went to the MP4
            raise fake_pipeline.GenerationFailed("the VAE decode in float16 gave non-finite values")
        return real(pipe, req, on_frames, decode_callback)

    monkeypatch.setattr(fake_pipeline.FakePipeline, "_decode", decode)
    jobs = _run(*setup, lambda job: job.terminal)
    assert setup[4] == []  # the worker's loop went on
    assert [(j.status, j.batch, j.attempts, j.video) for j in jobs] == [
        ("completed", 2, 1, f"{jobs[0].id}.mp4"), ("failed", 2, 1, None), ("failed", 1, 1, None),
        ("completed", 1, 1, f"{jobs[3].id}.mp4")]  # fmt: skip
    assert jobs[1].error == jobs[2].error == "the VAE decode in float16 gave non-finite values"
    assert sorted(os.listdir(setup[0].videos_dir)) == sorted(j.video for j in jobs if j.video) + ["previews"]


def test_a_batch_that_fails_of_its_own_fails_each_job_and_the_worker_goes_on(tmp_path):
    setup = _queued(tmp_path, 2, [SPEC | {"seed": 0}, SPEC | {"seed": 1}, OTHER])

    def unappliable(jobs, on_phase=None, checkpoints=None):  # every rank alike, before any step
        raise fake_pipeline.GenerationFailed("loras: the set could not be applied: FileNotFoundError: x")

    setup[3].pipe.generate_batch = unappliable
    jobs = _run(*setup, lambda job: job.terminal)
    assert setup[4] == []  # the worker's loop went on: the job of another key after the batch completed
    assert [(j.status, j.batch, j.attempts) for j in jobs] == [
        ("failed", 2, 1), ("failed", 2, 1), ("completed", 1, 1)]  # fmt: skip
    assert jobs[0].error == jobs[1].error == "loras: the set could not be applied: FileNotFoundError: x"


def test_a_failed_batch_leaves_every_job_to_the_group_death_re_queue(tmp_path):
    setup = _queued(tmp_path, 3, [SPEC | {"seed": s} for s in range(3)])
    config, store, ids, worker, errors = setup

    def broken(jobs, on_phase=None, checkpoints=None):
        raise RuntimeError("CUDA error: an illegal memory access")

    worker.pipe.generate_batch = broken
    jobs = _run(*setup, lambda job: job.status == "in_progress")
    assert [str(e) for e in errors] == ["CUDA error: an illegal memory access"]
    assert [(j.status, j.batch) for j in jobs] == [("in_progress", 3)] * 3
    # the group is gone: the supervisor re-queues what its workers were running (_group_exited)
    running = store.in_progress(worker_prefix=f"{config.instance}/group/")
    assert sorted(j.id for j in running) == sorted(ids)
    again = [store.requeue_or_fail(j, max_attempts=3, reason="the worker group exited") for j in running]
    assert [(j.status, j.batch, j.attempts) for j in again] == [("queued", None, 1)] * 3


def test_a_batch_that_dies_leaves_each_job_its_checkpoint_and_each_resumes_alone(tmp_path, monkeypatch):
    setup = _queued(tmp_path, 3, [SPEC | {"seed": s} for s in range(3)], checkpoint_every="1")
    config, store, ids, worker, errors = setup
    real_record = LatestStep.record

    def record(steps, job_id, step, total):  # the batch's step 2 dies, after step 1's checkpoints
        if step == 2:
            raise RuntimeError("CUDA error: an illegal memory access")
        return real_record(steps, job_id, step, total)

    monkeypatch.setattr(LatestStep, "record", record)
    _run(*setup, lambda job: False)
    assert [str(e) for e in errors] == ["CUDA error: an illegal memory access"]
    assert all(os.path.exists(videos.checkpoint_path(config.videos_dir, i)) for i in ids)
    for job in store.in_progress(worker_prefix=f"{config.instance}/group/"):  # the supervisor's re-queue
        store.requeue_or_fail(job, max_attempts=3, reason="the worker group exited")
    monkeypatch.setattr(LatestStep, "record", real_record)
    again = Worker(config, "group2", MESH, fake_pipeline.load_pipeline(config.pipeline, MESH), fake_pipeline)
    jobs = _run(config, store, ids, again, [], lambda job: job.terminal)
    # each resumed from its own step-1 state, alone (a job with a checkpoint joins no batch)
    assert [(j.status, j.batch, j.attempts) for j in jobs] == [("completed", 1, 2)] * 3
    assert again.pipe.batches == 0


def test_a_batchs_jobs_have_the_time_limit_of_the_batch(tmp_path, monkeypatch):
    """A batch of N runs up to N times one job's time (its decodes one after another): its later jobs failed
    the time limit where each fit it alone, and the group was reset."""
    from server import supervisor as supervisor_mod

    store = JobStore(os.path.join(tmp_path, "jobs.db"))
    config = ServeConfig(data_dir=str(tmp_path), instance="box", job_timeout=10)
    supervisor = supervisor_mod.Supervisor(config, store, on_fatal=lambda: None)
    supervisor.group_id, resets = "g1", []
    monkeypatch.setattr(supervisor, "_kill_group", lambda: resets.append(1))
    ids = [store.create(dict(SPEC, prompt=f"p{i}"))[0].id for i in range(3)]
    first = store.claim("box/g1/replica0", "box")
    store.join_batch("box/g1/replica0", "box", first.id, ids[1:2])  # two of a batch
    alone = store.claim("box/g1/replica1", "box")  # the third, on another replica
    start = store.get(first.id).started_at
    monkeypatch.setattr(supervisor_mod.time, "time", lambda: start + 15)
    supervisor._enforce_time_limit()
    assert [store.get(i).status for i in ids] == ["in_progress", "in_progress", "failed"] and resets == [1]
    assert store.get(alone.id).error == "exceeded the time limit of 10 s; the worker group was reset"
    monkeypatch.setattr(supervisor_mod.time, "time", lambda: start + 21)
    supervisor._enforce_time_limit()
    assert store.get(ids[1]).error == "exceeded the time limit of 20 s; the worker group was reset"
