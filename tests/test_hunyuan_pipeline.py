"""`tiny-joint`: the HunyuanVideo-1.5 tiny preset driven by the shared pipeline through the t2v adapter, with
the built-in tiny text encoder and VAE. (Assembled here the way `dit.pipeline.load_pipeline` will once it
switches on the family.)"""

from __future__ import annotations

from dataclasses import replace

import torch

from tests.distributed import run_distributed


def _pipeline(comm="alltoall", **degrees):
    import parallel
    from dit import load_transformer
    from dit.hunyuan import parallelize_hunyuan
    from dit.hunyuan.t2v import HunyuanT2V
    from dit.pipeline import TINY_LIMITS, Pipeline, PipelineConfig
    from dit.text_encoder import TinyTextEncoder
    from dit.vae import tiny_vae

    mesh = parallel.init_parallel(**degrees)
    model = parallelize_hunyuan(HunyuanT2V(load_transformer("tiny-joint")), mesh, comm)
    encoder = TinyTextEncoder(model.config.text_dim)
    limits = replace(TINY_LIMITS, size_multiple=8, max_prompt_tokens=encoder.max_tokens)
    vae = tiny_vae(model.config.in_channels) if mesh.is_replica_leader else None
    return Pipeline(PipelineConfig(model="tiny-joint"), mesh, model, encoder, vae, limits, flow_shift=3.0)


def _request():
    from dit.pipeline import GenerationRequest

    return GenerationRequest("a red fox", num_frames=9, height=24, width=40, num_inference_steps=2)


def latents_on_world(degrees: dict) -> torch.Tensor:
    return _pipeline(**degrees).denoise(_request())


def test_tiny_joint_generates_frames():
    frames = _pipeline().generate(_request())
    assert frames.shape == (9, 24, 40, 3) and frames.dtype.name == "uint8"


def test_tiny_joint_latents_same_on_two_ranks():
    expected = _pipeline().denoise(_request())  # 3 frames x 3 x 5 = 45 tokens: odd
    for got in run_distributed(2, latents_on_world, dict(ulysses=2)):
        assert ((got - expected).norm() / expected.norm()).item() <= 1e-5
