"""`ithaca serve` settings: one dataclass, each field a `--flag` that can also come from `ITHACA_<NAME>`.

Precedence: command-line flag, then environment variable, then the default. Deployments set environment only;
the worker group receives the same settings as flags from its supervisor (`worker_argv`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from dataclasses import dataclass, field

from dit.image import ImageLimits
from parallel.plan import parse_degree


def _opt(default, help: str, *, worker: bool = False, parse=None):
    """`parse(text)` checks a text value as the flag or variable is read (ValueError: what is wrong)."""
    return field(default=default, metadata={"help": help, "worker": worker, "parse": parse})


def _loras(text: str) -> tuple[tuple[str, float], ...]:
    from dit.lora import parse_specs  # imports torch: only when a LoRA is set

    return parse_specs(text)


def _checkpoint_every(text: str) -> str:
    if text not in ("auto", "off") and not (text.isdigit() and int(text) > 0):
        raise ValueError(f"must be auto, off or a number of steps, not {text!r}")
    return text


def _store_url(text: str) -> str:
    if not text.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ValueError(f"must be sqlite:///PATH or postgresql://USER@HOST:PORT/DB, not {text!r}")
    return text


def _cache(text: str) -> str:
    from dit.cache import CacheConfig

    return str(CacheConfig.parse(text))


@dataclass
class ServeConfig:
    host: str = _opt("127.0.0.1", "address the HTTP API listens on")
    port: int = _opt(8000, "HTTP port")
    data_dir: str = _opt("ithaca-data", "folder holding the job database and the videos", worker=True)
    db: str | None = _opt(None, "job database path (default DATA_DIR/jobs.db)", worker=True)
    store: str | None = _opt(
        None,
        "job store URL: sqlite:///PATH (one box), or postgresql://USER@HOST:PORT/DB shared by several "
        "servers (default sqlite:///DB, i.e. DATA_DIR/jobs.db)",
        worker=True,
        parse=_store_url,
    )
    results_dir: str | None = _opt(None, "folder for finished MP4s (default DATA_DIR/videos)", worker=True)
    preset: str = _opt("tiny", "model preset when no --model-path is given", worker=True)
    model_path: str | None = _opt(None, "model folder (diffusers pipeline or transformer)", worker=True)
    device: str = _opt("cpu", "cpu or cuda", worker=True)
    dtype: str = _opt("float32", "float32, bfloat16 or float16", worker=True)
    nproc: int = _opt(2, "ranks in the worker group on this machine (its GPUs on a GPU box; per node)")
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
    comm: str = _opt(
        "auto",
        "sequence-parallel exchange: alltoall, fp8, p2p, p2p+fp8, each optionally +overlapN (heads in N "
        "chunks whose exchanges overlap attention), or auto: each exact one, plain and overlapped in 2 and "
        "4 chunks, timed at start-up on the model's attention shape and the fastest kept (the FP8 ones too "
        "with --allow-lossy-comm)",
        worker=True,
    )
    allow_lossy_comm: bool = _opt(False, "--comm auto may pick an FP8 exchange (lossy)", worker=True)
    comm_probe_timeout: float = _opt(
        60.0, "--comm auto: seconds one exchange's probe may take before it is ruled out", worker=True
    )
    attn_backend: str = _opt("auto", "attention kernel backend", worker=True)
    text_encoder_device: str | None = _opt(
        None, "device of the text encoder (cpu: keep it off the GPU; default: the DiT's)", worker=True
    )
    compile: bool = _opt(False, "torch.compile each DiT block (faster GPU steps after warm-up)", worker=True)
    offload_idle_expert: bool = _opt(
        False, "a two-expert model (Wan2.2 A14B): keep the expert not running in host memory", worker=True
    )
    sampler: str | None = _opt(
        None, "unipc, euler or renoise (default: the folder's scheduler, else the family's)", worker=True
    )
    flow_shift: float | None = _opt(
        None, "flow shift (default: the folder's scheduler config, else the family's)", worker=True
    )
    timesteps: str | None = _opt(
        None,
        "a distilled model's fixed schedule, e.g. 1000,750,500,250: every job takes exactly these steps, "
        "guidance 1 unless it asks (default: the folder's denoising_step_list, if any)",
        worker=True,
    )
    lora: str | None = _opt(
        None,
        "LoRA files merged into the DiT at load: PATH[:STRENGTH] (strength 1 by default), several separated "
        "by ',' or ';'",
        worker=True,
        parse=_loras,
    )
    cache: str = _opt(
        "off",
        "step caching for jobs that do not choose: off | fbcache[:THRESHOLD] (skips most of the DiT at steps "
        "where its first block's output barely moved)",
        worker=True,
        parse=_cache,
    )
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY' on every route but /health")
    max_queue: int = _opt(64, "queued jobs beyond this are refused with 429")
    max_body_bytes: int = _opt(65536, "larger request bodies are refused with 413")
    max_image_bytes: int = _opt(
        ImageLimits.max_bytes, "image-to-video: larger input images are refused with 413", worker=True
    )
    max_image_pixels: int = _opt(
        ImageLimits.max_pixels,
        "image-to-video: input images of more pixels are refused with 413, before they are decoded",
        worker=True,
    )
    store_busy_timeout: float = _opt(
        2.0, "seconds a request waits for another process's lock on the job store before it answers 503"
    )
    store_outage_grace: float = _opt(
        60.0,
        "seconds the supervisor and the workers retry a job store that does not answer (PostgreSQL "
        "restarting or unreachable, connections cut, a lock held) before a call gives up; a running job "
        "waits meanwhile",
        worker=True,
    )
    job_timeout: float = _opt(3600.0, "seconds a job may run before it fails and the group is reset")
    shutdown_grace: float = _opt(300.0, "seconds the running job may take to finish after SIGTERM")
    instance: str = _opt(socket.gethostname(), "name of this server in a shared job store", worker=True)
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
        600.0, "with --nnodes > 1: seconds a launch of the group waits for every machine to join it"
    )
    relaunch_backoff: float = _opt(
        1.0,
        "--no-api: seconds before this node launches its share again after it exited, doubled after each "
        "exit in a row that came within a minute of its launch (up to 60)",
    )
    relaunch_budget: int = _opt(
        5, "--no-api: exits in a row, each within a minute of its launch, before this node gives up (exit 1)"
    )
    max_attempts: int = _opt(
        2, "runs a job interrupted by a crash or a restart may get before it is failed (each resumes)"
    )
    checkpoint_every: str = _opt(
        "auto",
        "save a running job's denoising state every N steps, so an interrupted job resumes from it; auto: "
        "as often as keeps the saving under 1 % of the job's time (measured per save); off",
        worker=True,
        parse=_checkpoint_every,
    )
    restart_budget: int = _opt(3, "consecutive worker-group failures before the server exits")
    orphan_timeout: float = _opt(
        60.0, "seconds without a worker heartbeat before its running job is re-queued (any server's)"
    )
    poll_interval: float = _opt(0.005, "seconds between an idle worker's queue polls", worker=True)
    pipeline_module: str = _opt(
        "dit.pipeline", "module providing load_pipeline (tests use a fake)", worker=True
    )
    log_level: str = _opt("info", "log level (debug, info, warning, error)", worker=True)
    log_format: str = _opt("text", "text, or json: one JSON object per line for log collectors", worker=True)

    def __post_init__(self):
        for name in ("ulysses", "ring", "cfg"):  # a flag's or variable's text: an int or "auto"
            if isinstance(getattr(self, name), str):
                setattr(self, name, parse_degree(getattr(self, name)))

    @property
    def model(self) -> str:
        return self.model_path or self.preset

    @property
    def loras(self) -> tuple[tuple[str, float], ...]:
        return _loras(self.lora) if self.lora else ()

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
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.metadata["worker"] or value is None:
                continue
            if isinstance(value, bool):  # BooleanOptionalAction flags take no value
                argv.append(_flag(f.name) if value else _flag("no_" + f.name))
            else:
                argv += [_flag(f.name), str(value)]
        return argv


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
    try:
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not {'an integer' if kind.startswith('int') else 'a number'}"
        ) from None
    if f.metadata["parse"] is not None:
        try:
            f.metadata["parse"](raw)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return raw


def add_arguments(parser: argparse.ArgumentParser, *, worker_only: bool = False) -> None:
    for f in dataclasses.fields(ServeConfig):
        if worker_only and not f.metadata["worker"]:
            continue
        # argparse expands %-formats in help ("%(default)s"): a literal "%" must be doubled
        help_text = f"{f.metadata['help']} [env {env_name(f.name)}; default {f.default}]".replace("%", "%%")
        if f.type in ("bool", bool):
            parser.add_argument(
                _flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(
                _flag(f.name), type=lambda raw, f=f: _convert(f, raw), default=None, help=help_text
            )


def from_args(args: argparse.Namespace, environ=os.environ) -> ServeConfig:
    values = {}
    for f in dataclasses.fields(ServeConfig):
        flag_value = getattr(args, f.name, None)
        if flag_value is not None:
            values[f.name] = flag_value
        elif env_name(f.name) in environ:
            try:
                values[f.name] = _convert(f, environ[env_name(f.name)])
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"{env_name(f.name)}: {e}") from None
    return ServeConfig(**values)
