"""The results folder: finished MP4s named `<job id>.mp4`, written as `<job id>.<attempt>.partial.mp4` first,
and in its `inputs/` folder the first-frame image of each image-to-video job, the bytes the client sent as
`<job id>.png`, `.jpg` or `.webp`, written before the job is queued and kept beside it (the worker reads it
when it claims the job, again if the job is re-queued).

At start-up `sweep` removes what no route can reach or remove any more: the MP4 of a job that was deleted or
did not complete (a worker that died between writing the file and recording the job), partial files of
jobs no longer running, and the input image of a deleted job that is over. Files the store knows nothing of
are left alone and reported: they mean the store was replaced or lost, and deleting them would make a lost
store worse.

In its `previews/` folder the latest live preview of each job, `<job id>.webp` (a small WebP the worker's
leader replaces every few steps, written then renamed), kept after the job ends as a thumbnail of its
result. It goes with the job on delete; `sweep` removes those of deleted jobs, and those of jobs the store
does not know unless the store holds no jobs at all (a lost store: they are left with the videos).

In its `checkpoints/` folder the latest denoising checkpoint of each running job, `<job id>.pt`
(dit.denoise_state: written then renamed by the worker's leader every few steps), read when an interrupted job
runs again and removed when the job ends; `sweep` removes those of jobs that are over or unknown.
"""

from __future__ import annotations

import contextlib
import logging
import os

from dit.files import written
from server.store import Job, JobStore

PARTIAL_SUFFIX = ".partial.mp4"
_INPUT_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp"}  # PNG first: earlier
# versions kept every input as a PNG
log = logging.getLogger("ithaca.videos")


def video_file(config, job: Job) -> str:
    """Where a completed job's MP4 is on this box: its name in this server's results folder."""
    return os.path.join(config.videos_dir, os.path.basename(job.video or ""))


def missing_video(config, job: Job, what: str = "video") -> str:
    """Why a job's MP4 (or its `what`: "preview") is not in this server's results folder, for its 404.
    Servers sharing a job store (PostgreSQL) serve every job's files only when their results folders are one
    shared folder. The folder is not named: a client has no business with the server's paths."""
    if job.instance and job.instance != config.instance:
        return (
            f"the {what} of job {job.id} is not in this server's results folder: server {job.instance!r} "
            "wrote it; servers that share a job store must share the results folder (--results-dir on a "
            "shared file system)"
        )
    return f"the {what} of job {job.id} is gone from this server's results folder"


def input_path(videos_dir: str, job_id: str) -> str:
    """The job's input image; its PNG name when it has none (gone, or not written yet)."""
    paths = [_input_name(videos_dir, job_id, suffix) for suffix in _INPUT_SUFFIXES.values()]
    return next((path for path in paths if os.path.exists(path)), paths[0])


def write_input(videos_dir: str, job_id: str, data: bytes, media_type: str) -> None:
    path = _input_name(videos_dir, job_id, _INPUT_SUFFIXES[media_type])
    _write_atomic(path, path + ".partial", data)  # the worker never reads a half-written file


def remove_input(videos_dir: str, job_id: str) -> None:
    for suffix in _INPUT_SUFFIXES.values():
        _remove(_input_name(videos_dir, job_id, suffix))


def _input_name(videos_dir: str, job_id: str, suffix: str) -> str:
    return os.path.join(videos_dir, "inputs", job_id + suffix)


def preview_path(videos_dir: str, job_id: str) -> str:
    return os.path.join(videos_dir, "previews", f"{job_id}.webp")


def write_preview(videos_dir: str, job_id: str, webp: bytes) -> None:
    path = preview_path(videos_dir, job_id)
    # a reader gets the previous preview or this one, never half of one; a temporary file a crash leaves is
    # an unknown job's to `sweep`
    _write_atomic(path, path.removesuffix(".webp") + ".partial.webp", webp)


def read_preview(videos_dir: str, job_id: str) -> bytes | None:
    """The job's latest preview; None when there is none."""
    try:
        with open(preview_path(videos_dir, job_id), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def remove_preview(videos_dir: str, job_id: str) -> None:
    _remove(preview_path(videos_dir, job_id))


def checkpoint_path(videos_dir: str, job_id: str) -> str:
    return os.path.join(videos_dir, "checkpoints", f"{job_id}.pt")


def remove_checkpoint(videos_dir: str, job_id: str) -> None:
    _remove(checkpoint_path(videos_dir, job_id))


def _write_atomic(path: str, tmp: str, data: bytes) -> None:
    """`data` into `path` through `tmp` and a rename, so no reader ever sees part of it."""
    with written(path, tmp) as name, open(name, "wb") as f:
        f.write(data)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def partial_video(videos_dir: str, job_id: str, attempt: int) -> str:
    """Where a run writes its job's MP4 until the job completes: a name per attempt, so a run whose job was
    re-queued while it lived on (its heartbeats lost) never writes into the file of the run after it."""
    return os.path.join(videos_dir, f"{job_id}.{attempt}{PARTIAL_SUFFIX}")


def remove_earlier_partials(videos_dir: str, job_id: str, attempt: int) -> None:
    """The partial MP4s of the job's attempts before `attempt`: their runs are over, or no longer the job's
    (one that lives on finds that at its close and leaves the name alone: `JobEnd`)."""
    for earlier in range(1, attempt):
        remove_partial(videos_dir, job_id, earlier)


def remove_partial(videos_dir: str, job_id: str, attempt: int) -> None:
    _remove(partial_video(videos_dir, job_id, attempt))


def _unreachable_video(name: str, job: Job) -> bool:
    if name.endswith(PARTIAL_SUFFIX):
        mine = os.path.basename(partial_video("", job.id, job.attempts))  # an earlier attempt's is not
        return job.status != "in_progress" or name != mine
    return job.deleted or job.status != "completed"


def _unreachable_input(name: str, job: Job) -> bool:
    return job.deleted and job.terminal  # a running job may be re-queued and read it again


def _unreachable_preview(name: str, job: Job) -> bool:
    return job.deleted


def _unreachable_checkpoint(name: str, job: Job) -> bool:
    return job.terminal  # a queued one is a re-queued job's, to resume from


def sweep(store: JobStore, videos_dir: str) -> list[str]:
    """Remove unreachable MP4s, input images, previews and checkpoints; returns the names removed. Logs a
    warning for MP4s and input images of unknown jobs."""
    known = not store.is_empty()
    return (
        _sweep(store, videos_dir, ".mp4", "MP4(s)", _unreachable_video)
        + _sweep(
            store,
            os.path.join(videos_dir, "inputs"),
            tuple(_INPUT_SUFFIXES.values()),
            "input image(s)",
            _unreachable_input,
        )
        + _sweep(
            store, os.path.join(videos_dir, "previews"), ".webp", "preview(s)", _unreachable_preview, known
        )
        + _sweep(
            store,
            os.path.join(videos_dir, "checkpoints"),
            ".pt",
            "checkpoint(s)",
            _unreachable_checkpoint,
            known,
        )
    )


def _sweep(
    store: JobStore, folder: str, suffix: str | tuple, kind: str, unreachable, drop_unknown=False
) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(suffix))
    except FileNotFoundError:
        return []
    removed, unknown = [], []
    for name in names:
        job_id = name.split(".", 1)[0]  # <job id>.mp4, <job id>.<attempt>.partial.mp4, ...
        job = store.get(job_id, include_deleted=True)
        if job is None and not drop_unknown:
            unknown.append(name)
        elif job is None or unreachable(name, job):
            os.remove(os.path.join(folder, name))
            removed.append(name)
    if removed:
        log.info("removed %d %s no job can serve: %s", len(removed), kind, ", ".join(removed[:10]))
    if unknown:
        empty = "holds no jobs" if store.is_empty() else "does not know the jobs of"
        log.warning(
            "the job store %s %s %d %s in %s (e.g. %s): if the store was replaced or lost, stop the "
            "server and restore it from a backup; the files are left as they are",
            store.path, empty, len(unknown), kind, folder, unknown[0],
        )  # fmt: skip
    return removed
