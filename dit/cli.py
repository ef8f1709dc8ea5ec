"""`ithaca generate` (one video, any layout, with or without torchrun) and `ithaca parity` (1 vs N ranks)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from parallel.plan import parse_degree

MODES = ("alltoall", "fp8", "p2p", "ring", "hybrid", "cfg")
# Parity tolerances on the final latents, relative to their largest magnitude (max |a - b| / max |ref|).
# fp32 exact modes differ only by summation order (ring's online softmax, kernel blocking): measured ≤ 1e-6 on
# tiny, 1e-4 leaves room for longer runs. bf16/fp16 round every layer, so reordering shows up ~100× larger.
# FP8 all-to-all quantizes q/k/v at every layer and step (e4m3 round trip ≈ 2.6 % per element).
EXACT_TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 1e-2}
FP8_TOL = 0.1
FRAME_TOL_EXACT = 2  # uint8 levels: a latent difference of 1e-6 may still flip a rounding boundary


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where the help says what leaving it out does (default
    None) and for off-by-default switches."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _lora_arg(spec: str) -> tuple[str, float]:
    from dit.lora import parse_spec

    try:
        path, strength = parse_spec(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return path, strength


def _degree(text: str) -> int | str:
    try:
        return parse_degree(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model-path",
        help="diffusers-format pipeline folder; the family comes from its transformer/config.json "
        "(e.g. Wan2.1-T2V-1.3B-Diffusers, HunyuanVideo-1.5-Diffusers-480p_t2v)",
    )
    src.add_argument(
        "--preset",
        default="tiny",
        help="tiny (the trained default: coloured shapes moving on black, see the README) | random weights: "
        "tiny-random | tiny-joint (HunyuanVideo-1.5) | tiny-i2v-random, tiny-joint-i2v (image-to-video) | "
        "tiny-moe-random (two experts) | tiny-ti2v-random | wan2.1-1.3b | wan2.1-14b | wan2.1-i2v-14b-480p | "
        "wan2.2-t2v-a14b | wan2.2-ti2v-5b | hunyuanvideo-1.5-480p-t2v",
    )
    # Allowed values are checked by dit.preflight, against the lists the pipeline and parallel/ use.
    p.add_argument(
        "--dtype", default="float32", help="float32 | bfloat16 | float16 (the DiT and text encoder)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="cpu | cuda | cuda:N (default: cuda:LOCAL_RANK when GPUs are present, else cpu)",
    )
    p.add_argument(
        "--attn-backend",
        default="auto",
        help="auto | flash | cudnn | sdpa | math (auto: flash-attn on CUDA when installed, else SDPA)",
    )
    p.add_argument(
        "--text-encoder-device", help="e.g. cpu: keep the text encoder off the GPU (default: --device)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each DiT block: faster GPU steps after a one-off compile per video size",
    )
    p.add_argument(
        "--sampler",
        default=None,
        help="unipc | euler | renoise (default: the folder's scheduler class, else the family's: Wan unipc, "
        "HunyuanVideo-1.5 euler); renoise re-noises each step's clean prediction afresh, as LightX2V samples "
        "its step-distilled Wan2.1",
    )
    p.add_argument(
        "--flow-shift", type=float, default=None, help="default: the folder's scheduler config, else 3"
    )
    p.add_argument(
        "--timesteps",
        default=None,
        help="a distilled model's fixed schedule, e.g. 1000,750,500,250 (LightX2V's 4 steps, with "
        "--flow-shift 5 and --sampler euler or renoise): exactly these steps, guidance 1 unless --guidance "
        "(default: the folder's denoising_step_list in scheduler/scheduler_config.json, if any)",
    )
    p.add_argument(
        "--offload-idle-expert",
        action="store_true",
        help="a two-expert model (Wan2.2 A14B): keep the expert not running in host memory",
    )
    p.add_argument(
        "--lora",
        action="append",
        type=_lora_arg,
        metavar="PATH[:STRENGTH]",
        help="merge a LoRA safetensors file into the DiT at load, times STRENGTH (default 1); repeatable, "
        "the LoRAs add; diffusers/PEFT, kohya and original-Wan (LightX2V) key layouts",
    )


def _add_request_args(p: argparse.ArgumentParser, prompt_default: str | None = None) -> None:
    if prompt_default is None:
        p.add_argument("prompt", help="what the video shows")
    else:
        p.add_argument("--prompt", default=prompt_default, help="what the video shows")
    p.add_argument("--negative-prompt", default="", help="what it should not show (guidance > 1)")
    p.add_argument("--frames", type=int, default=None, help="4k+1 (default: the model's; tiny 17)")
    size = "multiple of 16 (default: the model's; tiny 64; HunyuanVideo-1.5 I2V without either: the image's)"
    p.add_argument("--height", type=int, default=None, help=size)
    p.add_argument("--width", type=int, default=None, help=size)
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's; tiny 12)")
    p.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="guidance scale (default: the model's; 1 with --timesteps)",
    )
    p.add_argument(
        "--guidance-2",
        type=float,
        default=None,
        help="a two-expert model's (Wan2.2 A14B) guidance below its boundary (default: --guidance)",
    )
    p.add_argument("--seed", type=int, default=0, help="the initial noise depends on it alone")
    p.add_argument(
        "--image",
        default=None,
        help="first frame of an image-to-video model: a PNG, JPEG or WebP file (scaled to cover the video "
        "and centre-cropped)",
    )
    p.add_argument(
        "--cache",
        default=None,
        help="step caching: off | fbcache[:THRESHOLD] (skips most of the DiT at steps where its first "
        "block's output barely moved; default off)",
    )
    p.add_argument(
        "--fps", type=int, default=None, help="frames per second of the MP4 (default: the model's)"
    )


def add_subcommands(subparsers) -> None:
    g = subparsers.add_parser(
        "generate", help="generate one video and write it as MP4", formatter_class=HelpFormatter
    )
    _add_request_args(g)
    g.add_argument("--out", default="video.mp4", help="MP4 file to write")
    _add_model_args(g)
    # no degree given: all auto (parallel.plan's rule, `ithaca plan` shows it); some: the others as before
    g.add_argument(
        "--ulysses",
        type=_degree,
        default=None,
        help="Ulysses degree or auto (default: auto; with --ring/--cfg given: the ranks left over)",
    )
    g.add_argument(
        "--ring", type=_degree, default=None, help="ring attention degree or auto (default: auto; else 1)"
    )
    g.add_argument(
        "--cfg",
        type=_degree,
        default=None,
        help="1 | 2 (2: prompt and negative prompt in parallel) | auto (default: auto; else 1)",
    )
    g.add_argument(
        "--comm",
        default="alltoall",
        help="Ulysses exchange: alltoall | fp8 | p2p | p2p+fp8, each optionally +overlapN (the heads in N "
        "chunks, one chunk's exchange overlapping another's attention)",
    )
    g.add_argument("--nproc", type=int, default=1, help="re-launch under torchrun with N CPU/GPU processes")
    g.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="under torchrun across machines: this machine's number, 0 to NNODES-1 (node 0 holds rank 0, "
        "which writes the video; the ranks are numbered by it, as `ithaca serve` numbers them)",
    )
    g.add_argument("--save-latents", default=None, help="also torch.save the final latents and frames here")
    g.set_defaults(func=run_generate)

    p = subparsers.add_parser(
        "parity",
        help="same generation on 1 rank and on N ranks per mode; compare",
        formatter_class=HelpFormatter,
    )
    _add_request_args(p, prompt_default="a lighthouse on a cliff at dusk, waves crashing")
    _add_model_args(p)
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
    p.add_argument("--fp8-tol", type=float, default=FP8_TOL, help="fp8 mode, relative")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.set_defaults(func=run_parity)


def _pipeline_config(args, comm: str):
    from dit.pipeline import PipelineConfig

    # preview_every 0: no one watches this run's previews, so the VAE is not decoded to fit their colour map
    return PipelineConfig(
        preview_every=0,
        model=args.model_path or args.preset,
        device=args.device,
        dtype=args.dtype,
        comm=comm,
        attn_backend=args.attn_backend,
        text_encoder_device=args.text_encoder_device,
        compile=args.compile,
        sampler=args.sampler,
        flow_shift=args.flow_shift,
        timesteps=args.timesteps,
        loras=tuple(args.lora or ()),
        offload_idle_expert=args.offload_idle_expert,
    )


def _torchrun(nproc: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "server.cli", *argv]  # fmt: skip


def _without_nproc(argv: list[str]) -> list[str]:
    """argv minus `--nproc N` / `--nproc=N` (torchrun's parser would read `--nproc` as `--nproc-per-node`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _preflight(args, command: str, *, ulysses=None, ring=1, cfg=1, comm="alltoall") -> bool:
    """Whether dit.preflight accepts the settings; if not, its one line goes to stderr (from rank 0 alone)."""
    from dit.preflight import preflight

    # Under torchrun (launched by us or by hand) the ranks are already there: check against their count.
    nproc = int(os.environ.get("WORLD_SIZE", args.nproc))
    try:
        preflight(
            model_path=args.model_path,
            preset=args.preset,
            device=args.device,
            dtype=args.dtype,
            attn_backend=args.attn_backend,
            comm=comm,
            sampler=args.sampler,
            timesteps=args.timesteps,
            text_encoder_device=args.text_encoder_device,
            nproc=nproc,
            local_nproc=int(os.environ.get("LOCAL_WORLD_SIZE", nproc)),
            ulysses=ulysses,
            ring=ring,
            cfg=cfg,
            loras=tuple(getattr(args, "lora", None) or ()),
            request=_request(args),
        )
    except ValueError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"ithaca {command}: error: {e}", file=sys.stderr)
        return False
    return True


def _request(args):
    """The request the arguments ask for (the image apart: `read_image` reads it after the checks)."""
    from dit.pipeline import GenerationRequest

    return GenerationRequest(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        num_frames=args.frames,
        height=args.height,
        width=args.width,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance,
        guidance_scale_2=args.guidance_2,
        seed=args.seed,
        fps=args.fps,
        cache=args.cache,
    )


def read_image(path: str):
    """`--image`: the file's pixels (uint8 RGB), checked as the server checks an upload (dit.image)."""
    from dit.image import ImageLimits, decode

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"--image {path}: {e.strerror or e}") from None
    try:
        return decode(data, ImageLimits())
    except ValueError as e:
        raise ValueError(f"--image {path}: {e}") from None


def run_generate(args) -> int:
    if not _preflight(args, "generate", ulysses=args.ulysses, ring=args.ring, cfg=args.cfg, comm=args.comm):
        return 2
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return subprocess.call(_torchrun(args.nproc, _without_nproc(sys.argv[1:])))

    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    import parallel
    from dit.pipeline import load_pipeline
    from dit.shape import launch_layout
    from dit.video import write_mp4
    from dit.vocabulary import prompt_warnings, read_vocabulary
    from parallel.launch import number_ranks_by_node

    choice = launch_layout(args.model_path or args.preset, args.ulysses, args.ring, args.cfg,
                           sampler=args.sampler, timesteps=args.timesteps)  # fmt: skip
    if os.environ.get("RANK", "0") == "0":
        if choice.reason != "as given":
            print(choice.line(), file=sys.stderr)
        for warning in prompt_warnings(args.prompt, read_vocabulary(args.model_path or args.preset)):
            print(f"ithaca generate: warning: {warning}", file=sys.stderr)
    layout, backend = choice.layout, "gloo" if args.device == "cpu" else None
    try:  # across machines: rank 0 on node 0; every machine gives its own node number and the same layout
        number_ranks_by_node(
            args.node_rank, {"ulysses": layout.ulysses, "ring": layout.ring, "cfg": layout.cfg}
        )
    except ValueError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"ithaca generate: error: {e}", file=sys.stderr)
        return 2
    mesh = parallel.init_parallel(ulysses=layout.ulysses, ring=layout.ring, cfg=layout.cfg, backend=backend)
    try:
        pipe = load_pipeline(_pipeline_config(args, args.comm), mesh)
        request = _request(args)
        try:
            if args.image is not None:
                request = replace(request, image=read_image(args.image))
            request = pipe.validate(request)
        except ValueError as e:
            if mesh.rank == 0:
                print(f"ithaca generate: error: {e}", file=sys.stderr)
            return 2
        leader = mesh.rank == 0
        bar = tqdm(total=request.num_inference_steps, desc="denoising", unit="step", disable=not leader)
        start = time.perf_counter()
        latents = pipe.denoise(request, callback=lambda step, total: bar.update(1))
        bar.close()
        frames = pipe.decode(latents)  # every rank decodes a band; rank 0 gets the frames
        if leader:
            write_mp4(frames, args.out, request.fps)
            if args.save_latents:
                torch.save({"latents": latents.cpu(), "frames": torch.from_numpy(frames)}, args.save_latents)
            n, h, w, _ = frames.shape
            layout = f"ulysses {mesh.ulysses_size} x ring {mesh.ring_size} x cfg {mesh.cfg_size}"
            seconds = time.perf_counter() - start
            stats, cached = pipe.evaluations, ""
            if request.cache != "off":
                cached = f", {stats.skipped} of {stats.evaluated + stats.skipped} evaluations skipped"
            print(
                f"wrote {args.out}: {n} frames {w}x{h} @ {request.fps} fps, "
                f"{request.num_inference_steps} steps{cached}, {layout} ({mesh.world_size} ranks), "
                f"{seconds:.1f} s"
            )
        return 0
    finally:
        if dist.is_initialized() and "WORLD_SIZE" in os.environ:
            dist.destroy_process_group()


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
    tol: float | None = None
    seconds: float | None = None  # the run's wall time, launch included
    note: str = ""


def _mode_layout(mode: str, n: int) -> tuple[int, int, int, str] | str:
    """(ulysses, ring, cfg, comm) for a mode at n ranks, or why it cannot run."""
    if mode in ("alltoall", "fp8", "p2p"):
        return n, 1, 1, mode
    if mode == "ring":
        return 1, n, 1, "alltoall"
    if mode == "hybrid":
        return (2, n // 2, 1, "alltoall") if n >= 4 and n % 2 == 0 else "needs an even --nproc of at least 4"
    if mode == "cfg":
        return (n // 2, 1, 2, "alltoall") if n % 2 == 0 else "needs an even --nproc"
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def _common_argv(args) -> list[str]:
    argv = [args.prompt, "--negative-prompt", args.negative_prompt, "--seed", str(args.seed)]
    for flag, value in (("--frames", args.frames), ("--height", args.height), ("--width", args.width),
                        ("--steps", args.steps), ("--guidance", args.guidance), ("--fps", args.fps),
                        ("--guidance-2", args.guidance_2), ("--image", args.image),
                        ("--model-path", args.model_path), ("--device", args.device),
                        ("--flow-shift", args.flow_shift), ("--sampler", args.sampler),
                        ("--timesteps", args.timesteps), ("--cache", args.cache),
                        ("--text-encoder-device", args.text_encoder_device)):  # fmt: skip
        if value is not None:
            argv += [flag, str(value)]
    if not args.model_path:
        argv += ["--preset", args.preset]
    if args.compile:
        argv.append("--compile")
    if args.offload_idle_expert:
        argv.append("--offload-idle-expert")
    for path, strength in args.lora or ():
        argv += ["--lora", f"{path}:{strength!r}"]
    return argv + ["--dtype", args.dtype, "--attn-backend", args.attn_backend]


def _launch(argv: list[str], nproc: int, out: Path) -> tuple[dict | None, str]:
    argv = ["generate", *argv, "--out", str(out.with_suffix(".mp4")), "--save-latents", str(out)]
    cmd = _torchrun(nproc, argv) if nproc > 1 else [sys.executable, "-m", "server.cli", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:  # the most telling line: the last error message, else the last line
        lines = (proc.stdout + proc.stderr).strip().splitlines() or [f"exit code {proc.returncode}"]
        return None, next((ln for ln in reversed(lines) if "rror" in ln), lines[-1]).strip()
    import torch

    return torch.load(out), ""


def _compare(ref: dict, got: dict) -> tuple[float, float, int, float]:
    a, b = ref["latents"].double(), got["latents"].double()
    lat_abs = (a - b).abs().max().item()
    fr_abs = (ref["frames"].int() - got["frames"].int()).abs().max().item()
    return lat_abs, lat_abs / max(a.abs().max().item(), 1e-30), fr_abs, fr_abs / 255.0


def run_parity(args) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            print(
                f"ithaca parity: error: unknown mode {m!r}; choose from {', '.join(MODES)}", file=sys.stderr
            )
            return 2
    if not _preflight(args, "parity"):
        return 2
    exact_tol = args.tol if args.tol is not None else EXACT_TOL[args.dtype]
    common = _common_argv(args)
    rows: list[ParityRow] = []
    # A run takes tens of seconds: each row prints as its run ends. With --json the table is progress on
    # stderr and stdout holds only the JSON document.
    table = _Table(sys.stderr if args.json else sys.stdout)
    with tempfile.TemporaryDirectory(prefix="ithaca-parity-") as tmp:
        start = time.perf_counter()
        ref, err = _launch(common, 1, Path(tmp) / "reference.pt")
        if ref is None:
            print(f"ithaca parity: the 1-rank reference run failed: {err}", file=sys.stderr)
            return 1
        reference = ParityRow("reference", 1, "1x1x1", "alltoall", "ok", seconds=time.perf_counter() - start)
        table.print(reference)
        for mode in modes:
            layout = _mode_layout(mode, args.nproc)
            if isinstance(layout, str):
                rows.append(ParityRow(mode, args.nproc, "-", "-", "skipped", note=layout))
                table.print(rows[-1])
                continue
            u, r, c, comm = layout
            tol = args.fp8_tol if "fp8" in comm else exact_tol
            row = ParityRow(mode, args.nproc, f"{u}x{r}x{c}", comm, "error", tol=tol)
            argv = [*common, "--ulysses", str(u), "--ring", str(r), "--cfg", str(c), "--comm", comm]
            start = time.perf_counter()
            got, err = _launch(argv, args.nproc, Path(tmp) / f"{mode}.pt")
            row.seconds = time.perf_counter() - start
            if got is None:
                row.note = err
            else:
                row.latents_max_abs, row.latents_rel, row.frames_max_abs, row.frames_rel = _compare(ref, got)
                frames_ok = "fp8" in comm or row.frames_max_abs <= FRAME_TOL_EXACT
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
        report = {"ok": not bad, "dtype": args.dtype, "reference_seconds": reference.seconds}
        print(json.dumps({**report, "rows": [asdict(r) for r in rows]}, indent=2))
    return 1 if bad else 0


class _Table:
    """Parity rows printed one at a time under a header, in fixed-width columns (the note comes last)."""

    # (heading, width): wide enough for "reference", "alltoall", "1.23e-05", "1234.5 s"
    COLUMNS = (("mode", 9), ("ranks", 5), ("u x r x c", 9), ("comm", 8), ("latents max abs", 15),
               ("latents rel", 11), ("frames max abs", 14), ("frames rel", 10), ("tol", 8), ("time", 8),
               ("result", 0))  # fmt: skip

    def __init__(self, out):
        self.out = out
        self._line(head for head, _ in self.COLUMNS)

    def print(self, r: ParityRow) -> None:
        def fmt(v):
            return "-" if v is None else (str(v) if isinstance(v, int) else f"{v:.2e}")

        seconds = "-" if r.seconds is None else f"{r.seconds:.1f} s"
        self._line((r.mode, str(r.ranks), r.layout, r.comm, fmt(r.latents_max_abs), fmt(r.latents_rel),
                    fmt(r.frames_max_abs), fmt(r.frames_rel), fmt(r.tol), seconds,
                    f"{r.status} {r.note}".strip()))  # fmt: skip

    def _line(self, cells) -> None:
        line = "  ".join(cell.ljust(w) for cell, (_, w) in zip(cells, self.COLUMNS, strict=True))
        print(line.rstrip(), file=self.out, flush=True)
