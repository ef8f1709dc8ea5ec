"""Step caching (dit/cache.py) on the trained tiny model: off by default, threshold 0 is exact, a threshold
saves evaluations, and every rank of every layout takes the same decisions (gloo, CPU)."""

from __future__ import annotations

import pytest
import torch

from dit.cache import CacheConfig
from dit.pipeline import GenerationRequest
from tests.distributed import run_distributed

# 24 steps: enough late steps whose first-block change is small for the cache to skip some
REQUEST = dict(prompt="a blue square moving up", num_frames=9, height=48, width=48, num_inference_steps=24,
               guidance_scale=3.0, seed=5)  # fmt: skip
CACHE = "fbcache"  # its default threshold (0.08) skips 14 of 48 evaluations here; latents within 8 %
EXACT_REL = 1e-4  # as tests/test_pipeline_parallel.py: exact layouts differ by float rounding only


def _pipeline(ulysses=None, ring=1, cfg=1):
    import parallel
    from dit.pipeline import PipelineConfig, load_pipeline

    mesh = parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg)
    return load_pipeline(PipelineConfig(model="tiny", device="cpu"), mesh)


@pytest.fixture(scope="module")
def one_rank():
    pipe = _pipeline()
    off = pipe.denoise(GenerationRequest(**REQUEST))
    assert pipe.cache_stats is None
    cached = pipe.denoise(GenerationRequest(**REQUEST, cache=CACHE))
    return pipe, off, cached, pipe.cache_stats


def test_parse():
    assert CacheConfig.parse(None) == CacheConfig("off")
    assert str(CacheConfig.parse("fbcache")) == "fbcache:0.08"
    assert CacheConfig.parse("fbcache:0.05") == CacheConfig("fbcache", 0.05)
    for bad in ("teacache", "fbcache:x", "fbcache:2", "fbcache:-1"):
        with pytest.raises(ValueError, match="cache"):
            CacheConfig.parse(bad)


def test_bad_request_cache_is_a_value_error(one_rank):
    pipe = one_rank[0]
    for bad in ("fbcache:high", 0.1):
        with pytest.raises(ValueError, match="cache"):
            pipe.validate(GenerationRequest(**REQUEST, cache=bad))


def test_threshold_zero_is_the_uncached_run(one_rank):
    pipe, off = one_rank[:2]
    exact = pipe.denoise(GenerationRequest(**REQUEST, cache="fbcache:0"))
    assert torch.equal(exact, off)
    steps = REQUEST["num_inference_steps"]
    assert (pipe.cache_stats.evaluated, pipe.cache_stats.skipped) == (2 * steps, 0)


def test_cache_saves_evaluations_and_stays_close(one_rank):
    _, off, cached, stats = one_rank
    steps = REQUEST["num_inference_steps"]
    assert stats.evaluated + stats.skipped == 2 * steps
    assert stats.skipped >= 4 and stats.skipped % 2 == 0, stats  # both CFG halves skip together
    rel = ((cached - off).abs().max() / off.abs().max()).item()
    assert 0 < rel < 0.15, rel


LAYOUTS = {2: [(2, 1, 1), (1, 2, 1), (1, 1, 2)], 4: [(4, 1, 1), (2, 2, 1), (2, 1, 2)]}


def _cached_on_ranks(layouts):
    out = []
    for layout in layouts:
        pipe = _pipeline(*layout)
        latents = pipe.denoise(GenerationRequest(**REQUEST, cache=CACHE))
        out.append((latents, pipe.cache_stats))
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
