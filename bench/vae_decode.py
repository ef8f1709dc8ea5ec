"""Band-parallel VAE decode (`dit.vae_parallel`) on P CPU processes (gloo) against the VAE's own decode in
one process (Wan's: ours; HunyuanVideo-1.5's: diffusers' whole-video decode, then ours a latent frame at a
time), on the same weights: seconds per decode, the peak memory a decode adds per process, and the largest
difference from the first row's frames. All run the pipeline's decode (`dit.wan.vae.decode`,
`dit.hunyuan.vae.decode`: latents → uint8 frames on the leader).

    python bench/vae_decode.py                                  # tiny Wan VAE, 33 frames of 256×256
    python bench/vae_decode.py --family hunyuan --ranks 1 2 4 --json

One rank is the VAE's `decode` itself (a replica of one decodes as before). Every process gets --threads
threads (default cpu_count // P, at least one: the ranks share the cores one process would use). A warm-up
decode of a few latent pixels loads the kernels and opens the connections. Seconds: each decode's slowest rank
(the leader waits for every band), the fastest of --iters decodes (the box may be shared). Memory: how far the
first full decode raises the process's peak resident set (getrusage ru_maxrss) above what the VAE, the
latents and the warm-up took: the leader's (its band, then the gathered uint8 frames) and the largest of the
other ranks'. The ranks run with glibc's mmap threshold fixed at 64 KiB, so every freed tensor goes back to
the system and the peak RSS follows the peak of live tensors (with glibc's default dynamic threshold, tensors
under 32 MiB come from the heap and the figure measures the heap's fragmentation instead).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402

SEED = 0


def _build(args, whole: bool):
    """(VAE, latents, the family's decode); HunyuanVideo-1.5's VAE a latent frame at a time as the pipeline
    loads it, or diffusers' own (`whole`: every frame in one call)."""
    if args.family == "wan":
        from dit.wan.vae import decode, tiny_vae

        spatial = 8
    else:
        from dit.hunyuan.vae import decode, tiny_vae

        spatial = 16
    vae = tiny_vae(args.channels, seed=SEED)
    if args.family == "hunyuan" and not whole:
        from dit.hunyuan.vae_chunks import streamed

        vae = streamed(vae)
    shape = (1, args.channels, (args.frames - 1) // 4 + 1, args.height // spatial, args.width // spatial)
    return vae, torch.randn(shape, generator=torch.Generator().manual_seed(SEED)), decode


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rank(args, out: str, whole: bool) -> None:
    import torch.distributed as dist

    import parallel

    if args.threads:
        torch.set_num_threads(args.threads)
    mesh = parallel.init_parallel()
    vae, z, decode = _build(args, whole)
    decode(vae, z[..., : mesh.world_size, :2], mesh.replica_group)  # one latent row per rank
    before, times, grown = _peak_rss_mib(), [], []
    for _ in range(args.iters):
        mesh.barrier()
        start = time.perf_counter()
        frames = decode(vae, z, mesh.replica_group)
        times.append(time.perf_counter() - start)
        grown.append(_peak_rss_mib() - before)
    stats = dict(times=times, rss_mib=grown[0], threads=torch.get_num_threads())
    every = [stats]
    if mesh.control_group is not None:
        every = [None] * mesh.world_size
        dist.all_gather_object(every, stats, group=mesh.control_group)
    if mesh.rank == 0:
        torch.save(dict(ranks=every, frames=torch.from_numpy(frames)), out)


def measure(args) -> list[dict]:
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(ranks, False) for ranks in args.ranks]
        for ranks, whole in [(1, True)] * (args.family == "hunyuan") + runs:  # diffusers' decode first
            out = str(Path(tmp) / f"{ranks}{whole}.pt")
            spawn_local(_rank, ranks, args, out, whole)
            got = torch.load(out)
            reference = got["frames"] if reference is None else reference
            others = [r["rss_mib"] for r in got["ranks"][1:]]
            rows.append(
                dict(
                    ranks=ranks,
                    decode="diffusers' (whole video)" if whole else "one process" if ranks == 1 else "banded",
                    threads=got["ranks"][0]["threads"],
                    seconds=min(map(max, zip(*(r["times"] for r in got["ranks"]), strict=True))),
                    leader_rss_mib=got["ranks"][0]["rss_mib"],
                    other_rss_mib=max(others) if others else None,
                    max_level_diff=(got["frames"].int() - reference.int()).abs().max().item(),
                )
            )
    for row in rows:
        row["speedup"] = rows[0]["seconds"] / row["seconds"]
    return rows


def markdown(rows: list[dict]) -> str:
    out = [  # row 1: --ranks' first, or diffusers' decode
        "| ranks | decode | threads/rank | s/decode | speed-up vs row 1 | peak RSS added: leader (MiB) "
        "| other ranks (MiB) | frames vs row 1 (max level diff) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        other = "—" if r["other_rss_mib"] is None else f"{r['other_rss_mib']:.0f}"
        out.append(
            f"| {r['ranks']} | {r['decode']} | {r['threads']} | {r['seconds']:.2f} | {r['speedup']:.2f} "
            f"| {r['leader_rss_mib']:.0f} | {other} | {r['max_level_diff']} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["wan", "hunyuan"], default="wan")
    p.add_argument("--channels", type=int, help="latent channels (default: wan 16, hunyuan 8, its widest)")
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument(
        "--ranks", type=at_least(1), nargs="+", default=[1, 2, 4], help="the first is the reference"
    )
    p.add_argument("--threads", type=at_least(1), help="per process (default: cpu_count // ranks)")
    p.add_argument("--iters", type=at_least(1), default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.channels = args.channels or {"wan": 16, "hunyuan": 8}[args.family]
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by the ranks' glibc at start
    rows = measure(args)
    if args.json:
        print(json.dumps(dict(config=vars(args), rows=rows), indent=2))
        return
    print(f"{args.family} tiny VAE, {args.frames} frames {args.height}×{args.width}, CPU (gloo)")
    print(markdown(rows))


if __name__ == "__main__":
    run_main(main)
