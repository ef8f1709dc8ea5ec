"""Prometheus text exposition, written by hand (a handful of series; no client library needed).

Histograms live as counters in the job store (`counters` table): the worker leader adds a finished job's
step latencies, duration and phase seconds there, so every API process sharing the store reports the same
numbers, across restarts.
"""

from __future__ import annotations

from server.store import TIMED_PHASES

STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
EVALUATIONS = "ithaca_transformer_evaluations_total"
LORA_SWITCHES = "ithaca_lora_switches_total"
LORA_SWITCH_SECONDS = "ithaca_lora_switch_seconds_total"
RESULTS = ("evaluated", "skipped")
# name → (buckets, help, (label, its values) or None)
_HISTOGRAMS = {
    "ithaca_step_latency_seconds": (STEP_BUCKETS, "Wall time of one denoising step (all ranks)", None),
    "ithaca_job_duration_seconds": (
        JOB_BUCKETS,
        "Wall time from claim to completion of a completed job",
        None,
    ),
    "ithaca_job_phase_seconds": (
        PHASE_BUCKETS,
        "Seconds a completed job spent in each phase (the text encoding, the denoising, the VAE decode, "
        "writing the MP4)",
        ("phase", TIMED_PHASES),
    ),
}


def _key(name: str, part: str, label_value: str | None) -> str:
    """The series' counter in the store (unlabelled ones keep the names earlier versions stored)."""
    return f"{name}_{part}" + (f":{label_value}" if label_value else "")


def _observe(deltas: dict, name: str, value: float, label_value: str | None = None) -> None:
    keys = [_key(name, f"bucket:{le}", label_value) for le in _HISTOGRAMS[name][0] if value <= le]
    for key in [*keys, _key(name, "count", label_value)]:
        deltas[key] = deltas.get(key, 0) + 1
    key = _key(name, "sum", label_value)
    deltas[key] = deltas.get(key, 0.0) + value


def observations(
    step_times: list[float], job_seconds: float, phases: dict[str, float], evaluations
) -> dict[str, float]:
    """Counter increments for one completed job; `phases`: seconds of each phase it went through;
    `evaluations`: its transformer passes run and skipped (dit.cache.Evaluations)."""
    deltas: dict[str, float] = {f"{EVALUATIONS}:{result}": getattr(evaluations, result) for result in RESULTS}
    for t in step_times:
        _observe(deltas, "ithaca_step_latency_seconds", t)
    _observe(deltas, "ithaca_job_duration_seconds", job_seconds)
    for phase, seconds in phases.items():
        _observe(deltas, "ithaca_job_phase_seconds", seconds, phase)
    return deltas


def lora_switches(count: int, seconds: float | None) -> dict[str, float]:
    """Counter increments for `count` LoRA switches of a replica, the last of which took `seconds`."""
    return {LORA_SWITCHES: count} | ({LORA_SWITCH_SECONDS: seconds} if seconds is not None else {})


def render(
    *,
    counts: dict[str, int] | None,
    counters: dict[str, float] | None,
    restarts: int,
    ready: bool,
    comm: dict | None = None,
) -> str:
    """The exposition; `counts` and `counters` None: the store did not answer, and the series it holds are
    left out (`ithaca_store_up` 0), so a scrape still reads the rest."""
    lines = [
        "# HELP ithaca_store_up Whether the job store answered this scrape",
        "# TYPE ithaca_store_up gauge",
        f"ithaca_store_up {int(counts is not None)}",
    ]
    if counts is not None:
        lines += [
            "# HELP ithaca_queue_depth Jobs waiting to run",
            "# TYPE ithaca_queue_depth gauge",
            f"ithaca_queue_depth {counts.get('queued', 0)}",
            "# HELP ithaca_jobs Jobs in the store by state",
            "# TYPE ithaca_jobs gauge",
            *(f'ithaca_jobs{{state="{state}"}} {n}' for state, n in counts.items()),
        ]
    lines += [
        "# HELP ithaca_worker_restarts_total Worker group restarts by this server's supervisor",
        "# TYPE ithaca_worker_restarts_total counter",
        f"ithaca_worker_restarts_total {restarts}",
        "# HELP ithaca_ready Whether the worker group is loaded and answering",
        "# TYPE ithaca_ready gauge",
        f"ithaca_ready {int(ready)}",
    ]
    if counters is not None:
        lines += _counted(counters)
    if comm:
        lines += [
            "# HELP ithaca_comm_mode The sequence-parallel exchange in use (1 for its mode)",
            "# TYPE ithaca_comm_mode gauge",
            f'ithaca_comm_mode{{mode="{comm["mode"]}"}} 1',
        ]
        if comm.get("probe"):
            probed = [row for row in comm["probe"] if row["ms"] is not None]  # ruled-out modes have no time
            lines += [
                "# HELP ithaca_comm_probe_ms --comm auto: ms per attention call of each exchange at start-up "
                "(the slowest rank's median; a mode ruled out has none)",
                "# TYPE ithaca_comm_probe_ms gauge",
                *(f'ithaca_comm_probe_ms{{mode="{row["mode"]}"}} {row["ms"]:.4g}' for row in probed),
            ]
    if counters is not None:
        lines += _histograms(counters)
    return "\n".join(lines) + "\n"


def _counted(counters: dict[str, float]) -> list[str]:
    """The store's counters: transformer evaluations and LoRA switches."""
    return [
        f"# HELP {EVALUATIONS} Transformer passes of completed jobs (one per CFG pass per step), run in "
        "full or skipped by the step cache",
        f"# TYPE {EVALUATIONS} counter",
        *(f'{EVALUATIONS}{{result="{r}"}} {int(counters.get(f"{EVALUATIONS}:{r}", 0))}' for r in RESULTS),
        f"# HELP {LORA_SWITCHES} Changes of a replica's applied LoRA set (--lora-dir) between jobs, to "
        "another set or back to the base weights",
        f"# TYPE {LORA_SWITCHES} counter",
        f"{LORA_SWITCHES} {int(counters.get(LORA_SWITCHES, 0))}",
        f"# HELP {LORA_SWITCH_SECONDS} Seconds those switches took (base restored, files read, merged)",
        f"# TYPE {LORA_SWITCH_SECONDS} counter",
        f"{LORA_SWITCH_SECONDS} {counters.get(LORA_SWITCH_SECONDS, 0.0)}",
    ]


def _histograms(counters: dict[str, float]) -> list[str]:
    lines = []
    for name, (buckets, help_text, label) in _HISTOGRAMS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for value in label[1] if label else [None]:
            labels = {label[0]: value} if label else {}
            count = int(counters.get(_key(name, "count", value), 0))
            # Prometheus buckets are cumulative; _observe already counted every bucket >= the value.
            cumulative = {le: int(counters.get(_key(name, f"bucket:{le}", value), 0)) for le in buckets}
            lines += [
                f"{_series(f'{name}_bucket', **labels, le=le)} {n}"
                for le, n in (cumulative | {"+Inf": count}).items()
            ]
            lines += [
                f"{_series(f'{name}_count', **labels)} {count}",
                f"{_series(f'{name}_sum', **labels)} {counters.get(_key(name, 'sum', value), 0.0)}",
            ]
    return lines


def _series(name: str, **labels) -> str:
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
