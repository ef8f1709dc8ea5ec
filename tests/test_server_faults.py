"""Faults with real processes (2 CPU ranks): a rank killed with SIGKILL mid-job (the real `tiny` pipeline: the
job resumes from its checkpoint in the restarted group and ends with the frames of an uninterrupted run), a
job past its time limit; the API killed with jobs queued and one running, a graceful SIGTERM with a job in
flight (the fake pipeline, testing/fake_pipeline.py: what they test is processes and the store; an ffmpeg that
takes a second to exit, so each next job runs while the last MP4 closes and the drain waits for it). The tests
run in order and share one data folder (one job store) across server restarts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import imageio_ffmpeg
import pytest

from dit.video import read_mp4
from server import videos
from server.app import create_app
from server.config import ServeConfig
from server.store import JobStore, StoreBusy
from testing.server_process import FAKE, ServerProcess, group_pids, wait_until

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

LONG = {"num_frames": 33, "height": 256, "width": 256, "num_inference_steps": 50}
RESUMED = {"prompt": "a green triangle moving up", "num_frames": 17, "height": 128, "width": 128,
           "num_inference_steps": 12, "seed": 7}  # fmt: skip
INSTANCE = ["--instance", "fault-box"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


def _wait_step(srv: ServerProcess, job_id: str, step: int = 1) -> None:
    while srv.client.get(f"/jobs/{job_id}").json()["step"] < step:
        time.sleep(0.02)


@pytest.mark.slow
def test_rank_killed_mid_job_resumes_and_job_time_limit(data_dir):
    srv = ServerProcess(data_dir, *INSTANCE, "--job-timeout", "8", "--checkpoint-every", "2", restarts=True)
    try:
        srv.wait()
        first = srv.submit(prompt="warm-up", num_inference_steps=2)
        assert srv.wait_job(first["id"])["status"] == "completed"
        job = srv.submit(**RESUMED)
        _wait_step(srv, job["id"], 3)  # past the checkpoint after step 2
        group = srv.client.get("/ready").json()["group"]
        pids = group_pids(data_dir)[1]
        assert len(pids) == 2, pids
        os.kill(max(pids), signal.SIGKILL)  # one rank (not the API, not the launcher)
        group = _wait_new_group(srv, group)
        assert srv.client.get("/ready").json()["restarts"] == 1
        resumed = srv.wait_job(job["id"], timeout=60)
        assert resumed["status"] == "completed" and resumed["attempts"] == 2, resumed
        assert resumed["resumed_from_step"] in range(2, 12, 2), resumed  # a checkpoint's step
        assert "resumes after step" in srv.log()
        folder = os.path.join(data_dir, "videos")
        assert not os.path.exists(videos.checkpoint_path(folder, job["id"]))  # gone with the job
        again = srv.wait_job(srv.submit(**RESUMED)["id"])  # the same request, never interrupted
        assert again["status"] == "completed" and again["resumed_from_step"] is None
        want, got = (read_mp4(os.path.join(folder, f"{j['id']}.mp4")).frames for j in (again, resumed))
        assert want.shape == (17, 128, 128, 3) and (got == want).all()
        after = srv.submit(prompt="after the crash", num_inference_steps=2)
        assert srv.wait_job(after["id"])["status"] == "completed"
        assert "ithaca_worker_restarts_total 1" in srv.client.get("/metrics").text

        # A job past --job-timeout fails and the group is reset.
        slow = srv.submit(prompt="too slow", **LONG)
        failed = srv.wait_job(slow["id"], timeout=60)
        assert failed["status"] == "failed" and "time limit" in failed["error"], failed
        timings = failed["timings"]  # where its time went: steps, and the phase it was in
        assert timings["total_s"] > 8 and timings["steps"] >= 1 and timings["denoising_s"] > 0, timings
        assert timings["total_s"] >= timings["encoding_s"] + timings["denoising_s"] - 1e-6, timings
        _wait_new_group(srv, group)
        assert len(group_pids(data_dir)[1]) == 2  # the reset group's ranks are gone, not orphaned
        said = srv.log().split("exceeded the time limit")[-1]  # as ours, not as a crash "ended by SIGKILL"
        assert f"was reset for job {slow['id']}'s time limit" in said and "SIGKILL" not in said, said
        last = srv.submit(prompt="after the reset", num_inference_steps=2)
        assert srv.wait_job(last["id"])["status"] == "completed"
    finally:
        srv.stop()


def _wait_new_group(srv: ServerProcess, old_group: str) -> str:
    deadline = time.monotonic() + 120
    while (ready := srv.client.get("/ready")).status_code != 200 or ready.json()["group"] == old_group:
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.2)
    return ready.json()["group"]


@pytest.mark.slow
def test_api_restart_runs_queued_jobs_and_requeues_the_interrupted_one(data_dir):
    # An API without workers takes jobs; then it dies hard, leaving them queued and one "running" job behind.
    attached = ServerProcess(data_dir, "--no-workers", *INSTANCE)
    try:
        attached.wait("/health")
        assert attached.client.get("/ready").status_code == 503
        queued = [attached.submit(prompt=f"queued {i}", num_inference_steps=2) for i in range(4)]
        store = JobStore(os.path.join(data_dir, "jobs.db"))
        interrupted = store.claim("fault-box/old-group/replica0", "fault-box")  # as if a group was running it
        # ... and one claimed by another server sharing the store that vanished for good (never beats again)
        vanished = store.claim("vanished-box/gone/replica0", "vanished-box")
        assert [interrupted.id, vanished.id] == [queued[0]["id"], queued[1]["id"]]
    finally:
        attached.stop(signal.SIGKILL)

    ffmpeg = data_dir / "slow-ffmpeg"  # each MP4's close takes a second more than its encoding
    ffmpeg.write_text(f'#!/bin/sh\n"{imageio_ffmpeg.get_ffmpeg_exe()}" "$@"; code=$?; sleep 1; exit $code\n')
    ffmpeg.chmod(0o755)
    srv = ServerProcess(data_dir, *INSTANCE, "--orphan-timeout", "2", "--pipeline-module", FAKE,
                        env={"ITHACA_FAKE_STEP_S": "0.1", "IMAGEIO_FFMPEG_EXE": str(ffmpeg)})  # fmt: skip
    try:
        srv.wait()
        for job in queued:
            done = srv.wait_job(job["id"])
            assert done["status"] == "completed", done
        burst = [srv.submit(prompt=f"burst {i}", num_inference_steps=2)["id"] for i in range(3)]
        ran = [store.get(srv.wait_job(job_id)["id"]) for job_id in burst]
        for last, following in zip(ran, ran[1:], strict=False):  # each next job claimed while the MP4 closed
            assert following.started_at < last.finished_at and last.timings["writing_s"] > 1, last
        assert srv.client.get(f"/jobs/{interrupted.id}").json()["attempts"] == 2  # re-queued once, then ran
        assert srv.client.get(f"/jobs/{vanished.id}").json()["attempts"] == 2  # swept from the silent server
        assert "sent no heartbeat" in srv.log()
        old = srv.client.get("/jobs", params={"status": "completed", "order": "asc", "limit": 1}).json()[
            "data"
        ][0]
        assert srv.client.get(old["video_url"]).status_code == 200  # earlier videos stay downloadable

        # Graceful SIGTERM: the running job finishes, then the server exits.
        job = srv.submit(prompt="finish me", num_frames=17, height=128, width=128, num_inference_steps=20)
        _wait_step(srv, job["id"])
        assert srv.stop(signal.SIGTERM) == 0  # drained: a clean exit (uvicorn re-raised the signal: 143)
        assert "the running job has" in srv.log()
        assert store.get(job["id"]).status == "completed"
        assert group_pids(data_dir)[1] == []
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_rank_killed_in_one_replica_leaves_the_other_replicas_job_queued_again_uncounted(tmp_path):
    """Two replicas of one rank: killing one has the launcher SIGTERM the other, which drained, running its
    job on until the SIGKILL 30 s later, and the job was re-queued counted (failed, with --max-attempts 1).
    Now it stops at its next step and is queued again at once, its attempt given back."""
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--nproc", "2", "--ulysses", "1", "--ring", "1",
                        "--cfg", "1", "--max-attempts", "1", env={"ITHACA_FAKE_STEP_S": "0.8"},
                        restarts=True)  # fmt: skip
    try:
        srv.wait()
        jobs = [srv.submit(prompt=f"long {i}", num_inference_steps=50)["id"] for i in range(2)]  # 40 s
        views = lambda: [srv.client.get(f"/jobs/{job}").json() for job in jobs]  # noqa: E731
        wait_until(lambda: all(v["step"] >= 1 for v in views()), 60, "both jobs' first steps")
        by_replica = {v["worker"].rsplit("/", 1)[1]: v["id"] for v in views()}
        (killed,) = [pid for pid in group_pids(tmp_path)[1] if _rank_of(pid) == 1]  # replica1's
        os.kill(killed, signal.SIGKILL)
        other = JobStore(os.path.join(tmp_path, "jobs.db"))
        wait_until(lambda: other.get(by_replica["replica0"]).attempts == 0, 15, "the other job queued again")
        killed_job = lambda: other.get(by_replica["replica1"])  # noqa: E731  its own rank was killed: counted
        wait_until(lambda: killed_job().status == "failed", 15, "the killed replica's job failed")
    finally:
        srv.stop(signal.SIGKILL)


def _rank_of(pid: int) -> int | None:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return int(env[b"RANK"]) if b"RANK" in env else None


def test_group_that_never_becomes_ready_ends_the_server(tmp_path):
    srv = ServerProcess(tmp_path, "--pipeline-module", "tests.no_such_pipeline", "--restart-budget", "2",
                        "--log-format", "json", restarts=True)  # fmt: skip
    try:
        assert srv.proc.wait(timeout=120) == 1  # non-zero: the container's restart policy takes over
        last = srv.log().strip().splitlines()[-1]  # the last line says why: the failing rank's first error
        assert json.loads(last)["level"] == "error"  # a record as every line before it, not plain text
        assert "failed 2 times in a row before becoming ready" in last
        assert "ModuleNotFoundError: No module named 'tests.no_such_pipeline'" in last
        # the failing rank's traceback is a log record too (it was printed, many lines outside the JSON); both
        # ranks fail alike, and the first to fail has the launcher stop the other (which may say nothing)
        failed = [json.loads(line) for line in srv.log().splitlines() if re.search(r'"rank \d+ failed', line)]
        assert failed and "Traceback" in failed[0]["exception"]
        assert not any(line.startswith(("Traceback", "  File ")) for line in srv.log().splitlines())
    finally:
        srv.stop()


def test_a_group_that_finds_a_mistake_as_it_loads_ends_the_server_at_once(tmp_path):
    """A mistake in the model's files (an FP8 checkpoint's scale of a layout it cannot read, say) started the
    group again --restart-budget times, a traceback from every rank each time, to fail alike every time."""
    said = "blocks.0.ffn.0.weight_scale: a scale of shape (4, 1) for a float8 weight of shape (512, 128)"
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--nproc", "2", "--log-format", "json",
                        env={"ITHACA_FAKE_LOAD_ERROR": said}, restarts=True)  # fmt: skip
    try:
        assert srv.proc.wait(timeout=60) == 1
        lines = [json.loads(line) for line in srv.log().strip().splitlines()]
        cannot = rf"the worker group cannot start: rank [01]: ValueError: {re.escape(said)}"
        assert re.fullmatch(f"ithaca serve: {cannot}", lines[-1]["message"])  # the server's last word
        assert [line["message"] for line in lines].count(f"rank 0 failed: ValueError: {said}") == 1
        assert not any("exception" in line for line in lines)  # its line says it all
    finally:
        srv.stop()


def test_a_rank_ended_by_a_store_outage_logs_one_line_without_a_traceback(tmp_path, monkeypatch, caplog):
    """Past the grace a store call fails and the group starts again: expected of an outage, which was logged
    as it began; its traceback (through the pipeline's phase callback) read as a crash."""
    from server import worker
    from server.config import ServeConfig
    from server.store import StoreBusy

    monkeypatch.setattr(worker, "_exit_now", lambda code: None)  # it ends the process
    monkeypatch.setattr(worker, "open_store", lambda config: None)  # record_error: the store is down
    config = ServeConfig(data_dir=str(tmp_path))
    for error, traced in ((StoreBusy("the job store is unreachable"), False), (KeyError("x"), True)):
        caplog.clear()
        worker._fail(config, "g", error)
        (record,) = [r for r in caplog.records if r.name == "ithaca.worker"]
        assert f"rank 0 failed: {type(error).__name__}" in record.getMessage()
        assert (record.exc_info is not None) is traced, error


def test_a_damaged_store_ends_serve_with_one_line(tmp_path):
    (tmp_path / "jobs.db").write_bytes(b"SQLite format 3\x00" + b"\x07" * 300)  # a header, then garbage
    srv = ServerProcess(tmp_path, "--pipeline-module", "testing.fake_pipeline")
    try:
        assert srv.proc.wait(timeout=120) == 2
        lines = srv.log().strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in srv.log(), lines
        assert str(tmp_path / "jobs.db") in lines[0] and "move it aside" in lines[0]
    finally:
        srv.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread ended
def test_the_supervisor_thread_outlives_any_error_and_a_watchdog_starts_it_again(tmp_path, monkeypatch):
    """An error in a round is logged and the round tried again; a thread that ends anyway is started again
    and goes on supervising the same group. (The group here: a `sleep`, no ranks.)"""
    from server import supervisor as supervisor_mod
    from server.config import ServeConfig
    from testing.server_process import wait_until

    monkeypatch.setattr(supervisor_mod, "launch_group", lambda *_: subprocess.Popen(["sleep", "60"]))
    config = ServeConfig(data_dir=str(tmp_path))
    supervisor = supervisor_mod.Supervisor(config, JobStore(config.db_path), on_fatal=lambda: None)
    watch = supervisor._watch_group

    def fail_once(error: BaseException):
        def failing():
            supervisor._watch_group = watch
            raise error

        supervisor._watch_group = failing

    fail_once(RuntimeError("a bug"))
    supervisor.start()
    first = supervisor._thread
    wait_until(lambda: supervisor._watch_group == watch, 10, "the failing round")
    fail_once(SystemExit())  # ends the thread, past the catch-all
    wait_until(lambda: supervisor._thread is not first and supervisor._thread.is_alive(), 10, "the watchdog")
    group = supervisor._proc
    assert group.poll() is None and supervisor.restarts == 0  # the same group, supervised again
    supervisor.stop(grace=0)
    assert group.poll() is not None


def test_ready_says_why_a_ready_group_went_quiet_and_a_full_disk_ends_once_writes_land(tmp_path, monkeypatch):
    """A group that was ready and stops heartbeating (its writes fail: a full disk) is named as such by
    /ready's reason, not as "loading". A full disk's outage is not ended by a read that answers (reads do on
    a full disk), only by FULL_SETTLE_S without a failed write."""
    from server import supervisor as supervisor_mod
    from server.config import ServeConfig
    from server.store import StoreFull
    from server.store import retry as retry_mod
    from testing.server_process import wait_until

    monkeypatch.setattr(supervisor_mod, "launch_group", lambda *_: subprocess.Popen(["sleep", "60"]))
    monkeypatch.setattr(supervisor_mod, "FRESH_HEARTBEAT_S", 0.5)
    config = ServeConfig(data_dir=str(tmp_path))
    store = JobStore(config.db_path)
    supervisor = supervisor_mod.Supervisor(config, store, on_fatal=lambda: None)
    supervisor.start()
    try:
        wait_until(lambda: supervisor.group_id is not None, 10, "the group's launch")
        beat = dict(instance=config.instance, group_id=supervisor.group_id, state="ready", info={})
        store.heartbeat(f"{config.instance}/{supervisor.group_id}/replica0", **beat)
        wait_until(supervisor.ready, 10, "ready")
        wait_until(lambda: not supervisor.ready(), 10, "the heartbeat gone stale")
        assert "sent no heartbeat for" in supervisor.unready() and "full disk" in supervisor.unready()
    finally:
        supervisor.stop(grace=0)

    monkeypatch.setattr(retry_mod, "FULL_SETTLE_S", 0.3)
    outage = retry_mod.StoreOutage(60, "worker")
    outage.failed(StoreFull("the job store's disk is full (database or disk is full)"))
    outage.answered()  # a read
    assert outage.describe().startswith("the job store's disk is full")
    time.sleep(0.35)
    outage.answered()  # writes have landed for FULL_SETTLE_S
    assert outage.describe() is None


def test_an_sqlite_lock_past_the_busy_timeout_makes_the_server_unready(tmp_path, monkeypatch):
    """A lock that refuses requests (503 past --store-busy-timeout) is an outage to the supervisor too: its
    call gives up as soon (it waited 30 s in silence, /ready saying ready all along), rides it out for the
    grace, and /ready says "locked"; the store answers again, the outage is over. A second lock soon after
    is one too: the orphan sweep, an idle supervisor's only write, waits --orphan-timeout after an outage,
    and meanwhile /health said ok and /ready blamed the workers' disk."""
    from server import orphans

    monkeypatch.setattr(orphans, "SWEEP_S", 0.0)  # every round sweeps
    config = ServeConfig(data_dir=str(tmp_path), store_busy_timeout=0.5, store_outage_grace=1.0)
    supervisor = create_app(config).state.services.supervisor  # not started: one round, by hand
    holder = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    start = time.monotonic()
    with pytest.raises(StoreBusy):
        supervisor._watch_group()
    assert time.monotonic() - start < 10 and not supervisor.ready()
    assert "locked" in supervisor.unready()
    holder.execute("COMMIT")
    supervisor._watch_group()
    assert supervisor.outage.describe() is None
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(StoreBusy):
        supervisor._watch_group()
    assert "locked" in supervisor.unready() and "locked" in supervisor.degraded()
    holder.execute("COMMIT")


def test_an_api_only_server_requeues_the_jobs_of_a_box_that_vanished(tmp_path):
    """--no-workers: the orphan sweep ran only in a supervisor's rounds, so with every worker box gone (or
    none beside an API-only front) their jobs read in_progress forever."""
    srv = ServerProcess(tmp_path, "--no-workers", "--orphan-timeout", "1", "--host", "0.0.0.0")
    try:
        srv.wait("/health")
        job = srv.submit(prompt="a red circle moving right", num_inference_steps=2)
        assert (
            JobStore(os.path.join(tmp_path, "jobs.db")).claim("gone-box/g/replica0", "gone-box").id
            == job["id"]
        )
        wait_until(lambda: srv.client.get(f"/jobs/{job['id']}").json()["status"] == "queued", 20, "the sweep")
        assert srv.client.get(f"/jobs/{job['id']}").json()["attempts"] == 1
        assert "sent no heartbeat for 1 s" in srv.log()
        # no key, reachable from elsewhere: said (an empty ITHACA_API_KEY left every route open in silence)
        assert (
            f"(--api-key, ITHACA_API_KEY): every route is open to whoever reaches 0.0.0.0:{srv.port}"
            in srv.log()
        )
    finally:
        assert srv.stop() == 0


def test_a_stopping_group_makes_the_server_unready_saying_so(tmp_path):
    """A replica that heartbeats "stopping" (its server's drain, or its launcher's teardown after another
    rank failed) takes /ready to 503 with that reason (it said "loading, or starting again")."""
    supervisor = create_app(ServeConfig(data_dir=str(tmp_path))).state.services.supervisor  # not started
    supervisor.group_id = "g"
    supervisor.store.heartbeat("box/g/replica0", instance="box", group_id="g", state="stopping", info={})
    supervisor._watch_group()
    assert not supervisor.ready() and supervisor.unready().startswith("the worker group is stopping")
