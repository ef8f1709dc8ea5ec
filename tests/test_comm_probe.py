"""`parallel.probe_comm` and `dit.comm_choice.choose_comm` on gloo CPU ranks: one row per mode and one choice
on every rank; a slow, raising or hanging exchange is ruled out on every rank (faults injected by patching
torch.distributed.all_to_all_single inside the rank function); the tiny pipeline after `choose_comm` still
matches one rank (last but one: it imports the pipeline into the 2-rank pool; the 4-rank pool comes last).
The probe tests import only `parallel` on the ranks, so a pool starts in seconds."""

from __future__ import annotations

import threading
import time

import torch

from parallel import ProbeRow
from parallel.probe import choose
from tests.distributed import run_distributed

SHAPE = (1, 64, 4, 16)  # [B, S_local, H, D]: 4 heads split over Ulysses 4
TIMEOUT_S = 2.0
EXACT_REL = 1e-4  # tests/test_pipeline_parallel.py's float32 bound (importing it would import the pipeline)


def _probe(fault=None, **kwargs):
    """probe_comm on this rank with all_to_all_single replaced by fault(rank, original) when given."""
    import torch.distributed as dist

    import parallel

    mesh = parallel.init_parallel()
    original = dist.all_to_all_single
    if fault is not None:
        dist.all_to_all_single = fault(mesh.rank, original)
    try:
        start = time.monotonic()
        result = parallel.probe_comm(mesh, SHAPE, timeout_s=TIMEOUT_S, iters=3, **kwargs)
        return result, time.monotonic() - start
    finally:
        dist.all_to_all_single = original


def _slow(rank, original):
    def all_to_all_single(*args, **kwargs):
        time.sleep(0.05)
        return original(*args, **kwargs)

    return all_to_all_single


def _raises_on_rank_1(rank, original):
    def all_to_all_single(*args, **kwargs):
        if rank == 1:
            raise RuntimeError("injected all_to_all failure")
        return original(*args, **kwargs)

    return all_to_all_single


def _hangs_on_rank_1(rank, original):
    never = threading.Event()

    def all_to_all_single(*args, **kwargs):
        if rank == 1:
            never.wait()  # a rank stuck outside any collective: only the probe's thread deadline ends it
        return original(*args, **kwargs)

    return all_to_all_single


def _check_rows_and_choice(world):
    ranks = run_distributed(world, _probe, allow_lossy=True, margin=0.0, timeout=60)
    result = ranks[0][0]
    assert all(r == result for r, _ in ranks)  # rows and choice identical on every rank
    exact, lossy = ["alltoall", "p2p"], ["fp8", "p2p+fp8"]  # each plain, then in 2 overlapped head chunks
    heads_a_rank = SHAPE[2] // world  # 2 at world 2 (2 chunks, not 4), 1 at world 4 (no chunks)
    overlap2 = lambda modes: [f"{m}+overlap2" for m in modes] if heads_a_rank >= 2 else []  # noqa: E731
    assert [row.mode for row in result.rows] == exact + overlap2(exact) + lossy + overlap2(lossy)
    assert all(row.error is None and row.ms > 0 for row in result.rows), result.summary()
    assert result.chosen == min(result.rows, key=lambda row: row.ms).mode
    assert result.shape == SHAPE and result.dtype == "float32"


def test_probe_rows_and_one_choice_on_every_rank_2():
    _check_rows_and_choice(2)


def test_a_later_mode_wins_only_by_more_than_the_margin():
    rows = [ProbeRow("alltoall", 10.0), ProbeRow("fp8", None, "rank 1: timed out"), ProbeRow("p2p", 9.6)]
    assert choose(rows, 0.05) == "alltoall" and choose(rows, 0.0) == "p2p"
    assert choose([*rows, ProbeRow("p2p+fp8", 9.0)], 0.05) == "p2p+fp8"
    assert choose(rows[1:2], 0.05) is None


def test_lossy_modes_only_when_allowed():
    ranks = run_distributed(2, _probe, timeout=60)
    assert [row.mode for row in ranks[0][0].rows] == ["alltoall", "p2p", "alltoall+overlap2", "p2p+overlap2"]


def _probe_ring_only():
    import parallel

    return parallel.probe_comm(parallel.init_parallel(ulysses=1, ring=2), SHAPE, timeout_s=TIMEOUT_S, iters=3)


def test_a_ring_only_layout_times_no_exchange():
    """Attention takes no all-to-all at ulysses 1, whatever the mode: timing one "chose" noise."""
    result = run_distributed(2, _probe_ring_only, timeout=60)[0]
    assert result.rows == () and result.summary() == "no all-to-all (ulysses 1) -> alltoall"


def test_slow_all_to_all_picks_p2p():
    ranks = run_distributed(2, _probe, _slow, timeout=60)
    result = ranks[0][0]
    assert all(r == result for r, _ in ranks)
    assert result.chosen in ("p2p", "p2p+overlap2"), result.summary()
    assert result.rows[0].ms > 50  # every alltoall call waited 50 ms


def test_mode_raising_on_one_rank_is_ruled_out_on_all():
    ranks = run_distributed(2, _probe, _raises_on_rank_1, allow_lossy=True, timeout=60)
    result = ranks[0][0]
    assert all(r == result for r, _ in ranks)
    rows = {row.mode: row for row in result.rows}
    for mode in ("alltoall", "fp8"):  # both exchange through all_to_all_single
        assert rows[mode].ms is None and "injected all_to_all failure" in rows[mode].error, rows[mode]
    assert rows["p2p"].error is None and rows["p2p+fp8"].error is None
    assert result.chosen.startswith("p2p")  # plain, FP8 or overlapped: the fastest of those that ran


def test_mode_hanging_on_one_rank_is_ruled_out_within_the_timeout():
    ranks = run_distributed(2, _probe, _hangs_on_rank_1, modes=("alltoall", "p2p"), timeout=60)
    result = ranks[0][0]
    assert all(r == result for r, _ in ranks)
    assert "timed out" in result.rows[0].error.lower() and result.rows[0].ms is None, result.summary()
    assert result.chosen == "p2p"
    # one mode runs out its timeout, the other takes well under a second
    assert max(elapsed for _, elapsed in ranks) < TIMEOUT_S + 3.0


def _choose_and_denoise():
    import parallel
    from dit.comm_choice import attention_shape, choose_comm
    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
    from tests.test_pipeline_parallel import REQUEST

    req, config, mesh = (
        GenerationRequest(**REQUEST),
        PipelineConfig(model="tiny", device="cpu"),
        parallel.init_parallel(),
    )
    # one rank's latents, from a world-1 mesh on rank 0 (the test process then never imports the pipeline)
    ref = load_pipeline(config, parallel.ParallelMesh()).denoise(req) if mesh.rank == 0 else None
    pipe = load_pipeline(config, mesh)
    mode, result = choose_comm(pipe, mesh, allow_lossy=False, timeout_s=10.0, iters=2)
    applied = (pipe.config.comm, pipe.model.sequence_parallel.comm)
    latents = pipe.denoise(req)
    pipe.set_comm("p2p" if mode == "alltoall" else "alltoall")  # the other exact mode gives the same latents
    other = pipe.denoise(req)
    return dict(mode=mode, result=result, applied=applied, shape=attention_shape(pipe), latents=latents,
                other=other, ref=ref)  # fmt: skip


def test_choose_comm_on_tiny_pipeline_matches_one_rank():
    ranks = run_distributed(2, _choose_and_denoise, timeout=120)
    first, ref = ranks[0], ranks[0]["ref"]
    # the fastest exact mode wins; which one depends on the box's load (overlapped chunks included)
    assert "fp8" not in first["mode"] and first["applied"] == (first["mode"], first["mode"])
    # trained tiny's default 17 × 64 × 64: 5 latent frames of 8 × 8 in 2 × 2 patches = 80 tokens, 40 a rank
    assert first["shape"] == (1, 40, 4, 32) and first["result"].shape == first["shape"]
    for rank in ranks:
        assert rank["mode"] == first["mode"] and rank["result"] == first["result"]
        for latents in (rank["latents"], rank["other"]):
            assert torch.equal(latents, first["latents"])
            rel = ((latents - ref).abs().max() / ref.abs().max()).item()
            assert rel < EXACT_REL, rel


def test_probe_rows_and_one_choice_on_every_rank_4():
    _check_rows_and_choice(4)
