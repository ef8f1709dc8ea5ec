"""bench/job.py kept alive: one row per (model, variant, ranks), every phase timed on the leader, the parts
within the total; a throughput row per worker (waiting for each MP4, handing it off), its jobs completed."""

from __future__ import annotations

import json

import pytest

from bench import job


@pytest.mark.slow
def test_rows_split_a_job_into_its_phases(capsys):
    argv = ["--models", "tiny-random", "--ranks", "1", "2", "--iters", "1", "--queued", "2", "--json"]
    argv += ["--request", "num_frames=5", "--request", "num_inference_steps=3"]  # the phases, not the size
    job.main([*argv, "--vary", "parallel_decode=false", "--vary", "cache=fbcache:0.5"])
    printed = json.loads(capsys.readouterr().out)
    rows = printed["rows"]
    variants = ["", "parallel_decode=false", "cache=fbcache:0.5"]
    assert [(r["variant"], r["ranks"]) for r in rows] == [(v, n) for v in variants for n in (1, 2)]
    assert [r["request"]["cache"] for r in rows] == ["off"] * 4 + ["fbcache:0.5"] * 2
    for r in rows:
        parts = [r[phase] for phase in job.COLUMNS]
        assert min(parts) > 0 and sum(parts) <= r["total"]
    throughput = printed["throughput"]  # their jobs completed, each with its MP4 (_jobs_per_minute checks)
    assert [r["worker"] for r in throughput] == list(job.WORKERS)
    assert all(r["jobs_per_min"] > 0 and r["request"]["num_inference_steps"] == 3 for r in throughput)


def test_an_unknown_field_is_refused(capsys):
    with pytest.raises(SystemExit):
        job.main(["--vary", "no_such_field=1"])
    assert "no_such_field" in capsys.readouterr().err
