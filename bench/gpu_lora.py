"""The GPU kit's LoRA-per-request section: what switching a job's LoRA set costs at Wan2.1-1.3B's and
Wan2.1-14B's sizes (bench/lora_switch.py's rows, on the device), and that a switch back leaves the base
weights exact. The 1.3B goes through a served pipeline; the 14B is its transformer alone (the switch
touches nothing else), with one timed switch per row."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.gpu_kit import Kit, Report, drawn_on_device
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
        with drawn_on_device():
            pipe = load_pipeline(config)
        model = pipe.lora_catalogue.experts[0][0]
        for name, seed in (("a", 1), ("b", 2)):
            write_lora(Path(folder) / f"{name}.safetensors", model, rank, seed)
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        _table(
            report, config.model, config.dtype, rank, switch_rows(pipe.lora_catalogue, iters=kit.pick(5, 1))
        )
        switch = LoraSwitch(pipe.lora_catalogue, [model], keep=2)
        for loras in ((("a", 1.0),), (("b", 0.5),), ()):
            switch.apply(loras)
        drift = max((p - base[n]).abs().max().item() for n, p in model.named_parameters())
        report.check("largest weight difference after a → b → base (exact restore)", drift, 0.0)
        del pipe, model, base, switch
        kit.free()
    big = kit.pick("wan2.1-14b", "tiny-random")
    with tempfile.TemporaryDirectory(dir=kit.tmp) as folder:
        catalogue = _bare_catalogue(kit, big, Path(folder), rank)
        _table(report, big, config.dtype, rank, switch_rows(catalogue, iters=1))
        del catalogue
        kit.free()


def _bare_catalogue(kit: Kit, preset: str, folder: Path, rank: int):
    """A catalogue of two LoRAs over the preset's transformer alone (random weights, on the kit's device)."""
    from dit.loading import load_transformer, lora_resolver
    from dit.lora_catalogue import LoraCatalogue

    with drawn_on_device():
        model = load_transformer(preset, dtype=kit.dtype, device=kit.device)
    for name, seed in (("a", 1), ("b", 2)):
        write_lora(folder / f"{name}.safetensors", model, rank, seed)
    return LoraCatalogue(folder, [(model, lora_resolver(preset))])


def _table(report: Report, model: str, dtype: str, rank: int, rows: list[dict]) -> None:
    report.table(
        f"LoRA switch, {model} in {dtype}, rank {rank} on every block linear layer",
        ["what", "s / MB"],
        [[r["row"], f"{r['seconds']:.4f}" if "seconds" in r else f"{r['value']:.1f}"] for r in rows],
    )
