"""The GPU kit's LoRA-per-request section: what switching a job's LoRA set costs at Wan2.1-1.3B's and
Wan2.1-14B's sizes (bench/lora_switch.py's rows, on the device), and that a switch back leaves the base
weights exact. The 1.3B goes through a served pipeline, in bf16 and with `--quant fp8`; the 14B is its
transformer alone (the switch touches nothing else), with one timed switch per row."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.gpu_kit import Kit, Report, drawn_on_device
from bench.lora_switch import switch_rows, weights, write_lora


def lora_switch(kit: Kit, report: Report) -> None:
    rank = kit.pick(32, 4)
    for quant in ("none", "fp8"):  # FP8: each switch also quantises the merged weights (dit.lora_switch)
        _served(kit, report, rank, quant)
    big = kit.pick("wan2.1-14b", "tiny-random")
    with tempfile.TemporaryDirectory(dir=kit.tmp) as folder:
        switcher = _bare_switcher(kit, big, Path(folder), rank)
        _table(report, big, kit.pick("bfloat16", "float32"), "none", rank, switch_rows(switcher, iters=1))
        del switcher
        kit.free()


def _served(kit: Kit, report: Report, rank: int, quant: str) -> None:
    """The 1.3B through a served pipeline: the switch rows, and a → b → base leaving the weights exact."""
    from dit.lora_switch import LoraSwitch
    from dit.pipeline import PipelineConfig, load_pipeline

    with tempfile.TemporaryDirectory(dir=kit.tmp) as folder:
        config = PipelineConfig(
            model=kit.pick("wan2.1-1.3b", "tiny-random"), device=kit.device.type,
            dtype=kit.pick("bfloat16", "float32"), quant=quant, lora_dir=folder, preview_every=0,
        )  # fmt: skip
        with drawn_on_device():
            pipe = load_pipeline(config)
        switcher = pipe.lora_switcher
        for name, seed in (("a", 1), ("b", 2)):
            write_lora(Path(folder) / f"{name}.safetensors", weights(switcher), rank, seed)
        model = switcher.models[0]
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        rows = switch_rows(switcher, iters=kit.pick(5, 1))
        _table(report, config.model, config.dtype, quant, rank, rows)
        switch = LoraSwitch(switcher.catalogue, [model], 2, switcher.unquantised)
        for loras in ((("a", 1.0),), (("b", 0.5),), ()):
            switch.apply(loras)
        drift = max((p.float() - base[n].float()).abs().max().item() for n, p in model.named_parameters())
        report.check(f"largest weight difference after a → b → base (exact restore), {quant}", drift, 0.0)
        del pipe, switcher, model, base, switch
        kit.free()


def _bare_switcher(kit: Kit, preset: str, folder: Path, rank: int):
    """A switch of two LoRAs over the preset's transformer alone (random weights, on the kit's device)."""
    from dit.loading import load_transformer, lora_resolver
    from dit.lora_catalogue import LoraCatalogue
    from dit.lora_switch import LoraSwitch

    with drawn_on_device():
        model = load_transformer(preset, dtype=kit.dtype, device=kit.device)
    for name, seed in (("a", 1), ("b", 2)):
        write_lora(folder / f"{name}.safetensors", dict(model.named_parameters()), rank, seed)
    return LoraSwitch(LoraCatalogue(folder, [(model, lora_resolver(preset))]), [model], keep=1)


def _table(report: Report, model: str, dtype: str, quant: str, rank: int, rows: list[dict]) -> None:
    report.table(
        f"LoRA switch, {model} in {dtype}, --quant {quant}, rank {rank} on every block linear layer",
        ["what", "s / MB"],
        [[r["row"], f"{r['seconds']:.4f}" if "seconds" in r else f"{r['value']:.1f}"] for r in rows],
    )
