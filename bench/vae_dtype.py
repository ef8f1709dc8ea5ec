"""The VAE decode in float32, bfloat16 and float16 (`--vae-dtype`) on the same latents: how far each lower
precision's uint8 frames are from float32's (largest difference in levels, share of values more than 2 levels
off, PSNR) and the seconds a decode takes, on
(a) the trained tiny model's videos: the latents of --scenes of its scenes (every 12th of the 72: a few
    colours and shapes), decoded by its own VAE;
(b) random latents through the published Wan2.1 VAE config (73 M decoder parameters) with fixed-seed random
    weights, at --real-frames × --real-height × --real-width.

    python bench/vae_dtype.py                                      # CPU: 6 scenes; Wan2.1 VAE 17×240×416
    python bench/vae_dtype.py --real-frames 81 --real-height 480 --real-width 832 --device cuda   # a GPU

Each decode is the pipeline's (`family.decode`: latents → uint8 frames on the host) of a copy of the VAE whose
decoder `dit.vae_frames.cast_decoder` put in the dtype. Seconds: the median of --iters decodes after --warmup
(on CUDA with events; each decode ends with its frames on the host).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import timed  # noqa: E402
from bench.entry import run_main  # noqa: E402
from bench.quality import psnr  # noqa: E402
from dit.pipeline import DTYPES  # noqa: E402
from dit.vae_frames import cast_decoder  # noqa: E402

SEED = 0
BOUND = 2  # levels: a lower precision may be the default if it keeps every frame within this of float32's


def differences(frames: np.ndarray, reference: np.ndarray) -> dict:
    """uint8 frames against the float32 ones: the largest difference in levels, the share of values more
    than `BOUND` levels off, PSNR in dB."""
    diff = np.abs(frames.astype(np.int16) - reference.astype(np.int16))
    over = float((diff > BOUND).mean())
    return dict(max_diff=int(diff.max()), over_bound=over, psnr=psnr(frames, reference))


def measure(vae, decode, latents: list[torch.Tensor], dtypes, args) -> list[dict]:
    """A row per dtype: `decode(vae in that dtype, z)` of every latent against float32's (the first)."""
    device, rows, reference = torch.device(args.device), [], None
    for name in ["float32", *(d for d in dtypes if d != "float32")]:
        runs = _decodes(cast_decoder(copy.deepcopy(vae), DTYPES[name]), decode, latents, args, device)
        frames = np.concatenate([out for _, out in runs])
        reference = frames if reference is None else reference
        seconds = statistics.median(s for s, _ in runs)
        rows.append(dict(dtype=name, **differences(frames, reference), seconds=seconds))
    for row in rows:
        row["speedup"] = rows[0]["seconds"] / row["seconds"]
    return [r for r in rows if r["dtype"] in dtypes]


def _decodes(vae, decode, latents, args, device) -> list[tuple[float, np.ndarray]]:
    return [timed(lambda z=z: decode(vae, z), args.warmup, args.iters, device) for z in latents]


def tiny(args) -> tuple[str, list[dict]]:
    """(a): the trained tiny model's latents, its VAE."""
    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
    from dit.tiny.language import all_scenes

    pipe = load_pipeline(PipelineConfig(model="tiny", device=args.device, preview_every=0))
    scenes = all_scenes()[:: 72 // args.scenes][: args.scenes]
    request = dict(num_inference_steps=args.steps) if args.steps else {}
    request |= dict(num_frames=args.tiny_frames) if args.tiny_frames else {}
    requests = [pipe.validate(GenerationRequest(s.prompt, seed=SEED, **request)) for s in scenes]
    latents = [pipe.denoise(r) for r in requests]
    size = f"{requests[0].num_frames}×{requests[0].height}×{requests[0].width}"
    what = f"trained tiny model, {len(scenes)} scenes of {size}"
    return what, measure(pipe.vae, pipe.family.decode, latents, args.dtypes, args)


def real(args) -> tuple[str, list[dict]]:
    """(b): random latents, the published Wan2.1 VAE config with fixed-seed random weights."""
    from dit.wan.vae import WanVAE, WanVAEConfig, decode

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        vae = WanVAE(WanVAEConfig()).eval().to(args.device)
    shape = (1, 16, (args.real_frames - 1) // 4 + 1, args.real_height // 8, args.real_width // 8)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(SEED)).to(args.device)
    what = f"Wan2.1 VAE config, random weights, {args.real_frames}×{args.real_height}×{args.real_width}"
    return what, measure(vae, decode, [z], args.dtypes, args)


def markdown(tables: list[tuple[str, list[dict]]]) -> str:
    out = [
        "| latents | VAE dtype | max \\|Δ\\| (levels) | share > 2 levels | PSNR vs float32 (dB) "
        "| s/decode | speed-up |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for what, rows in tables:
        for r in rows:
            db = "∞" if math.isinf(r["psnr"]) else f"{r['psnr']:.1f}"
            cells = [what, r["dtype"], r["max_diff"], f"{r['over_bound']:.4%}", db]
            cells += [f"{r['seconds']:.3f}", f"{r['speedup']:.2f}"]
            out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--scenes", type=int, default=6, help="tiny model scenes (0: none)")
    p.add_argument("--steps", type=int, help="the tiny model's denoising steps (default: its own, 12)")
    p.add_argument("--tiny-frames", type=int, help="the tiny model's frames, 4k+1 (default: its own, 17)")
    p.add_argument("--real-frames", type=int, default=17, help="4k+1; 0: skip the Wan2.1 VAE")
    p.add_argument("--real-height", type=int, default=240)
    p.add_argument("--real-width", type=int, default=416)
    p.add_argument("--warmup", type=int, help="decodes before the timed ones (default: CUDA 1, CPU 0)")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 1 if args.device.startswith("cuda") else 0
    tables = [tiny(args)] if args.scenes else []
    tables += [real(args)] if args.real_frames else []
    if args.json:
        print(json.dumps(dict(config=vars(args), tables=[dict(latents=w, rows=r) for w, r in tables])))
        return
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"VAE decode per dtype on {where} ({torch.get_num_threads()} threads), torch {torch.__version__}")
    print(markdown(tables))


if __name__ == "__main__":
    run_main(main)
