"""Wan's text encoder: UMT5 (umt5-xxl) from a diffusers pipeline folder, or the tiny built-in encoder
(`dit.text_encoder`) when the folder has none or there is no folder (a preset).

UMT5 runs in our own torch code, not transformers' (whose import alone costs a second): `UMT5Encoder` keeps
transformers' parameter names, so the folder's `text_encoder/` safetensors load as they are, and computes
what `transformers.UMT5EncoderModel(ids, mask).last_hidden_state` computes (tests/test_umt5.py compares).
The tokenizer is the folder's `tokenizer/tokenizer.json` run by the `tokenizers` package."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dit.text_encoder import ByteTokenizer, PromptTokenizer, TextEncoder, TinyTextEncoder
from dit.weights import checkpoint_files, checkpoint_keys, load_safetensors, materialize

WAN_MAX_TOKENS = 512


class UMT5Tokenizer(PromptTokenizer):
    """Wan's umt5-xxl tokenizer from a diffusers pipeline folder's `tokenizer/`. Prompts pad to Wan's 512
    tokens, or to the tokenizer's `model_max_length` where it declares fewer (the trained tiny model: 16).

    A folder with `spiece.model` but no `tokenizer.json` goes through transformers' AutoTokenizer, which
    converts the SentencePiece model (and costs transformers' import); the published Wan folders ship both."""

    def __init__(self, folder: str | Path):
        path = Path(folder) / "tokenizer"
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self.max_tokens = min(WAN_MAX_TOKENS, config.get("model_max_length", WAN_MAX_TOKENS))
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            # as transformers' call without truncation/padding does, whatever the file has baked in
            tokenizer.no_truncation()
            tokenizer.no_padding()
            self._ids = lambda text: tokenizer.encode(text, add_special_tokens=True).ids
        elif (path / "spiece.model").is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
            self._ids = lambda text: tokenizer(text, add_special_tokens=True).input_ids
        else:
            raise ValueError(f"{path} has no tokenizer.json (nor a SentencePiece spiece.model)")

    def token_ids(self, text: str) -> list[int]:
        return self._ids(text)


@dataclasses.dataclass(frozen=True)
class UMT5Config:
    """The fields of transformers' UMT5Config (`text_encoder/config.json`) the encoder reads."""

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"

    @classmethod
    def from_json(cls, path: Path) -> UMT5Config:
        raw = json.loads(path.read_text())
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})

    @property
    def gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> str:
        # transformers derives the activation from feed_forward_proj ("gated-gelu" means the tanh GELU)
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    # transformers' NewGELUActivation step by step (F.gelu(approximate="tanh") rounds differently in bf16)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS = {"gelu_new": _gelu_new, "gelu": F.gelu, "relu": F.relu, "silu": F.silu}


class RMSNorm(nn.Module):
    """T5's layer norm: no mean, no bias; the variance in float32, the result in a half weight's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        half = self.weight.dtype in (torch.float16, torch.bfloat16)
        return self.weight * (x.to(self.weight.dtype) if half else x)


def relative_buckets(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional buckets of key − query offsets: half for each sign, exact up to a quarter of the
    buckets, logarithmic up to `max_distance`, the last bucket beyond."""
    half = num_buckets // 2
    exact = half // 2
    distance = relative.abs()
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact) * (half - exact)
    far = (exact + log_ratio.to(torch.long)).clamp(max=half - 1)
    return (relative > 0).long() * half + torch.where(distance < exact, distance, far)


def _table(rows: int, dim: int) -> nn.Embedding:
    """An embedding left uninitialised: the weights always come from a folder, and `nn.Embedding`'s random
    init on the meta device runs torch's reference ops, whose first use imports dynamo (0.7 s of a start)."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class Attention(nn.Module):
    """Self-attention with this layer's own relative position bias (UMT5: one per layer) and no 1/√d scale."""

    def __init__(self, cfg: UMT5Config):
        super().__init__()
        inner, self.heads = cfg.num_heads * cfg.d_kv, cfg.num_heads
        self.q, self.k, self.v = (nn.Linear(cfg.d_model, inner, bias=False) for _ in range(3))
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        self.relative_attention_bias = _table(cfg.relative_attention_num_buckets, cfg.num_heads)

    def forward(self, x: torch.Tensor, buckets: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (proj(x).view(b, n, self.heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1)[None]
        bias = torch.where(keep, bias, torch.finfo(k.dtype).min)  # padded keys: the dtype's minimum
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


class FeedForward(nn.Module):
    """`wo(act(wi_0 x) · wi_1 x)` (gated) or `wo(act(wi x))`; the product is cast to `wo`'s dtype, which is
    float32 in a float16 encoder (transformers keeps `wo` in float32 there)."""

    def __init__(self, cfg: UMT5Config):
        super().__init__()
        self.act, self.gated = ACTIVATIONS[cfg.activation], cfg.gated
        names = ("wi_0", "wi_1") if cfg.gated else ("wi",)
        for name in names:
            setattr(self, name, nn.Linear(cfg.d_model, cfg.d_ff, bias=False))
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(h.to(self.wo.weight.dtype))


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """transformers' float16 guard after each sub-layer: keep values finite (a step lower once one is inf)."""
    if x.dtype != torch.float16:
        return x
    limit = torch.finfo(x.dtype).max
    limit = torch.where(torch.isinf(x).any(), limit - 1000, limit)
    return x.clamp(-limit, limit)


class Block(nn.Module):
    def __init__(self, cfg: UMT5Config):
        super().__init__()
        norm = lambda: RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.layer = nn.ModuleList(
            [
                nn.ModuleDict({"layer_norm": norm(), "SelfAttention": Attention(cfg)}),
                nn.ModuleDict({"layer_norm": norm(), "DenseReluDense": FeedForward(cfg)}),
            ]
        )

    def forward(self, x: torch.Tensor, buckets: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        attn, ff = self.layer
        x = _clamp_fp16(x + attn["SelfAttention"](attn["layer_norm"](x), buckets, keep))
        return _clamp_fp16(x + ff["DenseReluDense"](ff["layer_norm"](x)))


class UMT5Encoder(nn.Module):
    """UMT5's encoder stack under transformers' parameter names (`shared`, `encoder.block.N.layer...`,
    `encoder.final_layer_norm`)."""

    def __init__(self, cfg: UMT5Config):
        super().__init__()
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"UMT5 feed_forward_proj {cfg.feed_forward_proj!r}: unknown activation")
        self.cfg = cfg
        self.shared = _table(cfg.vocab_size, cfg.d_model)
        self.encoder = nn.ModuleDict(
            {
                "block": nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers)),
                "final_layer_norm": RMSNorm(cfg.d_model, cfg.layer_norm_epsilon),
            }
        )

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask `[batch, tokens]` (mask 1 on real tokens) → last hidden states `[batch, tokens, dim]`."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        cfg = self.cfg
        buckets = relative_buckets(
            pos[None] - pos[:, None], cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        )
        keep = mask[:, None, None, :].bool()
        x = self.shared(ids)
        for block in self.encoder["block"]:
            x = block(x, buckets, keep)
        return self.encoder["final_layer_norm"](x)

    @classmethod
    def from_folder(cls, path: Path, *, dtype: torch.dtype, device: torch.device | str) -> UMT5Encoder:
        """The encoder of a transformers UMT5EncoderModel folder (`config.json` + `model.safetensors`, or
        shards named by `model.safetensors.index.json`) read a tensor at a time into `dtype` on `device`."""
        with torch.device("meta"):
            model = cls(UMT5Config.from_json(path / "config.json"))
        # transformers keeps `wo` in float32 in a float16 model
        materialize(model, dtype=dtype, device=device, keep_fp32=[".wo."] if dtype == torch.float16 else [])
        keys = checkpoint_keys(path)

        def resolve(key: str):
            if key == "encoder.embed_tokens.weight":  # tied to shared.weight, which a file may hold instead
                return None if "shared.weight" in keys else ("shared.weight", 0, 1)
            return key, 0, 1

        load_safetensors(model, checkpoint_files(path), resolve)
        return model.eval()


class UMT5TextEncoder(TextEncoder):
    """Wan's umt5-xxl encoder from a diffusers pipeline folder's `text_encoder/`."""

    def __init__(
        self, folder: str | Path, tokenizer: UMT5Tokenizer, *, dtype: torch.dtype, device: torch.device | str
    ):
        super().__init__(tokenizer)
        self.model = UMT5Encoder.from_folder(Path(folder) / "text_encoder", dtype=dtype, device=device)
        self.dim = self.model.cfg.d_model

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask)


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
