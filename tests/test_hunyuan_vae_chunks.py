"""HunyuanVideo-1.5's VAE a latent frame at a time (`dit.hunyuan.vae_chunks`) against diffusers' own decode of
the whole video on the same weights; its attention block without the `[S, S]` mask against diffusers' block
(float64 and float32, frames of uneven sizes). The banded decode of the streamed VAE at 1-4 ranks:
tests/test_vae_parallel.py; the pipelines against diffusers' pipeline: tests/test_hunyuan_*.py."""

from __future__ import annotations

import json

import pytest
import torch

from dit.hunyuan.vae import load_vae, tiny_vae
from dit.hunyuan.vae_chunks import streamed


@pytest.mark.parametrize(("dtype", "bound"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_the_attention_block_equals_diffusers_masked_one(dtype, bound):
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    torch.manual_seed(0)
    theirs = HunyuanVideo15AttnBlock(16).to(dtype).eval()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = torch.nn.Module()  # a stand-in VAE whose decoder is the block
    ours.decoder = HunyuanVideo15AttnBlock(16).to(dtype)
    streamed(ours).decoder.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 16, 4, 3, 5, dtype=dtype)  # 4 frames of 3×5 positions
    with torch.no_grad():
        want, whole, chunks = theirs(x), ours.decoder(x), torch.cat(list(ours.decode_chunks(x)), 2)
    for got in (whole, chunks):  # in one call, and a frame at a time (keys and values carried)
        assert ((got - want).abs().max() / want.abs().max()).item() <= bound


def test_a_latent_frame_at_a_time_decodes_as_diffusers_whole_video():
    z = torch.randn(1, 4, 4, 4, 5, generator=torch.Generator().manual_seed(1))
    vae = load_vae(None, 4, "cpu")  # tiny_vae(4), streamed
    with torch.no_grad():
        want = tiny_vae(4).decode(z).sample
        chunks = list(vae.decode_chunks(z))
        whole = vae.decode(z).sample  # no stream: diffusers' decoder, but the attention
    assert [c.shape[2] for c in chunks] == [1, 4, 4, 4]
    for got in (torch.cat(chunks, 2), whole):
        assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5


def test_bench_prints_both_blocks(capsys):
    from bench import vae_attention

    vae_attention.main(["--frames", "2", "--channels", "8", "--height", "3", "--width", "4", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["impl"], r["positions"]) for r in rows] == [("diffusers", 24), ("ours", 24)]
    assert rows[1]["max_rel"] <= 1e-6 and all(r["seconds"] > 0 for r in rows)
