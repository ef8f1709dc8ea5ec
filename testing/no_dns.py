"""A command run as on a box without DNS (tests/test_local_group.py, bench/startup_dns.py): in new UTS,
network and mount namespaces, with loopback up, a host name that is in no hosts file, and /etc/resolv.conf
pointing at a DNS server on 127.0.0.1 that records every question and either refuses it at once or never
answers (the resolver then waits out its timeout, as where no DNS server can be reached). Needs root,
util-linux's `unshare` and iproute2's `ip` (`unavailable()` says why not, for a skip)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

HOST = "ithaca-nowhere"

# Runs inside the namespaces: argv[1] a scratch folder, argv[2] the command (JSON), argv[3] "refuse" or
# "silent", argv[4] "1" to name the IPv4-mapped loopback address in /etc/hosts, argv[5] the timeout.
_BOX = """
import json, socket, subprocess, sys, threading, time
scratch, command, answer, name_loopback, timeout = sys.argv[1:6]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open(scratch + "/resolv.conf", "w") as f:
    f.write("nameserver 127.0.0.1\\n")
subprocess.run(["mount", "--bind", scratch + "/resolv.conf", "/etc/resolv.conf"], check=True)
if name_loopback == "1":
    with open("/etc/hosts") as f, open(scratch + "/hosts", "w") as g:
        g.write(f.read() + "\\n::ffff:127.0.0.1 ipv4-loopback\\n")
    subprocess.run(["mount", "--bind", scratch + "/hosts", "/etc/hosts"], check=True)
socket.sethostname(HOST)
asked = []
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))

def serve_dns():
    while True:
        q, peer = dns.recvfrom(4096)
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1 : i + 1 + q[i]].decode(errors="replace"))
            i += 1 + q[i]
        asked.append([".".join(labels), int.from_bytes(q[i + 1 : i + 3], "big")])
        if answer == "refuse":
            dns.sendto(q[:2] + bytes([q[2] | 0x80, 0x05]) + q[4:], peer)  # a response, RCODE 5: refused

threading.Thread(target=serve_dns, daemon=True).start()
start = time.monotonic()
try:
    done = subprocess.run(json.loads(command), capture_output=True, text=True, timeout=float(timeout))
    rc, out, err = done.returncode, done.stdout, done.stderr
except subprocess.TimeoutExpired as e:
    rc, out, err = None, "", (e.stderr or b"").decode(errors="replace")
seconds = time.monotonic() - start
print(json.dumps({"rc": rc, "seconds": seconds, "out": out[-3000:], "err": err[-3000:], "asked": asked}))
""".replace("HOST", repr(HOST))


@dataclass
class Run:
    rc: int | None  # None: still running at the timeout (then killed)
    seconds: float
    out: str  # the command's standard output, its end
    err: str  # and its standard error
    asked: list  # [name, type] of every DNS question, in order


def unavailable() -> str | None:
    """Why the namespaces cannot be made here, or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs util-linux's unshare and iproute2's ip"
    if os.geteuid() != 0:
        return "namespaces need root"
    probe = subprocess.run(["unshare", "--uts", "--net", "--mount", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot create namespaces: {probe.stderr.strip()}"


def run_without_dns(
    argv: list[str], scratch, *, answer: str = "refuse", name_loopback: bool = False, timeout: float = 60.0
) -> Run:
    """`argv` on a box without DNS (see the module's text); `scratch` an existing folder for its files."""
    box = os.path.join(scratch, "no_dns_box.py")
    with open(box, "w") as f:
        f.write(_BOX)
    done = subprocess.run(
        ["unshare", "--uts", "--net", "--mount", sys.executable, box, str(scratch), json.dumps(argv), answer,
         "1" if name_loopback else "0", str(timeout)],
        capture_output=True, text=True, timeout=timeout + 30,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the namespaces did not run the command: {done.stderr[-3000:]}")
    return Run(**json.loads(done.stdout.splitlines()[-1]))
