"""Wan2.2 A14B's two experts (dit/wan/experts.py): a folder with transformer/ and transformer_2/ and a
boundary ratio gives diffusers' WanPipeline latents from the same noise, each expert with its own guidance;
both experts run sequence-parallel and CFG-parallel equal to one rank; the step cache starts afresh when the
low-noise expert takes over; the checks of `guidance_scale_2`."""

from __future__ import annotations

import pytest
import torch

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed
from tests.test_pipeline_folder import _reference_kwargs

BOUNDARY = 0.875  # Wan2.2 T2V's: the high-noise expert runs the timesteps ≥ 875
REQUEST = dict(prompt="a red fox in snow", negative_prompt="blurry", num_frames=5, height=32, width=32,
               num_inference_steps=6, guidance_scale=5.0, guidance_scale_2=2.0, seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """tests/test_pipeline_folder.py's tiny published layout with a second expert and a boundary."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from tests.test_pipeline_folder import folders

    base = folders.__wrapped__(tmp_path_factory)["unipc"]
    pipe = WanPipeline.from_pretrained(base)
    torch.manual_seed(1)
    second = WanTransformer3DModel(**pipe.transformer.config)
    pipe = WanPipeline(**pipe.components | {"transformer_2": second}, boundary_ratio=BOUNDARY)
    root = tmp_path_factory.mktemp("wan22") / "a14b"
    pipe.save_pretrained(root)
    return root


def test_two_experts_match_diffusers(folder):
    from diffusers import WanPipeline

    ours = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    assert ours.boundary == BOUNDARY and ours.model_2 is not None
    ref = WanPipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    timesteps = ref.scheduler.set_timesteps(REQUEST["num_inference_steps"]) or ref.scheduler.timesteps
    assert (timesteps >= BOUNDARY * 1000).any() and (timesteps < BOUNDARY * 1000).any()  # both experts run
    for fields in ({}, {"guidance_scale_2": None}, {"guidance_scale": 1.0, "guidance_scale_2": 1.0}):
        req = GenerationRequest(**REQUEST | fields)
        got = ours.denoise(req)
        kwargs = _reference_kwargs(ours.validate(req))
        want = ref(**kwargs, output_type="latent").frames
        rel = ((got - want).abs().max() / want.abs().max()).item()
        assert rel <= 1e-4, (fields, rel)


def test_guidance_2_is_checked():
    one = load_pipeline(PipelineConfig(model="tiny-random", device="cpu"))
    with pytest.raises(ValueError, match="guidance_scale_2 is for two-expert models"):
        one.validate(GenerationRequest("a fox", guidance_scale_2=2.0))
    two = load_pipeline(PipelineConfig(model="tiny-moe-random", device="cpu"))
    assert two.validate(GenerationRequest("a fox", guidance_scale=4.0)).guidance_scale_2 == 4.0
    with pytest.raises(ValueError, match="guidance_scale_2 must be between 1.0 and 20.0"):
        two.validate(GenerationRequest("a fox", guidance_scale_2=0.5))
    with pytest.raises(ValueError, match="each expert takes its own file"):
        load_pipeline(PipelineConfig(model="tiny-moe-random", device="cpu", loras=(("x.safetensors", 1.0),)))


def _moe(layout, **config):
    import parallel

    ulysses, ring, cfg = layout
    pipe = load_pipeline(
        PipelineConfig(model="tiny-moe-random", device="cpu", **config),
        parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg),
    )
    req = GenerationRequest(**REQUEST | {"num_inference_steps": 8})
    return pipe.denoise(req), pipe.evaluations


def test_both_experts_run_parallel_as_one_rank():
    want, counted = _moe((None, 1, 1))
    assert (counted.evaluated, counted.skipped) == (16, 0)
    same, _ = _moe((None, 1, 1), offload_idle_expert=True)  # on the host: the moves change nothing
    assert torch.equal(same, want)
    for layout in ((2, 1, 1), (1, 1, 2)):
        for got, evaluations in run_distributed(2, _moe, layout, timeout=180):
            assert evaluations == counted
            assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4, layout


def test_the_cache_starts_afresh_at_the_boundary(monkeypatch):
    """When the low-noise expert takes over, the cache forgets the other expert's residuals (once, at the
    switch), and that step runs in full whatever the threshold."""
    from dit.cache import StepCache

    pipe = load_pipeline(PipelineConfig(model="tiny-moe-random", device="cpu"))
    made, evaluated, restarts = [], [0], []
    make = pipe.step_cache
    pipe.step_cache = lambda config: made.append(make(config)) or made[-1]
    restart = StepCache.restart
    monkeypatch.setattr(
        StepCache, "restart", lambda self, real: restarts.append(len(evaluated) - 1) or restart(self, real)
    )
    req = GenerationRequest(**REQUEST | {"num_inference_steps": 8, "cache": "fbcache:1"})
    pipe.denoise(req, callback=lambda step, total: evaluated.append(made[0].stats.evaluated))
    switch = next(i for i, t in enumerate(pipe.scheduler.timesteps) if t < pipe.boundary * 1000)
    assert restarts == [switch] and evaluated[switch + 1] - evaluated[switch] == 2, (restarts, evaluated)
    assert pipe.evaluations.skipped > 0


def test_the_cli_takes_guidance_2(tmp_path, capsys):
    from server.cli import main

    out = tmp_path / "moe.mp4"
    argv = ["generate", "a fox", "--frames", "5", "--height", "32", "--width", "32", "--steps", "4"]
    assert main([*argv, "--preset", "tiny-moe-random", "--guidance-2", "2", "--out", str(out)]) == 0
    assert out.is_file()
    assert main([*argv, "--preset", "tiny-random", "--guidance-2", "2", "--out", str(out)]) == 2
    assert "--guidance-2 is for two-expert models" in capsys.readouterr().err
