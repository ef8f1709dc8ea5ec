"""Shared by the bench scripts: time ours vs diffusers (eager and compiled) and print the table / JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def add_run_args(p: argparse.ArgumentParser, dtypes, cuda: bool) -> None:
    """The options every DiT bench shares: precision, device, repetitions, compile, JSON."""
    p.add_argument("--dtype", choices=dtypes, default="bfloat16" if cuda else "float32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    p.add_argument("--json", action="store_true")


def timed(fn, warmup: int, iters: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Median seconds of `iters` calls after `warmup` ones (CUDA-synchronised), and the last output."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def compare(fns: dict, call, args, device: torch.device) -> tuple[list[dict], float]:
    """Time every fn (keys "diffusers" and "ours") in eager (and compiled with --compile) mode via
    `call(fn)`; rows with seconds and ratio to diffusers, and the eager outputs' relative difference."""
    rows, outs = [], {}
    with torch.inference_mode():
        for mode in ["eager", "compile"] if args.compile else ["eager"]:
            for name, fn in fns.items():
                run = torch.compile(fn) if mode == "compile" else fn
                warm = args.warmup + (2 if mode == "compile" else 0)
                sec, outs[name, mode] = timed(lambda run=run: call(run), warm, args.iters, device)
                rows.append(dict(model=name, mode=mode, seconds=sec))
    base = {r["mode"]: r["seconds"] for r in rows if r["model"] == "diffusers"}
    for r in rows:
        r["vs_diffusers"] = r["seconds"] / base[r["mode"]]
    want = outs["diffusers", "eager"].double()
    return rows, ((outs["ours", "eager"].double() - want).norm() / want.norm()).item()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def report(title: str, rows: list[dict], diff: float, args, **meta) -> None:
    print(title)
    print(f"{'model':10s} {'mode':8s} {'s/forward':>10s} {'vs diffusers':>13s}")
    for r in rows:
        print(f"{r['model']:10s} {r['mode']:8s} {r['seconds']:10.4f} {r['vs_diffusers']:12.3f}x")
    print(f"output rel. difference ours vs diffusers (eager): {diff:.2e}")
    if args.json:
        print(json.dumps(dict(vars(args), **meta, torch=torch.__version__, rel_diff=diff, rows=rows)))
