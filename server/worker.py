"""Worker group entry point, run on every rank under torchrun:

    python -m torch.distributed.run --nproc-per-node 2 -m server.worker --data-dir ithaca-data --preset tiny

Each data-parallel replica serves its own jobs. Its leader polls the job store, claims the oldest queued
job and broadcasts the spec over the replica's gloo control group; idle ranks wait there (the leader sends
a keep-alive while idle, so the wait never reaches the gloo timeout and never sits inside NCCL). Every
rank runs the pipeline; the leader records progress after each step, turns the job's cancel flag into the
callback's False, writes the MP4 and the terminal state. A drain request (store flag or SIGTERM) makes the
leader send "stop" once idle. Any failure other than a cancel leaves the group's state unknown: the leader
fails the job and every rank exits non-zero, so torchrun ends the group and the supervisor starts a fresh
one.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import signal
import sys
import threading
import time
import traceback
import uuid

import parallel
from dit.video import write_mp4
from server import limits as limits_mod
from server import metrics
from server.config import ServeConfig, add_arguments, from_args
from server.store import Job, JobStore

HEARTBEAT_S = 1.0
KEEPALIVE_S = 5.0
DRAIN_CHECK_S = 0.25


class Worker:
    def __init__(self, config: ServeConfig, group_id: str, mesh, pipe, module):
        self.config, self.group_id, self.mesh, self.pipe, self.module = config, group_id, mesh, pipe, module
        self.name = f"{config.instance}/{group_id}/replica{mesh.dp_rank}"
        self.stopping = threading.Event()
        self._beat_lock = threading.Lock()
        self.supervisor_pid = int(os.environ.get("ITHACA_SUPERVISOR_PID", "0"))
        self.state, self.job_id = "ready", None
        self.store = JobStore(config.db_path) if mesh.is_replica_leader else None
        described = limits_mod.describe(pipe.limits)
        self.info = {
            "limits": described,
            "defaults": limits_mod.defaults(described),
            "model": config.model,
            "dp_rank": mesh.dp_rank,
            "dp_size": mesh.dp_size,
            "world_size": mesh.world_size,
            "pid": os.getpid(),
        }

    # -- leader side ----------------------------------------------------------------------------------------

    def _beat(self) -> None:
        # state is read under the lock, so the final "stopped"/"failed" write is the last one
        with self._beat_lock:
            self.store.heartbeat(
                self.name,
                instance=self.config.instance,
                group_id=self.group_id,
                state=self.state,
                info=self.info | {"job": self.job_id},
            )

    def _heartbeat_loop(self) -> None:
        while self.state != "stopped":
            self._beat()
            time.sleep(HEARTBEAT_S)

    def _next_message(self):
        """Leader: block until there is something to broadcast (a job, a keep-alive None, or 'stop')."""
        idle_since = last_drain_check = time.monotonic()
        while True:
            now = time.monotonic()
            if now - last_drain_check > DRAIN_CHECK_S:
                last_drain_check = now
                if self.store.drain_requested(self.group_id) or not _alive(self.supervisor_pid):
                    self.stopping.set()  # asked to drain, or orphaned by a supervisor that was killed
            if self.stopping.is_set():
                return "stop"
            if self.store.has_queued():
                job = self.store.claim(self.name, self.config.instance)
                spec = job and self._validated(job)
                if spec:
                    return {"id": job.id, "spec": spec}
            if now - idle_since > KEEPALIVE_S:
                return None
            time.sleep(self.config.poll_interval)

    def _validated(self, job: Job) -> dict | None:
        """The job's request with the model's defaults filled in (recorded on the job), or None: it failed."""
        try:
            req = self.pipe.validate(self.module.GenerationRequest(**job.spec))
        except (TypeError, ValueError) as e:
            self.store.finish(job.id, self.name, "failed", error=f"invalid request: {e}")
            return None
        spec = dataclasses.asdict(req)
        self.store.set_spec(job.id, spec)
        return spec

    # -- every rank -----------------------------------------------------------------------------------------

    def run(self) -> None:
        if self.store is not None:
            threading.Thread(target=self._heartbeat_loop, daemon=True).start()
        while True:
            message = self.mesh.broadcast_object(self._next_message() if self.store is not None else None)
            if message == "stop":
                break
            if message is not None:
                self._run_job(message["id"], message["spec"])
        self.state = "stopped"
        if self.store is not None:
            self._beat()

    def _run_job(self, job_id: str, spec: dict) -> None:
        leader = self.store is not None
        self.job_id, self.state = job_id, "busy"
        step_times: list[float] = []
        last = [time.perf_counter()]

        def callback(step: int, total: int) -> bool:
            now = time.perf_counter()
            step_times.append(now - last[0])
            last[0] = now
            return not self.store.progress(job_id, self.name, step, total)

        start = time.perf_counter()
        try:
            frames = self.pipe.generate(self.module.GenerationRequest(**spec), callback if leader else None)
        except self.module.GenerationCancelled:
            if leader:
                self.store.finish(
                    job_id,
                    self.name,
                    "cancelled",
                    error=f"cancelled after step {len(step_times)}",
                    timings=_timings(start, step_times),
                )
            self.job_id, self.state = None, "ready"
            return
        except Exception as e:
            if leader:
                self.store.finish(
                    job_id,
                    self.name,
                    "failed",
                    error=f"generation failed, the worker group was restarted: {type(e).__name__}: {e}"[
                        :2000
                    ],
                )
            raise
        if leader:
            self._complete(job_id, spec, frames, _timings(start, step_times), step_times)
        self.job_id, self.state = None, "ready"

    def _complete(self, job_id, spec, frames, timings, step_times) -> None:
        generated = time.perf_counter()
        os.makedirs(self.config.videos_dir, exist_ok=True)
        path = os.path.join(self.config.videos_dir, f"{job_id}.mp4")
        tmp = path + ".partial.mp4"
        write_mp4(frames, tmp, spec["fps"])
        os.replace(tmp, path)  # readers never see a half-written file
        timings |= {"encode_s": time.perf_counter() - generated}
        job = self.store.finish(job_id, self.name, "completed", video=os.path.basename(path), timings=timings)
        if job is not None:
            self.store.add_counters(metrics.observations(step_times, job.finished_at - job.started_at))


def _alive(pid: int) -> bool:
    if not pid:
        return True  # started by hand (attach mode): nobody to outlive
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _timings(start: float, step_times: list[float]) -> dict:
    return {
        "generate_s": time.perf_counter() - start,
        "steps": len(step_times),
        "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server.worker", description=__doc__.split("\n\n")[0])
    add_arguments(parser, worker_only=True)
    config = from_args(parser.parse_args(argv))
    group_id = os.environ.get("ITHACA_GROUP_ID") or uuid.uuid4().hex[:12]
    module = importlib.import_module(config.pipeline_module)
    mesh = parallel.init_parallel(
        ulysses=config.ulysses,
        ring=config.ring,
        cfg=config.cfg,
        backend="gloo" if config.device == "cpu" else None,
    )
    pipe = module.load_pipeline(
        # device None: the mesh's device (cuda:LOCAL_RANK under torchrun on a GPU box)
        module.PipelineConfig(
            model=config.model,
            device="cpu" if config.device == "cpu" else None,
            dtype=config.dtype,
            comm=config.comm,
            attn_backend=config.attn_backend,
            text_encoder_device=config.text_encoder_device,
            compile=config.compile,
        ),
        mesh,
    )
    worker = Worker(config, group_id, mesh, pipe, module)
    signal.signal(
        signal.SIGTERM, lambda *_: worker.stopping.set()
    )  # drain: finish the running job, then stop
    try:
        worker.run()
    except BaseException:
        traceback.print_exc()
        if worker.store is not None:
            worker.state = "failed"  # /ready turns false now, not when the heartbeat goes stale
            worker._beat()
        sys.stdout.flush()
        os._exit(1)  # skip interpreter teardown: peers may still be inside a collective


if __name__ == "__main__":
    main()
