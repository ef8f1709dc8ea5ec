"""Quality against speed on the trained tiny model: for each (steps, guidance) option, all 72 prompts of its
language generated once, read back by the detector (dit/tiny/detect.py), scored, and timed.

    python bench/quality.py [--steps 4 8 16] [--guidance 1 3 5] [--seed 0] [--model tiny] [--json]

Later speed work (caching, few-step schedules, FP8) reports its score here beside the time it saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from dit.pipeline import PipelineConfig, load_pipeline  # noqa: E402
from dit.tiny.language import all_scenes  # noqa: E402
from dit.tiny.score import generate_and_read, rates  # noqa: E402

SCORES = ("color", "shape", "direction", "all", "held_out_all")


def run(model: str, steps: list[int], guidance: list[float], seed: int) -> list[dict]:
    pipe = load_pipeline(PipelineConfig(model=model))
    rows = []
    for n in steps:
        for g in guidance:
            scored = generate_and_read(pipe, all_scenes(), num_inference_steps=n, guidance_scale=g, seed=seed)
            held = [s for s in scored if s.held_out]
            rows.append(
                dict(
                    steps=n,
                    guidance=g,
                    **rates(scored),
                    held_out_all=rates(held)["all"],
                    seconds_per_video=statistics.median(s.seconds for s in scored),
                )
            )
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--guidance", type=float, nargs="+", default=[1.0, 3.0, 5.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    rows = run(args.model, args.steps, args.guidance, args.seed)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.model}: 72 prompts (6 held out of training), seed {args.seed}, one CPU rank")
    print("| steps | guidance | colour | shape | direction | all three | held-out, all three | s/video |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [r["steps"], f"{r['guidance']:g}", *(f"{r[k]:.0%}" for k in SCORES)]
        print("| " + " | ".join(map(str, cells)) + f" | {r['seconds_per_video']:.2f} |")


if __name__ == "__main__":
    main()
