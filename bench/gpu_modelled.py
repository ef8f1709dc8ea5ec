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

import torch

from bench.gpu_kit import Kit, Report, Skip
from parallel.plan import Layout, Links, Shape, estimate, messages

LINKS = {"NVLink 4 (450 GB/s per direction)": 450e9, "PCIe 5 x16 (64 GB/s per direction)": 64e9}
LIGHTX2V = {"cfg": 0.75, "no_cfg": 0.39}  # published 8×H100 s/step, Wan2.1-14B 480p 81 frames

LAYOUTS = (
    Layout("Ulysses 8", 8),
    Layout("CFG 2 × Ulysses 4", 4, cfg=2),
    Layout("ring 2 × Ulysses 4", 4, ring=2),
)

__all__ = ["LAYOUTS", "Layout", "messages", "modelled", "overlap"]


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
    forwards = {f"bf16, ours {fig['mode']}": fig["seconds"]}
    if "fp8" in fig:  # the wan-14b section's fastest FP8 forward
        forwards[f"FP8: {fig['fp8']['what']}"] = fig["fp8"]["seconds"]
    rows, fp8_steps = [], []
    for forward, seconds in forwards.items():
        for layout in LAYOUTS:
            for comm in ("alltoall", "fp8"):
                if comm == "fp8" and layout.ulysses == 1:
                    continue
                for link, bw in LINKS.items():
                    links = Links(bw, bw)
                    guided = estimate(layout, shape, seconds, links, fp8=comm == "fp8")
                    plain = estimate(layout, replace(shape, guided=False), seconds, links, fp8=comm == "fp8")
                    no_cfg = (
                        "n/a (CFG parallel needs guidance)" if plain.step_s is None else f"{plain.step_s:.3f}"
                    )
                    rows.append(
                        [
                            forward,
                            layout.name,
                            comm,
                            link,
                            f"{guided.compute_s:.3f}",
                            f"{guided.bytes_per_forward / 1e9:.2f}",
                            f"{guided.comm_s:.3f}",
                            f"{guided.step_s:.3f}",
                            no_cfg,
                        ]
                    )
                    if forward.startswith("FP8") and bw == max(LINKS.values()) and plain.step_s is not None:
                        fp8_steps.append(plain.step_s)
    measured = ", ".join(f"{what} {sec:.3f} s" for what, sec in forwards.items())
    report.table(
        f"MODELLED, not measured: Wan2.1-14B 480p/81 frames ({S} tokens) on 8 GPUs, from one GPU's measured "
        f"forward ({measured}) / sp degree + analytic bytes / link",
        [
            "one GPU's forward",
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
    report.target(
        "s/step without CFG on 8 GPUs (NVLink, best layout), MODELLED from the fastest FP8 forward",
        min(fp8_steps, default=None),
        0.24,
        "s",
    )
    report.note(
        f"LightX2V's published 8×H100 figures for the same job: {LIGHTX2V['cfg']} s/step with CFG, "
        f"{LIGHTX2V['no_cfg']} s/step without."
    )
    report.note(
        "Assumed: compute splits perfectly over the sp ranks; communication does not overlap compute; "
        "bytes are analytic from parallel/'s message shapes (checked against count_comm in the tests)."
    )


def overlap(kit: Kit, report: Report) -> None:
    """Overlapped Ulysses at P=8 on the Wan2.1-14B shape: each head chunk's attention MEASURED on this GPU
    (one rank's share: the whole sequence, its heads), the exchanges MODELLED from their bytes and a link's
    bandwidth, with the schedule parallel/overlap.py issues (chunk c attends while chunk c+1's Q/K/V and
    chunk c-1's output cross the link)."""
    from bench.gpu_speed import WAN_14B_SHAPE, _rand
    from parallel import local_attention
    from parallel.ulysses import head_splits

    S, H, D = kit.pick(WAN_14B_SHAPE, (512, 32, 64))
    P = 8
    heads = H // P  # every rank's share (40 / 8 = 5)
    elt = torch.finfo(kit.dtype).bits // 8
    attend_ms = {}
    for n in sorted(set(head_splits(heads, 4) + head_splits(heads, 2) + [heads])):
        q, k, v = (_rand(kit, 1, S, n, D) for _ in "qkv")
        sec, _, _ = kit.time(lambda q=q, k=k, v=v: local_attention(q, k, v), warmup=3, iters=10)
        attend_ms[n] = sec * 1e3
    rows = []
    for link, bw in LINKS.items():
        for chunks in (c for c in (1, 2, 4) if c <= heads):
            split = head_splits(heads, chunks)
            # one rank's bytes on the wire per chunk: its (P-1)/P of L = S/P tokens × the chunk's P·n heads
            wire = lambda n, tensors: tensors * (S // P) * P * n * D * elt * (P - 1) / P  # noqa: E731
            qkv_in = [wire(n, 3) / bw * 1e3 for n in split]
            out = [wire(n, 1) / bw * 1e3 for n in split]
            attend = [attend_ms[n] for n in split]
            call = qkv_in[0] + out[-1]
            for c in range(chunks):  # chunk c attends; c+1's input and c-1's output share the link meanwhile
                link_busy = (qkv_in[c + 1] if c + 1 < chunks else 0) + (out[c - 1] if c else 0)
                call += max(attend[c], link_busy)
            rows.append([link, chunks, f"{sum(attend):.3f}", f"{sum(qkv_in) + sum(out):.3f}", f"{call:.3f}"])
    single = {r[0]: float(r[4]) for r in rows if r[1] == 1}
    for r in rows:
        r.append(f"{float(r[4]) / single[r[0]]:.2f}×")
    report.table(
        f"MODELLED exchanges, MEASURED attention: one attention call of Ulysses 8 at S={S}, {H} heads "
        f"({heads} a rank), D={D}, {kit.dtype}",
        ["link", "head chunks", "attention ms (measured)", "exchange ms (modelled)", "call ms", "vs one"],
        rows,
    )
    report.note(
        "Assumed: the link moves one chunk's bytes at its nominal bandwidth while attention runs (NCCL on "
        "its own stream); packing and unpacking, the same bytes in C pieces, are left out. Attention by "
        "chunk is measured, so the cost of smaller kernels is in the table; the overlap itself needs 2+ "
        "GPUs to time."
    )
