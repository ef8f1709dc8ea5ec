"""What the routes share: settings, the job store, the supervisor (None when attached), and the job rules
both APIs apply (id checks, text and prompt rules, published limits, the input image, idempotency, the
queue cap, cancel, the video path)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field

from fastapi import HTTPException

from dit.image import ImageError, ImageTooLarge, UnsupportedFormat
from dit.request import blank, check_text, unused_negative_prompt
from dit.vocabulary import prompt_warnings
from server import images, loras, videos
from server import limits as limits_mod
from server.config import ServeConfig
from server.jsonsafe import shown
from server.store import IdempotencyConflict, Job, JobStore, QueueFull, UnknownCursor
from server.supervisor import Supervisor, group_ready

log = logging.getLogger("ithaca.server")
_ID = re.compile(r"^[0-9a-f]{32}$")
LIMITS_CACHE_S = 1.0
# Characters a prompt may have before it is tokenized at all (tokens set the real limit, well below this).
MAX_PROMPT_CHARS = 20_000
_IMAGE_STATUS = {ImageTooLarge: 413, UnsupportedFormat: 415}  # any other ImageError: 422
# A job sent without a seed gets one drawn below this: JavaScript's numbers hold it exactly, so the page (and
# any JSON client) shows it and can send it back to make the same video.
RANDOM_SEEDS = 2**32
_NEGATIVE = ("negative_prompt", "guidance_scale", "guidance_scale_2")  # unused_negative_prompt's, from a spec


def _digest(body: dict) -> str:
    """An idempotent request's fingerprint: a key's retry must bring the same one."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def unprocessable(field_name: str, message: str) -> HTTPException:
    """422 in FastAPI's own validation-error shape, naming the field."""
    return HTTPException(422, [_error(field_name, message)])


def _error(field_name: str, message: str) -> dict:
    return {"loc": ["body", field_name], "msg": message, "type": "value_error"}


def text_field(name: str, value, *, max_chars: int, required: bool = False) -> str:
    """A client's text as every route takes it: a string of at most `max_chars`, blank only when not
    `required`, and storable and renderable (UTF-8 encodable, so no lone UTF-16 surrogate; no NUL)."""
    if not isinstance(value, str):
        raise unprocessable(name, f"{name} is required" if value is None else f"{name} must be a string")
    if required and blank(value):
        raise unprocessable(name, f"{name} must not be empty or blank (only spaces or invisible characters)")
    if len(value) > max_chars:
        raise unprocessable(name, f"{name} is {len(value)} characters long; at most {max_chars} are accepted")
    try:
        check_text(name, value)
    except ValueError as e:
        raise unprocessable(name, str(e)) from None
    if "\x00" in value:
        raise unprocessable(name, f"{name} must not hold NUL characters")
    return value


@dataclass
class Services:
    config: ServeConfig
    store: JobStore
    supervisor: Supervisor | None
    _worker_info: tuple[float, dict] = field(default=(0.0, {}))
    _tokenizers: dict = field(default_factory=dict)  # model → its prompt tokenizer (None: cannot load here)
    _tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)
    # set once the server is asked to stop: the event streams end then, as uvicorn waits for every open
    # connection before the server stops
    closing: threading.Event = field(default_factory=threading.Event)

    def worker_info(self) -> dict:
        """Limits and request defaults the newest worker published (cached for a second once there are some,
        so the first reads after the group starts see them at once)."""
        at, info = self._worker_info
        if not info or time.monotonic() - at > LIMITS_CACHE_S:
            workers = self.store.workers()
            info = workers[0]["info"] if workers else {}
            self._worker_info = (time.monotonic(), info)
        return info

    def warnings(self, job: Job) -> list[str]:
        """What the job's view warns of: a prompt with words outside the vocabulary the model declares (the
        trained tiny model's; none for a model that declares none), as the workers published it, and a
        negative prompt that a guidance of 1 leaves out (the model's default once a worker took the job)."""
        spec = job.spec
        unused = unused_negative_prompt(*(spec.get(name) for name in _NEGATIVE))
        return prompt_warnings(spec.get("prompt"), self.worker_info().get("vocabulary")) + unused

    def video_size(self, job: Job) -> tuple[int, int] | None:
        """The job's (width, height): its request's, else the model's defaults, else, for a request with an
        image and no size to a model that sizes videos from their image, the size the model's family makes of
        it (as the worker will once it takes the job); None before a worker published the model's limits."""
        spec, info = job.spec, self.worker_info()
        width, height = (spec.get(name, info.get("defaults", {}).get(name)) for name in ("width", "height"))
        target = info.get("limits", {}).get("image", {}).get("target_size")
        image = spec.get("image")
        if target and isinstance(image, dict) and width is None and height is None:
            from dit.families import model_family  # importing `dit` takes seconds: only when asked

            try:
                family = model_family(self.served_model())
            except (OSError, ValueError):  # a model folder only the workers see: they size it as they run it
                return None
            height, width = family.video_size(image["height"], image["width"], target)
        return (width, height) if width and height else None

    def expires_at(self, job: Job) -> int | None:
        """When --keep-hours deletes the job (server/retention.py); None: kept until a client deletes it."""
        keep = self.config.keep_hours
        return math.ceil(job.finished_at + keep * 3600) if keep and job.terminal and job.finished_at else None

    def ready(self) -> bool:
        return self.supervisor.ready() if self.supervisor is not None else group_ready(self.store)

    def job(self, job_id: str) -> Job:
        job = self.store.get(job_id) if _ID.match(job_id) else None
        if job is None:
            raise HTTPException(404, f"no job {shown(job_id)}")
        return job

    def served_model(self) -> str:
        """The model the workers run, as they published it (the server's own setting before they have)."""
        return self.worker_info().get("model") or self.config.model

    def prompt_tokenizer(self):
        """The model's prompt tokenizer, loaded on first use (importing `dit` takes seconds; the API starts
        without it). None where this process cannot load it (a model folder only the workers see): the
        workers still check every prompt, as a failed job."""
        model = self.served_model()
        with self._tokenizer_lock:
            if model not in self._tokenizers:
                try:
                    from dit.pipeline import load_prompt_tokenizer

                    self._tokenizers[model] = load_prompt_tokenizer(model)
                except Exception as exc:
                    log.warning(
                        "prompt lengths are left to the workers: no tokenizer for %s here (%s)", model, exc
                    )
                    self._tokenizers[model] = None
            return self._tokenizers[model]

    def check_prompts(self, spec: dict) -> None:
        """The prompt rules of both APIs: text rules, then tokens against the limit the workers publish."""
        text_field("prompt", spec.get("prompt"), max_chars=MAX_PROMPT_CHARS, required=True)
        text_field("negative_prompt", spec.get("negative_prompt", ""), max_chars=MAX_PROMPT_CHARS)
        tokenizer = self.prompt_tokenizer()
        if tokenizer is None:
            return
        limits = self.worker_info().get("limits", {})
        for name in ("prompt", "negative_prompt"):
            limit = limits.get(name, {}).get("max_tokens", tokenizer.max_tokens)
            tokens = tokenizer.count_tokens(spec.get(name, ""))
            if tokens > limit:
                raise unprocessable(
                    name, f"{name} is {tokens} tokens long; the model accepts at most {limit}"
                )

    def submit(
        self,
        spec: dict,
        *,
        image: bytes | str | None = None,
        image_field: str = "image",
        meta: dict | None = None,
        idempotency_key: str | None,
        scope: str,
        body: dict,
    ) -> tuple[Job, bool]:
        """Queue a job for `spec` with its first-frame `image` (a file's bytes or a data URL; errors name
        `image_field`), kept as sent beside the job and described in its request. An Idempotency-Key
        belongs to its route family (`scope`) and to the request `body` (and image) it first came with: the
        same body replays the job, another one is a 409. A `spec` without a seed gets a random one, kept in
        the job (its `request.seed`), so a re-run or a resumed job makes the same video."""
        self.check_prompts(spec)
        if idempotency_key is not None and not 0 < len(idempotency_key) <= 255:
            # an empty one (a client's template left it blank) would be every such client's one key
            raise HTTPException(400, "Idempotency-Key must be 1 to 255 characters")
        key = None if idempotency_key is None else f"{scope}:{idempotency_key}"
        if key is not None and image is None:
            # a retry gets its job though the limits or the LoRA catalogue changed since: it was a 422 (the
            # LoRA it named gone) after an answer the client never got
            replayed = self.store.replayed(key, _digest(body))
            if replayed is not None:
                return replayed, False
        info = self.worker_info()
        errors = limits_mod.check(spec | {"image": image}, info.get("limits", {}))
        errors += loras.check(spec.get("loras"), info)
        if errors:
            raise HTTPException(422, [_error(image_field if f == "image" else f, m) for f, m in errors])
        # early, before the image is decoded; `create` counts for sure, after it looks a key up: a retry of a
        # request whose job is queued gets that job, however full the queue
        queued = self.store.queued_count() if idempotency_key is None else 0
        if queued >= self.config.max_queue:
            raise self._queue_full(queued)
        if image is not None:  # decoded only now: cheaper refusals come first
            data, media_type, described = self._input_image(image_field, image)
            spec, body = spec | {"image": described}, body | {"image": described}
        if spec.get("seed") is None:
            spec = spec | {"seed": secrets.randbelow(RANDOM_SEEDS)}  # not in `body`: a replay keeps its job's
        digest = _digest(body)
        job_id, created = uuid.uuid4().hex, False
        if image is not None:  # in place before the job exists, so no worker claims it without its image
            try:
                videos.write_input(self.config.videos_dir, job_id, data, media_type)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                raise HTTPException(  # as a full job store is: the server cannot take a job now
                    503, "the results folder's disk is full; free space there", headers={"Retry-After": "1"}
                ) from None
        try:
            job, created = self.store.create(
                spec, meta=meta, idempotency_key=key, request_hash=digest, job_id=job_id,
                max_queued=self.config.max_queue,
            )  # fmt: skip
        except QueueFull as exc:
            raise self._queue_full(exc.queued) from None
        except IdempotencyConflict as exc:
            raise HTTPException(
                409,
                f"Idempotency-Key {shown(idempotency_key)} was first used with a different request (job "
                f"{exc.args[0]}); send that request again to get its job, or use a new key",
            ) from None
        finally:
            if image is not None and not created:  # a replay (its job has its own file), or no job at all
                videos.remove_input(self.config.videos_dir, job_id)
        return job, created

    def _input_image(self, name: str, image: bytes | str) -> tuple[bytes, str, dict]:
        """`images.take`; 413: too many bytes or pixels, 415: not PNG, JPEG or WebP, 422: not an image,
        naming `name`."""
        try:
            return images.take(image, self.config.image_limits)
        except ImageError as e:
            raise HTTPException(_IMAGE_STATUS.get(type(e), 422), [_error(name, str(e))]) from None

    def _queue_full(self, queued: int) -> HTTPException:
        return HTTPException(
            429,
            f"the queue is full ({queued} job{'s' if queued != 1 else ''} waiting); retry later",
            headers={"Retry-After": str(self.retry_after(queued))},
        )

    def retry_after(self, queued: int) -> int:
        """Seconds until the queue has room, from the mean job duration so far; before any job ended, from
        how far the running jobs got in their time (it said 1 s to a crowd of 20 s jobs); 1 s when unknown."""
        counters = self.store.counters()
        count = counters.get("ithaca_job_duration_seconds_count", 0)
        if count:
            mean = counters.get("ithaca_job_duration_seconds_sum", 0.0) / count
        else:
            now = time.time()
            mean = min((((now - job.started_at) * 100 / job.progress) for job in self.store.in_progress()
                        if job.progress and job.started_at is not None), default=1.0)  # fmt: skip
        return max(1, min(3600, round(mean * max(1, queued - self.config.max_queue + 1))))

    def page(self, *, limit: int, after: str | None, **order) -> tuple[list[Job], bool]:
        """A page of both APIs' job lists; an `after` that names no job is a 404 saying so (an empty page
        would read as the end of the list); an empty one is none (a client's loop before its first page)."""
        try:
            return self.store.list(limit=limit, after=after or None, **order)
        except UnknownCursor:
            raise HTTPException(
                404, f"after={shown(after)} names no job; give the last_id of the page before"
            ) from None

    def cancel(self, job_id: str, *, delete: bool = False) -> Job:
        """Cancel (and with `delete`, hide) a job. The store decides atomically: a job that completed or
        failed first is refused with 409 unless deleted; a running one stops at its next step, or, past its
        last step, ends cancelled before its video is kept."""
        job = self.store.cancel(self.job(job_id).id, delete=delete)
        if job.status in ("completed", "failed") and not delete:
            raise HTTPException(409, f"job {job_id} already {job.status}; there is nothing to cancel")
        path = self._video_file(job)
        if delete and path is not None:
            with contextlib.suppress(FileNotFoundError):  # another server sharing the folder took it first
                os.remove(path)
        if delete and job.terminal:  # a running job may still be re-queued: its worker removes it at the end
            videos.remove_input(self.config.videos_dir, job.id)
        # and one no route reaches (a re-queue cleared it); a running job's later one goes with its worker
        if delete or (job.terminal and job.preview_step is None):
            videos.remove_preview(self.config.videos_dir, job.id)
        if job.terminal:  # cancelled while queued to run again: it never resumes from its checkpoint
            videos.remove_checkpoint(self.config.videos_dir, job.id)
        return job

    def preview(self, job: Job) -> bytes:
        """The job's latest live preview, a WebP (404 before its first, or when the file is gone)."""
        if job.preview_step is None:
            raise HTTPException(404, f"job {job.id} has no preview yet (status {job.status})")
        webp = videos.read_preview(self.config.videos_dir, job.id)
        if webp is None:  # written, but not here: another server's, its results folder not shared
            raise HTTPException(404, videos.missing_video(self.config, job, "preview"))
        return webp

    def _video_file(self, job: Job) -> str | None:
        """Where the job's MP4 is, inside the results folder and never anywhere else; None: it has none."""
        root = os.path.realpath(self.config.videos_dir)
        path = os.path.realpath(os.path.join(root, os.path.basename(job.video or "")))
        return path if job.status == "completed" and job.video and os.path.dirname(path) == root else None

    def video_path(self, job: Job) -> str:
        """The job's MP4 (404 until it is completed, or when the file is gone)."""
        path = self._video_file(job)
        if path is None:
            raise HTTPException(404, f"job {job.id} has no video (status {job.status})")
        if not os.path.isfile(path):
            raise HTTPException(404, f"the video of job {job.id} is gone")
        return path
