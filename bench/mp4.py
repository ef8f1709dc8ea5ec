"""What writing the MP4 costs: H.264 (libx264, yuv420p, CRF 18) through the bundled ffmpeg, per x264
preset, on frames shaped like a real video's (81 frames of 480×832 by default: a smooth moving scene with
fine texture, not noise, which no encoder compresses). Prints seconds, MB and the mean absolute frame error
against the input for each preset, so the default (`dit.video.PRESET`) is chosen from a table, not a guess.

    python bench/mp4.py [--frames 81] [--size 480x832] [--presets ultrafast superfast veryfast faster medium]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.video import read_mp4, write_mp4  # noqa: E402


def scene(frames: int, height: int, width: int) -> np.ndarray:
    """A lit disc crossing a gradient with a fine fixed texture: motion, edges and detail, as in a video."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    texture = np.random.default_rng(0).integers(0, 24, (height, width, 1)).astype(np.float32)
    out = np.empty((frames, height, width, 3), np.uint8)
    for t in range(frames):
        cx, cy = width * (0.2 + 0.6 * t / max(frames - 1, 1)), height * 0.5
        disc = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * (0.12 * height) ** 2))[..., None]
        base = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin(x / 40 + t / 8)], -1) * 180
        out[t] = np.clip(base + disc * np.array([255, 80, 40]) + texture, 0, 255)
    return out


# x264's presets, fastest first (another is ffmpeg's exit 234 after the warm-up)
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower",
                "veryslow", "placebo")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=at_least(1), default=81)
    p.add_argument("--size", default="480x832", help="HEIGHTxWIDTH")
    p.add_argument("--presets", nargs="+", default=["ultrafast", "superfast", "veryfast", "faster", "medium"],
                   choices=X264_PRESETS)  # fmt: skip
    args = p.parse_args()
    size = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)", args.size)
    if size is None:
        p.error(f"--size {args.size!r} is not HEIGHTxWIDTH, e.g. 480x832")
    height, width = map(int, size.groups())
    if height % 2 or width % 2:
        p.error(f"--size {args.size}: yuv420p needs an even height and width")
    frames = scene(args.frames, height, width)
    print(f"{args.frames} frames {height}x{width}, libx264 yuv420p CRF 18")
    print(f"{'preset':>10} {'seconds':>8} {'MB':>7} {'error':>6}")
    with tempfile.TemporaryDirectory() as folder:
        write_mp4(frames[:1], Path(folder) / "warm-up.mp4", 16)  # ffmpeg's first start, paid by no row
        for preset in args.presets:
            path = Path(folder) / f"{preset}.mp4"
            start = time.perf_counter()
            write_mp4(frames, path, 16, preset=preset)
            seconds = time.perf_counter() - start
            error = np.abs(read_mp4(path).frames.astype(np.int16) - frames).mean()
            print(f"{preset:>10} {seconds:8.2f} {path.stat().st_size / 1e6:7.2f} {error:6.2f}")


if __name__ == "__main__":
    run_main(main)
