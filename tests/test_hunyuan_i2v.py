"""HunyuanVideo-1.5 image-to-video through the pipeline (dit/hunyuan/i2v.py): a tiny folder saved with
diffusers' `HunyuanVideo15ImageToVideoPipeline` (tests/test_hunyuan_pipeline_folder.py's tiny parts and a
tiny SigLIP tower) gives its latents from the same seed and image, a request without a size taking the
image's; `tiny-joint-i2v` runs sequence-parallel and CFG-parallel equal to one rank; the image-to-video model
needs an image and `tiny-joint` refuses one; `ithaca generate --image` sizes the video from the image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed
from tests.test_hunyuan_pipeline_folder import REQUEST


def _image(height=32, width=48, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from diffusers import HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline
    from transformers import SiglipImageProcessor

    from dit.hunyuan.i2v import tiny_image_encoder
    from tests.test_hunyuan_pipeline_folder import folder as t2v_folder

    parts = HunyuanVideo15Pipeline.from_pretrained(t2v_folder.__wrapped__(tmp_path_factory)).components
    transformer = parts["transformer"]
    # diffusers sizes the video from the image and `target_size`: 48 gives an image of 32x48 its own size
    transformer.register_to_config(target_size=48)
    root = tmp_path_factory.mktemp("hunyuan-i2v") / "i2v"
    HunyuanVideo15ImageToVideoPipeline(
        **parts,
        image_encoder=tiny_image_encoder(transformer.config.image_embed_dim, seed=3),
        feature_extractor=SiglipImageProcessor(size={"height": 32, "width": 32}),
    ).save_pretrained(root)
    return root


def test_latents_match_diffusers_i2v_pipeline(folder):
    """A request without a size takes the image's as diffusers does (40×40 at target size 48: 48×48, the
    image resized to it); one at the image's size."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    ours = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    assert ours.limits.image and ours.image_encoder is not None
    ref = HunyuanVideo15ImageToVideoPipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    kw = {k: REQUEST[k] for k in ("prompt", "negative_prompt", "num_frames", "num_inference_steps")}
    sized = REQUEST | {"guidance_scale": 4.5}  # the folder guider's scale
    unsized = {k: v for k, v in sized.items() if k not in ("height", "width")}
    for fields, image, shape in (
        (unsized, _image(40, 40), (1, 4, 2, 3, 3)),
        (sized, _image(), (1, 4, 2, 2, 3)),
    ):
        request = GenerationRequest(**fields, image=image)
        got = ours.denoise(request)
        generator = torch.Generator("cpu").manual_seed(REQUEST["seed"])
        want = ref(Image.fromarray(image), **kw, generator=generator, output_type="latent").frames
        assert got.shape == want.shape == shape
        rel = ((got - want).abs().max() / want.abs().max()).item()
        print(f"image {image.shape[:2]}: latents vs diffusers max rel {rel:.2e}")
        assert rel <= 1e-4, (image.shape, rel)
    other = ours.denoise(GenerationRequest(**sized, image=_image(seed=1)))
    assert ((other - got).abs().max() / got.abs().max()).item() > 1e-3  # the image is heard


def test_the_image_is_required_or_refused():
    i2v = load_pipeline(PipelineConfig(model="tiny-joint-i2v", device="cpu"))
    with pytest.raises(ValueError, match="image: this image-to-video model needs a first-frame image"):
        i2v.validate(GenerationRequest("a fox"))
    t2v = load_pipeline(PipelineConfig(model="tiny-joint", device="cpu"))
    assert not t2v.limits.image and t2v.image_encoder is None
    with pytest.raises(ValueError, match="image: this text-to-video model takes no image"):
        t2v.validate(GenerationRequest("a fox", image=_image()))


def _i2v(degrees: dict):
    import parallel

    pipe = load_pipeline(
        PipelineConfig(model="tiny-joint-i2v", device="cpu"), parallel.init_parallel(**degrees)
    )
    # a larger image than the video: fit scales and crops it on the leader
    request = GenerationRequest(**REQUEST, guidance_scale=4.5, image=_image(40, 80))
    return pipe.generate(request)


def test_parallel_layouts_give_one_ranks_frames():
    want = _i2v({})
    for degrees in (dict(ulysses=2), dict(cfg=2)):
        leader, other = run_distributed(2, _i2v, degrees, timeout=180)
        assert other is None and leader.shape == want.shape == (5, 32, 48, 3)
        assert np.abs(leader.astype(int) - want.astype(int)).max() <= 1, degrees


def test_the_cli_sizes_the_video_from_the_image(tmp_path):
    """`generate --image` without --height/--width: the size of `tiny-joint-i2v`'s target (64) closest to the
    image's 1:4, as diffusers' pipeline picks it."""
    from dit.video import read_mp4
    from server.cli import main

    Image.fromarray(_image(40, 160)).save(tmp_path / "first.png")
    argv = ["generate", "a fox", "--preset", "tiny-joint-i2v", "--frames", "5", "--steps", "1",
            "--image", str(tmp_path / "first.png"), "--out", str(tmp_path / "v.mp4")]  # fmt: skip
    assert main(argv) == 0
    assert read_mp4(tmp_path / "v.mp4").frames.shape[:3] == (5, 32, 128)
