"""The GPU kit's hunyuan-vae section: HunyuanVideo-1.5's VAE (published config, random weights, float32)
decoding 33 frames at 480p as diffusers does (every frame in one call) and as the pipeline does (a latent
frame at a time, `dit.hunyuan.vae_chunks`): seconds, peak memory, the difference between the two videos."""

from __future__ import annotations

import torch

from bench.common import max_rel
from bench.gpu_kit import Kit, Report, gib


def hunyuan_vae(kit: Kit, report: Report) -> None:
    from diffusers import AutoencoderKLHunyuanVideo15

    from dit.hunyuan.vae import tiny_vae
    from dit.hunyuan.vae_chunks import streamed

    channels = kit.pick(32, 8)  # the tiny VAE has 8 channels a level
    with torch.device(kit.device):
        vae = kit.pick(AutoencoderKLHunyuanVideo15, lambda: tiny_vae(channels))().eval()
    frames, height, width = kit.pick((33, 480, 848), (5, 32, 48))
    z = torch.randn(1, channels, (frames - 1) // 4 + 1, height // 16, width // 16, device=kit.device)
    rows, videos = [], []

    def decoded(name: str, decode) -> None:
        sec, video, peak = kit.time(decode, warmup=1, iters=2)
        videos.append(video)
        rows.append([name, f"{sec:.3f}", gib(peak)])
        kit.free()

    with torch.no_grad():
        decoded("diffusers (whole video)", lambda: vae.decode(z).sample)
        streamed(vae)  # the same weights, now a latent frame at a time (outside the timed calls)
        decoded("a latent frame at a time", lambda: torch.cat(list(vae.decode_chunks(z)), 2))
    diff = max_rel(videos[1], videos[0])
    rows[1].append(f"{diff:.1e}")
    rows[0].append("—")
    report.table(
        f"HunyuanVideo-1.5 VAE decode, float32: {tuple(z.shape)} → {frames} frames {width}×{height}",
        ["decode", "s", "peak GiB", "max rel vs diffusers"],
        rows,
    )
    report.check("a latent frame at a time vs diffusers' whole video (max rel)", diff, 1e-4)
