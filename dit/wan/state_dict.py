"""Checkpoint key names: ours ↔ diffusers ↔ the original Wan repository.

One table row per checkpoint tensor: (our parameter, part, parts, diffusers key, original Wan key).
`part/parts` says which equal slice along dim 0 of our parameter the tensor fills: our fused projections
hold q|k|v (self-attention) and k|v (cross-attention) stacked, and `qk_norm` stacks q and k RMSNorm weights.

Notable renames (original → diffusers → ours):
  patch_embedding → patch_embedding → patch_embed.proj
  time_embedding.{0,2} → condition_embedder.time_embedder.linear_{1,2} → time_embed.mlp.{0,2}
  time_projection.1 → condition_embedder.time_proj → time_embed.proj
  text_embedding.{0,2} → condition_embedder.text_embedder.linear_{1,2} → text_embed.{0,2}
  blocks.N.self_attn.{q,k,v,o} → blocks.N.attn1.to_{q,k,v,out.0} → blocks.N.self_attn.{qkv[0..2], out}
  blocks.N.self_attn.norm_{q,k} → blocks.N.attn1.norm_{q,k} → blocks.N.self_attn.qk_norm[0..1]
  blocks.N.cross_attn.{q,k,v,o} → blocks.N.attn2.to_{q,k,v,out.0} → blocks.N.cross_attn.{q, kv[0..1], out}
  blocks.N.norm3 (affine, before cross-attention) → blocks.N.norm2 → blocks.N.norm_cross
  blocks.N.ffn.{0,2} → blocks.N.ffn.net.{0.proj,2} → blocks.N.ffn.{0,2}
  blocks.N.modulation → blocks.N.scale_shift_table → blocks.N.modulation
  head.head / head.modulation → proj_out / scale_shift_table → head.proj / head.modulation
Image-to-video (Wan2.1 I2V / FLF2V) adds:
  img_emb.proj.{0,1,3,4} → condition_embedder.image_embedder.{norm1, ff.net.0.proj, ff.net.2, norm2}
    → img_embed.{norm1, ff.0, ff.2, norm2}
  img_emb.emb_pos → condition_embedder.image_embedder.pos_embed → img_embed.pos_embed (FLF2V)
  blocks.N.cross_attn.{k,v}_img → blocks.N.attn2.add_{k,v}_proj → blocks.N.cross_attn.kv_img[0..1]
  blocks.N.cross_attn.norm_k_img → blocks.N.attn2.norm_added_k → blocks.N.cross_attn.norm_k_img
Original checkpoints may carry a `model.diffusion_model.` prefix; it is stripped.
"""

from __future__ import annotations

from typing import NamedTuple

from dit.wan.config import WanConfig

WB = ("weight", "bias")


class Row(NamedTuple):
    ours: str
    part: int
    parts: int
    diffusers: str
    original: str


def _linear(ours: str, diffusers: str, original: str, part: int = 0, parts: int = 1) -> list[Row]:
    return [Row(f"{ours}.{p}", part, parts, f"{diffusers}.{p}", f"{original}.{p}") for p in WB]


def key_table(cfg: WanConfig) -> list[Row]:
    rows = _linear("patch_embed.proj", "patch_embedding", "patch_embedding")
    rows += _linear("time_embed.mlp.0", "condition_embedder.time_embedder.linear_1", "time_embedding.0")
    rows += _linear("time_embed.mlp.2", "condition_embedder.time_embedder.linear_2", "time_embedding.2")
    rows += _linear("time_embed.proj", "condition_embedder.time_proj", "time_projection.1")
    rows += _linear("text_embed.0", "condition_embedder.text_embedder.linear_1", "text_embedding.0")
    rows += _linear("text_embed.2", "condition_embedder.text_embedder.linear_2", "text_embedding.2")
    if cfg.image_dim is not None:
        e, d = "img_embed.", "condition_embedder.image_embedder."
        rows += _linear(e + "norm1", d + "norm1", "img_emb.proj.0")
        rows += _linear(e + "ff.0", d + "ff.net.0.proj", "img_emb.proj.1")
        rows += _linear(e + "ff.2", d + "ff.net.2", "img_emb.proj.3")
        rows += _linear(e + "norm2", d + "norm2", "img_emb.proj.4")
        if cfg.pos_embed_seq_len is not None:
            rows.append(Row(e + "pos_embed", 0, 1, d + "pos_embed", "img_emb.emb_pos"))
    for i in range(cfg.num_layers):
        o, d, w = f"blocks.{i}.", f"blocks.{i}.", f"blocks.{i}."
        for part, name in enumerate("qkv"):
            rows += _linear(o + "self_attn.qkv", d + f"attn1.to_{name}", w + f"self_attn.{name}", part, 3)
        for part, name in enumerate("qk"):
            rows.append(
                Row(
                    o + "self_attn.qk_norm",
                    part,
                    2,
                    d + f"attn1.norm_{name}.weight",
                    w + f"self_attn.norm_{name}.weight",
                )
            )
        rows += _linear(o + "self_attn.out", d + "attn1.to_out.0", w + "self_attn.o")
        rows += _linear(o + "cross_attn.q", d + "attn2.to_q", w + "cross_attn.q")
        for part, name in enumerate("kv"):
            rows += _linear(o + "cross_attn.kv", d + f"attn2.to_{name}", w + f"cross_attn.{name}", part, 2)
        for name in "qk":
            rows.append(
                Row(
                    o + f"cross_attn.norm_{name}.weight",
                    0,
                    1,
                    d + f"attn2.norm_{name}.weight",
                    w + f"cross_attn.norm_{name}.weight",
                )
            )
        rows += _linear(o + "cross_attn.out", d + "attn2.to_out.0", w + "cross_attn.o")
        if cfg.added_kv_proj_dim is not None:
            for part, name in enumerate("kv"):
                rows += _linear(
                    o + "cross_attn.kv_img",
                    d + f"attn2.add_{name}_proj",
                    w + f"cross_attn.{name}_img",
                    part,
                    2,
                )
            rows.append(
                Row(
                    o + "cross_attn.norm_k_img.weight",
                    0,
                    1,
                    d + "attn2.norm_added_k.weight",
                    w + "cross_attn.norm_k_img.weight",
                )
            )
        if cfg.cross_attn_norm:
            rows += _linear(o + "norm_cross", d + "norm2", w + "norm3")
        rows += _linear(o + "ffn.0", d + "ffn.net.0.proj", w + "ffn.0")
        rows += _linear(o + "ffn.2", d + "ffn.net.2", w + "ffn.2")
        rows.append(Row(o + "modulation", 0, 1, d + "scale_shift_table", w + "modulation"))
    rows += _linear("head.proj", "proj_out", "head.head")
    rows.append(Row("head.modulation", 0, 1, "scale_shift_table", "head.modulation"))
    return rows


def key_map(cfg: WanConfig, naming: str) -> dict[str, tuple[str, int, int]]:
    """Checkpoint key → (our parameter, part, parts) for `naming` in {"diffusers", "original"}."""
    return {getattr(r, naming): (r.ours, r.part, r.parts) for r in key_table(cfg)}


def normalize_key(key: str, naming: str) -> str | None:
    """Strip wrappers; None for keys the reference itself ignores."""
    if naming == "original":
        return key.removeprefix("model.diffusion_model.")
    return None if key.endswith("norm_added_q.weight") or key.endswith("norm_added_q.bias") else key


def export_state_dict(model, naming: str) -> dict:
    """Our weights under `naming`'s keys (the inverse of `key_map`; used by round-trip tests and tools)."""
    params = dict(model.named_parameters())
    return {
        getattr(r, naming): params[r.ours].chunk(r.parts, 0)[r.part].clone() for r in key_table(model.config)
    }


def resolver(config: WanConfig, naming: str):
    """Checkpoint key → (our parameter, part, parts); None for keys the reference ignores; KeyError else."""
    table = key_map(config, naming)

    def resolve(key: str):
        key = normalize_key(key, naming)
        return None if key is None else table[key]

    return resolve


def lora_resolver(config: WanConfig):
    """LoRA files name Wan's weights either way, diffusers' or the original's, whatever the checkpoint's:
    LightX2V's LoRAs use the original names on diffusers folders (a name both use is the same weight)."""
    table = {**key_map(config, "original"), **key_map(config, "diffusers")}
    return table.__getitem__
