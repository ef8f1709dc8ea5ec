"""Wan2.1-architecture DiT configuration, readable from diffusers' and the original Wan config.json."""

from __future__ import annotations

from dataclasses import dataclass

# The original Wan code fixes what diffusers' config names: image-to-video models take CLIP ViT-H image tokens
# (1280 wide) projected to the model width, and FLF2V learns positions over two frames' 257 tokens each.
CLIP_DIM = 1280
FLF2V_IMAGE_TOKENS = 2 * 257


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
    # image-to-video (Wan2.1 I2V / FLF2V); None for text-to-video
    image_dim: int | None = None  # width of the image-encoder tokens (the image embedder's input)
    added_kv_proj_dim: int | None = None  # input width of cross-attention's image K/V projections
    pos_embed_seq_len: int | None = None  # FLF2V: learned positions over the two frames' image tokens

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    def __post_init__(self):
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim must be even and >= 6 for the 3D RoPE split, got {self.head_dim}")

    @classmethod
    def from_diffusers(cls, cfg: dict) -> WanConfig:
        """From a diffusers `WanTransformer3DModel` config.json."""
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
            image_dim=cfg.get("image_dim"),
            added_kv_proj_dim=cfg.get("added_kv_proj_dim"),
            pos_embed_seq_len=cfg.get("pos_embed_seq_len"),
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
            image_dim=self.image_dim,
            added_kv_proj_dim=self.added_kv_proj_dim,
            pos_embed_seq_len=self.pos_embed_seq_len,
        )

    @classmethod
    def from_original(cls, cfg: dict) -> WanConfig:
        """From the original Wan repo's config.json (`_class_name: WanModel`); defaults are WanModel's. Its
        `model_type` says the conditioning: t2v and Wan2.2's ti2v take text only, i2v and flf2v (Wan2.1) add
        CLIP image tokens."""
        model_type = cfg.get("model_type", "t2v")
        if model_type not in ("t2v", "ti2v", "i2v", "flf2v"):
            raise ValueError(f"unsupported Wan model_type {model_type!r} (t2v, ti2v, i2v or flf2v)")
        dim, heads = cfg.get("dim", 2048), cfg.get("num_heads", 16)
        # Wan2.2 I2V A14B says i2v too but has no CLIP image tokens (`complete_original`)
        image = model_type in ("i2v", "flf2v") and cfg.get("image_encoder", True)
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
            image_dim=CLIP_DIM if image else None,
            added_kv_proj_dim=dim if image else None,
            pos_embed_seq_len=FLF2V_IMAGE_TOKENS if model_type == "flf2v" else None,
        )

    def to_original(self) -> dict:
        """ValueError for a config the original format cannot state (its image widths are fixed)."""
        model_type = "flf2v" if self.pos_embed_seq_len else "i2v" if self.image_dim else "t2v"
        cfg = dict(
            _class_name="WanModel",
            model_type=model_type,
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
        if WanConfig.from_original(cfg) != self:
            raise ValueError(f"the original Wan config.json cannot express {self}")
        return cfg


def complete_original(config_json: dict, keys: set[str]) -> dict:
    """An original config whose checkpoint has no image embedder (Wan2.2 I2V A14B: `model_type` i2v, like
    Wan2.1 I2V's, but no CLIP image tokens) gains `image_encoder: false`."""
    if config_json.get("model_type") in ("i2v", "flf2v") and not any("img_emb." in k for k in keys):
        return config_json | {"image_encoder": False}
    return config_json
