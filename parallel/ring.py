"""Ring attention over the ring group: K/V spans rotate with isend/irecv (double-buffered: the next block is
in flight while this one computes); each block's partial output is merged by its LSE in fp32 (online softmax).

Padding: block `src` has span_valid(src) real keys, always a prefix, so it is truncated (empty blocks
skipped); local padded queries are never computed and come back as zeros.
Causal: the contiguous layout skips blocks from later ranks; zigzag (rank r holds chunks r and 2R-1-r) gives
every rank the same work: own block causal, earlier ranks' first chunk for all queries, later ranks' whole
block for the second-chunk queries only. Causal with text = causal over the joint order (text_first: text
before image).

Joint text:
- image queries see the text K/V at step 0 (the rank's own block), so every query sees them exactly once;
- text queries do not ride the ring: each rank attends them to its own block only (ring rank 0 also to the
  text K/V); the partials (out, lse) are all-gathered over the ring group and merged in ring-rank order on
  every rank, so text_out is bitwise identical everywhere and costs one small all-gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.comm import all_gather, ring_pass
from parallel.kernels import acc_dtype, local_attention
from parallel.padded_text import each_sample_own_text, padded_batch
from parallel.sharding import SequenceShardInfo


def merge_(out, lse, o, lo) -> None:
    """Fold a partial (o, lo) into the running (out, lse), in place; -inf LSE marks 'no keys yet'. One
    sample at a time: a vectorised exp rounds an element unlike the scalar tail that the same element falls
    into in a one-sample tensor, and a batch's samples must get their solo numbers (dit.batch)."""
    for sample in range(out.shape[0]):
        _merge_sample(out[sample], lse[sample], o[sample], lo[sample])


def _merge_sample(out, lse, o, lo) -> None:
    new = torch.logaddexp(lse, lo)
    safe = new.masked_fill(new == float("-inf"), 0.0)
    out.mul_(torch.exp(lse - safe)[..., None]).add_(o.to(out.dtype) * torch.exp(lo - safe)[..., None])
    lse.copy_(new)


def _empty(q, acc):
    return q.new_zeros(q.shape, dtype=acc), q.new_full(q.shape[:-1], float("-inf"), dtype=acc)


def ring_attention(q, k, v, info: SequenceShardInfo, group, text, text_mask, text_first, causal, backend):
    """q/k/v [B, S_span, h, D]: this ring rank's span. Returns (out [B, S_span, h, D], text_out or None)."""
    if padded_batch(text, text_mask, q.shape[0], causal):  # a ring pass per sample

        def alone(q, k, v, text):
            return ring_attention(q, k, v, info, group, text, None, text_first, causal, backend)

        return each_sample_own_text(alone, q, k, v, text, text_mask)
    R, r = dist.get_world_size(group), dist.get_rank(group)
    tq, tk, tv = text if text is not None else (None, None, None)
    acc = acc_dtype(q)
    S, half, nq = q.shape[1], q.shape[1] // 2, info.span_valid(r)
    zigzag = info.layout == "zigzag"
    out, lse = _empty(q[:, :nq], acc)

    def add(rows: slice, kb, vb, **kw):
        if rows.start < nq and kb.shape[1]:
            o, lo = local_attention(
                q[:, rows][:, : nq - rows.start], kb, vb, backend=backend, return_lse=True, **kw
            )
            merge_(out[:, rows], lse[:, rows], o, lo)

    bufs = [torch.stack([k, v]), None]
    for step in range(R):
        kv = bufs[step % 2]
        if step + 1 < R:
            if bufs[(step + 1) % 2] is None:
                bufs[(step + 1) % 2] = torch.empty_like(kv)
            works = ring_pass(kv, bufs[(step + 1) % 2], group)
        src = (r - step) % R
        kb, vb = kv[0, :, : info.span_valid(src)], kv[1, :, : info.span_valid(src)]
        if not causal:
            add(slice(0, S), kb, vb)
        elif src == r:
            add(slice(0, S), kb, vb, causal=True)
        elif zigzag and src < r:
            add(slice(0, S), kb[:, :half], vb[:, :half])
        elif zigzag:
            add(slice(half, S), kb, vb)
        elif src < r:
            add(slice(0, S), kb, vb)
        if step == 0 and tk is not None and (text_first or not causal):
            add(slice(0, S), tk, tv, key_mask=text_mask)
        if step == 0 and tq is not None:
            text_out = _text_partial(tq, tk, tv, kb, vb, r, text_mask, text_first, causal, backend, acc)
        if step + 1 < R:
            for w in works:
                w.wait()
    out = torch.cat([out, out.new_zeros(out.shape[0], S - nq, *out.shape[2:])], 1).to(q.dtype)
    if tq is None:
        return out, None
    parts = all_gather(torch.cat([text_out[0], text_out[1][..., None]], -1), group)  # [R, B, T, h, D+1]
    tout, tlse = _empty(tq, acc)
    for p in parts:
        merge_(tout, tlse, p[..., :-1], p[..., -1])
    return out, tout.to(q.dtype)


def _text_partial(tq, tk, tv, kb, vb, r, text_mask, text_first, causal, backend, acc):
    """Text queries against this rank's own image block (+ the text K/V on ring rank 0): (out, lse) in acc."""
    out, lse = _empty(tq, acc)
    for keys, vals, kw, use in (
        (kb, vb, {}, kb.shape[1] > 0 and not (causal and text_first)),
        (tk, tv, {"key_mask": text_mask, "causal": causal}, r == 0),
    ):
        if use:
            o, lo = local_attention(tq, keys, vals, backend=backend, return_lse=True, **kw)
            merge_(out, lse, o, lo)
    return out, lse
