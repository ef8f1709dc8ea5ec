"""torchrun for the ranks of one machine, with no host-name lookups: `local_torchrun(N) + ["-m", MODULE]`.

torch's launcher looks the machine's name up in DNS several times before the ranks start, and a lookup that
gets no answer costs the resolver's timeout (10 s with glibc's defaults): on a box that reaches no DNS server
`ithaca serve --nproc 1` took 55 s to get ready instead of 5, and where the host name resolves nowhere the
ranks never met at all (they were given that name as MASTER_ADDR). The ranks of one machine need no name:

- `--local-addr 127.0.0.1`: the rendezvous address handed to the ranks is loopback, not the machine's name;
- `socket.getfqdn` answers the plain host name in the launcher: torchrun labels each event it records with
  the fully qualified name (a lookup each), and its rendezvous takes that name only without `--local-addr`;
- GLOO_SOCKET_IFNAME=lo (unless set): gloo otherwise finds the address it listens on by resolving the host
  name; the ranks of one machine reach each other over loopback.

What stays is torch's own C++ store client, which looks up the name of a loopback address once per connection
(the launcher's, then every rank's at once): on a box without DNS, give `::ffff:127.0.0.1` a name in
/etc/hosts or shorten the resolver's wait with RES_OPTIONS (README, "Start-up without DNS")."""

from __future__ import annotations

import os
import socket
import sys

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"  # Linux's name for it


def local_torchrun(nproc: int) -> list[str]:
    """The command that starts `nproc` ranks on this machine; append `-m MODULE ARGS...` as to torchrun."""
    return [sys.executable, "-m", "parallel.torchrun", "--standalone", "--local-addr", LOOPBACK,
            f"--nproc-per-node={nproc}"]  # fmt: skip


def _host_name(name: str = "") -> str:
    return name or socket.gethostname()


def main() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_INTERFACE)
    socket.getfqdn = _host_name  # this launcher process only; the ranks are processes of their own
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:])


if __name__ == "__main__":
    main()
