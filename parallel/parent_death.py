"""The kernel's parent-death signal (Linux): a process that must not outlive the one that started it asks
for it, or its parent asks for it between fork and exec (`preexec_fn`). The launcher's ranks, the launcher
of `generate`'s and `parity`'s runs, and the worker group of `serve` use it, so a `kill -9` of the command
ends what it started instead of leaving ranks computing on (or claiming jobs) with no one to answer to."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
# Loaded here, not in the call: the call runs in `preexec_fn`, between fork and exec, where loading a library
# could deadlock on a lock another thread of the parent held at the fork.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent dies. `parent`: the pid the caller expects
    as its parent (default: the current one); if that parent is already gone, `sig` is sent at once.
    Returns False where the platform has no parent-death signal (the store-side checks still apply)."""
    if _LIBC is None:
        return False
    parent = os.getppid() if parent is None else parent
    if _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True


def with_parent() -> dict:
    """Popen's arguments for a child that dies with this process (SIGKILL), asked before it runs anything."""
    parent = os.getpid()
    return {"preexec_fn": lambda: die_with_parent(parent)}
