"""One machine's ranks start without looking any host name up (parallel.torchrun): run in namespaces of their
own, with a host name that is in no hosts file and a DNS server that records every question and refuses it
at once, a 2-rank gloo launch meets and sums, and no question asked for the host name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HOST = "ithaca-nowhere"

RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
with open(os.path.join(os.path.dirname(__file__), f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"{os.environ['MASTER_ADDR']} {float(t)}")
dist.destroy_process_group()
"""

# Runs as root in new UTS, network and mount namespaces: loopback up, the host name changed, resolv.conf
# pointing at a DNS server on 127.0.0.1 that logs each question's name and type and answers REFUSED.
BOX = """
import json, socket, subprocess, sys, threading
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
open(sys.argv[1] + "/resolv.conf", "w").write("nameserver 127.0.0.1\\n")
subprocess.run(["mount", "--bind", sys.argv[1] + "/resolv.conf", "/etc/resolv.conf"], check=True)
socket.sethostname(HOST)
asked = []
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))

def answer():
    while True:
        q, peer = dns.recvfrom(4096)
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1 : i + 1 + q[i]].decode(errors="replace"))
            i += 1 + q[i]
        asked.append([".".join(labels), int.from_bytes(q[i + 1 : i + 3], "big")])
        dns.sendto(q[:2] + bytes([q[2] | 0x80, 0x05]) + q[4:], peer)  # a response, RCODE 5: refused

threading.Thread(target=answer, daemon=True).start()
done = subprocess.run(json.loads(sys.argv[2]), capture_output=True, text=True, timeout=60)
print(json.dumps({"rc": done.returncode, "err": done.stderr[-3000:], "asked": asked}))
""".replace("HOST", repr(HOST))


def _unavailable() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs util-linux's unshare and iproute2's ip"
    if os.geteuid() != 0:
        return "namespaces need root"
    probe = subprocess.run(["unshare", "--uts", "--net", "--mount", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot create namespaces: {probe.stderr.strip()}"


def test_one_machines_ranks_start_without_host_name_lookups(tmp_path):
    if reason := _unavailable():
        pytest.skip(reason)
    from parallel.torchrun import local_torchrun

    (tmp_path / "rank.py").write_text(textwrap.dedent(RANK))
    (tmp_path / "box.py").write_text(BOX)
    launch = [*local_torchrun(2), str(tmp_path / "rank.py")]
    box = subprocess.run(
        ["unshare", "--uts", "--net", "--mount", sys.executable, str(tmp_path / "box.py"), str(tmp_path),
         json.dumps(launch)],
        capture_output=True, text=True, timeout=90, cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    assert box.returncode == 0, box.stderr[-3000:]
    run = json.loads(box.stdout.splitlines()[-1])
    assert run["rc"] == 0, run["err"]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["127.0.0.1 3.0"] * 2
    # torch's C++ store client asks for its loopback peer's name (PTR 1.0.0.127.in-addr.arpa): not ours
    names = {name for name, _ in run["asked"]}
    assert not {n for n in names if n.split(".")[0] == HOST}, run["asked"]
