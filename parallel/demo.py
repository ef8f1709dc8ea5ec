"""Ulysses attention across N CPU processes vs one process: prints the parity of every comm mode.

python -m parallel.demo --nproc 4                  # spawns 4 gloo processes itself
torchrun --nproc-per-node 4 -m parallel.demo       # or under torchrun
"""

from __future__ import annotations

import argparse
import time

import torch

import parallel
from parallel.launch import spawn_local
from parallel.local_group import launched, world_size

MODES = ("alltoall", "fp8", "p2p", "p2p+fp8")


def run(args) -> None:
    torch.manual_seed(0)
    mesh = parallel.init_parallel()
    B, S, H, D, T = 1, args.seq, args.heads, args.head_dim, args.text
    q, k, v = (torch.randn(B, S, H, D) for _ in range(3))
    text = tuple(torch.randn(B, T, H, D) for _ in range(3))
    ref = parallel.local_attention(*(torch.cat(p, 1) for p in zip((q, k, v), text, strict=True)))
    ref_out, ref_text = ref.split([S, T], 1)
    shards = [parallel.shard_sequence(t, mesh) for t in (q, k, v)]
    info = shards[0][1]
    if mesh.rank == 0:
        ranks = f"{mesh.world_size} process{'' if mesh.world_size == 1 else 'es'}"
        print(f"Ulysses attention over {ranks} (gloo), B={B} S={S} (+{T} text) H={H} D={D}")
        print(f"{'comm':<10} {'ms':>8} {'max|Δ| image':>14} {'max|Δ| text':>13} {'‖Δ‖/‖ref‖':>11}")
    for comm in MODES:
        mesh.barrier()
        t0 = time.perf_counter()
        out, text_out = parallel.attention(*(s for s, _ in shards), mesh, info=info, text=text, comm=comm)
        ms = (time.perf_counter() - t0) * 1e3
        out = parallel.gather_sequence(out, mesh, info)
        d_img, d_txt = (out - ref_out).abs().max().item(), (text_out - ref_text).abs().max().item()
        rel = (torch.cat([out, text_out], 1) - ref).norm().item() / ref.norm().item()
        if mesh.rank == 0:
            print(f"{comm:<10} {ms:8.1f} {d_img:14.2e} {d_txt:13.2e} {rel:11.2e}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4, help="processes to spawn when not under torchrun")
    p.add_argument("--seq", type=int, default=1030, help="image tokens (need not divide by --nproc)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--text", type=int, default=16, help="joint text tokens")
    args = p.parse_args(argv)
    for flag in ("nproc", "seq", "heads", "head_dim", "text"):  # 0 tokens: a traceback from every rank
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be 1 or more, got {getattr(args, flag)}")
    world = world_size() or args.nproc
    if args.heads < world:  # the demo's layout is Ulysses over every rank
        p.error(f"--heads {args.heads} cannot split over {world} ranks (Ulysses: every rank needs a head)")
    if launched():
        return run(args)
    spawn_local(run, args.nproc, args)


if __name__ == "__main__":
    main()
