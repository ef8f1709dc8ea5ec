"""Check a launch's settings before any rank starts: a mistake is one ValueError line naming the option and
what it allows, instead of a traceback from every rank (or torchrun's ChildFailedError) minutes later.

`ithaca generate`/`parity` call `preflight` first thing and `ithaca serve` before it starts its worker group.
Nothing here imports diffusers or transformers (the model's code loads them when it is built), so a
mistake, a request's included, is reported in about the time torch takes to import.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path

from dit.settings import DTYPE_NAMES, TWO_EXPERT_LORAS, PipelineConfig


def preflight(
    config: PipelineConfig | None = None,
    *,
    model_path: str | None = None,
    nproc: int = 1,
    local_nproc: int | None = None,
    ulysses: int | str | None = None,
    ring: int | str | None = None,
    cfg: int | str | None = None,
    request=None,
    planned: bool = False,
    **settings,
) -> None:
    """Raise ValueError (one line: the option, the value, what is allowed) for a pipeline's settings that
    cannot run on `nproc` ranks, `local_nproc` of them on this machine (default: all). `config` (default
    `PipelineConfig()`) with `settings` (any of its fields by name, and `preset`: the model by name) over it;
    `model_path`: the model, when the command line gives it as a folder (else `config.model` is a name).
    `device` None: cuda when CUDA is present, else cpu (as the ranks pick); comm "auto": measured at start-up.
    Degrees: integers, "auto", or None (see `parallel.plan.requested`); auto ones are resolved for the model
    last (`dit.shape.plan_layout`). `request` (a `GenerationRequest`): its frames, size, steps, guidance and
    fps against the model's limits, read from its configs and its folder's card (`dit.model_card`) before any
    model code loads; `planned`: a video's size only (`ithaca plan`), no image-to-video model's image."""
    from parallel.mesh import dist_timeout
    from parallel.plan import AUTO, CFG_DEGREES, check_fixed, needs_model

    dist_timeout()  # the ranks read it as they start
    preset = settings.pop("preset", None)  # not a field: the model by name, which a folder overrides
    model = model_path or preset
    config = replace(config or PipelineConfig(), **settings, **({"model": model} if model else {}))
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    if cfg not in (*CFG_DEGREES, AUTO, None):
        raise ValueError(f"--cfg must be 1 or 2 (prompt and negative prompt in parallel) or auto: {cfg!r}")
    with _degrees(nproc):
        check_fixed(nproc, ulysses, ring, cfg)
    check_settings(config, nproc if local_nproc is None else local_nproc)

    from dit.families import model_family, model_names, pick_sampling
    from dit.parts import check_parts
    from dit.presets import resolve
    from dit.sampling import FIXED_SCHEDULE_SAMPLERS

    sampler, timesteps = config.sampler, config.timesteps
    if model_path is None:
        _check_choice("--preset", config.model, model_names())
    elif not Path(model_path).is_dir():
        what = "a file, not a model folder" if Path(model_path).exists() else "no such folder"
        raise ValueError(f"--model-path {model_path}: {what}")
    else:
        try:
            model_family(model_path)
            check_parts(Path(model_path))
        except FileNotFoundError:
            raise ValueError(
                f"--model-path {model_path}: not a model folder (a diffusers pipeline folder with "
                "transformer/config.json, or a transformer folder with config.json)"
            ) from None
        except ValueError as e:  # an unreadable config.json or a model class no family handles
            raise ValueError(f"--model-path {model_path}: {e}") from None
    # The sampler against the folder's scheduler/ and the fixed schedule (reads JSON, loads no weights).
    model = resolve(config.model)
    family, folder = model_family(model), (Path(model) if Path(model).is_dir() else None)
    if sampler is not None and sampler not in family.samplers:  # named as the command line names it
        raise ValueError(f"--sampler {sampler}: this model samples with {' or '.join(family.samplers)}")
    picked = pick_sampling(family, folder, sampler)[0]  # the folder's own fixed schedule checked too
    if timesteps is not None:
        if picked not in FIXED_SCHEDULE_SAMPLERS:
            whose = "--sampler" if sampler else "the model's sampler,"
            raise ValueError(
                f"--timesteps {timesteps} are sampled with --sampler {' or '.join(FIXED_SCHEDULE_SAMPLERS)}, "
                f"not {whose} {picked}"
            )
    two_experts = family.boundary_ratio(model, folder) is not None
    if config.offload_idle_expert and not two_experts:
        raise ValueError(f"{flag('offload_idle_expert')} {ONE_EXPERT}")
    if config.loras and two_experts:
        raise ValueError(f"--lora: {TWO_EXPERT_LORAS}")
    if request is not None or config.warmup:  # the request, and each warm-up size as a request of that size
        from dit.request import GenerationRequest, check_numbers
        from dit.shape import request_limits
        from dit.warmup import warmup_request

        limits = request_limits(model, sampler=sampler, timesteps=timesteps)
        if request is not None:
            check_numbers(request, limits, planned=planned)
        for size in config.warmup:
            try:
                check_numbers(warmup_request(limits, size, GenerationRequest), limits)
            except ValueError as e:
                raise ValueError(f"--warmup {'x'.join(map(str, size))}: {e}") from None
    from dit.shape import model_shape, plan_layout, request_video

    video = None if request is None else request_video(request)
    with _degrees(nproc):  # reads the model's configs only for an auto degree
        layout = plan_layout(model, nproc, node=local_nproc, ulysses=ulysses, ring=ring, cfg=cfg,
                             sampler=sampler, timesteps=timesteps, video=video).layout  # fmt: skip
    if request is not None:  # one video (generate, parity): a rank without work of its own is a mistake
        _one_video(layout, nproc, model, video, sampler, timesteps)
    if not needs_model(ulysses, ring, cfg):  # an auto choice keeps within the heads
        heads = model_shape(model, sampler=sampler, timesteps=timesteps).heads
        if layout.ulysses > heads:
            raise ValueError(
                f"--ulysses/--ring/--cfg do not fit this model: ulysses {layout.ulysses} is more than its "
                f"{heads} attention heads (every rank of a Ulysses group needs one); give the rest to --ring"
            )
    from dit.lora_switch import check_lora_dir

    check_lora_dir(config)
    if config.loras:  # every file's keys and shapes against the model's (headers only, no weights)
        from dit.loading import check_loras

        try:
            check_loras(model, config.loras)
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"--lora: {e}") from None


def flag(field: str) -> str:
    """A setting's name on the command line."""
    return "--" + field.replace("_", "-")


# the end of a message naming the setting: `offload_idle_expert` on a model of one expert
ONE_EXPERT = "is for two-expert models (Wan2.2 A14B); this model has one"


def check_settings(config: PipelineConfig, local_nproc: int = 1, named: Callable[[str], str] = flag) -> bool:
    """The settings that need no model, one ValueError line naming the setting as `named` spells a field (its
    flag here, its name for `load_pipeline`): the exchange, attention backend, devices, dtypes, FP8, sampler,
    flow shift, timesteps' syntax, step cache and LoRA pairs. Whether the ranks run on CUDA."""
    from dit.cache_config import CacheConfig
    from dit.fp8_linear import QUANTS
    from dit.request import plain_number
    from dit.sampling import SAMPLERS, FixedSchedule
    from parallel.comm import COMM_MODES, comm_config
    from parallel.kernels import BACKENDS

    if config.comm != "auto":  # auto: measured at start-up (dit.comm_choice)
        try:
            if not isinstance(config.comm, str):  # None's AttributeError came from deep inside
                raise ValueError
            comm_config(config.comm)
        except ValueError:
            modes = ", ".join(COMM_MODES)
            raise ValueError(
                f"{named('comm')} {config.comm!r} is not one of {modes} (each optionally +overlapN, N >= 2), "
                "auto"
            ) from None
    _check_choice(named("attn_backend"), config.attn_backend, BACKENDS)
    on_cuda = _check_device(named("device"), config.device, local_nproc)
    if config.text_encoder_device is not None:
        _check_device(named("text_encoder_device"), config.text_encoder_device, 1)
    if config.attn_backend == "flash" and not (on_cuda and importlib.util.find_spec("flash_attn")):
        raise ValueError(
            f"{named('attn_backend')} flash needs a CUDA device and flash-attn installed; use auto or sdpa"
        )
    if config.attn_backend == "cudnn" and not on_cuda:  # it ran as plain SDPA, saying nothing
        raise ValueError(f"{named('attn_backend')} cudnn needs a CUDA device; use auto or sdpa")
    shift = plain_number(config.flow_shift)  # 0 or less: no noise schedule at all; numpy's as Python's
    number = isinstance(shift, int | float) and not isinstance(shift, bool)
    if shift is not None and not (number and math.isfinite(shift) and shift > 0):
        raise ValueError(
            f"{named('flow_shift')} must be a number above 0 (Wan 480p: 3, 720p: 5), got {shift!r}"
        )
    for name in ("dtype", "vae_dtype"):
        _check_choice(named(name), getattr(config, name), DTYPE_NAMES)
    _check_choice(named("quant"), config.quant, QUANTS)
    if config.sampler is not None:  # None: the family's own
        _check_choice(named("sampler"), config.sampler, SAMPLERS)
    if config.timesteps is not None:
        try:
            if not isinstance(config.timesteps, str):
                raise ValueError(
                    f"timesteps must be text such as '1000,750,500,250', got {config.timesteps!r}"
                )
            FixedSchedule.parse(config.timesteps)
        except ValueError as e:  # "timesteps must be integers ..."
            raise ValueError(named("timesteps") + str(e).removeprefix("timesteps")) from None
    try:
        CacheConfig.parse(config.cache)
    except (ValueError, TypeError) as e:  # "cache must be off, fbcache, ..."
        raise ValueError(named("cache") + str(e).removeprefix("cache")) from None
    # (path, strength) pairs: a path alone was unpacked into its letters
    for pair in [config.loras] if isinstance(config.loras, str) else config.loras:
        paired = not isinstance(pair, str) and hasattr(pair, "__len__") and len(pair) == 2
        strength = plain_number(pair[1]) if paired else None
        if isinstance(strength, bool) or not isinstance(strength, int | float):
            raise ValueError(f"{named('loras')} must be (path, strength) pairs, got {pair!r}")
        if not _finite(strength):  # NaN weights: the decode's overflow was blamed on the VAE
            raise ValueError(
                f"{named('loras')} {pair[0]}: the strength must be a finite number, got {strength}"
            )
    every = plain_number(config.preview_every)  # "2" failed at load, 1.5 and -1 ran
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"{named('preview_every')} must be an integer of 0 (none) or more, got {every!r}")
    for field in fields(config):  # "yes" and "no" both compiled, or decoded in parallel (numpy's are taken)
        value = getattr(config, field.name)
        if field.type == "bool" and value not in (True, False):
            raise ValueError(f"{named(field.name)} must be True or False, got {value!r}")
    if not isinstance(config.model, str | os.PathLike) or not str(config.model):  # pathlib's TypeError
        raise ValueError(f"{named('model')} must be a preset's name or a folder, got {config.model!r}")
    return on_cuda


def _finite(number) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int past a float's range
        return False


def _one_video(layout, nproc: int, model: str, video: dict, sampler, timesteps) -> None:
    """One video's layout leaves no rank idle: replicas would each make the same video, and CFG's second
    half has nothing to do without guidance (`ithaca plan` says "n/a" of both)."""
    from dit.shape import model_shape

    used = layout.ulysses * layout.ring * layout.cfg
    if used < nproc:
        raise ValueError(
            f"--ulysses {layout.ulysses} x --ring {layout.ring} x --cfg {layout.cfg} use {used} of the "
            f"{nproc} ranks, and the others would make the same video again: give them to --ulysses or "
            f"--ring, or run --nproc {used}"
        )
    if layout.cfg == 2 and not model_shape(model, sampler=sampler, timesteps=timesteps, **video).guided:
        raise ValueError(
            "--cfg 2 runs the negative prompt's pass on half the ranks, and guidance 1 makes none: that half "
            "would have nothing to do; use --cfg 1, or a --guidance (or --guidance-2) above 1"
        )


@contextmanager
def _degrees(nproc: int):
    try:
        yield
    except ValueError as e:
        raise ValueError(f"--ulysses/--ring/--cfg do not fit --nproc {nproc}: {e}") from None


def _check_choice(option: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{option} {value!r} is not one of {', '.join(map(str, allowed))}")


def _check_device(option: str, device: str | None, local_nproc: int) -> bool:
    """Whether the ranks will run on CUDA; ValueError for a device this machine lacks."""
    import torch

    if device is None:
        kind, index = ("cuda" if torch.cuda.is_available() else "cpu"), None
    else:
        try:
            parsed = torch.device(device)
        except RuntimeError:
            parsed = None
        if parsed is None or parsed.type not in ("cpu", "cuda"):
            raise ValueError(f"{option} {device!r} is not a device; allowed: cpu, cuda, cuda:N")
        kind, index = parsed.type, parsed.index
    if kind == "cpu":
        return False
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise ValueError(
            f"{option} {device}: no CUDA device here (torch {torch.__version__}); use {option} cpu"
        )
    if index is not None and index >= gpus:
        raise ValueError(f"{option} {device}: this machine has {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}")
    if local_nproc > gpus:  # one GPU per rank
        raise ValueError(
            f"--nproc {local_nproc} needs {local_nproc} GPUs, this machine has {gpus}; or use --device cpu"
        )
    return True
