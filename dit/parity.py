"""`ithaca parity`: the same generation on 1 rank and on N ranks per mode (each a `generate` run on N ranks
of this machine, parallel.local_group), compared on the final latents and frames."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dit.cli_args import (
    HelpFormatter,
    add_model_args,
    add_request_args,
    checked,
    found_model,
    on_ranks,
    pipeline_argv,
    pipeline_config,  # fmt: skip
    request_argv,
    run_forwarding,
    say_error,
    sigterm_as_interrupt,
)
from dit.shape import model_shape

MODES = ("alltoall", "fp8", "p2p", "ring", "hybrid", "cfg")
# Parity tolerances on the final latents, relative to their largest magnitude (max |a - b| / max |ref|).
# fp32 exact modes differ only by summation order (ring's online softmax, kernel blocking): measured ≤ 1e-6 on
# tiny, 1e-4 leaves room for longer runs. bf16/fp16 round every layer, so reordering shows up ~100× larger.
# FP8 all-to-all quantizes q/k/v at every layer and step (e4m3 round trip ≈ 2.6 % per element), and guidance
# amplifies it: 1e-2 on random weights, but 0.16-0.29 on the trained tiny model (the default), whose sharper
# attention feels the 3-bit mantissa (2-core box, 2026-11-22 and -28). 0.5 still catches a broken exchange
# (garbage is ~1); that FP8 videos show what was asked is tests/test_tiny_model.py's check, not this one.
EXACT_TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}
FP8_TOL = 0.5
FRAME_TOL_EXACT = 2  # uint8 levels: a latent difference of 1e-6 may still flip a rounding boundary


def add_parity(subparsers) -> None:
    p = subparsers.add_parser(
        "parity",
        help="same generation on 1 rank and on N ranks per mode; compare",
        formatter_class=HelpFormatter,
    )
    # words the trained tiny model (the default) knows: it warned of every one of a lighthouse's, unseen
    add_request_args(p, prompt_default="a red circle moving right")
    add_model_args(p, "parity")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    p.add_argument("--nproc", type=int, default=2, help="ranks of each mode's run")
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="exact modes, relative to the latents' largest magnitude (default: by --dtype: "
        + ", ".join(f"{k} {v:g}" for k, v in EXACT_TOL.items())
        + ")",
    )
    p.add_argument(
        "--fp8-tol",
        type=float,
        default=FP8_TOL,
        help="fp8 mode, and ring and hybrid in bfloat16/float16 or with --quant/--attn-backend fp8; relative",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.set_defaults(func=run_parity)


@dataclass
class ParityRow:
    mode: str
    ranks: int
    layout: str  # ulysses x ring x cfg
    comm: str
    status: str  # ok | FAIL | skipped | error
    latents_max_abs: float | None = None
    latents_rel: float | None = None
    frames_max_abs: int | None = None
    frames_rel: float | None = None
    tol: float | None = None  # on latents_rel
    frames_tol: int | None = None  # on frames_max_abs; None: frames unchecked (a lossy row)
    seconds: float | None = None  # the run's wall time, launch included
    note: str = ""


def _mode_layout(mode: str, n: int, heads: int, guided: bool) -> tuple[int, int, int, str] | str:
    """(ulysses, ring, cfg, comm) for a mode at n ranks of a model of `heads` attention heads, or why it
    cannot run."""
    if mode in ("alltoall", "fp8", "p2p"):
        layout = n, 1, 1, mode
    elif mode == "ring":
        layout = 1, n, 1, "alltoall"
    elif mode == "hybrid":
        if n < 4 or n % 2:
            return "needs an even --nproc of at least 4"
        layout = 2, n // 2, 1, "alltoall"
    elif mode == "cfg":
        if n % 2:
            return "needs an even --nproc"
        if not guided:
            return "needs guidance above 1 (no negative pass for the second half of the ranks)"
        layout = n // 2, 1, 2, "alltoall"
    else:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if layout[0] > heads:
        return f"needs ulysses {layout[0]}, more than the model's {heads} heads (every rank needs a head)"
    return layout


def _launch(argv: list[str], nproc: int, out: Path) -> tuple[dict | None, str, int]:
    """The run's saved latents and frames, or None and the most telling line of why not; its exit code.
    `Interrupted` once the run has ended when a signal stopped it (it went on to the run's ranks)."""
    argv = ["generate", "--out", str(out.with_suffix(".mp4")), "--save-latents", str(out), *argv]
    command = on_ranks(nproc, argv) if nproc > 1 else [sys.executable, "-m", "server.cli", *argv]
    proc = run_forwarding(command, capture=True)
    if proc.returncode != 0:  # the most telling line: the last error message, else the last line
        lines = (proc.stdout + proc.stderr).strip().splitlines() or [f"exit code {proc.returncode}"]
        return None, next((ln for ln in reversed(lines) if "rror" in ln), lines[-1]).strip(), proc.returncode
    if not out.exists():
        return None, "the run saved no latents", 1
    import torch

    return torch.load(out), "", 0


def _compare(ref: dict, got: dict) -> tuple[float, float, int, float]:
    a, b = ref["latents"].double(), got["latents"].double()
    lat_abs = (a - b).abs().max().item()
    fr_abs = (ref["frames"].int() - got["frames"].int()).abs().max().item()
    return lat_abs, lat_abs / max(a.abs().max().item(), 1e-30), fr_abs, fr_abs / 255.0


def run_parity(args) -> int:
    """Ctrl-C or SIGTERM stops the whole run (the run in progress first: its ranks end), one line, exit
    128 + the signal's number, the temporary folder gone."""
    try:
        with sigterm_as_interrupt():
            return _run_parity(args)
    except KeyboardInterrupt as stop:
        print("ithaca parity: interrupted", file=sys.stderr)
        return getattr(stop, "code", 128 + signal.SIGINT)


def _run_parity(args) -> int:
    modes = list(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))  # each once
    why = _refused(modes, args)
    if why:  # found before the model's runs, not as "0 of 0 modes" after them
        print(f"ithaca parity: error: {why}", file=sys.stderr)
        return 2
    if not found_model(args, "parity") or not checked(  # each mode's layout is checked below: any one here
        args, "parity", config := pipeline_config(args), ulysses="auto", ring="auto", cfg=1
    ):
        return 2
    sampling = dict(sampler=config.sampler, timesteps=config.timesteps)
    shape = model_shape(config.model, guidance=args.guidance, guidance_2=args.guidance_2, **sampling)
    layouts = {mode: _mode_layout(mode, args.nproc, shape.heads, shape.guided) for mode in modes}
    if all(isinstance(why, str) for why in layouts.values()):
        reasons = "; ".join(f"{mode} {why}" for mode, why in layouts.items())
        say_error("parity", ValueError(f"no mode of --modes runs on --nproc {args.nproc}: {reasons}"))
        return 2
    exact_tol = args.tol if args.tol is not None else EXACT_TOL[args.dtype]
    common, request = pipeline_argv(args), request_argv(args)  # the request last: it ends with the prompt
    rows: list[ParityRow] = []
    # A run takes tens of seconds: each row prints as its run ends. With --json the table is progress on
    # stderr and stdout holds only the JSON document.
    runs = ["generate", *common, *request]  # what every run is: each mode adds its layout
    table = _Table(sys.stderr if args.json else sys.stdout, f"each run: ithaca {shlex.join(runs)}")
    with tempfile.TemporaryDirectory(prefix="ithaca-parity-") as tmp:
        start = time.perf_counter()
        ref, err, code = _launch([*common, *request], 1, Path(tmp) / "reference.pt")
        if ref is None:
            print(f"ithaca parity: the 1-rank reference run failed: {err}", file=sys.stderr)
            if args.json:  # still the one document stdout promises
                failed = {"ok": False, "dtype": args.dtype, "error": f"the reference run failed: {err}"}
                print(json.dumps({**failed, "runs": runs, "rows": []}, indent=2))
            return 2 if code == 2 else 1  # a setting its run refused (a prompt too long) is the user's
        reference = ParityRow("reference", 1, "1x1x1", "alltoall", "ok", seconds=time.perf_counter() - start)
        table.print(reference)
        for mode, layout in layouts.items():
            if isinstance(layout, str):
                rows.append(ParityRow(mode, args.nproc, "-", "-", "skipped", note=layout))
                table.print(rows[-1])
                continue
            u, r, c, comm = layout
            lossy = "fp8" in comm or _drifts(args, r)
            tol = args.fp8_tol if lossy else exact_tol
            frames_tol = None if lossy else FRAME_TOL_EXACT
            row = ParityRow(mode, args.nproc, f"{u}x{r}x{c}", comm, "error", tol=tol, frames_tol=frames_tol)
            argv = [*common, "--ulysses", str(u), "--ring", str(r), "--cfg", str(c), "--comm", comm, *request]
            start = time.perf_counter()
            got, err, _ = _launch(argv, args.nproc, Path(tmp) / f"{mode}.pt")
            row.seconds = time.perf_counter() - start
            if got is None:
                row.note = err
            else:
                row.latents_max_abs, row.latents_rel, row.frames_max_abs, row.frames_rel = _compare(ref, got)
                frames_ok = frames_tol is None or row.frames_max_abs <= frames_tol
                row.status = "ok" if row.latents_rel <= tol and frames_ok else "FAIL"
            rows.append(row)
            table.print(row)
    bad = [r.mode for r in rows if r.status not in ("ok", "skipped")]
    skipped = sum(r.status == "skipped" for r in rows)
    print(
        f"parity: {len(rows) - len(bad) - skipped} of {len(rows)} modes match 1 rank"
        + (f", {skipped} skipped" if skipped else "")
        + (f"; FAIL: {', '.join(bad)}" if bad else ""),
        file=table.out,
        flush=True,
    )
    if args.json:
        report = {"ok": not bad, "dtype": args.dtype, "runs": runs, "reference_seconds": reference.seconds}
        print(json.dumps({**report, "rows": [asdict(r) for r in rows]}, indent=2))
    return 1 if bad else 0


def _drifts(args, ring: int) -> bool:
    """Whether a layout with `ring` ring ranks drifts from one rank by more than rounding: its blocks' partial
    attention rounds to bfloat16/float16 on its own, or FP8 attention gives each span its own K and V
    scales, or an FP8 linear layer's input crosses an e4m3 step (the merge rounds float32 otherwise); the
    steps amplify it (ring on 2 ranks of the trained tiny model: 1.9e-2 to 1.0e-1 in bfloat16, 7.5e-3 to
    1.1e-2 in float16; Ulysses and CFG give one rank's latents exactly). Held to --fp8-tol, as FP8's
    exchange is: a broken exchange gives about 1."""
    lossy_compute = args.dtype != "float32" or args.quant == "fp8" or args.attn_backend == "fp8"
    return ring > 1 and lossy_compute


def _refused(modes: list[str], args) -> str | None:
    """Why the run cannot go or would check nothing (an unknown mode, none, a negative tolerance), or None;
    before any model is looked for (`_run_parity` checks the modes against the model)."""
    unknown = next((mode for mode in modes if mode not in MODES), None)
    if unknown is not None:
        return f"unknown mode {unknown!r}; choose from {', '.join(MODES)}"
    if not modes:
        return f"--modes names no mode; choose from {', '.join(MODES)}"
    if args.nproc < 2:  # one rank against one rank checks nothing
        return f"--nproc must be 2 or more (each mode's run against one rank), got {args.nproc}"
    for flag, tol in (("--tol", args.tol), ("--fp8-tol", args.fp8_tol)):
        if tol is not None and not tol >= 0:
            return f"{flag} must be 0 or more, got {tol}"
    return None


class _Table:
    """Parity rows printed one at a time under a header, in fixed-width columns (the note comes last)."""

    # (heading, width): wide enough for "reference", "alltoall", "1.23e-05", "1234.5 s"
    COLUMNS = (("mode", 9), ("ranks", 5), ("u x r x c", 9), ("comm", 8), ("latents max abs", 15),
               ("latents rel", 11), ("latents tol", 11), ("frames max abs", 14), ("frames tol", 10),
               ("frames rel", 10), ("time", 8), ("result", 0))  # fmt: skip

    def __init__(self, out, described: str):
        """`described`: what every run is, said above the table."""
        self.out = out
        print(described, file=out, flush=True)
        self._line(head for head, _ in self.COLUMNS)

    def print(self, r: ParityRow) -> None:
        def fmt(v):
            return "-" if v is None else (str(v) if isinstance(v, int) else f"{v:.2e}")

        seconds = "-" if r.seconds is None else f"{r.seconds:.1f} s"
        self._line((r.mode, str(r.ranks), r.layout, r.comm, fmt(r.latents_max_abs), fmt(r.latents_rel),
                    fmt(r.tol), fmt(r.frames_max_abs), fmt(r.frames_tol), fmt(r.frames_rel), seconds,
                    f"{r.status} {r.note}".strip()))  # fmt: skip

    def _line(self, cells) -> None:
        line = "  ".join(cell.ljust(w) for cell, (_, w) in zip(cells, self.COLUMNS, strict=True))
        print(line.rstrip(), file=self.out, flush=True)
