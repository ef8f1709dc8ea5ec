"""Named models. `SHIPPED` names the pipeline folders that come with the package (trained weights: `tiny`,
the default model, written by `scripts/train_tiny.py`); `PRESETS` are configs (config.json form,
`_class_name` included) that load with random weights from a fixed seed, for tests and benchmarks; the
Wan entries are the published configs of the `Wan-AI/...-Diffusers` transformers."""

from __future__ import annotations

from pathlib import Path

SHIPPED: dict[str, Path] = {"tiny": Path(__file__).resolve().parent / "tiny" / "model"}


def resolve(model: str | Path) -> str | Path:
    """A shipped model's folder for its name; anything else (a preset, a path) unchanged."""
    return str(SHIPPED[model]) if isinstance(model, str) and model in SHIPPED else model


_WAN = dict(_class_name="WanTransformer3DModel", patch_size=[1, 2, 2], in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, cross_attn_norm=True, eps=1e-6, attention_head_dim=128,
            rope_max_seq_len=1024)  # fmt: skip

# Seconds on a CPU: 2 layers, 4 heads of 16 (RoPE t/h/w = 8/4/4; 4 heads so Ulysses reaches degree 4),
# text_dim 32; random weights, for tests that need arbitrary ones.
_TINY = {**_WAN, "num_layers": 2, "num_attention_heads": 4, "attention_head_dim": 16, "ffn_dim": 64,
         "text_dim": 32, "freq_dim": 32}  # fmt: skip

PRESETS: dict[str, dict] = {
    "tiny-random": _TINY,
    # tiny-random as image-to-video: 16 noise + 4 mask + 16 image latent channels in, image tokens 32 wide
    "tiny-i2v-random": {**_TINY, "in_channels": 36, "image_dim": 32, "added_kv_proj_dim": 64},
    "tiny-moe-random": _TINY,  # two experts (dit.wan.experts), for tests
    # tiny-random as Wan2.2 TI2V-5B: 48 latent channels in and out, with the tiny Wan2.2 VAE (dit.wan.vae)
    "tiny-ti2v-random": {**_TINY, "in_channels": 48, "out_channels": 48},
    "wan2.1-1.3b": {**_WAN, "num_layers": 30, "num_attention_heads": 12, "ffn_dim": 8960},
    "wan2.1-14b": {**_WAN, "num_layers": 40, "num_attention_heads": 40, "ffn_dim": 13824},
    # Wan2.1-I2V-14B-480P (720P: the same transformer config): CLIP ViT-H image tokens, 1280 wide
    "wan2.1-i2v-14b-480p": {
        **_WAN,
        "num_layers": 40,
        "num_attention_heads": 40,
        "ffn_dim": 13824,
        "in_channels": 36,
        "image_dim": 1280,
        "added_kv_proj_dim": 5120,
    },  # fmt: skip
    # Wan2.2-TI2V-5B: text-only cross-attention; an input image enters as the first latent frame
    "wan2.2-ti2v-5b": {
        **_WAN,
        "num_layers": 30,
        "num_attention_heads": 24,
        "ffn_dim": 14336,
        "in_channels": 48,
        "out_channels": 48,
    },  # fmt: skip
    # Wan2.2 A14B text-to-video: two experts of Wan2.1-14B's shape (dit.wan.experts pairs the second)
    "wan2.2-t2v-a14b": {**_WAN, "num_layers": 40, "num_attention_heads": 40, "ffn_dim": 13824},
}


def register_preset(name: str, config: dict) -> None:
    """Other families add their presets here (config.json form with `_class_name`)."""
    PRESETS[name] = config
