"""The pipeline's settings, declared once: `PipelineConfig`. Each field carries its default, its help, the
commands that take it as a flag (`ithaca generate`, `parity`, `serve`: `--name-with-dashes`, in serve also
`ITHACA_NAME_WITH_UNDERSCORES`) and whether it is part of a checkpoint's key; the command lines
(`dit.cli_args`, `server.config`) are derived from these fields.

It imports no model code (what parses a LoRA or cache setting loads when one is given): `ithaca --help` and
the server's settings read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dit.cache_config import CacheConfig

COMMANDS = ("generate", "parity", "serve")
# `PipelineConfig.model`'s two flags, on every command
MODEL_PATH_HELP = (
    "diffusers-format pipeline folder, or its Hugging Face Hub name ORG/NAME[@REVISION] (cached; "
    "HF_HUB_OFFLINE=1: no network); the family comes from its transformer/config.json (e.g. "
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers, hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v)"
)
PRESET_HELP = (
    "tiny (the trained default: coloured shapes moving on black, see the README) | random weights: "
    "tiny-random | tiny-joint (HunyuanVideo-1.5) | tiny-i2v-random, tiny-joint-i2v (image-to-video) | "
    "tiny-moe-random (two experts) | tiny-ti2v-random | wan2.1-1.3b | wan2.1-14b | wan2.1-i2v-14b-480p | "
    "wan2.2-t2v-a14b | wan2.2-ti2v-5b | hunyuanvideo-1.5-480p-t2v (used when no model path is given)"
)
_SAME = object()  # serve_default: the field's own default


def setting(
    default,
    help: str = "",
    *,
    commands: tuple[str, ...] = COMMANDS,
    serve_default=_SAME,
    key: bool = False,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    item: Callable[[str], Any] | None = None,
    item_text: Callable[[Any], str] = str,
    metavar: str | None = None,
):
    """A `PipelineConfig` field. `commands`: where it is a flag; `serve_default`: `ithaca serve`'s default
    where it differs; `key`: a checkpoint made under another value is not resumed (it changes the numbers);
    `flag`: the flag's name when it is not the field's. `parse(text)`: the value of a flag's or variable's
    text (ValueError: what is wrong), else the text as the field's type. `item`: the field is a tuple given
    one item per flag (`--lora A --lora B`; `parse` reads them all from one text, as ITHACA_LORA),
    `item(text)` reads one and `item_text` writes one back; `metavar`: how the help shows a flag's value."""
    meta = {
        "help": help,
        "commands": commands,
        "key": key,
        "flag": flag,
        "parse": parse,
        "item": item,
        "item_text": item_text,
        "metavar": metavar,
        "serve_default": default if serve_default is _SAME else serve_default,
    }
    return field(default=default, metadata=meta)


def _lora_list(text: str) -> tuple[tuple[str, float], ...]:
    from dit.lora import parse_specs  # imports torch: only when a LoRA is set

    return parse_specs(text)


def _lora_file(spec: str) -> tuple[str, float]:
    """One `--lora PATH[:STRENGTH]` of `generate`/`parity`: the file must be there (argparse says so)."""
    from dit.lora import not_a_file, parse_spec

    path, strength = parse_spec(spec)
    missing = not_a_file(path)
    if missing:
        raise ValueError(f"{path}: {missing}")
    return path, strength


def _lora_text(lora: tuple[str, float]) -> str:
    return f"{lora[0]}:{lora[1]!r}"


def _warmup_size(text: str) -> tuple[int, int, int]:
    """One `--warmup` size, HEIGHTxWIDTHxFRAMES (480x832x81) → (height, width, frames)."""
    import re

    found = re.fullmatch(r"([0-9]+)x([0-9]+)x([0-9]+)", text.strip())  # \d takes any script's digits
    if found is None:
        raise ValueError(f"{text!r} is not HEIGHTxWIDTHxFRAMES, e.g. 480x832x81")
    return tuple(int(n) for n in found.groups())


def _warmup_sizes(text: str) -> tuple[tuple[int, int, int], ...]:
    return tuple(_warmup_size(part) for part in text.replace(";", ",").replace(" ", ",").split(",") if part)


# the model's and the decoder's dtypes by name (dit.pipeline.DTYPES maps them to torch's)
DTYPE_NAMES = ("float32", "bfloat16", "float16")

TWO_EXPERT_LORAS = (
    "LoRAs on a two-expert model (Wan2.2 A14B) are not supported: each expert takes its own file"
)


@dataclass
class PipelineConfig:
    # "tiny" (trained, shipped), a preset ("tiny-random", "wan2.1-1.3b", ...) or a folder. On the command line
    # two flags name it, --preset and --model-path (`dit.cli_args.add_model_args`, `server.config`).
    model: str = setting("tiny", commands=())
    # None: the mesh's device (cuda:LOCAL_RANK under torchrun on GPUs, else cpu). `ithaca serve` takes cpu or
    # cuda, each rank its own GPU (`server.worker`).
    device: str | None = setting(
        None,
        "cpu | cuda: each rank its own GPU (cuda:LOCAL_RANK) | cuda:N: that GPU (generate, parity); generate "
        "and parity default to cuda when GPUs are present, else cpu",
        serve_default="cpu",
        key=True,
    )
    # the DiT's and text encoder's dtype; the VAE's is `vae_dtype`
    dtype: str = setting("float32", "float32 | bfloat16 | float16 (the DiT and text encoder)", key=True)
    # the VAE decoder's dtype (`dit.vae_frames.cast_decoder`); its encoder stays float32, so the latents do
    # not depend on it (not in a checkpoint's key). float32 by default: bench/vae_dtype.py's table
    vae_dtype: str = setting(
        "float32",
        "float32 | bfloat16 | float16: the VAE's decoder, weights and activations (a lower precision moves "
        "some values a few levels, see the README; the encoder stays float32)",
    )
    # sequence-parallel exchange; auto: chosen by measurement once the model is loaded (`dit.startup`),
    # which `load_pipeline` itself never sees
    comm: str = setting(
        "alltoall",
        "sequence-parallel exchange: alltoall, fp8, p2p, p2p+fp8, each optionally +overlapN (heads in N "
        "chunks whose exchanges overlap attention), or auto: each exact one, plain and overlapped in 2 and "
        "4 chunks, timed at start-up on the model's attention shape and the fastest kept (the FP8 ones too "
        "with serve's --allow-lossy-comm)",
        commands=("generate", "serve"),  # parity runs each mode it compares
        serve_default="auto",
        key=True,
    )
    attn_backend: str = setting(  # parallel.kernels
        "auto",
        "auto | flash | cudnn | sdpa | math | fp8 (auto: flash-attn on CUDA when installed, else SDPA; fp8: "
        "e4m3 Q, K, V and P, a Triton kernel on CUDA, lossy, never chosen by auto)",
        key=True,
    )
    # None: the folder's scheduler class, else the family's (Wan: unipc, HunyuanVideo-1.5: euler); a folder's
    # scheduler config is used when its class is the one sampled (families.pick_scheduler)
    sampler: str | None = setting(
        None,
        "unipc | euler | renoise (default: the folder's scheduler class, else the family's: Wan unipc, "
        "HunyuanVideo-1.5 euler); renoise re-noises each step's clean prediction afresh, as LightX2V samples "
        "its step-distilled Wan2.1",
        key=True,
    )
    flow_shift: float | None = setting(
        None,
        "flow shift (default: the folder's scheduler config, else the family's: Wan 3, HunyuanVideo-1.5 5)",
        key=True,
    )
    # A fixed (distilled) schedule, "1000,750,500,250" (dit.sampling.FixedSchedule): every request takes
    # exactly these steps, guidance 1 unless it asks; None: the folder's `denoising_step_list`, if any.
    timesteps: str | None = setting(
        None,
        "a distilled model's fixed schedule, e.g. 1000,750,500,250 (LightX2V's 4 steps, with --flow-shift 5 "
        "and --sampler euler or renoise): every video takes exactly these steps, guidance 1 unless it asks "
        "(default: the folder's denoising_step_list in scheduler/scheduler_config.json, if any)",
        key=True,
    )
    # None: `device`. "cpu" keeps the text encoder(s) in host memory (the leader then needs no GPU memory for
    # them: UMT5-XXL is 11 GiB in bf16); encoding a prompt is a small part of a job.
    text_encoder_device: str | None = setting(
        None,
        "device of the text encoder, e.g. cpu: keep it off the GPU (default: the DiT's, --device)",
        key=True,
    )
    # torch.compile each DiT block (regional; the sequence-parallel attention op stays eager): faster
    # forwards on GPUs after a one-off compile at each new video size's first step.
    compile: bool = setting(
        False,
        "torch.compile each DiT block: faster GPU steps after a one-off compile per video size",
        key=True,
    )
    # FP8 linear layers (dit.fp8_linear): the blocks' large linear layers as float8 GEMMs, quantised after
    # the weights (and LoRAs) load or read as stored from a pre-quantised checkpoint (dit.fp8_checkpoint);
    # lossy, so never chosen for the user
    quant: str = setting(
        "none",
        "none | fp8: the DiT blocks' large linear layers as FP8 GEMMs (e4m3, per-channel weight and "
        "per-token activation scales; half the weight memory, lossy)",
        key=True,
    )
    # (safetensors file, strength) LoRAs merged into the DiT's weights at load (dit.lora: layouts accepted);
    # not on a two-expert model (TWO_EXPERT_LORAS)
    loras: tuple[tuple[str, float], ...] = setting(
        (),
        "merge LoRA safetensors files into the DiT at load, each PATH[:STRENGTH] (strength 1 by default); "
        "several add: give --lora again (generate, parity) or separate them by ',' or ';' (serve); "
        "diffusers/PEFT, kohya and original-Wan (LightX2V) key layouts",
        key=True,
        flag="lora",
        parse=_lora_list,
        item=_lora_file,
        item_text=_lora_text,
        metavar="PATH[:STRENGTH]",
    )
    # LoRAs a request names (`GenerationRequest.loras`): the catalogue of this folder (dit.lora_catalogue),
    # applied per job on top of the weights loaded (with any --lora), the base restored exactly after
    lora_dir: str | None = setting(
        None,
        "a folder of LoRAs that requests choose by name: NAME.safetensors (SUB/NAME.safetensors: SUB/NAME), "
        "and for a two-expert model (Wan2.2 A14B) a folder NAME holding high_noise.safetensors and "
        "low_noise.safetensors; files added later are seen without a restart",
        commands=("serve",),
        metavar="DIR",
    )
    lora_cache: int = setting(
        4,
        "how many recent LoRA sets (of --lora-dir) keep their tensors in host memory: switching back to one "
        "reads no file",
        commands=("serve",),
    )
    # step caching for requests that do not choose (dit.cache); `generate`'s --cache is the request's own
    cache: str = setting(
        "off",
        "step caching for jobs that do not choose: off | fbcache[:THRESHOLD] (skips most of the DiT at steps "
        "where its first block's output barely moved)",
        commands=("serve",),
        key=True,
        parse=CacheConfig.checked,
    )
    # (height, width, frames) each worker group generates once, a few steps, before it reports ready: the
    # first job of that size then finds its compiled graphs (--compile) and its kernels chosen (dit.warmup)
    warmup: tuple[tuple[int, int, int], ...] = setting(
        (),
        "video sizes HEIGHTxWIDTHxFRAMES (several separated by ','), e.g. 480x832x81: the worker group "
        "generates each once, 2 steps, before it reports ready, so that the first job of that size does "
        "not compile",
        commands=("serve",),
        parse=_warmup_sizes,
        item=_warmup_size,
        item_text=lambda size: "x".join(map(str, size)),
        metavar="SIZES",
    )
    # True: every rank of a replica holds the VAE and decodes a band of rows (dit.vae_parallel); False: the
    # replica leader alone holds it and decodes the whole video while the others wait (the comparison
    # bench/job.py draws)
    parallel_decode: bool = setting(True, commands=())
    # a two-expert model (Wan2.2 A14B, dit.wan.experts): keep the expert not running in host memory, moving
    # each in at its turn (saves one expert's weights of device memory per rank, costs two copies per job)
    offload_idle_expert: bool = setting(
        False, "a two-expert model (Wan2.2 A14B): keep the expert not running in host memory"
    )
    # live previews (dit.preview): every this many steps, and after the last, the replica leader maps the
    # current x0 estimate to a small RGB image for `on_preview`; 0 turns them off (and skips the fit at load).
    # Measured (bench/preview.py, 2-core CPU): a preview (map + resize) costs 0.2 ms, 0.25 % of the trained
    # tiny model's ~80 ms step (the smallest step, so the worst ratio), and 0.5 ms on a Wan2.1-14B-shaped
    # latent against its steps of seconds. Every step would already stay under 2 %; every 2nd halves the
    # share (≤ 0.13 %), leaving the server's image encoding room inside the 2 % on the smallest model, and a
    # 50-step job still shows 25 images.
    preview_every: int = setting(2, commands=())


def options(command: str) -> list[dataclasses.Field]:
    """The `PipelineConfig` fields `command` takes as flags, in declaration order."""
    return [f for f in dataclasses.fields(PipelineConfig) if command in f.metadata["commands"]]


def flag(f: dataclasses.Field) -> str:
    return "--" + (f.metadata["flag"] or f.name).replace("_", "-")


def checkpoint_key(config: PipelineConfig) -> dict:
    """The settings a checkpoint must have been made under to be resumed (those that change the numbers)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.metadata["key"]}
