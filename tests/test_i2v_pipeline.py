"""Wan image-to-video through the pipeline (dit/wan/i2v.py): a tiny folder in the published layout of
Wan2.1-I2V (transformer with image K/V, CLIP `image_encoder/` + `image_processor/`, VAE, UMT5, UniPC) gives
diffusers' `WanImageToVideoPipeline` latents from the same noise and image; the tiny preset runs
sequence-parallel and CFG-parallel equal to one rank; an image-to-video model needs an image and a
text-to-video model refuses one; `ithaca generate --image`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import PRESETS
from tests.distributed import run_distributed
from tests.test_pipeline_folder import _reference_kwargs

REQUEST = dict(prompt="a red fox in snow", negative_prompt="blurry", num_frames=5, height=32, width=32,
               num_inference_steps=4, guidance_scale=5.0, seed=7)  # fmt: skip


def _image(height=32, width=32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """tests/test_pipeline_folder.py's tiny parts, an I2V transformer and a tiny CLIP vision tower."""
    from diffusers import WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor

    from dit.wan.i2v import tiny_image_encoder
    from tests.test_pipeline_folder import folders

    base = WanPipeline.from_pretrained(folders.__wrapped__(tmp_path_factory)["unipc"])
    cfg = {k: v for k, v in PRESETS["tiny-i2v-random"].items() if not k.startswith("_")}
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**cfg)
    with torch.no_grad():  # diffusers' init leaves the image norms at 1: make every weight matter
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    pipe = WanImageToVideoPipeline(
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=base.vae,
        scheduler=base.scheduler,
        image_processor=CLIPImageProcessor(crop_size=32, size=32),
        image_encoder=tiny_image_encoder(cfg["image_dim"], seed=2),
        transformer=transformer,
    )
    root = tmp_path_factory.mktemp("wan-i2v") / "i2v"
    pipe.save_pretrained(root)
    return root


def test_latents_match_diffusers_wan_i2v_pipeline(folder, monkeypatch):
    from types import SimpleNamespace

    from diffusers import WanImageToVideoPipeline
    from diffusers.pipelines.wan import pipeline_wan_i2v

    # diffusers 0.42's I2V pipeline calls ftfy without checking it is installed (WanPipeline checks);
    # ftfy.fix_text leaves these ASCII prompts as they are
    monkeypatch.setattr(pipeline_wan_i2v, "ftfy", SimpleNamespace(fix_text=lambda t: t), raising=False)

    ours = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    assert ours.limits.image and ours.image_encoder is not None
    ref = WanImageToVideoPipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    # at the video's size, and twice it: CLIP sees the image as given (its processor resizes it), the VAE
    # the image resized to the video
    for fields, image in (({}, _image()), ({"guidance_scale": 1.0}, _image()), ({}, _image(64, 64))):
        req = GenerationRequest(**REQUEST | fields, image=image)
        got = ours.denoise(req)
        kwargs = _reference_kwargs(ours.validate(req)) | {"image": Image.fromarray(image)}
        kwargs.pop("guidance_scale_2")
        want = ref(**kwargs, output_type="latent").frames
        rel = ((got - want).abs().max() / want.abs().max()).item()
        print(f"{fields} image {image.shape[:2]}: latents vs diffusers max rel {rel:.2e}")
        assert rel <= 1e-4, (fields, image.shape, rel)
    other = ours.denoise(GenerationRequest(**REQUEST, image=_image(64, 64, seed=1)))
    assert ((other - got).abs().max() / got.abs().max()).item() > 1e-3  # the image is heard


def test_wan22_i2v_two_experts_match_diffusers(folder, tmp_path, monkeypatch):
    """Wan2.2 I2V A14B's layout: two image-to-video experts without image features (no image encoder),
    boundary 0.9, each expert with its guidance."""
    from types import SimpleNamespace

    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from diffusers.pipelines.wan import pipeline_wan_i2v

    monkeypatch.setattr(pipeline_wan_i2v, "ftfy", SimpleNamespace(fix_text=lambda t: t), raising=False)
    parts = WanImageToVideoPipeline.from_pretrained(folder).components
    cfg = {k: v for k, v in parts["transformer"].config.items() if not k.startswith("_")}
    cfg |= {"image_dim": None, "added_kv_proj_dim": None}
    experts = []
    for seed in (3, 4):
        torch.manual_seed(seed)
        experts.append(WanTransformer3DModel(**cfg))
    parts |= {"transformer": experts[0], "transformer_2": experts[1], "image_encoder": None,
              "image_processor": None}  # fmt: skip
    WanImageToVideoPipeline(**parts, boundary_ratio=0.9).save_pretrained(tmp_path / "a14b")
    ours = load_pipeline(PipelineConfig(model=str(tmp_path / "a14b"), device="cpu"))
    assert ours.boundary == 0.9 and ours.image_encoder is None and ours.limits.image
    ref = WanImageToVideoPipeline.from_pretrained(tmp_path / "a14b")
    ref.set_progress_bar_config(disable=True)
    image = _image()
    req = GenerationRequest(**REQUEST | {"num_inference_steps": 6, "guidance_scale_2": 2.0}, image=image)
    got = ours.denoise(req)
    kwargs = _reference_kwargs(ours.validate(req)) | {"image": Image.fromarray(image)}
    want = ref(**kwargs, output_type="latent").frames
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4


def test_the_image_is_required_or_refused():
    from dit.preflight import preflight
    from dit.shape import request_limits
    from dit.warmup import warm_up

    i2v = load_pipeline(PipelineConfig(model="tiny-i2v-random", device="cpu"))
    with pytest.raises(ValueError, match="image: this image-to-video model needs a first-frame image"):
        i2v.validate(GenerationRequest("a fox"))
    # validate checks the image's kind and shape (only the job's run did, on Wan's image-to-video)
    with pytest.raises(ValueError, match="image must be a uint8 numpy array \\[H, W, 3\\], got float32"):
        i2v.validate(GenerationRequest("a fox", image=np.zeros((8, 8), np.float32)))
    with pytest.raises(ValueError, match="image must be a uint8 numpy array .* got shape \\(8, 8\\)"):
        i2v.validate(GenerationRequest("a fox", image=np.zeros((8, 8), np.uint8)))
    # an image 1 or 3 pixels tall is channels last, as every other: CLIP's processor guessed channels first
    flat = np.random.default_rng(0).integers(0, 256, (3, 56, 3), dtype=np.uint8)
    assert torch.equal(i2v.image_encoder.encode(flat), i2v.image_encoder.encode(Image.fromarray(flat)))
    t2v = load_pipeline(PipelineConfig(model="tiny-random", device="cpu"))
    assert not t2v.limits.image
    with pytest.raises(ValueError, match="image: this text-to-video model takes no image"):
        t2v.validate(GenerationRequest("a fox", image=_image()))
    # known from the configs, before a rank starts: the loaded pipeline's limits say no more
    for model, pipe in (("tiny-i2v-random", i2v), ("tiny-random", t2v)):
        limits = request_limits(model)
        assert (limits.image, limits.image_optional) == (pipe.limits.image, pipe.limits.image_optional)
    assert request_limits("tiny-ti2v-random").image_optional and request_limits("tiny-joint-i2v").image
    with pytest.raises(ValueError, match="needs a first-frame image"):
        preflight(preset="tiny-i2v-random", device="cpu", request=GenerationRequest("a fox"))
    with pytest.raises(ValueError, match="takes no image"):
        preflight(preset="tiny-random", device="cpu", request=GenerationRequest("a fox", image=_image()))
    # `serve --warmup` on an image-to-video model warms up with a first frame (its workers died without one)
    preflight(preset="tiny-i2v-random", device="cpu", warmup=((32, 32, 5),))
    assert [run["size"] for run in warm_up(i2v, [(32, 32, 5)] * 2, GenerationRequest)] == ["32x32x5"]


def _i2v(layout):
    import parallel

    ulysses, ring, cfg = layout
    pipe = load_pipeline(
        PipelineConfig(model="tiny-i2v-random", device="cpu"),
        parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg),
    )
    # a larger image than the video: fit scales and crops it on the leader
    return pipe.generate(GenerationRequest(**REQUEST, image=_image(48, 80)))


def test_parallel_layouts_give_one_ranks_frames():
    want = _i2v((None, 1, 1))
    for layout in ((2, 1, 1), (1, 2, 1), (1, 1, 2)):
        leader, other = run_distributed(2, _i2v, layout, timeout=180)
        assert other is None and leader.shape == want.shape == (5, 32, 32, 3)
        assert np.abs(leader.astype(int) - want.astype(int)).max() <= 1, layout


def test_the_cli_takes_an_image(tmp_path, capsys):
    from server.cli import main

    Image.fromarray(_image(40, 40)).save(tmp_path / "first.png")
    out = tmp_path / "i2v.mp4"
    argv = ["generate", "a fox", "--frames", "5", "--height", "32", "--width", "32", "--steps", "2"]
    assert (
        main(
            [*argv, "--preset", "tiny-i2v-random", "--image", str(tmp_path / "first.png"), "--out", str(out)]
        )
        == 0
    )
    assert out.is_file()
    assert main([*argv, "--preset", "tiny-i2v-random", "--out", str(out)]) == 2
    assert "needs a first-frame image" in capsys.readouterr().err
    assert main([*argv, "--image", str(tmp_path / "missing.png"), "--out", str(out)]) == 2
    assert "missing.png" in capsys.readouterr().err


def test_the_image_encoders_load_without_transformers_warning(capfd):
    """Without torchvision transformers warned on every image-to-video load that it fell back to the PIL
    processor; the PIL processor is now asked for by name (with torchvision: the default one)."""
    from dit.hunyuan.family import FAMILY as HUNYUAN

    capfd.readouterr()
    assert load_pipeline(PipelineConfig(model="tiny-i2v-random", device="cpu")).image_encoder is not None
    pipe = load_pipeline(PipelineConfig(model="tiny-joint-i2v", device="cpu"))
    assert pipe.family is HUNYUAN and pipe.image_encoder is not None
    assert "torchvision" not in capfd.readouterr().err
