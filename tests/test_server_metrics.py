"""/metrics exposition on its own: the per-phase histogram beside the unlabelled ones, the evaluation
counter."""

from __future__ import annotations

from dit.cache import Evaluations
from server import metrics


def test_phase_seconds_histogram_counts_each_phase_under_its_label():
    counters: dict[str, float] = {}
    jobs = [{"encoding": 0.02, "denoising": 0.3, "decoding": 0.3, "writing": 0.04}, {"denoising": 2.0}]
    for phases in jobs:
        for name, delta in metrics.observations([0.1], 1.0, phases, Evaluations(6, 2)).items():
            counters[name] = counters.get(name, 0) + delta
    text = metrics.render(counts={}, counters=counters, restarts=0, ready=True)
    lines = set(text.splitlines())
    assert "# TYPE ithaca_job_phase_seconds histogram" in lines
    assert {
        'ithaca_job_phase_seconds_bucket{phase="denoising",le="0.25"} 0',
        'ithaca_job_phase_seconds_bucket{phase="denoising",le="0.5"} 1',
        'ithaca_job_phase_seconds_bucket{phase="denoising",le="+Inf"} 2',
        'ithaca_job_phase_seconds_count{phase="denoising"} 2',
        'ithaca_job_phase_seconds_sum{phase="denoising"} 2.3',
        'ithaca_job_phase_seconds_count{phase="writing"} 1',
        'ithaca_job_phase_seconds_bucket{phase="writing",le="0.05"} 1',
    } <= lines
    assert "ithaca_step_latency_seconds_count 2" in lines  # unlabelled, named as before
    assert 'ithaca_job_duration_seconds_bucket{le="1.0"} 2' in lines
    assert text.count("# TYPE ithaca_job_phase_seconds histogram") == 1  # one family, four series
    assert 'ithaca_transformer_evaluations_total{result="evaluated"} 12' in lines
    assert 'ithaca_transformer_evaluations_total{result="skipped"} 4' in lines


def test_an_empty_store_renders_zero_evaluations():
    text = metrics.render(counts={}, counters={}, restarts=0, ready=False)
    assert "# TYPE ithaca_transformer_evaluations_total counter" in text
    assert 'ithaca_transformer_evaluations_total{result="skipped"} 0' in text
