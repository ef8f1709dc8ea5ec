"""Runs the worker group as a torchrun child of the API process and keeps it alive.

- Launch: `python -m torch.distributed.run --standalone --nproc-per-node N -m server.worker <settings>`
  with a fresh group id in its environment (jobs it claims are tagged `<instance>/<group>/replica<k>`; a
  reset finds every rank by that id, as torchrun puts each rank in a session of its own).
- torchrun dies with the API process (parent-death signal, bound to the supervisor thread, which therefore
  lives as long as the group) and every rank with torchrun, so no group outlives its server.
- A group that exits (a rank killed, a crash, a reset) has the jobs it was running re-queued (they resume
  from their checkpoints) or, past `max_attempts`, failed with its exit code and first error; it is
  forgotten in the store and started again. Restarts are counted; `restart_budget` groups
  in a row that die before they were ever ready mean the failure is fatal: `on_fatal` ends the server so the
  container's restart policy applies, and `fatal` quotes the first error a rank of the last group recorded.
- A job past `job_timeout` is failed and the group is killed and restarted (a hung collective cannot be
  interrupted any other way).
- `stop(grace)`: drain (the leader stops claiming and exits once its running job is done), then kill what
  is left.
- At start, groups an earlier server of this instance left behind are asked to drain (they stop claiming),
  and jobs this instance left in_progress in a previous run are re-queued (or failed after max_attempts).
  While running, jobs of any server sharing the store whose worker sent no heartbeat for `orphan_timeout`
  seconds are re-queued the same way (a replica that vanished for good), and such workers' rows are pruned.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from server import videos
from server.config import ServeConfig
from server.lifetime import die_with_parent
from server.store import JobStore, StoreBusy

log = logging.getLogger("ithaca.supervisor")
FRESH_HEARTBEAT_S = 5.0
ORPHAN_SWEEP_S = 5.0


def group_ready(store: JobStore, *, group_id: str | None = None) -> bool:
    """Every replica of the group (or, attached, of any group) has a fresh heartbeat and is serving."""
    workers = [
        w
        for w in store.workers(group_id=group_id)
        if w["state"] in ("ready", "busy") and time.time() - w["heartbeat_at"] < FRESH_HEARTBEAT_S
    ]
    if not workers:
        return False
    return group_id is None or len(workers) == workers[0]["info"].get("dp_size", 1)


def _pids_with_env(entry: str) -> list[int]:
    """Processes of this user whose environment holds `entry` (Linux /proc; empty elsewhere)."""
    needle, pids = entry.encode(), []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except (OSError, ValueError):
            continue
    return pids


class Supervisor:
    def __init__(self, config: ServeConfig, store: JobStore, on_fatal):
        self.config, self.store, self.on_fatal = config, store, on_fatal
        self.restarts = 0
        self._last_sweep = 0.0
        self.group_id: str | None = None
        self.fatal: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def start(self) -> None:
        for group in {w["group_id"] for w in self.store.workers(instance=self.config.instance)}:
            self.store.request_drain(group)  # a killed server's group must not claim beside ours
        for job in self.store.in_progress(instance=self.config.instance):
            self._requeue(job, "interrupted when the server stopped while it ran")
        self._thread.start()

    def ready(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None and group_ready(self.store, group_id=self.group_id)

    def _worker_prefix(self) -> str:
        return f"{self.config.instance}/{self.group_id}/"

    def _launch(self) -> None:
        self.group_id = uuid.uuid4().hex[:12]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(self.config.nproc),
            "--max-restarts",
            "0",
            "-m",
            "server.worker",
            *self.config.worker_argv(),
        ]
        log.info("starting worker group %s: %s", self.group_id, " ".join(cmd))
        env = os.environ | {"ITHACA_GROUP_ID": self.group_id, "ITHACA_SUPERVISOR_PID": str(os.getpid())}
        self._proc = subprocess.Popen(
            cmd,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the API only
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )

    def _kill_group(self, sig=signal.SIGKILL) -> None:
        """Signal torchrun and every rank (torchrun starts each rank in a session of its own)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        for pid in [self._proc.pid, *_pids_with_env(f"ITHACA_GROUP_ID={self.group_id}")]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _loop(self) -> None:
        failures_in_a_row = 0
        while not self._stopping.is_set():
            self._launch()
            was_ready = False
            while self._proc.poll() is None and not self._stopping.is_set():
                if not was_ready and self.ready():
                    was_ready, failures_in_a_row = True, 0
                    log.info("worker group %s is ready", self.group_id)
                try:
                    self._enforce_time_limit()
                    self._sweep_orphans()
                except StoreBusy as e:  # try again next round; this thread must outlive the group
                    log.warning("supervisor: %s", e)
                time.sleep(0.2)
            if self._stopping.is_set():
                self._proc.wait()  # `stop` ends the group; torchrun would die with this thread
                return
            code = self._proc.wait()
            error = self.store.group_error(self.group_id)
            for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
                self._requeue(job, f"the worker group exited (code {code}) while running it"
                              + (f": {error}" if error else ""))  # fmt: skip
            self.restarts += 1
            failures_in_a_row += 0 if was_ready else 1
            self.store.forget_group(self.group_id)
            log.error(
                "worker group %s exited with code %s (restart %d)%s",
                self.group_id, code, self.restarts, f": {error}" if error else "",
            )  # fmt: skip
            if failures_in_a_row >= self.config.restart_budget:
                self.fatal = (
                    f"the worker group failed {failures_in_a_row} times in a row before becoming ready; "
                    f"the last time: {error or f'exit code {code}, see the log above'}"
                )
                log.critical("%s; stopping the server", self.fatal)
                self.on_fatal()
                return

    def _sweep_orphans(self) -> None:
        """Re-queue (or fail) running jobs whose worker stopped answering, also those another server sharing
        the store claimed and then vanished with: otherwise they would stay in_progress forever."""
        now = time.monotonic()
        if now - self._last_sweep < ORPHAN_SWEEP_S:
            return
        self._last_sweep = now
        stale = self.config.orphan_timeout
        self.store.prune_workers(stale_after=stale)
        for job in self.store.orphans(stale_after=stale):
            log.warning(
                "job %s: its worker %s sent no heartbeat for %g s; re-queueing", job.id, job.worker, stale
            )
            self._requeue(job, f"its worker {job.worker} stopped answering (no heartbeat for {stale:g} s)")

    def _requeue(self, job, reason: str) -> None:
        """Re-queue an interrupted job, or fail it past its attempts: then its checkpoint goes too."""
        after = self.store.requeue_or_fail(job, max_attempts=self.config.max_attempts, reason=reason)
        if after is not None and after.terminal:
            videos.remove_checkpoint(self.config.videos_dir, job.id)

    def _enforce_time_limit(self) -> None:
        now = time.time()
        for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
            if job.started_at is not None and now - job.started_at > self.config.job_timeout:
                self.store.finish(
                    job.id,
                    None,
                    "failed",
                    error=f"exceeded the time limit of {self.config.job_timeout:g} s; "
                    "the worker group was reset",
                )
                videos.remove_checkpoint(self.config.videos_dir, job.id)
                log.error("job %s exceeded the time limit; resetting the worker group", job.id)
                self._kill_group()

    def stop(self, grace: float) -> None:
        """Stop claiming, let the running job finish within `grace` seconds, then end the group."""
        self._stopping.set()
        if self.group_id is not None:
            self.store.request_drain(self.group_id)
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("the running job did not finish within %.0f s; stopping the worker group", grace)
                self._kill_group(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._kill_group()
                    proc.wait()
        if self.group_id is not None:
            for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
                self._requeue(job, "interrupted by a server shutdown")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
