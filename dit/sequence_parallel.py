"""Sequence parallelism applied to a plain model from outside (torchtitan style): hooks at module boundaries
and one replaced attention op; the model code itself stays single-device.

Contract a model follows to be parallelised (Wan here; other families may reuse it):
  `patch_embed(...)` → image tokens `[B, S, dim]`      — sharded (padded to a multiple of sp, excluded)
  `rope(...)`        → tuple of tables `[S, ...]`     — sharded the same way along dim 0
  `time_embed(timestep, ...)` with `[B, S]` timesteps — per-token timesteps sharded before embedding
  `head(...)`        → per-token outputs `[B, S_local, ...]` — gathered and unpadded
  `blocks[i].self_attn.attention(q, k, v)`             — replaced by `parallel.attention` over the sp group
  `blocks[i].cross_attn.attention(q, k, v)`            — set to the local kernel on `backend`
Only the sp group is used, so a mesh with cfg > 1 works unchanged (the pipeline combines CFG halves).
`parallelize` hands a model to its family's step (`ModelFamily.parallelize` of the family whose
`parallel_models` it is); `parallelize_by_contract` is the step for this contract.
"""

from __future__ import annotations

import inspect
from functools import partial

import parallel
from dit.families import families
from parallel.kernels import BACKENDS


class SequenceParallel:
    """Per-model state shared by the hooks: the mesh, the comm mode and the current forward's shard info."""

    def __init__(self, mesh, comm="alltoall", backend="auto"):
        self.mesh, self.comm, self.backend, self.info = mesh, comm, backend, None

    def shard_tokens(self, module, args, tokens):
        tokens, self.info = parallel.shard_sequence(tokens, self.mesh, dim=1)
        return tokens

    def shard_rope(self, module, args, tables):
        return tuple(parallel.shard_sequence(t, self.mesh, dim=0)[0] for t in tables)

    def shard_timestep(self, module, args):
        timestep, *rest = args
        if timestep.ndim == 2:  # per-token timesteps [B, S]
            timestep = parallel.shard_sequence(timestep, self.mesh, dim=1)[0]
        return (timestep, *rest)

    def gather(self, module, args, out):
        return parallel.gather_sequence(out, self.mesh, self.info, dim=1)

    def real_tokens(self, x):
        """This rank's real tokens of a block output (the step cache's L1 sums skip the padding)."""
        return parallel.real_tokens(x, self.mesh, self.info, dim=1)

    def attention(self, q, k, v):
        return parallel.attention(q, k, v, self.mesh, info=self.info, comm=self.comm, backend=self.backend)


def check_backend(backend: str) -> None:
    """Fail at load time, not at the first attention call deep inside a forward."""
    if backend not in BACKENDS:
        raise ValueError(f"attn_backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def set_comm(model, comm: str) -> None:
    """Switch a parallelized model's sequence-parallel exchange in place (between forwards). The ops that
    carry `comm`: Wan's `sequence_parallel`, a registered family's `attention` (HunyuanVideo-1.5's), in
    `model` or any module inside it (adapters wrap the transformer); `compile_blocks` may have wrapped the
    op in `torch.compiler.disable`, which keeps it as `__wrapped__`."""
    parallel.comm_config(comm)  # ValueError for an unknown mode
    for module in model.modules():
        for name in ("sequence_parallel", "attention"):
            op = getattr(module, name, None)
            if op is not None and hasattr(inspect.unwrap(op), "comm"):
                inspect.unwrap(op).comm = comm


def parallelize(model, mesh, comm="alltoall", backend="auto"):
    """Make `model` run sequence-parallel over `mesh`'s sp group (in place, returned) by its family's step
    (`parallelize_by_contract` for a model no family claims). Self-attention runs on the attention kernel
    `backend` (one of `parallel.kernels.BACKENDS`), at sp size 1 too."""
    check_backend(backend)
    for family in families():
        if isinstance(model, family.parallel_models):
            return family.parallelize(model, mesh, comm, backend)
    return parallelize_by_contract(model, mesh, comm, backend)


def parallelize_by_contract(model, mesh, comm="alltoall", backend="auto"):
    """The step for a model that follows this module's contract (Wan's)."""
    check_backend(backend)
    if getattr(model, "sequence_parallel", None) is not None:
        raise ValueError("model is already parallelized")
    local = partial(parallel.local_attention, backend=backend)
    for block in model.blocks:
        block.cross_attn.attention = local  # text K/V are replicated: cross-attention always stays local
    if mesh.sp_size == 1:
        for block in model.blocks:
            block.self_attn.attention = local
        return model
    sp = SequenceParallel(mesh, comm, backend)
    model.sequence_parallel = sp
    model.patch_embed.register_forward_hook(sp.shard_tokens)
    model.rope.register_forward_hook(sp.shard_rope)
    model.time_embed.register_forward_pre_hook(sp.shard_timestep)
    model.head.register_forward_hook(sp.gather)
    for block in model.blocks:
        block.self_attn.attention = sp.attention
    return model
