"""The job store on its own: atomic claims under contention, idempotency, cancel, recovery, pagination."""

from __future__ import annotations

import threading

from server import limits
from server.store import JobStore


def test_claims_are_atomic_and_in_order(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    ids = [store.create({"prompt": f"p{i}"})[0].id for i in range(40)]
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(k: int) -> None:
        own = JobStore(store.path)  # a separate connection, like another replica's leader
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


def test_idempotency_cancel_and_progress(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    a, created = store.create({"prompt": "a"}, idempotency_key="k1")
    again, created_again = store.create({"prompt": "different"}, idempotency_key="k1")
    assert created and not created_again and again.id == a.id
    b, _ = store.create({"prompt": "b"})
    assert store.queue_position(store.get(b.id)) == 1
    assert store.cancel(b.id).status == "cancelled"  # queued: cancelled at once, never runs
    running = store.claim("w", "test")
    assert running.id == a.id and store.claim("w", "test") is None
    assert store.progress(a.id, "w", 1, 4) is False
    assert store.progress(a.id, "someone-else", 2, 4) is True  # not this worker's job: stop
    store.cancel(a.id)
    assert store.progress(a.id, "w", 2, 4) is True  # the cancel flag reaches the callback
    assert store.finish(a.id, "w", "cancelled").status == "cancelled"
    assert store.finish(a.id, "w", "completed") is None  # terminal states stick


def test_requeue_then_fail_and_pagination(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job, _ = store.create({"prompt": "x"})
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


def test_limits_are_published_from_the_pipeline_dataclass():
    from dit.pipeline import TINY_LIMITS

    described = limits.describe(TINY_LIMITS)
    assert described["num_frames"] == {"min": 5, "max": 33, "default": 9, "multiple_of": 4}
    assert described["height"]["default"] == 64 and described["width"]["multiple_of"] == 16
    assert limits.check({"num_frames": 9, "height": 64}, described) == []
    errors = dict(limits.check({"num_frames": 10, "height": 4096, "guidance_scale": 0.5}, described))
    assert "5..33 in steps of 4" in errors["num_frames"] and "16..256" in errors["height"]
    assert "guidance_scale" in errors


def test_orphans_are_running_jobs_whose_worker_went_silent(tmp_path):
    """A replica that vanished for good leaves in_progress jobs no supervisor of its own will ever fail."""
    import time

    store = JobStore(str(tmp_path / "jobs.db"))
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
