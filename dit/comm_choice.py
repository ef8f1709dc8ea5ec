"""Choose a loaded pipeline's sequence-parallel exchange by measurement: `parallel.probe_comm` times each mode
on the self-attention shard shape the model issues at its default video size, and the pipeline switches to
the fastest mode that works on every rank (the same choice on every rank of the replica)."""

from __future__ import annotations

from typing import Protocol

import torch

import parallel
from dit.settings import PipelineConfig
from dit.shape import model_shape


class Switchable(Protocol):
    """What the choice reads from and switches on a loaded pipeline (`dit.pipeline.Pipeline` is one)."""

    config: PipelineConfig
    mesh: parallel.ParallelMesh
    model: torch.nn.Module

    @property
    def device(self) -> torch.device: ...

    def set_comm(self, comm: str) -> None: ...


def attention_shape(pipe: Switchable) -> tuple[int, int, int, int]:
    """The q/k/v shard shape [B, S_local, H, D] of one self-attention call at the default video size
    (`dit.shape.model_shape`: the planner's reading of the same model): one video per pass (the guided passes
    run one after the other), its tokens padded to a multiple of sp."""
    config = pipe.config
    shape = model_shape(config.model, sampler=config.sampler, timesteps=config.timesteps)
    return 1, -(-shape.tokens // pipe.mesh.sp_size), shape.heads, shape.head_dim


def choose_comm(
    pipe: Switchable,
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
