"""Processes that must not outlive their owner: the worker group's launcher (`parallel.local_group`, or
torchrun across machines) dies with the API process that started it, and every rank with its launcher,
through the kernel's parent-death signal (Linux). A `kill -9` of the API therefore ends the whole group within
moments, instead of leaving ranks that keep claiming jobs beside the next server's group.

A rank asks for the signal before it imports anything heavy (`python -m server.lifetime MODULE ARGS...` asks,
then runs MODULE as `python -m MODULE ARGS...` would), and then checks that its parent is still the launcher
its supervisor (ITHACA_SUPERVISOR_PID) started: a launcher killed before the rank asked is no longer its
parent, and no signal would come. Asked only once the worker had imported torch, as it once was, a launcher
killed in those seconds left ranks running on (20 s and more, measured)."""

from __future__ import annotations

import os
import runpy
import signal
import sys

from parallel.parent_death import die_with_parent


def running(pid: int) -> bool:
    """Whether a process of this pid runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal: it runs
        pass
    return True


def _parent_started_by(pid: int) -> bool:
    """Whether this process's parent is a child of `pid` (Linux /proc)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == pid  # the fields after "(name)": state, ppid
    except (OSError, ValueError, IndexError):
        return False


if __name__ == "__main__":  # python -m server.lifetime MODULE ARGS...
    supervisor = int(os.environ.get("ITHACA_SUPERVISOR_PID", "0"))
    if die_with_parent() and supervisor and not _parent_started_by(supervisor):
        os.kill(os.getpid(), signal.SIGKILL)  # the launcher (or its server) died before it was asked
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
