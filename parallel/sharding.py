"""Split a sequence over the sp ranks (padding it to fit) and put it back together.

Layouts, in terms of the span a ring rank holds after the Ulysses all-to-all (its ulysses ranks' shards):
- contiguous: ring rank r's span is tokens [r*U*L, (r+1)*U*L).
- zigzag (causal load balance): the padded sequence is cut into 2R chunks; ring rank r's span is chunk r
  followed by chunk 2R-1-r, split contiguously over its U ulysses ranks. With R=1 it equals contiguous.
Padding always sits at the global end, so the valid tokens of any span form a prefix of it (zigzag: if chunk
r is not full, chunk 2R-1-r is all padding), which lets attention truncate instead of masking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parallel.comm import all_gather
from parallel.mesh import ParallelMesh

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class SequenceShardInfo:
    seq_len: int  # true length
    padded_len: int
    local_len: int
    layout: str = "contiguous"
    ring_size: int = 1
    ulysses_size: int = 1

    @property
    def span_len(self) -> int:
        return self.local_len * self.ulysses_size

    def span_starts(self, ring_rank: int) -> list[int]:
        """Global start of each contiguous piece of a ring rank's span (one piece, or two for zigzag)."""
        if self.layout == "contiguous":
            return [ring_rank * self.span_len]
        c = self.span_len // 2
        return [ring_rank * c, (2 * self.ring_size - 1 - ring_rank) * c]

    def span_valid(self, ring_rank: int) -> int:
        """How many leading tokens of a ring rank's span are real (the rest is padding)."""
        starts = self.span_starts(ring_rank)
        piece = self.span_len // len(starts)
        return sum(min(max(self.seq_len - s, 0), piece) for s in starts)

    def global_index(self) -> torch.Tensor:
        """Global position of every token, in gathered (sp-rank-major) order."""
        spans = []
        for r in range(self.ring_size):
            starts = self.span_starts(r)
            spans += [torch.arange(s, s + self.span_len // len(starts)) for s in starts]
        return torch.cat(spans)


def _info(seq_len: int, mesh: ParallelMesh, layout: str) -> SequenceShardInfo:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; allowed: {', '.join(LAYOUTS)}")
    multiple = mesh.sp_size * (2 if layout == "zigzag" else 1)
    padded = -(-seq_len // multiple) * multiple
    return SequenceShardInfo(
        seq_len, padded, padded // mesh.sp_size, layout, mesh.ring_size, mesh.ulysses_size
    )


def shard_sequence(x: torch.Tensor, mesh: ParallelMesh, dim: int = 1, layout: str = "contiguous"):
    """This rank's shard of the (replicated) full sequence x along dim, zero-padded at the end to fit."""
    info = _info(x.shape[dim], mesh, layout)
    if info.padded_len != info.seq_len:
        pad = list(x.shape)
        pad[dim] = info.padded_len - info.seq_len
        x = torch.cat([x, x.new_zeros(pad)], dim)
    starts = info.span_starts(mesh.ring_rank)
    span = [x.narrow(dim, s, info.span_len // len(starts)) for s in starts]
    span = span[0] if len(span) == 1 else torch.cat(span, dim)
    return span.narrow(dim, mesh.ulysses_rank * info.local_len, info.local_len), info


def gather_sequence(x_local: torch.Tensor, mesh: ParallelMesh, info: SequenceShardInfo, dim: int = 1):
    """The full unpadded sequence on every rank of the sp group (one all-gather)."""
    x = x_local
    if mesh.sp_size > 1:
        parts = all_gather(x_local.movedim(dim, 0).contiguous(), mesh.sp_group)  # [sp, L, ...]
        x = parts.flatten(0, 1).movedim(0, dim)
    if info.layout == "zigzag" and info.ring_size > 1:
        order = torch.empty(info.padded_len, dtype=torch.long)
        order[info.global_index()] = torch.arange(info.padded_len)
        x = x.index_select(dim, order.to(x.device))
    return x.narrow(dim, 0, info.seq_len)


def real_tokens(x_local: torch.Tensor, mesh: ParallelMesh, info: SequenceShardInfo, dim: int = 1):
    """The real (unpadded) tokens of this rank's shard: a prefix of it, since padding sits at the global end
    and a ring rank's span holds its valid tokens first."""
    valid = info.span_valid(mesh.ring_rank) - mesh.ulysses_rank * info.local_len
    return x_local.narrow(dim, 0, min(max(valid, 0), info.local_len))


def local_info(q: torch.Tensor, mesh: ParallelMesh, info: SequenceShardInfo | None) -> SequenceShardInfo:
    """The info attention works with; without one the shards are taken as unpadded and contiguous."""
    if info is None:
        L = q.shape[1]
        return SequenceShardInfo(
            L * mesh.sp_size, L * mesh.sp_size, L, "contiguous", mesh.ring_size, mesh.ulysses_size
        )
    if (
        info.local_len != q.shape[1]
        or info.ring_size != mesh.ring_size
        or info.ulysses_size != mesh.ulysses_size
    ):
        raise ValueError(
            f"info (local_len={info.local_len}, ring={info.ring_size}, ulysses={info.ulysses_size}) "
            "does not match "
            f"q (S_local={q.shape[1]}) on mesh ring={mesh.ring_size}, ulysses={mesh.ulysses_size}"
        )
    return info
