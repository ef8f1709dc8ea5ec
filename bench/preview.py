"""Live previews (`dit.preview`): what one costs against a denoising step, and how close it comes to the VAE.

    python bench/preview.py            # the trained tiny model at its defaults, CPU

Rows: the linear map's fit at load (random latents decoded by the tiny VAE: what a VAE without a shipped map
gets); one tiny step (a denoise without previews over its steps, prompt encoding included); one preview on
the tiny latents (its shipped map + resize) and its share of a step; the linear map alone and map + resize on
a Wan2.1-14B-shaped latent (16 × 21 × 60 × 104, 480 × 832 → a 148 × 256 preview), and the tiny's map with
pair products on it, CPU. Times: the median of --iters after a warm-up. Fit quality: PSNR of the last step's
preview (the shipped map, and the linear one) against the VAE's decode of the same x0 (its middle frame), per
prompt, beside the ceiling any map per latent pixel has (the decode mean-pooled to the latent grid and
upsampled alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.entry import run_main  # noqa: E402
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.preview import fit_preview

PROMPTS = [
    "a red ball going left",
    "a lighthouse at dusk",  # outside the tiny model's language
    "a blue square moving right",
    "the white box sliding up",
]
WAN14B_LATENT = (1, 16, 21, 60, 104)


def median_s(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()
    return float(10 * np.log10(255**2 / mse))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()

    pipe = load_pipeline(PipelineConfig(model="tiny", device="cpu"))
    channels, scale = pipe.model.config.in_channels, pipe.compression[1]
    fit_s = median_s(lambda: fit_preview(partial_decode(pipe), channels, scale), 3)
    linear = fit_preview(partial_decode(pipe), channels, scale)  # what a VAE without a shipped map gets

    req = pipe.validate(GenerationRequest(prompt=PROMPTS[0]))
    steps = req.num_inference_steps
    step_s = median_s(lambda: pipe.denoise(req), 3) / steps
    latents = pipe.denoise(req)
    tiny_s = median_s(lambda: pipe.preview(latents), args.iters)

    big = torch.randn(WAN14B_LATENT)
    map_s = median_s(lambda: linear.rgb(big), args.iters)
    big_s = median_s(lambda: linear(big), args.iters)
    big_shape = linear(big).shape
    products_s = median_s(lambda: pipe.preview(big), args.iters)

    rows = [
        ("linear fit at load (tiny VAE, 16 decodes)", f"{fit_s * 1e3:.0f} ms", ""),
        (f"tiny step ({req.height}x{req.width}, {req.num_frames} frames)", f"{step_s * 1e3:.1f} ms", ""),
        ("tiny preview (map + resize)", f"{tiny_s * 1e3:.2f} ms", f"{tiny_s / step_s:.2%} of a step"),
        (f"Wan2.1-14B latent {WAN14B_LATENT[1:]}: map", f"{map_s * 1e3:.2f} ms", ""),
        (f"Wan2.1-14B latent: map + resize to {big_shape[:2]}", f"{big_s * 1e3:.2f} ms", ""),
        ("Wan2.1-14B latent: the tiny map (pair products) + resize", f"{products_s * 1e3:.2f} ms", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print("Live preview cost (CPU, torch threads:", torch.get_num_threads(), ")")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>10}  {note}")

    print(f"\nFit quality: last step's preview vs the VAE decode of the same x0 (tiny, {steps} steps)")
    print(f"  {'prompt':<28} {'shipped dB':>10} {'linear dB':>10} {'ceiling dB':>11}")
    shipped = pipe.preview
    for prompt in PROMPTS:
        seen = []  # each x0 previewed, recorded around the pipeline's map
        pipe.preview = lambda x0, seen=seen: seen.append(x0) or shipped(x0)
        pipe.denoise(GenerationRequest(prompt=prompt), on_preview=lambda step, image: None)
        x0 = seen[-1]
        mid = (frames := pipe.decode(x0))[len(frames) // 2]
        ceiling = pooled_ceiling(mid, x0.shape[-2:])
        quality = f"{psnr(shipped(x0), mid):>10.2f} {psnr(linear(x0), mid):>10.2f} {ceiling:>11.2f}"
        print(f"  {prompt:<28} {quality}")
    pipe.preview = shipped


def partial_decode(pipe):
    return lambda z: pipe.family.decode(pipe.vae, z)


def pooled_ceiling(frame: np.ndarray, grid) -> float:
    pixels = torch.from_numpy(frame.astype(np.float32)).permute(2, 0, 1)[None]
    pooled = F.adaptive_avg_pool2d(pixels, tuple(grid))
    up = F.interpolate(pooled, size=frame.shape[:2], mode="bilinear", align_corners=False)
    return psnr(up[0].permute(1, 2, 0).round().clamp(0, 255).numpy(), frame)


if __name__ == "__main__":
    run_main(main)
