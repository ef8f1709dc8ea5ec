"""Diffusers-layout checkpoint keys -> our parameter names (for `dit.weights.load_safetensors`).

Key mapping (diffusers `HunyuanVideo15Transformer3DModel` -> ours). Per-stream q/k/v projections are
fused into one `*qkv` linear, so `to_q/to_k/to_v` (and `add_{q,k,v}_proj`) fill thirds of it:
    x_embedder.proj                                   -> patch_embed
    time_embed.timestep_embedder[_r].linear_N         -> time_embed[_r].mlp.linear_N
    context_embedder.time_text_embed.timestep_embedder -> text_refiner.time_embed.mlp
    context_embedder.time_text_embed.text_embedder    -> text_refiner.pooled_embed
    context_embedder.token_refiner.refiner_blocks.i   -> text_refiner.blocks.i
        attn.to_{q,k,v} -> qkv, attn.to_out.0 -> proj, ff.net.0.proj/ff.net.2 -> mlp.linear_1/2,
        norm_out.linear -> gates.linear
    context_embedder_2                                -> byt5_proj
    transformer_blocks.i                              -> blocks.i
        norm1/norm1_context.linear -> img_mod/txt_mod.linear, attn.to_{q,k,v} -> attn.img_qkv,
        attn.add_{q,k,v}_proj -> attn.txt_qkv, attn.norm_{q,k} -> attn.img_norm_{q,k},
        attn.norm_added_{q,k} -> attn.txt_norm_{q,k}, attn.to_out.0 -> attn.img_out,
        attn.to_add_out -> attn.txt_out,
        ff/ff_context.net.0.proj -> img_mlp/txt_mlp.linear_1, .net.2 -> .linear_2
    everything else (image_embedder, cond_type_embed, norm_out, proj_out) keeps its name.
"""

from __future__ import annotations

import re

_RULES = [
    (r"^x_embedder\.proj\.", "patch_embed."),
    (r"^time_embed\.timestep_embedder_r\.", "time_embed_r.mlp."),
    (r"^time_embed\.timestep_embedder\.", "time_embed.mlp."),
    (r"^context_embedder\.time_text_embed\.timestep_embedder\.", "text_refiner.time_embed.mlp."),
    (r"^context_embedder\.time_text_embed\.text_embedder\.", "text_refiner.pooled_embed."),
    (r"^context_embedder\.token_refiner\.refiner_blocks\.", "text_refiner.blocks."),
    (r"^context_embedder\.", "text_refiner."),
    (r"^context_embedder_2\.", "byt5_proj."),
    (r"^transformer_blocks\.", "blocks."),
    (r"^(text_refiner\.blocks\.\d+)\.attn\.to_([qkv])\.", r"\1.qkv.\2."),
    (r"^(text_refiner\.blocks\.\d+)\.attn\.to_out\.0\.", r"\1.proj."),
    (r"^(text_refiner\.blocks\.\d+)\.ff\.", r"\1.mlp."),
    (r"^(text_refiner\.blocks\.\d+)\.norm_out\.", r"\1.gates."),
    (r"^(blocks\.\d+)\.norm1\.", r"\1.img_mod."),
    (r"^(blocks\.\d+)\.norm1_context\.", r"\1.txt_mod."),
    (r"^(blocks\.\d+)\.attn\.to_([qkv])\.", r"\1.attn.img_qkv.\2."),
    (r"^(blocks\.\d+)\.attn\.add_([qkv])_proj\.", r"\1.attn.txt_qkv.\2."),
    (r"^(blocks\.\d+)\.attn\.norm_([qk])\.", r"\1.attn.img_norm_\2."),
    (r"^(blocks\.\d+)\.attn\.norm_added_([qk])\.", r"\1.attn.txt_norm_\2."),
    (r"^(blocks\.\d+)\.attn\.to_out\.0\.", r"\1.attn.img_out."),
    (r"^(blocks\.\d+)\.attn\.to_add_out\.", r"\1.attn.txt_out."),
    (r"^(blocks\.\d+)\.ff\.", r"\1.img_mlp."),
    (r"^(blocks\.\d+)\.ff_context\.", r"\1.txt_mlp."),
    (r"\.net\.0\.proj\.", ".linear_1."),
    (r"\.net\.2\.", ".linear_2."),
]
_FUSED = re.compile(r"^(.*qkv)\.([qkv])\.(weight|bias)$")


def map_key(key: str) -> tuple[str, int | None]:
    """diffusers key -> (our parameter name, third of a fused qkv it fills or None)."""
    for pattern, repl in _RULES:
        key = re.sub(pattern, repl, key)
    fused = _FUSED.match(key)
    if fused:
        return f"{fused[1]}.{fused[3]}", "qkv".index(fused[2])
    return key, None


def resolve(key: str) -> tuple[str, int, int]:
    """`dit.weights` resolver: (our parameter, which third of a fused qkv / 0, parts)."""
    name, slot = map_key(key)
    return (name, 0, 1) if slot is None else (name, slot, 3)
