"""Choose a loaded pipeline's sequence-parallel exchange by measurement: `parallel.probe_comm` times each mode
on the self-attention shard shape the model issues at its default video size, and the pipeline switches to
the fastest mode that works on every rank (the same choice on every rank of the replica)."""

from __future__ import annotations

import parallel
from dit.pipeline import GenerationRequest, Pipeline


def attention_shape(pipe: Pipeline) -> tuple[int, int, int, int]:
    """The q/k/v shard shape [B, S_local, H, D] of one self-attention call at the default video size: one
    video per pass (the guided passes run one after the other), its tokens padded to a multiple of sp."""
    lim = pipe.limits
    req = GenerationRequest(
        "", num_frames=lim.default_frames, height=lim.default_height, width=lim.default_width
    )
    f, h, w = pipe.latent_shape(req)[-3:]
    pt, ph, pw = pipe.model.config.patch_size
    tokens = (f // pt) * (h // ph) * (w // pw)
    heads, head_dim = _heads(pipe.model)
    return 1, -(-tokens // pipe.mesh.sp_size), heads, head_dim


def _heads(model) -> tuple[int, int]:
    """(heads, head_dim) from the first config that has them: adapters (image-to-video, HunyuanVideo-1.5's
    text-to-video) keep only a few fields and hold the transformer as a submodule."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        heads = getattr(cfg, "num_heads", None) or getattr(cfg, "num_attention_heads", None)
        if heads:
            return heads, getattr(cfg, "head_dim", None) or cfg.attention_head_dim
    raise ValueError(f"{type(model).__name__} has no config with attention heads")


def choose_comm(
    pipe: Pipeline,
    mesh: parallel.ParallelMesh,
    allow_lossy: bool = False,
    timeout_s: float = 60.0,
    iters: int = 5,
) -> tuple[str, parallel.ProbeResult]:
    """Probe the exchanges at `pipe`'s default shape (FP8 ones only when `allow_lossy`), switch `pipe` to the
    fastest and return (mode, result). Collective over the replica; RuntimeError when no mode works."""
    result = parallel.probe_comm(
        mesh,
        attention_shape(pipe),
        next(pipe.model.parameters()).dtype,
        allow_lossy=allow_lossy,
        iters=iters,
        timeout_s=timeout_s,
        backend=pipe.config.attn_backend,
        device=pipe.device,
    )
    if result.chosen is None:
        raise RuntimeError(f"no sequence-parallel exchange worked: {result.summary()}")
    pipe.set_comm(result.chosen)
    return result.chosen, result
