"""One machine's ranks without torchrun: `local_group(N) + ["-m", MODULE, ARGS...]` (or a script and its
arguments) starts N processes joined as torchrun joins them, and ends them all when one fails.

torch's launcher imports torch and sets up an elastic agent before the first rank starts: 2.5 s of wall and
2.3 s of CPU for a trivial rank on a 2-core CPU box, paid again at every worker group start and restart and
before every `generate --nproc N`. This launcher imports no torch (0.1 s to a one-rank `python -c pass`, the
rank included) and gives each rank torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR/PORT; OMP_NUM_THREADS=1 unless set, as torchrun sets it for more than one rank;
TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set, as torchrun), with loopback as the rendezvous address and gloo's
interface (GLOO_SOCKET_IFNAME=lo unless set), so nothing looks the machine's name up (README, "Start-up
without DNS"); it times the loopback-name lookup torch's store client makes and warns when no DNS server
answers. The rendezvous store is rank 0's: this launcher binds and listens on a loopback port the kernel picks
and hands the socket to rank 0 (ITHACA_STORE_FD), whose `parallel.init_parallel` serves the store on it, so no
other process can take the port between its choice and its use; the other ranks connect to it
(ITHACA_LOCAL_GROUP tells `init_parallel` to). Ranks join through `parallel.init_parallel`, not a plain
`env://` (which would bind the port again).

Like torchrun: each rank runs in a session of its own; a rank that fails (a non-zero exit, a signal) has the
others sent SIGTERM, then SIGKILL after TERM_GRACE_S, and the launcher exits 1, or 128 + N when signal N
ended the rank (137: SIGKILL, the kernel's out-of-memory killer's too). Exit code 2 apart: a mistake
in the command every rank meets (said by rank 0 alone, so once), the others get MISTAKE_GRACE_S to end by
themselves, and when all end with 2 so does the launcher, with nothing of its own to say. SIGTERM, SIGINT or
SIGHUP to the launcher is passed on to every rank as SIGTERM. A group across machines still uses torchrun's
c10d rendezvous (`parallel.torchrun`)."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from parallel.parent_death import with_parent

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"  # Linux's name for it
MAPPED_LOOPBACK = "::ffff:127.0.0.1"  # the address whose name torch's store client looks up
SLOW_LOOKUP_S = 1.0
TERM_GRACE_S = 30.0  # torchrun's: a rank sent SIGTERM is killed this long after
MISTAKE = 2  # a rank's exit code for a mistake in the command line (argparse's)
MISTAKE_GRACE_S = 10.0  # for the other ranks to meet it too, rank 0 saying it
POLL_S = 0.05


def _say(text: str) -> None:
    print(f"parallel.local_group: warning: {text}", file=sys.stderr, flush=True)


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


def launched(environ=os.environ) -> bool:
    """Whether this process is a rank of a launch: this launcher and torchrun both set RANK and WORLD_SIZE.
    A WORLD_SIZE left in a shell alone is not one (it ran `generate --nproc 2` on one rank)."""
    return "RANK" in environ and "WORLD_SIZE" in environ


def world_size(environ=os.environ) -> int | None:
    """This launch's ranks, or None when this process is no rank of one (`launched`)."""
    return int(environ["WORLD_SIZE"]) if launched(environ) else None


def local_group(nproc: int, quiet: bool = False) -> list[str]:
    """The command that starts `nproc` ranks on this machine; append `-m MODULE ARGS...` or a script.
    `quiet`: the launcher says nothing of its own (a caller that logs in its own format says it: a failed
    rank's exit is the group's, the slow loopback lookup `time_loopback_lookup`)."""
    return [sys.executable, "-m", "parallel.local_group", f"--nproc={nproc}", *(["--quiet"] if quiet else [])]


def check_start_folder(packages: Iterable[str], folder: Path | None = None) -> None:
    """ValueError when `folder` (the working folder: where the ranks start) holds one of `packages` other than
    the one this process runs: `python -m` puts that folder first on a rank's import path, so the ranks
    would run its code (an older checkout, a project's own `server/`) beside this process's own. The same
    code elsewhere (an image's sources beside its installed copy) is no other."""
    if os.environ.get("PYTHONSAFEPATH"):  # the ranks' import path leaves the folder out
        return
    folder = Path.cwd() if folder is None else folder
    for name in packages:
        ours = Path(importlib.import_module(name).__file__).parent.resolve()
        for there in (folder / name / "__init__.py", folder / f"{name}.py"):
            if there.is_file() and there.parent.resolve() != ours and not _same_code(there.parent, ours):
                found = there.relative_to(folder)
                raise ValueError(
                    f"the folder this starts in, {folder}, holds {found}: its ranks would import that "
                    f"instead of the {name} this runs ({ours}); start it from another folder"
                )


def _same_code(theirs: Path, ours: Path) -> bool:
    """Whether two package folders hold the same Python files, byte for byte."""

    def code(root: Path) -> dict[str, bytes]:
        return {str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*.py")}

    return theirs.is_dir() and code(theirs) == code(ours)


def rank_env(rank: int, nproc: int, port: int | None) -> dict[str, str]:
    """torchrun's variables for `rank` of a one-machine group (port None: one rank, no store to meet at)."""
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank), WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", GROUP_WORLD_SIZE="1", MASTER_ADDR=LOOPBACK,
                MASTER_PORT=str(port or 0), ITHACA_LOCAL_GROUP="1")  # fmt: skip


class Group:
    """The ranks of one launch: `start()`, then `wait()` for the launcher's exit code."""

    def __init__(self, nproc: int, command: list[str], quiet: bool = False):
        self.nproc, self.command, self.quiet = nproc, command, quiet
        self.procs: list[subprocess.Popen] = []
        self.stopping: int | None = None  # the signal the launcher was asked to stop by

    def start(self) -> None:
        env = dict(os.environ)
        # gloo finds the address it listens on by resolving the host name unless given an interface (a
        # resolver timeout where no DNS answers), even in a one-rank group's groups
        env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_INTERFACE)
        # as torchrun: an NCCL error or timeout ends the rank (the group then ends, and is started again)
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        listener = None
        if self.nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
            listener = socket.create_server((LOOPBACK, 0), backlog=max(128, self.nproc))
            if not self.quiet:
                threading.Thread(target=time_loopback_lookup, name="loopback-lookup", daemon=True).start()
        port = listener.getsockname()[1] if listener else None
        try:
            for rank in range(self.nproc):
                if self.stopping is not None:  # a signal while starting: start no more
                    break
                mine = env | rank_env(rank, self.nproc, port)
                fds = ()
                if listener is not None and rank == 0:
                    fds = (listener.fileno(),)
                    mine["ITHACA_STORE_FD"] = str(listener.fileno())
                proc = subprocess.Popen(  # a launcher killed with SIGKILL takes its ranks along
                    self.command, env=mine, pass_fds=fds, start_new_session=True, **with_parent()
                )
                self.procs.append(proc)
        except BaseException:
            self.terminate(signal.SIGKILL)
            raise
        finally:
            if listener is not None:
                listener.close()  # rank 0 holds it now
        if self.stopping is not None:
            self.terminate()

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, signum: int, _frame=None) -> None:
        self.stopping = signum
        self.terminate()

    def _settle(self, deadline: float) -> None:
        """Until every rank has ended, or `deadline` (time.monotonic())."""
        while any(proc.poll() is None for proc in self.procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def wait(self) -> int:
        while True:
            codes = [proc.poll() for proc in self.procs]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed or self.stopping is not None:
                break
            if all(code == 0 for code in codes):
                return 0
            time.sleep(POLL_S)
        if failed and self.stopping is None and all(code == MISTAKE for _, code in failed):
            self._settle(time.monotonic() + MISTAKE_GRACE_S)
            codes = [proc.poll() for proc in self.procs]
            if all(code == MISTAKE for code in codes):
                return MISTAKE
        if failed and self.stopping is None:
            rank, code = failed[0]
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            if not self.quiet:
                print(f"parallel.local_group: rank {rank} ended with {how}; stopping the others",
                      file=sys.stderr, flush=True)  # fmt: skip
            self.terminate()
        self._settle(time.monotonic() + TERM_GRACE_S)
        self.terminate(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        if self.stopping is not None:
            return 128 + self.stopping
        return 128 - failed[0][1] if failed[0][1] < 0 else 1  # a rank a signal ended: as a shell says it


USAGE = "usage: python -m parallel.local_group --nproc=N [--quiet] (-m MODULE | SCRIPT) [ARGS...]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    nproc, command = (argv[0].removeprefix("--nproc="), argv[1:]) if argv else ("", [])
    quiet = command[:1] == ["--quiet"]
    command = command[quiet:]
    if not (argv and argv[0].startswith("--nproc=") and nproc.isdigit() and int(nproc) >= 1 and command):
        print(f"{USAGE}\n{local_group.__doc__}", file=sys.stderr)
        return 2
    group = Group(int(nproc), [sys.executable, *command], quiet)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, group.stop)
    group.start()
    return group.wait()


if __name__ == "__main__":
    sys.exit(main())
