"""A model's facts as numbers for `parallel.plan` (heads, widths, layers, the tokens of its default video,
whether it is guided by default), read from a preset or folder's configs without loading any weight; and
`plan_layout`, which resolves `--ulysses/--ring/--cfg` (integers or auto) for a model and a world size."""

from __future__ import annotations

import os
from pathlib import Path

from parallel.local_group import world_size
from parallel.plan import Choice, Shape, choose, needs_model


def model_shape(
    model: str,
    *,
    frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    guidance: float | None = None,
    guidance_2: float | None = None,
    sampler: str | None = None,
    timesteps: str | None = None,
) -> Shape:
    """The shape of `model` (a preset, a shipped model or a folder) making a video of `frames` × `height` ×
    `width` (default: the model's) at `guidance` (default: the model's; 1 under a fixed schedule) and, on a
    two-expert model, the low-noise expert's `guidance_2` (default: `guidance`): guided when either is not 1
    (guidance 1 with a guidance_2 of 3 was planned unguided, and --cfg 2 refused)."""
    from dit.request import guided

    family, folder, config, limits = _read(model, sampler, timesteps)
    # Wan's config (WanConfig) and HunyuanVideo-1.5's (diffusers' names) name the same facts apart
    heads = getattr(config, "num_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.attention_head_dim
    ffn = getattr(config, "ffn_dim", None) or int(heads * head_dim * config.mlp_ratio)
    patch = _patch(config)
    t, s = family.compression_of(folder, config.in_channels)
    frames = limits.default_frames if frames is None else frames
    height = limits.default_height if height is None else height
    width = limits.default_width if width is None else width
    latent = ((frames - 1) // t + 1, height // s, width // s)
    tokens = 1
    for n, p in zip(latent, patch, strict=True):
        tokens *= n // p
    guidance = limits.default_guidance if guidance is None else guidance
    return Shape(
        name=f"{model}, {frames} frames {height}×{width}",
        heads=heads,
        head_dim=head_dim,
        layers=config.num_layers,
        ffn=ffn,
        tokens=tokens,
        latent_elements=config.out_channels * latent[0] * latent[1] * latent[2],
        guided=guided(guidance, guidance_2),
        text_tokens=family.text_tokens,
        joint_text=family.joint_text,
    )


def request_limits(model: str, *, sampler: str | None = None, timesteps: str | None = None):
    """The request limits of `model` (a preset, a shipped model or a folder) that its configs tell, its
    folder's card included (`dit.families.model_limits`): what a request can be checked against before the
    model loads."""
    return _read(model, sampler, timesteps)[3]


def _read(model: str, sampler: str | None, timesteps: str | None):
    """(model family, folder or None, the transformer's parsed config, request limits) from configs."""
    from dit.families import model_family, model_limits, pick_sampling, weight_format
    from dit.loading import _source
    from dit.presets import resolve

    name = resolve(model)
    folder = Path(name) if Path(name).is_dir() else None
    family = model_family(name)
    _, config_json = _source(name)
    config = weight_format(config_json.get("_class_name")).parse_config(config_json)
    schedule = pick_sampling(family, folder, sampler, None, timesteps)[3]
    limits = model_limits(family, folder, str(name), config, config.in_channels, _patch(config))
    return family, folder, config, limits.with_schedule(schedule)


def _patch(config) -> tuple[int, ...]:
    return config.patch if hasattr(config, "patch") else tuple(config.patch_size)


def plan_layout(
    model: str,
    world: int,
    *,
    node: int | None = None,
    ulysses=None,
    ring=None,
    cfg=None,
    sampler: str | None = None,
    timesteps: str | None = None,
    video: dict | None = None,
) -> Choice:
    """The layout of `world` ranks, `node` of them per machine (default: all), for `model`'s video
    (`video`: `model_shape`'s frames, height, width and guidance; None ones, or none, the model's defaults);
    degrees as `parallel.plan.choose` takes them. The model's configs are read only when a degree is auto."""
    shape = (
        model_shape(model, sampler=sampler, timesteps=timesteps, **(video or {}))
        if needs_model(ulysses, ring, cfg)
        else None
    )
    return choose(world, shape, ulysses, ring, cfg, node=node)


def request_video(request) -> dict:
    """The video a `GenerationRequest` asks for, as `plan_layout` takes it (None fields: the model's)."""
    return dict(
        frames=request.num_frames, height=request.height, width=request.width,
        guidance=request.guidance_scale, guidance_2=request.guidance_scale_2,
    )  # fmt: skip


def launch_layout(
    model: str, ulysses=None, ring=None, cfg=None, *, sampler=None, timesteps=None, video=None
) -> Choice:
    """`plan_layout` for this process's torchrun launch: WORLD_SIZE ranks, LOCAL_WORLD_SIZE per machine."""
    world = world_size() or 1
    node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return plan_layout(model, world, node=node, ulysses=ulysses, ring=ring, cfg=cfg, sampler=sampler,
                       timesteps=timesteps, video=video)  # fmt: skip
