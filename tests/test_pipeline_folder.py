"""A Wan pipeline folder in the published diffusers layout (`model_index.json`, transformer/, text_encoder/ +
tokenizer/, vae/ with Wan2.1's latents_mean/std, scheduler/ with Wan2.1's published UniPC config), saved with
`WanPipeline.save_pretrained` from tiny random models in tmp_path, loads into the pipeline (UMT5 through
our own code, the folder's VAE and scheduler, Wan's limits) and gives diffusers' `WanPipeline` latents from
the same noise: UniPC and flow-match Euler folders, guidance 1 and > 1, empty and long negative prompts, a
large shift with many steps, and `sampler=`/`flow_shift=` overrides (measured ≤ 1e-6 relative, fp32, 2-core
CPU box, torch 2.13.0 CPU, diffusers 0.42.1)."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
import torch

from dit.flow_schedulers import FlowMatchEulerScheduler as Euler
from dit.flow_schedulers import UniPCFlowScheduler as UniPC
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import PRESETS
from dit.wan.umt5 import UMT5TextEncoder
from dit.wan.vae import tiny_vae
from testing.wan_vae import diffusers_wan_vae

WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "fox", "in", "snow", "blurry"]
# Wan2.1-T2V-*-Diffusers/scheduler/scheduler_config.json and vae/config.json's latent statistics.
WAN21_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler", "beta_end": 0.02, "beta_schedule": "linear",
    "beta_start": 0.0001, "disable_corrector": [], "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": True, "num_train_timesteps": 1000,
    "predict_x0": True, "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0, "solver_order": 2, "solver_p": None, "solver_type": "bh2", "steps_offset": 0,
    "thresholding": False, "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
    "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False,
}  # fmt: skip
WAN21_LATENTS_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]  # fmt: skip
WAN21_LATENTS_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]  # fmt: skip
LONG_NEGATIVE = " ".join(["blurry", "static", "red", "overexposed", "snow", "worst", "quality"] * 60)


def _save_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """{"unipc": the published layout, "euler": the same but a FlowMatchEulerDiscreteScheduler scheduler/,
    "unipc-no-shift": the published layout whose scheduler config gives no flow_shift}."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    root = tmp_path_factory.mktemp("wan-pipeline")
    cfg = {k: v for k, v in PRESETS["tiny-random"].items() if not k.startswith("_")}
    _save_tokenizer(root / "_tokenizer")
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**cfg)
    text = UMT5Config(
        vocab_size=len(WORDS), d_model=cfg["text_dim"], d_kv=8, d_ff=64, num_layers=1, num_heads=4
    )
    vae = diffusers_wan_vae(
        tiny_vae(cfg["in_channels"], seed=1), latents_mean=WAN21_LATENTS_MEAN, latents_std=WAN21_LATENTS_STD
    )
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(root / "_tokenizer"),
        text_encoder=UMT5EncoderModel(text).eval(),
        vae=vae,
        scheduler=UniPCMultistepScheduler.from_config(WAN21_SCHEDULER),
        transformer=transformer,
    )
    pipe.save_pretrained(root / "unipc")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe.save_pretrained(root / "euler")
    # the published UniPC config without flow_shift (a hand-written folder): diffusers takes the class's 1.0
    (root / "unipc-no-shift" / "scheduler").mkdir(parents=True)
    for part in ("model_index.json", "transformer", "text_encoder", "tokenizer", "vae"):
        (root / "unipc-no-shift" / part).symlink_to(root / "unipc" / part)
    no_shift = {k: v for k, v in WAN21_SCHEDULER.items() if k != "flow_shift"}
    (root / "unipc-no-shift" / "scheduler" / "scheduler_config.json").write_text(json.dumps(no_shift))
    return {name: root / name for name in ("unipc", "euler", "unipc-no-shift")}


@pytest.fixture(scope="module")
def ours(folders):
    """name, PipelineConfig overrides → our pipeline from `folders[name]`, loaded once per combination."""

    @functools.cache
    def load(name: str, **overrides):
        return load_pipeline(PipelineConfig(model=str(folders[name]), device="cpu", **overrides))

    return load


@pytest.fixture(scope="module")
def reference(folders):
    """name, scheduler overrides → diffusers' WanPipeline from `folders[name]`, its scheduler re-made from the
    folder's config with the overrides (as diffusers' Wan example sets a flow shift)."""
    from diffusers import WanPipeline

    @functools.cache
    def load(name: str):
        pipe = WanPipeline.from_pretrained(folders[name])
        pipe.set_progress_bar_config(disable=True)
        return pipe, pipe.scheduler

    def get(name: str, **scheduler_overrides):
        pipe, published = load(name)
        pipe.scheduler = type(published).from_config(published.config, **scheduler_overrides)
        return pipe

    return get


def test_pipeline_folder_loads_and_generates(ours, reference):
    pipe = ours("unipc")
    assert isinstance(pipe.text_encoder, UMT5TextEncoder) and pipe.flow_shift == 3.0
    saved_vae = tiny_vae(
        pipe.model.config.in_channels, seed=1
    )  # the folder's VAE, not the built-in seed-0 one
    assert all(torch.equal(a, b) for a, b in zip(pipe.vae.parameters(), saved_vae.parameters(), strict=True))
    assert pipe.vae.config.latents_std == WAN21_LATENTS_STD
    assert (pipe.limits.default_frames, pipe.limits.default_height, pipe.limits.default_width) == (
        81,
        480,
        832,
    )
    assert pipe.limits.max_prompt_tokens == 512

    # Wan's text layout: UMT5's states for the real tokens ("a red fox" + </s>), zeros up to 512.
    emb = pipe.text_encoder.encode("a  red fox")
    ids = torch.tensor([[3, 4, 5, 1]])
    direct = pipe.text_encoder.hidden_states(ids, torch.ones_like(ids))
    assert emb.shape == (1, 512, 32) and pipe.tokenizer.count_tokens("a red fox") == 4
    torch.testing.assert_close(emb[:, :4], direct, rtol=1e-5, atol=1e-6)
    assert emb[:, 4:].abs().max() == 0
    assert pipe.tokenizer.count_tokens(LONG_NEGATIVE) == 421

    # The decoded video is diffusers' (its [0, 1] floats rounded to uint8).
    req = GenerationRequest("a red fox in snow", negative_prompt="blurry", num_frames=5, height=32, width=32,
                            num_inference_steps=2, guidance_scale=5.0, seed=3)  # fmt: skip
    frames = pipe.generate(req)
    assert frames.shape == (5, 32, 32, 3) and frames.dtype == np.uint8
    ref = reference("unipc")(**_reference_kwargs(req), output_type="np").frames[0]
    assert np.abs(frames.astype(np.float64) - ref * 255).max() <= 1.0


def _reference_kwargs(req: GenerationRequest) -> dict:
    """WanPipeline's arguments for `req` (the same names but seed, fps, our step cache and LoRA set); our
    initial noise is randn of this generator."""
    fields = {
        k: v
        for k, v in dataclasses.asdict(req).items()
        if k not in ("seed", "fps", "cache", "image", "loras")
    }
    return {**fields, "generator": torch.Generator("cpu").manual_seed(req.seed)}


# (our folder, our overrides, the reference's folder, its scheduler overrides, request fields)
CASES = {
    "unipc-guided-empty-negative": ("unipc", {}, "unipc", {}, dict(guidance_scale=5.0, negative_prompt="")),
    "unipc-unguided": ("unipc", {}, "unipc", {}, dict(guidance_scale=1.0)),
    "unipc-guided-long-negative": ("unipc", {}, "unipc", {},
                                   dict(guidance_scale=5.0, negative_prompt=LONG_NEGATIVE)),
    "euler-guided": ("euler", {}, "euler", {}, dict(guidance_scale=5.0)),
    "euler-unguided": ("euler", {}, "euler", {}, dict(guidance_scale=1.0)),
    # a config without flow_shift samples at its class's default (1.0), not the family's 3
    "unipc-no-shift": ("unipc-no-shift", {}, "unipc-no-shift", {}, dict(guidance_scale=5.0)),
    # UniPC's integer timesteps start 999, 999 here: found by value, step 0 would be the second
    "unipc-shift-12-90-steps": ("unipc", {"flow_shift": 12.0}, "unipc", {"flow_shift": 12.0},
                                dict(guidance_scale=1.0, num_inference_steps=90)),
    # the user's sampler wins over the folder's class (and samples with that sampler's default config)
    "euler-folder-sampler-unipc": ("euler", {"sampler": "unipc"}, "unipc", {}, dict(guidance_scale=5.0)),
    "unipc-folder-sampler-euler": ("unipc", {"sampler": "euler"}, "euler", {}, dict(guidance_scale=5.0)),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_latents_match_diffusers_wan_pipeline(ours, reference, case):
    folder, overrides, ref_folder, scheduler_overrides, fields = CASES[case]
    fields = {"negative_prompt": "blurry", "num_inference_steps": 4, **fields}
    req = GenerationRequest("a red fox in snow", num_frames=5, height=32, width=32, seed=7, **fields)
    got = ours(folder, **overrides).denoise(req)
    ref = reference(ref_folder, **scheduler_overrides)(**_reference_kwargs(req), output_type="latent").frames
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"{case}: latents vs WanPipeline max rel {rel:.2e}")
    assert rel <= 1e-4, rel


def test_the_folder_scheduler_is_used_unless_the_user_overrides_it(ours):
    pipe = ours("unipc")
    assert (pipe.sampler, pipe.flow_shift, type(pipe.scheduler)) == ("unipc", 3.0, UniPC)
    published = {k: v for k, v in WAN21_SCHEDULER.items() if k in pipe.scheduler.config}
    assert {k: pipe.scheduler.config[k] for k in published} == published and len(published) == 16
    pipe = ours("euler")
    assert (pipe.sampler, pipe.flow_shift, type(pipe.scheduler)) == ("euler", 3.0, Euler)
    pipe = ours("euler", sampler="unipc", flow_shift=12.0)
    assert (pipe.sampler, pipe.flow_shift, pipe.scheduler.config["flow_shift"]) == ("unipc", 12.0, 12.0)
    assert pipe.scheduler.config["prediction_type"] == "flow_prediction"


def test_an_unsupported_folder_scheduler_is_refused_unless_a_sampler_is_picked(folders, tmp_path):
    for part in ("transformer", "text_encoder", "tokenizer", "vae"):
        (tmp_path / part).symlink_to(folders["unipc"] / part)
    (tmp_path / "scheduler").mkdir()
    config = {**WAN21_SCHEDULER, "_class_name": "DPMSolverMultistepScheduler", "flow_shift": 5.0}
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        load_pipeline(PipelineConfig(model=str(tmp_path), device="cpu"))
    assert str(error.value) == (
        f"{tmp_path / 'scheduler'}: scheduler class 'DPMSolverMultistepScheduler' is not supported; "
        "supported: UniPCMultistepScheduler, FlowMatchEulerDiscreteScheduler; or pick a sampler "
        "(unipc | euler | renoise) to sample with its default config"
    )
    pipe = load_pipeline(PipelineConfig(model=str(tmp_path), device="cpu", sampler="euler"))
    # the folder's shift stays; its class's other settings do not apply to Euler
    assert (pipe.sampler, pipe.flow_shift, type(pipe.scheduler)) == ("euler", 5.0, Euler)


def test_a_transformer_folder_alone_says_its_parts_are_stood_in_for(tmp_path, caplog):
    """Its vae/ and text encoder are tiny random stand-ins: a real model's video is noise, said once."""
    import shutil

    from dit.presets import SHIPPED

    shutil.copytree(SHIPPED["tiny"] / "transformer", tmp_path / "transformer")
    with caplog.at_level("WARNING", logger="ithaca.pipeline"):
        load_pipeline(PipelineConfig(model=str(tmp_path), device="cpu"))
    (said,) = [r.getMessage() for r in caplog.records if r.name == "ithaca.pipeline"]
    assert said.startswith(f"{tmp_path} has no vae/ or text_encoder/: tiny random stand-ins take the place")
    caplog.clear()
    with caplog.at_level("WARNING", logger="ithaca.pipeline"):
        load_pipeline(PipelineConfig(model=str(SHIPPED["tiny"]), device="cpu"))  # a whole pipeline: nothing
    assert not [r for r in caplog.records if r.name == "ithaca.pipeline"]
