"""The multi-process harness itself: results come back in rank order, failures and hangs fail fast."""

import time

import pytest

from tests.distributed import DistError, run_distributed


def _rank_sum():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _fail_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank one")
    return "ok"


def _mismatched_collective():
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # a group of its own with a 2-second timeout: the pool's 15 s, waited out, was the suite's slowest wait
    group = dist.new_group(timeout=timedelta(seconds=2))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1), group=group)  # rank 1 never joins: must time out, not hang
    return "done"


def test_results_in_rank_order():
    assert run_distributed(3, _rank_sum) == [(0, 6.0), (1, 6.0), (2, 6.0)]


def _pid():
    import os

    return os.getpid()


def test_pools_of_two_and_four_ranks_stay_up_beside_one_other():
    two, four, three = (run_distributed(n, _pid) for n in (2, 4, 3))
    assert run_distributed(2, _pid) == two and run_distributed(4, _pid) == four  # the same processes
    assert run_distributed(3, _pid) == three
    five = run_distributed(5, _pid)  # takes the place of the 3 ranks
    assert run_distributed(3, _pid) != three and run_distributed(2, _pid) == two
    assert len({*two, *four, *five}) == 11


def test_error_on_one_rank_is_reported():
    with pytest.raises(DistError, match="boom on rank one"):
        run_distributed(2, _fail_on_rank_one)
    assert run_distributed(2, _rank_sum)[0] == (0, 3.0)  # a fresh pool replaced the failed one


def test_mismatched_collective_fails_fast():
    start = time.monotonic()
    with pytest.raises(DistError, match="(?s)rank 0.*[Tt]imed out"):
        run_distributed(2, _mismatched_collective, timeout=60)
    assert time.monotonic() - start < 15
