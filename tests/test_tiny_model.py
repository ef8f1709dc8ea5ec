"""The trained tiny default model (dit/tiny/): the detector reads the renderer's clips right; the shipped
model turns every prompt of its language into the video it names, held-out combinations included; the
shipped folder is what the package promises (small, complete, its vocabulary known); and the training script
is deterministic and resumes to the same weights."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from dit.presets import SHIPPED
from dit.tiny import train
from dit.tiny.detect import read
from dit.tiny.language import (
    HELD_OUT,
    SIZES,
    Scene,
    all_scenes,
    caption,
    declared_vocabulary,
    training_scenes,
    vocabulary,
)
from dit.tiny.render import render
from dit.tiny.score import generate_and_read, rates
from dit.vae_frames import to_uint8
from dit.vocabulary import read_vocabulary


def test_detector_reads_every_rendered_scene():
    """The reference for the detector is the scene the renderer drew: every combination at every size."""
    g = torch.Generator().manual_seed(1)
    for size in (None, *SIZES):
        for scene in all_scenes():
            scene = Scene(*scene.combo, size)
            reading = read(to_uint8(render(scene, 17, 64, 64, g)[None]))
            assert all(reading.matches(scene).values()), (scene, reading)
    blank = np.zeros((17, 64, 64, 3), np.uint8)
    assert read(blank).color is None and read(blank).direction is None


def test_language_holds_out_combinations_but_not_their_parts():
    assert len(all_scenes()) == 72 and len(training_scenes()) == 72 - len(HELD_OUT)
    seen = {s.combo for s in training_scenes()}
    for color, shape, direction in HELD_OUT:
        assert any(c == color and s == shape for c, s, _ in seen)
        assert any(c == color and d == direction for c, _, d in seen)
        assert any(s == shape and d == direction for _, s, d in seen)


def test_shipped_folder_is_small_and_knows_every_caption_word():
    folder = SHIPPED["tiny"]
    for part in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert (folder / part).is_dir(), part
    weights = sum(f.stat().st_size for f in folder.rglob("*.safetensors"))
    assert weights <= 8 * 2**20, weights
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder / "tokenizer")
    rng = random.Random(0)
    captions = [caption(Scene(*s.combo, rng.choice((None, *SIZES))), rng) for s in all_scenes() * 5]
    for text in [*captions, "A Red Circle Moving Left", *vocabulary()]:  # lower-cased by the tokenizer
        ids = tok(text).input_ids
        assert tok.unk_token_id not in ids and len(ids) <= tok.model_max_length, text
    # the vocabulary the folder declares (dit.vocabulary) is the language's, as training writes it
    assert read_vocabulary("tiny") == declared_vocabulary() and declared_vocabulary()["words"] == vocabulary()


@pytest.fixture(scope="module")
def pipe(tiny_pipe):
    return tiny_pipe


@pytest.fixture(scope="module")
def scored(tiny_scenes):
    """All 72 prompts with the default settings, read back by the detector."""
    print(f"\nall 72: {rates(tiny_scenes)}\nheld out (6): {rates([s for s in tiny_scenes if s.held_out])}")
    return tiny_scenes


@pytest.mark.slow
def test_trained_model_draws_the_colour_and_motion_its_prompt_names(scored):
    """The issue's bar: colour ≥ 95 %, direction ≥ 90 %, held-out combinations included (and on their own)."""
    overall, held = rates(scored), rates([s for s in scored if s.held_out])
    assert overall["color"] >= 0.95 and overall["direction"] >= 0.90, overall
    assert held["color"] >= 5 / 6 and held["direction"] >= 5 / 6, held


@pytest.mark.slow
def test_trained_model_draws_the_shape_its_prompt_names(scored):
    """The issue's bar for shape: ≥ 80 % over all 72, held-out combinations included."""
    assert rates(scored)["shape"] >= 0.80, rates(scored)


@pytest.mark.slow
def test_shipped_folder_is_a_diffusers_wan_pipeline(pipe):
    """diffusers' own WanPipeline loads the shipped folder and denoises to the same latents as ours (its text
    padded to the tokenizer's 16 tokens, as ours is)."""
    from diffusers import WanPipeline

    from dit.pipeline import GenerationRequest
    from tests.test_pipeline_folder import _reference_kwargs

    ref = WanPipeline.from_pretrained(SHIPPED["tiny"])
    ref.set_progress_bar_config(disable=True)
    req = pipe.validate(GenerationRequest("a green square moving down", seed=3))
    got = pipe.denoise(req)
    want = ref(**_reference_kwargs(req), max_sequence_length=16, output_type="latent").frames
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel <= 1e-4, rel


FP8_SCENES = [
    Scene(*combo)
    for combo in [("red", "circle", "right"), ("blue", "square", "down"), ("white", "triangle", "left"),
                  ("purple", "circle", "right"), ("yellow", "square", "up"), ("green", "triangle", "down")]
]  # fmt: skip


def _read_on_ranks(comm: str):
    import parallel
    from dit.pipeline import PipelineConfig, load_pipeline

    mesh = parallel.init_parallel(ulysses=2)
    pipe = load_pipeline(PipelineConfig(model="tiny", device="cpu", comm=comm), mesh)
    if not mesh.is_replica_leader:
        from dit.pipeline import GenerationRequest

        for scene in FP8_SCENES:
            pipe.generate(GenerationRequest(scene.prompt))
        return None
    return [s.reading for s in generate_and_read(pipe, FP8_SCENES)]


@pytest.mark.slow
def test_fp8_ulysses_keeps_the_meaning(scored):
    """Ulysses 2 with FP8 exchange (lossy: its latents differ from one rank's by ~0.3 relative on this model,
    tests/test_pipeline_parallel.py) on 2 gloo ranks: the detector finds what the prompts ask as often as on
    one rank (the shared 72 scenes' readings), give or take one reading of the 18."""
    from tests.distributed import run_distributed

    one = [next(s.reading for s in scored if s.scene == scene) for scene in FP8_SCENES]
    fp8 = run_distributed(2, _read_on_ranks, "fp8", timeout=240)[0]
    hits = lambda readings: [sum(r.matches(s).values()) for s, r in zip(FP8_SCENES, readings, strict=True)]  # noqa: E731
    print(f"\nattributes right per scene, one rank: {hits(one)}, FP8 Ulysses 2: {hits(fp8)}")
    assert sum(hits(fp8)) >= sum(hits(one)) - 1


def _tiny_run(tmp_path, name: str, interrupt_at: int | None = None):
    cfg = train.TrainConfig(
        vae_steps=3,
        encoder_steps=2,
        vae_batch=1,
        vae_frames=5,
        dit_steps=6,
        dit_batch=2,
        clips=4,
        preview_clips=2,
    )
    work, out = tmp_path / f"work-{name}", tmp_path / f"out-{name}"
    if interrupt_at is not None:
        saves = []
        real_save = train.Checkpoints.save

        def save_then_die(self, phase, state):
            real_save(self, phase, state)
            saves.append(phase)
            if phase == "dit" and state["step"] == interrupt_at:
                raise KeyboardInterrupt("killed mid-training")

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train.Checkpoints, "save", save_then_die)
            with pytest.raises(KeyboardInterrupt):
                train.train(cfg, work, out, save_every=1)
        assert not out.exists()
    train.train(cfg, work, out, save_every=1)
    return out


def test_a_work_folder_resumes_only_its_own_run(tmp_path):
    """Another seed or scale given the same --work resumed its checkpoints: a model of two runs, written
    without a word (its text encoder one seed's, its VAE the other's)."""
    config = dataclasses.asdict(train.TrainConfig())
    train.Checkpoints(tmp_path, 1, config).save("vae-decoder", {"step": 1})
    assert train.Checkpoints(tmp_path, 1, config).load("vae-decoder") == {"step": 1}  # the same run resumes
    with pytest.raises(train.OtherRun, match=r"another run \(seed 0 there, 1 here; dit_steps"):
        train.Checkpoints(tmp_path, 1, config | {"seed": 1, "dit_steps": 7})
    (tmp_path / "run.json").unlink()  # checkpoints an earlier version left, their run unnamed
    with pytest.raises(train.OtherRun, match="an unnamed run"):
        train.Checkpoints(tmp_path, 1, config)
    with pytest.raises(SystemExit) as e:
        train.main(["--scale", "nan"])
    assert e.value.code == 2


@pytest.mark.slow
def test_training_is_deterministic_and_resumes_to_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    straight = _tiny_run(tmp_path, "straight")
    resumed = _tiny_run(tmp_path, "resumed", interrupt_at=3)
    for part in ("transformer", "vae", "text_encoder"):
        (a,) = (straight / part).glob("*.safetensors")
        (b,) = (resumed / part).glob("*.safetensors")
        wa, wb = load_file(a), load_file(b)
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa), part
