"""The job store on PostgreSQL: lock waits and lost connections, claims and idempotency keys raced from
several processes, and a server that runs its jobs through an outage of the database."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from server.store import StoreBusy, StoreError, StoreFull, open_store
from testing.server_process import wait_until


def test_a_locked_postgres_store_fails_fast_with_store_busy(postgres_cluster):
    url = postgres_cluster.new_database()
    store = open_store(url, busy_timeout=0.3)
    store.create({"prompt": "before"})
    holder = open_store(url)
    with holder._write() as db:
        db.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
        start = time.monotonic()
        with pytest.raises(StoreBusy):
            store.create({"prompt": "during"})
        assert time.monotonic() - start < 2
    assert store.create({"prompt": "after"})[1]


def test_a_cut_postgres_connection_is_replaced_and_one_that_cannot_be_is_busy(postgres_cluster):
    """A connection the server ended while idle (a restart, a failover, an administrator's kill) leaves its
    goodbye on the socket: it is replaced before a call is sent on it (the first call on each failed, a 503
    while /ready said ready). One that cannot be replaced is StoreBusy, in a running server's words (the
    start-up's "check the URL ..." read as if the server were misconfigured)."""
    url = postgres_cluster.new_database()
    store = open_store(url)
    job, _ = store.create({"prompt": "a"})
    pid = store._db._conn.info.backend_pid
    postgres_cluster.cut_connections(url)
    wait_until(lambda: store._db._conn.info.backend_pid != pid, 10, "the ended connection replaced")
    assert store.get(job.id).id == job.id and store.create({"prompt": "b"})[1]
    store._db.close()  # lost, and PostgreSQL does not answer
    store._backend.connect = lambda: (_ for _ in ()).throw(StoreError(store.path, "cannot be reached (x)"))
    said = str(pytest.raises(StoreBusy, store.get, job.id).value)
    assert said == "the job store is unreachable (cannot be reached (x)); retry shortly"


def test_a_full_postgres_disk_is_store_full(postgres_cluster):
    """PostgreSQL's disk_full (SQLSTATE 53100) is the outage SQLite's full disk is: 503 with the reason."""
    store = open_store(postgres_cluster.new_database())
    full = "DO $$ BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; END $$"
    with pytest.raises(StoreFull, match=r"the job store's disk is full \(could not extend file"):
        store._db.execute(full)
    assert store.create({"prompt": "after"})[1]


def _claim_all(url: str, worker: str, out) -> None:
    store = open_store(url)
    claimed = []
    while (job := store.claim(worker, "box")) is not None:
        claimed.append(job.id)
    out.put(claimed)


def test_postgres_claims_from_several_processes_are_exactly_once(postgres_cluster):
    url = postgres_cluster.new_database()
    store = open_store(url)
    ids = [store.create({"prompt": f"p{i}"})[0].id for i in range(60)]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=_claim_all, args=(url, f"w{k}", out)) for k in range(4)]
    for proc in procs:
        proc.start()
    claimed = [job_id for _ in procs for job_id in out.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=30)
    assert sorted(claimed) == sorted(ids) and len(set(claimed)) == len(ids)
    assert store.counts()["in_progress"] == 60 and store.queued_count() == 0


def test_postgres_idempotency_keys_race_to_one_job(postgres_cluster):
    url = postgres_cluster.new_database()
    open_store(url)
    results, barrier = [], threading.Barrier(4)

    def submit() -> None:
        own = open_store(url)
        barrier.wait()
        results.append(own.create({"prompt": "same"}, idempotency_key="k", request_hash="h"))

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({job.id for job, _ in results}) == 1 and sum(created for _, created in results) == 1


@pytest.mark.slow  # a real server
def test_a_server_runs_a_job_on_a_postgres_store(postgres_cluster, tmp_path):
    from testing.server_process import FAKE, ServerProcess

    url = postgres_cluster.new_database()
    server = ServerProcess(tmp_path / "data", "--pipeline-module", FAKE, "--nproc", "1", "--store", url)
    try:
        server.wait()
        job = server.wait_job(server.submit(prompt="a fox")["id"])
        assert job["status"] == "completed", job
        assert server.client.get(f"/jobs/{job['id']}/video").status_code == 200
        assert open_store(url).get(job["id"]).status == "completed"  # in PostgreSQL, not a jobs.db
        assert not (tmp_path / "data" / "jobs.db").exists()
        with open_store(url)._write() as db:  # completed on another box whose results folder is not shared
            db.execute(
                "INSERT INTO jobs (id, status, spec, created_at, instance, video) "
                "VALUES (?, 'completed', '{}', 0, 'other-box', ?)",
                ("f" * 32, "f" * 32 + ".mp4"),
            )
        missing = server.client.get(f"/jobs/{'f' * 32}/video")
        assert missing.status_code == 404 and "other-box" in missing.text and "shared" in missing.text
    finally:
        server.stop()


@pytest.mark.slow  # a real server
def test_a_postgres_outage_costs_a_wait_never_a_job(postgres_cluster, tmp_path):
    """PostgreSQL stopped mid-job and started again, then every connection cut twice mid-job: the running
    jobs complete on their first attempt, the queued ones run after, with no restart of the server; while
    the store is down /ready and the API say it is unreachable and /health says degraded."""
    from testing.server_process import FAKE, ServerProcess, wait_until

    url = postgres_cluster.new_database()
    server = ServerProcess(tmp_path / "data", "--pipeline-module", FAKE, "--nproc", "1", "--store", url,
                           env={"ITHACA_FAKE_STEP_S": "0.1"})  # fmt: skip
    client = server.client

    def mid_job(job_id: str) -> bool:
        return client.get(f"/jobs/{job_id}").json()["step"] >= 3

    try:
        server.wait()
        running = server.submit(prompt="a fox", num_inference_steps=40)["id"]
        queued = [server.submit(prompt=f"fox {i}", num_inference_steps=2)["id"] for i in range(3)]
        wait_until(lambda: mid_job(running), 60, "the first job's steps")
        postgres_cluster.pause()
        try:
            wait_until(lambda: client.get("/health").json()["status"] == "degraded", 30, "/health degraded")
            assert "unreachable" in client.get("/health").json()["reason"]
            ready, jobs = client.get("/ready"), client.get(f"/jobs/{running}")
            assert ready.status_code == 503 and "unreachable" in ready.json()["reason"]
            assert jobs.status_code == 503 and "unreachable" in jobs.text
            time.sleep(2)  # the outage: steps go on meanwhile
        finally:
            postgres_cluster.start()
        for job_id in [running, *queued]:
            job = server.wait_job(job_id)
            assert (job["status"], job["attempts"]) == ("completed", 1), job
        wait_until(lambda: client.get("/ready").status_code == 200, 30, "/ready after the outage")
        assert client.get("/health").json() == {"status": "ok"}

        running = server.submit(prompt="a hare", num_inference_steps=40)["id"]
        wait_until(lambda: mid_job(running), 60, "the second job's steps")
        for _ in range(2):
            postgres_cluster.cut_connections(url)
            time.sleep(1)
        job = server.wait_job(running)
        assert (job["status"], job["attempts"]) == ("completed", 1), job
        assert server.proc.poll() is None and client.get("/ready").status_code == 200
    finally:
        server.stop()
