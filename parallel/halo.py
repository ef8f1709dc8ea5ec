"""Row bands: a tensor split along one dimension into contiguous bands, one per rank of a group, as even as
the rows allow (the first n % P ranks take one row more). Each rank computes on its own band; an operation
that reads neighbouring rows (a convolution) first takes a halo of rows from the neighbouring bands, and one
that needs every row (attention over the whole frame) gathers the bands.

`RowBands` is the split on a base grid; a tensor at s times that resolution along the dimension (after an
upsampling) holds s times each band, so the bands at any integer multiple of the base grid follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.comm import _record, all_gather

EDGES = ("zeros", "replicate")  # what a band at the tensor's true edge pads with


def band_sizes(n: int, size: int) -> list[int]:
    """Rows of each of `size` bands of n rows, as even as possible (the first n % size take one more)."""
    return [n // size + (r < n % size) for r in range(size)]


def _edge(x: torch.Tensor, dim: int, rows: int, at_start: bool, edge: str) -> torch.Tensor:
    if edge == "zeros":
        shape = list(x.shape)
        shape[dim] = rows
        return x.new_zeros(shape)
    side = x.narrow(dim, 0 if at_start else x.shape[dim] - 1, 1)
    return side.expand(*x.shape[:dim], rows, *x.shape[dim + 1 :])


def _place(group) -> tuple[int, int]:
    """(the group's size, this rank's place in it); None: this rank alone, no process group needed."""
    return (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))


def exchange_halo(
    x: torch.Tensor, dim: int, before: int, after: int, group, edge: str = "zeros"
) -> torch.Tensor:
    """x with `before` rows of the previous group rank's band prepended along `dim` and `after` rows of the
    next one's appended; the first and last ranks pad their outer side with `edge` ("zeros" or "replicate",
    as the unsplit tensor's own padding would). One isend/irecv per neighbour and direction; every band needs
    at least max(before, after) rows."""
    if edge not in EDGES:
        raise ValueError(f"edge={edge!r}; allowed: {', '.join(map(repr, EDGES))}")
    dim = dim % x.dim()
    (P, me), n = _place(group), x.shape[dim]
    if not before + after:
        return x
    if n < max(before, after):
        raise ValueError(f"a band of {n} rows cannot lend a halo of {max(before, after)}")

    def shaped(rows):
        return x.new_empty((*x.shape[:dim], rows, *x.shape[dim + 1 :]))

    # (rows to send, buffer to receive into, neighbour): the previous rank lends `before` rows and takes
    # `after`, the next one the reverse; an empty side sends nothing
    top = shaped(before) if me > 0 else None
    bottom = shaped(after) if me < P - 1 else None
    links = [(x.narrow(dim, 0, after), top, me - 1)] if top is not None else []
    links += [(x.narrow(dim, n - before, before), bottom, me + 1)] if bottom is not None else []
    ops = []
    for send, recv, peer in links:
        if send.numel():
            send = send.contiguous()
            ops.append(dist.P2POp(dist.isend, send, group=group, group_peer=peer))
            _record("send", send.nbytes)
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, group=group, group_peer=peer))
            _record("recv", recv.nbytes)
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    top = top if top is not None else _edge(x, dim, before, True, edge)
    bottom = bottom if bottom is not None else _edge(x, dim, after, False, edge)
    return torch.cat([top, x, bottom], dim)


def gather_bands(x: torch.Tensor, dim: int, sizes: list[int], group, dst: int | None = None):
    """The whole tensor from every rank's band (`sizes[r]` rows along `dim` on group rank r): on every rank
    (dst None, one all-gather) or on group rank `dst` alone (one gather; None elsewhere). Bands are padded to
    the largest for the collective and cut back after."""
    if group is None:  # this rank alone: its band is the whole
        return x
    dim = dim % x.dim()
    P, me, most = dist.get_world_size(group), dist.get_rank(group), max(sizes)
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, most - x.shape[dim]]
    x = F.pad(x, pad).movedim(dim, 0).contiguous()  # gloo concatenates along dim 0
    if dst is None:
        parts = all_gather(x, group)
    else:
        _record("gather", x.nbytes)
        parts = [torch.empty_like(x) for _ in range(P)] if me == dst else None
        dist.gather(x, parts, group=group, group_dst=dst)
        if me != dst:
            return None
    return torch.cat([part[:rows] for part, rows in zip(parts, sizes, strict=True)]).movedim(0, dim)


@dataclass(frozen=True)
class RowBands:
    """Bands of `sizes[r]` rows of a base grid on group rank r (`rank` is this one's)."""

    sizes: tuple[int, ...]
    rank: int
    group: object

    @classmethod
    def split(cls, n: int, group) -> RowBands:
        """`n` rows over `group` (None: this rank alone, as a mesh of world size 1 gives it)."""
        size, rank = _place(group)
        return cls(tuple(band_sizes(n, size)), rank, group)

    def sizes_at(self, x: torch.Tensor, dim: int) -> list[int]:
        """The bands at x's resolution, x being this rank's band."""
        scale, rest = divmod(x.shape[dim], self.sizes[self.rank])
        if rest:
            raise ValueError(f"{x.shape[dim]} rows are not a multiple of the band's {self.sizes[self.rank]}")
        return [rows * scale for rows in self.sizes]

    def own(self, whole: torch.Tensor, dim: int, sizes: list[int]) -> torch.Tensor:
        """This rank's band of a whole tensor whose bands are `sizes`."""
        return whole.narrow(dim, sum(sizes[: self.rank]), sizes[self.rank])

    def exchange(self, x: torch.Tensor, dim: int, before: int, after: int, edge: str) -> torch.Tensor:
        return exchange_halo(x, dim, before, after, self.group, edge)

    def all_gather(self, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, list[int]]:
        """(the whole tensor on every rank, its bands)."""
        sizes = self.sizes_at(x, dim)
        return gather_bands(x, dim, sizes, self.group), sizes

    def gather(self, x: torch.Tensor, dim: int, dst: int = 0) -> torch.Tensor | None:
        """The whole tensor on group rank `dst`, None elsewhere."""
        return gather_bands(x, dim, self.sizes_at(x, dim), self.group, dst)
