"""Overlapped Ulysses against the single exchange, one attention call on N gloo ranks (CPU).

    python bench/overlap.py [--worlds 2 4] [--heads 12 40] [--seq 2048] [--head-dim 64] [--chunks 2 4]

For each world size N and head count H: `parallel.attention` with joint text in each exact exchange mode
(alltoall, p2p), first as one exchange each way, then with the heads in C overlapped chunks (`+overlapC`: the
Q/K/V exchange of chunk c+1 and the output exchange of chunk c-1 run while chunk c attends). fp32; the time
is the median over --iters of the slowest rank, after a warm-up. gloo runs its collectives on threads of its
own, so the overlap can show, but the ranks and gloo's threads share this machine's cores: a CPU box has no
idle network engine, so read the ratio as a bound on what the chunking costs, not on what a GPU gains.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from bench.layouts import TEXT, _slowest_ms  # noqa: E402
from parallel import attention, init_parallel, overlapped, shard_sequence  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402


def _rank(args, out_path: str) -> None:
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_parallel(ulysses=world)
    results = []
    for heads in args.heads:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, args.seq, heads, args.head_dim, generator=g) for _ in range(3))
        text = tuple(torch.randn(1, TEXT, heads, args.head_dim, generator=g) for _ in range(3))
        (q, info), (k, _), (v, _) = (shard_sequence(t, mesh) for t in (q, k, v))
        for mode in ("alltoall", "p2p"):
            for chunks in (1, *(c for c in args.chunks if c <= heads // world)):
                comm = overlapped(mode, chunks)
                call = partial(attention, q, k, v, mesh, info=info, text=text, comm=comm)
                results.append(dict(heads=heads, mode=mode, chunks=chunks, ms=_slowest_ms(call, args.iters)))
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", type=at_least(2), nargs="+", default=[2, 4])
    p.add_argument("--heads", type=int, nargs="+", default=[12, 40], help="Wan2.1-1.3B: 12, Wan2.1-14B: 40")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunks", type=at_least(2), nargs="+", default=[2, 4])
    p.add_argument("--iters", type=at_least(1), default=5)
    args = p.parse_args()
    print(f"One attention call, S={args.seq} + {TEXT} text, D={args.head_dim}, fp32, gloo, "
          f"{os.cpu_count()} cores; median of {args.iters}, slowest rank")  # fmt: skip
    print("| ranks | heads | exchange | head chunks | ms | vs one exchange |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for world in args.worlds:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            spawn_local(_rank, world, args, f.name)
            rows = json.loads(Path(f.name).read_text())
        base = {(r["heads"], r["mode"]): r["ms"] for r in rows if r["chunks"] == 1}
        for r in rows:
            ratio = r["ms"] / base[r["heads"], r["mode"]]
            print(f"| {world} | {r['heads']} | {r['mode']} | {r['chunks']} | {r['ms']:.1f} | {ratio:.2f}× |")


if __name__ == "__main__":
    run_main(main)
