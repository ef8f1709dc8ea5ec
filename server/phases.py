"""Where a job's time went: the seconds of each phase (encoding, denoising, decoding, writing) and of its
steps, as the worker records them on the job and bench/job.py prints them."""

from __future__ import annotations

import time


class PhaseClock:
    """Seconds spent in each phase of one job (the worker records them, bench/job.py prints them)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._phase, self._since = None, time.perf_counter()

    def enter(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self._phase is not None:
            self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + now - self._since
        self._phase, self._since = phase, now

    @property
    def timings(self) -> dict[str, float]:
        """The finished phases' seconds under the job view's keys ("encoding_s", ...)."""
        return {f"{phase}_s": seconds for phase, seconds in self.seconds.items()}


def job_timings(start: float, step_times: list[float], phases: PhaseClock) -> dict:
    phases.enter(None)
    return {
        "total_s": time.perf_counter() - start,
        "steps": len(step_times),
        "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
        **phases.timings,
    }
