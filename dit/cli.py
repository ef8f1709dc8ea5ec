"""`ithaca generate` (one video, any layout: one rank, N of this machine, or under torchrun), and the
pipeline's subcommands for `ithaca` (`server.cli`): generate and `ithaca parity` (dit.parity)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from dit.cli_args import (
    HelpFormatter,
    Interrupted,
    add_model_args,
    add_request_args,
    checked,
    found_model,
    pipeline_config,
    request,
    run_on_ranks,
    say_error,  # fmt: skip
    sigterm_as_interrupt,
    tells_the_end,
    typed,
)
from dit.files import check_folder, check_name
from dit.parity import add_parity
from parallel.local_group import launched
from parallel.plan import parse_degree


def add_subcommands(subparsers) -> None:
    g = subparsers.add_parser(
        "generate", help="generate one video and write it as MP4", formatter_class=HelpFormatter
    )
    add_request_args(g)
    g.add_argument("--out", default="video.mp4", help="MP4 file to write")
    add_model_args(g, "generate")
    # no degree given: all auto (parallel.plan's rule, `ithaca plan` shows it); some: the others as before
    g.add_argument(
        "--ulysses",
        type=typed(parse_degree),
        default=None,
        help="Ulysses degree or auto (default: auto; with --ring/--cfg given: the ranks left over)",
    )
    g.add_argument(
        "--ring",
        type=typed(parse_degree),
        default=None,
        help="ring attention degree or auto (default: auto; else 1)",
    )
    g.add_argument(
        "--cfg",
        type=typed(parse_degree),
        default=None,
        help="1 | 2 (2: prompt and negative prompt in parallel) | auto (default: auto; else 1)",
    )
    g.add_argument(
        "--nproc", type=int, default=1, help="re-launch as N ranks on this machine (a GPU each, or CPU)"
    )
    g.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="under torchrun across machines: this machine's number, 0 to NNODES-1 (node 0 holds rank 0, "
        "which writes the video; the ranks are numbered by it, as `ithaca serve` numbers them)",
    )
    g.add_argument("--save-latents", default=None, help="also torch.save the final latents and frames here")
    g.set_defaults(func=run_generate)
    add_parity(subparsers)


def partial_out(path: str) -> Path:
    """The hidden name the video is written under until done: a run that fails or is stopped leaves the
    --out it found."""
    return Path(path).with_name(f".{Path(path).stem}.partial.mp4")


def check_out(path: str) -> None:
    """ValueError for an --out the MP4 writer cannot write, found before the model loads rather than after
    the whole run. Its folder is made by the writer: a run that fails first leaves none."""
    out = Path(path)
    if out.name.lower() == ".mp4":  # a hidden file's name, with no suffix: "give a name ending in .mp4"
        raise ValueError(f"--out {path}: give the video a name before .mp4")
    if out.suffix.lower() != ".mp4":
        raise ValueError(f"--out {path}: the video is an MP4; give a file name ending in .mp4")
    check_name("--out", out, partial_out(path).name)
    if out.is_dir():
        raise ValueError(f"--out {path} is a folder; give a file name ending in .mp4")
    check_folder(f"--out {path}", out.parent, make=False)


def check_latents(path: str | None, out: str) -> None:
    """ValueError for a --save-latents file that cannot be written, found before the run (torch.save would
    fail after it, and the video with it), or that is the video's own file (the latents took its place and
    the run said it wrote the video)."""
    if path is None:
        return
    check_name("--save-latents", path)
    if Path(path).is_dir():
        raise ValueError(f"--save-latents {path} is a folder; give a file name")
    if Path(path).resolve() == Path(out).resolve():
        raise ValueError(f"--save-latents {path} is the video's own file (--out); give another")
    check_folder(f"--save-latents {path}", Path(path).parent, make=False)


def run_generate(args) -> int:
    from parallel.launch import check_node_rank

    if not found_model(args, "generate"):
        return 2
    config = pipeline_config(args)
    if not checked(args, "generate", config, ulysses=args.ulysses, ring=args.ring, cfg=args.cfg):
        return 2
    try:
        check_node_rank(args.node_rank)  # before the model loads; the ranks are numbered by it later
        if os.environ.get("RANK", "0") == "0":  # the one that writes (across machines, node 0's)
            check_out(args.out)
            check_latents(args.save_latents, args.out)
    except ValueError as e:
        say_error("generate", e)
        return 2
    if args.nproc > 1 and not launched():
        before = _stamp(args.out)
        try:
            return run_on_ranks(args.nproc, sys.argv[1:]).returncode  # the ranks see WORLD_SIZE: no re-launch
        except Interrupted as stop:  # said here: ranks stopped while starting say nothing
            if stop.done or _stamp(args.out) != before:  # too late to stop: the video is in place
                said = f"interrupted once the video was written ({args.out})"
                print(f"ithaca generate: {said}", file=sys.stderr)
                return 0
            print(f"ithaca generate: {INTERRUPTED}", file=sys.stderr)
            return stop.code
    # SIGTERM (a rank's launcher passes Ctrl-C on as one) cleans up as Ctrl-C does: no partial video left
    try:
        with sigterm_as_interrupt():
            return _generate(args, config)
    except KeyboardInterrupt as stop:  # the partial video is gone (Mp4Writer); no traceback for a Ctrl-C
        if tells_the_end():
            print(f"ithaca generate: {INTERRUPTED}", file=sys.stderr)
        return getattr(stop, "code", 130)  # SIGTERM's 143 (it said 130 of every signal)


INTERRUPTED = "interrupted; no video written"


def _stamp(path: str) -> tuple[int, int] | None:
    """The file at `path` as its inode and modification time (the video goes in by a rename), or None."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _generate(args, config) -> int:
    """One rank's run of `generate` (all of it on one rank)."""

    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    from dit.failures import GenerationFailed
    from dit.request import unused_negative_prompt
    from dit.shape import request_video
    from dit.startup import start
    from dit.video import Mp4Writer, VideoNotWritten
    from dit.vocabulary import prompt_warnings, read_vocabulary

    def report(choice) -> None:  # global rank 0, before the model loads
        if choice.reason != "as given":
            print(choice.line(), file=sys.stderr)
        if choice.layout.ulysses == 1 and config.comm not in ("alltoall", "auto"):  # it ran exact, unsaid
            say = f"--comm {config.comm} is Ulysses' exchange, and this layout has none (ulysses 1): unused"
            print(f"ithaca generate: warning: {say}", file=sys.stderr)
        said = unused_negative_prompt(asked.negative_prompt, asked.guidance_scale, asked.guidance_scale_2)
        for warning in prompt_warnings(args.prompt, read_vocabulary(config.model)) + said:
            print(f"ithaca generate: warning: {warning}", file=sys.stderr)

    try:
        try:  # across machines: rank 0 on node 0; every machine gives its own node number and the same layout
            asked = request(args)
            started = start(config, args.ulysses, args.ring, args.cfg, node_rank=args.node_rank,
                            report=report, video=request_video(asked))  # fmt: skip
        except ValueError as e:
            say_error("generate", e)
            return 2
        mesh, pipe = started.mesh, started.pipe
        leader = mesh.rank == 0
        if started.probe is not None and leader:
            print(f"exchange: {started.probe.summary()}", file=sys.stderr)
        try:
            req = pipe.validate(asked)
        except ValueError as e:
            say_error("generate", e)
            return 2
        start_s = time.perf_counter()
        try:  # a failure of the video's own (a float16 decode that overflows) is every rank's, and one line
            # its line ends before any other is said: a Ctrl-C's came after the bar, which it then drew again
            steps = req.num_inference_steps
            with tqdm(total=steps, desc="denoising", unit="step", disable=not leader) as bar:
                latents = pipe.denoise(req, callback=lambda step, total: bar.update(1))
            # every rank decodes a band; rank 0 gets the frames and encodes each chunk as it comes (a
            # failure removes the file)
            partial = partial_out(args.out)
            with Mp4Writer(partial, req.height, req.width, req.fps) if leader else nullcontext() as writer:
                frames = pipe.decode(latents, writer.write if leader else None)
            if leader:
                os.replace(partial, args.out)
        except (GenerationFailed, VideoNotWritten) as e:
            if leader:
                print(f"ithaca generate: error: {e}", file=sys.stderr)
            return 1
        if leader:
            if args.save_latents:
                Path(args.save_latents).parent.mkdir(parents=True, exist_ok=True)
                torch.save({"latents": latents.cpu(), "frames": torch.from_numpy(frames)}, args.save_latents)
            n, h, w, _ = frames.shape
            layout = f"ulysses {mesh.ulysses_size} x ring {mesh.ring_size} x cfg {mesh.cfg_size}"
            if mesh.ulysses_size > 1:  # the exchange it used (fp8 moves the latents: it was not said)
                layout += f" over {pipe.config.comm}"
            seconds = time.perf_counter() - start_s
            stats, cached = pipe.evaluations, ""
            if req.cache != "off":
                cached = f", {stats.skipped} of {stats.evaluated + stats.skipped} evaluations skipped"
            steps, ranks = req.num_inference_steps, mesh.world_size
            print(
                f"wrote {args.out}: {n} frames {w}x{h} @ {req.fps} fps, "
                f"{steps} step{'s' * (steps > 1)}{cached}, {layout} ({ranks} rank{'s' * (ranks > 1)}), "
                f"{seconds:.1f} s"
            )
        return 0
    finally:
        if dist.is_initialized() and launched():
            dist.destroy_process_group()
