"""Wan's text encoder: UMT5 (umt5-xxl) from a diffusers pipeline folder, or the tiny built-in encoder
(`dit.text_encoder`) when the folder has none or there is no folder (a preset)."""

from __future__ import annotations

from pathlib import Path

import torch

from dit.text_encoder import ByteTokenizer, PromptTokenizer, TextEncoder, TinyTextEncoder


class UMT5Tokenizer(PromptTokenizer):
    """Wan's umt5-xxl tokenizer from a diffusers pipeline folder's `tokenizer/`. Prompts pad to Wan's 512
    tokens, or to the tokenizer's `model_max_length` where it declares fewer (the trained tiny model: 16)."""

    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(Path(folder) / "tokenizer")
        self.max_tokens = min(512, self.tokenizer.model_max_length)

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True).input_ids


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
