"""HunyuanVideo-1.5 family: joint image+text attention DiT in the diffusers
`HunyuanVideo15Transformer3DModel` weight layout."""

from dit.hunyuan.config import DIFFUSERS_CLASS_NAME, PRESETS, HunyuanVideo15Config
from dit.hunyuan.model import HunyuanVideo15Transformer
from dit.hunyuan.weights import empty_model, load_hunyuan_transformer, random_init


def build_preset(name: str, *, dtype=None, device="cpu", seed: int = 0) -> HunyuanVideo15Transformer:
    """A preset's architecture with deterministic random weights (benchmarks, tests, `tiny-joint`)."""
    import torch

    if name not in PRESETS:
        raise ValueError(f"unknown HunyuanVideo-1.5 preset {name!r}; allowed: {sorted(PRESETS)}")
    return random_init(empty_model(PRESETS[name], dtype or torch.float32, device), seed).eval()


__all__ = [
    "DIFFUSERS_CLASS_NAME",
    "PRESETS",
    "HunyuanVideo15Config",
    "HunyuanVideo15Transformer",
    "build_preset",
    "load_hunyuan_transformer",
]
