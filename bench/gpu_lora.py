"""The GPU kit's LoRA-per-request section: what switching a job's LoRA set costs at Wan2.1-1.3B's size
(bench/lora_switch.py's rows, on the device), and that a switch back leaves the base weights exact."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.gpu_kit import Kit, Report
from bench.lora_switch import switch_rows, write_lora


def lora_switch(kit: Kit, report: Report) -> None:
    from dit.lora_switch import LoraSwitch
    from dit.pipeline import PipelineConfig, load_pipeline

    rank = kit.pick(32, 4)
    with tempfile.TemporaryDirectory(dir=kit.tmp) as folder:
        config = PipelineConfig(
            model=kit.pick("wan2.1-1.3b", "tiny-random"), device=kit.device.type,
            dtype=kit.pick("bfloat16", "float32"), lora_dir=folder, preview_every=0,
        )  # fmt: skip
        pipe = load_pipeline(config)
        model = pipe.lora_catalogue.experts[0][0]
        for name, seed in (("a", 1), ("b", 2)):
            write_lora(Path(folder) / f"{name}.safetensors", model, rank, seed)
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        rows = switch_rows(pipe, iters=kit.pick(5, 1))
        switch = LoraSwitch(pipe.lora_catalogue, [model], keep=2)
        for loras in ((("a", 1.0),), (("b", 0.5),), ()):
            switch.apply(loras)
        drift = max((p - base[n]).abs().max().item() for n, p in model.named_parameters())
    report.check("largest weight difference after a → b → base (exact restore)", drift, 0.0)
    report.table(
        f"LoRA switch, {config.model} in {config.dtype}, rank {rank} on every block linear layer",
        ["what", "s / MB"],
        [[r["row"], f"{r['seconds']:.4f}" if "seconds" in r else f"{r['value']:.1f}"] for r in rows],
    )
    del pipe, model, base
    kit.free()
