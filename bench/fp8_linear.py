"""FP8 linear layers at the Wan DiT's shapes: bf16 vs torch._scaled_mm (row-wise scales) vs torchao's float8.

    python bench/fp8_linear.py [--model 14b|1.3b] [--tokens 32760] [--iters 20] [--cpu-smoke]

The measurement issue 27 asks for before choosing how `--quant fp8` computes: for each of the model's large
linear shapes (attention Q/K/V/O, FFN up and down), the median time of

- `bf16`: `F.linear` in bfloat16 (cuBLAS), the baseline;
- `scaled_mm`: weights float8_e4m3 with one scale per output channel (quantised once, outside the timing),
  the activation quantised per token at run time, then `torch._scaled_mm` to bf16 — the GEMM alone, and with
  the activation's quantisation (eager, and compiled into one graph);
- `torchao`: `quantize_(Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))` on an nn.Linear,
  eager and compiled, where torchao imports (it travels to the GPU machine as a wheel);

with TFLOP/s (2·M·N·K per call) and each output's error ‖y − y_ref‖/‖y_ref‖ against the float32 product of the
same bf16 inputs. `--cpu-smoke` runs toy sizes on the CPU (proves the code runs; not a speed figure).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import at_least, rel_diff, timed  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.fp8_linear import quantise_rows  # noqa: E402

# (name, in features, out features) of the Wan2.1 DiT's large linear layers, per model size
SHAPES = {
    "14b": [("q/k/v/o", 5120, 5120), ("ffn up", 5120, 13824), ("ffn down", 13824, 5120)],
    "1.3b": [("q/k/v/o", 1536, 1536), ("ffn up", 1536, 8960), ("ffn down", 8960, 1536)],
}


def scaled_mm_linear(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    x8, x_scale = quantise_rows(x)
    return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=x.dtype)


def torchao_linear(weight: torch.Tensor, compile_it: bool):
    """An nn.Linear holding `weight`, quantised by torchao's float8 (dynamic per-token activation, per-row
    weight), or None when torchao is missing or refuses."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except ImportError as e:
        return None, f"torchao not importable: {e}"
    lin = torch.nn.Linear(
        weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype
    )
    lin.weight.data.copy_(weight)
    try:
        quantize_(lin, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
    except Exception as e:  # noqa: BLE001 - a refusal is a row of the table, not a crash of the bench
        return None, f"torchao refused: {type(e).__name__}: {e}"
    return (torch.compile(lin) if compile_it else lin), ""


def rows_for(
    name: str, k: int, n: int, m: int, device: torch.device, iters: int, others: bool = True
) -> list[dict]:
    """The variants' rows at one shape; `others` False: `_scaled_mm`'s alone (no compile, no torchao)."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(torch.bfloat16)
    ref = x.float() @ w.float().t()
    w8, w_scale = quantise_rows(w)
    x8, x_scale = quantise_rows(x)
    flops = 2 * m * n * k
    variants = {
        "bf16": lambda: F.linear(x, w),
        "scaled_mm GEMM alone": lambda: torch._scaled_mm(
            x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16
        ),
        # Hopper's FP8 MMA without the periodic fp32 promotion: faster, less exact (torchao's default)
        "scaled_mm GEMM alone, fast accumulation": lambda: torch._scaled_mm(
            x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16, use_fast_accum=True
        ),
        "scaled_mm + quantise, eager": lambda: scaled_mm_linear(x, w8, w_scale),
    }
    if device.type == "cuda":  # what an FP8 layer runs outside torch.compile (dit.fp8_linear)
        from dit.fp8_linear import Fp8Linear

        layer = Fp8Linear(torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16))
        layer.weight.data, layer.weight_scale.data = w8, w_scale
        variants["Fp8Linear, eager (Triton quantise)"] = lambda: layer(x)
    notes = {}
    if others:
        compiled = torch.compile(scaled_mm_linear)
        variants["scaled_mm + quantise, compiled"] = lambda: compiled(x, w8, w_scale)
        for mode, compile_it in (("eager", False), ("compiled", True)):
            lin, why = torchao_linear(w, compile_it)
            key = f"torchao {mode}"
            if lin is None:
                notes[key] = why
            else:
                variants[key] = lambda lin=lin: lin(x)
    rows = []
    with torch.inference_mode():
        for variant, fn in variants.items():
            try:
                sec, out = timed(fn, warmup=3, iters=iters, device=device)
            except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape is reported
                rows.append(dict(shape=name, variant=variant, note=f"{type(e).__name__}: {e}"[:120]))
                continue
            rows.append(
                dict(
                    shape=name,
                    variant=variant,
                    ms=sec * 1e3,
                    tflops=flops / sec / 1e12,
                    error=rel_diff(out, ref),
                )
            )
    rows += [dict(shape=name, variant=v, note=why) for v, why in notes.items()]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SHAPES), default="14b")
    p.add_argument("--tokens", type=int, default=32760, help="M: tokens per forward (Wan 480p/81 frames)")
    p.add_argument("--iters", type=at_least(1), default=20)
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU")
    args = p.parse_args()
    if args.cpu_smoke:
        device, m, shapes = (
            torch.device("cpu"),
            64,
            [(nm, k // 64, n // 64) for nm, k, n in SHAPES[args.model]],
        )
    elif torch.cuda.is_available():
        device, m, shapes = torch.device("cuda"), args.tokens, SHAPES[args.model]
    else:
        p.error("needs CUDA (or --cpu-smoke)")
    print(f"FP8 linear, Wan2.1-{args.model} shapes, M={m} tokens, {device}, torch {torch.__version__}")
    print(f"{'shape':10s} {'variant':40s} {'ms':>8s} {'TFLOP/s':>8s} {'vs bf16':>8s} {'rel. error':>10s}")
    for name, k, n in shapes:
        rows = rows_for(name, k, n, m, device, 1 if args.cpu_smoke else args.iters)
        base = next((r["ms"] for r in rows if r["variant"] == "bf16" and "ms" in r), None)
        for r in rows:
            if "ms" not in r:
                print(f"{r['shape']:10s} {r['variant']:40s} {r['note']}")
                continue
            ratio = f"{r['ms'] / base:7.3f}x" if base else "–"
            print(
                f"{r['shape']:10s} {r['variant']:40s} {r['ms']:8.3f} {r['tflops']:8.1f} {ratio:>8s} "
                f"{r['error']:10.2e}"
            )


if __name__ == "__main__":
    run_main(main)
