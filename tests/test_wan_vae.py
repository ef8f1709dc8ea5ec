"""Wan's VAE in our code (`dit.wan.vae`) against diffusers' `AutoencoderKLWan` on the same weights: Wan2.1's
tiny layout and Wan2.2's (residual levels, 2×2 patches), decode and encode over several chunks; the random
init of a seed; folders either one saved; and the shipped tiny model's VAE decoding without diffusers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dit.wan.vae import WAN22_Z_DIM, read_vae, save_vae, tiny_config, tiny_vae
from testing.wan_vae import diffusers_wan_vae

ATOL = 1e-5  # float32 on outputs in [-1, 1] (measured: 1.8e-6 decoded, 3.7e-7 encoded: RMS norm rounding)
LAYOUTS = [16, WAN22_Z_DIM]  # Wan2.1's tiny layout; Wan2.2's


def _space(z_dim: int) -> int:
    return 16 if z_dim == WAN22_Z_DIM else 8


def _latents(z_dim: int) -> torch.Tensor:
    # 3 latent frames: the first chunk, one whose caches hold a single frame, one whose hold two
    return torch.randn(1, z_dim, 3, 4, 5, generator=torch.Generator().manual_seed(0))


def _video(z_dim: int) -> torch.Tensor:
    space = _space(z_dim)  # 9 frames: the first frame, then two chunks of 4
    return torch.rand(1, 3, 9, 3 * space, 2 * space, generator=torch.Generator().manual_seed(1)) * 2 - 1


@pytest.mark.parametrize("z_dim", LAYOUTS)
def test_decode_and_encode_match_diffusers(z_dim):
    from diffusers import AutoencoderKLWan

    ours = tiny_vae(z_dim, seed=1)
    reference = diffusers_wan_vae(ours)
    with torch.no_grad():
        got, want = ours.decode(_latents(z_dim)), reference.decode(_latents(z_dim)).sample
        assert got.shape == want.shape == (1, 3, 9, 4 * _space(z_dim), 5 * _space(z_dim))
        assert (got - want).abs().max() <= ATOL and want.abs().max() <= 1
        got, want = ours.encode(_video(z_dim)), reference.encode(_video(z_dim)).latent_dist.mode()
        assert got.shape == want.shape == (1, z_dim, 3, 3, 2) and (got - want).abs().max() <= ATOL
    # a seed draws the weights diffusers' class draws (the random presets' VAEs stay what they were)
    torch.manual_seed(1)
    drawn = AutoencoderKLWan(**vars(tiny_config(z_dim))).state_dict()
    assert list(drawn) == list(ours.state_dict())
    assert all(torch.equal(drawn[k], v) for k, v in ours.state_dict().items())


def test_folders_load_either_way(tmp_path):
    from diffusers import AutoencoderKLWan

    ours = tiny_vae(WAN22_Z_DIM, seed=2)
    ours.config.latents_mean = torch.linspace(-1, 1, WAN22_Z_DIM).tolist()
    diffusers_wan_vae(ours).save_pretrained(tmp_path / "theirs")
    loaded = read_vae(tmp_path / "theirs")
    assert loaded.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), ours.parameters(), strict=True))
    save_vae(ours, tmp_path / "ours")
    theirs = AutoencoderKLWan.from_pretrained(tmp_path / "ours").eval()
    assert list(theirs.config.latents_mean) == ours.config.latents_mean
    with torch.no_grad():
        want = theirs.decode(_latents(WAN22_Z_DIM)).sample
        assert (loaded.decode(_latents(WAN22_Z_DIM)) - want).abs().max() <= ATOL


def test_the_tiny_models_vae_decodes_without_diffusers():
    script = textwrap.dedent(
        """
        import sys, torch
        from dit.wan.vae import decode, load_vae
        vae = load_vae(sys.argv[1], z_dim=16, device="cpu")
        frames = decode(vae, torch.randn(1, 16, 5, 8, 8))
        print(frames.shape, frames.dtype, sorted(m for m in sys.modules if m.split(".")[0] == "diffusers"))
        """
    )
    model = Path(__file__).resolve().parents[1] / "dit" / "tiny" / "model"
    run = [sys.executable, "-c", script, str(model)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["(17,", "64,", "64,", "3)", "uint8", "[]"], out.stdout + out.stderr
