"""Two boxes, one queue (issue 17): two `ithaca serve` instances, each with its own worker group, in two
network namespaces (tests/netns.py: separate hosts with their own addresses and loopback, joined by a veth
link), sharing one PostgreSQL store served over TCP from box A's host and one results folder (the shared
mount of deploy/docker-compose.boxes.yml). A job posted to either box runs exactly once, on whichever is
free, and reads and downloads from both; a box killed mid-job has its job re-queued by the other after
--orphan-timeout, which completes it."""

from __future__ import annotations

import os
import signal

import pytest

from testing.server_process import FAKE, ServerProcess, group_pids, wait_until
from tests import netns
from tests.postgres import started_cluster

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

ENV = {"ITHACA_DIST_TIMEOUT": "20", "ITHACA_FAKE_STEP_S": "0.2", "PYTHONUNBUFFERED": "1"}
ORPHAN_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("boxes")
    with netns.two_hosts() as hosts:
        in_box_a = lambda argv: hosts.argv(0, argv)  # noqa: E731 - PostgreSQL runs on box A's host
        with started_cluster(listen=hosts.addrs[0], trust_net="10.77.0.0/24", wrap=in_box_a) as db:
            store = db.new_database(tcp=True)
            servers = []
            try:
                for i, box in enumerate("ab"):
                    with hosts.entered(i):
                        servers.append(ServerProcess(
                            root / f"box-{box}", "--store", store, "--results-dir", str(root / "shared"),
                            "--instance", f"box-{box}", "--nproc", "1", "--pipeline-module", FAKE,
                            "--orphan-timeout", str(ORPHAN_TIMEOUT_S), "--checkpoint-every", "2", env=ENV,
                        ))  # fmt: skip
                for i, srv in enumerate(servers):
                    with hosts.entered(i):
                        srv.wait(timeout=120)
                yield hosts, servers, store
            finally:
                for i, srv in enumerate(servers):
                    with hosts.entered(i):
                        srv.stop(signal.SIGKILL)


def _on(hosts, i, fn):
    with hosts.entered(i):
        return fn()


def _get(boxes, i: int, path: str):
    """GET `path` from box i (from inside its host)."""
    hosts, servers, _ = boxes
    return _on(hosts, i, lambda: servers[i].client.get(path))


@pytest.mark.slow
def test_a_job_posted_to_either_box_runs_once_and_reads_from_both(boxes):
    hosts, servers, _ = boxes
    posted = [_on(hosts, i % 2, lambda i=i: servers[i % 2].submit(prompt=f"job {i}", num_inference_steps=4))
              for i in range(6)]  # fmt: skip
    done = [_on(hosts, 0, lambda j=j: servers[0].wait_job(j["id"], timeout=90)) for j in posted]
    assert all(j["status"] == "completed" and j["attempts"] == 1 for j in done), done
    assert {j["worker"].split("/")[0] for j in done} == {"box-a", "box-b"}  # both boxes took jobs
    for i in (0, 1):  # every job and every video from either box
        for job in done:
            seen = _get(boxes, i, f"/jobs/{job['id']}").json()
            assert seen["status"] == "completed" and seen["worker"] == job["worker"]
            video = _get(boxes, i, job["video_url"])
            assert video.status_code == 200 and len(video.content) > 0


@pytest.mark.slow
def test_a_box_killed_mid_job_has_its_job_finished_by_the_other(boxes):
    hosts, servers, _ = boxes
    jobs = [_on(hosts, 0, lambda: servers[0].submit(prompt="long", num_inference_steps=20)) for _ in range(2)]

    def running() -> dict:
        views = [_get(boxes, 0, f"/jobs/{j['id']}").json() for j in jobs]
        past_a_checkpoint = [v for v in views if v["status"] == "in_progress" and v["step"] >= 3]
        return {v["worker"].split("/")[0]: v for v in past_a_checkpoint}

    wait_until(lambda: len(running()) == 2, 60, "one long job running on each box")
    on_b = running()["box-b"]
    for pid in [servers[1].proc.pid, *sum(group_pids(servers[1].data_dir), [])]:
        os.kill(pid, signal.SIGKILL)
    done = _on(hosts, 0, lambda: servers[0].wait_job(on_b["id"], timeout=120))
    assert done["status"] == "completed" and done["attempts"] == 2, done
    assert done["worker"].startswith("box-a/")
    assert done["resumed_from_step"] in range(2, 20, 2), done  # its checkpoint, in the shared folder
    other = next(j for j in jobs if j["id"] != on_b["id"])
    assert _on(hosts, 0, lambda: servers[0].wait_job(other["id"], timeout=60))["attempts"] == 1
