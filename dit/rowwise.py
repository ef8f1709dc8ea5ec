"""Layers that compute each sample of a batch alone, where torch's kernel would round a batch's rows
differently from the same samples run one by one: `dit.batch` promises each job its solo run's numbers.

Measured on torch 2.13 CPU (2 threads): a Linear over a batch folded into one `[B*S, in]` product picks
another kernel for more rows (the trained tiny model's FFN at 12 tokens: 1e-6 per layer, 5e-6 after a
denoise); one row (a time embedding) runs a matrix-vector kernel and several a matrix-matrix one; even a
batched product over the same weight splits a long reduction across threads differently (K ≥ 1024 at 128
rows: 1e-4). Only the very call a solo run makes is exact, so these layers make it once per sample; the rest
of a batch's work (attention, norms, elementwise) runs batched. tests/test_rowwise.py checks each."""

from __future__ import annotations

import torch
from torch import nn


def rowwise(fn, x: torch.Tensor, *args):
    """`fn(sample, *args)` for each sample of `x` (`[B, ...]`) alone, the outputs (a tensor or a tuple of
    them) joined along the batch; `fn(x, *args)` for one."""
    if x.shape[0] == 1:
        return fn(x, *args)
    outs = [fn(sample, *args) for sample in x.split(1)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))
    return torch.cat(outs)


def real_rows(fn, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`fn` over each sample's real tokens alone (`x [B, T, ...]`, `mask [B, T]` bool, None: all real), zeros
    at the padding: a batch padded to its longest text then runs each sample's matrix products on as many
    rows as its unpadded solo run does (the kernel depends on the row count)."""
    if mask is None or x.shape[0] == 1:
        return fn(x)
    if torch.compiler.is_compiling():
        # rows picked by the mask's data would break the block's graph (dynamo cannot trace their number),
        # and a compiled batch is not its solo runs bit for bit anyway (other shapes, other kernels): the
        # padded rows are computed too, then zeroed
        return torch.where(mask.view(*mask.shape, *[1] * (x.dim() - 2)), fn(x), 0)
    outs = [fn(x[b : b + 1, real]) for b, real in enumerate(mask)]
    out = outs[0].new_zeros(*x.shape[:2], *outs[0].shape[2:])
    for b, real in enumerate(mask):
        out[b, real] = outs[b][0]
    return out


class RowwiseLinear(nn.Linear):
    """nn.Linear, each sample (`[B, ..., in]`, batch first) alone; parameters and names are nn.Linear's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rowwise(super().forward, x)


class RowwiseConv3d(nn.Conv3d):
    """nn.Conv3d, each sample alone (the CPU convolution picks its algorithm by batch size: a batch of 3
    differs from 3 single runs by ~1e-6 relative); a patchify convolution costs little next to the blocks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rowwise(super().forward, x)
