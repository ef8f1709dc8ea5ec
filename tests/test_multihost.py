"""One worker group across two hosts (issue 17): `torchrun --nnodes 2 --rdzv-backend c10d` on two network
namespaces joined by a veth link (tests/netns.py), gloo over it.

- parity: a 2 + 2 rank hybrid group (Ulysses 2 inside each host, ring 2 across them) generates the latents and
  frames of one rank (the real tiny model);
- serving: `ithaca serve --nnodes 2` on host 0 (API, store, supervisor, the replica leader) and `ithaca serve
  --no-api --node-rank 1` on host 1 (its own data folder, never given a job store) run jobs end to end (the
  fake pipeline); host 1's ranks killed with SIGKILL mid-job: the job resumes from its checkpoint in the next
  group, as on one host, once host 1's serve has launched its share again; host 1 gone entirely: the group
  is not ready until it returns, then the interrupted job resumes.
Without root or `ip` these skip (`tests/netns.py`); the checks of the options and the rank numbering run
anywhere.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

import pytest

from server.config import ServeConfig, add_arguments, from_args
from testing.server_process import FAKE, REPO, ServerProcess, group_pids, wait_until
from tests import netns

# every test here starts real server processes: left out of the quick loop (README, Tests)
pytestmark = pytest.mark.slow

RDZV_PORT = 29400  # inside host 0's namespace: nothing else listens there
TIMEOUTS = {"ITHACA_DIST_TIMEOUT": "20", "GLOO_SOCKET_IFNAME": netns.IFNAME, "PYTHONUNBUFFERED": "1"}


# -- the options and the rank numbering (no namespaces) --------------------------------------------------


def _config(argv: list[str]) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), environ={})


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "nohost"], "needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "a:1"], "--node-rank must be 0 to 1"),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "a:1"], "give --no-api"),
        (["--nnodes", "2", "--rdzv-endpoint", "a:1", "--no-api"], "only --node-rank 1 or more"),
        (["--no-api"], "--no-api is for the nodes other than 0"),
        (["--nnodes", "0"], "--nnodes must be 1 or more"),
    ],
)
def test_node_options_are_checked(argv, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        _config(argv).check_nodes()


def test_serve_rejects_node_settings_before_anything_starts(capsys):
    from server.cli import main

    assert main(["serve", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "a:1"]) == 2
    assert "give --no-api" in capsys.readouterr().err
    # across machines the group is one replica: its leader, the only rank using the store, is on node 0
    argv = ["serve", "--nnodes", "2", "--nproc", "2", "--rdzv-endpoint", "a:1", "--ulysses", "2",
            "--cfg", "1"]  # fmt: skip
    assert main([*argv, "--ring", "1"]) == 2
    assert "a group across machines is one replica" in capsys.readouterr().err


def test_layout_across_nodes_puts_ulysses_inside_a_node_and_the_ring_across():
    from server.cli import _layout

    config = _config(["--nnodes", "2", "--nproc", "2", "--rdzv-endpoint", "a:1", "--ulysses", "auto",
                      "--ring", "auto", "--cfg", "1"])  # fmt: skip
    choice = _layout(config)
    assert (choice.layout.ulysses, choice.layout.ring, choice.layout.cfg) == (2, 2, 1), choice.line()
    assert _layout(_config(["--nproc", "4", "--cfg", "1"])).layout.ring == 1  # one node: no ring needed


def test_torchrun_joins_node_zeros_rendezvous():
    from parallel.local_group import local_group
    from server.supervisor import launcher_argv

    assert launcher_argv(_config(["--nproc", "4"])) == local_group(4)  # one machine: no torchrun
    json_logs = _config(["--nproc", "4", "--log-format", "json"])  # no plain line of the launcher among them
    assert launcher_argv(json_logs) == local_group(4, quiet=True)
    node1 = _config(["--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h0:29400",
                     "--node-addr", "h1", "--no-api"])  # fmt: skip
    argv = launcher_argv(node1)
    assert " ".join(argv) == (
        f"{sys.executable} -m parallel.torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 "
        "--rdzv-backend c10d --rdzv-endpoint h0:29400 --rdzv-id ithaca "
        "--rdzv-conf is_host=0,join_timeout=600 --local-addr h1 --max-restarts 0"
    )
    node0 = _config(["--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "h0:29400", "--rdzv-timeout", "30"])
    assert "is_host=1,join_timeout=30" in launcher_argv(node0) and "--local-addr" not in launcher_argv(node0)


def test_a_node_without_the_api_relaunches_with_a_backoff_until_its_budget(monkeypatch):
    """Its share exits: launched again after 1, 2, 4 ... s while the exits come within a minute of their
    launch; one that ran longer starts the count again; `--relaunch-budget` quick exits in a row end it."""
    import server.supervisor as supervisor

    clock, ran = [0.0], [5, 5, 120, 5, 5, 5]  # seconds each launch runs before it exits

    class Exits:
        def wait(self):
            clock[0] += ran.pop(0)
            return 1

    class Pauses(list):
        def is_set(self):
            return False

        def wait(self, seconds):
            self.append(seconds)

    monkeypatch.setattr(supervisor, "launch_group", lambda config, group_id: Exits())
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: clock[0])
    share = supervisor.NodeShare(_config(["--relaunch-backoff", "1", "--relaunch-budget", "3"]))
    share._stopping = pauses = Pauses()
    share.run()
    assert (share.starts, pauses, ran) == (6, [1, 2, 1, 1, 2], [])
    assert share.fatal == ("this node's share of the worker group exited 3 times in a row within 60 s of its "
                           "launch, the last time with code 1 (its error is above)")  # fmt: skip


def _number(node_ranks: list[int], agree: list[dict]) -> list[str]:
    """`number_ranks_by_node` on one thread per machine (one rank each, torchrun's order: machine i has rank
    i) through a store as torchrun's: each one's new RANK, or its error."""
    from torch.distributed import TCPStore

    from parallel.launch import number_ranks_by_node

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    n, said = len(node_ranks), [""] * len(node_ranks)

    def rank(i: int) -> None:
        env = {"GROUP_WORLD_SIZE": str(n), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "RANK": str(i), "GROUP_RANK": str(i), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port)}  # fmt: skip
        try:
            number_ranks_by_node(node_ranks[i], agree[i], env, timeout=30)
            said[i] = env["RANK"]
        except ValueError as e:
            said[i] = str(e)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return said


def test_ranks_are_numbered_by_node_and_the_machines_checked_before_the_group_forms():
    from parallel.launch import number_ranks_by_node

    # torchrun's rendezvous put the operator's node 0 second, node 1 first: their ranks swap
    assert _number([1, 0], [{"ring": 2}] * 2) == ["1", "0"]
    # a node number given twice, degrees that differ: every rank says so at once (no rendezvous timeout)
    twice = _number([0, 1, 1], [{}] * 3)
    assert len(set(twice)) == 1 and twice[0].startswith("--node-rank 1 is given on 2 machines"), twice
    differ = _number([0, 1], [{"ring": 2}, {"ring": 1}])
    assert [line.split(": give")[0] for line in differ] == [
        "the machines disagree on ring: 2 on node 0, 1 on node 1",
        "the machines disagree on ring: 1 on node 1, 2 on node 0",
    ]
    env = {
        "GROUP_WORLD_SIZE": "2",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "RANK": "3",
    }
    one = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "RANK": "1"}
    number_ranks_by_node(0, environ=one)
    assert one["RANK"] == "1"  # one machine: untouched
    with pytest.raises(ValueError, match="give every machine the same --nproc"):
        number_ranks_by_node(0, environ=env | {"WORLD_SIZE": "3"})
    with pytest.raises(ValueError, match="--node-rank 2 is not one of the 2 machines"):
        number_ranks_by_node(2, environ=env)


# -- two hosts ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hosts():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    with netns.two_hosts() as made:
        yield made


def _torchrun(hosts, i: int, argv: list[str], rdzv_id: str) -> list[str]:
    return hosts.argv(i, [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.addrs[0]}:{RDZV_PORT}", "--rdzv-id", rdzv_id,
        "--rdzv-conf", f"is_host={int(i == 0)},join_timeout=60", "--local-addr", hosts.addrs[i],
        "--max-restarts", "0", *argv,
    ])  # fmt: skip


@pytest.mark.slow
def test_parity_two_hosts_hybrid_with_one_rank(hosts, tmp_path):
    import torch

    request = ["generate", "a red ball bouncing", "--steps", "2", "--frames", "5", "--seed", "3"]
    one = subprocess.run([sys.executable, "-m", "server.cli", *request, "--out", str(tmp_path / "one.mp4"),
                          "--save-latents", str(tmp_path / "one.pt")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    # Ulysses 2 inside each host, ring 2 across: each ring pass crosses the veth link
    group = [*request, "--ulysses", "2", "--ring", "2", "--cfg", "1", "--out", str(tmp_path / "two.mp4"),
             "--save-latents", str(tmp_path / "two.pt")]  # fmt: skip
    logs = [open(tmp_path / f"host{i}.log", "w") for i in range(2)]
    procs = [
        subprocess.Popen(_torchrun(hosts, i, ["-m", "server.cli", *group, "--node-rank", str(i)], "parity"),
                         cwd=REPO, env=os.environ | TIMEOUTS, stdout=logs[i], stderr=subprocess.STDOUT)
        for i in range(2)
    ]  # fmt: skip
    try:
        codes = [p.wait(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    said = "\n".join((tmp_path / f"host{i}.log").read_text()[-3000:] for i in range(2))
    assert codes == [0, 0], said
    assert "ulysses 2 x ring 2 x cfg 1 over alltoall (4 ranks)" in said  # the exchange said
    ref, got = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    a, b = ref["latents"].double(), got["latents"].double()
    assert a.shape == b.shape and (a - b).abs().max() <= 1e-4 * a.abs().max()
    assert (ref["frames"].int() - got["frames"].int()).abs().max() <= 2  # dit.parity.FRAME_TOL_EXACT


class Node1:
    """`ithaca serve --no-api --node-rank 1` on host 1, with a data folder of its own (never a job store)."""

    def __init__(self, hosts, data_dir, flags: list[str]):
        self.data_dir = str(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.log_path = os.path.join(self.data_dir, "node1.log")
        argv = [sys.executable, "-m", "server.cli", "serve", "--no-api", "--node-rank", "1", "--node-addr",
                hosts.addrs[1], "--data-dir", self.data_dir, *flags]  # fmt: skip
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(hosts.argv(1, argv), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         env=os.environ | TIMEOUTS)  # fmt: skip

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def group(hosts, tmp_path_factory):
    """Host 0: the API with its share (1 rank, the leader); host 1: its share (1 rank). Ring 2 across them."""
    root = tmp_path_factory.mktemp("multihost")
    flags = ["--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"{hosts.addrs[0]}:{RDZV_PORT}",
             "--pipeline-module", FAKE, "--ulysses", "1", "--ring", "2", "--cfg", "1"]  # fmt: skip
    env = TIMEOUTS | {"ITHACA_FAKE_STEP_S": "0.2"}
    with hosts.entered(0):  # the API, its supervisor and torchrun start in host 0 (talk to it from there)
        api = ServerProcess(root / "node0", *flags, "--node-addr", hosts.addrs[0], "--checkpoint-every", "2",
                            env=env)  # fmt: skip
    nodes = {"api": api, "flags": flags, "node1_dir": root / "node1"}
    nodes["node1"] = Node1(hosts, nodes["node1_dir"], flags)
    try:
        yield nodes
    finally:
        nodes["node1"].stop(signal.SIGKILL)
        with hosts.entered(0):
            api.stop()


@pytest.mark.slow
def test_a_job_end_to_end_across_two_hosts(hosts, group):
    api = group["api"]
    with hosts.entered(0):
        api.wait(timeout=90)
        job = api.submit(prompt="across two hosts", num_inference_steps=3)
        done = api.wait_job(job["id"], timeout=60)
        assert done["status"] == "completed", done
        assert api.client.get(done["video_url"]).status_code == 200
    from server.store import JobStore

    (worker,) = JobStore(os.path.join(api.data_dir, "jobs.db")).workers()
    assert worker["info"]["world_size"] == 2 and worker["info"]["dp_size"] == 1
    assert len(group_pids(api.data_dir)[1]) == 1 and len(group_pids(group["node1_dir"])[1]) == 1
    assert "node 1 of 2: 1 ranks of the group" in group["node1"].log()
    assert not os.path.exists(os.path.join(group["node1_dir"], "jobs.db"))  # host 1 never opens a store


def _wait_step(api, job_id: str, step: int) -> None:
    wait_until(lambda: api.client.get(f"/jobs/{job_id}").json()["step"] >= step, 60, f"step {step}")


@pytest.mark.slow
def test_host_lost_mid_job_resumes_when_it_returns(hosts, group):
    api = group["api"]
    api.restarts = True  # its groups die here, by design
    request = {"prompt": "interrupted", "num_inference_steps": 12, "num_frames": 17, "height": 64,
               "width": 64}  # fmt: skip
    with hosts.entered(0):
        api.wait(timeout=90)
        # 1. host 1's rank killed: its serve launches it again, node 0 re-queues the job, which resumes
        job = api.submit(**request)
        _wait_step(api, job["id"], 3)  # past the checkpoint after step 2
        (rank,) = group_pids(group["node1_dir"])[1]
        os.kill(rank, signal.SIGKILL)
        done = api.wait_job(job["id"], timeout=90)
        assert done["status"] == "completed" and done["attempts"] == 2, done
        assert done["resumed_from_step"] in range(2, 12, 2), done
        assert "starting it again" in group["node1"].log()

        # 2. host 1 gone entirely (its serve, torchrun and rank): not ready until it comes back
        api.wait(timeout=90)
        job = api.submit(**request)
        _wait_step(api, job["id"], 3)
        group["node1"].stop(signal.SIGKILL)
        wait_until(lambda: api.client.get("/ready").status_code == 503, 30, "the group without host 1")
        status = lambda: api.client.get(f"/jobs/{job['id']}").json()["status"]  # noqa: E731
        wait_until(lambda: status() == "queued", 30, "the job re-queued, waiting for the group")
        group["node1"] = Node1(hosts, group["node1_dir"], group["flags"])
        done = api.wait_job(job["id"], timeout=90)
        assert done["status"] == "completed" and done["attempts"] == 2, done
        assert done["resumed_from_step"] in range(2, 12, 2), done
        after = api.submit(prompt="after the host returned", num_inference_steps=2)
        assert api.wait_job(after["id"], timeout=60)["status"] == "completed"
    assert not os.path.exists(os.path.join(group["node1_dir"], "jobs.db"))
