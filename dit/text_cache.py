"""The text conditioning of recent prompts, kept on the replica leader: a server encodes the default and
common negative prompts once, not at every job (UMT5-XXL is 5.7 B parameters; its states for one prompt are
4 MiB in bf16). Least recently used first out, bounded in bytes; one cache per loaded pipeline, so its key
is the text alone (the model, its encoder and the dtype are the pipeline's)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

Condition = dict[str, torch.Tensor]
DEFAULT_BYTES = 256 * 2**20  # 64 prompts of UMT5-XXL's 512 × 4096 bf16 states


class TextCache:
    def __init__(self, max_bytes: int = DEFAULT_BYTES):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[str, tuple[Condition, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, text: str, encode: Callable[[str], Condition]) -> Condition:
        """`encode(text)`, from the cache when it holds `text`. Callers must not change the tensors."""
        if text in self._entries:
            self._entries.move_to_end(text)
            self.hits += 1
            return self._entries[text][0]
        self.misses += 1
        condition = encode(text)
        size = sum(t.numel() * t.element_size() for t in condition.values())
        if size <= self.max_bytes:
            self._entries[text] = (condition, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted
        return condition
