"""`--vae-dtype`: float32 decodes the frames the VAE's own float32 decode gives; bfloat16 stays within the
bound bench/vae_dtype.py measured on the trained tiny model, frame chunks and the band-parallel decode
included; the bench prints its table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import dit
from bench import vae_dtype
from dit.pipeline import GenerationFailed, GenerationRequest, PipelineConfig, load_pipeline
from dit.vae_frames import to_uint8
from dit.wan.vae import decode, read_vae
from tests.distributed import run_distributed

TINY_VAE = Path(dit.__file__).parent / "tiny" / "model" / "vae"
# bfloat16 against float32 on the tiny model (bench/vae_dtype.py, bench/RESULTS.md): at most 8 levels off,
# 0.08 % of values more than 2 levels off, 60.8 dB on 6 scenes; 11 levels, 0.4 %, 56.5 dB on one scene in 2
# steps
BF16_MAX_LEVELS, BF16_OVER_2, BF16_PSNR_DB = 16, 0.01, 50.0


def _reference(latents: torch.Tensor) -> np.ndarray:
    """The tiny VAE's own float32 decode of the DiT's latents, as the pipeline decoded before --vae-dtype."""
    vae = read_vae(TINY_VAE)
    mean, std = (
        torch.tensor(v).view(1, -1, 1, 1, 1) for v in (vae.config.latents_mean, vae.config.latents_std)
    )
    with torch.no_grad():
        return to_uint8(vae.decode(latents * std + mean))


def test_float32_is_todays_decode_and_bfloat16_stays_within_the_bound():
    pipe = load_pipeline(PipelineConfig(model="tiny", device="cpu", vae_dtype="bfloat16", preview_every=0))
    assert {p.dtype for p in pipe.vae.decoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in pipe.vae.encoder.parameters()} == {torch.float32}  # an image's latents unchanged
    latents = pipe.denoise(GenerationRequest("a green square moving up", num_inference_steps=4))
    want = _reference(latents)
    assert np.array_equal(decode(read_vae(TINY_VAE), latents), want)  # --vae-dtype float32: byte-identical

    chunks = []
    got = pipe.decode(latents, on_frames=chunks.append)
    assert got.dtype == np.uint8 and got.shape == want.shape == (17, 64, 64, 3)
    assert [len(c) for c in chunks] == [1, 4, 4, 4, 4] and np.array_equal(np.concatenate(chunks), got)
    diff = vae_dtype.differences(got, want)
    assert 0 < diff["max_diff"] <= BF16_MAX_LEVELS, diff  # bfloat16 did run
    assert diff["over_bound"] <= BF16_OVER_2 and diff["psnr"] >= BF16_PSNR_DB, diff


def _banded_bfloat16():
    """The tiny VAE's float32 decode of random latents on one rank, and its bfloat16 decode in bands across
    the world, chunk by chunk."""
    import torch.distributed as dist

    from dit.vae_frames import cast_decoder

    z, chunks = torch.randn(1, 16, 3, 7, 8, generator=torch.Generator().manual_seed(0)), []
    want = decode(read_vae(TINY_VAE), z)
    got = decode(cast_decoder(read_vae(TINY_VAE), torch.bfloat16), z, dist.group.WORLD, chunks.append)
    return want, got, chunks


def test_banded_decode_in_bfloat16_stays_within_the_bound():
    (want, got, chunks), (_, other, left) = run_distributed(2, _banded_bfloat16)
    assert other is None and left == [] and got.shape == want.shape == (9, 56, 64, 3)
    assert np.array_equal(np.concatenate(chunks), got)
    diff = vae_dtype.differences(got, want)
    assert 0 < diff["max_diff"] <= BF16_MAX_LEVELS, diff
    assert diff["over_bound"] <= BF16_OVER_2 and diff["psnr"] >= BF16_PSNR_DB, diff


@pytest.mark.slow  # loads the tiny model and the published Wan2.1 VAE config
def test_a_float16_overflow_is_an_error_not_black_pixels():
    vae = read_vae(TINY_VAE)
    from dit.vae_frames import cast_decoder, decode_frames

    cast_decoder(vae, torch.float16)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(1e6)  # outputs past float16's 65504
    with pytest.raises(GenerationFailed, match=r"decode in float16 gave non-finite values .*--vae-dtype"):
        decode_frames(vae, torch.randn(1, vae.config.z_dim, 2, 4, 4))


def test_bench_prints_a_row_per_dtype(capsys):
    real = ["--real-frames", "1", "--real-height", "16", "--real-width", "16"]
    vae_dtype.main(["--scenes", "1", "--steps", "2", "--tiny-frames", "5", *real, "--json"])
    tables = json.loads(capsys.readouterr().out)["tables"]
    assert [t["latents"] for t in tables] == [
        "trained tiny model, 1 scenes of 5×64×64",
        "Wan2.1 VAE config, random weights, 1×16×16",
    ]
    for table in tables:
        rows = table["rows"]
        assert [r["dtype"] for r in rows] == ["float32", "bfloat16", "float16"]
        assert (rows[0]["max_diff"], rows[0]["psnr"], rows[0]["speedup"]) == (0, float("inf"), 1.0)
        for r in rows[1:]:  # a lower precision: off, but by a few levels
            assert r["max_diff"] <= BF16_MAX_LEVELS and 40 < r["psnr"] < float("inf"), r
            assert r["seconds"] > 0
