"""torchrun without needless host-name lookups: `local_torchrun(N) + ["-m", MODULE]` starts one machine's
ranks; `python -m parallel.torchrun` takes torchrun's own options for a machine of a larger group.

torch's launcher looks the machine's name up in DNS several times before the ranks start, and a lookup that
gets no answer costs the resolver's timeout (10 s with glibc's defaults): on a box that reaches no DNS server
`ithaca serve --nproc 1` took 55 s to get ready instead of 5, and where the host name resolves nowhere the
ranks never met at all (they were given that name as MASTER_ADDR). Here:

- one machine's ranks get `--local-addr 127.0.0.1`: the rendezvous address handed to them is loopback, not
  the machine's name, and gloo uses the loopback interface (GLOO_SOCKET_IFNAME=lo unless set; otherwise it
  finds the address it listens on by resolving the host name);
- with `--local-addr` given (here, or `--node-addr` across machines) `socket.getfqdn` answers the plain host
  name in the launcher: torchrun then uses the fully qualified name only to label each event it records, a
  lookup each time.

What stays is torch's own C++ store client, which looks up the name of a loopback address once per connection
(the launcher's, then every rank's at once; a one-rank group skips its own, `parallel.mesh.init_parallel`):
on a box without DNS, give `::ffff:127.0.0.1` a name in /etc/hosts or shorten the resolver's wait with
RES_OPTIONS (README, "Start-up without DNS"). The launcher makes the same lookup beside them and says so in
its log when it was slow."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"  # Linux's name for it
MAPPED_LOOPBACK = "::ffff:127.0.0.1"  # the address whose name torch's store client looks up
SLOW_LOOKUP_S = 1.0


def torchrun() -> list[str]:
    """The launcher's command; append torchrun's options, then `-m MODULE ARGS...`."""
    return [sys.executable, "-m", "parallel.torchrun"]


def local_torchrun(nproc: int) -> list[str]:
    """The command that starts `nproc` ranks on this machine; append `-m MODULE ARGS...` as to torchrun."""
    return [*torchrun(), "--standalone", "--local-addr", LOOPBACK, f"--nproc-per-node={nproc}"]


def _host_name(name: str = "") -> str:
    return name or socket.gethostname()


def _say(text: str) -> None:
    print(f"parallel.torchrun: warning: {text}", file=sys.stderr, flush=True)


def time_loopback_lookup(warn=_say, slow_s: float = SLOW_LOOKUP_S) -> float:
    """Look up the name of the loopback address as torch's store client does at every connection, and warn
    when it took longer than `slow_s` (a DNS server that does not answer); returns the seconds."""
    start = time.monotonic()
    try:
        socket.getnameinfo((MAPPED_LOOPBACK, 0), 0)
    except OSError:
        pass  # no name, or no answer: the time is what counts
    seconds = time.monotonic() - start
    if seconds > slow_s:
        warn(f"looking up the name of {MAPPED_LOOPBACK} took {seconds:.1f} s: no DNS server answers here, "
             "and torch's store client waits as long at every rank's start; add the line "
             f"'{MAPPED_LOOPBACK} ipv4-loopback' to /etc/hosts (README, 'Start-up without DNS')")  # fmt: skip
    return seconds


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    options = argv[: argv.index("-m")] if "-m" in argv else argv
    if "--standalone" in options:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_INTERFACE)
        threading.Thread(target=time_loopback_lookup, name="loopback-lookup", daemon=True).start()
    if "--local-addr" in options:  # this launcher process only; the ranks are processes of their own
        socket.getfqdn = _host_name
    from torch.distributed.run import main as run

    run(argv)


if __name__ == "__main__":
    main()
