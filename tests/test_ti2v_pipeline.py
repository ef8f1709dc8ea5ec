"""Wan2.2 TI2V-5B through the pipeline (dit.first_frame.FirstFrame): a tiny folder in its published layout
(`model_index.json` `expand_timesteps: true`, a 48-channel transformer, the Wan2.2 VAE: time ×4, space ×16)
gives diffusers' `WanPipeline` latents without an image and `WanImageToVideoPipeline`'s with one, guided and
not; the tiny preset runs Ulysses 2 and CFG-parallel equal to one rank; the image is optional; frames come in
multiples of 32 pixels (the VAE's 16 × the patch's 2)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import PRESETS
from tests.distributed import run_distributed
from tests.test_i2v_pipeline import _image
from tests.test_pipeline_folder import _reference_kwargs

REQUEST = dict(prompt="a red fox in snow", negative_prompt="blurry", num_frames=5, height=32, width=64,
               num_inference_steps=4, guidance_scale=5.0, seed=7)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """tests/test_pipeline_folder.py's tokenizer, UMT5 and scheduler, a TI2V transformer and the tiny Wan2.2
    VAE, saved by diffusers' WanPipeline with `expand_timesteps`."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from dit.wan.vae import tiny_vae
    from testing.wan_vae import diffusers_wan_vae
    from tests.test_pipeline_folder import folders

    base = WanPipeline.from_pretrained(folders.__wrapped__(tmp_path_factory)["unipc"])
    cfg = {k: v for k, v in PRESETS["tiny-ti2v-random"].items() if not k.startswith("_")}
    torch.manual_seed(0)
    pipe = WanPipeline(
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=diffusers_wan_vae(tiny_vae(cfg["in_channels"], seed=1)),
        scheduler=base.scheduler,
        transformer=WanTransformer3DModel(**cfg),
        expand_timesteps=True,
    )
    root = tmp_path_factory.mktemp("wan-ti2v") / "ti2v"
    pipe.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def ours(folder):
    return load_pipeline(PipelineConfig(model=str(folder), device="cpu"))


@pytest.mark.parametrize("guidance", [5.0, 1.0])
@pytest.mark.parametrize("with_image", [False, True])
def test_latents_match_diffusers(folder, ours, monkeypatch, guidance, with_image):
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from diffusers.pipelines.wan import pipeline_wan_i2v

    # diffusers 0.42's I2V pipeline calls ftfy without checking it is installed (WanPipeline checks);
    # ftfy.fix_text leaves these ASCII prompts as they are
    monkeypatch.setattr(pipeline_wan_i2v, "ftfy", SimpleNamespace(fix_text=lambda t: t), raising=False)
    assert (ours.compression, ours.expand_timesteps) == ((4, 16), True)
    assert ours.limits.image_optional and not ours.limits.image and ours.limits.size_multiple == 32
    image = _image(32, 64) if with_image else None
    req = GenerationRequest(**REQUEST | {"guidance_scale": guidance}, image=image)
    got = ours.denoise(req)
    kwargs = _reference_kwargs(ours.validate(req))
    kwargs.pop("guidance_scale_2")
    if with_image:  # the same folder as diffusers' image-to-video pipeline (no image encoder)
        ref = WanImageToVideoPipeline.from_pretrained(folder, image_encoder=None, image_processor=None)
        kwargs["image"] = Image.fromarray(image)
    else:
        ref = WanPipeline.from_pretrained(folder)
    assert ref.config.expand_timesteps
    ref.set_progress_bar_config(disable=True)
    want = ref(**kwargs, output_type="latent").frames
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"image {with_image}, guidance {guidance}: latents vs diffusers max rel {rel:.2e}")
    assert rel <= 1e-4, rel
    if with_image:  # the final latents' first frame is the image's latents exactly, and diffusers' VAE's
        own = ours.image_condition(ours.validate(req), torch.float32)["first_frame"]
        assert own.shape == got[:, :, :1].shape and torch.equal(got[:, :, :1], own)
        first = ((own - want[:, :, :1]).abs().max() / want[:, :, :1].abs().max()).item()
        print(f"first frame vs diffusers' max rel {first:.2e}")
        assert first <= 1e-5, first  # the VAEs' RMS norms round apart (dit.wan.vae_layers)


def test_the_image_is_heard_and_optional(ours):
    plain = ours.denoise(GenerationRequest(**REQUEST))
    a = ours.denoise(GenerationRequest(**REQUEST, image=_image(32, 64)))
    b = ours.denoise(GenerationRequest(**REQUEST, image=_image(32, 64, seed=1)))
    for x, y in ((plain, a), (a, b)):
        assert ((x - y)[:, :, 1:].abs().max() / x.abs().max()).item() > 1e-3
    with pytest.raises(ValueError, match="height must be a multiple of 32"):
        ours.validate(GenerationRequest(**REQUEST | {"height": 48}))


def _ti2v(layout, image: bool):
    import parallel

    ulysses, cfg = layout
    pipe = load_pipeline(
        PipelineConfig(model="tiny-ti2v-random", device="cpu"),
        parallel.init_parallel(ulysses=ulysses, cfg=cfg),
    )
    # a larger image than the video: fit scales and crops it on the leader
    return pipe.generate(GenerationRequest(**REQUEST, image=_image(48, 80) if image else None))


@pytest.mark.parametrize("image", [True, False])
def test_parallel_layouts_give_one_ranks_frames(image):
    want = _ti2v((None, 1), image)
    assert want.shape == (5, 32, 64, 3) and want.dtype == np.uint8
    for layout in ((2, 1), (1, 2)):
        leader, other = run_distributed(2, _ti2v, layout, image, timeout=180)
        assert other is None and leader.shape == want.shape
        assert np.abs(leader.astype(int) - want.astype(int)).max() <= 1, layout


def test_the_step_cache_runs():
    pipe = load_pipeline(PipelineConfig(model="tiny-ti2v-random", device="cpu"))
    req = GenerationRequest(**REQUEST | {"num_inference_steps": 8}, image=_image(32, 64), cache="fbcache:0.5")
    frames = pipe.generate(req)
    assert frames.shape == (5, 32, 64, 3) and pipe.evaluations.skipped > 0
