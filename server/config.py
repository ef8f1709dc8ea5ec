"""`ithaca serve` settings: one dataclass, each field a `--flag` that can also come from `ITHACA_<NAME>`, and
the pipeline's settings it holds (`dit.settings.PipelineConfig`: those `ithaca serve` takes, flags and
variables alike, with serve's defaults).

Precedence: command-line flag, then environment variable, then the default. Deployments set environment only;
the worker group receives the same settings as flags from its supervisor (`worker_argv`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import socket
from dataclasses import dataclass, field

from dit import settings
from dit.files import check_folder
from dit.image import ImageLimits
from dit.settings import PipelineConfig
from parallel.plan import parse_degree
from server import logs


def _opt(default, help: str, *, worker: bool = False, parse=None):
    """`parse(value)` checks a value as the flag or variable is read, after an int or float field's text is
    converted (ValueError: what is wrong)."""
    return field(default=default, metadata={"help": help, "worker": worker, "parse": parse})


def _checkpoint_every(text: str) -> str:
    if text not in ("auto", "off") and not (text.isdigit() and int(text) > 0):
        raise ValueError(f"must be auto, off or a number of steps, not {text!r}")
    return text


def _at_least(low, high=None):
    """A parse that refuses a number below `low` (or above `high`): a timeout of -1 or a queue of -5 would
    start a server that fails every job, or refuses every one."""

    def parse(number):
        if number < low or (high is not None and number > high):
            raise ValueError(f"must be {low} to {high}, not {number}" if high is not None
                             else f"must be {low} or more, not {number}")  # fmt: skip
        return number

    return parse


def _one_of(*choices: str):
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, not {text!r}")
        return text.lower()

    return parse


def _above(low: float):
    """A parse for a duration that must be longer than `low` seconds."""

    def parse(number: float) -> float:
        if number <= low:
            raise ValueError(f"must be more than {low}, not {number}")
        return number

    return parse


def _store_url(text: str) -> str:
    if not text.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ValueError(f"must be sqlite:///PATH or postgresql://USER@HOST:PORT/DB, not {text!r}")
    path = text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else None
    # SQLite would give each connection a database of its own (empty, :memory:), or a file named as the
    # query; a folder cannot be one
    if path is not None and (path == "" or _private(path) or path.endswith("/") or os.path.isdir(path)):
        raise ValueError(
            f"must name a file the server's processes share: sqlite:///PATH (relative) or "
            f"sqlite:////ABSOLUTE/PATH, no query, not {text!r}"
        )
    return text


def _private(path: str) -> bool:
    """Whether SQLite gives each connection a database of its own there: the API and every rank each had an
    empty one (a --db :memory: server logged a traceback a round, without end)."""
    return path == ":memory:" or "?" in path


def _db_file(text: str) -> str:
    _named(text)
    if _private(text):
        raise ValueError(f"must name a file the server's processes share, not {text!r}")
    return text


def _api_key(key: str) -> str:
    """A key no client can send was every request refused: HTTP drops a header's end spaces (a key of spaces
    alone too), and a header carries printable ASCII (a browser cannot set one of other characters)."""
    if key != key.strip():
        raise ValueError("has a space or tab at an end, which HTTP drops from headers: no client can send it")
    if not re.fullmatch(r"[\x20-\x7e]+", key):
        raise ValueError("must be printable ASCII (letters, digits, punctuation): a header carries no other")
    return key


def _named(text: str) -> str:
    """A name or path that must not be empty (an empty variable, ITHACA_DATA_DIR= say, is a slip)."""
    if not text.strip():
        raise ValueError(f"must not be empty, not {text!r}")
    return text


@dataclass
class ServeConfig:
    host: str = _opt("127.0.0.1", "address the HTTP API listens on")
    port: int = _opt(8000, "HTTP port", parse=_at_least(0, 65535))
    data_dir: str = _opt(
        "ithaca-data", "folder holding the job database and the videos", worker=True, parse=_named
    )
    db: str | None = _opt(None, "job database path (default DATA_DIR/jobs.db)", worker=True, parse=_db_file)
    store: str | None = _opt(
        None,
        "job store URL: sqlite:///PATH (one box), or postgresql://USER@HOST:PORT/DB shared by several "
        "servers (default sqlite:///DB, i.e. DATA_DIR/jobs.db)",
        worker=True,
        parse=_store_url,
    )
    results_dir: str | None = _opt(
        None, "folder for finished MP4s (default DATA_DIR/videos)", worker=True, parse=_named
    )
    # the model, by name or as a folder (the folder's when both are given): `pipeline.model`
    preset: str = _opt("tiny", settings.PRESET_HELP, worker=True)
    model_path: str | None = _opt(None, settings.MODEL_PATH_HELP, worker=True)
    nproc: int = _opt(
        2, "ranks in the worker group on this machine (its GPUs on a GPU box; per node)", parse=_at_least(1)
    )
    # degrees: an integer or "auto" (parallel.plan's rule); none given: all auto, else the others not given
    # are ulysses: what remains, ring 1, cfg 1
    ulysses: str | int | None = _opt(
        None, "Ulysses degree, or auto (default: auto; with other degrees given: what remains)", worker=True,
        parse=parse_degree,
    )  # fmt: skip
    ring: str | int | None = _opt(
        None,
        "ring degree, or auto (default: auto; with other degrees given: 1)",
        worker=True,
        parse=parse_degree,
    )
    cfg: str | int | None = _opt(
        None,
        "classifier-free-guidance parallel degree, 1, 2 or auto (default: auto; with other degrees given: 1)",
        worker=True,
        parse=parse_degree,
    )
    allow_lossy_comm: bool = _opt(False, "--comm auto may pick an FP8 exchange (lossy)", worker=True)
    comm_probe_timeout: float = _opt(
        60.0,
        "--comm auto: seconds one exchange's probe may take before it is ruled out",
        worker=True,
        parse=_above(0),
    )
    api_key: str | None = _opt(
        None, "require 'Authorization: Bearer KEY' on every route but /health (empty: none)", parse=_api_key
    )
    max_queue: int = _opt(64, "queued jobs beyond this are refused with 429", parse=_at_least(1))
    lora_patience: float = _opt(
        60.0,
        "--lora-dir: a replica takes a queued job of the LoRA set it has applied before older jobs of other "
        "sets while none has waited this many seconds, saving a switch (0: strictly the oldest first)",
        worker=True,
        parse=_at_least(0),
    )
    max_batch: int = _opt(
        1,
        "a replica runs up to this many queued jobs that can share every forward (dit.batch.batch_key) as "
        "one batch (1: one job at a time)",
        worker=True,
        parse=_at_least(1),
    )
    max_body_bytes: int = _opt(65536, "larger request bodies are refused with 413", parse=_at_least(1))
    max_image_bytes: int = _opt(
        ImageLimits.max_bytes,
        "image-to-video: larger input images are refused with 413",
        worker=True,
        parse=_at_least(1),
    )
    max_image_pixels: int = _opt(
        ImageLimits.max_pixels,
        "image-to-video: input images of more pixels are refused with 413, before they are decoded",
        worker=True,
        parse=_at_least(1),
    )
    store_busy_timeout: float = _opt(
        2.0,
        "seconds a request waits for another process's lock on the job store before it answers 503",
        parse=_above(0),
    )
    store_outage_grace: float = _opt(
        60.0,
        "seconds the supervisor and the workers retry a job store that does not answer (PostgreSQL "
        "restarting or unreachable, connections cut, a lock held) before a call gives up; a running job "
        "waits meanwhile",
        worker=True,
        parse=_at_least(0),
    )
    job_timeout: float = _opt(
        3600.0, "seconds a job may run before it fails and the group is reset", parse=_above(0)
    )
    keep_hours: float = _opt(
        0.0,
        "hours a finished job is kept, then deleted with its video, preview and input image as DELETE "
        "/v1/videos/ID deletes them (0: until a client deletes it)",
        parse=_at_least(0),
    )
    shutdown_grace: float = _opt(
        300.0, "seconds the running job may take to finish after SIGTERM", parse=_at_least(0)
    )
    instance: str = _opt(
        socket.gethostname(), "name of this server in a shared job store", worker=True, parse=_named
    )
    workers: bool = _opt(
        True, "start and supervise the worker group (--no-workers: attach to one started apart)"
    )
    # one worker group across machines (deploy/README.md, "One group across hosts")
    nnodes: int = _opt(1, "machines the worker group spans, each running --nproc ranks of its one replica")
    node_rank: int = _opt(
        0, "this machine's number, 0 to NNODES-1: node 0 runs the API and the replica leader, others --no-api"
    )
    rdzv_endpoint: str | None = _opt(
        None, "with --nnodes > 1: HOST:PORT of node 0's rendezvous (torchrun's c10d), the same on every node"
    )
    node_addr: str | None = _opt(
        None, "with --nnodes > 1: the address the other machines reach this one at (default: its hostname)"
    )
    api: bool = _opt(
        True, "serve the HTTP API (--no-api: a node other than 0, which only runs its share of the group)"
    )
    rdzv_timeout: float = _opt(
        600.0,
        "with --nnodes > 1: seconds a launch of the group waits for every machine to join it",
        parse=_above(0),
    )
    relaunch_backoff: float = _opt(
        1.0,
        "--no-api: seconds before this node launches its share again after it exited, doubled after each "
        "exit in a row that came within a minute of its launch (up to 60)",
        parse=_at_least(0),
    )
    relaunch_budget: int = _opt(
        5,
        "--no-api: exits in a row, each within a minute of its launch, before this node gives up (exit 1)",
        parse=_at_least(1),
    )
    max_attempts: int = _opt(
        2,
        "runs a job interrupted by a crash or a restart may get before it is failed (each resumes)",
        parse=_at_least(1),
    )
    checkpoint_every: str = _opt(
        "auto",
        "save a running job's denoising state every N steps, so an interrupted job resumes from it; auto: "
        "as often as keeps the saving under 1 % of the job's time (measured per save); off",
        worker=True,
        parse=_checkpoint_every,
    )
    restart_budget: int = _opt(
        3, "consecutive worker-group failures before the server exits", parse=_at_least(1)
    )
    orphan_timeout: float = _opt(
        60.0,
        "seconds without a worker heartbeat before its running job is re-queued (any server's)",
        parse=_above(0),
    )
    poll_interval: float = _opt(
        0.005,
        "seconds between a worker's queue polls in its first second without a job (then 50 ms)",
        worker=True,
        parse=_above(0),
    )
    pipeline_module: str = _opt(
        "dit.pipeline", "module providing load_pipeline (tests use a fake)", worker=True
    )
    log_level: str = _opt(
        "info", f"log level ({', '.join(logs.LEVELS)})", worker=True, parse=_one_of(*logs.LEVELS)
    )
    log_format: str = _opt(
        "text", "text, or json: one JSON object per line for log collectors", worker=True,
        parse=_one_of(*logs.FORMATS),
    )  # fmt: skip
    # every other pipeline setting (device, dtype, comm, sampler, ...), read as `config.device` too; its
    # model is `model_path or preset`
    pipeline: PipelineConfig = field(default_factory=lambda: serve_pipeline())

    def __post_init__(self):
        self.pipeline = dataclasses.replace(self.pipeline, model=self.model_path or self.preset)

    def __getattr__(self, name: str):  # only for names that are not the server's own
        if name in PIPELINE_NAMES and "pipeline" in self.__dict__:
            return getattr(self.pipeline, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def model(self) -> str:
        return self.pipeline.model

    @property
    def checkpoint_steps(self) -> int | None:
        """Steps between checkpoints: None off, 0 auto (dit.denoise_state.Checkpointing)."""
        every = self.checkpoint_every
        return None if every == "off" else 0 if every == "auto" else int(every)

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels)

    @property
    def db_path(self) -> str:
        """The SQLite file of the job store (that of an sqlite:/// --store, else --db or DATA_DIR/jobs.db)."""
        if self.store and self.store.startswith("sqlite:///"):
            return self.store.removeprefix("sqlite:///")
        return self.db or os.path.join(self.data_dir, "jobs.db")

    @property
    def store_url(self) -> str:
        return self.store or "sqlite:///" + self.db_path

    @property
    def videos_dir(self) -> str:
        return os.path.abspath(self.results_dir or os.path.join(self.data_dir, "videos"))

    @property
    def world_size(self) -> int:
        """Ranks in the worker group: --nproc on each of --nnodes machines."""
        return self.nproc * self.nnodes

    def check_folders(self) -> None:
        """ValueError (one line naming the option) for a data, results or job-store folder that cannot be
        made or written in: found at start, not as a traceback as the store opens or the first MP4 is due;
        and for --db beside --store, which took the job store while --db was dropped in silence."""
        if self.db and self.store:
            raise ValueError("--db and --store both name the job store; give one (--db PATH is --store "
                             "sqlite:///PATH)")  # fmt: skip
        check_folder(f"--data-dir {self.data_dir}", self.data_dir)
        check_folder(f"--results-dir {self.videos_dir}", self.videos_dir)
        if self.store_url.startswith("sqlite:///"):
            check_folder(f"the job store {self.db_path}", os.path.dirname(os.path.abspath(self.db_path)))

    def check_nodes(self) -> None:
        """ValueError (one line naming the option) for node settings that cannot form one group."""
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be 1 or more, not {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be 0 to {self.nnodes - 1} (--nnodes {self.nnodes}), "
                             f"not {self.node_rank}")  # fmt: skip
        if self.nnodes == 1:
            if not self.api:
                raise ValueError("--no-api is for the nodes other than 0 of a group across machines "
                                 "(--nnodes 2 or more, --node-rank 1 or more)")  # fmt: skip
            return
        host, _, port = (self.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address and a free port, "
                f"the same on every node), not {self.rdzv_endpoint!r}"
            )
        if self.node_rank == 0 and not self.api:
            raise ValueError("--no-api: node 0 runs the API and the replica leader; only --node-rank 1 or "
                             "more can run without it")  # fmt: skip
        if self.node_rank > 0 and self.api:
            raise ValueError(f"--node-rank {self.node_rank}: only node 0 runs the API (it holds the replica "
                             "leader, the one rank that uses the job store); give --no-api")  # fmt: skip

    def worker_argv(self) -> list[str]:
        """The settings the worker group needs, as flags for `python -m server.worker`."""
        argv = []
        for option in _options(worker_only=True):
            value = option.text(self.pipeline if option.pipeline else self)
            if isinstance(value, bool):  # BooleanOptionalAction flags take no value
                argv.append(_flag(option.name) if value else _flag("no_" + option.name))
            elif value is not None:
                argv += [_flag(option.name), value]
        return argv


def serve_pipeline(**changes) -> PipelineConfig:
    """A `PipelineConfig` with `ithaca serve`'s defaults (device cpu, comm auto) and `changes`."""
    defaults = {f.name: f.metadata["serve_default"] for f in settings.options("serve")}
    return PipelineConfig(**defaults | changes)


PIPELINE_NAMES = frozenset(f.name for f in dataclasses.fields(PipelineConfig)) - {"model"}


@dataclass
class _Option:
    """One flag of `ithaca serve` (and its ITHACA_* variable): a field of `ServeConfig` or of the
    `PipelineConfig` it holds."""

    field: dataclasses.Field
    pipeline: bool

    @property
    def name(self) -> str:  # of the flag and the variable
        return self.field.metadata.get("flag") or self.field.name

    @property
    def default(self):
        return self.field.metadata["serve_default"] if self.pipeline else self.field.default

    def text(self, holder):
        """The value in `holder` as a flag's text; a bool as it is; None: nothing to pass."""
        value, meta = getattr(holder, self.field.name), self.field.metadata
        if meta.get("item") is not None:  # a tuple read from one text by `parse`
            return ";".join(map(meta["item_text"], value)) or None
        return value if value is None or isinstance(value, bool) else str(value)


def _options(worker_only: bool = False) -> list[_Option]:
    """Every flag: the server's own, the pipeline's after the model's; the worker group's alone if asked."""
    own = [f for f in dataclasses.fields(ServeConfig) if f.name != "pipeline"]
    at = next(i for i, f in enumerate(own) if f.name == "model_path") + 1
    pipeline = [_Option(f, True) for f in settings.options("serve")]
    options = [_Option(f, False) for f in own[:at]] + pipeline + [_Option(f, False) for f in own[at:]]
    return [o for o in options if o.pipeline or not worker_only or o.field.metadata["worker"]]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return "ITHACA_" + name.upper()


def _convert(f: dataclasses.Field, raw: str):
    """A flag's or variable's text as the field's type. Raises ArgumentTypeError: argparse shows its message
    after the flag's name (`from_args` puts the variable's name before it)."""
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off", ""):
            return False
        raise argparse.ArgumentTypeError(f"{raw!r} is not a boolean (1/0, true/false, yes/no, on/off)")
    if raw == "" and "None" in kind:
        return None  # compose's `${VAR:-}` sets an empty value: the same as unset
    text = raw
    try:
        if kind.startswith("int"):
            raw = int(raw)
        elif kind.startswith("float"):
            raw = float(raw)
            if not math.isfinite(raw):  # nan passes every comparison
                raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind.startswith('int') else 'a finite number'}"
        ) from None
    if f.metadata["parse"] is None:
        return raw
    try:
        return f.metadata["parse"](raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser, *, worker_only: bool = False) -> None:
    for option in _options(worker_only):
        f = option.field
        # argparse expands %-formats in help ("%(default)s"): a literal "%" must be doubled. A help that
        # says its default keeps it (it read "(default DATA_DIR/jobs.db) [...; default None]")
        said = f.metadata["help"]
        if re.search(r"\(default\b", said):  # "(default DATA_DIR/jobs.db)", "(default: auto...)"
            default = ""
        else:
            default = "; unset by default" if option.default is None else f"; default {option.default}"
        help_text = f"{said} [env {env_name(option.name)}{default}]"
        kwargs = dict(dest=f.name, default=None, help=help_text.replace("%", "%%"))
        if f.type in ("bool", bool):
            parser.add_argument(_flag(option.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            convert, metavar = (lambda raw, f=f: _convert(f, raw)), option.name.upper()
            parser.add_argument(_flag(option.name), type=convert, metavar=metavar, **kwargs)


def from_args(args: argparse.Namespace, environ=os.environ, *, worker_only: bool = False) -> ServeConfig:
    """Each setting from its flag, else its ITHACA_* variable. `worker_only`: as the worker ranks read them,
    their own settings as flags (the server's resolved ones) and the others from the environment (the
    supervisor sets ITHACA_NODE_RANK and ITHACA_NNODES); a variable of those others that cannot be read is
    left out: the server checked it, or a flag overrode it (ITHACA_PORT=abc with --port 8001)."""
    values: dict[bool, dict] = {False: {}, True: {}}  # the server's own, the pipeline's
    workers = {option.field.name for option in _options(worker_only=True)}
    for option in _options():
        name, env = option.field.name, env_name(option.name)
        flag_value = getattr(args, name, None)
        if flag_value is not None:
            values[option.pipeline][name] = flag_value
        elif env in environ:
            try:
                values[option.pipeline][name] = _convert(option.field, environ[env])
            except argparse.ArgumentTypeError as e:
                if not worker_only or name in workers:
                    raise ValueError(f"{env}: {e}") from None
    return ServeConfig(**values[False], pipeline=serve_pipeline(**values[True]))


def with_variables(message: str, args: argparse.Namespace, environ=os.environ) -> str:
    """`message` with the ITHACA_* variable behind each flag it names that the command line did not give: an
    operator who set ITHACA_ULYSSES=3 in a compose file reads "--ulysses" in the error."""
    notes = []
    for option in _options():
        flag, env = _flag(option.name), env_name(option.name)
        if env in environ and getattr(args, option.field.name, None) is None:
            if re.search(rf"{re.escape(flag)}(?![\w-])", message):
                notes.append(f"{flag} is {env}={environ[env]!r}")
    return message + (f" ({'; '.join(notes)})" if notes else "")
