"""HunyuanVideo-1.5 transformer configuration: the fields of diffusers' `config.json`, as a dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DIFFUSERS_CLASS_NAME = "HunyuanVideo15Transformer3DModel"

# The ByT5 projection's hidden width is fixed in the published architecture, not a config field.
BYT5_HIDDEN_DIM = 2048


@dataclass(frozen=True)
class HunyuanVideo15Config:
    in_channels: int = 65  # 32 noisy latent + 32 conditioning latent + 1 mask channel
    out_channels: int = 32
    num_attention_heads: int = 16
    attention_head_dim: int = 128
    num_layers: int = 54
    num_refiner_layers: int = 2
    mlp_ratio: float = 4.0
    patch_size: int = 1
    patch_size_t: int = 1
    qk_norm: str = "rms_norm"
    text_embed_dim: int = 3584  # Qwen2.5-VL hidden states
    text_embed_2_dim: int = 1472  # ByT5 (glyph) hidden states
    image_embed_dim: int = 1152  # SigLIP image embeddings (image-to-video)
    rope_theta: float = 256.0
    rope_axes_dim: tuple[int, int, int] = (16, 56, 56)  # t/h/w split of the head dim
    target_size: int = 640
    task_type: str = "i2v"
    use_meanflow: bool = False

    def __post_init__(self):
        if self.qk_norm != "rms_norm":
            raise ValueError(f"qk_norm={self.qk_norm!r} is not supported; allowed: 'rms_norm'")
        if sum(self.rope_axes_dim) != self.attention_head_dim:
            raise ValueError(
                f"rope_axes_dim {tuple(self.rope_axes_dim)} must sum to "
                f"attention_head_dim={self.attention_head_dim}"
            )

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def patch(self) -> tuple[int, int, int]:
        return (self.patch_size_t, self.patch_size, self.patch_size)

    @classmethod
    def from_dict(cls, raw: dict) -> HunyuanVideo15Config:
        """Build from a diffusers `config.json` dict; bookkeeping keys (`_class_name`, ...) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in names}
        if "rope_axes_dim" in kwargs:
            kwargs["rope_axes_dim"] = tuple(kwargs["rope_axes_dim"])
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rope_axes_dim": list(self.rope_axes_dim)}


_TINY_JOINT = HunyuanVideo15Config(
    in_channels=9,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=16,
    num_layers=2,
    num_refiner_layers=1,
    text_embed_dim=32,
    text_embed_2_dim=16,
    image_embed_dim=24,
    rope_axes_dim=(4, 6, 6),
    task_type="t2v",
)

PRESETS: dict[str, HunyuanVideo15Config] = {
    # Tiny random model for CPU tests and the `tiny-joint` pipeline preset.
    "tiny-joint": _TINY_JOINT,
    # The same transformer as image-to-video (`dit.hunyuan.i2v.PRESETS`: a tiny SigLIP tower of its
    # `image_embed_dim` encodes the first frame); a request without a size gets one of about 64² pixels.
    "tiny-joint-i2v": dataclasses.replace(_TINY_JOINT, task_type="i2v", target_size=64),
    # hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v (8.3B parameters).
    "hunyuanvideo-1.5-480p-t2v": HunyuanVideo15Config(task_type="t2v"),
}
