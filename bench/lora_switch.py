"""LoRA per request (dit/lora_switch.py): what a switch costs, and the drift of the alternative it avoids.

    python bench/lora_switch.py                                  # tiny-random, CPU, float32 and bfloat16
    python bench/lora_switch.py --model wan2.1-1.3b --device cuda --dtype bfloat16 --rank 32

Two random LoRAs of --rank on every linear layer of every block (self- and cross-attention q/k/v/o, the
FFN), written as files; the model's weights random. Switch rows (median of --iters, seconds): the first
switch in (reads the file, copies the touched weights' base values to host memory, merges); a switch in that
reads its file (another set was applied: restore + read + merge); a switch back to a cached set (restore +
merge); back to the base (restore). Drift rows: the alternative that unmerges by subtracting (W ← W + Δ, then
W − Δ, each rounded to the weight dtype; a round trip: a in and out, then b) after N round trips, against the
base: the weights' largest difference relative to each tensor's largest value, the share of elements changed,
and the latents of a small job; and this switch's own restore after as many (0 when exact).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least
from bench.entry import run_main  # noqa: E402
from dit import lora
from dit.fp8_linear import QUANTS
from dit.lora_switch import LoraSwitch
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import PRESETS

# original Wan module → (our parameter, slices of it along dim 0)
MODULES = {"self_attn.q": ("self_attn.qkv", 3), "self_attn.k": ("self_attn.qkv", 3),
           "self_attn.v": ("self_attn.qkv", 3), "self_attn.o": ("self_attn.out", 1),
           "cross_attn.q": ("cross_attn.q", 1), "cross_attn.k": ("cross_attn.kv", 2),
           "cross_attn.v": ("cross_attn.kv", 2), "cross_attn.o": ("cross_attn.out", 1),
           "ffn.0": ("ffn.0", 1), "ffn.2": ("ffn.2", 1)}  # fmt: skip
TINY_JOB = dict(num_frames=5, height=32, width=32, num_inference_steps=4)
REAL_JOB = dict(num_frames=9, height=256, width=256, num_inference_steps=4)


def weights(switcher: LoraSwitch) -> dict[str, torch.Tensor]:
    """The first expert's weights by name, its FP8 layers' as they were before quantising."""
    return {**dict(switcher.models[0].named_parameters()), **switcher.unquantised[0]}


def write_lora(path: Path, params: dict[str, torch.Tensor], rank: int, seed: int) -> None:
    """Factors sized so that Δ is about 1 % of a weight in `params` (a LoRA's usual scale), in bfloat16 as
    trainers save them."""
    g, state = torch.Generator().manual_seed(seed), {}
    blocks = sorted({int(name.split(".")[1]) for name in params if name.startswith("blocks.")})
    for i in blocks:
        for module, (ours, parts) in MODULES.items():
            weight = params[f"blocks.{i}.{ours}.weight"]
            out, fan_in = weight.shape[0] // parts, weight.shape[1]
            std = weight.float().std().item()
            state[f"diffusion_model.blocks.{i}.{module}.lora_down.weight"] = torch.randn(
                rank, fan_in, generator=g
            )
            up = torch.randn(out, rank, generator=g) * (0.01 * std / rank**0.5)  # Δ's std: 1 % of W's
            state[f"diffusion_model.blocks.{i}.{module}.lora_up.weight"] = up
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, path)


def switch_rows(switcher: LoraSwitch, iters: int) -> list[dict]:
    """Timed switches of two fresh switches over `switcher`'s catalogue, models and unquantised weights."""
    catalogue, models, unquantised = switcher.catalogue, switcher.models, switcher.unquantised
    reads, cached = (LoraSwitch(catalogue, models, keep, unquantised) for keep in (1, 2))
    a, b = (("a", 1.0),), (("b", 1.0),)

    def seconds(switch, loras) -> float:
        switch.apply(loras)
        return switch.last_switch_s

    first = seconds(reads, a)
    read = statistics.median(seconds(reads, s) for _ in range(iters) for s in (b, a))  # keep 1: each reads
    reads.apply(())
    cached.apply(a), cached.apply(b)
    back = statistics.median(seconds(cached, s) for _ in range(iters) for s in (a, b))
    restores = []
    for _ in range(iters):
        cached.apply(a)
        restores.append(seconds(cached, ()))
    base = statistics.median(restores)
    kept = sum(t.numel() * t.element_size() for t in (*cached.base[0].values(), *unquantised[0].values()))
    factors = sum(t.numel() * t.element_size() for t in lora.read(catalogue.plans(a)[0][0][0]).values())
    return [
        {"row": "first switch in (file read, base values copied, merge)", "seconds": first},
        {"row": "switch in reading the file (restore + read + merge)", "seconds": read},
        {"row": "switch back to a cached set (restore + merge)", "seconds": back},
        {"row": "back to the base (restore)", "seconds": base},
        {"row": "host memory: kept base values (MB)", "value": kept / 2**20},
        {"row": "host memory: one set's cached tensors (MB)", "value": factors / 2**20},
    ]


@torch.no_grad()
def drift_rows(pipe, round_trips: list[int], job: dict | None) -> list[dict]:
    """Subtract-to-unmerge after N round trips (a merged and subtracted, then b), against the base; then this
    switch's restore after as many. `job` None: the weights alone."""
    catalogue = pipe.lora_catalogue
    model = catalogue.experts[0][0]
    plans = [catalogue.plans(((name, 1.0),))[0][0] for name in ("a", "b")]
    steps = [s for merges in plans for s in (merges, [replace(m, strength=-m.strength) for m in merges])]
    names = set().union(*map(lora.touched, plans))
    params = dict(model.named_parameters())
    base = {name: params[name].clone() for name in names}
    req = None if job is None else GenerationRequest("a red fox", seed=1, **job)
    want = None if job is None else pipe.denoise(req)
    rows, done = [], 0
    for n in sorted(round_trips):
        for merges in steps * (n - done):
            lora.merge(model, merges)
        done = n
        rows.append(
            {"row": f"subtract to unmerge, {n} round trip(s)", **_drift(params, base, pipe, req, want)}
        )
    for name in names:
        params[name].copy_(base[name])
    switch = LoraSwitch(catalogue, [model], keep=1)
    for loras in [(("a", 1.0),), (("b", 1.0),)] * max(round_trips) + [()]:
        switch.apply(loras)
    rows.append(
        {"row": f"this switch, {max(round_trips)} round trip(s)", **_drift(params, base, pipe, req, want)}
    )
    return rows


def _drift(params: dict, base: dict, pipe, req, want) -> dict:
    weights = max(((params[n] - b).abs().max() / b.abs().max()).item() for n, b in base.items())
    changed = sum((params[n] != b).sum().item() for n, b in base.items()) / sum(
        b.numel() for b in base.values()
    )
    if req is None:
        return {"weights_rel": weights, "changed": changed, "latents_rel": float("nan")}
    got = pipe.denoise(req)
    return {
        "weights_rel": weights,
        "changed": changed,
        "latents_rel": ((got - want).abs().max() / want.abs().max()).item(),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-random", help="a Wan preset (random weights)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--rank", type=at_least(1), default=4)
    p.add_argument(
        "--quant", nargs="+", default=["none"], choices=QUANTS,
        help="fp8: switch rows only (a float8 weight has no subtract-to-unmerge to compare with)",
    )  # fmt: skip
    p.add_argument("--iters", type=at_least(1), default=5)
    p.add_argument("--round-trips", type=at_least(1), nargs="+", default=[1, 4])
    p.add_argument("--no-latents", action="store_true", help="drift of the weights alone (no job: a CPU run)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.model not in PRESETS and not Path(args.model).is_dir():  # a traceback once a pipeline loaded
        p.error(f"--model {args.model!r} is neither a folder nor one of {', '.join(PRESETS)}")
    job = None if args.no_latents else TINY_JOB if args.model.startswith("tiny") else REAL_JOB
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for dtype, quant in itertools.product(args.dtype, args.quant):
            config = PipelineConfig(model=args.model, device=args.device, dtype=dtype, quant=quant,
                                    lora_dir=folder, preview_every=0)  # fmt: skip
            pipe = load_pipeline(config)
            for name, seed in (("a", 1), ("b", 2)):
                write_lora(Path(folder) / f"{name}.safetensors", weights(pipe.lora_switcher), args.rank, seed)
            drift = drift_rows(pipe, args.round_trips, job) if quant == "none" else []
            switches = switch_rows(pipe.lora_switcher, args.iters)
            rows += [r | {"dtype": dtype, "quant": quant} for r in switches + drift]
            for f in Path(folder).iterdir():
                f.unlink()
    if args.json:
        print(json.dumps({"model": args.model, "device": args.device, "rank": args.rank, "rows": rows}))
        return
    print(
        f"LoRA switch: {args.model} on {args.device}, rank {args.rank} on every block linear layer, job {job}"
    )
    print("| dtype | quant | row | seconds / MB | weights rel | elements changed | latents rel |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        value = f"{r['seconds']:.4f}" if "seconds" in r else f"{r['value']:.2f}" if "value" in r else ""
        drift = (
            f"{r['weights_rel']:.1e} | {r['changed']:.2%} | {r['latents_rel']:.1e}"
            if "changed" in r
            else "| |"
        )
        print(f"| {r['dtype']} | {r['quant']} | {r['row']} | {value} | {drift} |")


if __name__ == "__main__":
    run_main(main)
