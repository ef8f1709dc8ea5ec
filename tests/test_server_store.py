"""The job store on its own: atomic claims under contention, idempotency, cancel, recovery, pagination."""

from __future__ import annotations

import itertools
import json
import logging
import re
import sqlite3
import threading
import time

import pytest

from server import limits, logs, videos
from server.store import (
    PHASE_TIMINGS,
    SCHEMA_VERSION,
    JobStore,
    QueueFull,
    StoreBusy,
    StoreError,
    StoreFull,
    UnknownCursor,
    lora_set,
    open_store,
)
from server.store.retry import LatestStep, PatientStore, StoreOutage


@pytest.fixture(params=["sqlite", "postgresql"])
def new_url(request, tmp_path):
    """`new_url()`: the URL of a new, empty store of the backend under test (PostgreSQL: a fresh database
    in the session's throwaway cluster, tests/postgres.py)."""
    if request.param == "sqlite":
        numbers = itertools.count()
        return lambda: f"sqlite:///{tmp_path}/jobs{next(numbers)}.db"
    return request.getfixturevalue("postgres_cluster").new_database


@pytest.fixture
def store(new_url):
    return open_store(new_url())


def test_claims_are_atomic_and_in_order(store):
    ids = [store.create({"prompt": f"p{i}"})[0].id for i in range(40)]
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(k: int) -> None:
        own = JobStore(store.url)  # a separate connection, like another replica's leader
        while (job := own.claim(f"w{k}", "test")) is not None:
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids) and len(set(claimed)) == len(ids)
    assert store.counts()["in_progress"] == 40


def test_a_full_queue_is_counted_in_the_insert_and_queue_positions_are_unique(new_url):
    url = new_url()
    open_store(url)
    barrier, results = threading.Barrier(20), []

    def submit(i: int) -> None:
        own = open_store(url)
        barrier.wait()
        try:
            results.append(own.create({"prompt": f"p{i}"}, max_queued=16)[0])
        except QueueFull as e:
            results.append(e)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = [r for r in results if not isinstance(r, QueueFull)]
    assert len(jobs) == 16 and [r.queued for r in results if isinstance(r, QueueFull)] == [16] * 4
    store = open_store(url)
    assert sorted(store.queue_position(store.get(job.id)) for job in jobs) == list(range(16))


def test_claims_prefer_the_applied_lora_set_while_no_job_waited_past_the_patience(store):
    """Set A applied, queue [B (older), A, none]: A goes first while B is young; once B has waited past the
    patience, B does (the oldest first); with nothing of the applied set queued, the oldest; positions stay
    the count of queued jobs created before."""
    a_set = [["style", 0.8]]
    applied = lora_set(a_set)
    b = store.create({"prompt": "b", "loras": [["other", 1.0]]})[0]
    a = store.create({"prompt": "a", "loras": a_set})[0]
    plain = store.create({"prompt": "plain"})[0]
    assert store.get(a.id).spec["loras"] == a_set
    assert [store.queue_position(store.get(j.id)) for j in (b, a, plain)] == [0, 1, 2]
    assert store.claim("w", "box", applied=applied, patience=60).id == a.id
    assert [store.queue_position(store.get(j.id)) for j in (b, plain)] == [0, 1]
    again = store.create({"prompt": "a again", "loras": [["style", 0.8]]})[0]
    with store._write() as db:  # B has waited two minutes
        db.execute("UPDATE jobs SET created_at = created_at - 120 WHERE id = ?", (b.id,))
    assert store.claim("w", "box", applied=applied, patience=60).id == b.id
    assert store.claim("w", "box", applied=lora_set([["x", 1.0]]), patience=60).id == plain.id  # none: oldest
    assert store.claim("w", "box", applied="", patience=60).id == again.id
    assert lora_set([["b", 1], ["a", 0.5]]) == lora_set([["a", 0.5], ["b", 1.0]]) != lora_set([]) == ""


def test_a_batch_claims_the_named_jobs_still_queued_and_records_its_size(store):
    """The leader claimed `first`; of the companions it names, one was cancelled and one claimed by another
    worker meanwhile: the rest join, in queue order, and every job of the batch records its size; a re-queue
    clears it."""
    first, taken, a, gone, b, left = (store.create({"prompt": f"p{i}"})[0] for i in range(6))
    assert store.claim("w", "box").id == first.id and store.get(first.id).batch == 1
    assert store.claim("other", "box").id == taken.id
    assert [j.id for j in store.queued_jobs(3)] == [a.id, gone.id, b.id]
    store.cancel(gone.id)
    joined = store.join_batch("w", "box", first.id, [b.id, taken.id, gone.id, a.id])
    assert [(j.id, j.status, j.worker, j.batch, j.attempts) for j in joined] == [
        (a.id, "in_progress", "w", 3, 1), (b.id, "in_progress", "w", 3, 1)]  # fmt: skip
    assert [store.get(j.id).batch for j in (first, taken, gone, left)] == [3, 1, None, None]
    assert store.get(taken.id).worker == "other"
    assert store.requeue_or_fail(store.get(a.id), max_attempts=3, reason="test").batch is None


def test_idempotency_cancel_and_progress(store):
    a, created = store.create({"prompt": "a"}, idempotency_key="k1")
    again, created_again = store.create({"prompt": "different"}, idempotency_key="k1")
    assert created and not created_again and again.id == a.id
    b, _ = store.create({"prompt": "b"})
    assert store.queue_position(store.get(b.id)) == 1
    cancelled = store.cancel(b.id)
    assert (cancelled.status, cancelled.cancel_requested) == (
        "cancelled",
        True,
    )  # queued: at once, never runs
    running = store.claim("w", "test")
    assert running.id == a.id and store.claim("w", "test") is None
    assert store.progress(a.id, "w", 1, 4) is False
    assert store.progress(a.id, "someone-else", 2, 4) is True  # not this worker's job: stop
    store.cancel(a.id)
    assert store.progress(a.id, "w", 2, 4) is True  # the cancel flag reaches the callback
    assert (store.get(a.id).step, store.get(a.id).progress) == (2, 22)  # the step ran; progress stays
    assert store.finish(a.id, "w", "cancelled").status == "cancelled"
    assert store.finish(a.id, "w", "completed") is None  # terminal states stick


def test_a_cancel_asked_while_it_ran_is_honoured_when_its_run_ends_otherwise(store):
    """The DELETE was answered: the group dying before the worker acted on it ran the job again, or failed
    it."""
    asked, _ = store.create({"prompt": "y"})
    claimed = store.claim("w", "box-a")
    store.cancel(asked.id)
    ended = store.requeue_or_fail(claimed, max_attempts=2, reason="the worker group exited (code 1)")
    assert (ended.status, ended.video) == ("cancelled", None)
    assert ended.error == "cancelled; its run ended before it stopped (the worker group exited (code 1))"
    one, _ = store.create({"prompt": "z"})
    store.requeue_or_fail(store.claim("w", "box-a"), max_attempts=1, reason="interrupted")
    assert store.get(one.id).error == "interrupted (after 1 attempt)"  # not "1 attempts"


def test_requeue_then_fail_and_pagination(store):
    job, _ = store.create({"prompt": "x"})
    for _ in range(3):  # runs a shutdown stopped use no attempt, however many
        assert store.claim("w", "box-a").attempts == 1
        requeued = store.requeue_or_fail(store.get(job.id), max_attempts=1, reason="shutdown", counted=False)
        assert (requeued.status, requeued.attempts) == ("queued", 0)
    for attempt in (1, 2):
        claimed = store.claim("w", "box-a")
        assert claimed.attempts == attempt
        store.requeue_or_fail(claimed, max_attempts=2, reason="interrupted")
    final = store.get(job.id)
    assert final.status == "failed" and "after 2 attempts" in final.error
    for i in range(5):
        store.create({"prompt": str(i)})
    page, more = store.list(limit=4)
    rest, more2 = store.list(limit=4, after=page[-1].id)
    assert more and not more2 and len(page) + len(rest) == 6
    assert len({j.id for j in page + rest}) == 6
    store.cancel(page[-1].id, delete=True)  # a page read after a job deleted meanwhile goes on
    assert [j.id for j in store.list(limit=4, after=page[-1].id)[0]] == [j.id for j in rest]
    with pytest.raises(UnknownCursor):  # not an empty page, which would read as the end of the list
        store.list(limit=4, after="f" * 32)


def test_an_earlier_run_of_a_job_claimed_again_does_not_end_it(store):
    """A run whose job was re-queued (its worker went silent) and claimed again, by the same worker, ends
    late (its MP4 closed on the worker's closer thread): that end is not the new run's."""
    job, _ = store.create({"prompt": "x"})
    first = store.claim("w", "box-a")
    store.requeue_or_fail(first, max_attempts=3, reason="no heartbeat")
    again = store.claim("w", "box-a")
    assert (first.attempts, again.attempts) == (1, 2)
    assert store.finish(job.id, "w", "completed", video="x.mp4", attempt=1) is None
    assert store.get(job.id).status == "in_progress"
    assert store.finish(job.id, "w", "completed", video="x.mp4", attempt=2).status == "completed"


def test_limits_are_published_from_the_pipeline_dataclass():
    from dit.pipeline import TINY_LIMITS

    described = limits.describe(TINY_LIMITS)
    assert described["num_frames"] == {"min": 5, "max": 33, "default": 9, "multiple_of": 4}
    assert described["height"]["default"] == 64 and described["width"]["multiple_of"] == 16
    assert limits.check({"num_frames": 9, "height": 64}, described) == []
    errors = dict(limits.check({"num_frames": 10, "height": 4096, "guidance_scale": 0.5}, described))
    assert "5..33 in steps of 4" in errors["num_frames"] and "16..256" in errors["height"]
    assert "guidance_scale" in errors


def test_orphans_are_running_jobs_whose_worker_went_silent(store):
    """A replica that vanished for good leaves in_progress jobs no supervisor of its own will ever fail."""
    import time

    for prompt in ("gone", "alive", "fresh"):
        store.create({"prompt": prompt})
    gone, alive = store.claim("b/g1/replica0", "b"), store.claim("a/g2/replica0", "a")
    for worker, instance in (("b/g1/replica0", "b"), ("a/g2/replica0", "a")):
        store.heartbeat(worker, instance=instance, group_id="g", state="busy", info={})
    long_ago = time.time() - 600
    with store._write() as db:  # both jobs started long ago; b's worker last beat long ago
        db.execute("UPDATE jobs SET started_at = ? WHERE id IN (?, ?)", (long_ago, gone.id, alive.id))
        db.execute("UPDATE workers SET heartbeat_at = ? WHERE worker = 'b/g1/replica0'", (long_ago,))
    fresh = store.claim("c/g3/replica0", "c")  # just claimed, no heartbeat yet: not an orphan
    assert [j.id for j in store.orphans(stale_after=60)] == [gone.id]
    store.requeue_or_fail(store.orphans(stale_after=60)[0], max_attempts=2, reason="silent")
    assert store.get(gone.id).status == "queued"
    assert store.get(alive.id).status == store.get(fresh.id).status == "in_progress"


def _damaged_files(tmp_path):
    """(name, path) of files that must not be taken for a job store."""
    good = JobStore(str(tmp_path / "good.db"))
    for i in range(200):
        good.create({"prompt": "x" * 200 + str(i)})
    good.close()
    data = (tmp_path / "good.db").read_bytes()
    (tmp_path / "truncated.db").write_bytes(data[:8])
    (tmp_path / "half.db").write_bytes(data[: len(data) // 2])
    (tmp_path / "png.db").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    foreign = sqlite3.connect(tmp_path / "foreign.db")
    foreign.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    foreign.commit()
    foreign.close()
    (tmp_path / "folder.db").mkdir()
    return {name: str(tmp_path / f"{name}.db") for name in ("truncated", "half", "png", "foreign", "folder")}


def test_a_damaged_or_foreign_file_is_refused_with_what_to_do(tmp_path):
    for name, path in _damaged_files(tmp_path).items():
        with pytest.raises(StoreError) as refused:
            JobStore(path)
        message = str(refused.value)
        # a folder is likely where the file was meant to go: "move it aside" (`--db /tmp`) was no advice
        fix = f"name a file in it ({path}/jobs.db?)" if name == "folder" else "move it aside"
        assert path in message and fix in message, (name, message)
        assert "\n" not in message
    assert "another program" in str(pytest.raises(StoreError, JobStore, str(tmp_path / "foreign.db")).value)
    JobStore(str(tmp_path / "empty.db"))  # a new or empty file is a new store


def test_a_store_from_an_earlier_version_gains_the_new_columns(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)  # the first release's jobs table: no phase column
    db.execute(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
        "idempotency_key TEXT UNIQUE, status TEXT NOT NULL, spec TEXT NOT NULL, meta TEXT NOT NULL "
        "DEFAULT '{}', created_at REAL NOT NULL, started_at REAL, finished_at REAL, step INTEGER NOT NULL "
        "DEFAULT 0, total_steps INTEGER NOT NULL DEFAULT 0, progress INTEGER NOT NULL DEFAULT 0, attempts "
        "INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT NULL DEFAULT 0, deleted INTEGER NOT NULL "
        "DEFAULT 0, instance TEXT, worker TEXT, video TEXT, timings TEXT, error TEXT)"
    )
    db.execute("INSERT INTO jobs (id, status, spec, created_at) VALUES ('a' , 'queued', '{}', 0)")
    old_timings = {"total_s": 2.0, "encoding_s": 0.5, "denoising_s": 1.0, "decoding_s": 0.3, "writing_s": 0.1}
    db.execute(  # finished by a version that kept the phases' seconds in the timings JSON
        "INSERT INTO jobs (id, status, spec, created_at, timings) VALUES ('b', 'completed', '{}', 0, ?)",
        (json.dumps(old_timings),),
    )
    db.commit()
    db.close()
    store = JobStore(str(path))
    assert set(PHASE_TIMINGS) <= {r[1] for r in store._db.execute("PRAGMA table_info(jobs)")}
    assert store._db.execute("SELECT version FROM schema_version").fetchall()[0][0] == SCHEMA_VERSION
    assert store.get("a").phase == "queued" and store.get("a").timings == dict.fromkeys(PHASE_TIMINGS)
    assert store.get("b").timings == old_timings
    assert store.claim("w", "box").phase == "encoding"
    store.set_phase("a", "w", "denoising", {"encoding_s": 0.25})
    assert store.get("a").timings["encoding_s"] == 0.25


def test_a_locked_store_fails_fast_with_store_busy(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"), busy_timeout=0.3)
    store.create({"prompt": "before"})
    holder = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with pytest.raises(StoreBusy):
            store.create({"prompt": "during"})
        assert time.monotonic() - start < 2
    finally:
        holder.execute("ROLLBACK")
    assert store.create({"prompt": "after"})[1]


def test_a_full_disk_is_an_outage_and_a_failed_commit_keeps_no_lock(tmp_path, caplog):
    """SQLite's "database or disk is full" is `StoreFull` (a 503, an outage the workers ride out), reads go
    on, and writes once there is room; a COMMIT that fails (on a full disk, or here a deferred foreign key)
    leaves neither its transaction nor the write lock behind for every other connection to wait on."""
    store = JobStore(str(tmp_path / "jobs.db"), busy_timeout=0.3)
    other = JobStore(str(tmp_path / "jobs.db"), busy_timeout=0.3)
    first, _ = store.create({"prompt": "before"})
    db = store._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")  # no room
    with caplog.at_level(logging.INFO, logger="ithaca.jobs"), pytest.raises(StoreFull, match="disk is full"):
        store.create({"prompt": "x" * 100_000})
    assert not caplog.records  # nothing logged as queued that was not
    assert store.get(first.id).status == "queued"
    db.execute("PRAGMA max_page_count = 1073741823")
    assert store.create({"prompt": "room again"})[1]
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TEMP TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(sqlite3.IntegrityError), store._write() as txn:
        txn.execute("INSERT INTO child VALUES (1)")  # fails at COMMIT
    assert other.create({"prompt": "after"})[1] and store.create({"prompt": "and here"})[1]


class _Flaky:
    """A store that, while `down`, answers every call as an unreachable one does."""

    def __init__(self, store):
        self.store, self.down = store, False

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args, **kwargs):
            if self.down:
                raise StoreBusy("the job store is unreachable (connection refused)")
            return method(*args, **kwargs)

        return call


def test_a_phase_entered_in_an_outage_is_kept_as_a_step_is_and_the_job_runs_on(store):
    """A job entering its decode while the store did not answer waited out the whole grace, and one past it
    ended the group (a traceback; the job failed when that was its last attempt). Kept, the newest of each,
    and written once the store answers, the phase before the decode's progress."""
    job, _ = store.create({"prompt": "a"})
    store.claim("w", "box")
    flaky = _Flaky(store)
    steps = LatestStep(PatientStore(flaky, StoreOutage(600, "worker")), "w")
    assert steps.phase(job.id, "denoising", {"encoding_s": 0.5}) is False
    assert steps.record(job.id, 9, 10) is False
    flaky.down = True
    assert steps.record(job.id, 10, 10) is False  # the outage begins here
    assert steps.phase(job.id, "decoding", {"encoding_s": 0.5, "denoising_s": 1.0}) is False  # no retries
    assert steps.decoded(job.id, 3, 7) is False
    assert (store.get(job.id).phase, store.get(job.id).step) == ("denoising", 9)
    flaky.down = False
    steps.write()
    written = store.get(job.id)
    assert (written.phase, written.step, written.timings["denoising_s"]) == ("decoding", 10, 1.0)
    assert written.progress == 93  # the decode's 3 of 7 latent frames, from the decoding phase's 90
    after, _ = store.create({"prompt": "b"})
    store.claim("w", "box")
    flaky.down = True
    steps.phase(job.id, "writing", {})  # its MP4 closes while the next job begins
    steps.phase(after.id, "denoising", {})
    flaky.down = False
    steps.write()
    assert (store.get(job.id).phase, store.get(after.id).phase) == ("writing", "denoising")
    store.cancel(after.id)
    assert steps.phase(after.id, "decoding", {}) is True  # the answer read back: the job stops


def test_a_job_claimed_back_after_a_stall_is_not_stopped_by_its_stale_run(store):
    """A worker stalled past the orphan timeout: its job was queued again and claimed back by it, and the new
    run stopped at its first step, "cancelled after step 1", the job lost (the stale run's stop stayed)."""
    job, _ = store.create({"prompt": "a"})
    store.claim("w", "box")
    steps = LatestStep(PatientStore(store, StoreOutage(600, "worker")), "w")
    steps.start(job.id)
    assert steps.record(job.id, 5, 10) is False
    store.requeue_or_fail(store.get(job.id), max_attempts=3, reason="its worker stopped answering")
    assert steps.record(job.id, 6, 10) is True  # the stale run: stop
    assert store.claim("w", "box").id == job.id and store.get(job.id).attempts == 2
    steps.start(job.id)  # the next run
    assert steps.record(job.id, 1, 10) is False and store.get(job.id).step == 1


def test_a_jobs_end_waits_out_an_outage_past_the_grace(store, caplog):
    """Once its video is made a job's end is written however long the store is away: past the grace it was
    given up and the job stayed in progress under its live worker, which nothing re-queues, until
    --job-timeout. Other calls past the grace fail, said once an outage (it was once a call: a line every
    few seconds)."""
    from server.job_end import JobEnd

    flaky = _Flaky(store)
    patient = PatientStore(flaky, StoreOutage(0.05, "worker"))
    job, _ = store.create({"prompt": "a"})
    store.claim("w", "box")
    flaky.down = True
    with caplog.at_level(logging.ERROR, logger="ithaca.store"):
        for _ in range(2):
            with pytest.raises(StoreBusy):
                patient.running(job.id, "w", 1)
    assert len([r for r in caplog.records if "did not answer for 0.05 s" in r.getMessage()]) == 1
    threading.Timer(0.5, lambda: setattr(flaky, "down", False)).start()
    ending = JobEnd(patient, "w", "unused")
    store.progress(job.id, "w", 6, 20)  # the last writes that landed before the outage
    done = ending.store.finish(job.id, "w", "completed", video="x.mp4")
    # every step and the MP4 done: it read "completed denoising step 6 / 20", the writes after it dropped
    assert (done.status, done.step, done.total_steps, done.phase, done.progress) == (
        "completed", 20, 20, "writing", 100)  # fmt: skip


def test_expired_are_the_jobs_over_before_a_time_not_yet_deleted(store):
    a, b, running, gone = (store.create({"prompt": p})[0] for p in "abcd")
    for _ in range(4):
        store.claim("w", "box")
    store.finish(a.id, "w", "completed", video=f"{a.id}.mp4")
    store.finish(b.id, "w", "failed", error="boom")
    store.finish(gone.id, "w", "completed", video=f"{gone.id}.mp4")
    store.cancel(gone.id, delete=True)
    cutoff = time.time() + 1
    assert [j.id for j in store.expired(cutoff)] == [a.id, b.id] and store.expired(cutoff, 1)[0].id == a.id
    assert store.expired(store.get(a.id).finished_at) == []


def test_phases_progress_and_a_cancel_after_the_last_step(store):
    job, _ = store.create({"prompt": "a"})
    assert store.claim("w", "box").phase == "encoding"
    store.set_spec(job.id, {"prompt": "a", "num_inference_steps": 10})  # validated: its steps known
    assert (store.get(job.id).step, store.get(job.id).total_steps) == (0, 10)  # not 0 of 0 until step 1
    assert store.set_phase(job.id, "w", "denoising") is False
    store.progress(job.id, "w", 5, 10)
    assert (store.get(job.id).phase, store.get(job.id).progress) == ("denoising", 45)
    store.set_phase(job.id, "w", "decoding")
    assert store.get(job.id).progress == 90  # the decode still counts: not "99 %" while it runs
    assert store.decoded(job.id, "w", 5, 7) is False  # its latent frames fill 90..97, after every step
    assert (store.get(job.id).progress, store.get(job.id).step) == (95, 10)
    assert store.decoded(job.id, "other", 6, 7) is True
    assert store.cancel(job.id).status == "in_progress"  # accepted: the flag is set ...
    assert store.decoded(job.id, "w", 6, 7) is True and store.get(job.id).progress == 95  # seen mid-decode
    assert store.set_phase(job.id, "w", "writing") is True  # ... and the worker sees it before writing
    assert (store.get(job.id).phase, store.get(job.id).progress) == ("decoding", 95)  # where it stopped
    done = store.finish(job.id, "w", "completed", video=f"{job.id}.mp4")
    assert done.status == "cancelled" and done.video is None and "last step" in done.error  # ... or here
    assert done.phase == "decoding"


def test_phase_seconds_are_kept_as_each_phase_ends_and_start_afresh_on_a_requeue(store):
    job, _ = store.create({"prompt": "a"})
    none = dict.fromkeys(PHASE_TIMINGS)
    assert store.get(job.id).timings == none  # the job view's four keys, null until reached
    store.claim("w", "box")
    store.set_phase(job.id, "w", "denoising", {"encoding_s": 0.5})
    assert store.get(job.id).timings == none | {"encoding_s": 0.5}
    store.requeue_or_fail(store.get(job.id), max_attempts=2, reason="interrupted")
    assert store.get(job.id).timings == none
    store.claim("w", "box")
    store.set_phase(job.id, "w", "decoding", {"encoding_s": 0.2, "denoising_s": 1.0})
    failed = store.finish(job.id, None, "failed", error="the group died")  # a supervisor knows no seconds
    assert failed.timings == none | {"encoding_s": 0.2, "denoising_s": 1.0}

    job, _ = store.create({"prompt": "over its time limit"})
    claimed = store.claim("w", "box")
    store.set_phase(job.id, "w", "denoising", {"encoding_s": 0.5})
    store.progress(job.id, "w", 3, 10)
    running = store.get(job.id)
    timings = store.finish(
        job.id, None, "failed", timings=running.timings_until(claimed.started_at + 5)
    ).timings
    assert timings == none | {
        "encoding_s": 0.5,
        "denoising_s": 4.5,
        "total_s": 5,
        "steps": 3,
        "mean_step_s": None,
    }

    job, _ = store.create({"prompt": "b"})
    store.claim("w", "box")
    seconds = {"encoding_s": 0.1, "denoising_s": 2.0, "decoding_s": 0.5, "writing_s": 0.05}
    done = store.finish(
        job.id, "w", "completed", video="b.mp4", timings=seconds | {"total_s": 2.7, "steps": 4}
    )
    assert done.timings == seconds | {"total_s": 2.7, "steps": 4}
    row = store._db.execute("SELECT timings, decoding_s FROM jobs WHERE id = ?", (job.id,)).fetchone()
    assert json.loads(row[0]) == {"total_s": 2.7, "steps": 4} and row[1] == 0.5  # each value kept once


def test_deleted_jobs_leave_the_counts_and_gone_workers_are_pruned(store):
    a, _ = store.create({"prompt": "a"})
    store.create({"prompt": "b"})
    store.cancel(a.id, delete=True)
    assert store.counts()["cancelled"] == 0 and store.counts()["queued"] == 1
    for name, group in (("old/g1/replica0", "g1"), ("old/g1/replica1", "g1"), ("new/g2/replica0", "g2")):
        store.heartbeat(name, instance=name.split("/")[0], group_id=group, state="ready", info={})
    with store._write() as db:
        db.execute("UPDATE workers SET heartbeat_at = heartbeat_at - 600 WHERE group_id = 'g1'")
    assert store.prune_workers(stale_after=60) == 2
    assert [w["worker"] for w in store.workers()] == ["new/g2/replica0"]
    store.record_error("g2", "rank 1: first")
    store.record_error("g2", "rank 0: echo")
    assert store.group_error("g2") == "rank 1: first"
    store.forget_group("g2")
    assert store.workers() == [] and store.group_error("g2") is None


def test_state_changes_are_logged_one_line_each_also_as_json(store, caplog):
    job, _ = store.create({"prompt": "a"})
    with caplog.at_level(logging.INFO, logger="ithaca.jobs"):
        store.claim("w", "box")
        store.set_phase(job.id, "w", "decoding")
        store.finish(job.id, "w", "failed", error="boom")
        store.create({"prompt": "b"})
        store.requeue_or_fail(store.claim("w", "box"), max_attempts=2, reason="its worker stopped answering")
    lines = [r for r in caplog.records if r.name == "ithaca.jobs"]
    assert [r.fields["state"] for r in lines[:3]] == ["in_progress", "in_progress", "failed"]
    assert [r.fields["phase"] for r in lines[:3]] == ["encoding", "decoding", "decoding"]
    # in text too: why it was queued again (it read "queued (queued)", the reason in the JSON record alone)
    said = [re.sub(r"\d+\.\d s", "T s", r.getMessage().replace(r.fields["job"], "ID")) for r in lines]
    assert said == ["job ID in_progress (encoding) T s", "job ID in_progress (decoding) T s",
                    "job ID failed (decoding) T s: boom", "job ID queued T s",
                    "job ID in_progress (encoding) T s",
                    "job ID queued T s: its worker stopped answering"], said  # fmt: skip
    entry = json.loads(logs.JsonFormatter().format(lines[2]))
    assert entry["job"] == job.id and entry["state"] == "failed" and entry["error"] == "boom"
    assert entry["duration_s"] >= 0 and job.id in entry["message"]


def test_sweep_removes_videos_no_route_can_reach_and_keeps_unknown_ones(store, new_url, tmp_path, caplog):
    videos_dir = tmp_path / "videos"
    videos_dir.mkdir()
    done, deleted, cancelled, running = (store.create({"prompt": p})[0] for p in "abcd")
    for _ in range(4):
        store.claim("w", "box")
    for job in (done, deleted):
        store.finish(job.id, "w", "completed", video=f"{job.id}.mp4")
    store.cancel(deleted.id, delete=True)
    store.finish(cancelled.id, "w", "cancelled")
    # a running job's partial file of another attempt is no run's (its run was re-queued while it lived on)
    names = [f"{done.id}.mp4", f"{deleted.id}.mp4", f"{cancelled.id}.mp4", f"{cancelled.id}.1.partial.mp4",
             f"{running.id}.2.partial.mp4", f"{running.id}.1.partial.mp4", "0" * 32 + ".mp4"]  # fmt: skip
    for name in names:
        (videos_dir / name).write_bytes(b"mp4")
    with caplog.at_level(logging.WARNING, logger="ithaca.videos"):
        removed = videos.sweep(store, str(videos_dir))
    assert sorted(removed) == sorted(names[1:5])
    assert sorted(p.name for p in videos_dir.iterdir()) == sorted([names[0], names[5], names[6]])
    assert "does not know the jobs of 1 MP4" in caplog.text

    empty = open_store(new_url())  # a lost store beside a folder of videos: said, kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ithaca.videos"):
        assert videos.sweep(empty, str(videos_dir)) == []
    assert "holds no jobs" in caplog.text and "restore it from a backup" in caplog.text


def test_the_preview_step_migrates_and_a_requeue_clears_it(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)  # a store from before live previews: every other column, no preview_step
    JobStore(str(path)).close()
    db.execute("ALTER TABLE jobs DROP COLUMN preview_step")
    db.execute("INSERT INTO jobs (id, status, spec, created_at) VALUES ('a', 'queued', '{}', 0)")
    db.commit()
    db.close()
    store = JobStore(str(path))
    assert "preview_step" in {r[1] for r in store._db.execute("PRAGMA table_info(jobs)")}
    assert store.get("a").preview_step is None
    job = store.claim("w", "box")
    assert store.set_preview(job.id, "w", 2) and store.get(job.id).preview_step == 2
    assert not store.set_preview(job.id, "other", 3)  # no longer this worker's: left as it was
    store.requeue_or_fail(store.get(job.id), max_attempts=2, reason="interrupted")
    assert store.get(job.id).preview_step is None  # a re-queued job starts without one
    store.claim("w", "box")
    store.set_preview(job.id, "w", 1)
    done = store.finish(job.id, "w", "completed", video="a.mp4")
    assert done.preview_step == 1  # kept after the job: the thumbnail of its result
    assert not store.set_preview(job.id, "w", 5) and store.get(job.id).preview_step == 1


def test_a_store_of_a_newer_schema_version_or_another_program_is_refused(new_url):
    url = new_url()
    store = open_store(url)
    store.create({"prompt": "a"})
    with store._write() as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    store.close()
    refused = pytest.raises(StoreError, open_store, url).value
    assert f"schema version {SCHEMA_VERSION + 1}" in str(refused) and "upgrade" in str(refused)
    assert "\n" not in str(refused)

    foreign = open_store(new_url())  # a database that holds someone else's `jobs` table
    with foreign._write() as db:
        db.execute("DROP TABLE schema_version")
        db.execute("DROP TABLE jobs")
        db.execute("CREATE TABLE jobs (name TEXT)")
    assert "another program" in str(pytest.raises(StoreError, open_store, foreign.url).value)
    # another's schema_version (old Flyway's: text versions; or a number and no jobs table): a traceback
    flyway = "installed_rank INTEGER, version TEXT, script TEXT"
    for table, version in ((flyway, "'1.0'"), ("version TEXT", "'1.0'"), ("version INTEGER", "2")):
        foreign = open_store(new_url())
        with foreign._write() as db:
            db.execute("DROP TABLE schema_version")
            db.execute("DROP TABLE jobs")
            db.execute(f"CREATE TABLE schema_version ({table})")
            db.execute(f"INSERT INTO schema_version (version) VALUES ({version})")
        refused = str(pytest.raises(StoreError, open_store, foreign.url).value)
        assert "another program" in refused and "\n" not in refused, (table, refused)


def test_the_worker_groups_command_is_logged_without_the_stores_password(monkeypatch, caplog, tmp_path):
    """The supervisor's "starting worker group" line showed the whole --store URL, password and all."""
    from server import supervisor
    from server.config import ServeConfig

    monkeypatch.setattr(supervisor.subprocess, "Popen", lambda *args, **kwargs: None)
    url = "postgresql://ithaca:s3cret@db:5432/ithaca?password=s3cret"
    with caplog.at_level(logging.INFO, logger="ithaca.supervisor"):
        supervisor.launch_group(ServeConfig(data_dir=str(tmp_path), store=url), "g1")
    assert "starting worker group g1: " in caplog.text and "postgresql://ithaca:***@db" in caplog.text
    assert "s3cret" not in caplog.text


def test_a_refused_postgres_login_is_said_so(monkeypatch):
    """A wrong password read "cannot be reached", sending an operator to the network."""
    import psycopg

    def refused(*args, **kwargs):
        raise psycopg.OperationalError('connection failed: FATAL:  password authentication failed for "u"')

    monkeypatch.setattr(psycopg, "connect", refused)
    said = str(pytest.raises(StoreError, open_store, "postgresql://u:s3cret@db:5432/x").value)
    assert "postgresql://u:***@db:5432/x: refused the login (connection failed: FATAL: password" in said, said
    assert "PGPASSWORD" in said and "s3cret" not in said and "cannot be reached" not in said


def test_a_postgres_url_libpq_cannot_read_is_one_line_and_no_password_is_shown():
    """No server needed: libpq refuses the URL before it connects (it was a traceback); a password, in the
    user part or as a parameter, never reaches the message."""
    for url, says in (
        ("postgresql://[::1/x", "IPv6 host address"),
        ("postgresql://nobody@127.0.0.1:1/x?bogus=1", 'invalid URI query parameter: "bogus"'),
        (
            "postgresql://u:s3cret@127.0.0.1:1/x?password=s3cret&bogus=1",
            "postgresql://u:***@127.0.0.1:1/x?password=***",
        ),
    ):
        refused = str(pytest.raises(StoreError, open_store, url).value)
        assert "is not a PostgreSQL URL libpq reads" in refused and says in refused, refused
        assert "s3cret" not in refused and "\n" not in refused
