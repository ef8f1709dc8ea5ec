"""Which queued jobs join a claimed job's batch (`ithaca serve --max-batch`): those whose validated request
has the claimed one's batch key (dit.batch.batch_key) and no checkpoint to resume from (a batch would start
it afresh), the oldest first. The claimed job is taken as the queue orders claims, so a batch never delays
it; its companions are claimed by id in one transaction (`JobRuns.join_batch`), and one another replica took
or a cancel ended meanwhile is left out."""

from __future__ import annotations

import os

from dit.batch import BatchKey, batch_key, runs_alone
from server import videos
from server.store import Job

BATCH_SCAN = 64  # the oldest queued jobs looked at for a batch's companions


def companion_ids(first: dict, store, pipe, module, config) -> list[str]:
    """The queued jobs to claim beside `first` (a claimed job's worker message) under `config.max_batch`:
    none when it resumes from a checkpoint or runs alone (a batch takes neither)."""
    key = batch_key(pipe.validate(module.GenerationRequest(**first["spec"])))
    if first["resume"] is not None or runs_alone(key) is not None:
        return []
    return companions(
        store.queued_jobs(BATCH_SCAN), key, config.max_batch - 1, pipe, module, config.videos_dir
    )


def companions(queued: list[Job], key: BatchKey, wanted: int, pipe, module, videos_dir: str) -> list[str]:
    """The ids of the first `wanted` jobs of `queued` (oldest first) that may join a batch of `key`."""
    ids: list[str] = []
    for job in queued:
        if len(ids) == wanted:
            break
        if "image" in job.spec or os.path.exists(videos.checkpoint_path(videos_dir, job.id)):
            continue
        try:
            request = pipe.validate(module.GenerationRequest(**job.spec))
        except (TypeError, ValueError):  # its own claim fails it, with the reason
            continue
        if batch_key(request) == key:
            ids.append(job.id)
    return ids
