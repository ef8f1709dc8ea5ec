"""bench/job.py kept alive: one row per (model, ranks), every phase timed on the leader, the parts within the
total."""

from __future__ import annotations

import json

from bench import job


def test_rows_split_a_job_into_its_phases(capsys):
    job.main(["--models", "tiny-random", "--ranks", "1", "2", "--iters", "1", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["model"], r["ranks"]) for r in rows] == [("tiny-random", 1), ("tiny-random", 2)]
    for r in rows:
        parts = [r[phase] for phase in job.COLUMNS]
        assert min(parts) > 0 and sum(parts) <= r["total"]
