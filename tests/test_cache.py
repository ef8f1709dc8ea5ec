"""Step caching (dit/cache.py) on the trained tiny model: off by default, threshold 0 is exact, a threshold
saves evaluations, and every rank of every layout takes the same decisions (gloo, CPU); the same for the
tiny HunyuanVideo-1.5 model (joint text attention)."""

from __future__ import annotations

import pytest
import torch

from dit.cache_config import CacheConfig
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed

# 24 steps: enough late steps whose first-block change is small for the cache to skip some
REQUEST = dict(prompt="a blue square moving up", num_frames=9, height=48, width=48, num_inference_steps=24,
               guidance_scale=3.0, seed=5)  # fmt: skip
CACHE = "fbcache"  # its default threshold (0.08) skips 14 of 48 evaluations here; latents within 8 %
EXACT_REL = 1e-4  # as tests/test_pipeline_parallel.py: exact layouts differ by float rounding only


# Random weights change the first block's output a lot from step to step: only a large threshold skips.
JOINT = dict(model="tiny-joint", cache="fbcache:0.9", steps=16)  # skips 10 of 32 evaluations here


def _pipeline(ulysses=None, ring=1, cfg=1, model="tiny"):
    import parallel
    from dit.pipeline import PipelineConfig, load_pipeline

    mesh = parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg)
    return load_pipeline(PipelineConfig(model=model, device="cpu"), mesh)


@pytest.fixture(scope="module")
def one_rank():
    pipe = _pipeline()
    off = pipe.denoise(GenerationRequest(**REQUEST))
    steps = REQUEST["num_inference_steps"]
    assert (pipe.evaluations.evaluated, pipe.evaluations.skipped) == (2 * steps, 0)  # counted uncached too
    cached = pipe.denoise(GenerationRequest(**REQUEST, cache=CACHE))
    return pipe, off, cached, pipe.evaluations


def test_parse():
    assert CacheConfig.parse(None) == CacheConfig("off")
    assert str(CacheConfig.parse("fbcache")) == "fbcache:0.08"
    assert CacheConfig.parse("fbcache:0.05") == CacheConfig("fbcache", 0.05)
    # the API's rule on the command line too: it took 1e-2, seven decimals, an empty threshold or setting
    for bad in ("teacache", "fbcache:x", "fbcache:2", "fbcache:-1", "fbcache:1e-2", "fbcache:0.1234567",
                "fbcache:", "", "off:0.1", 0.1):  # fmt: skip  # off takes no threshold (a key of its own)
        with pytest.raises(ValueError, match=r"from 0 to 1 in at most 6 decimals \(e.g. fbcache:0.05\), got"):
            CacheConfig.parse(bad)


def test_bad_request_cache_is_a_value_error(one_rank):
    pipe = one_rank[0]
    for bad in ("fbcache:high", 0.1):
        with pytest.raises(ValueError, match="cache"):
            pipe.validate(GenerationRequest(**REQUEST, cache=bad))
    with pytest.raises(ValueError, match=r"^cache must be off, fbcache, .*got 0.1$"):  # "cacheexpected"
        load_pipeline(PipelineConfig(cache=0.1))


def test_threshold_zero_is_the_uncached_run(one_rank):
    pipe, off = one_rank[:2]
    exact = pipe.denoise(GenerationRequest(**REQUEST, cache="fbcache:0"))
    assert torch.equal(exact, off)
    steps = REQUEST["num_inference_steps"]
    assert (pipe.evaluations.evaluated, pipe.evaluations.skipped) == (2 * steps, 0)


def test_cache_saves_evaluations_and_stays_close(one_rank):
    _, off, cached, stats = one_rank
    steps = REQUEST["num_inference_steps"]
    assert stats.evaluated + stats.skipped == 2 * steps
    assert stats.skipped >= 4 and stats.skipped % 2 == 0, stats  # both CFG halves skip together
    rel = ((cached - off).abs().max() / off.abs().max()).item()
    assert 0 < rel < 0.15, rel


LAYOUTS = {2: [(2, 1, 1), (1, 2, 1), (1, 1, 2)], 4: [(4, 1, 1), (2, 2, 1), (2, 1, 2)]}


def _cached_on_ranks(layouts, model="tiny", cache=CACHE, steps=REQUEST["num_inference_steps"]):
    out = []
    request = GenerationRequest(**REQUEST | dict(num_inference_steps=steps, cache=cache))
    for layout in layouts:
        pipe = _pipeline(*layout, model=model)
        latents = pipe.denoise(request)
        out.append((latents, pipe.evaluations))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_every_layout_takes_the_same_decisions(one_rank, world):
    """Ulysses, ring, hybrid and CFG parallel (the negative prompt's ranks follow the prompt's decision)
    skip the same steps as one rank and end with its latents."""
    _, _, ref, ref_stats = one_rank
    ranks = run_distributed(world, _cached_on_ranks, LAYOUTS[world], timeout=240)
    for i, layout in enumerate(LAYOUTS[world]):
        for rank in ranks:
            latents, stats = rank[i]
            assert stats == ref_stats, (layout, stats, ref_stats)
            rel = ((latents - ref).abs().max() / ref.abs().max()).item()
            assert rel <= EXACT_REL, (layout, rel)


@pytest.mark.slow  # every layout
def test_hunyuan_caches_alike_on_every_layout():
    """HunyuanVideo-1.5's dual-stream blocks: the first block carries the text stream on to the others, a
    skipped step reuses the image stream's residual; Ulysses, ring and CFG parallel decide as one rank."""
    (ref, ref_stats), (off, _) = _cached_on_ranks([(None, 1, 1)], **JOINT) + _cached_on_ranks(
        [(None, 1, 1)], **JOINT | {"cache": "off"}
    )
    assert ref_stats.skipped >= 4 and ref_stats.evaluated + ref_stats.skipped == 2 * JOINT["steps"]
    assert 0 < ((ref - off).abs().max() / off.abs().max()).item() < 0.15
    ranks = run_distributed(2, _cached_on_ranks, LAYOUTS[2], **JOINT, timeout=240)
    for i, layout in enumerate(LAYOUTS[2]):
        for rank in ranks:
            latents, stats = rank[i]
            assert stats == ref_stats, (layout, stats, ref_stats)
            rel = ((latents - ref).abs().max() / ref.abs().max()).item()
            assert rel <= EXACT_REL, (layout, rel)
