"""Worker groups never outlive their server, SIGTERM stops claiming at once, a cancel after the last step is
honoured, and job phases and state-change log lines. Real processes (uvicorn, the launcher, 2 gloo ranks)
running the FAKE INSTANT PIPELINE (testing/fake_pipeline.py: no model work, a slow decode by
ITHACA_FAKE_DECODE_S), so the test is about processes and the store, not the model."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server.store import TIMED_PHASES, JobStore
from testing.server_process import FAKE, ServerProcess, group_pids, wait_until

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

SLOW_DECODE = {"ITHACA_FAKE_STEP_S": "0.05", "ITHACA_FAKE_DECODE_S": "1.5"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_killed_launcher_or_api_takes_its_ranks_along(tmp_path):
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, restarts=True)
    try:
        srv.wait()
        (launcher,), ranks = group_pids(tmp_path)
        assert len(ranks) == 2
        os.kill(launcher, signal.SIGKILL)
        took = wait_until(lambda: not any(map(_alive, ranks)), 10, "ranks exit after the launcher is killed")
        print(f"ranks gone {took:.2f} s after kill -9 of the launcher")
        srv.wait()  # the supervisor starts a fresh group
        launchers, ranks = group_pids(tmp_path)
        os.kill(srv.proc.pid, signal.SIGKILL)
        took = wait_until(
            lambda: not any(map(_alive, launchers + ranks)), 10, "the group exits after the API is killed"
        )
        print(f"launcher and ranks gone {took:.2f} s after kill -9 of the API")
    finally:
        srv.stop()


def test_a_rank_goes_with_its_launcher_even_one_killed_before_the_rank_could_ask():
    """`python -m server.lifetime MODULE` (how the supervisor starts each rank): with its parent killed, it
    goes too; with its parent gone before it could ask for the signal (a launcher killed while its ranks
    were starting), it does not even start MODULE. `sh` stands for the launcher, this test for the server."""
    rank = f"{sys.executable} -m server.lifetime timeit -n 1 -r 1 \"print('running', flush=True); " \
           "import time; time.sleep(60)\""  # fmt: skip
    env = os.environ | {"ITHACA_SUPERVISOR_PID": str(os.getpid())}
    for script, starts in ((f"{rank} & echo $!; wait", True), (f"(sleep 0.5; exec {rank}) & echo $!", False)):
        launcher = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        try:
            pid = int(launcher.stdout.readline())
            if starts:
                assert launcher.stdout.readline() == "running\n"
                os.kill(launcher.pid, signal.SIGKILL)
            took = wait_until(lambda p=pid: not _alive(p), 10, "the rank exits")
            print(
                f"rank gone {took:.2f} s after its parent ({'killed' if starts else 'gone before it asked'})"
            )
            assert launcher.stdout.read() == ""  # nothing more: the second one never ran MODULE
        finally:
            launcher.kill()
            launcher.wait()


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("lifetime")
    # A group an earlier server of this instance left behind, still beating as one started apart would (one
    # beat before the start went stale on a loaded box before the server had imported torch)
    store, started = JobStore(os.path.join(data_dir, "jobs.db")), threading.Event()

    def beat():
        while True:
            store.heartbeat("box/leftover/replica0", instance="box", group_id="leftover", state="ready",
                            info={})  # fmt: skip
            if started.wait(1.0):
                return

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    srv = ServerProcess(
        data_dir, "--pipeline-module", FAKE, "--log-format", "json", "--instance", "box", env=SLOW_DECODE
    )
    try:
        srv.wait()
        started.set()
        beating.join()
        yield srv
    finally:
        started.set()
        srv.stop()


def test_a_server_drains_groups_an_earlier_one_of_its_instance_left(slow):
    """Where the parent-death signal cannot act (a group started apart, another PID namespace), the new
    server's supervisor asks every group of its instance to drain (stop claiming) before it starts its own;
    one still beating may be another live server's under the same name, which the log says."""
    store = JobStore(os.path.join(slow.data_dir, "jobs.db"))
    assert store.drain_requested("leftover")
    assert not store.drain_requested(slow.client.get("/ready").json()["group"])
    warned = [json.loads(line)["message"] for line in slow.log().splitlines() if "leftover" in line]
    assert any("if another server runs as 'box', give each its own --instance" in m for m in warned), warned


def test_a_dead_group_of_this_host_is_drained_without_a_warning(tmp_path, caplog, monkeypatch):
    """A server killed and started again at once (a restart policy) found its own group's last heartbeat
    fresh and warned of another server under its name; its ranks ran on this host and are gone."""
    import socket
    import subprocess
    import sys

    from server import supervisor as supervisor_mod
    from server.config import ServeConfig

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    store = JobStore(os.path.join(tmp_path, "jobs.db"))
    here = socket.gethostname()
    for group, pid, host in (("dead", int(gone.stdout), here), ("live", os.getpid(), here),
                             ("elsewhere", int(gone.stdout), "another-host")):  # fmt: skip
        store.heartbeat(f"box/{group}/replica0", instance="box", group_id=group, state="idle",
                        info={"pid": pid, "host": host})  # fmt: skip
    monkeypatch.setattr(supervisor_mod.threading.Thread, "start", lambda self: None)  # no loop, no watchdog
    config = ServeConfig(data_dir=str(tmp_path), instance="box")
    supervisor = supervisor_mod.Supervisor(config, store, on_fatal=lambda: None)
    with caplog.at_level(logging.WARNING, logger="ithaca.supervisor"):
        supervisor.start()
    warned = {group for group in ("dead", "live", "elsewhere") if f"worker group {group} " in caplog.text}
    assert warned == {"live", "elsewhere"}, caplog.text
    assert all(store.drain_requested(group) for group in ("dead", "live", "elsewhere"))


def test_a_group_another_server_drained_is_said_so_where_it_ran(tmp_path, caplog):
    """The server whose group a second one (started under the same --instance) drained said only "worker
    group G exited (code 0; restart 1)", as an error."""
    from server.config import ServeConfig
    from server.supervisor import Supervisor

    store = JobStore(os.path.join(tmp_path, "jobs.db"))
    supervisor = Supervisor(ServeConfig(data_dir=str(tmp_path), instance="box"), store, on_fatal=lambda: None)
    supervisor.group_id = "g1"
    store.request_drain("g1")  # the other server's start
    with caplog.at_level(logging.WARNING, logger="ithaca.supervisor"):
        assert supervisor._group_exited(0) is False
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "another server started as instance 'box'" in record.getMessage()
    assert "give each server its own --instance" in record.getMessage().lower()


def test_the_ranks_keep_compiled_graphs_in_the_data_folder(slow):
    """`--compile`'s graphs outlive a restart: inductor's cache is under the data folder (a volume in a
    container) unless the environment names another."""
    (rank, *_) = group_pids(slow.data_dir)[1]
    with open(f"/proc/{rank}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    assert env[b"TORCHINDUCTOR_CACHE_DIR"] == os.path.join(slow.data_dir, "compile-cache").encode()


def _wait_phase(srv: ServerProcess, job_id: str, phase: str, timeout: float = 30) -> dict:
    seen = []

    def reached():
        seen.append(srv.client.get(f"/jobs/{job_id}").json())
        return seen[-1]["phase"] == phase

    wait_until(reached, timeout, f"job {job_id} reaches {phase}")
    return seen[-1]


def _phase_counts(srv: ServerProcess) -> dict[str, int]:
    """`ithaca_job_phase_seconds_count` of each phase, read from /metrics."""
    prefix = 'ithaca_job_phase_seconds_count{phase="'
    lines = [line for line in srv.client.get("/metrics").text.splitlines() if line.startswith(prefix)]
    return {line[len(prefix) :].split('"')[0]: int(line.split()[-1]) for line in lines}


def test_phases_show_where_a_job_is_and_progress_counts_the_decode(slow):
    counted = _phase_counts(slow)
    assert set(counted) == set(TIMED_PHASES)
    job = slow.submit(prompt="phases", num_inference_steps=4)
    assert set(job["timings"].values()) == {None}  # no phase reached yet
    events = [view for name, view in slow.events(job["id"]) if name in ("progress", "done")]
    decoding = next(view for view in events if view["phase"] == "decoding")
    assert decoding["status"] == "in_progress" and decoding["step"] == 4 and 90 <= decoding["progress"] < 97
    # the decode's 3 latent frames (0.5 s each) move the progress on and the stream says each; the last one's
    # 97 may turn to the MP4's phase before a poll sees it
    decoded = [view["progress"] for view in events if view["phase"] == "decoding"]
    assert decoded[:3] == [90, 92, 94] and decoded[3:] in ([], [97]), decoded
    # the phases it finished are timed already, the running one not yet
    assert decoding["timings"]["denoising_s"] >= 0.2 and decoding["timings"]["decoding_s"] is None
    done = slow.wait_job(job["id"])
    assert done["status"] == "completed" and done["progress"] == 100
    timings = done["timings"]
    phases = [timings[f"{phase}_s"] for phase in TIMED_PHASES]
    assert min(phases) >= 0 and sum(phases) <= min(
        timings["total_s"], done["finished_at"] - done["started_at"]
    )
    assert timings["decoding_s"] >= 1.4 and timings["mean_step_s"] >= 0.05
    assert (timings["evaluated"], timings["skipped"]) == (8, 0)  # guided: two passes a step
    wait_until(  # the leader adds the job to the histograms right after completing it
        lambda: _phase_counts(slow) == {p: n + 1 for p, n in counted.items()}, 10, "one more job per phase"
    )


@pytest.mark.parametrize("route", ["/jobs/{}", "/v1/videos/{}"])
def test_a_delete_during_the_decode_is_honoured_and_writes_no_video(slow, route):
    job = slow.submit(prompt="delete me while decoding", num_inference_steps=2)
    _wait_phase(slow, job["id"], "decoding")
    r = slow.client.delete(route.format(job["id"]))
    assert r.status_code == 200, r.text
    store = JobStore(os.path.join(slow.data_dir, "jobs.db"))
    final = wait_until(lambda: store.get(job["id"], include_deleted=True).terminal, 30, "the job ends")
    job_row = store.get(job["id"], include_deleted=True)
    assert job_row.status == "cancelled" and job_row.video is None, (final, job_row)
    videos_dir = os.path.join(slow.data_dir, "videos")
    assert not [n for n in os.listdir(videos_dir) if n.startswith(job["id"])]


def test_state_changes_are_logged_as_json_lines(slow):
    job = slow.submit(prompt="log me", num_inference_steps=1)
    slow.wait_job(job["id"])
    entries = []
    for line in slow.log().splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))  # --log-format json: every log line is one JSON object
    mine = [(e["state"], e["phase"]) for e in entries if e.get("job") == job["id"]]
    assert mine[0] == ("queued", "queued") and mine[-1] == ("completed", "writing"), mine
    assert ("in_progress", "decoding") in mine and all("duration_s" in e for e in entries if "job" in e)


def test_past_its_shutdown_grace_a_job_is_stopped_at_once_and_keeps_its_attempts(tmp_path):
    """SIGTERM: the running job has --shutdown-grace; past it the group goes at once (a rank's SIGTERM only
    drains, so the server waited 10 s more while the job went on), and the job is queued again without
    using an attempt (--max-attempts 1: a rolling restart failed it). Stopped in its decode, the MP4 it was
    writing goes with the group (it stayed until the next start's sweep)."""
    env = {"ITHACA_FAKE_STEP_S": "0.1", "ITHACA_FAKE_DECODE_S": "60"}
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--nproc", "1", "--shutdown-grace", "1",
                        "--max-attempts", "1", env=env, restarts=True)  # fmt: skip
    partial = os.path.join(tmp_path, "videos", "{}.1.partial.mp4")
    try:
        srv.wait()
        job = srv.submit(prompt="long", num_inference_steps=2, num_frames=33)
        wait_until(lambda: os.path.exists(partial.format(job["id"])), 30, "the MP4's first frames")
        start = time.monotonic()
        srv.stop(signal.SIGTERM)
        took = time.monotonic() - start
    finally:
        srv.stop(signal.SIGKILL)
    after = JobStore(os.path.join(tmp_path, "jobs.db")).get(job["id"])
    assert (after.status, after.attempts) == ("queued", 0) and after.step == 0, after
    assert took < 6, f"{took:.1f} s for a grace of 1 s"  # ~1.5 s; it was 11.5 s and more
    assert group_pids(tmp_path) == ([], []) and not os.path.exists(partial.format(job["id"]))


def test_a_sigterm_while_the_group_loads_its_model_stops_it_at_once(tmp_path):
    """No job runs: the drain waited for the model's load and warm-up (minutes for a large model), saying
    "the running job has 300 s"."""
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--nproc", "1", env={"ITHACA_FAKE_LOAD_S": "60"},
                        restarts=True)  # fmt: skip
    try:
        srv.wait("/health")
        wait_until(lambda: group_pids(tmp_path)[1], 30, "the group's rank")
        start = time.monotonic()
        code = srv.stop(signal.SIGTERM, timeout=30)
        took = time.monotonic() - start
    finally:
        srv.stop(signal.SIGKILL)
    assert code == 0 and took < 10, (code, took)  # ~1 s
    assert "no job is running" in srv.log() and "the running job has" not in srv.log()
    assert group_pids(tmp_path) == ([], [])


@pytest.mark.parametrize("soon", [False, True], ids=["during-the-wait", "at-once"])
def test_a_second_ctrl_c_stops_the_running_job_at_once(tmp_path, soon):
    """The first Ctrl-C lets the running job finish within --shutdown-grace; the wait held the event loop,
    so uvicorn's own answer to a second one never came and the server sat out the whole grace; and a second
    one before the wait began was uvicorn's forced exit, which skipped the shutdown and left the job in
    progress, an attempt spent. Now the group goes at once, and the job is queued again without using one."""
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--nproc", "1", "--shutdown-grace", "300",
                        env={"ITHACA_FAKE_STEP_S": "0.5"}, restarts=True)  # fmt: skip
    try:
        srv.wait()
        job = srv.submit(prompt="long", num_inference_steps=40)
        wait_until(lambda: srv.client.get(f"/jobs/{job['id']}").json()["step"] >= 1, 30, "a step")
        srv.proc.send_signal(signal.SIGINT)
        if soon:
            time.sleep(0.05)
        else:
            wait_until(lambda: "shutting down" in srv.log(), 30, "the shutdown")
        start = time.monotonic()
        code = srv.stop(signal.SIGINT)
        took = time.monotonic() - start
    finally:
        srv.stop(signal.SIGKILL)
    assert "asked again; stopping the worker group" in srv.log()
    store = JobStore(os.path.join(tmp_path, "jobs.db"))
    after = store.get(job["id"])
    assert (after.status, after.attempts) == ("queued", 0), after
    # the killed ranks' last heartbeat said "busy": a server sharing the store read it as serving
    assert {w["state"] for w in store.workers()} == {"stopped"}
    assert took < 10, f"{took:.1f} s after the second Ctrl-C"  # ~1 s; it waited for the job (20 s here)
    assert code == 0 and "serve: interrupted" not in srv.log(), code  # drained: a KeyboardInterrupt, exit 130
    assert group_pids(tmp_path) == ([], [])


def test_sigterm_stops_claiming_at_once(slow):
    """Runs last in this module: it stops the server. An open event stream ends at once: uvicorn waits for
    every open connection, so it used to hold the stop 5 s and then log an error."""
    running = slow.submit(prompt="running", num_inference_steps=2)
    queued = [slow.submit(prompt=f"queued {i}", num_inference_steps=2) for i in range(5)]
    _wait_phase(slow, running["id"], "decoding")
    ended = []

    def listen():
        with httpx.stream("GET", f"{slow.url}/jobs/{queued[0]['id']}/events", timeout=30) as stream:
            for _ in stream.iter_lines():
                pass
        ended.append(time.monotonic())

    listener = threading.Thread(target=listen)
    listener.start()
    time.sleep(0.5)  # the stream is open
    start = time.monotonic()
    slow.proc.send_signal(signal.SIGTERM)
    # while the running job finishes the API answers (it refused every connection for the whole grace):
    # /ready says why it is not ready, and the job's client sees it
    wait_until(lambda: slow.client.get("/ready").status_code == 503, 5, "/ready 503")
    assert slow.client.get("/ready").json()["reason"].startswith("the server is shutting down: it starts no")
    assert slow.client.get(f"/jobs/{running['id']}").status_code == 200
    assert slow.proc.wait(timeout=30) == 0  # drained: a clean exit
    took = time.monotonic() - start
    listener.join(10)
    assert ended and ended[0] - start < took + 1, (ended, start, took)  # at the drain's end
    assert "graceful shutdown exceeded" not in slow.log()
    store = JobStore(os.path.join(slow.data_dir, "jobs.db"))
    assert store.get(running["id"]).status == "completed"  # within --shutdown-grace
    assert [store.get(j["id"]).status for j in queued] == ["queued"] * 5  # left for the next server
    assert took < 1.5 * 5  # not the whole queue's decodes
    assert group_pids(slow.data_dir) == ([], [])
