"""MODELLED 8-GPU step times for Wan2.1-14B at 480p/81 frames: one rank's measured compute plus the bytes each
collective moves over a stated link bandwidth. Nothing here runs on 8 GPUs; it is arithmetic on figures the
kit measured on one, through the model `ithaca plan` uses (parallel/plan.py: the message bytes of each layout,
checked against `parallel.count_comm` in tests/test_bench_gpu.py, and the step time).

Assumptions, stated in the report: compute splits perfectly over the sp ranks (linear layers by tokens,
attention by heads); no overlap of communication with compute; every byte crosses a link at the nominal
per-direction bandwidth below.
"""

from __future__ import annotations

from dataclasses import replace

from bench.gpu_kit import Kit, Report, Skip
from parallel.plan import Layout, Links, Shape, estimate, messages

LINKS = {"NVLink 4 (450 GB/s per direction)": 450e9, "PCIe 5 x16 (64 GB/s per direction)": 64e9}
LIGHTX2V = {"cfg": 0.75, "no_cfg": 0.39}  # published 8×H100 s/step, Wan2.1-14B 480p 81 frames

LAYOUTS = (
    Layout("Ulysses 8", 8),
    Layout("CFG 2 × Ulysses 4", 4, cfg=2),
    Layout("ring 2 × Ulysses 4", 4, ring=2),
)

__all__ = ["LAYOUTS", "Layout", "messages", "modelled"]


def modelled(kit: Kit, report: Report) -> None:
    fig = kit.figures.get("wan2.1-14b")
    if fig is None:
        raise Skip("needs the wan-14b section's measured forward (run it in the same call)")
    from dit.presets import PRESETS

    S = fig["tokens"]
    latent = 1
    for n in fig["latent"]:
        latent *= n
    shape = Shape(
        "wan2.1-14b", fig["heads"], fig["head_dim"], fig["layers"], PRESETS["wan2.1-14b"]["ffn_dim"], S,
        latent, guided=True,
    )  # fmt: skip
    rows = []
    for layout in LAYOUTS:
        for comm in ("alltoall", "fp8"):
            if comm == "fp8" and layout.ulysses == 1:
                continue
            for link, bw in LINKS.items():
                links = Links(bw, bw)
                guided = estimate(layout, shape, fig["seconds"], links, fp8=comm == "fp8")
                plain = estimate(
                    layout, replace(shape, guided=False), fig["seconds"], links, fp8=comm == "fp8"
                )
                rows.append(
                    [
                        layout.name,
                        comm,
                        link,
                        f"{guided.compute_s:.3f}",
                        f"{guided.bytes_per_forward / 1e9:.2f}",
                        f"{guided.comm_s:.3f}",
                        f"{guided.step_s:.3f}",
                        "n/a (CFG parallel needs guidance)"
                        if plain.step_s is None
                        else f"{plain.step_s:.3f}",
                    ]
                )
    report.table(
        f"MODELLED, not measured: Wan2.1-14B 480p/81 frames ({S} tokens) on 8 GPUs, from one GPU's measured "
        f"forward ({fig['seconds']:.3f} s, ours {fig['mode']}) / sp degree + analytic bytes / link",
        [
            "layout",
            "comm",
            "link",
            "compute/forward s",
            "GB sent/forward/rank",
            "comm/forward s",
            "s/step with CFG",
            "s/step without CFG",
        ],
        rows,
    )
    report.note(
        f"LightX2V's published 8×H100 figures for the same job: {LIGHTX2V['cfg']} s/step with CFG, "
        f"{LIGHTX2V['no_cfg']} s/step without."
    )
    report.note(
        "Assumed: compute splits perfectly over the sp ranks; communication does not overlap compute; "
        "bytes are analytic from parallel/'s message shapes (checked against count_comm in the tests)."
    )
