"""HunyuanVideo-1.5's VAE attention block (the decoder's mid-block, on the whole latent frame): diffusers'
`HunyuanVideo15AttnBlock` (an `[S, S]` mask filled by a loop of S steps) against ours without the mask
(`dit.hunyuan.vae_chunks`), on the same random weights, float32, the published width (1024 channels), a
480p latent grid (30×53) and a few latent frames: seconds (the fastest of --iters, after a warm-up call), the
peak memory one call adds to a fresh process, and the difference. Each case runs in a process of its own,
with glibc's mmap threshold fixed at 64 KiB so the peak RSS follows the peak of live tensors.

    python bench/vae_attention.py                      # 2, 5 and 9 latent frames
    python bench/vae_attention.py --frames 3 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path
from queue import Empty

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least, max_rel  # noqa: E402
from bench.entry import run_main  # noqa: E402


def _case(impl: str, shape: tuple, iters: int, queue) -> None:
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    from dit.hunyuan.vae_chunks import streamed

    torch.manual_seed(0)
    block = HunyuanVideo15AttnBlock(shape[1]).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=shape[1] ** -0.5)
    if impl == "ours":
        vae = torch.nn.Module()  # a stand-in VAE whose decoder is the block
        vae.decoder = block
        streamed(vae)
    x = torch.randn(shape)
    with torch.no_grad():
        block(x[:, :, :1, :2])  # loads the kernels
        before, times = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, []
        for _ in range(iters):
            start = time.perf_counter()
            out = block(x)
            times.append(time.perf_counter() - start)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # KiB on Linux
    queue.put(dict(seconds=min(times), rss_mib=grown, out=out.numpy()))  # a tensor would go by a shared fd


def _result(queue, proc, what: str) -> dict:
    """The case's result, or SystemExit once its process ended without one (its error went to stderr):
    waiting on the queue alone hung for good."""
    while True:
        try:
            return queue.get(timeout=1)
        except Empty:
            if not proc.is_alive():
                raise SystemExit(
                    f"vae_attention.py: {what} failed (exit code {proc.exitcode}); see above"
                ) from None


def measure(args) -> list[dict]:
    ctx, rows = mp.get_context("spawn"), []
    for frames in args.frames:
        shape = (1, args.channels, frames, args.height, args.width)
        outs = {}
        for impl in ("diffusers", "ours"):
            queue = ctx.Queue()
            proc = ctx.Process(target=_case, args=(impl, shape, args.iters, queue))
            proc.start()
            got = _result(queue, proc, f"the {impl} case at {frames} latent frames")
            proc.join()
            outs[impl] = torch.from_numpy(got.pop("out"))
            rows.append(dict(impl=impl, frames=frames, positions=frames * args.height * args.width, **got))
        rows[-1]["max_rel"] = max_rel(outs["ours"], outs["diffusers"])
        rows[-1]["speedup"] = rows[-2]["seconds"] / rows[-1]["seconds"]
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| latent frames | positions S | block | s/call | speed-up | peak RSS added (MiB) | max rel |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        speedup, diff = (f"{r['speedup']:.1f}", f"{r['max_rel']:.1e}") if "speedup" in r else ("1.0", "—")
        out.append(f"| {r['frames']} | {r['positions']} | {r['impl']} | {r['seconds']:.2f} | {speedup} "
                   f"| {r['rss_mib']:.0f} | {diff} |")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=at_least(1), nargs="+", default=[2, 5, 9], help="latent frames")
    p.add_argument("--channels", type=at_least(1), default=1024, help="the mid-block width (published: 1024)")
    p.add_argument("--height", type=at_least(1), default=30, help="latent rows (480p: 30)")
    p.add_argument("--width", type=at_least(1), default=53, help="latent columns (848 wide: 53)")
    p.add_argument("--iters", type=at_least(1), default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by the children's glibc at start
    rows = measure(args)
    if args.json:
        print(json.dumps(dict(config=vars(args), rows=rows), indent=2))
        return
    grid = f"{args.channels} channels, a {args.height}×{args.width} latent grid"
    print(f"HunyuanVideo-1.5 VAE attention block, {grid}")
    print(markdown(rows))


if __name__ == "__main__":
    run_main(main)
