"""MODELLED 8-GPU step times for Wan2.1-14B at 480p/81 frames: one rank's measured compute plus the bytes each
collective moves over a stated link bandwidth. Nothing here runs on 8 GPUs; it is arithmetic on figures the
kit measured on one.

Bytes come analytically from the message shapes parallel/ builds (tests/test_bench_gpu.py checks them against
`parallel.count_comm` on real gloo runs): per self-attention, Ulysses sends the fused Q/K/V buffer
`pack_qkv` → [U, 3, L, H/U, D] and gets the output back through `pack_out` → [U, L, H/U, D] (L = S/(R·U)
tokens per rank), keeping its own 1/U of each; the ring passes its stacked K/V span [2, U·L, H/U, D] R−1
times; CFG parallel all-gathers each step's fp32 noise prediction once. FP8 sends D payload bytes plus a
4-byte scale per (token, head) row instead of 2·D.

Assumptions, stated in the report: compute splits perfectly over the sp ranks (linear layers by tokens,
attention by heads); no overlap of communication with compute; every byte crosses a link at the nominal
per-direction bandwidth below.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.gpu_kit import Kit, Report, Skip

LINKS = {"NVLink 4 (450 GB/s per direction)": 450e9, "PCIe 5 x16 (64 GB/s per direction)": 64e9}
LIGHTX2V = {"cfg": 0.75, "no_cfg": 0.39}  # published 8×H100 s/step, Wan2.1-14B 480p 81 frames
BF16 = 2


@dataclass(frozen=True)
class Layout:
    name: str
    ulysses: int
    ring: int = 1
    cfg: int = 1

    @property
    def sp(self) -> int:
        return self.ulysses * self.ring


LAYOUTS = (
    Layout("Ulysses 8", 8),
    Layout("CFG 2 × Ulysses 4", 4, cfg=2),
    Layout("ring 2 × Ulysses 4", 4, ring=2),
)


def messages(layout: Layout, S: int, H: int, D: int, fp8: bool = False, elt: int = BF16) -> dict[str, int]:
    """Bytes of one self-attention call's messages as `parallel.count_comm` counts them (a Ulysses
    all-to-all: its whole buffer; a ring pass: what is sent); `elt` bytes per element."""
    U, R = layout.ulysses, layout.ring
    L = -(-S // layout.sp)
    row = D + 4 if fp8 else D * elt  # bytes per (token, head) row on the wire
    out = {}
    if U > 1:
        out["all_to_all"] = (3 + 1) * L * H * row
    if R > 1:
        out["send"] = (R - 1) * 2 * U * L * (H // U) * D * elt
    return out


def link_bytes(layout: Layout, S: int, H: int, D: int, fp8: bool = False) -> float:
    """Bytes one rank puts on its links per self-attention: all-to-all less the chunk it keeps."""
    m = messages(layout, S, H, D, fp8)
    return m.get("all_to_all", 0) * (layout.ulysses - 1) / layout.ulysses + m.get("send", 0)


def modelled(kit: Kit, report: Report) -> None:
    fig = kit.figures.get("wan2.1-14b")
    if fig is None:
        raise Skip("needs the wan-14b section's measured forward (run it in the same call)")
    S, H, D, layers = fig["tokens"], fig["heads"], fig["head_dim"], fig["layers"]
    latent_bytes = 4
    for n in fig["latent"]:
        latent_bytes *= n  # CFG parallel gathers the fp32 noise prediction once per step
    rows = []
    for layout in LAYOUTS:
        compute = fig["seconds"] / layout.sp
        for comm in ("alltoall", "fp8"):
            if comm == "fp8" and layout.ulysses == 1:
                continue
            per_forward = layers * link_bytes(layout, S, H, D, comm == "fp8")
            for link, bw in LINKS.items():
                fwd = compute + per_forward / bw
                if layout.cfg == 2:
                    cfg_step, plain = fwd + latent_bytes / bw, "n/a (CFG parallel needs guidance)"
                else:
                    cfg_step, plain = 2 * fwd, f"{fwd:.3f}"
                rows.append(
                    [
                        layout.name,
                        comm,
                        link,
                        f"{compute:.3f}",
                        f"{per_forward / 1e9:.2f}",
                        f"{per_forward / bw:.3f}",
                        f"{cfg_step:.3f}",
                        plain,
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
