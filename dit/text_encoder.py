"""Text encoders: UMT5 (real Wan weights) and a tiny built-in one (random weights, nothing downloaded).

Both return Wan's layout: `[1, max_tokens, dim]` where positions past the prompt's tokens are zero. Wan pads
to the full length on purpose: the zero rows still pass through the DiT's text projection and take part in
cross-attention, so real weights only reproduce the reference outputs with the same padding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from torch import nn


class TextEncoder(nn.Module):
    """Common part: clean the prompt, tokenize, run the encoder, zero everything past the real tokens."""

    max_tokens: int

    def token_ids(self, text: str) -> list[int]:
        """Token ids of the cleaned prompt, special tokens included, without truncation or padding."""
        raise NotImplementedError

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def count_tokens(self, text: str) -> int:
        return len(self.token_ids(prompt_clean(text)))

    @torch.no_grad()
    def states_and_mask(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(states `[1, max_tokens, dim]`, zero past the prompt's tokens; mask `[1, max_tokens]` bool)."""
        ids = self.token_ids(prompt_clean(text))[: self.max_tokens]
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
    """Wan's umt5-xxl encoder from a diffusers pipeline folder (`text_encoder/` and `tokenizer/`)."""

    max_tokens = 512

    def __init__(self, folder: str | Path, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        from transformers import AutoTokenizer, UMT5EncoderModel

        folder = Path(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
        self.model = UMT5EncoderModel.from_pretrained(folder / "text_encoder", dtype=dtype).to(device).eval()
        self.dim = self.model.config.d_model

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True).input_ids

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask).last_hidden_state


class TinyTextEncoder(TextEncoder):
    """UTF-8 bytes as tokens (+1, so 0 is padding; 257 ends the prompt) → embedding → one transformer layer →
    projection to the DiT's text width. Random weights from a fixed seed: the same on every rank and run."""

    EOS = 257

    def __init__(self, dim: int, *, max_tokens: int = 128, width: int = 64, seed: int = 0):
        super().__init__()
        self.dim, self.max_tokens = dim, max_tokens
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(self.EOS + 1, width)
            self.layer = nn.TransformerEncoderLayer(
                width, nhead=4, dim_feedforward=2 * width, batch_first=True, norm_first=True, dropout=0.0
            )
            self.proj = nn.Linear(width, dim)
        self.eval()

    def token_ids(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")] + [self.EOS]

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.layer(self.embed(ids), src_key_padding_mask=mask == 0)
        return self.proj(x)


def load_text_encoder(
    folder: str | Path | None, *, dim: int, dtype: torch.dtype, device: torch.device | str
) -> TextEncoder:
    """UMT5 from `folder` when it has a `text_encoder/`; else the tiny encoder at the DiT's text width."""
    if folder is not None and (Path(folder) / "text_encoder").is_dir():
        return UMT5TextEncoder(folder, dtype=dtype, device=device)
    return TinyTextEncoder(dim).to(device=device, dtype=dtype)
