"""The tiny model's live-preview map (dit.preview), shipped as `vae/latent_preview.json`:

    .venv/bin/python -m dit.tiny.preview_map     # refits it for the shipped VAE (a minute on 2 CPU cores)

Its VAE draws a pixel as a cell's lit share times the clip's colour (the written-down latents of
dit.tiny.latents), a product no linear map makes: the map fitted at load on random latents gave every
object the same olive tint. This one has the channels' pairwise products, fitted on the written-down latents
of rendered training clips decoded by the VAE. Noise is added to those latents because the DiT's x0
estimates lie near them, not on them (the DiT's last x0 of each of the 72 scenes, previewed: the colour of
the video's middle frame on 71 with noise, 69 without; 20.6 dB against 20.0)."""

from __future__ import annotations

import json

import torch

from dit.preview import LatentPreview, fit_rows, solve, write_preview
from dit.tiny.clips import MODEL_DIR, TrainConfig, clip
from dit.tiny.latents import describe

NOISE = 0.3  # in the DiT's normalised latent space (unit variance per channel)


@torch.no_grad()
def fit(vae, cfg) -> LatentPreview:
    """The map for a trained tiny VAE (its config holding the latents' mean and std), fitted on
    `cfg.preview_clips` clips of the training (a `dit.tiny.clips.TrainConfig`)."""
    from dit.wan.vae import decode

    generator = torch.Generator().manual_seed(cfg.seed)
    shape = (1, -1, 1, 1, 1)
    mean, std = (torch.tensor(v).view(shape) for v in (vae.config.latents_mean, vae.config.latents_std))
    rows = []
    for index in range(cfg.preview_clips):
        z = (describe(clip(cfg, index, cfg.frames)[1][None]) - mean) / std
        z = z + NOISE * torch.randn(z.shape, generator=generator)
        rows.append(fit_rows(z, decode(vae, z), 2 ** sum(vae.config.temperal_downsample)))
    scale = 2 ** (len(vae.config.dim_mult) - 1)
    return solve(torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows]), scale, quadratic=True)


def main() -> None:
    from dit.wan.vae import read_vae

    cfg = TrainConfig(**json.loads((MODEL_DIR / "training.json").read_text()))
    vae = read_vae(MODEL_DIR / "vae")
    write_preview(MODEL_DIR / "vae", fit(vae, cfg))
    print(f"wrote {MODEL_DIR / 'vae'}/latent_preview.json")


if __name__ == "__main__":
    main()
