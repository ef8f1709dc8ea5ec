"""The tiny model's live-preview map (dit.preview), shipped as `vae/latent_preview.json`:

    .venv/bin/python -m dit.tiny.preview_map     # refits it for the shipped VAE (a minute on 2 CPU cores)

Its VAE draws a pixel as a cell's lit share times the clip's colour (the written-down latents of
dit.tiny.latents), a product no linear map makes: the map fitted at load on random latents gave every
object the same olive tint. This one has the channels' pairwise products, fitted on the written-down latents
of rendered training clips decoded by the VAE. Noise is added to those latents because the DiT's x0
estimates lie near them, not on them (on the 72 scenes' last previews: the colour of the video in 71 of 72
without noise it was 69)."""

from __future__ import annotations

import torch

from dit.preview import LatentPreview, fit_rows, solve, write_preview
from dit.tiny.latents import describe

CLIPS = 128
NOISE = 0.3  # in the DiT's normalised latent space (unit variance per channel)


@torch.no_grad()
def fit(vae, clips: int = CLIPS, seed: int = 0) -> LatentPreview:
    """The map for a trained tiny VAE (its config holding the latents' mean and std)."""
    from dit.tiny.train import TrainConfig, clip
    from dit.vae import decode

    cfg, generator = TrainConfig(seed=seed), torch.Generator().manual_seed(seed)
    shape = (1, -1, 1, 1, 1)
    mean, std = (torch.tensor(v).view(shape) for v in (vae.config.latents_mean, vae.config.latents_std))
    rows = []
    for index in range(clips):
        z = (describe(clip(cfg, index, cfg.frames)[1][None]) - mean) / std
        z = z + NOISE * torch.randn(z.shape, generator=generator)
        rows.append(fit_rows(z, decode(vae, z), 2 ** sum(vae.config.temperal_downsample)))
    scale = 2 ** (len(vae.config.dim_mult) - 1)
    return solve(torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows]), scale, quadratic=True)


def main() -> None:
    from diffusers import AutoencoderKLWan

    from dit.tiny.train import MODEL_DIR

    vae = AutoencoderKLWan.from_pretrained(MODEL_DIR / "vae", torch_dtype=torch.float32).eval()
    write_preview(MODEL_DIR / "vae", fit(vae))
    print(f"wrote {MODEL_DIR / 'vae'}/latent_preview.json")


if __name__ == "__main__":
    main()
