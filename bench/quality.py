"""Quality against speed on the trained tiny model: for each (steps, guidance, cache) option, all 72 prompts
of its language generated once, read back by the detector (dit/tiny/detect.py), scored, and timed. With a
step cache (dit/cache.py) the table adds the evaluations it skipped and the PSNR of its frames against the
same option uncached.

    python bench/quality.py [--steps 4 8 16] [--guidance 1 3 5] [--cache off fbcache:0.05 ...] [--seed 0]
                            [--quant none fp8] [--attn auto fp8] [--model tiny] [--json]

Later speed work (few-step schedules, FP8) reports its score here beside the time it saves.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.cache_config import CacheConfig  # noqa: E402
from dit.cli_args import typed  # noqa: E402
from dit.fp8_linear import QUANTS  # noqa: E402
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from dit.request import check_numbers  # noqa: E402
from dit.shape import request_limits  # noqa: E402
from dit.tiny.language import all_scenes  # noqa: E402
from dit.tiny.score import generate_and_read, rates  # noqa: E402
from parallel.kernels import BACKENDS  # noqa: E402

SCORES = ("color", "shape", "direction", "all", "held_out_all")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of uint8 frames a against b, dB (inf when equal)."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def run(
    model: str,
    steps: list[int],
    guidance: list[float],
    caches: list[str],
    seed: int,
    quants=("none",),
    attns=("auto",),
) -> list[dict]:
    """A row per (FP8 linear layers or not, attention backend, steps, guidance, cache); the PSNR reference of
    each (steps, guidance) is the unquantised, auto-attention, uncached run, made first whether asked for or
    not."""
    references, rows = {}, []
    exact = ("none", "auto")
    for quant, attn in [exact, *((q, a) for q in quants for a in attns if (q, a) != exact)]:
        pipe = load_pipeline(PipelineConfig(model=model, quant=quant, attn_backend=attn))
        for n in steps:
            for g in guidance:
                for cache in ["off", *(c for c in caches if c != "off")]:
                    if (quant, attn) == exact and cache == "off" and (n, g) in references:
                        continue
                    scored = generate_and_read(
                        pipe, all_scenes(), num_inference_steps=n, guidance_scale=g, seed=seed, cache=cache
                    )
                    reference = references.setdefault((n, g), scored)
                    held = [s for s in scored if s.held_out]
                    row = dict(
                        quant=quant,
                        attn=attn,
                        steps=n,
                        guidance=g,
                        cache=cache,
                        **rates(scored),
                        held_out_all=rates(held)["all"],
                        seconds_per_video=statistics.median(s.seconds for s in scored),
                        skipped=statistics.mean(s.skipped for s in scored),
                        psnr=statistics.median(
                            psnr(s.frames, u.frames) for s, u in zip(scored, reference, strict=True)
                        ),
                    )
                    if cache in caches and quant in quants and attn in attns:
                        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=at_least(1), nargs="+", default=[4, 8, 16])
    p.add_argument("--guidance", type=float, nargs="+", default=[1.0, 3.0, 5.0])
    p.add_argument(  # checked before the 72 reference videos, not after them
        "--cache",
        nargs="+",
        type=typed(CacheConfig.checked),
        default=["off"],
        help="step caches: off | fbcache[:THRESHOLD]",
    )
    p.add_argument("--quant", nargs="+", choices=QUANTS, default=["none"], help="FP8 linear layers: fp8")
    p.add_argument("--attn", nargs="+", choices=BACKENDS, default=["auto"], help="attention backends")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    try:  # every (steps, guidance) against the model's limits, before any model loads
        limits = request_limits(args.model)
        for n, g in itertools.product(args.steps, args.guidance):
            check_numbers(GenerationRequest("x", num_inference_steps=n, guidance_scale=g), limits)
    except (FileNotFoundError, ValueError) as e:
        p.error(f"{args.model}: {e}")
    rows = run(args.model, args.steps, args.guidance, args.cache, args.seed, args.quant, args.attn)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.model}: 72 prompts (6 held out of training), seed {args.seed}, one CPU rank")
    print(
        "| quant | attn | steps | guidance | cache | colour | shape | direction | all three "
        "| held-out, all three | evaluations skipped | PSNR vs unquantised uncached, dB (median) | s/video |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [r["quant"], r["attn"], r["steps"], f"{r['guidance']:g}", r["cache"]]
        cells += [f"{r[k]:.0%}" for k in SCORES]
        cells += [f"{r['skipped']:.0%}", f"{r['psnr']:.1f}", f"{r['seconds_per_video']:.2f}"]
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    run_main(main)
