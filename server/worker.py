"""Worker group entry point, run on every rank (the supervisor launches them, `server.supervisor`):

    python -m parallel.local_group --nproc=2 -m server.worker --data-dir ithaca-data --preset tiny

Each data-parallel replica serves its own jobs. Its leader polls the job store, claims the oldest queued
job and broadcasts the spec over the replica's gloo control group (an image-to-video job's first frame read
from its PNG, as a uint8 array: the leader, which alone conditions on it, keeps it as given, the other ranks
get it fitted to the request's size, a small broadcast); idle ranks wait there (the leader sends
a keep-alive while idle, so the wait never reaches the gloo timeout and never sits inside NCCL). Every
rank runs the pipeline; the leader records progress after each step, turns the job's cancel flag into the
callback's False, records each phase (encoding, denoising, decoding, writing) and the seconds of each one
it finished, writes the MP4 and the terminal state; a cancel that arrives after the last step ends the job
cancelled with no video. The leader also passes the pipeline an `on_preview`: each preview image it gets is
handed to a thread (`PreviewWriter`) that encodes it as WebP, puts it in place (`videos.write_preview`) and
records its step, so a step never waits on it; a newer image replaces one not yet written, and a preview
that fails is logged and left out. Before every claim the leader checks that its server is alive and has
not asked it to drain (store flag or SIGTERM): otherwise it sends "stop" and the group exits, leaving queued
jobs for the next group. Every rank dies with its launcher (parent-death signal). Any failure other than a
cancel leaves the group's state unknown: every rank exits non-zero, so the launcher ends the group, and the
supervisor re-queues the job (up to --max-attempts) and starts a fresh group; the first rank to fail records
its error in the store for the supervisor's log and the job's final error.

A job-store outage (server/store/retry.py) is not a failure: the leader's writes at a job's edges (claim,
phases, the end) wait for the store for up to --store-outage-grace, its steps and heartbeats are kept (the
newest) and written once the store answers, and an idle leader polls on slowly, so the job goes on.

Once the video is decoded, its middle frame takes the last live preview's place before the job completes:
a finished job's thumbnail is a frame of its video. Its MP4's frames are then all with ffmpeg, so the leader
hands the rest to a thread (`server.job_end`: wait for the file, rename it into place, complete the job) and
claims its next job at once. Until the file is in place the job stays in progress under this worker, so a
group that dies meanwhile has it re-queued, never completed without its file; a drain waits (up to CLOSE_S)
for those closes before the group exits.

Every `--checkpoint-every` steps the leader hands the sampler's state to another thread
(`server.writers.CheckpointWriter`), which saves it beside the job; when it claims a job that has a
checkpoint made for the same model, settings, layout and request, the replica goes on from it (the job
records `resumed_from_step`), and one made for anything else is ignored with a log line. The checkpoint goes
when the job ends.

With `--lora-dir` the leader publishes the LoRA catalogue (`info["loras"]`, rescanned every heartbeat),
prefers jobs of the set it applied last (`JobRuns.claim`, `--lora-patience`) and counts the switches between
sets; a job's set is in its spec, so in its checkpoint's key.

Across machines (`ithaca serve --nnodes`), each rank first takes the global rank its node number gives it
(`parallel.launch.number_ranks_by_node`), so the leader is on node 0, beside the job store; ranks on the
other nodes never open the store, not even to record an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from functools import partial

from dit.batch import BatchJob
from dit.denoise_state import DenoiseState, Expected, load_file
from dit.image import fit, read
from dit.settings import checkpoint_key
from dit.startup import start
from dit.vocabulary import read_vocabulary
from dit.warmup import warm_up
from parallel.local_group import MISTAKE
from parallel.parent_death import die_with_parent
from server import limits as limits_mod
from server import logs, metrics, videos
from server.batching import companion_ids
from server.config import ServeConfig, add_arguments, from_args
from server.job_end import JobEnd
from server.job_run import JobRun
from server.lifetime import running
from server.store import Job, StoreBusy, lora_set, open_store
from server.store.retry import MAX_RETRY_S, LatestStep, PatientStore, StoreOutage
from server.writers import CheckpointWriter, PreviewWriter

HEARTBEAT_S = 1.0
KEEPALIVE_S = 5.0
STOP_CHECK_S = 0.25
# After a second without a job, a leader polls the queue at most every 50 ms (the job then waits up to 50 ms
# more): at --poll-interval's 5 ms an idle leader queried the store 200 times a second (5 % of a core, and
# load on a PostgreSQL store that several boxes share).
IDLE_AFTER_S, IDLE_POLL_S = 1.0, 0.05
FLUSH_S = 5.0  # at most this long, at the end of a job, for its last preview or checkpoint to be written
CLOSE_S = 30.0  # at most this long, before the group exits, for the MP4s handed off to be closed
log = logging.getLogger("ithaca.worker")


class Worker:
    def __init__(self, config: ServeConfig, group_id: str, mesh, pipe, module, probe=None):
        self.config, self.group_id, self.mesh, self.pipe, self.module = config, group_id, mesh, pipe, module
        self.name = f"{config.instance}/{group_id}/replica{mesh.dp_rank}"
        self.stopping = threading.Event()
        self.terminated = threading.Event()  # SIGTERM: its launcher ends the group (`torn_down`)
        self._torn_down: bool | None = None  # decided once, at the first step after a SIGTERM
        self._beat_lock = threading.Lock()
        self.supervisor_pid = int(os.environ.get("ITHACA_SUPERVISOR_PID", "0"))
        self.state, self.jobs = "ready", []
        self.last_job = time.monotonic()  # the last job's arrival or end (or the start): the poll's pace
        self.applied, self.switches = "", pipe.lora_switches  # the LoRA set last run (store.lora_set)
        # the leader's store calls ride out an outage: those at a job's edges wait for it (up to the grace),
        # heartbeats and steps are single attempts whose newest value is written once the store answers
        self.outage = StoreOutage(config.store_outage_grace, f"worker {self.name}")
        self.store = PatientStore(open_store(config), self.outage) if mesh.is_replica_leader else None
        leader = self.store is not None
        self.steps = LatestStep(self.store, self.name) if leader else None
        # its thread waits out an outage, then records the newest preview (past the grace it was dropped, a
        # warning each, and the job's preview_step stayed at the outage's start)
        self.previews = (
            PreviewWriter(self.store.until_answered, config.videos_dir, self.name) if leader else None
        )
        self.checkpoints = CheckpointWriter(config.videos_dir) if leader else None
        self.ending = JobEnd(self.store, self.name, config.videos_dir) if leader else None
        described = limits_mod.describe(pipe.limits, config.image_limits)
        self.info = {
            "limits": described,
            "defaults": limits_mod.defaults(described),
            "model": config.model,
            "vocabulary": read_vocabulary(config.model),  # None: the model declares none (dit.vocabulary)
            "dp_rank": mesh.dp_rank,
            "dp_size": mesh.dp_size,
            "world_size": mesh.world_size,
            "pid": os.getpid(),
            "host": socket.gethostname(),  # with the pid: a server started on this host tells a dead group
            "comm": {  # the exchange in use; with --comm auto, the probe's rows (ms None: ruled out)
                "mode": pipe.config.comm,
                "probe": None if probe is None else [dataclasses.asdict(row) for row in probe.rows],
            },
            "loras": None if pipe.lora_catalogue is None else pipe.lora_catalogue.entries(),
        }

    # -- leader side ----------------------------------------------------------------------------------------

    def _beat(self) -> None:
        """One heartbeat; never raises: the next one carries the newest state (and an error being handled
        stays the one the group reports)."""
        # state is read under the lock, so the final "stopped"/"failed" write is the last one; a replica told
        # to stop (its server's drain, a SIGTERM: a launcher ending the group as another rank died) is
        # "stopping": /ready turns false within a heartbeat, not only once the group is gone
        with self._beat_lock:
            state = self.state
            if (self.stopping.is_set() or self.terminated.is_set()) and state in ("ready", "busy"):
                state = "stopping"
            try:
                self.store.once.heartbeat(
                    self.name,
                    instance=self.config.instance,
                    group_id=self.group_id,
                    state=state,
                    info=self.info | {"job": next(iter(self.jobs), None), "jobs": self.jobs},
                )
            except Exception as e:  # StoreBusy: the outage logged it
                if not isinstance(e, StoreBusy):
                    log.warning("heartbeat not written: %s: %s", type(e).__name__, e)

    def _heartbeat_loop(self) -> None:
        while self.state != "stopped":
            self.steps.write()
            self._rescan_loras()
            self._beat()
            time.sleep(HEARTBEAT_S)

    def _rescan_loras(self) -> None:
        """The LoRA catalogue as the folder holds it now (a header read once per file), for the heartbeat."""
        if self.pipe.lora_catalogue is None:
            return
        try:
            entries = self.pipe.lora_catalogue.entries()
            with self._beat_lock:  # the warm-ups' end sets info too
                self.info = self.info | {"loras": entries}
        except Exception as e:  # the folder gone or unreadable: the workers' validation says so per job
            log.warning("the LoRA catalogue was not rescanned: %s: %s", type(e).__name__, e)

    def _next_message(self):
        """Leader: block until there is something to broadcast (a job, a keep-alive None, or 'stop')."""
        idle_since = last_check = time.monotonic()
        while True:
            now, pause = time.monotonic(), self.config.poll_interval
            if now - self.last_job > IDLE_AFTER_S:
                pause = max(pause, IDLE_POLL_S)
            try:
                queued = self.store.once.has_queued()
                # right before every claim, so no queued job is taken after a stop; idle: soon, without a
                # second read every poll
                if queued or now - last_check > STOP_CHECK_S:
                    last_check = now
                    if self._should_stop():
                        return "stop"
            except StoreBusy:  # idle, nothing to lose: poll on, slowly (the outage logged it)
                queued, pause = False, MAX_RETRY_S
                if not _alive(self.supervisor_pid) or self.stopping.is_set():
                    return "stop"
            if queued:
                self.last_job = now  # a job came, whether or not it is claimed and valid: poll fast again
                preference = {"applied": self.applied, "patience": self.config.lora_patience}
                job = self.store.claim(self.name, self.config.instance, **preference)
                spec = job and self._validated(job)
                if spec:
                    self.applied = lora_set(spec.get("loras"))  # every rank applies it as the job starts
                    message = self._message(job, spec, resume=True)
                    return self._with_companions(message) if self.config.max_batch > 1 else message
            if now - idle_since > KEEPALIVE_S:
                return None
            time.sleep(pause)

    def _with_companions(self, first: dict) -> dict:
        """`first` (a claimed job's message) and up to --max-batch - 1 queued jobs that can share its
        forwards (the oldest first: `batching.companions`) as one batch's message; `first` alone when none
        joins, or when it resumes from a checkpoint or runs alone (a batch takes none)."""
        ids = companion_ids(first, self.store, self.pipe, self.module, self.config)
        messages = [first]
        for job in self.store.join_batch(self.name, self.config.instance, first["id"], ids):
            spec = self._validated(job)
            if spec:
                messages.append(self._message(job, spec, resume=False))
        return first if len(messages) == 1 else {"batch": messages}

    def _message(self, job: Job, spec: dict, resume: bool) -> dict:
        """A claimed job as the replica's ranks run it: its checkpoint to resume from (with `resume`; a
        batch's companions start afresh) and the claim's attempt, which ends only this run of it."""
        key = self._checkpoint_key(job, spec)
        return {"id": job.id, "spec": spec, "key": key, "attempt": job.attempts,
                "resume": self._resume(job, spec, key) if resume else None}  # fmt: skip

    def torn_down(self) -> bool:
        """Leader: whether the group is going under it. A SIGTERM its server did not ask for with a drain
        comes from its launcher, which ends the group because another rank failed (a replica beside this
        one): the SIGKILL follows in 30 s, so the running job stops at its next step and goes back to the
        queue, its attempt not counted, rather than run on to be killed with it counted."""
        if self.terminated.is_set() and self._torn_down is None:
            try:
                self._torn_down = not self.store.once.drain_requested(self.group_id)
            except StoreBusy:  # the drain cannot be read: the job runs on, asked again at the next step
                pass
        return bool(self._torn_down)

    def _should_stop(self) -> bool:
        """SIGTERM, a drain request, or a server that is gone (its supervisor was killed)."""
        if self.store.once.drain_requested(self.group_id) or not _alive(self.supervisor_pid):
            self.stopping.set()
        return self.stopping.is_set()

    def _validated(self, job: Job) -> dict | None:
        """The job's request with the model's defaults filled in (recorded on the job, its image still
        described), its image as pixels; or None: it failed."""
        described = job.spec.get("image")
        try:
            image = None if described is None else read(videos.input_path(self.config.videos_dir, job.id))
            req = self.pipe.validate(self.module.GenerationRequest(**job.spec | {"image": image}))
        except (TypeError, ValueError) as e:  # an unreadable input file is an ImageError, a ValueError
            self.store.finish(job.id, self.name, "failed", error=f"invalid request: {e}")
            return None
        spec = dataclasses.asdict(dataclasses.replace(req, image=described))  # recorded without pixels
        if described is None:
            del spec["image"]  # a text-to-video request reads as it always did
        if not spec["loras"]:
            del spec["loras"]  # so does one without LoRAs (and its checkpoint key)
        self.store.set_spec(job.id, spec)
        return spec if image is None else spec | {"image": image}

    def _checkpoint_key(self, job: Job, spec: dict) -> dict:
        """What a checkpoint must have been made for: the model and the settings that change its numbers,
        the replica's layout and the validated request (its image as described: the job's own file)."""
        config, mesh = self.config, self.mesh
        request = spec | {"image": job.spec["image"]} if "image" in spec else spec
        return {
            "model": config.model,
            # as given (serve's device), the exchange as chosen
            "settings": checkpoint_key(dataclasses.replace(config.pipeline, comm=self.pipe.config.comm)),
            "layout": {"ulysses": mesh.ulysses_size, "ring": mesh.ring_size, "cfg": mesh.cfg_size},
            "request": request,
        }

    def _resume(self, job: Job, spec: dict, key: dict) -> DenoiseState | None:
        """The job's checkpoint, when it has one made under `key`; it is recorded on the job."""
        size = self.pipe.latent_shape(self.module.GenerationRequest(**spec))  # reads the video's size alone
        expected = Expected(spec["num_inference_steps"], size, ranks=self.mesh.sp_size * self.mesh.cfg_size)
        state, why = load_file(videos.checkpoint_path(self.config.videos_dir, job.id), key, expected)
        if why is not None:
            log.warning("job %s: its checkpoint is ignored, starting from the first step: %s", job.id, why)
        elif state is not None:
            log.info("job %s resumes after step %d (attempt %d)", job.id, state.step, job.attempts)
            self.store.set_resumed(job.id, self.name, state.step, spec["num_inference_steps"])
        return state

    def _count_switches(self) -> None:
        """Count the LoRA switch the job made, if any (every rank switched alike: the leader counts)."""
        switches = self.pipe.lora_switches
        if switches > self.switches:
            seconds = self.pipe.lora_switch_seconds
            self.store.add_counters(metrics.lora_switches(switches - self.switches, seconds))
            self.switches = switches

    # -- every rank -----------------------------------------------------------------------------------------

    def run(self) -> None:
        if self.store is not None:  # "warming" is not serving: the group is ready once its warm-ups are done
            self.state = "warming" if self.config.pipeline.warmup else "ready"  # /ready said "loading"
            threading.Thread(target=self._heartbeat_loop, daemon=True).start()
        warmed = warm_up(self.pipe, self.config.pipeline.warmup, self.module.GenerationRequest)
        with self._beat_lock:
            self.info, self.state = self.info | {"warmup": warmed}, "ready"
        while True:
            own = self._next_message() if self.store is not None else None
            message = self.mesh.broadcast_object(_for_other_ranks(own))
            message = own if self.store is not None else message
            if message == "stop":
                break
            if message is not None:
                if "batch" in message:
                    self._run_batch(message["batch"])
                else:
                    self._run_job(message)
                if self.store is not None:
                    for job in message.get("batch", [message]):
                        self.ending.drop_files(job["id"], "image" in job["spec"])
                    self._count_switches()
                    self.last_job = time.monotonic()
        if self.store is not None and not self.ending.flush(CLOSE_S):
            log.warning(
                "an MP4 was not closed within %g s: its job stays in progress, to be re-queued", CLOSE_S
            )
        self.state = "stopped"
        if self.store is not None:
            self._beat()

    def _run_job(self, message: dict) -> None:
        job_id, spec, resume = message["id"], message["spec"], message["resume"]
        run = JobRun(self, message) if self.store is not None else None  # the leader records the job
        self.jobs, self.state = [job_id], "busy"
        every = self.config.checkpoint_steps
        checkpoints = run and self.checkpoints.schedule(every, partial(self.checkpoints.save, message))
        try:
            outcome = self.pipe.generate(
                self.module.GenerationRequest(**spec),
                run and run.callback,
                run and run.on_phase,
                on_preview=run and run.on_preview,
                resume=resume,
                checkpoints=checkpoints,
                on_frames=run and run.video.frames,
                decode_callback=run and run.decode_callback,
            )
        except (self.module.GenerationCancelled, self.module.GenerationFailed) as stop:  # every rank alike
            outcome = stop
        except Exception:
            self._failed([run] if run is not None else [])
            raise
        if run is not None:
            run.ended(outcome, self.pipe.evaluations)  # this job's (the next generate replaces them)
        self.jobs, self.state = [], "ready"

    def _run_batch(self, messages: list[dict]) -> None:
        """The jobs of one batch through `Pipeline.generate_batch`, each recorded as a job of its own."""
        leader = self.store is not None
        runs = [JobRun(self, m) for m in messages] if leader else []
        self.jobs, self.state = [m["id"] for m in messages], "busy"  # the heartbeat names them
        requests = [self.module.GenerationRequest(**m["spec"]) for m in messages]
        jobs = [run.batch_job(req) for run, req in zip(runs, requests, strict=True)] if leader else [
            BatchJob(req) for req in requests]  # fmt: skip

        def on_phase(phase: str) -> None:  # the batch's phases are each job's, but its own decode's start
            for run in runs:
                run.on_batch_phase(phase)

        def save(states) -> None:  # each job's own state, to resume alone (dit.batch)
            for j, state in states:
                self.checkpoints.save(messages[j], state)

        checkpoints = self.checkpoints.schedule(self.config.checkpoint_steps, save) if leader else None
        try:  # the leader records each job as its outcome comes (`JobRun.batch_job`)
            self.pipe.generate_batch(jobs, on_phase if leader else None, checkpoints)
        except self.module.GenerationFailed as failed:  # the batch's own (its LoRA set): each job's
            for run in runs:
                if not run.over:
                    run.ended(failed, None)
        except Exception:
            self._failed([run for run in runs if not run.over])
            raise
        self.jobs, self.state = [], "ready"

    def _failed(self, runs: list[JobRun]) -> None:
        """A run failed: its jobs stay in progress, for the supervisor to re-queue once the group is gone
        (the leader's; those of a batch that ended before stay as they ended)."""
        if self.store is None:  # not the leader: it records nothing
            return
        for run in runs:
            run.video.drop()
        self._flush_previews()
        self.checkpoints.flush(FLUSH_S)  # the last one, to resume from
        self.ending.flush(FLUSH_S)  # the job before, complete with its file, rather than re-run

    def _flush(self) -> None:
        """The job's run is over: its last preview in place, no write of its checkpoint left (a finished
        run's checkpoint goes once its MP4 is in place: `JobEnd`)."""
        self._flush_previews()
        self.checkpoints.flush(FLUSH_S)

    def _flush_previews(self) -> None:
        """The last preview in place, waited for FLUSH_S at most, and not at all while the store is away: its
        step waits out the outage on the writer's thread (each job's decode took FLUSH_S longer)."""
        self.previews.flush(0 if self.store.outage.since is not None else FLUSH_S)


def _alive(pid: int) -> bool:
    return not pid or running(pid)  # no pid: started by hand (attach mode), nobody to outlive


def _for_other_ranks(message):
    """The leader's message as the replica's other ranks get it: a job's image fitted to the request's size.
    They only validate the request with it; the leader alone conditions on the image, as given (Wan's CLIP
    sees the whole image, as diffusers'), so the broadcast stays one frame's pixels."""
    if not isinstance(message, dict) or "image" not in message.get("spec", ()):  # a batch has no image
        return message
    spec = message["spec"]
    return message | {"spec": spec | {"image": fit(spec["image"], spec["height"], spec["width"])}}


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # the launcher killed (even with SIGKILL): this rank goes too
    parser = argparse.ArgumentParser(prog="python -m server.worker", description=__doc__.split("\n\n")[0])
    add_arguments(parser, worker_only=True)
    config = from_args(parser.parse_args(argv), worker_only=True)
    logs.setup(config.log_level, config.log_format)
    group_id = os.environ.get("ITHACA_GROUP_ID") or uuid.uuid4().hex[:12]
    try:
        worker = _start(config, group_id)
    except BaseException as e:  # a ValueError: a mistake in the model's files or settings, no start mends it
        _fail(config, group_id, e, mistake=isinstance(e, ValueError))

    def on_sigterm(*_) -> None:  # stop claiming; the running job finishes, unless the group is torn down
        worker.terminated.set()
        worker.stopping.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        worker.run()
    except BaseException as e:
        if worker.store is not None:
            worker.state = "failed"  # /ready turns false now, not when the heartbeat goes stale
            worker._beat()
        _fail(config, group_id, e)
    worker.mesh.close()


def _start(config: ServeConfig, group_id: str) -> Worker:
    module = importlib.import_module(config.pipeline_module)

    def report(choice) -> None:
        log.info("%s", choice.line())

    # auto degrees (`ithaca serve` passes them resolved) from the model and this launch's ranks; across
    # machines the replica leader (the one rank using the job store) on node 0. `--device cuda`: each rank
    # its own GPU (device None: the mesh's, cuda:LOCAL_RANK)
    pipeline = dataclasses.replace(config.pipeline, device="cpu" if config.pipeline.device == "cpu" else None)
    started = start(pipeline, config.ulysses, config.ring, config.cfg, node_rank=config.node_rank,
                    load=module.load_pipeline, allow_lossy_comm=config.allow_lossy_comm,
                    comm_probe_timeout=config.comm_probe_timeout, report=report)  # fmt: skip
    if started.probe is not None and started.mesh.is_replica_leader:
        log.info("exchange: %s", started.probe.summary())
    return Worker(config, group_id, started.mesh, started.pipe, module, started.probe)


def _fail(config: ServeConfig, group_id: str, error: BaseException, mistake: bool = False) -> None:
    """Log the traceback (in the log's format: one JSON object with --log-format json), record the first
    error of the group for the supervisor, exit at once. `mistake`: the model's files or settings are wrong
    (its line says it all): exit MISTAKE, which the supervisor does not start again."""
    rank = os.environ.get("RANK", "0")
    # an outage past the grace, or a mistake: its line says it all
    trace = None if isinstance(error, StoreBusy) or mistake else error
    log.critical("rank %s failed: %s: %s", rank, type(error).__name__, error, exc_info=trace)
    code = MISTAKE if mistake else 1
    if config.node_rank != 0:  # a --no-api node has no job store: its error stays in its log
        _exit_now(code)
    try:
        open_store(config).record_error(group_id, f"rank {rank}: {type(error).__name__}: {error}"[:2000])
    except Exception:  # the store itself may be what failed; the traceback above still tells
        pass
    _exit_now(code)


def _exit_now(code: int = 1) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: peers may still be inside a collective


if __name__ == "__main__":
    main()
