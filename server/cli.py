"""`ithaca` command line: the pipeline's subcommands (generate, parity) from dit.cli, plus `serve`."""

from __future__ import annotations

import argparse
import importlib
import sys

from server import config as config_mod
from server import logs
from server.store_file import StoreError


def serve(args: argparse.Namespace) -> int:
    """Run the HTTP API under uvicorn, with a supervised worker group unless --no-workers."""
    import uvicorn

    from server.app import create_app

    try:
        config = config_mod.from_args(args)  # an ITHACA_* value of the wrong type
        if config.workers:  # a group started apart (--no-workers) checks its own settings
            _preflight(config)
    except ValueError as e:
        print(f"ithaca serve: error: {e}", file=sys.stderr)
        return 2
    holder: dict = {}
    try:
        logs.setup(config.log_level, config.log_format)
        app = create_app(config, on_fatal=lambda: setattr(holder["server"], "should_exit", True))
    except (ValueError, StoreError) as e:  # a bad log setting; a jobs.db that is damaged or not ours
        print(f"ithaca serve: error: {e}", file=sys.stderr)
        return 2
    server = holder["server"] = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            timeout_graceful_shutdown=5,
            access_log=False,
            log_config=None,  # uvicorn's lines go through the handler `logs.setup` installed
        )
    )
    server.run()
    supervisor = app.state.services.supervisor
    if supervisor is not None and supervisor.fatal:
        print(f"ithaca serve: {supervisor.fatal}", file=sys.stderr)
        return 1  # a non-zero exit lets the container's restart policy start us again
    return 0


def _preflight(config: config_mod.ServeConfig) -> None:
    """The worker group's settings, checked before it starts (ValueError: one line naming the option)."""
    from dit.preflight import preflight

    # ServeConfig names these fields as preflight names its arguments
    checked = ("model_path", "preset", "device", "dtype", "attn_backend", "comm", "sampler", "timesteps",
               "text_encoder_device", "nproc", "ulysses", "ring", "cfg", "loras")  # fmt: skip
    preflight(**{name: getattr(config, name) for name in checked})


class _Parser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr and exit code 2 (subcommand parsers inherit this class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
