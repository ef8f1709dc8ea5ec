"""Overlapped Ulysses: the heads cross the all-to-all in C chunks, so the exchanges run while attention does.
Chunk c carries a contiguous share of every rank's heads (`chunk_heads`), and the calls go

    in(0)  in(1) attend(0) out(0)  in(2) attend(1) out(1)  ...  attend(C-1) out(C-1)  wait(out)

so while chunk c attends, the Q/K/V exchange of chunk c+1 and the output exchange of chunk c-1 are in flight
(async collectives: gloo runs them on its own threads, NCCL on its own stream). Each chunk is an (even or
uneven) Ulysses exchange of its own heads and attention is per head, so the result is the single exchange's.
Every rank issues the same collectives in the same order, which keeps NCCL and gloo matched."""

from __future__ import annotations

from collections.abc import Callable

import torch

from parallel.comm import CommConfig
from parallel.ulysses import head_range, head_splits, ulysses_in, ulysses_out_parts


def chunk_heads(H: int, P: int, chunks: int) -> list[list[slice]]:
    """[c][j]: the heads rank j owns in chunk c, a contiguous part of its `head_range` (the first parts one
    larger). Needs chunks <= H // P so every rank has a head in every chunk; then each chunk's shares are
    again a `head_splits` split (non-increasing over ranks, differing by at most one)."""
    if not 1 <= chunks <= H // P:
        raise ValueError(f"{chunks} head chunks need 1 <= chunks <= heads per rank ({H} // {P})")
    plan = [[] for _ in range(chunks)]
    for j in range(P):
        mine = head_range(H, P, j)
        start = mine.start
        for c, n in enumerate(head_splits(mine.stop - mine.start, chunks)):
            plan[c].append(slice(start, start + n))
            start += n
    return plan


def overlapped_ulysses(
    q, k, v, text, group, P: int, rank: int, cfg: CommConfig, chunks: int, attend: Callable
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ulysses attention of this rank's shard q/k/v [B, L, H, D] in `chunks` overlapped head chunks.
    `attend(q, k, v, text)` → (out, text_out) is the attention over the gathered sequence of one chunk
    (joint or ring); `text` holds all H heads. Returns (out [B, L, H, D], text_out [B, T, h, D] for this
    rank's own heads in order, or None)."""
    plan = chunk_heads(q.shape[2], P, chunks)

    def start_in(c: int):
        return ulysses_in(q, k, v, group, P, rank, cfg, async_op=True, heads=plan[c])

    out, text_outs, outs = torch.empty_like(q), [], []
    pending = start_in(0)
    for c in range(chunks):
        following = start_in(c + 1) if c + 1 < chunks else None  # in flight while chunk c attends
        qc, kc, vc = pending.wait()
        mine = plan[c][rank]
        text_c = None if text is None else tuple(t if t is None else t[:, :, mine] for t in text)
        out_c, text_out = attend(qc, kc, vc, text_c)
        splits = [s.stop - s.start for s in plan[c]]
        outs.append(ulysses_out_parts(out_c, group, P, splits, cfg, async_op=True))
        text_outs.append(text_out)
        pending = following
    for c, sent in enumerate(outs):
        for heads, part in zip(plan[c], sent.wait(), strict=True):
            out[:, :, heads] = part
    return out, None if text_outs[0] is None else torch.cat(text_outs, 2)
