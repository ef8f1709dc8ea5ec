"""A pool of CPU processes joined in one gloo process group, reused across tests.

Spawning a fresh group per test costs seconds of `import torch` (and each rank's later imports and fits);
the pool starts each world size once and runs module-level functions on every rank, and its ranks fork
from a server process that imported torch once (`parallel.launch.forked_context`). The pools of 2 and 4
ranks, which most tests take in turns, stay up side by side, with one of any other size beside them. Every
collective runs under a short gloo timeout, and every call under a wall-clock deadline, so a mismatch fails
the test instead of hanging it. After any failure the pool is torn down and the next call starts a fresh one,
so one broken group never poisons later tests.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import socket
import time
import traceback
from datetime import timedelta

from parallel.launch import forked_context

COLLECTIVE_TIMEOUT_S = 15.0
POLL_S = 0.5  # between looks at whether a rank's process died


def _exit(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


class DistError(RuntimeError):
    """One or more ranks raised, or the call ran past its deadline; the message holds every traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dumps(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank: int, world_size: int, port: int, tasks, results) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ITHACA_DIST_TIMEOUT=str(COLLECTIVE_TIMEOUT_S),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, _dumps(fn(*args, **kwargs))))
        except BaseException:  # noqa: BLE001 - every failure must reach the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class DistPool:
    def __init__(self, world_size: int):
        self.world_size = world_size
        ctx = forked_context()
        port = _free_port()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_worker, args=(r, world_size, port, self._tasks[r], self._results), daemon=True
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self.healthy = True

    def run(self, fn, *args, timeout: float = 120.0, **kwargs) -> list:
        """Run fn(*args, **kwargs) on every rank; return the per-rank results in rank order."""
        for q in self._tasks:
            q.put((fn, args, kwargs))
        deadline = time.monotonic() + timeout
        got: dict[int, object] = {}
        errors: dict[int, str] = {}
        peers_told = False  # a rank failed: its peers get a collective's timeout to end too
        while len(got) + len(errors) < self.world_size and (left := deadline - time.monotonic()) > 0:
            try:
                rank, ok, payload = self._results.get(timeout=min(left, POLL_S))
            except queue.Empty:  # a rank whose process died (a signal: SIGFPE, SIGSEGV) never answers
                for rank, proc in enumerate(self._procs):
                    if proc.exitcode is not None and rank not in got and rank not in errors:
                        errors[rank] = f"its process died: {_exit(proc.exitcode)}\n"
            else:
                if ok:
                    got[rank] = _loads(payload)
                else:
                    errors[rank] = payload
            if errors and not peers_told:  # they may be stuck until their collective times out
                peers_told, deadline = True, min(deadline, time.monotonic() + COLLECTIVE_TIMEOUT_S + 5.0)
        if errors or len(got) < self.world_size:
            self.close()
            missing = sorted(set(range(self.world_size)) - got.keys() - errors.keys())
            parts = [f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items())]
            if missing:
                parts.append(f"ranks {missing} gave no result within the deadline")
            raise DistError("\n".join(parts))
        return [got[r] for r in range(self.world_size)]

    def close(self) -> None:
        self.healthy = False
        for q in self._tasks:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)


KEPT = (2, 4)  # world sizes whose pools stay up beside the others
_POOLS: dict[int, DistPool] = {}


def run_distributed(world_size: int, fn, *args, timeout: float = 120.0, **kwargs) -> list:
    """Run a module-level function on `world_size` gloo ranks (a live pool of that size, reused)."""
    pool = _POOLS.get(world_size)
    if pool is None or not pool.healthy:
        others = () if world_size in KEPT else [size for size in _POOLS if size not in KEPT]
        for size in {world_size, *others} & _POOLS.keys():
            _POOLS.pop(size).close()
        pool = _POOLS[world_size] = DistPool(world_size)
    return pool.run(fn, *args, timeout=timeout, **kwargs)


def shutdown() -> None:
    while _POOLS:
        _POOLS.popitem()[1].close()
