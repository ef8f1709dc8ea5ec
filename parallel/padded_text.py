"""Attention with text padded to a batch's longest: each sample against its own real text keys alone.

A batch of jobs (dit.batch) pads its texts to the longest and marks the padding in `text_mask`. A masked
kernel over the longer text rounds differently from the unmasked one of a solo run, and the batch promises
each job its solo numbers, so the layouts run each sample over its own real text keys, unmasked: the calls
its solo run makes (measured: HunyuanVideo-1.5 tiny, masked 2e-6 relative after a denoise, this way
bit-identical on 1 rank, Ulysses, ring and CFG-parallel; torch 2.13 CPU). The padding's queries are cut
as well and their outputs are zero: padded text tokens are never keys, so nothing real reads them.
"""

from __future__ import annotations

import torch


def padded_batch(text, text_mask: torch.Tensor | None, batch: int, causal: bool) -> bool:
    """Whether a joint attention takes `each_sample_own_text`: text with a mask, more than one sample, not
    causal (whose queries and keys are one sequence: it keeps the mask), not inside torch.compile (keys
    picked by the mask's data break the graph, and a compiled batch is not its solo runs bit for bit anyway:
    it keeps the mask too)."""
    padded = text is not None and text_mask is not None and batch > 1 and not causal
    return padded and not torch.compiler.is_compiling()


def each_sample_own_text(attend, q, k, v, text, text_mask: torch.Tensor):
    """`attend(q, k, v, text) -> (image_out, text_out or None)` of one sample, run for each sample of a batch
    (`q/k/v [B, S, h, D]`, text (tq or None, tk, tv) `[B, T, h, D]`, text_mask `[B, T]` bool) with only its
    real text keys and values; the outputs joined along the batch."""
    tq, tk, tv = text
    images, texts = [], []
    for b, real in enumerate(text_mask):
        # the text queries are cut too: the kernel then sees the solo job's very shapes (a CPU kernel's
        # blocking, hence its rounding, can depend on the number of query rows); padded rows' outputs are zero
        own = (None if tq is None else tq[b : b + 1, real], tk[b : b + 1, real], tv[b : b + 1, real])
        img, txt = attend(q[b : b + 1], k[b : b + 1], v[b : b + 1], own)
        images.append(img)
        if tq is not None:
            full = txt.new_zeros(1, tq.shape[1], *txt.shape[2:])
            texts.append(full.index_copy_(1, real.nonzero()[:, 0], txt))
    return torch.cat(images), (torch.cat(texts) if texts else None)
