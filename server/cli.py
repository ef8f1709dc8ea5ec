"""`ithaca` command line: the pipeline's subcommands (generate, parity) from dit.cli, plus `serve`."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import ipaddress
import logging
import os
import sys
import textwrap

from dit.cli_args import PACKAGES, sigterm_as_interrupt, tells_the_end
from dit.hub import local_model
from parallel.local_group import check_start_folder
from server import config as config_mod
from server import logs
from server.store import StoreError

log = logging.getLogger("ithaca.server")


def serve(args: argparse.Namespace) -> int:
    """Run the HTTP API under uvicorn, with a supervised worker group unless --no-workers."""
    import uvicorn

    from server.app import create_app
    from server.http_server import ClosingServer

    choice = None
    try:
        config = config_mod.from_args(args)  # an ITHACA_* value of the wrong type
        config.check_nodes()
        if config.api:
            _check_port(config.host, config.port)
        if config.workers or not config.api:  # a group started apart (--no-workers) checks its own settings
            check_start_folder(PACKAGES)
            # a Hub name: its cached folder is what the ranks load
            config = dataclasses.replace(config, model_path=local_model(config.model_path))
            _preflight(config)
            choice = _layout(config)
            layout = choice.layout  # the workers get the degrees resolved, not "auto"
            config = dataclasses.replace(config, ulysses=layout.ulysses, ring=layout.ring, cfg=layout.cfg)
        config.check_folders()  # last: it makes them, and a mistake above leaves no folder behind
    except ValueError as e:  # the log format asked for, unless it is the mistake
        message = f"ithaca serve: error: {config_mod.with_variables(str(e), args)}"
        logs.last_line(message, _log_format(getattr(args, "log_format", None)))
        return 2
    if not config.api:
        return _serve_node_share(config, choice)
    holder: dict = {}
    try:
        logs.setup(config.log_level, config.log_format)
        app = create_app(config, on_fatal=lambda: holder["server"].stop())
    except (ValueError, StoreError) as e:  # a store URL of no known kind; a jobs.db damaged or not ours
        logs.last_line(f"ithaca serve: error: {e}", config.log_format)
        return 2
    if choice is not None:  # once the store opened: a damaged one ends serve with its one line alone
        log.info("%s", choice.line())
    if not config.api_key and not _loopback(config.host):  # an empty ITHACA_API_KEY is none: said, not silent
        log.warning("no API key (--api-key, ITHACA_API_KEY): every route is open to whoever reaches %s:%d",
                    config.host, config.port)  # fmt: skip
    supervisor = app.state.services.supervisor
    server = holder["server"] = ClosingServer(
        app.state.services.closing,
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            timeout_graceful_shutdown=5,
            access_log=False,
            log_config=None,  # uvicorn's lines go through the handler `logs.setup` installed
        ),
        hurry=supervisor.hurry if supervisor is not None else lambda: None,
        drain=(lambda: supervisor.stop(config.shutdown_grace)) if supervisor is not None else None,
    )
    server.run()
    if supervisor is not None and supervisor.fatal:
        logs.last_line(f"ithaca serve: {supervisor.fatal}", config.log_format)
        return 1  # a non-zero exit lets the container's restart policy start us again
    return 0


def _check_port(host: str, port: int) -> None:
    """ValueError when the API's address cannot be bound (a port in use): found before the worker group
    starts and loads the model, not after. SO_REUSEADDR as uvicorn binds, so a port in TIME_WAIT passes."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        raise ValueError(f"--host {host} --port {port}: {e.strerror or e}") from None


def _serve_node_share(config: config_mod.ServeConfig, choice) -> int:
    """`--no-api`: this node's share of a group across machines, until SIGTERM/SIGINT (no API, no store)."""
    import signal

    from server.supervisor import NodeShare

    logs.setup(config.log_level, config.log_format)  # both checked as they were read (server.config)
    log.info("%s", choice.line())
    log.info("node %d of %d: %d ranks of the group, rendezvous at %s (no API on this node)",
             config.node_rank, config.nnodes, config.nproc, config.rdzv_endpoint)  # fmt: skip
    share = NodeShare(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: share.stop())
    share.run()
    if share.fatal:
        logs.last_line(f"ithaca serve: {share.fatal}", config.log_format)
        return 1
    log.info("stopped")
    return 0


def _preflight(config: config_mod.ServeConfig) -> None:
    """The worker group's settings, checked before it starts (ValueError: one line naming the option)."""
    from dit.preflight import preflight

    preflight(config.pipeline, model_path=config.model_path, nproc=config.world_size,
              local_nproc=config.nproc, ulysses=config.ulysses, ring=config.ring, cfg=config.cfg)  # fmt: skip


def _layout(config: config_mod.ServeConfig):
    """The worker group's layout: `--nproc` ranks on each of `--nnodes` machines, auto degrees resolved for
    the model (Ulysses within a machine, the ring across them). A group across machines is one replica: its
    leader, the one rank that uses the job store, is on node 0."""
    from dit.shape import plan_layout

    choice = plan_layout(config.model, config.world_size, node=config.nproc, ulysses=config.ulysses,
                         ring=config.ring, cfg=config.cfg, sampler=config.sampler,
                         timesteps=config.timesteps)  # fmt: skip
    layout = choice.layout
    if config.nnodes > 1 and layout.sp * layout.cfg != config.world_size:
        raise ValueError(
            f"--nnodes {config.nnodes}: a group across machines is one replica, so ulysses × ring × cfg must "
            f"be its {config.world_size} ranks ({config.nnodes} × --nproc {config.nproc}), not "
            f"{layout.ulysses} × {layout.ring} × {layout.cfg}"
        )
    return choice


def plan(args: argparse.Namespace) -> int:
    """Print every layout of --nproc ranks with its bytes and modelled step time, marking auto's choice."""
    from dit.cli_args import in_flags
    from dit.preflight import preflight
    from dit.request import GenerationRequest
    from dit.shape import model_shape
    from parallel import plan as plan_mod

    node = args.nproc if args.nproc_per_node is None else args.nproc_per_node
    try:
        args.model_path = local_model(args.model_path)
        video = GenerationRequest("", num_frames=args.frames, height=args.height, width=args.width,
                                  guidance_scale=args.guidance, guidance_scale_2=args.guidance_2)  # fmt: skip
        preflight(model_path=args.model_path, preset=args.preset, device="cpu", nproc=args.nproc,
                  request=video, planned=True)  # fmt: skip
        if node < 1:
            raise ValueError(f"--nproc-per-node must be a positive integer, got {node}")
        if args.nproc % node:
            raise ValueError(f"--nproc-per-node {node} does not divide --nproc {args.nproc}")
        shape = model_shape(args.model_path or args.preset, frames=args.frames, height=args.height,
                            width=args.width, guidance=args.guidance, guidance_2=args.guidance_2)  # fmt: skip
    except ValueError as e:
        print(f"ithaca plan: error: {in_flags(str(e))}", file=sys.stderr)
        return 2
    links = plan_mod.Links()
    choice = plan_mod.choose(args.nproc, shape, node=node, links=links)
    forward = plan_mod.estimated_forward(shape)
    nodes = args.nproc // node
    print(
        f"{shape.name}: {shape.tokens} tokens, {shape.heads} heads × {shape.head_dim}, "
        f"{shape.layers} layers, {'guided' if shape.guided else 'unguided'}; {args.nproc} rank"
        + "s" * (args.nproc > 1)
        + (f" on {nodes} nodes of {node}" if nodes > 1 else "")
    )
    assumed = (
        f"MODELLED, not measured: one GPU's forward {forward:.3g} s, the Wan2.1-14B forward measured on an "
        f"H100 in bf16 ({plan_mod.REFERENCE_SECONDS} s at {plan_mod.REFERENCE.tokens} tokens, "
        f"bench/RESULTS.md) scaled by FLOPs; compute split over the sp ranks (attention by heads: the "
        f"slowest rank does ⌈H/U⌉), but every rank repeats the {shape.text_tokens} text tokens' own work; "
        f"communication not overlapped; links {links.describe()}, per direction."
    )
    print(textwrap.fill(assumed, 110))
    heads = ("", "ulysses", "ring", "cfg", "heads/rank", "GB/step/rank", "compute s/step", "comm s/step",
             "s/step")  # fmt: skip
    rows = []
    for e in plan_mod.table(args.nproc, shape, node=node, links=links, forward_s=forward):
        lay = e.layout
        forwards = 2 if shape.guided and lay.cfg == 1 else 1
        mark = "*" if lay == choice.layout else ""
        if e.step_s is None:
            timing = ("-", "-", "n/a")
        else:
            comm = e.step_s - forwards * e.compute_s
            timing = (f"{forwards * e.compute_s:.3g}", f"{comm:.3g}", f"{e.step_s:.3g}")
        rows.append((mark, str(lay.ulysses), str(lay.ring), str(lay.cfg), str(e.heads_per_rank),
                     f"{e.bytes_per_step / 1e9:.3g}", *timing))  # fmt: skip
    widths = [max(len(r[i]) for r in (heads, *rows)) for i in range(len(heads))]
    for r in (heads, *rows):
        print("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if not shape.guided:
        print("n/a: CFG parallel needs guidance (the second half of the ranks would have nothing to do)")
    if args.nproc > shape.heads:
        print(f"Ulysses degrees above {shape.heads} heads are left out: a rank would own no head.")
    print(textwrap.fill(f"* auto picks {choice.line()}", 110))
    return 0


def _add_plan(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print every layout of N ranks with its modelled step time, marking the one auto picks",
        description="Every ulysses × ring × cfg layout of --nproc ranks (one replica) for the model's video: "
        "the bytes each rank sends per denoising step and the modelled step time; * marks the layout "
        "--ulysses/--ring/--cfg auto (the default) picks. Reads the model's configs only; loads no weights.",
    )
    p.add_argument("--nproc", type=int, required=True, help="ranks (GPUs)")
    p.add_argument("--nproc-per-node", type=int, default=None, help="ranks per machine (default: --nproc)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-path", help="a model folder (diffusers pipeline or transformer), or a Hub name")
    src.add_argument("--preset", default="tiny", help="a model name, e.g. wan2.1-14b (default: tiny)")
    p.add_argument("--frames", type=int, default=None, help="default: the model's")
    p.add_argument("--height", type=int, default=None, help="default: the model's")
    p.add_argument("--width", type=int, default=None, help="default: the model's")
    p.add_argument("--guidance", type=float, default=None, help="default: the model's (1: unguided)")
    p.add_argument("--guidance-2", type=float, default=None,
                   help="a two-expert model's low-noise expert's (default: --guidance)")  # fmt: skip
    p.set_defaults(func=plan)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _log_format(flag: str | None) -> str | None:
    """The log format asked for, `--log-format` else ITHACA_LOG_FORMAT, as given: the format of a line said
    before, or instead of, reading the settings."""
    return flag or os.environ.get(config_mod.env_name("log_format"))


class _Parser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr and exit code 2 (subcommand parsers inherit this class); in the
    log's format where `log_format` is set (serve's, from its command line: the settings are not read)."""

    log_format: str | None = None

    def error(self, message: str):
        logs.last_line(f"{self.prog}: error: {message} (see {self.prog} --help)", self.log_format)
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """`ithaca` and its subcommands."""
    parser = _Parser(prog="ithaca", description="Text-to-video generation with sequence parallelism")
    subparsers = parser.add_subparsers(dest="command", required=True)
    try:
        dit_cli = importlib.import_module("dit.cli")
    except ModuleNotFoundError as e:
        if e.name != "dit.cli":
            raise
    else:
        dit_cli.add_subcommands(subparsers)
    serve_parser = subparsers.add_parser(
        "serve",
        help="serve the HTTP API with a worker group",
        description="Every flag can also be set as ITHACA_<FLAG> in the environment (e.g. ITHACA_NPROC=8).",
    )
    config_mod.add_arguments(serve_parser)
    serve_parser.set_defaults(func=serve)
    _add_plan(subparsers)
    parser.commands = subparsers.choices
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    flag = next((v for k, v in zip(given, given[1:], strict=False) if k == "--log-format"), None)
    flag = next((a.partition("=")[2] for a in given if a.startswith("--log-format=")), flag)
    parser.commands["serve"].log_format = _log_format(flag)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said as the command's: its --help lists its flags (`ithaca --help` only the commands)
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        # SIGTERM as Ctrl-C (serve's start-up, before uvicorn takes the signals: it ended serve in silence)
        with sigterm_as_interrupt():
            return args.func(args) or 0
    except KeyboardInterrupt as stop:  # before a command's own handling (its checks, the model's look-up)
        if tells_the_end():
            logs.last_line(f"ithaca {args.command}: interrupted", parser.commands[args.command].log_format)
        return getattr(stop, "code", 130)  # SIGTERM's 143
    except BrokenPipeError:  # `ithaca plan ... | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit would fail too
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
