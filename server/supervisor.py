"""Runs the worker group as a child of the API process and keeps it alive.

- Launch: `python -m parallel.local_group --nproc=N -m server.worker <settings>` (one machine's ranks,
  without torchrun's agent: no torch imported before the ranks start) with a fresh group id in its environment
  (jobs it claims are tagged `<instance>/<group>/replica<k>`; a reset finds every rank by that id, as the
  launcher puts each rank in a session of its own).
- Across machines (--nnodes > 1): each machine runs `ithaca serve` and launches its own N ranks with
  torchrun (`parallel.torchrun`): `--nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT`;
  node 0 (this class: API, store, supervision) hosts the rendezvous and, by the worker's numbering, the
  replica leader; the other nodes run `--no-api` (`NodeShare`): they only launch their share again whenever
  it exits. A rank lost on any machine fails the whole group (its collectives break), so node 0 re-queues the
  job and launches again, and the group forms once every node has joined the new rendezvous.
- The launcher dies with the API process (parent-death signal, bound to the supervisor thread, which
  therefore lives as long as the group) and every rank with the launcher, so no group outlives its server.
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
  seconds are re-queued the same way (server/orphans.py), and such workers' rows are pruned.
- A job-store outage costs a wait: every store call is retried up to --store-outage-grace
  (server/store/retry.py), and a round that still fails is tried again.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import uuid

from parallel.local_group import MISTAKE, local_group, time_loopback_lookup
from parallel.parent_death import with_parent
from parallel.torchrun import torchrun
from server import videos
from server.config import ServeConfig
from server.lifetime import running
from server.orphans import OrphanSweep, requeue
from server.store import JobStore, StoreBusy
from server.store.postgres import redact
from server.store.retry import PatientStore, StoreOutage

log = logging.getLogger("ithaca.supervisor")
FRESH_HEARTBEAT_S = 5.0
RDZV_ID = "ithaca"  # the rendezvous of a group across machines: one per --rdzv-endpoint (node 0's store)
RELAUNCH_STABLE_S = 60.0  # a worker-only node's share that ran this long did not fail to start
RELAUNCH_MAX_S = 60.0  # the longest pause of its backoff


def group_ready(store: JobStore, *, group_id: str | None = None) -> bool:
    """Every replica of the group (or, attached, of any group) has a fresh heartbeat and is serving."""
    return serving(store.workers(group_id=group_id), whole=group_id is not None)


def _fresh(heartbeat_at: float) -> bool:
    return time.time() - heartbeat_at < FRESH_HEARTBEAT_S


def serving(workers: list[dict], *, whole: bool) -> bool:
    """`workers` (rows of `JobStore.workers`) have fresh heartbeats and serve; `whole`: all of one group's
    replicas."""
    fresh = [w for w in workers if w["state"] in ("ready", "busy") and _fresh(w["heartbeat_at"])]
    if not fresh:
        return False
    return not whole or len(fresh) == fresh[0]["info"].get("dp_size", 1)


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


def _quiet_launcher(config: ServeConfig) -> bool:
    """In JSON logs the local launcher says nothing of its own (a plain line would break them); this log says
    it instead."""
    return config.nnodes == 1 and config.log_format == "json"


def launcher_argv(config: ServeConfig) -> list[str]:
    """The launcher of this machine's share of the group: the whole group (`parallel.local_group`), or with
    --nnodes > 1 one node of a c10d rendezvous that node 0's torchrun (`parallel.torchrun`) hosts at
    --rdzv-endpoint, no restarts (the supervisor restarts the group)."""
    if config.nnodes == 1:
        return local_group(config.nproc, quiet=_quiet_launcher(config))
    host = "1" if config.node_rank == 0 else "0"  # node 0 serves the rendezvous store, the others join it
    return [
        *torchrun(), "--nnodes", str(config.nnodes), "--node-rank", str(config.node_rank), "--nproc-per-node",
        str(config.nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", config.rdzv_endpoint,
        "--rdzv-id", RDZV_ID, "--rdzv-conf", f"is_host={host},join_timeout={config.rdzv_timeout:g}",
        *(["--local-addr", config.node_addr] if config.node_addr else []), "--max-restarts", "0",
    ]  # fmt: skip


def compile_cache(config: ServeConfig) -> str:
    """Where the ranks keep `--compile`'s compiled graphs (inductor's cache, unless TORCHINDUCTOR_CACHE_DIR
    says otherwise): under the data folder, so a restarted server, or a container given the same volume,
    finds them and its first job of a size runs near warm speed instead of compiling again."""
    return os.path.join(config.data_dir, "compile-cache")


def launch_group(config: ServeConfig, group_id: str) -> subprocess.Popen:
    """Start this machine's share of the worker group (its launcher), as a child that dies with this thread.
    The ranks learn their node from ITHACA_NODE_RANK (the worker numbers them by it, see
    `parallel.launch.number_ranks_by_node`); ITHACA_GROUP_ID finds them again (`kill_group`)."""
    cmd = [*launcher_argv(config), "-m", "server.lifetime", "server.worker", *config.worker_argv()]
    log.info("starting worker group %s: %s", group_id, redact(" ".join(cmd)))  # a --store URL's password
    if _quiet_launcher(config) and config.nproc > 1:
        threading.Thread(target=time_loopback_lookup, args=(log.warning,), daemon=True).start()
    env = (
        {"TORCHINDUCTOR_CACHE_DIR": compile_cache(config)}
        | os.environ
        | {
            "ITHACA_GROUP_ID": group_id,
            "ITHACA_SUPERVISOR_PID": str(os.getpid()),
            "ITHACA_NNODES": str(config.nnodes),
            "ITHACA_NODE_RANK": str(config.node_rank),
        }
    )
    return subprocess.Popen(
        cmd,
        env=env,
        start_new_session=True,  # Ctrl-C reaches the API only
        **with_parent(),
    )


def _exit_said(code: int) -> str:
    """The launcher's exit in words: -N, signal N ended it; 128 + N, signal N ended it or one of its ranks
    (`parallel.local_group` exits as a shell says it)."""
    if code < 0 and -code in signal.valid_signals():
        return f"its launcher was ended by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"code {code}: {signal.Signals(code - 128).name} ended the launcher or one of its ranks"
    return f"code {code}"


def _ended_here(row: dict) -> bool:
    """Whether a worker row's rank ran on this host and has ended: a server killed and started again at once
    (a restart policy) found its own dead group still fresh and warned of another server under its name."""
    info = row["info"]
    here = info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int)
    return here and not running(info["pid"])


def _in_a_row(n: int) -> str:
    return "once" if n == 1 else f"{n} times in a row"


def kill_group(proc: subprocess.Popen | None, group_id: str | None, sig=signal.SIGKILL) -> None:
    """Signal the launcher and every rank of this machine (each rank is in a session of its own)."""
    if proc is None or proc.poll() is not None:
        return
    for pid in [proc.pid, *_pids_with_env(f"ITHACA_GROUP_ID={group_id}")]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class NodeShare:
    """`ithaca serve --no-api` on a node other than 0: launches this machine's share of the group and
    launches it again each time it exits (a peer failed, node 0 reset or drained the group, the rendezvous
    timed out), until `stop`: after `relaunch_backoff` seconds, doubled after each exit within
    RELAUNCH_STABLE_S of its launch (a share that cannot start: a crash, settings the machines disagree on);
    `relaunch_budget` such exits in a row and it gives up, `fatal` saying why. It has no job store: node 0's
    supervisor re-queues the jobs."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.group_id: str | None = None
        self.starts = 0
        self.fatal: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        quick = 0  # exits in a row within RELAUNCH_STABLE_S of their launch
        while not self._stopping.is_set():
            self.group_id = uuid.uuid4().hex[:12]
            self._proc = launch_group(self.config, self.group_id)
            self.starts += 1
            started = time.monotonic()
            code = self._proc.wait()
            if self._stopping.is_set():
                return
            quick = quick + 1 if time.monotonic() - started < RELAUNCH_STABLE_S else 0
            if quick >= self.config.relaunch_budget:
                self.fatal = (f"this node's share of the worker group exited {_in_a_row(quick)} within "
                              f"{RELAUNCH_STABLE_S:g} s of its launch, the last time with code {code} (its "
                              "error is above)")  # fmt: skip
                log.critical("%s; giving up", self.fatal)
                return
            pause = min(self.config.relaunch_backoff * 2 ** max(quick - 1, 0), RELAUNCH_MAX_S)
            log.warning("this node's share of the worker group (%s) exited with code %s; starting it again "
                        "in %g s", self.group_id, code, pause)  # fmt: skip
            self._stopping.wait(pause)

    def stop(self, sig=signal.SIGTERM) -> None:
        """End this node's ranks (from a signal handler: no waiting here; `run` returns once they are gone).
        The group's other ranks then fail, and node 0 re-queues the running job."""
        self._stopping.set()
        kill_group(self._proc, self.group_id, sig)


class Supervisor:
    """Every store call rides out an outage (`PatientStore`, up to --store-outage-grace each); a round that
    still fails is logged and tried again, so the supervisor thread never ends on an error (the launcher
    would die with it), and a watchdog starts it again should it end anyway. While the store does not answer,
    /ready is 503 and /health says degraded, with the reason (`outage`)."""

    def __init__(self, config: ServeConfig, store: JobStore, on_fatal):
        self.config, self.on_fatal = config, on_fatal
        self.outage = StoreOutage(config.store_outage_grace, "supervisor")
        self.store = PatientStore(store, self.outage)
        self.restarts = 0
        self._sweep_orphans = OrphanSweep(config, self.store, self.outage)
        self.group_id: str | None = None
        self.fatal: str | None = None
        self._proc: subprocess.Popen | None = None
        self._group_ready = False  # as the last round found it: every replica of the group serving
        self._was_ready = False  # the running group was ready once
        self._heard_at: float | None = None  # its newest heartbeat (time.time())
        self._group_stopping = False  # as the last round found it: a replica said it is stopping
        self._group_warming = False  # ... a replica said it runs its --warmup generations
        self._reset_for: str | None = None  # the job whose time limit the group was killed for
        self._failures_in_a_row = 0
        self._stopping = threading.Event()
        self._hurried = threading.Event()  # `hurry`: a shutdown's wait for the running job ends
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    def start(self) -> None:
        instance = self.config.instance
        groups: dict[str, dict] = {}  # group → its newest row (the rows come newest first)
        for row in self.store.workers(instance=instance):
            groups.setdefault(row["group_id"], row)
        for group, row in groups.items():
            beat = row["heartbeat_at"]
            if _fresh(beat) and not self.store.drain_requested(group) and not _ended_here(row):
                log.warning(  # a group left behind, or another live server under the same name
                    "worker group %s of instance %r beat %.1f s ago and was not draining: asking it to drain "
                    "and re-queuing its jobs; if another server runs as %r, give each its own --instance "
                    "(ITHACA_INSTANCE)", group, instance, time.time() - beat, instance,
                )  # fmt: skip
            self.store.request_drain(group)  # a killed server's group must not claim beside ours
        for job in self.store.in_progress(instance=self.config.instance):
            requeue(self.config, self.store, job, "interrupted when the server stopped while it ran")
        self._thread.start()
        threading.Thread(target=self._watchdog, name="supervisor-watchdog", daemon=True).start()

    def ready(self) -> bool:
        proc = self._proc
        serving = proc is not None and proc.poll() is None and self._group_ready
        return serving and self.outage.since is None and not self._stopping.is_set()

    def unready(self) -> str:
        """Why the server does not serve now (while `ready()` is False), for /ready."""
        if self._stopping.is_set() and self.fatal is None:
            return (
                "the server is shutting down: it starts no job (the running one has --shutdown-grace to "
                "finish; the queued ones wait for another server)"
            )
        outage = self.fatal or self.outage.describe()
        if outage:
            return outage
        if self._group_stopping:
            return "the worker group is stopping (its server drains it, or another of its ranks failed)"
        silent = None if self._heard_at is None else time.time() - self._heard_at
        if self._was_ready and silent is not None and silent >= FRESH_HEARTBEAT_S:
            return (
                f"the worker group sent no heartbeat for {silent:.0f} s: it cannot write to the job store "
                "(a full disk? its log says) or it is stuck"
            )
        if self._group_warming:
            return "the worker group is warming up (--warmup: a first generation of each size)"
        return "the worker group is not serving (loading, or starting again after it exited)"

    def degraded(self) -> str | None:
        """Why the server cannot do its work now (None: it can), for /health: no secrets, no store URL."""
        if self.outage.since is not None:
            return self.outage.describe(detail=False)
        if not self._thread.is_alive() and not self._stopping.is_set() and self.fatal is None:
            return "the supervisor thread ended; the watchdog starts it again"
        return None

    def _worker_prefix(self) -> str:
        return f"{self.config.instance}/{self.group_id}/"

    def _launch(self) -> None:
        self.group_id = uuid.uuid4().hex[:12]
        self._proc = launch_group(self.config, self.group_id)

    def _kill_group(self, sig=signal.SIGKILL) -> None:
        kill_group(self._proc, self.group_id, sig)

    def _watchdog(self) -> None:
        """Start the supervisor thread again whenever it ends while the server runs: the launcher died with
        it, so the new thread's first round re-queues the group's job and launches another group."""
        while True:
            self._thread.join()
            if self._stopping.is_set() or self.fatal is not None:
                return
            log.critical("the supervisor thread ended unexpectedly; starting it again")
            self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._round():
                    return
            except StoreBusy:
                pass  # logged by the outage; the same round again: nothing is skipped, nothing done twice
            except Exception:
                log.exception("supervisor: a round failed; trying again")
            self._stopping.wait(0.2)
        if self._proc is not None:
            self._proc.wait()  # `stop` ends the group; the launcher would die with this thread

    def _round(self) -> bool:
        """Launch the group, watch it, or deal with its exit; True: the server must end."""
        if self._proc is None:
            self._launch()
        if self._proc.poll() is None:
            self._watch_group()
        elif not self._stopping.is_set():
            return self._group_exited(self._proc.returncode)
        return False

    def _watch_group(self) -> None:
        workers = self.store.workers(group_id=self.group_id)
        self._group_ready = serving(workers, whole=True)
        self._heard_at = max((w["heartbeat_at"] for w in workers), default=None)
        self._group_stopping = any(w["state"] == "stopping" for w in workers)
        self._group_warming = any(w["state"] == "warming" for w in workers)
        if self._group_ready and not self._was_ready:
            self._was_ready, self._failures_in_a_row = True, 0
            log.info("worker group %s is ready", self.group_id)
        self._enforce_time_limit()
        self._sweep_orphans()

    def _group_exited(self, code: int) -> bool:
        """Re-queue the exited group's jobs and forget it (a round that fails here does it all again: the
        restart is counted once the store has it all); True: it failed too often, the server must end."""
        self._group_ready = self._group_warming = False
        error = self.store.group_error(self.group_id)
        # its ranks found a mistake in the model's files or settings as they loaded: no start again mends it
        mistake = code == MISTAKE and not self._was_ready
        # drained as asked, and not by this server: by another that starts under the same --instance
        taken = code == 0 and self.store.drain_requested(self.group_id)
        why = f"the worker group exited ({_exit_said(code)}) while running it" + (
            f": {error}" if error else ""
        )
        for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
            requeue(self.config, self.store, job, why, gone=True)
        self.store.forget_group(self.group_id)
        self.restarts += 1
        self._failures_in_a_row += 0 if self._was_ready else 1
        self._proc, self._was_ready = None, False
        reset, self._reset_for = self._reset_for, None
        if taken:
            log.warning(
                "worker group %s stopped: another server started as instance %r and asked it to drain; "
                "starting it again (restart %d). Give each server its own --instance (ITHACA_INSTANCE)",
                self.group_id, self.config.instance, self.restarts,
            )  # fmt: skip
        elif reset is not None:  # ours: it read as a crash ("ended by SIGKILL"), an error
            log.warning("worker group %s was reset for job %s's time limit; starting it again (restart %d)",
                        self.group_id, reset, self.restarts)  # fmt: skip
        else:
            log.error(
                "worker group %s exited (%s; restart %d)%s",
                self.group_id, _exit_said(code), self.restarts, f": {error}" if error else "",
            )  # fmt: skip
        if self._failures_in_a_row < self.config.restart_budget and not mistake:
            return False
        self.fatal = (
            f"the worker group cannot start: {error or 'see the log above'}"
            if mistake
            else f"the worker group failed {_in_a_row(self._failures_in_a_row)} before becoming ready; "
            f"the last time: {error or f'exit code {code}, see the log above'}"
        )
        log.critical("%s; stopping the server", self.fatal)
        self.on_fatal()
        return True

    def _enforce_time_limit(self) -> None:
        """A job running past --job-timeout fails and the group is reset. A batch of N runs up to N times one
        job's time (its forwards are shared, its decodes one after another), so its jobs have N times the
        limit: the later ones, waiting for the earlier ones' decodes, failed where they fit it alone."""
        now = time.time()
        for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
            limit = self.config.job_timeout * max(1, job.batch or 1)
            if job.started_at is not None and now - job.started_at > limit:
                self.store.finish(
                    job.id,
                    None,
                    "failed",
                    error=f"exceeded the time limit of {limit:g} s; the worker group was reset",
                    timings=job.timings_until(now),
                )
                videos.remove_checkpoint(self.config.videos_dir, job.id)
                log.error("job %s exceeded the time limit; resetting the worker group", job.id)
                self._reset_for = job.id
                self._kill_group()

    def hurry(self) -> None:
        """A second Ctrl-C (or SIGTERM) while `stop` waits: the group goes now and its job is re-queued."""
        self._hurried.set()

    def stop(self, grace: float) -> None:
        """Stop claiming, let the running job finish within `grace` seconds (or until `hurry`), then end the
        group; at once without a running job (a group still loading its model or warming up would have
        been waited for, and its drain said "the running job has 300 s")."""
        if self._stopping.is_set():  # drained already (the HTTP server's drain, then the lifespan's stop)
            return
        self._stopping.set()
        running = []
        if self.group_id is not None:
            self.store.request_drain(self.group_id)  # first: a claim after the look below is re-queued
            running = self.store.in_progress(worker_prefix=self._worker_prefix())
        if running:
            log.info(
                "shutting down: no new jobs; the running job has %.0f s to finish (asked again, by Ctrl-C or "
                "SIGTERM: it stops now, to run again later)",
                grace,
            )
        else:
            log.info("shutting down: no job is running; stopping the worker group")
            grace = 0.0
        proc = self._proc
        if proc is not None:
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline and not self._hurried.is_set():
                self._hurried.wait(0.1)  # a short wait: the signal handler that hurries runs on this thread
            if proc.poll() is None:  # a rank's SIGTERM only drains, as the store already asked
                if running:
                    late = f"the running job did not finish within {grace:.0f} s"
                    log.warning(
                        "%s; stopping the worker group", "asked again" if self._hurried.is_set() else late
                    )
                self._kill_group()
                proc.wait()
        if self.group_id is not None:  # the group is gone: no late end of its run can come
            for job in self.store.in_progress(worker_prefix=self._worker_prefix()):
                requeue(
                    self.config, self.store, job, "interrupted by a server shutdown", counted=False, gone=True
                )
            self.store.group_stopped(self.group_id)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
