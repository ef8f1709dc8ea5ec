"""The results folder: finished MP4s named `<job id>.mp4`, written as `<job id>.partial.mp4` first.

At start-up `sweep` removes what no route can reach or remove any more: the MP4 of a job that was deleted or
did not complete (a worker that died between writing the file and recording the job), and partial files of
jobs no longer running. MP4s the store knows nothing of are left alone and reported: they mean the store was
replaced or lost, and deleting them would make a lost store worse.
"""

from __future__ import annotations

import logging
import os

from server.store import JobStore

PARTIAL_SUFFIX = ".partial.mp4"
log = logging.getLogger("ithaca.videos")


def sweep(store: JobStore, videos_dir: str) -> list[str]:
    """Remove unreachable MP4s; returns the names removed. Logs a warning for MP4s of unknown jobs."""
    try:
        names = sorted(n for n in os.listdir(videos_dir) if n.endswith(".mp4"))
    except FileNotFoundError:
        return []
    removed, unknown = [], []
    for name in names:
        partial = name.endswith(PARTIAL_SUFFIX)
        job = store.get(name.removesuffix(PARTIAL_SUFFIX if partial else ".mp4"), include_deleted=True)
        if job is None:
            unknown.append(name)
            continue
        if (job.status != "in_progress") if partial else (job.deleted or job.status != "completed"):
            os.remove(os.path.join(videos_dir, name))
            removed.append(name)
    if removed:
        log.info("removed %d video file(s) no job can serve: %s", len(removed), ", ".join(removed[:10]))
    if unknown:
        empty = "holds no jobs" if store.is_empty() else "does not know the jobs of"
        log.warning(
            "the job store %s %s %d MP4(s) in %s (e.g. %s): if the store was replaced or lost, stop the "
            "server and restore it from a backup; the files are left as they are",
            store.path, empty, len(unknown), videos_dir, unknown[0],
        )  # fmt: skip
    return removed
