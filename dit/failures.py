"""A job's own failure, the same on every rank of its replica.

Any other exception in a job ends the worker group (a rank may be inside a collective the others left), and
the supervisor re-queues its jobs. A failure the job itself causes — a LoRA set that cannot be applied, a
decode that overflows — would only meet a re-run again, so it is raised on every rank at the same point as
`GenerationFailed`, and the worker fails the job and goes on. `alike` makes a failure seen on one rank (a
file on one host, one band of the video) every rank's before the next collective. (A request the pipeline
refuses never reaches the ranks: the worker's leader validates it when it claims the job.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import parallel


class GenerationFailed(RuntimeError):
    """The job's own failure, which a run again would meet again, raised on every rank of the replica at the
    same point: the job fails, the group goes on to the next."""


class GenerationCancelled(RuntimeError):
    """Raised on every rank of the replica when the callback asked to stop; `step` = steps completed."""

    def __init__(self, step: int, total: int):
        super().__init__(f"generation cancelled after step {step} of {total}")
        self.step, self.total = step, total

    def __reduce__(self):  # pickles with its numbers (a batch's outcomes cross processes)
        return type(self), (self.step, self.total)


class DecodeCancelled(GenerationCancelled):
    """Raised on every rank of the replica when the decode's callback asked to stop, after every step:
    `frame` of the video's `frames` latent frames were decoded (`step` and `total` are the decode's caller's
    to know: None)."""

    def __init__(self, frame: int, frames: int):
        message = f"generation cancelled while decoding, after latent frame {frame} of {frames}"
        RuntimeError.__init__(self, message)
        self.frame, self.frames = frame, frames
        self.step = self.total = None

    def __reduce__(self):
        return type(self), (self.frame, self.frames)


def alike(
    fn: Callable, group, device: torch.device, errors: tuple[type[Exception], ...] = (GenerationFailed,)
):
    """`fn()` on this rank, every rank of `group` (None: this rank alone) calling it at the same point. When
    it raised one of `errors` on any rank, the lowest such rank's is raised on every rank, as a
    GenerationFailed (another exception's type named in its text) or as the GenerationCancelled it is."""
    try:
        result, failed = fn(), None
    except errors as e:
        result, failed = None, e
        if not isinstance(e, (GenerationFailed, GenerationCancelled)):
            failed = GenerationFailed(f"{type(e).__name__}: {e}")
    if group is not None:
        failed = parallel.first_failure(failed, group, device)
    if failed is not None:
        raise failed
    return result
