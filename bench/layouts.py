"""Uneven Ulysses against what an operator could run before it, one attention call on N gloo ranks (CPU).

    python bench/layouts.py [--worlds 3 5 6 7] [--heads 12 40] [--seq 1024] [--head-dim 64] [--iters 5]

For each world size N, the first of --heads that N does not divide (12: Wan2.1-1.3B, 40: Wan2.1-14B) is H:
Ulysses N over H heads (ranks own ⌈H/N⌉ or ⌊H/N⌋), the
balanced case (Ulysses N over N·⌈H/N⌉ heads: the same heads on the busiest rank, none idle), the ring over N,
and every hybrid Ulysses u × ring N/u with u dividing H. One call of `parallel.attention` with joint text
(fp32, alltoall); the time is the median over --iters of the slowest rank, after a warm-up. Every process of
every world shares this machine's cores, so compare rows within one world size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from parallel import attention, init_parallel, shard_sequence  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402
from parallel.ulysses import head_splits  # noqa: E402

TEXT = 64  # joint text tokens, as a HunyuanVideo-style model brings


def layouts(world: int, heads: int) -> list[tuple[str, int, int, int]]:
    """(name, ulysses, ring, heads) rows for one world size."""
    balanced = world * -(-heads // world)
    rows = [
        (f"Ulysses {world}, uneven", world, 1, heads),
        (f"Ulysses {world}, balanced ({balanced} heads)", world, 1, balanced),
        (f"ring {world}", 1, world, heads),
    ]
    rows += [(f"Ulysses {u} × ring {world // u}", u, world // u, heads) for u in range(2, world)
             if world % u == 0 and heads % u == 0]  # fmt: skip
    return rows


def uneven_heads(world: int, heads: list[int]) -> int:
    return next(h for h in heads if h % world)


def _slowest_ms(call, iters: int) -> float:
    """Median over `iters` of the slowest rank's seconds for call(), in ms, after a warm-up."""
    call()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        slowest = torch.tensor(time.perf_counter() - t0)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(slowest.item())
    return statistics.median(times) * 1e3


def _rank(args, out_path: str) -> None:
    results = []
    world = int(os.environ["WORLD_SIZE"])
    for name, u, r, heads in layouts(world, uneven_heads(world, args.heads)):
        mesh = init_parallel(ulysses=u, ring=r)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, args.seq, heads, args.head_dim, generator=g) for _ in range(3))
        text = tuple(torch.randn(1, TEXT, heads, args.head_dim, generator=g) for _ in range(3))
        (q, info), (k, _), (v, _) = (shard_sequence(t, mesh) for t in (q, k, v))
        ms = _slowest_ms(partial(attention, q, k, v, mesh, info=info, text=text), args.iters)
        results.append(dict(layout=name, busiest_heads=max(head_splits(heads, u)), ms=ms))
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", type=at_least(2), nargs="+", default=[3, 5, 6, 7])
    p.add_argument("--heads", type=at_least(1), nargs="+", default=[12, 40], help="candidate head counts")
    p.add_argument("--seq", type=at_least(1), default=1024)
    p.add_argument("--head-dim", type=at_least(1), default=64)
    p.add_argument("--iters", type=at_least(1), default=5)
    args = p.parse_args(argv)
    for world in args.worlds:  # the bench times uneven splits: a world that divides every head count has none
        if all(heads % world == 0 for heads in args.heads):
            p.error(f"--worlds {world} divides every --heads ({' '.join(map(str, args.heads))}): give a head "
                    "count it does not divide")  # fmt: skip
    print(f"One attention call, S={args.seq} + {TEXT} text, D={args.head_dim}, fp32, gloo on "
          f"{torch.get_num_threads()} threads' machine; median of {args.iters}, slowest rank")  # fmt: skip
    print("| ranks | heads | layout | busiest rank's heads | ms | vs uneven Ulysses |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for world in args.worlds:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            spawn_local(_rank, world, args, f.name)
            rows = json.loads(Path(f.name).read_text())
        base = rows[0]["ms"]
        for row in rows:
            cells = f"{row['busiest_heads']} | {row['ms']:.1f} | {row['ms'] / base:.2f}×"
            print(f"| {world} | {uneven_heads(world, args.heads)} | {row['layout']} | {cells} |")


if __name__ == "__main__":
    run_main(main)
