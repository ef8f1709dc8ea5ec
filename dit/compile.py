"""Regional torch.compile: each transformer block's forward is compiled, not the whole model.

Why regional: the blocks are identical, so one compiled graph serves all of them (dynamo treats the block's
parameters as inputs) and compile time stays that of one block; the hooks that shard and gather tokens
(`dit.parallelize`) sit at module boundaries outside the blocks, so they never enter a graph. The
sequence-parallel attention op (all-to-all / isend / all-gather collectives) is wrapped in
`torch.compiler.disable`: dynamo ends the graph before it, runs it eagerly and starts a new graph after it,
instead of tracing collectives. Local attention (world size 1, cross-attention) is traced like any op.
"""

from __future__ import annotations

import torch
from torch import nn


def compile_blocks(model: nn.Module) -> nn.Module:
    """Compile every block of `model` (Wan or HunyuanVideo-1.5, after `dit.parallelize`) in place and return
    it. Compilation happens lazily, at each new input shape's first forward (Inductor)."""
    inner = getattr(model, "transformer", model)  # the HunyuanVideo-1.5 text-to-video adapter
    sp = getattr(inner, "sequence_parallel", None)
    if sp is not None:  # Wan: one shared op, so every block hits the same compiled graph (no recompile)
        op = torch.compiler.disable(sp.attention)
        for block in inner.blocks:
            block.self_attn.attention = op
    # a family's own sequence-parallel op (HunyuanVideo-1.5's joint attention) carries `comm`, as
    # `dit.parallelize.set_comm` finds it; the local op does not
    if hasattr(getattr(inner, "attention", None), "comm"):
        inner.attention = torch.compiler.disable(inner.attention)
    for block in inner.blocks:
        block.compile()  # in place: parameter names (state_dict keys) stay unchanged
    return model
