"""HunyuanVideo-1.5's text encoders: Qwen2.5-VL (the prompt in the reference's chat template, hidden states of
the third-to-last layer, the template's system tokens cropped) and the ByT5 glyph encoder (the text inside
quotes, for rendering it in the video). The encoding itself is the reference's (diffusers'
`HunyuanVideo15Pipeline` static helpers), so real weights give the reference's tokens and masks exactly.

`tiny-joint` pairs the model with two tiny built-in byte-level encoders instead (nothing downloaded). Every
rank loads the main encoder's tokenizer (to count prompt tokens); only the replica leader loads the encoders.
"""

from __future__ import annotations

import inspect
from functools import cache
from pathlib import Path

import torch
from torch import nn

from dit.text_encoder import ByteTokenizer, TinyTextEncoder

MLLM_MAX_TOKENS = 1000  # the reference's `tokenizer_max_length`: prompt tokens kept after the crop
TEMPLATE_CROP = 108  # the reference's `prompt_template_encode_start_idx`: system-template tokens dropped
BYT5_MAX_TOKENS = 256  # the reference's `tokenizer_2_max_length`


@cache
def reference():
    """diffusers' HunyuanVideo-1.5 pipeline module, imported at first use (it loads transformers)."""
    from diffusers.pipelines.hunyuan_video1_5 import pipeline_hunyuan_video1_5

    return pipeline_hunyuan_video1_5


def system_message() -> str:
    """The reference's default system prompt of the chat template."""
    embeds = reference().HunyuanVideo15Pipeline._get_mllm_prompt_embeds
    return inspect.signature(embeds).parameters["system_message"].default


class QwenTokenizer:
    """Qwen2.5-VL's tokenizer from a pipeline folder's `tokenizer/`: every rank loads it to count tokens."""

    max_tokens = MLLM_MAX_TOKENS

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")

    def count_tokens(self, text: str) -> int:
        """Tokens the DiT sees: the templated prompt minus the cropped system part."""
        chat = reference().format_text_input([text], system_message())[0]
        ids = self.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return len(ids["input_ids"]) - TEMPLATE_CROP


class QwenVLTextEncoder(nn.Module):
    """Qwen2.5-VL's text model from a pipeline folder's `text_encoder/`."""

    def __init__(
        self, folder: Path, tokenizer: QwenTokenizer, *, dtype: torch.dtype, device: torch.device | str
    ):
        super().__init__()
        from transformers import Qwen2_5_VLTextModel

        self.tokenizer = tokenizer
        self.model = (
            Qwen2_5_VLTextModel.from_pretrained(folder / "text_encoder", dtype=dtype).to(device).eval()
        )

    @torch.no_grad()
    def states_and_mask(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        return reference().HunyuanVideo15Pipeline._get_mllm_prompt_embeds(
            self.model, self.tokenizer.tokenizer, text, device, MLLM_MAX_TOKENS, crop_start=TEMPLATE_CROP
        )


class ByT5GlyphEncoder(nn.Module):
    """The glyph encoder (a T5 encoder over UTF-8 bytes) from `text_encoder_2/` (+ `tokenizer_2/`, optional:
    ByT5's tokenizer needs no files). A prompt without quoted text gives all-padding tokens."""

    def __init__(self, folder: Path, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        from transformers import ByT5Tokenizer, T5EncoderModel

        tokenizer = folder / "tokenizer_2"
        self.tokenizer = ByT5Tokenizer.from_pretrained(tokenizer) if tokenizer.is_dir() else ByT5Tokenizer()
        self.model = T5EncoderModel.from_pretrained(folder / "text_encoder_2", dtype=dtype).to(device).eval()

    @torch.no_grad()
    def states_and_mask(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        get = reference().HunyuanVideo15Pipeline._get_byt5_prompt_embeds
        return get(self.tokenizer, self.model, text, device, BYT5_MAX_TOKENS)


class TinyGlyphEncoder(TinyTextEncoder):
    """`tiny-joint`'s glyph encoder: the reference's quoted-text extraction, then the tiny byte encoder."""

    def states_and_mask(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        glyphs = reference().extract_glyph_texts(text)
        if glyphs is None:
            device = next(self.parameters()).device
            mask = torch.zeros(1, self.max_tokens, dtype=torch.bool, device=device)
            return torch.zeros(1, self.max_tokens, self.dim, device=device), mask
        return super().states_and_mask(glyphs)


class HunyuanTextEncoder(nn.Module):
    """Both encoders → the transformer's text keyword arguments, real masks included."""

    def __init__(self, main: nn.Module, glyph: nn.Module | None):
        super().__init__()
        self.main, self.glyph = main, glyph

    def condition(self, text: str) -> dict[str, torch.Tensor]:
        states, mask = self.main.states_and_mask(text)
        out = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
        if self.glyph is not None:
            states_2, mask_2 = self.glyph.states_and_mask(text)
            out |= {"encoder_hidden_states_2": states_2, "encoder_attention_mask_2": mask_2}
        return out


def _has_qwen(folder: Path | None) -> bool:
    return folder is not None and (folder / "text_encoder").is_dir()


def load_tokenizer(folder: Path | None) -> QwenTokenizer | ByteTokenizer:
    """The main encoder's tokenizer (what request validation counts): Qwen2.5-VL's from a folder with a
    `text_encoder/`, else the tiny encoder's byte tokens."""
    return QwenTokenizer(folder) if _has_qwen(folder) else ByteTokenizer()


def load_text_encoders(
    folder: Path | None, model, tokenizer, dtype: torch.dtype, device: torch.device | str
) -> HunyuanTextEncoder:
    """Qwen2.5-VL (+ ByT5 when the folder has `text_encoder_2/`; without it quoted text is not rendered
    specially) from `folder`; without a folder the tiny encoders at the transformer's text widths.
    `tokenizer` is `load_tokenizer(folder)`'s, shared rather than loaded twice."""
    if _has_qwen(folder):
        main = QwenVLTextEncoder(folder, tokenizer, dtype=dtype, device=device)
        has_glyph = (folder / "text_encoder_2").is_dir()
        glyph = ByT5GlyphEncoder(folder, dtype=dtype, device=device) if has_glyph else None
        return HunyuanTextEncoder(main, glyph)
    cfg = model.transformer.config
    main = TinyTextEncoder(cfg.text_embed_dim, tokenizer)
    glyph = TinyGlyphEncoder(cfg.text_embed_2_dim, seed=1)
    return HunyuanTextEncoder(main, glyph).to(device=device, dtype=dtype)
