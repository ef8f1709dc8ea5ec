"""The callbacks a generation calls as it goes, shared by the one-job pipeline and batches (dit.batch)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

PhaseCallback = Callable[[str], None]  # hears "encoding", "denoising", "decoding" as each begins
FramesCallback = Callable[[np.ndarray], None]  # decoded uint8 frames [n, H, W, 3], in order
# (latent frames decoded, latent frames in all) → False stops the decode (DecodeCancelled)
DecodeCallback = Callable[[int, int], "bool | None"]


def goes_on(answer) -> bool:
    """A callback's answer: None (it returned nothing) or a true value goes on; False or any other false
    value (numpy's False, a 0-d tensor holding False, 0) stops. Only the object False stopped before."""
    return answer is None or bool(answer)


class RowAnswers(list):
    """A batch's answer to a step, one go-on per row (dit.batch): not one callback's answer, a list a user's
    callback may return."""


def enter_phase(on_phase: PhaseCallback | None, phase: str) -> None:
    if on_phase is not None:
        on_phase(phase)
