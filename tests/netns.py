"""Two "hosts" on one machine: network namespaces joined by a veth pair, for tests of a worker group across
machines (gloo between them goes over the veth link, as it would over a real network).

Host i is the namespace `ith<run>-<i>` with the link `eth0` (address 10.77.0.<i+1>/24) and its own loopback,
so each host has 127.0.0.1 to itself (an API on one host is not reachable from the other's loopback). The
names are unique per run; the addresses need not be (every pair of namespaces is its own network). Needs
root and iproute2's `ip` (`unavailable()` says why not, for a skip). Run a command on a host with
`hosts.argv(i, [...])` (`ip netns exec`), or start processes from this thread while `hosts.entered(i)`
(setns: the children inherit the namespace, and this thread's own sockets, an HTTP client's, are there too).

    with two_hosts() as hosts:
        subprocess.run(hosts.argv(1, ["python", "-c", "..."]))
        with hosts.entered(0):
            srv = ServerProcess(...)  # in host 0; its client talks to it from here

Everything is removed on leaving, also after a failure: deleting a namespace deletes its end of the link.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import uuid

CLONE_NEWNET = 0x40000000
IFNAME = "eth0"  # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on every host


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"ithprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Hosts:
    def __init__(self, count: int = 2):
        if count != 2:
            raise ValueError("one veth pair joins two hosts")
        run = uuid.uuid4().hex[:8]
        self.names = [f"ith{run}-{i}" for i in range(count)]
        self.addrs = [f"10.77.0.{i + 1}" for i in range(count)]
        self._made: list[str] = []

    def create(self) -> None:
        for name in self.names:
            _ip("netns", "add", name)
            self._made.append(name)
        a, b = self.names
        _ip("link", "add", IFNAME, "netns", a, "type", "veth", "peer", "name", IFNAME, "netns", b)
        for name, addr in zip(self.names, self.addrs, strict=True):
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", IFNAME)
            _ip("-n", name, "link", "set", IFNAME, "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def remove(self) -> None:
        while self._made:
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True)

    def argv(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run on host i."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    @contextlib.contextmanager
    def entered(self, i: int):
        """This thread in host i's network namespace until the block ends (processes it starts meanwhile
        stay there for good)."""
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.names[i]}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.names[i]}")
            try:
                yield
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back into the test's namespace")
        finally:
            os.close(target)
            os.close(home)


@contextlib.contextmanager
def two_hosts():
    hosts = Hosts(2)
    try:
        hosts.create()
        yield hosts
    finally:
        hosts.remove()
