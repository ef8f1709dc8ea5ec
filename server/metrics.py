"""Prometheus text exposition, written by hand (a handful of series; no client library needed).

Histograms live as counters in the job store (`counters` table): the worker leader adds a finished job's
step latencies and duration there, so every API process sharing the store reports the same numbers, across
restarts.
"""

from __future__ import annotations

STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_HISTOGRAMS = {
    "ithaca_step_latency_seconds": (STEP_BUCKETS, "Wall time of one denoising step (all ranks)"),
    "ithaca_job_duration_seconds": (JOB_BUCKETS, "Wall time from claim to completion of a completed job"),
}


def _observe(deltas: dict, name: str, value: float) -> None:
    for le in _HISTOGRAMS[name][0]:
        if value <= le:
            deltas[f"{name}_bucket:{le}"] = deltas.get(f"{name}_bucket:{le}", 0) + 1
    deltas[f"{name}_count"] = deltas.get(f"{name}_count", 0) + 1
    deltas[f"{name}_sum"] = deltas.get(f"{name}_sum", 0.0) + value


def observations(step_times: list[float], job_seconds: float) -> dict[str, float]:
    """Counter increments for one completed job."""
    deltas: dict[str, float] = {}
    for t in step_times:
        _observe(deltas, "ithaca_step_latency_seconds", t)
    _observe(deltas, "ithaca_job_duration_seconds", job_seconds)
    return deltas


def render(*, counts: dict[str, int], counters: dict[str, float], restarts: int, ready: bool) -> str:
    lines = [
        "# HELP ithaca_queue_depth Jobs waiting to run",
        "# TYPE ithaca_queue_depth gauge",
        f"ithaca_queue_depth {counts.get('queued', 0)}",
        "# HELP ithaca_jobs Jobs in the store by state",
        "# TYPE ithaca_jobs gauge",
        *(f'ithaca_jobs{{state="{state}"}} {n}' for state, n in counts.items()),
        "# HELP ithaca_worker_restarts_total Worker group restarts by this server's supervisor",
        "# TYPE ithaca_worker_restarts_total counter",
        f"ithaca_worker_restarts_total {restarts}",
        "# HELP ithaca_ready Whether the worker group is loaded and answering",
        "# TYPE ithaca_ready gauge",
        f"ithaca_ready {int(ready)}",
    ]
    for name, (buckets, help_text) in _HISTOGRAMS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        # Prometheus buckets are cumulative; _observe already counted every bucket >= the value.
        lines += [
            f'{name}_bucket{{le="{le}"}} {int(counters.get(f"{name}_bucket:{le}", 0))}' for le in buckets
        ]
        count = int(counters.get(f"{name}_count", 0))
        lines += [
            f'{name}_bucket{{le="+Inf"}} {count}',
            f"{name}_count {count}",
            f"{name}_sum {counters.get(f'{name}_sum', 0.0)}",
        ]
    return "\n".join(lines) + "\n"
