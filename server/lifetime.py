"""Processes that must not outlive their owner: the worker group's torchrun dies with the API process that
started it, and every rank with its torchrun, through the kernel's parent-death signal (Linux). A `kill -9`
of the API therefore ends the whole group within moments, instead of leaving ranks that keep claiming jobs
beside the next server's group."""

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
