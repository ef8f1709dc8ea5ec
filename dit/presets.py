"""Named models. `SHIPPED` names the pipeline folders that come with the package (trained weights: `tiny`,
the default model, written by `scripts/train_tiny.py`); `PRESETS` are configs (config.json form,
`_class_name` included) that load with random weights from a fixed seed, for tests and benchmarks; the
Wan2.1 entries are the published diffusers configs."""

from __future__ import annotations

from pathlib import Path

SHIPPED: dict[str, Path] = {"tiny": Path(__file__).resolve().parent / "tiny" / "model"}


def resolve(model: str | Path) -> str | Path:
    """A shipped model's folder for its name; anything else (a preset, a path) unchanged."""
    return str(SHIPPED[model]) if isinstance(model, str) and model in SHIPPED else model


_WAN = dict(_class_name="WanTransformer3DModel", patch_size=[1, 2, 2], in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, cross_attn_norm=True, eps=1e-6, attention_head_dim=128)  # fmt: skip

PRESETS: dict[str, dict] = {
    # Seconds on a CPU: 2 layers, 4 heads of 16 (RoPE t/h/w = 8/4/4; 4 heads so Ulysses reaches degree 4),
    # text_dim 32; random weights, for tests that need arbitrary ones.
    "tiny-random": {
        **_WAN,
        "num_layers": 2,
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "ffn_dim": 64,
        "text_dim": 32,
        "freq_dim": 32,
    },  # fmt: skip
    "wan2.1-1.3b": {**_WAN, "num_layers": 30, "num_attention_heads": 12, "ffn_dim": 8960},
    "wan2.1-14b": {**_WAN, "num_layers": 40, "num_attention_heads": 40, "ffn_dim": 13824},
}


def register_preset(name: str, config: dict) -> None:
    """Other families add their presets here (config.json form with `_class_name`)."""
    PRESETS[name] = config
