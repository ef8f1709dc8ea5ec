"""Batches of compatible jobs (dit.batch): each job's latents and frames against its solo run, on one rank and
over gloo layouts; a cancel of one job mid-batch; requests that cannot share a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dit.batch import BatchJob, batch_key, denoise_batch
from dit.pipeline import (
    DecodeCancelled,
    GenerationCancelled,
    GenerationRequest,
    PipelineConfig,
    load_pipeline,
)
from tests.distributed import run_distributed

SMALL = dict(num_frames=5, height=32, width=48, num_inference_steps=3)
# different seeds, prompts, negative prompts and guidance scales (all guided)
REQUESTS = [
    GenerationRequest("a red fox", seed=1, guidance_scale=5.0, **SMALL),
    GenerationRequest("a blue whale in the deep sea", negative_prompt="blurry", seed=2, guidance_scale=3.0,
                      **SMALL),
    GenerationRequest("rain on a window", seed=3, guidance_scale=7.5, **SMALL),
]  # fmt: skip
# HunyuanVideo-1.5 tiny: a short and a long text (a batch pads to the longest), both guided
JOINT_SIZE = dict(num_frames=9, height=48, width=80, num_inference_steps=2)
JOINT = [
    GenerationRequest("a cat", seed=1, **JOINT_SIZE),
    GenerationRequest('a sign that reads "OPEN" in the rain', seed=2, guidance_scale=3.0, **JOINT_SIZE),
]
# the bar; measured (2-core CPU box, torch 2.13.0 CPU, 2026-11-25): bit-identical on every model and
# layout here, since the layers whose kernels round a batch differently run per sample (dit.rowwise,
# parallel.padded_text, the ring's merge)
EXACT_REL = 1e-6


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def _load(model="tiny-random", sampler=None, mesh=None):
    config = PipelineConfig(model=model, device="cpu", **({"sampler": sampler} if sampler else {}))
    return load_pipeline(config, mesh)


@pytest.fixture(scope="module")
def pipe():
    return _load()


@pytest.fixture(scope="module")
def solo(pipe):
    return [pipe.denoise(req) for req in REQUESTS]


def test_each_job_of_a_batch_gets_its_solo_latents(pipe, solo):
    heard = []
    got = denoise_batch(pipe, [BatchJob(req, callback=lambda s, n, j=j: heard.append((j, s))) for j, req in
                               enumerate(REQUESTS)])  # fmt: skip
    for batched, alone in zip(got, solo, strict=True):
        assert batched.shape == alone.shape and rel(batched, alone) <= EXACT_REL
    assert sorted(heard) == [(j, s) for j in range(3) for s in (1, 2, 3)]  # each job its own progress


def test_the_trained_tiny_model_batches_exactly():
    """Its FFN at 12 tokens a sample is where a folded batch's product measured 5e-6 off (dit.rowwise)."""
    pipe = _load(model="tiny")
    got = denoise_batch(pipe, [BatchJob(req) for req in REQUESTS[:2]])
    assert all(rel(b, pipe.denoise(req)) <= EXACT_REL for b, req in zip(got, REQUESTS, strict=False))


def test_fp8_linear_and_attention_batch_exactly():
    """Their scales are a token's (linear) and a sample's head's (attention): a row quantises as alone."""
    config = PipelineConfig(model="tiny-random", device="cpu", quant="fp8", attn_backend="fp8")
    pipe = load_pipeline(config)
    got = denoise_batch(pipe, [BatchJob(req) for req in REQUESTS[:2]])
    assert all(rel(b, pipe.denoise(req)) <= EXACT_REL for b, req in zip(got, REQUESTS, strict=False))


def test_renoise_rows_draw_from_their_own_generators():
    pipe = _load(sampler="renoise")
    solo = [pipe.denoise(req) for req in REQUESTS[:2]]
    got = denoise_batch(pipe, [BatchJob(req) for req in REQUESTS[:2]])
    assert all(rel(b, a) <= EXACT_REL for b, a in zip(got, solo, strict=True))


def test_a_cancelled_job_leaves_and_the_others_go_on(pipe, solo):
    calls = []

    def stop_after_1(step, total):
        calls.append(step)
        return step < 1

    ended = []
    heard = []  # what job 1's `on_end` had heard when job 0 was asked at step 2

    def go_on(step, total):
        if step == 2:
            heard.extend(ended)

    jobs = [
        BatchJob(REQUESTS[0], callback=go_on),
        BatchJob(REQUESTS[1], callback=stop_after_1, on_end=ended.append),
        BatchJob(REQUESTS[2]),
    ]
    got = denoise_batch(pipe, jobs)
    assert isinstance(got[1], GenerationCancelled) and (got[1].step, got[1].total) == (1, 3)
    assert calls == [1]  # not asked again once it left
    assert heard == ended == [got[1]]  # told as it left, before the others' next step
    # UniPC's history of the rows that stay is theirs: equal to their solo runs
    assert rel(got[0], solo[0]) <= EXACT_REL and rel(got[2], solo[2]) <= EXACT_REL


def test_each_job_checkpoints_its_own_state_and_resumes_from_it_alone(pipe, solo):
    """A batch that stops after a checkpoint (its group died) leaves each job a state of its own: resumed
    alone, each ends at its solo latents. Job 1 leaves the batch at step 1: the step-2 states are the
    others'."""
    from dit.denoise_state import Checkpointing

    saved = {}
    stop_after_1 = BatchJob(REQUESTS[1], callback=lambda step, total: step < 1)
    jobs = [BatchJob(REQUESTS[0]), stop_after_1, BatchJob(REQUESTS[2])]
    checkpoints = Checkpointing(1, lambda pairs: saved.update({(j, state.step): state for j, state in pairs}))
    got = denoise_batch(pipe, jobs, checkpoints=checkpoints)
    assert sorted(saved) == [(0, 1), (0, 2), (1, 1), (2, 1), (2, 2)]  # none after the last step
    for j in (0, 2):
        assert saved[j, 2].latents.shape == solo[j].shape
        resumed = pipe.denoise(REQUESTS[j], resume=saved[j, 2])
        assert rel(resumed, solo[j]) <= EXACT_REL and rel(got[j], solo[j]) <= EXACT_REL
    assert rel(pipe.denoise(REQUESTS[1], resume=saved[1, 1]), solo[1]) <= EXACT_REL


def test_generate_batch_decodes_each_job(pipe):
    reqs = REQUESTS[:2]
    frames = [[], []]
    phases = []

    def heard(j):
        return lambda phase: phases.append((j, phase, bool(frames[0])))

    def ended(j):
        return lambda outcome: phases.append((j, "ended", outcome.shape))

    jobs = [
        BatchJob(req, on_frames=frames[j].append, on_phase=heard(j), on_end=ended(j))
        for j, req in enumerate(reqs)
    ]
    got = pipe.generate_batch(jobs, on_phase=phases.append)
    # the batch's phases, then each job's own decode as it begins (job 1's after job 0's frames), each job's
    # end as its decode ends
    assert phases == ["encoding", "denoising", "decoding", (0, "decoding", False), (0, "ended", got[0].shape),
                      (1, "decoding", True), (1, "ended", got[1].shape)]  # fmt: skip
    for j, req in enumerate(reqs):
        alone = pipe.generate(req)
        assert abs(got[j].astype(int) - alone.astype(int)).max() <= 1 and got[j].shape == (5, 32, 48, 3)
        assert np.array_equal(np.concatenate(frames[j]), got[j])


def test_a_job_stopped_in_its_decode_ends_cancelled_and_the_next_still_decodes(pipe):
    frames, ended = [[], []], []
    stops = [lambda done, total: done < 1, None]  # job 0 stops at its first latent frame
    jobs = [BatchJob(req, on_frames=frames[j].append, on_end=ended.append, decode_callback=stops[j])
            for j, req in enumerate(REQUESTS[:2])]  # fmt: skip
    got = pipe.generate_batch(jobs)
    assert isinstance(got[0], DecodeCancelled) and frames[0] == [] and ended == got
    assert np.array_equal(np.concatenate(frames[1]), got[1]) and got[1].shape == (5, 32, 48, 3)


def test_a_job_cancelled_while_it_waits_for_the_decode_before_its_own_ends_at_once(pipe):
    frames, ended = [[], [], []], []
    asked = []  # job 1 is cancelled as job 0's decode begins: it ends then, not at its own decode's turn
    stops = [None, lambda done, total: asked.append(done) or False, None]
    jobs = [BatchJob(req, on_frames=frames[j].append, on_end=lambda out, j=j: ended.append((j, out)),
                     decode_callback=stops[j]) for j, req in enumerate(REQUESTS)]  # fmt: skip
    got = pipe.generate_batch(jobs)
    assert [j for j, _ in ended] == [1, 0, 2] and asked == [0]  # asked once, before job 0's end
    assert type(got[1]) is GenerationCancelled and (got[1].step, got[1].total) == (3, 3) and frames[1] == []
    assert got[0].shape == got[2].shape == (5, 32, 48, 3)
    assert np.array_equal(np.concatenate(frames[2]), got[2])


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_frames=9), r"num_frames differs within the batch \(5 and 9\)"),
        (dict(guidance_scale=1.0), r"guidance_scale: guided \(not 1\) and unguided \(1\) requests differ"),
        (dict(loras=(("x", 1.0),)), r"loras"),
        (dict(cache="fbcache:0.1"), r"cache: a batch runs with the step cache off"),
    ],
)
def test_requests_that_cannot_share_a_batch_are_refused(pipe, change, message):
    from dataclasses import replace

    other = replace(REQUESTS[1], **change)
    first = other if "cache" in change else REQUESTS[0]
    with pytest.raises(ValueError, match=message):
        denoise_batch(pipe, [BatchJob(first), BatchJob(other)])
    assert batch_key(pipe.validate(REQUESTS[0])) == batch_key(pipe.validate(REQUESTS[2]))


def test_a_batch_says_which_job_is_wrong_and_takes_only_jobs(pipe):
    from dataclasses import replace

    wrong = [BatchJob(REQUESTS[0]), BatchJob(replace(REQUESTS[1], num_inference_steps=0))]
    with pytest.raises(ValueError, match=r"^job 1: num_inference_steps must be"):  # no job was named
        pipe.generate_batch(wrong)
    for bad, kind in ((None, "NoneType"), (list(REQUESTS[:2]), "a list of GenerationRequest")):  # deep inside
        with pytest.raises(TypeError, match=f"generate_batch takes a list of BatchJob, got {kind}"):
            pipe.generate_batch(bad)
    with pytest.raises(TypeError, match="a request is a GenerationRequest, got dict"):  # an AttributeError
        pipe.validate({"prompt": "a fox"})


def _layouts(layouts):
    """On every rank, per layout: the batch's outcomes (job 1 cancelled after step 2), jobs 0 and 2 alone;
    then HunyuanVideo-1.5 tiny (texts of different lengths: padded in the batch) per layout."""
    import parallel

    out = []
    for ulysses, ring, cfg in layouts:
        pipe = _load(mesh=parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg))
        stop_after_2 = BatchJob(REQUESTS[1], callback=lambda step, total: step < 2)
        batch = denoise_batch(pipe, [BatchJob(REQUESTS[0]), stop_after_2, BatchJob(REQUESTS[2])])
        out.append((batch, {j: pipe.denoise(REQUESTS[j]) for j in (0, 2)}))
    joint = []
    for ulysses, ring, cfg in layouts:
        pipe = _load(model="tiny-joint", mesh=parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg))
        batch = denoise_batch(pipe, [BatchJob(req) for req in JOINT])
        joint.append([rel(got, pipe.denoise(req)) for got, req in zip(batch, JOINT, strict=True)])
    return out, joint


def test_batches_over_ulysses_ring_and_cfg_parallel_match_their_solo_runs(solo):
    ranks = run_distributed(2, _layouts, [(2, 1, 1), (1, 2, 1), (1, 1, 2)], timeout=120)
    for layout in range(3):
        got, alone = ranks[0][0][layout]
        assert isinstance(got[1], GenerationCancelled) and got[1].step == 2
        for j in (0, 2):
            assert all(torch.equal(rank[0][layout][0][j], got[j]) for rank in ranks)
            assert rel(got[j], alone[j]) <= EXACT_REL, (layout, j, rel(got[j], alone[j]))
            assert rel(got[j], solo[j]) <= 1e-4  # the layout's own rounding (tests/test_pipeline_parallel.py)
    assert max(max(errors) for errors in ranks[0][1]) <= EXACT_REL, ranks[0][1]
