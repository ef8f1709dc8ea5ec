"""What every family's text encoders share: the prompt tokenizer's contract, the encoder's common part, and a
tiny built-in encoder (random weights, nothing downloaded), each with its tokenizer kept apart from the
weights. A family's real encoders live in its package (Wan's UMT5: `dit.wan.umt5`).

Only the replica leader loads an encoder; every rank loads the (small) tokenizer, so every rank can count a
prompt's tokens and reject a request the same way without the encoder's weights.

Encoders return Wan's layout: `[1, max_tokens, dim]` where positions past the prompt's tokens are zero. Wan
pads to the full length on purpose: the zero rows still pass through the DiT's text projection and take part
in cross-attention, so real weights only reproduce the reference outputs with the same padding.
"""

from __future__ import annotations

import html
import importlib.util

import regex
import torch
from torch import nn


def prompt_clean(text: str) -> str:
    """diffusers' Wan prompt cleaning (`pipeline_wan.prompt_clean`: ftfy where installed, HTML entities
    unescaped twice, whitespace runs as one space), here because importing it loads transformers."""
    if importlib.util.find_spec("ftfy"):
        import ftfy

        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


class PromptTokenizer:
    """Prompt → token ids (cleaned as Wan cleans it, special tokens included, no truncation or padding);
    `count_tokens` is what request validation checks against `max_tokens`."""

    max_tokens: int

    def token_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def prompt_ids(self, text: str) -> list[int]:
        return self.token_ids(prompt_clean(text))

    def count_tokens(self, text: str) -> int:
        return len(self.prompt_ids(text))


class ByteTokenizer(PromptTokenizer):
    """UTF-8 bytes as tokens (+1, so 0 is padding; 257 ends the prompt): the tiny encoders' tokens."""

    EOS = 257

    def __init__(self, max_tokens: int = 128):
        self.max_tokens = max_tokens

    def token_ids(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")] + [self.EOS]


class TextEncoder(nn.Module):
    """Common part: clean the prompt, tokenize, run the encoder, zero everything past the real tokens."""

    def __init__(self, tokenizer: PromptTokenizer):
        super().__init__()
        self.tokenizer, self.max_tokens = tokenizer, tokenizer.max_tokens

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def states_and_mask(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(states `[1, max_tokens, dim]`, zero past the prompt's tokens; mask `[1, max_tokens]` bool)."""
        ids = self.tokenizer.prompt_ids(text)[: self.max_tokens]
        device = next(self.parameters()).device
        padded = torch.zeros(1, self.max_tokens, dtype=torch.long, device=device)
        padded[0, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask = torch.zeros_like(padded)
        mask[0, : len(ids)] = 1
        hidden = self.hidden_states(padded, mask)
        return hidden * mask[..., None].to(hidden.dtype), mask.bool()

    def encode(self, text: str) -> torch.Tensor:
        return self.states_and_mask(text)[0]

    def condition(self, text: str) -> dict[str, torch.Tensor]:
        """The model's text keyword arguments (Wan: the zero-padded states alone)."""
        return {"encoder_hidden_states": self.encode(text)}


class TinyTextEncoder(TextEncoder):
    """Byte tokens → embedding → one transformer layer → projection to the DiT's text width. Random weights
    from a fixed seed: the same on every rank and run."""

    def __init__(self, dim: int, tokenizer: ByteTokenizer | None = None, *, width: int = 64, seed: int = 0):
        super().__init__(tokenizer or ByteTokenizer())
        self.dim = dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(ByteTokenizer.EOS + 1, width)
            self.layer = nn.TransformerEncoderLayer(
                width, nhead=4, dim_feedforward=2 * width, batch_first=True, norm_first=True, dropout=0.0
            )
            self.proj = nn.Linear(width, dim)
        self.eval()

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.layer(self.embed(ids), src_key_padding_mask=mask == 0)
        return self.proj(x)
