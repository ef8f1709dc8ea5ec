"""What `ithaca generate` and `ithaca parity` share: the request's flags, the model's and the pipeline's
(these derived from `dit.settings.PipelineConfig`), the checks before any rank starts, the launch on N
ranks."""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from dit.cache_config import CacheConfig
from dit.settings import MODEL_PATH_HELP, PRESET_HELP, PipelineConfig, flag, options
from parallel.local_group import check_start_folder, launched, local_group, world_size
from parallel.parent_death import with_parent

# request flag → GenerationRequest field (the prompt apart: positional in generate, --prompt in parity)
REQUEST = {"negative_prompt": "negative_prompt", "frames": "num_frames", "height": "height", "width": "width",
           "steps": "num_inference_steps", "guidance": "guidance_scale", "guidance_2": "guidance_scale_2",
           "seed": "seed", "fps": "fps", "cache": "cache"}  # fmt: skip


def in_flags(message: str) -> str:
    """A request check's message (it names GenerationRequest's fields, as the HTTP API's body does) in the
    command line's words: the fields it begins with ("fps must be ...", "height and width must be ...",
    "image: ...") and field names no sentence has (num_frames → --frames, guidance_scale → --guidance)
    wherever they are; a plain word elsewhere ("the Hugging Face cache") stays."""
    flags = {name: "--" + dest.replace("_", "-") for dest, name in (*REQUEST.items(), ("image", "image"))}
    message = re.sub(
        r"^\w+(?: and \w+)?(?=[ :])",
        lambda m: " and ".join(flags.get(word, word) for word in m.group(0).split(" and ")),
        message,
    )
    for name, named in flags.items():
        if "_" in name:
            message = re.sub(rf"(?<![-\w]){name}\b", named, message)
    return message


def say_error(command: str, e: Exception) -> None:
    """`e` as the command's one error line on stderr, in the command line's words, from global rank 0 alone
    (each launched rank meets the same mistake)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"ithaca {command}: error: {in_flags(str(e))}", file=sys.stderr)


def tells_the_end() -> bool:
    """Whether this process says that the command was interrupted: not a rank of the command's own launch
    (the command says it, once: at --nproc 8 nine lines came of ranks stopped while they started), nor any
    rank but global rank 0 of a launch by hand."""
    return os.environ.get("RANK", "0") == "0" and "ITHACA_LOCAL_GROUP" not in os.environ


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where the help says what leaving it out does (default
    None), for off-by-default switches, and for empty text (it read "(default: )")."""

    def _get_help_string(self, action):
        if action.default in (None, False, ""):
            return action.help
        return super()._get_help_string(action)


def typed(parse):
    """`parse(text)` as an argparse type: its ValueError is argparse's one-line message after the flag."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def add_model_args(p: argparse.ArgumentParser, command: str) -> None:
    """--model-path or --preset (`PipelineConfig.model`), then the pipeline settings `command` takes."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-path", help=MODEL_PATH_HELP)
    src.add_argument("--preset", default="tiny", help=PRESET_HELP)
    # Allowed values are checked by dit.preflight, against the lists the pipeline and parallel/ use.
    p.set_defaults(settings_of=command)
    for f in options(command):
        meta, kind = f.metadata, str(f.type)
        kwargs = dict(dest=f.name, default=f.default, help=meta["help"], metavar=meta["metavar"])
        if kind == "bool":
            p.add_argument(flag(f), action="store_true", dest=f.name, help=meta["help"])
        elif meta["item"] is not None:
            p.add_argument(flag(f), **kwargs | dict(action="append", type=typed(meta["item"]), default=None))
        else:
            p.add_argument(flag(f), **kwargs, type=float if kind.startswith("float") else str)


def pipeline_config(args: argparse.Namespace) -> PipelineConfig:
    """The settings the arguments ask for. No previews: no one watches this run's (and the VAE is not
    decoded at load to fit their colour map)."""
    fields = options(args.settings_of)
    settings = {f.name: getattr(args, f.name) for f in fields}
    settings |= {f.name: tuple(settings[f.name] or ()) for f in fields if f.metadata["item"]}
    return PipelineConfig(model=args.model_path or args.preset, preview_every=0, **settings)


def pipeline_argv(args: argparse.Namespace) -> list[str]:
    """The model's and the pipeline's flags that give `args`' settings."""
    argv = ["--model-path", args.model_path] if args.model_path else ["--preset", args.preset]
    for f in options(args.settings_of):
        value = getattr(args, f.name)
        if f.metadata["item"] is not None:
            argv += [x for item in value or () for x in (flag(f), f.metadata["item_text"](item))]
        elif value is True:
            argv.append(flag(f))
        elif value is not None and value is not False:
            argv += [flag(f), str(value)]
    return argv


def add_request_args(p: argparse.ArgumentParser, prompt_default: str | None = None) -> None:
    if prompt_default is None:
        p.add_argument("prompt", help="what the video shows")
    else:
        p.add_argument("--prompt", default=prompt_default, help="what the video shows")
    p.add_argument(
        "--negative-prompt", default="", help="what it should not show (guidance > 1); none if left out"
    )
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
    p.add_argument("--seed", type=int, default=0, help="the initial noise depends on it alone (default: 0)")
    p.add_argument(
        "--image",
        default=None,
        help="first frame of an image-to-video model: a PNG, JPEG or WebP file (scaled to cover the video "
        "and centre-cropped)",
    )
    p.add_argument(
        "--cache",
        default=None,
        type=typed(CacheConfig.checked),  # before any rank starts
        help="step caching: off | fbcache[:THRESHOLD] (skips most of the DiT at steps where its first "
        "block's output barely moved; default off)",
    )
    p.add_argument(
        "--fps", type=int, default=None, help="frames per second of the MP4 (default: the model's)"
    )


def request(args: argparse.Namespace):
    """The request the arguments ask for, its --image file read (ValueError naming the flag)."""
    from dit.request import GenerationRequest

    image = None if args.image is None else read_image(args.image)
    return GenerationRequest(
        args.prompt, image=image, **{field: getattr(args, dest) for dest, field in REQUEST.items()}
    )


@functools.cache  # read once: the checks before the run and the run take the same pixels (a pipe reads once)
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


def request_argv(args: argparse.Namespace) -> list[str]:
    """`generate`'s arguments that ask for the same request as `args` (its image file included), to go
    last: `--flag=VALUE` and the prompt after `--`, so a text that starts with "-" stays text."""
    argv = []
    for dest in (*REQUEST, "image"):
        if getattr(args, dest) is not None:
            argv.append(f"--{dest.replace('_', '-')}={getattr(args, dest)}")
    return [*argv, "--", args.prompt]


def found_model(args, command: str) -> bool:
    """Whether the model can be had: a Hub name given as --model-path becomes its cached folder
    (downloaded if need be, `dit.hub`); if not, the one line why goes to stderr (from rank 0 alone)."""
    from dit.hub import local_model

    try:
        args.model_path = local_model(args.model_path)
    except ValueError as e:
        say_error(command, e)
        return False
    return True


def checked(args, command: str, config: PipelineConfig, *, ulysses=None, ring=1, cfg=1) -> bool:
    """Whether dit.preflight accepts the settings; if not, its one line goes to stderr (from rank 0 alone)."""
    from dit.preflight import preflight
    from dit.request import check_prompts

    # Launched (by us, or by hand under torchrun) the ranks are already there: check against their count.
    nproc = world_size() or args.nproc
    try:
        if nproc > 1 and not launched():
            check_start_folder(PACKAGES)
        asked = check_prompts(request(args))  # a blank one, before the model loads (its length needs it)
        preflight(config, model_path=args.model_path, nproc=nproc,
                  local_nproc=int(os.environ.get("LOCAL_WORLD_SIZE", nproc)), ulysses=ulysses, ring=ring,
                  cfg=cfg, request=asked)  # fmt: skip
    except ValueError as e:
        say_error(command, e)
        return False
    return True


PACKAGES = ("dit", "parallel", "server")  # what a rank imports of Ithaca's own


def on_ranks(nproc: int, argv: list[str]) -> list[str]:
    """`ithaca ARGV` on `nproc` ranks of this machine."""
    return [*local_group(nproc), "-m", "server.cli", *argv]


class Interrupted(KeyboardInterrupt):
    """A signal that stops the command (Ctrl-C's SIGINT, SIGTERM, SIGHUP); `code`: 128 + its number, as a
    shell reports a process it ended. `done`: what it stopped had finished its work all the same."""

    def __init__(self, signum: int, done: bool = False):
        super().__init__(signum)
        self.code, self.done = 128 + signum, done


def _interrupt(signum, _frame):
    raise Interrupted(signum)


@contextmanager
def sigterm_as_interrupt():
    """Inside, SIGTERM stops the command as Ctrl-C does (`Interrupted`): cleanup runs, no traceback. Only
    on the main thread, where Python runs signal handlers (tests call commands from others)."""
    on_main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
    try:
        yield
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def run_on_ranks(nproc: int, argv: list[str], capture: bool = False) -> subprocess.CompletedProcess:
    """`ithaca ARGV` on `nproc` ranks of this machine, waited for (`run_forwarding`)."""
    return run_forwarding(on_ranks(nproc, argv), capture)


def run_forwarding(command: list[str], capture: bool = False) -> subprocess.CompletedProcess:
    """`command` waited for (`capture`: its output as text). SIGINT, SIGTERM and SIGHUP to this process go
    on to it (a launcher then stops every rank and waits for them, so no rank outlives the command;
    subprocess.run would SIGKILL it on Ctrl-C, and ranks, each in a session of its own, would run on), and
    once it has ended raise `Interrupted` here: the command stops too."""
    pipe = subprocess.PIPE if capture else None
    heard = []
    # it dies with this process, even of a SIGKILL (and its ranks with it: parallel.local_group)
    with subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, **with_parent()) as child:

        def forward(signum, _frame):
            heard.append(signum)
            child.send_signal(signum)

        before = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            out, err = child.communicate()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
    if heard:
        raise Interrupted(heard[0], done=child.returncode == 0)
    code = child.returncode  # a signal's death as a shell reports it (-9: 137, not 247 once returned)
    return subprocess.CompletedProcess(child.args, 128 - code if code < 0 else code, out, err)
