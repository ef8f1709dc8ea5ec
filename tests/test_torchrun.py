"""One machine's ranks start without looking any host name up (parallel.torchrun): on a box without DNS
(testing/no_dns.py: a host name in no hosts file, a DNS server that refuses every question at once) a
2-rank gloo launch meets and sums, and no question asks for the host name. torch's own launcher hangs there
(it hands the ranks the unresolvable name as the rendezvous address)."""

from __future__ import annotations

import pytest

from testing.no_dns import HOST, run_without_dns, unavailable

RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.path.dirname(__file__), f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"{os.environ['MASTER_ADDR']} {float(t)}")
dist.destroy_process_group()  # a gloo group left to the interpreter's exit may abort
"""


def test_one_machines_ranks_start_without_host_name_lookups(tmp_path):
    if reason := unavailable():
        pytest.skip(f"a box without DNS cannot be made here: {reason}")
    from parallel.torchrun import local_torchrun

    (tmp_path / "rank.py").write_text(RANK)
    run = run_without_dns([*local_torchrun(2), str(tmp_path / "rank.py")], tmp_path, timeout=60)
    assert run.rc == 0, run.err
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["127.0.0.1 3.0"] * 2
    # torch's C++ store client asks for a loopback address's name (PTR 1.0.0.127.in-addr.arpa): not ours
    assert not [q for q in run.asked if q[0].split(".")[0] == HOST], run.asked


def test_a_slow_loopback_lookup_is_named_in_the_log(monkeypatch):
    """The launcher times the lookup torch's store client makes at every rank's start (a DNS server that
    does not answer makes it wait the resolver's timeout) and says what to add to /etc/hosts."""
    import socket
    import time

    from parallel import torchrun

    said = []
    monkeypatch.setattr(socket, "getnameinfo", lambda *a: time.sleep(0.2) or ("ipv4-loopback", "0"))
    assert torchrun.time_loopback_lookup(said.append, slow_s=0.1) >= 0.2
    assert len(said) == 1 and "'::ffff:127.0.0.1 ipv4-loopback' to /etc/hosts" in said[0]
    monkeypatch.setattr(socket, "getnameinfo", lambda *a: ("ipv4-loopback", "0"))
    torchrun.time_loopback_lookup(said.append, slow_s=0.1)
    assert len(said) == 1
