"""Collectives used by parallel attention, each counted by `count_comm`.

`exchange` is the Ulysses all-to-all: chunk i of a `[P, ...]` tensor goes to group rank i. It runs either
as one `all_to_all_single` or as a round-robin of pairwise isend/irecv (circle method: P-1 rounds for even P,
P rounds with one rank sitting out each round for odd P), optionally FP8-compressed (payload + scales in one
uint8 message per peer). `exchange_split` is the same for chunks of different sizes (uneven head splits):
rows of D elements, so many per peer; `all_to_all_single` then carries split sizes. With `async_op` each
returns a `Pending` exchange instead (overlapped Ulysses): the collective, or every round of the P2P one, is
issued at once and `wait()` returns the result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from parallel import fp8


@dataclass
class CommStats:
    calls: Counter = field(default_factory=Counter)
    bytes: Counter = field(
        default_factory=Counter
    )  # bytes this rank sends (all_gather: its own contribution)


_ACTIVE: list[CommStats] = []


@contextmanager
def count_comm():
    """Count collectives and bytes issued in the block: `stats.calls["all_to_all"]`, `stats.bytes[...]`."""
    stats = CommStats()
    _ACTIVE.append(stats)
    try:
        yield stats
    finally:
        _ACTIVE.remove(stats)


def _record(op: str, nbytes: int) -> None:
    for s in _ACTIVE:
        s.calls[op] += 1
        s.bytes[op] += nbytes


@dataclass(frozen=True)
class CommConfig:
    kind: str = "alltoall"  # "alltoall" (one all_to_all_single) or "p2p" (round-robin isend/irecv)
    fp8_in: bool = False  # compress Q/K/V on the way in
    fp8_out: bool = False  # compress the attention output on the way back
    compiled: bool = True  # the FP8 quantiser as one Triton kernel (CUDA tensors only)
    # Overlapped Ulysses: the heads go in this many chunks, each chunk's exchanges running while another
    # chunk attends (at most H/ulysses chunks are used: every rank keeps a head in each); 1: one exchange.
    chunks: int = 1


COMM_MODES = {
    "alltoall": CommConfig(),
    "fp8": CommConfig("alltoall", True, True),
    "p2p": CommConfig("p2p"),
    "p2p+fp8": CommConfig("p2p", True, True),
}


OVERLAP = "+overlap"  # "<mode>+overlap<N>": COMM_MODES[mode] with its heads in N overlapped chunks


def comm_config(comm: str | CommConfig) -> CommConfig:
    if isinstance(comm, CommConfig):
        if comm.kind not in ("alltoall", "p2p") or comm.chunks < 1:
            raise ValueError(f"CommConfig kind={comm.kind!r}, chunks={comm.chunks}: 'alltoall' or 'p2p', >=1")
        return comm
    mode, _, chunks = comm.partition(OVERLAP)
    if mode not in COMM_MODES or (OVERLAP in comm and not (chunks.isdigit() and int(chunks) >= 2)):
        raise ValueError(
            f"comm={comm!r}; allowed: {', '.join(map(repr, COMM_MODES))}, each optionally with "
            f"'{OVERLAP}N' (N >= 2 head chunks), or a CommConfig"
        )
    return replace(COMM_MODES[mode], chunks=int(chunks or 1))


def overlapped(mode: str, chunks: int) -> str:
    """The comm string of exchange `mode` with its heads in `chunks` overlapped chunks."""
    return mode if chunks == 1 else f"{mode}{OVERLAP}{chunks}"


def comm_modes(heads: int, ulysses: int, chunks=(2, 4)) -> tuple[str, ...]:
    """The exchanges worth timing for `heads` heads over `ulysses` ranks: every mode of COMM_MODES, then each
    overlapped in `chunks` head chunks where every rank keeps a head in every chunk."""
    usable = [n for n in chunks if ulysses > 1 and n <= heads // ulysses]
    return (*COMM_MODES, *(overlapped(m, n) for n in usable for m in COMM_MODES))


@dataclass
class Pending:
    """An exchange in flight: `wait()` waits for its collectives and returns the result (`finish(out)`)."""

    works: list
    out: torch.Tensor
    finish: Callable[[torch.Tensor], torch.Tensor] = lambda t: t

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.finish(self.out)

    def then(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Pending:
        return Pending(self.works, self.out, lambda t: fn(self.finish(t)))


def _partner(i: int, k: int, n: int) -> int:
    """Circle method for n (even) players: i's opponent in round k; the last player is the fixed pivot."""
    if i == n - 1:
        return (k * n // 2) % (n - 1)  # n/2 is the inverse of 2 modulo the odd n-1
    j = (k - i) % (n - 1)
    return n - 1 if j == i else j


def _p2p(send: list[torch.Tensor], recv: list[torch.Tensor], group, wait_rounds: bool = True) -> list:
    """Round-robin pairwise exchange: send[i] to group rank i, recv[i] filled from it (contiguous each).
    `wait_rounds`: each round ends before the next starts (no link carries two rounds at once); otherwise
    every round is issued at once, in the same order, and their works are returned."""
    P, me = len(send), dist.get_rank(group)
    recv[me].copy_(send[me])
    n = P + P % 2  # odd P: a phantom player; whoever meets it has a bye that round
    pending = []
    for k in range(n - 1):
        peer = _partner(me, k, n)
        if peer >= P:
            continue
        _record("send", send[peer].nbytes)
        _record("recv", recv[peer].nbytes)
        g = dist.get_global_rank(group, peer)
        ops = [dist.P2POp(dist.isend, send[peer], g, group), dist.P2POp(dist.irecv, recv[peer], g, group)]
        works = dist.batch_isend_irecv(ops)
        if wait_rounds:
            for work in works:
                work.wait()
        else:
            pending += works
    return pending


def _a2a(x: torch.Tensor, group, kind: str, async_op: bool) -> Pending:
    out = torch.empty_like(x)
    if kind == "p2p":
        return Pending(_p2p(list(x), list(out), group, not async_op), out)
    _record("all_to_all", x.nbytes)
    work = dist.all_to_all_single(out, x, group=group, async_op=async_op)
    return Pending([work] if async_op else [], out)


def _a2a_split(x: torch.Tensor, sizes_in: list[int], sizes_out: list[int], group, kind: str, async_op: bool):
    out = x.new_empty(sum(sizes_out))
    if kind == "p2p":
        return Pending(_p2p(list(x.split(sizes_in)), list(out.split(sizes_out)), group, not async_op), out)
    _record("all_to_all", x.nbytes)
    work = dist.all_to_all_single(out, x, sizes_out, sizes_in, group=group, async_op=async_op)
    return Pending([work] if async_op else [], out)


def _result(pending: Pending, async_op: bool):
    """The Pending itself (async), or its result (without async the collectives have already ended)."""
    return pending if async_op else pending.wait()


def all_to_all(x: torch.Tensor, group, kind: str = "alltoall", async_op: bool = False):
    """x [P, ...] contiguous, chunk i for group rank i → [P, ...] with chunk i from group rank i."""
    return _result(_a2a(x, group, kind, async_op), async_op)


def exchange(x: torch.Tensor, group, cfg: CommConfig, use_fp8: bool, async_op: bool = False):
    """all_to_all of x [P, ..., D], FP8-compressed on the wire when use_fp8."""
    if not use_fp8:
        return all_to_all(x, group, cfg.kind, async_op)
    sent = _a2a(fp8.pack(x, cfg.compiled), group, cfg.kind, async_op)
    return _result(sent.then(lambda got: fp8.unpack(got, x.shape, x.dtype)), async_op)


def exchange_split(
    x: torch.Tensor,
    rows_in: list[int],
    rows_out: list[int],
    group,
    cfg: CommConfig,
    use_fp8: bool,
    async_op: bool = False,
):
    """`exchange` for uneven chunks: x [N, D] rows, rows_in[i] of them (in order) for group rank i → [M, D],
    rows_out[i] rows from rank i. FP8: each peer's rows travel as their payload, then their scales."""
    D = x.shape[1]
    if not use_fp8:
        sizes = lambda rows: [r * D for r in rows]  # noqa: E731
        sent = _a2a_split(x.reshape(-1), sizes(rows_in), sizes(rows_out), group, cfg.kind, async_op)
        return _result(sent.then(lambda got: got.view(-1, D)), async_op)
    wire = lambda rows: [r * (D + 4) for r in rows]  # noqa: E731
    sent = _a2a_split(fp8.pack_rows(x, rows_in), wire(rows_in), wire(rows_out), group, cfg.kind, async_op)
    return _result(sent.then(lambda got: fp8.unpack_rows(got, rows_out, D, x.dtype)), async_op)


_all_gather_single = (
    getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
)  # renamed in 2.13


def all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """[P, *x.shape], entry i from group rank i (one all-gather)."""
    P = dist.get_world_size(group)
    out = x.new_empty((P * x.shape[0], *x.shape[1:]) if x.dim() else (P,))  # gloo wants dim 0 concatenated
    _record("all_gather", x.nbytes)
    _all_gather_single(out, x.contiguous(), group=group)
    return out.view(P, *x.shape)


def all_reduce_sum(x: torch.Tensor, group) -> torch.Tensor:
    """x summed over the group (a copy; x itself when there is no group)."""
    if group is None:
        return x
    out = x.clone()
    _record("all_reduce", x.nbytes)
    dist.all_reduce(out, group=group)
    return out


def ring_pass(x: torch.Tensor, buf: torch.Tensor, group) -> list:
    """Start sending x to the next ring rank and receiving the previous rank's into buf; returns the works."""
    P, me = dist.get_world_size(group), dist.get_rank(group)
    _record("send", x.nbytes)
    _record("recv", buf.nbytes)
    ops = [
        dist.P2POp(dist.isend, x, dist.get_global_rank(group, (me + 1) % P), group),
        dist.P2POp(dist.irecv, buf, dist.get_global_rank(group, (me - 1) % P), group),
    ]
    return dist.batch_isend_irecv(ops)
