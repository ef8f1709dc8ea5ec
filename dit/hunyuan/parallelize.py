"""Sequence parallelism for HunyuanVideo-1.5 (torchtitan style: the plain model stays free of parallel code).

`parallelize_hunyuan` swaps the model's two hooks. `sequence` shards the image tokens (and their RoPE rows)
over the sp group after the patch embedding and gathers them before unpatchify. `attention` runs every
block's joint attention through `parallel.attention` with the replicated text as `text=`: Ulysses
head-slices the text q/k/v locally and all-gathers the text output (no all-to-all of text tokens); ring
joins the text k/v in one step. The text stream's modulation and MLP then run on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import parallel
from dit.hunyuan.model import LocalJointAttention


@dataclass
class ShardedSequence:
    mesh: parallel.ParallelMesh
    info: parallel.SequenceShardInfo | None = None  # the current forward's

    def shard(self, x: torch.Tensor, *aligned: torch.Tensor):
        x, self.info = parallel.shard_sequence(x, self.mesh, dim=1)
        aligned = tuple(parallel.shard_sequence(a, self.mesh, dim=0)[0] for a in aligned)
        return x, aligned, self.info

    def gather(self, x: torch.Tensor, info) -> torch.Tensor:
        return parallel.gather_sequence(x, self.mesh, info, dim=1)

    def real_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's real tokens of a block output (the step cache's L1 sums skip the padding)."""
        return parallel.real_tokens(x, self.mesh, self.info, dim=1)


@dataclass
class ParallelJointAttention:
    mesh: parallel.ParallelMesh
    comm: str | object = "alltoall"
    backend: str = "auto"

    def __call__(self, q, k, v, *, text, text_mask=None, info=None):
        kw = dict(info=info, text=text, text_mask=text_mask, comm=self.comm, backend=self.backend)
        return parallel.attention(q, k, v, self.mesh, **kw)


def parallelize_hunyuan(model: nn.Module, mesh, comm="alltoall", backend: str = "auto") -> nn.Module:
    """The same model, sequence-parallel over mesh's sp group (sp size 1: local attention on `backend`).
    Accepts the text-to-video adapter too (it parallelises the transformer inside)."""
    inner = getattr(model, "transformer", model)
    if inner is not model:
        parallelize_hunyuan(inner, mesh, comm, backend)
        return model
    if mesh.sp_size == 1:
        model.attention = LocalJointAttention(backend)
        return model
    model.sequence = ShardedSequence(mesh)
    model.attention = ParallelJointAttention(mesh, comm, backend)
    return model
