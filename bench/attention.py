"""Per-rank cost of one Ulysses attention call, split into pack, quantise, communicate and attention.

CPU (default): spawns P gloo processes and times the real exchange at small shapes.
    python bench/attention.py --seq 4096 --heads 16 --head-dim 64 --nproc 4 --comm fp8
GPU (CUDA present): emulates one rank's share on the single GPU at Wan-14B shapes (S=32760, H=40, D=128, P=8):
pack and quantise that rank's QKV shard, attention over the full sequence for H/P heads (no communication).
    python bench/attention.py --gpu
Phases: pack = QKV permute into the send buffer + unpack + output pack/unpack; quantise = FP8 pack + unpack
(both directions); communicate = the all-to-alls (or P2P rounds) on the wire bytes; attention = local kernel.
Prints a table (median ms over --iters; the slowest rank for each phase), or JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least, timed  # noqa: E402
from bench.entry import run_main  # noqa: E402
from parallel import comm as C  # noqa: E402
from parallel import fp8, init_parallel, local_attention  # noqa: E402
from parallel.launch import spawn_local  # noqa: E402
from parallel.ulysses import pack_out, pack_qkv, unpack_out, unpack_qkv  # noqa: E402


def _time(fn, iters: int, device) -> tuple[float, object]:
    """Median milliseconds of fn() (after one warm-up) and its last result."""
    sec, out = timed(fn, 1, iters, device)
    return sec * 1e3, out


def measure(S, H, D, P, comm, iters, device, dtype, group=None) -> dict:
    """One rank's phases. group=None: single-device emulation of a rank's share (no communication)."""
    cfg = C.comm_config(comm)
    L = S // P
    q, k, v = (torch.randn(1, L, H, D, device=device, dtype=dtype) for _ in range(3))
    ms = {}

    def leg(x, use_fp8: bool):
        """Quantise (if FP8), send over the group (if any), dequantise: the wire part of one all-to-all."""
        wire = x
        if use_fp8:
            t, wire = _time(lambda: fp8.pack(x, cfg.compiled), iters, device)
            ms["quantise"] = ms.get("quantise", 0.0) + t
        if group is not None:
            t, wire = _time(lambda: C.all_to_all(wire, group, cfg.kind), iters, device)
            ms["communicate"] = ms.get("communicate", 0.0) + t
        if not use_fp8:
            return wire
        t, y = _time(lambda: fp8.unpack(wire, x.shape, dtype), iters, device)
        ms["quantise"] += t
        return y

    ms["pack"], send = _time(lambda: pack_qkv(q, k, v, P), iters, device)
    recv = leg(send, cfg.fp8_in or group is None)  # the single-device emulation always reports the quantiser
    t, (qh, kh, vh) = _time(lambda: unpack_qkv(recv), iters, device)
    ms["pack"] += t
    ms["attention"], out = _time(lambda: local_attention(qh, kh, vh), iters, device)
    t, send_out = _time(lambda: pack_out(out, P), iters, device)
    ms["pack"] += t
    back = leg(send_out, cfg.fp8_out)
    ms["pack"] += _time(lambda: unpack_out(back), iters, device)[0]
    flops = 4 * S * S * D * (H // P)
    return {"ms": ms, "attention_tflops": flops / ms["attention"] / 1e9}


def _rank(args) -> None:
    mesh = init_parallel()
    world, rank = mesh.world_size, mesh.rank
    torch.manual_seed(rank)
    res = measure(
        args.seq,
        args.heads,
        args.head_dim,
        world,
        args.comm,
        args.iters,
        mesh.device,
        torch.float32,
        mesh.ulysses_group,
    )
    slowest = torch.tensor(list(res["ms"].values()))
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        res["ms"] = dict(zip(res["ms"], slowest.tolist(), strict=True))
        report(res, args, f"CPU, {world} gloo processes, fp32, torch {torch.__version__}")


def report(res: dict, args, where: str) -> None:
    meta = dict(S=args.seq, H=args.heads, D=args.head_dim, P=args.nproc, comm=args.comm, device=where)
    if args.json:
        print(json.dumps({**meta, **res}))
        return
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    print(f"{'phase':<16} {'ms':>10}")
    for phase, ms in res["ms"].items():
        print(f"{phase:<16} {ms:10.3f}")
    print(f"{'total':<16} {sum(res['ms'].values()):10.3f}")
    print(f"attention core: {res['attention_tflops']:.2f} TFLOP/s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=at_least(1), default=2048)
    p.add_argument("--heads", type=at_least(1), default=8)
    p.add_argument("--head-dim", type=at_least(1), default=64)
    p.add_argument("--nproc", type=at_least(1), default=4, help="P: ranks (CPU) or the share emulated (GPU)")
    p.add_argument("--comm", default="alltoall", choices=list(C.COMM_MODES))
    p.add_argument("--iters", type=at_least(1), default=5)
    p.add_argument("--gpu", action="store_true", help="Wan-14B shapes on one GPU: S=32760 H=40 D=128 P=8")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.gpu:
        if not torch.cuda.is_available():
            p.error("--gpu needs CUDA")
        args.seq, args.heads, args.head_dim, args.nproc, args.iters = 32760, 40, 128, 8, max(args.iters, 20)
        res = measure(
            args.seq,
            args.heads,
            args.head_dim,
            args.nproc,
            args.comm,
            args.iters,
            torch.device("cuda"),
            torch.bfloat16,
        )
        return report(
            res, args, f"{torch.cuda.get_device_name()}, one rank's share, bf16, torch {torch.__version__}"
        )
    if args.seq % args.nproc or args.heads % args.nproc:
        p.error(f"--seq {args.seq} and --heads {args.heads} must divide by --nproc {args.nproc}")
    spawn_local(_rank, args.nproc, args)


if __name__ == "__main__":
    run_main(main)
