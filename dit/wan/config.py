"""Wan2.1-architecture DiT configuration, readable from diffusers' and the original Wan config.json."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WanConfig:
    num_layers: int = 30
    num_heads: int = 12
    head_dim: int = 128
    ffn_dim: int = 8960
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    def __post_init__(self):
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim must be even and >= 6 for the 3D RoPE split, got {self.head_dim}")

    @classmethod
    def from_diffusers(cls, cfg: dict) -> WanConfig:
        """From a diffusers `WanTransformer3DModel` config.json."""
        if cfg.get("image_dim") is not None or cfg.get("added_kv_proj_dim") is not None:
            raise ValueError(
                "image-to-video Wan checkpoints (image_dim / added_kv_proj_dim) are not supported"
            )
        return cls(
            num_layers=cfg.get("num_layers", 40),
            num_heads=cfg.get("num_attention_heads", 40),
            head_dim=cfg.get("attention_head_dim", 128),
            ffn_dim=cfg.get("ffn_dim", 13824),
            in_channels=cfg.get("in_channels", 16),
            out_channels=cfg.get("out_channels") or cfg.get("in_channels", 16),
            text_dim=cfg.get("text_dim", 4096),
            freq_dim=cfg.get("freq_dim", 256),
            patch_size=tuple(cfg.get("patch_size", (1, 2, 2))),
            cross_attn_norm=cfg.get("cross_attn_norm", True),
            eps=cfg.get("eps", 1e-6),
        )

    def to_diffusers(self) -> dict:
        return dict(
            num_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            attention_head_dim=self.head_dim,
            ffn_dim=self.ffn_dim,
            in_channels=self.in_channels,
            out_channels=self.out_channels,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            patch_size=list(self.patch_size),
            cross_attn_norm=self.cross_attn_norm,
            eps=self.eps,
        )

    @classmethod
    def from_original(cls, cfg: dict) -> WanConfig:
        """From the original Wan repo's config.json (`_class_name: WanModel`); defaults are WanModel's."""
        if cfg.get("model_type", "t2v") != "t2v":
            raise ValueError(
                f"only text-to-video Wan checkpoints are supported, got model_type={cfg['model_type']}"
            )
        dim, heads = cfg.get("dim", 2048), cfg.get("num_heads", 16)
        return cls(
            num_layers=cfg.get("num_layers", 32),
            num_heads=heads,
            head_dim=dim // heads,
            ffn_dim=cfg.get("ffn_dim", 8192),
            in_channels=cfg.get("in_dim", 16),
            out_channels=cfg.get("out_dim", 16),
            text_dim=cfg.get("text_dim", 4096),
            freq_dim=cfg.get("freq_dim", 256),
            patch_size=tuple(cfg.get("patch_size", (1, 2, 2))),
            cross_attn_norm=cfg.get("cross_attn_norm", True),
            eps=cfg.get("eps", 1e-6),
        )

    def to_original(self) -> dict:
        return dict(
            _class_name="WanModel",
            model_type="t2v",
            dim=self.dim,
            num_heads=self.num_heads,
            num_layers=self.num_layers,
            ffn_dim=self.ffn_dim,
            in_dim=self.in_channels,
            out_dim=self.out_channels,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            patch_size=list(self.patch_size),
            cross_attn_norm=self.cross_attn_norm,
            eps=self.eps,
        )
