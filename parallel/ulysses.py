"""Ulysses: one all-to-all turns sequence shards × all heads into the full sequence × H/P heads, attention
runs once over image (+ joint text) tokens, one all-to-all brings the image output back (LightX2V layout).

Any head count: when P does not divide H, rank i owns the contiguous heads `head_range(H, P, i)`, ⌈H/P⌉ of
them for the first H mod P ranks and ⌊H/P⌋ for the rest; the exchanges then carry chunks of different sizes
(`exchange_split`). An even split keeps the single strided pack into one `[P, ...]` buffer."""

from __future__ import annotations

import torch

from parallel.comm import CommConfig, exchange, exchange_split
from parallel.kernels import local_attention
from parallel.padded_text import each_sample_own_text, padded_batch


def pack_qkv(q, k, v, P: int) -> torch.Tensor:
    """[B, L, H, D] ×3 → send buffer [P, 3, B, L, H/P, D] (Q, K and V fused into one message per peer)."""
    B, L, H, D = q.shape
    buf = q.new_empty(P, 3, B, L, H // P, D)
    for i, t in enumerate((q, k, v)):
        buf[:, i].copy_(t.unflatten(2, (P, H // P)).permute(2, 0, 1, 3, 4))
    return buf


def unpack_qkv(x: torch.Tensor):
    """Received [P, 3, B, L, h, D] (chunk i = sequence shard i) → q, k, v each [B, P*L, h, D]."""
    P, _, B, L, h, D = x.shape
    return x.permute(1, 2, 0, 3, 4, 5).reshape(3, B, P * L, h, D).unbind(0)


def pack_out(out: torch.Tensor, P: int) -> torch.Tensor:
    """[B, S, h, D] → send buffer [P, B, S/P, h, D] (sequence shard i for peer i)."""
    return out.unflatten(1, (P, out.shape[1] // P)).transpose(0, 1).contiguous()


def unpack_out(x: torch.Tensor) -> torch.Tensor:
    """Received [P, B, L, h, D] (chunk i = heads of peer i) → [B, L, P*h, D]."""
    P, B, L, h, D = x.shape
    return x.permute(1, 2, 0, 3, 4).reshape(B, L, P * h, D)


def head_splits(H: int, P: int) -> list[int]:
    """Heads of each of P ranks, in rank order: the first H mod P ranks take one more."""
    return [H // P + (i < H % P) for i in range(P)]


def head_range(H: int, P: int, rank: int) -> slice:
    """The contiguous heads rank `rank` owns."""
    splits = head_splits(H, P)
    start = sum(splits[:rank])
    return slice(start, start + splits[rank])


def _then(sent, fn, async_op: bool):
    return sent.then(fn) if async_op else fn(sent)


def ulysses_in(q, k, v, group, P: int, rank: int, cfg: CommConfig, async_op=False, heads=None):
    """This rank's sequence shard × all heads → the whole sequence × its heads: q, k, v [B, P*L, h, D]
    (with `async_op`, a `Pending` of them). `heads`: the slice of heads each rank receives (default:
    `head_range`'s contiguous shares of all H; overlapped Ulysses sends a share of each in every chunk)."""
    B, L, H, D = q.shape
    if heads is None and H % P == 0:
        return _then(exchange(pack_qkv(q, k, v, P), group, cfg, cfg.fp8_in, async_op), unpack_qkv, async_op)
    heads = heads or [head_range(H, P, j) for j in range(P)]
    splits = [s.stop - s.start for s in heads]
    buf = q.new_empty(3 * B * L * sum(splits) * D)  # peer j's [3, B, L, splits[j], D] after peer j-1's
    at = 0
    for j, n in enumerate(splits):
        chunk = buf[at : at + 3 * B * L * n * D].view(3, B, L, n, D)
        for i, t in enumerate((q, k, v)):
            chunk[i].copy_(t[:, :, heads[j]])
        at += chunk.numel()
    rows = lambda n: 3 * B * L * n  # noqa: E731 - rows of D elements in one peer's chunk
    mine = splits[rank]
    got = exchange_split(
        buf.view(-1, D), [rows(n) for n in splits], [rows(mine)] * P, group, cfg, cfg.fp8_in, async_op
    )
    return _then(got, lambda got: unpack_qkv(got.view(P, 3, B, L, mine, D)), async_op)


def ulysses_out_parts(out, group, P: int, splits: list[int], cfg: CommConfig, async_op: bool = False):
    """The whole sequence × this rank's heads → its sequence shard × the heads of every rank, as one
    [B, S/P, splits[j], D] tensor per rank j (with `async_op`, a `Pending` of the list)."""
    B, S, h, D = out.shape
    L = S // P
    send = pack_out(out, P).view(-1, D)  # sequence shard j for rank j, this rank's heads
    rows_out = [B * L * n for n in splits]
    got = exchange_split(send, [B * L * h] * P, rows_out, group, cfg, cfg.fp8_out, async_op)
    parts = lambda got: [c.view(B, L, n, D) for c, n in zip(got.split(rows_out), splits, strict=True)]  # noqa: E731
    return _then(got, parts, async_op)


def ulysses_out(out, group, P: int, H: int, cfg: CommConfig):
    """The whole sequence × this rank's heads → its sequence shard × all H heads: [B, S/P, H, D]."""
    if H % P == 0:
        return unpack_out(exchange(pack_out(out, P), group, cfg, cfg.fp8_out))
    return torch.cat(ulysses_out_parts(out, group, P, head_splits(H, P), cfg), 2)  # rank order = head order


def joint_attention(q, k, v, n_valid: int, text, text_mask, text_first: bool, causal: bool, backend: str):
    """Attention of the first n_valid image tokens (+ text before or after them), ONE kernel call (one per
    sample for a batch's padded texts: parallel.padded_text). Padding is sliced off, not masked; the image
    output is zero-padded back to q's length.
    Returns (image_out [B, S, h, D], text_out [B, T, h, D] or None)."""
    B, S = q.shape[:2]
    if padded_batch(text, text_mask, B, causal):

        def alone(q, k, v, text):
            return joint_attention(q, k, v, n_valid, text, None, text_first, causal, backend)

        return each_sample_own_text(alone, q, k, v, text, text_mask)
    tq, tk, tv = text if text is not None else (None, None, None)
    q, k, v = q[:, :n_valid], k[:, :n_valid], v[:, :n_valid]
    key_mask = None
    if tk is not None:
        cat = lambda img, txt: torch.cat([txt, img] if text_first else [img, txt], 1)
        k, v = cat(k, tk), cat(v, tv)
        q = q if tq is None else cat(q, tq)
        if text_mask is not None:
            key_mask = cat(text_mask.new_ones(B, n_valid), text_mask)
    out = local_attention(q, k, v, key_mask=key_mask, causal=causal, backend=backend)
    T = 0 if tq is None else tq.shape[1]
    img, txt = (out[:, T:], out[:, :T]) if text_first else (out[:, :n_valid], out[:, n_valid:])
    if n_valid < S:
        img = torch.cat([img, img.new_zeros(B, S - n_valid, *img.shape[2:])], 1)
    return img, (txt if tq is not None else None)
