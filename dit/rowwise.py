"""Layers that compute each sample of a batch alone, where torch's kernel would round a batch's rows
differently from the same samples run one by one: `dit.batch` promises each job its solo run's numbers."""

from __future__ import annotations

import torch
from torch import nn


class RowwiseConv3d(nn.Conv3d):
    """A Conv3d over one sample at a time: the CPU convolution picks its algorithm by batch size (measured:
    a batch of 3 differs from 3 single runs by ~1e-6 relative, torch 2.13 CPU). A patchify convolution costs
    little next to the transformer blocks; the parameters and their names are Conv3d's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return super().forward(x)
        return torch.cat([self._conv_forward(row, self.weight, self.bias) for row in x.split(1)])


def rowwise(fn, x: torch.Tensor, *args):
    """`fn(row, *args)` for each sample of `x` alone, the outputs (a tensor or a tuple of them) joined along
    the batch: for small layers whose matrix products have a row per sample (one row runs a matrix-vector
    kernel, several a matrix-matrix one, and the two round differently)."""
    if x.shape[0] == 1:
        return fn(x, *args)
    outs = [fn(row, *args) for row in x.split(1)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))
    return torch.cat(outs)
