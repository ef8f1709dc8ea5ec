"""Text encoders: UMT5 (real Wan weights) and a tiny built-in one (random weights, nothing downloaded), each
with its tokenizer kept apart from the weights.

Only the replica leader loads an encoder; every rank loads the (small) tokenizer, so every rank can count a
prompt's tokens and reject a request the same way without the encoder's weights.

Encoders return Wan's layout: `[1, max_tokens, dim]` where positions past the prompt's tokens are zero. Wan
pads to the full length on purpose: the zero rows still pass through the DiT's text projection and take part
in cross-attention, so real weights only reproduce the reference outputs with the same padding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class PromptTokenizer:
    """Prompt → token ids (cleaned as Wan cleans it, special tokens included, no truncation or padding);
    `count_tokens` is what request validation checks against `max_tokens`."""

    max_tokens: int

    def token_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def prompt_ids(self, text: str) -> list[int]:
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean  # loads diffusers: at first use

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


class UMT5Tokenizer(PromptTokenizer):
    """Wan's umt5-xxl tokenizer from a diffusers pipeline folder's `tokenizer/`. Prompts pad to Wan's 512
    tokens, or to the tokenizer's `model_max_length` where it declares fewer (the trained tiny model: 16)."""

    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(Path(folder) / "tokenizer")
        self.max_tokens = min(512, self.tokenizer.model_max_length)

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True).input_ids


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


class UMT5TextEncoder(TextEncoder):
    """Wan's umt5-xxl encoder from a diffusers pipeline folder's `text_encoder/`."""

    def __init__(
        self, folder: str | Path, tokenizer: UMT5Tokenizer, *, dtype: torch.dtype, device: torch.device | str
    ):
        super().__init__(tokenizer)
        from transformers import UMT5EncoderModel

        folder = Path(folder)
        self.model = UMT5EncoderModel.from_pretrained(folder / "text_encoder", dtype=dtype).to(device).eval()
        self.dim = self.model.config.d_model

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask).last_hidden_state


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


def _has_umt5(folder: str | Path | None) -> bool:
    return folder is not None and (Path(folder) / "text_encoder").is_dir()


def load_tokenizer(folder: str | Path | None) -> PromptTokenizer:
    """UMT5's tokenizer when `folder` has a `text_encoder/`, else the tiny encoder's byte tokens."""
    return UMT5Tokenizer(folder) if _has_umt5(folder) else ByteTokenizer()


def load_text_encoder(
    folder: str | Path | None,
    tokenizer: PromptTokenizer,
    *,
    dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> TextEncoder:
    """UMT5 from `folder` when it has a `text_encoder/`; else the tiny encoder at the DiT's text width.
    `tokenizer` is `load_tokenizer(folder)`'s, shared rather than loaded twice."""
    if _has_umt5(folder):
        return UMT5TextEncoder(folder, tokenizer, dtype=dtype, device=device)
    return TinyTextEncoder(dim, tokenizer).to(device=device, dtype=dtype)
