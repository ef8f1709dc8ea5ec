"""One machine's ranks (parallel.local_group): they meet through rank 0's store on the launcher's socket,
with torchrun's environment, without looking any host name up (on a box without DNS, testing/no_dns.py: a
host name in no hosts file, a DNS server that refuses every question at once; torch's own launcher hangs
there, handing the ranks the unresolvable name); a rank that fails ends the others, and a signal to the
launcher reaches every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parallel.local_group import local_group
from testing.no_dns import HOST, run_without_dns, unavailable

RANK = """
import os, torch, torch.distributed as dist, parallel
parallel.init_parallel()
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
names = "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR OMP_NUM_THREADS".split()
with open(os.path.join(os.path.dirname(__file__), f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(" ".join(os.environ.get(n, "-") for n in names) + f" {float(t)}")
dist.destroy_process_group()  # a gloo group left to the interpreter's exit may abort
"""


def test_one_machines_ranks_meet_without_host_name_lookups(tmp_path):
    if reason := unavailable():
        pytest.skip(f"a box without DNS cannot be made here: {reason}")
    (tmp_path / "rank.py").write_text(RANK)
    run = run_without_dns([*local_group(2), str(tmp_path / "rank.py")], tmp_path, timeout=60)
    assert run.rc == 0, run.err
    got = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert got == [f"{r} {r} 2 2 127.0.0.1 1 3.0" for r in (0, 1)]
    # torch's C++ store client asks for a loopback address's name (PTR 1.0.0.127.in-addr.arpa): not ours
    assert not [q for q in run.asked if q[0].split(".")[0] == HOST], run.asked
    # one rank: no store at all, and gloo told its interface (it would look the host name up otherwise)
    one = run_without_dns([*local_group(1), str(tmp_path / "rank.py")], tmp_path, timeout=60)
    assert one.rc == 0 and one.asked == [], (one.err, one.asked)
    assert (tmp_path / "rank0.txt").read_text().startswith("0 0 1 1 127.0.0.1 ")


SLEEPER = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
signal.signal(signal.SIGTERM, lambda *_: (open(f"{sys.argv[1]}/term{rank}", "w").close(), sys.exit(0)))
open(f"{sys.argv[1]}/up{rank}", "w").close()
if rank == int(sys.argv[2]):  # once every rank is up (a rank not yet up would die of the SIGTERM)
    while not all(os.path.exists(f"{sys.argv[1]}/up{r}") for r in range(3)):
        time.sleep(0.01)
    sys.exit(3)
time.sleep(60)
"""


def _start(tmp_path, failing: int) -> subprocess.Popen:
    (tmp_path / "rank.py").write_text(SLEEPER)
    return subprocess.Popen([*local_group(3), str(tmp_path / "rank.py"), str(tmp_path), str(failing)],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_a_failed_rank_ends_the_others_and_a_signal_reaches_every_rank(tmp_path):
    launcher = _start(tmp_path, failing=1)
    assert launcher.wait(timeout=30) == 1
    assert "rank 1 ended with exit code 3; stopping the others" in launcher.stderr.read()
    assert sorted(p.name for p in tmp_path.glob("term*")) == ["term0", "term2"]
    for p in [*tmp_path.glob("term*"), *tmp_path.glob("up*")]:
        p.unlink()
    quiet = subprocess.run([*local_group(3, quiet=True), str(tmp_path / "rank.py"), str(tmp_path), "1"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert (quiet.returncode, quiet.stderr) == (1, "")  # serve's JSON logs: the server's log says it
    for p in [*tmp_path.glob("term*"), *tmp_path.glob("up*")]:
        p.unlink()
    launcher = _start(tmp_path, failing=-1)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("up*"))) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.glob("term*")) == ["term0", "term1", "term2"]


def test_a_rank_a_signal_ended_is_the_launchers_exit_code(tmp_path):
    """137 as a shell says it (SIGKILL: the out-of-memory killer's too); it was 1, and a job failed "the
    worker group exited (code 1)" of a killed rank, with nothing else to go on."""
    from server.supervisor import _exit_said

    (tmp_path / "rank.py").write_text(
        "import os, signal\nif os.environ['RANK'] == '1': os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([*local_group(2), str(tmp_path / "rank.py")], capture_output=True, timeout=30)
    assert killed.returncode == 128 + signal.SIGKILL
    assert _exit_said(killed.returncode) == "code 137: SIGKILL ended the launcher or one of its ranks"
    assert _exit_said(-9) == "its launcher was ended by SIGKILL" and _exit_said(1) == "code 1"  # it said -9


def test_a_command_killed_with_sigkill_takes_its_launcher_and_ranks_along(tmp_path):
    """`generate --nproc N` is a command (run_forwarding) over a launcher over ranks: a `kill -9` of the
    command, or of the launcher, left the ranks computing on with no one to answer to."""
    (tmp_path / "rank.py").write_text(SLEEPER)
    command = (
        "import sys; from dit.cli_args import run_forwarding; from parallel.local_group import local_group; "
        f"run_forwarding([*local_group(3), {str(tmp_path / 'rank.py')!r}, {str(tmp_path)!r}, '-1'])"
    )
    for killed in ("command", "launcher"):
        for p in tmp_path.glob("up*"):
            p.unlink()
        parent = subprocess.Popen([sys.executable, "-c", command])
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("up*"))) < 3:
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.02)
        processes = _processes_with(str(tmp_path))
        launcher = [pid for pid, line in processes.items() if "-m parallel.local_group" in line]
        assert len(processes) == 5 and len(launcher) == 1, processes  # the command, its launcher, 3 ranks
        os.kill(parent.pid if killed == "command" else launcher[0], signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _processes_with(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_with(str(tmp_path)) == {}, killed


def _processes_with(text: str) -> dict[int, str]:
    """Live processes whose command line holds `text`, by pid (Linux /proc)."""
    found = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in line and state != "Z":
            found[pid] = line
    return found


MISTAKEN = """
import os, sys, time
rank = int(os.environ["RANK"])
time.sleep(0.5 * (rank == 0))  # rank 1 meets the mistake first
if rank == 0:
    print("generate: error: the mistake", file=sys.stderr)
sys.exit(2)
"""


def test_a_mistake_every_rank_meets_is_said_once_with_its_exit_code(tmp_path):
    """Exit code 2 (a mistake in the command, said by rank 0 alone): the launcher used to stop rank 0 as soon
    as rank 1 met it, so the one line saying what was wrong never came, and it exited 1."""
    (tmp_path / "rank.py").write_text(MISTAKEN)
    launcher = subprocess.run([*local_group(2), str(tmp_path / "rank.py")], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    assert (launcher.returncode, launcher.stderr) == (2, "generate: error: the mistake\n")


def test_a_slow_loopback_lookup_is_named_in_the_log(monkeypatch):
    """The launcher times the lookup torch's store client makes at every rank's start (a DNS server that
    does not answer makes it wait the resolver's timeout) and says what to add to /etc/hosts."""
    import socket

    from parallel import local_group as launcher

    said = []
    monkeypatch.setattr(socket, "getnameinfo", lambda *a: time.sleep(0.2) or ("ipv4-loopback", "0"))
    assert launcher.time_loopback_lookup(said.append, slow_s=0.1) >= 0.2
    assert len(said) == 1 and "'::ffff:127.0.0.1 ipv4-loopback' to /etc/hosts" in said[0]
    monkeypatch.setattr(socket, "getnameinfo", lambda *a: ("ipv4-loopback", "0"))
    launcher.time_loopback_lookup(said.append, slow_s=0.1)
    assert len(said) == 1


def test_a_bad_command_line_says_how_to_call_it():
    for argv in ([], ["--nproc=0", "x.py"], ["--nproc=2"], ["--nproc", "2", "x.py"]):
        proc = subprocess.run([sys.executable, "-m", "parallel.local_group", *argv], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m parallel.local_group"), argv
