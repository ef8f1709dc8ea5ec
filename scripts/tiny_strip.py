"""Renders the README's frame strip from the trained tiny model's own output: a few prompts of its language,
every fourth frame of each video side by side under its prompt, written as one PNG.

    .venv/bin/python scripts/tiny_strip.py [--out docs/tiny-strip.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402

PROMPTS = (
    "a red circle moving right",
    "a blue triangle moving up",
    "a yellow square moving down",
    "a purple circle moving right",  # held out of training
    "a white square moving up",  # held out of training
    "the big green triangle sliding to the left",
)


def strip(pipe, prompts, every: int = 4, scale: int = 2, label_h: int = 14) -> Image.Image:
    rows = []
    for prompt in prompts:
        frames = pipe.generate(GenerationRequest(prompt))
        row = np.concatenate([np.pad(f, ((0, 0), (0, 2), (0, 0))) for f in frames[::every]], 1)
        row = Image.fromarray(row).resize((row.shape[1] * scale, row.shape[0] * scale), Image.NEAREST)
        canvas = Image.new("RGB", (row.width, row.height + label_h), (24, 24, 24))
        ImageDraw.Draw(canvas).text((4, 1), f'"{prompt}"', fill=(230, 230, 230))
        canvas.paste(row, (0, label_h))
        rows.append(canvas)
    out = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)))
    y = 0
    for r in rows:
        out.paste(r, (0, y))
        y += r.height
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/tiny-strip.png"))
    args = p.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    strip(load_pipeline(PipelineConfig(model="tiny", device="cpu")), PROMPTS).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
