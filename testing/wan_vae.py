"""diffusers' `AutoencoderKLWan` with the weights of one of ours (`dit.wan.vae.WanVAE`): the reference the
tests compare our VAE and pipelines with, and what diffusers' pipelines the tests save are given."""

from __future__ import annotations

from dataclasses import asdict


def diffusers_wan_vae(vae, **config):
    """diffusers' class on `vae`'s config (with `config`'s keys replaced) and weights, in eval mode."""
    from diffusers import AutoencoderKLWan

    reference = AutoencoderKLWan(**{**asdict(vae.config), **config})
    reference.load_state_dict(vae.state_dict())
    return reference.eval()
