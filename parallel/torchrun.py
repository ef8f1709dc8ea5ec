"""torch's launcher for a group across machines (`ithaca serve --nnodes M`, `generate` by hand), without
needless host-name lookups: `torchrun() + [torchrun's options, "-m", MODULE, ...]`. One machine's ranks start
without it (`parallel.local_group`).

torch's launcher looks the machine's name up in DNS several times before the ranks start, and a lookup that
gets no answer costs the resolver's timeout (10 s with glibc's defaults). With `--local-addr` given
(`--node-addr`) `socket.getfqdn` answers the plain host name in the launcher: torchrun then uses the fully
qualified name only to label each event it records, a lookup each time."""

from __future__ import annotations

import socket
import sys


def torchrun() -> list[str]:
    """The launcher's command; append torchrun's options, then `-m MODULE ARGS...`."""
    return [sys.executable, "-m", "parallel.torchrun"]


def _host_name(name: str = "") -> str:
    return name or socket.gethostname()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    options = argv[: argv.index("-m")] if "-m" in argv else argv
    if "--local-addr" in options:  # this launcher process only; the ranks are processes of their own
        socket.getfqdn = _host_name
    from torch.distributed.run import main as run

    run(argv)


if __name__ == "__main__":
    main()
