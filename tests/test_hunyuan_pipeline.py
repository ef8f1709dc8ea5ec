"""`tiny-joint`: the HunyuanVideo-1.5 tiny preset through `load_pipeline` (family picked from the preset's
`_class_name`): tiny Qwen-stand-in and glyph encoders with real masks, a tiny `AutoencoderKLHunyuanVideo15`
(×4 time, ×16 space), flow-match Euler; world 1 vs 2 latents."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed


def _pipeline(comm="alltoall", attn_backend="auto", **degrees):
    import parallel
    from dit.pipeline import PipelineConfig, load_pipeline

    mesh = parallel.init_parallel(**degrees)
    config = PipelineConfig(model="tiny-joint", device="cpu", comm=comm, attn_backend=attn_backend)
    return load_pipeline(config, mesh)


def _request(prompt="a red fox"):
    from dit.pipeline import GenerationRequest

    return GenerationRequest(prompt, num_frames=9, height=48, width=80, num_inference_steps=2)


def latents_on_world(degrees: dict) -> torch.Tensor:
    return _pipeline(**degrees).denoise(_request('a sign that reads "OPEN"'))


def test_tiny_joint_generates_frames():
    pipe = _pipeline()
    assert (pipe.sampler, pipe.flow_shift, pipe.limits.size_multiple) == ("euler", 5.0, 16)
    frames = pipe.generate(_request())
    assert frames.shape == (9, 48, 80, 3) and frames.dtype.name == "uint8"


def test_tiny_joint_batch_equals_its_solo_runs():
    """A batch (dit.batch) pads its texts to its longest prompt, where a solo run trims to its own; the text
    stream's products and the attention's text keys run per sample over the real tokens (dit.rowwise,
    parallel.padded_text): measured bit-identical (was 1.1e-6 masked; torch 2.13.0 CPU)."""
    from dit.batch import BatchJob, denoise_batch

    pipe = _pipeline()
    reqs = [_request("a cat"), _request('a much longer prompt with a sign that reads "OPEN"')]
    got = denoise_batch(pipe, [BatchJob(req) for req in reqs])
    for batched, req in zip(got, reqs, strict=True):
        alone = pipe.denoise(req)
        assert ((batched - alone).abs().max() / alone.abs().max()).item() <= 1e-6


def test_tiny_joint_rejects_a_sampler_it_does_not_offer():
    from dit.pipeline import PipelineConfig, load_pipeline

    with pytest.raises(ValueError, match="sampler must be 'euler', got 'unipc'"):
        load_pipeline(PipelineConfig(model="tiny-joint", device="cpu", sampler="unipc"))


def test_tiny_joint_text_carries_real_masks():
    text = _pipeline().text_encoder
    plain, quoted = text.condition("a red fox"), text.condition('a sign that reads "OPEN"')
    assert plain["encoder_attention_mask"].sum() == len("a red fox") + 1  # bytes + end token
    assert plain["encoder_attention_mask_2"].sum() == 0  # no quoted text: the glyph tokens are all padding
    # the reference's glyph text 'Text "OPEN". ', whitespace-trimmed by the tiny encoder, + end token
    assert quoted["encoder_attention_mask_2"].sum() == len('Text "OPEN".') + 1


def test_tiny_joint_attn_backend_math_matches_sdpa():
    with pytest.raises(ValueError, match="attn_backend 'flash3' is not one of"):
        _pipeline(attn_backend="flash3")
    got = {b: _pipeline(attn_backend=b).denoise(_request()) for b in ("math", "sdpa")}
    torch.testing.assert_close(got["math"], got["sdpa"], rtol=1e-5, atol=1e-5)


def test_tiny_joint_latents_same_on_two_ranks():
    expected = latents_on_world({})  # 3 frames x 3 x 5 = 45 tokens: odd
    for got in run_distributed(2, latents_on_world, dict(ulysses=2)):
        assert ((got - expected).norm() / expected.norm()).item() <= 1e-5
