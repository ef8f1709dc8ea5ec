"""Fixed (distilled) schedules: LightX2V's 4-step list 1000, 750, 500, 250 with shift 5 becomes the sigmas a
hand computation gives; on the trained tiny model a run with it equals diffusers' WanPipeline given the same
sigmas (flow-match Euler, guidance 1 and 3), guidance 1 evaluates the DiT once per step, renoise (LightX2V's
step) equals the hand-written LightX2V update and is the same on 2 ranks as on 1; a folder's
`denoising_step_list` works like `--timesteps`; the CLI, `ithaca serve`'s settings and the API take the
schedule and refuse a step count it does not allow."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from itertools import pairwise

import pytest
import torch

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import SHIPPED
from dit.sampling import FIXED_SCHEDULE_SAMPLERS, FixedSchedule, make_scheduler
from tests.distributed import run_distributed

LIGHTX2V = "1000,750,500,250"
SHIFT = 5.0
# shift·s / (1 + (shift − 1)·s) for s = t / 1000 = 1, 0.75, 0.5, 0.25, then the final 0
HAND_SIGMAS = [1.0, 3.75 / 4.0, 2.5 / 3.0, 1.25 / 2.0, 0.0]
REQUEST = dict(prompt="a red circle moving right", num_frames=9, height=32, width=32, seed=5)


def test_lightx2v_sigmas_match_a_hand_computation():
    schedule = FixedSchedule.parse(LIGHTX2V)
    assert (schedule.timesteps, schedule.steps, str(schedule)) == ((1000, 750, 500, 250), 4, LIGHTX2V)
    # LightX2V's WanStepDistillScheduler: shift linspace(1, 0, 1001)[:-1], take entry 1000 − t
    table = torch.linspace(1.0, 0.0, 1001)[:-1]
    lightx2v = (SHIFT * table / (1 + (SHIFT - 1) * table))[[1000 - t for t in schedule.timesteps]]
    for sampler in FIXED_SCHEDULE_SAMPLERS:
        scheduler = make_scheduler(sampler, SHIFT)
        scheduler.set_timesteps(sigmas=schedule.sigmas)
        torch.testing.assert_close(scheduler.sigmas, torch.tensor(HAND_SIGMAS), rtol=0, atol=1e-7)
        torch.testing.assert_close(scheduler.sigmas[:-1], lightx2v, rtol=0, atol=1e-7)
        torch.testing.assert_close(
            scheduler.timesteps, torch.tensor(HAND_SIGMAS[:-1]) * 1000, rtol=1e-7, atol=0
        )


@pytest.mark.parametrize(
    "text", ["", "1000,,250", "1000,750.5", "abc", "0", "1001,500", "500,750", "750,750"]
)
def test_a_bad_list_says_what_is_allowed(text):
    with pytest.raises(ValueError, match=r"timesteps must be integers in \(0, 1000\], strictly decreasing"):
        FixedSchedule.parse(text)


@functools.cache
def _tiny(sampler: str = "euler") -> object:
    """The trained tiny model with LightX2V's schedule (loaded once per sampler)."""
    return load_pipeline(
        PipelineConfig(model="tiny", device="cpu", sampler=sampler, flow_shift=SHIFT, timesteps=LIGHTX2V)
    )


def test_the_schedule_fixes_the_steps_and_drops_guidance_by_default():
    pipe = _tiny()
    assert (pipe.sampler, pipe.flow_shift, pipe.limits.schedule) == (
        "euler",
        SHIFT,
        FixedSchedule.parse(LIGHTX2V),
    )
    req = pipe.validate(GenerationRequest(**REQUEST))
    assert (req.num_inference_steps, req.guidance_scale) == (4, 1.0)
    assert (
        pipe.validate(GenerationRequest(**REQUEST, num_inference_steps=4, guidance_scale=3.0)).guidance_scale
        == 3
    )
    with pytest.raises(ValueError) as e:
        pipe.validate(GenerationRequest(**REQUEST, num_inference_steps=8))
    assert str(e.value) == (
        "num_inference_steps must be 4: the model's fixed schedule (timesteps 1000,750,500,250) takes "
        "exactly that many, got 8"
    )


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_latents_match_diffusers_wan_pipeline_given_the_same_sigmas(guidance):
    """diffusers' WanPipeline takes no sigmas argument: its scheduler's set_timesteps gets them. The reference
    runs in float64; our float32 run must be within twice diffusers' own float32 run's distance from it
    (guidance 3 amplifies float32 rounding to ~1e-5, so a fixed float32-vs-float32 bound would measure
    rounding; which of the two rounds closer differs by CPU: ours 1.5e-6 against its 8.8e-7 on an AMD EPYC
    box, 2026-11-25)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = _tiny()
    req = pipe.validate(GenerationRequest(**REQUEST, negative_prompt="blue", guidance_scale=guidance))
    fields = (
        "prompt",
        "negative_prompt",
        "num_frames",
        "height",
        "width",
        "num_inference_steps",
        "guidance_scale",
    )
    same = {name: getattr(req, name) for name in fields}

    def diffusers_latents(dtype: torch.dtype) -> torch.Tensor:
        ref = WanPipeline.from_pretrained(SHIPPED["tiny"], torch_dtype=dtype)
        ref.set_progress_bar_config(disable=True)
        ref.scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
        ref.scheduler.set_timesteps = functools.partial(
            ref.scheduler.set_timesteps, sigmas=[1.0, 0.75, 0.5, 0.25]
        )
        # our initial noise is randn of this generator
        generator = torch.Generator("cpu").manual_seed(req.seed)
        return ref(**same, generator=generator, max_sequence_length=16, output_type="latent").frames.double()

    exact, theirs = diffusers_latents(torch.float64), diffusers_latents(torch.float32)
    got = pipe.denoise(req).double()
    ours, diffusers = (((x - exact).abs().max() / exact.abs().max()).item() for x in (got, theirs))
    print(f"guidance {guidance}: rel vs float64 WanPipeline: ours {ours:.2e}, its float32 {diffusers:.2e}")
    assert ours <= 1e-5 and ours <= 2 * diffusers, (ours, diffusers)


@pytest.mark.parametrize("guidance, forwards", [(1.0, 4), (3.0, 8)])
def test_guidance_1_evaluates_the_dit_once_per_step(guidance, forwards):
    pipe, calls = _tiny(), []
    hook = pipe.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        pipe.denoise(GenerationRequest(**REQUEST, guidance_scale=guidance))
    finally:
        hook.remove()
    assert len(calls) == forwards


def _lightx2v_by_hand(pipe, req: GenerationRequest) -> torch.Tensor:
    """LightX2V's WanStepDistillScheduler.step_post: x0 = x − σ·v, then x = (1 − σ')·x0 + σ'·fresh noise; the
    initial and the fresh noise from one CPU generator seeded by the request, as the pipeline draws them."""
    generator = torch.Generator("cpu").manual_seed(req.seed)
    x = torch.randn(pipe.latent_shape(req), generator=generator)
    cond, _ = pipe.conditioning(req)
    for sigma, following in pairwise(HAND_SIGMAS):
        v = pipe.model(x, torch.tensor([sigma * 1000], dtype=torch.float32), **cond).float()
        x0 = x - sigma * v
        x = (1 - following) * x0 + following * torch.randn(x.shape, generator=generator)
    return x


def test_renoise_is_lightx2vs_step_and_follows_the_seed():
    pipe, req = _tiny("renoise"), GenerationRequest(**REQUEST)
    got = pipe.denoise(req)
    want = _lightx2v_by_hand(pipe, pipe.validate(req))
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"renoise vs LightX2V's step by hand: max rel {rel:.2e}")
    assert rel <= 1e-5, rel
    assert torch.equal(pipe.denoise(req), got)
    assert not torch.allclose(pipe.denoise(dataclasses.replace(req, seed=6)), got)
    assert not torch.allclose(_tiny("euler").denoise(req), got, atol=1e-3)


def _renoise_latents(ulysses: int) -> torch.Tensor:
    import parallel

    mesh = parallel.init_parallel(ulysses=ulysses)
    config = PipelineConfig(
        model="tiny", device="cpu", sampler="renoise", flow_shift=SHIFT, timesteps=LIGHTX2V
    )
    return load_pipeline(config, mesh).denoise(GenerationRequest(**REQUEST))


def test_renoise_draws_the_same_noise_on_every_rank():
    one = _tiny("renoise").denoise(GenerationRequest(**REQUEST))
    for rank, latents in enumerate(run_distributed(2, _renoise_latents, 2)):
        rel = ((latents - one).abs().max() / one.abs().max()).item()
        print(f"renoise, Ulysses 2, rank {rank} vs 1 rank: max rel {rel:.2e}")
        assert rel <= 1e-4, (
            rank,
            rel,
        )  # `ithaca parity`'s float32 tolerance (Ulysses measured bit-identical)


def _folder(tmp_path, scheduler: dict):
    """A pipeline folder as a LightX2V user may assemble it: the tiny model's parts, its transformer in the
    original Wan layout (LightX2V's distilled checkpoints' names), the schedule in scheduler_config.json."""
    from safetensors.torch import save_file

    from dit import load_transformer
    from dit.wan import export_state_dict

    for part in ("text_encoder", "tokenizer", "vae"):
        (tmp_path / part).symlink_to(SHIPPED["tiny"] / part)
    (tmp_path / "model_index.json").write_text((SHIPPED["tiny"] / "model_index.json").read_text())
    model = load_transformer("tiny")
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(model.config.to_original()))
    weights = {k: v.contiguous() for k, v in export_state_dict(model, "original").items()}
    save_file(weights, tmp_path / "transformer" / "diffusion_pytorch_model.safetensors")
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler))
    return str(tmp_path)


def test_a_folder_fixes_its_schedule_and_sampler(tmp_path):
    folder = _folder(
        tmp_path,
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": SHIFT, "stochastic_sampling": True,
         "denoising_step_list": [1000, 750, 500, 250]},
    )  # fmt: skip
    pipe = load_pipeline(PipelineConfig(model=folder, device="cpu"))
    assert (pipe.sampler, pipe.flow_shift, str(pipe.limits.schedule)) == ("renoise", SHIFT, LIGHTX2V)
    assert "denoising_step_list" not in pipe.scheduler.config
    req = pipe.validate(GenerationRequest(**REQUEST))
    assert (req.num_inference_steps, req.guidance_scale) == (4, 1.0)
    assert torch.equal(pipe.denoise(req), _tiny("renoise").denoise(req))


def test_a_folder_scheduler_the_model_cannot_take_is_named(tmp_path):
    """No one asked for the sampler but the folder's config (it said "sampler must be 'euler', got
    'renoise'" to a user who gave none)."""
    from dit.families import model_family, pick_scheduler

    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "FlowMatchEulerDiscreteScheduler", "stochastic_sampling": True})
    )
    said = "scheduler_config.json samples with 'renoise', which this model does not take: pick a sampler, "
    with pytest.raises(ValueError, match=re.escape(said)):
        pick_scheduler(model_family("tiny-joint"), tmp_path)


def test_a_schedule_that_cannot_run_is_refused(tmp_path):
    unipc = json.loads((SHIPPED["tiny"] / "scheduler" / "scheduler_config.json").read_text())
    with pytest.raises(ValueError) as e:
        load_pipeline(PipelineConfig(model="tiny", device="cpu", timesteps=LIGHTX2V))
    assert str(e.value) == (
        "fixed timesteps 1000,750,500,250 are sampled with euler or renoise, not unipc; "
        "pick one of those samplers"
    )
    folder = _folder(tmp_path, {**unipc, "denoising_step_list": [1000, 1000]})
    with pytest.raises(ValueError, match=r"scheduler_config.json: denoising_step_list: timesteps must be"):
        load_pipeline(PipelineConfig(model=folder, device="cpu", sampler="euler"))
    (tmp_path / "own").mkdir()
    own = _folder(tmp_path / "own", {**unipc, "denoising_step_list": [1000, 750, 500, 250]})
    with pytest.raises(ValueError) as e:  # the folder's own schedule: the message named no file
        load_pipeline(PipelineConfig(model=own, device="cpu", sampler="unipc"))
    assert str(e.value) == (
        f"{own}/scheduler/scheduler_config.json: its denoising_step_list fixed timesteps 1000,750,500,250 "
        "are sampled with euler or renoise, not unipc; pick one of those samplers"
    )
    # an option value Ithaca's UniPC does not compute: refused by preflight, before any model loads
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps({**unipc, "solver_order": 4}))
    from dit.preflight import preflight

    with pytest.raises(ValueError) as e:
        preflight(model_path=folder)
    assert str(e.value) == (
        f"{tmp_path / 'scheduler' / 'scheduler_config.json'}: UniPCMultistepScheduler option solver_order 4 "
        "is not supported; supported: 1, 2, 3"
    )


def test_the_cli_takes_the_schedule(tmp_path, capsys):
    import argparse

    from dit.cli import add_subcommands
    from dit.cli_args import pipeline_argv, pipeline_config
    from dit.preflight import preflight
    from server.cli import main

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    argv = ["a fox", "--timesteps", LIGHTX2V, "--flow-shift", "5", "--sampler", "renoise"]
    args = parser.parse_args(["generate", *argv])
    config = pipeline_config(args)
    assert (config.timesteps, config.flow_shift, config.sampler) == (LIGHTX2V, SHIFT, "renoise")
    common = pipeline_argv(parser.parse_args(["parity", "--prompt", *argv]))
    assert common[common.index("--timesteps") + 1] == LIGHTX2V  # parity's runs get it too

    with pytest.raises(ValueError, match="timesteps must be integers"):
        preflight(timesteps="1000,abc", sampler="euler")
    with pytest.raises(
        ValueError, match="sampled with --sampler euler or renoise, not the model's sampler, unipc"
    ):
        preflight(timesteps=LIGHTX2V)  # the shipped tiny folder's scheduler is UniPC
    preflight(timesteps=LIGHTX2V, sampler="euler")

    out = tmp_path / "v.mp4"
    common = ["generate", "a red circle moving right", "--frames", "9", "--out", str(out), *argv[1:]]
    assert main([*common, "--steps", "8"]) == 2
    assert "--steps must be 4: the model's fixed schedule" in capsys.readouterr().err
    assert main(common) == 0 and out.is_file()
    assert ", 4 steps," in capsys.readouterr().out


def test_serve_settings_carry_the_schedule_to_the_workers():
    import argparse

    from server.cli import _preflight
    from server.config import add_arguments, from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"ITHACA_TIMESTEPS": LIGHTX2V, "ITHACA_FLOW_SHIFT": "5", "ITHACA_SAMPLER": "euler"}
    config = from_args(parser.parse_args([]), environ=env)
    argv = config.worker_argv()
    for flag, value in (("--timesteps", LIGHTX2V), ("--flow-shift", "5.0"), ("--sampler", "euler")):
        assert argv[argv.index(flag) + 1] == value
    _preflight(config)
    with pytest.raises(ValueError, match="not the model's sampler, unipc"):
        _preflight(from_args(parser.parse_args([]), environ={"ITHACA_TIMESTEPS": LIGHTX2V}))


def test_the_api_refuses_a_step_count_the_schedule_does_not_allow(tmp_path):
    from fastapi.testclient import TestClient

    from dit.pipeline import TINY_LIMITS
    from server import limits
    from testing.published import published_app

    model = TINY_LIMITS.with_schedule(FixedSchedule.parse(LIGHTX2V))
    app = published_app(tmp_path, model)
    described = limits.describe(model)
    assert described["num_inference_steps"] == {
        "min": 4,
        "max": 4,
        "default": 4,
        "timesteps": [1000, 750, 500, 250],
    }
    with TestClient(app) as client:
        r = client.post("/generate", json={"prompt": "a fox", "num_inference_steps": 8})
        assert r.status_code == 422 and r.json()["detail"] == [{
            "loc": ["body", "num_inference_steps"], "type": "value_error",
            "msg": "num_inference_steps=8 is not valid: the model's fixed schedule "
                   "(timesteps 1000,750,500,250) takes exactly 4 steps; send 4 or leave it out",
        }]  # fmt: skip
        for body in ({"prompt": "a fox", "num_inference_steps": 4}, {"prompt": "a fox"}):
            assert client.post("/generate", json=body).status_code == 202
        assert client.post("/v1/videos", json={"prompt": "a fox", "seconds": "1"}).status_code == 200
        steps = client.get("/openapi.json").json()["components"]["schemas"]["GenerateBody"]["properties"]
        assert "takes exactly 4 steps" in steps["num_inference_steps"]["description"]
