"""Shared by the bench scripts: time ours vs diffusers (eager and compiled) and print the table / JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def at_least(minimum: int | float, kind=int):
    """An argparse type: a number of `kind` of at least `minimum` (a count of 0 made a median of nothing)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not value >= minimum:  # nan too
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def add_run_args(p: argparse.ArgumentParser, dtypes, cuda: bool) -> None:
    """The options every DiT bench shares: precision, device, repetitions, compile, JSON."""
    p.add_argument("--dtype", choices=dtypes, default="bfloat16" if cuda else "float32")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--warmup", type=at_least(0), default=1)
    p.add_argument("--iters", type=at_least(1), default=3)
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    p.add_argument("--json", action="store_true")


def check_preset(p: argparse.ArgumentParser, preset: str, presets) -> None:
    """`p.error` for a --preset that is neither `small` nor one of `presets` (a KeyError's traceback)."""
    if preset != "small" and preset not in presets:
        p.error(f"--preset {preset!r} is not small or one of {', '.join(presets)}")


def check_video_size(p: argparse.ArgumentParser, args, multiple: int = 16) -> None:
    """`p.error` for a video size the model does not take: --frames other than 4k+1 (the VAE's time stride)
    or a side not a multiple of `multiple` (the VAE's space stride × the patch's). The latents were floored to
    the nearest that fit while the table named the size asked."""
    if args.frames < 1 or (args.frames - 1) % 4:
        p.error(f"--frames {args.frames}: the VAE takes 4k+1 frames (1, 5, 9, ...)")
    for side in ("height", "width"):
        if (value := getattr(args, side)) < multiple or value % multiple:
            p.error(f"--{side} {value}: a multiple of {multiple}, at least {multiple}")


def check_run(p: argparse.ArgumentParser, args, build, models: int = 2) -> None:
    """`p.error` (one line, exit 2) for a --device this machine lacks, or for `models` copies of the model
    `build()` makes (called on the meta device: no memory) in --dtype that would not fit the device's free
    memory (a 14B preset on a CPU box took all its memory until the kernel killed it)."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here (torch {torch.__version__}); use --device cpu")
    with torch.device("meta"):
        params = sum(t.numel() for t in build().parameters())
    need = models * params * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _available_host_memory()
    if free is not None and need > free:
        p.error(
            f"{models} models of {params / 1e9:.2f} B parameters in {args.dtype} need {need / 2**30:.1f} GiB "
            f"for their weights alone; {device} has {free / 2**30:.1f} GiB free (try --layers or a smaller "
            "--preset)"
        )


def _available_host_memory() -> int | None:
    """Linux's MemAvailable in bytes, None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def timed(fn, warmup: int, iters: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Median seconds of `iters` calls after `warmup` ones, and the last output. On CUDA each call is timed
    with CUDA events (device time, no host sync inside the timed region)."""
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def time_modes(fn, call, modes, warmup: int, iters: int, device: torch.device, compile=torch.compile) -> dict:
    """mode ("eager" / "compile") → (median seconds, output) of `call(fn)`; `compile(fn)` gives the compiled
    callable (it may compile in place, so eager runs first); compiled runs warm up 2 more times."""
    out = {}
    for mode in modes:
        run = compile(fn) if mode == "compile" else fn
        warm = warmup + (2 if mode == "compile" else 0)
        out[mode] = timed(lambda run=run: call(run), warm, iters, device)
    return out


def compare(fns: dict, call, args, device: torch.device) -> tuple[list[dict], float]:
    """Time every fn (keys "diffusers" and "ours") in eager (and compiled with --compile) mode via
    `call(fn)`; rows with seconds and ratio to diffusers, and the eager outputs' relative difference."""
    modes = ["eager", "compile"] if args.compile else ["eager"]
    with torch.inference_mode():
        runs = {n: time_modes(fn, call, modes, args.warmup, args.iters, device) for n, fn in fns.items()}
    rows = [dict(model=name, mode=mode, seconds=runs[name][mode][0]) for mode in modes for name in fns]
    for r in rows:
        r["vs_diffusers"] = r["seconds"] / runs["diffusers"][r["mode"]][0]
    return rows, rel_diff(runs["ours"]["eager"][1], runs["diffusers"]["eager"][1])


def rel_diff(out: torch.Tensor, want: torch.Tensor) -> float:
    """‖out − want‖ / ‖want‖ in float64 (on the CPU: any device, any dtype)."""
    out, want = out.detach().cpu().double(), want.detach().cpu().double()
    return ((out - want).norm() / want.norm()).item()


def max_rel(out: torch.Tensor, want: torch.Tensor) -> float:
    """max |out − want| / max |want| in float32: the largest error against the largest value."""
    out, want = out.float(), want.float()
    return ((out - want).abs().max() / want.abs().max()).item()


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
