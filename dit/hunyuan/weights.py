"""Diffusers-layout checkpoints -> our module names, loaded straight into the target dtype/device.

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

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from dit.hunyuan.config import HunyuanVideo15Config
from dit.hunyuan.model import HunyuanVideo15Transformer

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


def transformer_dir(path: str | Path) -> Path:
    """A `transformer/` folder itself, or a pipeline folder holding one."""
    path = Path(path)
    return path / "transformer" if (path / "transformer" / "config.json").exists() else path


def read_config(path: str | Path) -> HunyuanVideo15Config:
    return HunyuanVideo15Config.from_dict(json.loads((transformer_dir(path) / "config.json").read_text()))


def _safetensors_files(folder: Path) -> list[Path]:
    index = sorted(folder.glob("*.safetensors.index.json"))
    if index:
        shards = set(json.loads(index[0].read_text())["weight_map"].values())
        return [folder / name for name in sorted(shards)]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return files


def empty_model(config: HunyuanVideo15Config, dtype: torch.dtype, device) -> HunyuanVideo15Transformer:
    """The model with uninitialised storage of the target dtype on the target device (no fp32 copy)."""
    with torch.device("meta"):
        model = HunyuanVideo15Transformer(config).to(dtype)
    return model.to_empty(device=device)


@torch.no_grad()
def load_weights(model: HunyuanVideo15Transformer, folder: str | Path) -> None:
    """Stream every tensor of a diffusers-layout checkpoint into the model, converting dtype on copy."""
    params = dict(model.named_parameters())
    expected = {
        (name, slot) for name, p in params.items() for slot in ([0, 1, 2] if "qkv." in name else [None])
    }
    filled = set()
    for file in _safetensors_files(Path(folder)):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                name, slot = map_key(key)
                if name not in params:
                    raise KeyError(f"checkpoint key {key!r} (-> {name!r}) has no place in the model")
                target = params[name]
                if slot is not None:
                    third = target.shape[0] // 3
                    target = target[slot * third : (slot + 1) * third]
                target.copy_(f.get_tensor(key))
                filled.add((name, slot))
    missing = sorted(f"{n}[{s}]" if s is not None else n for n, s in expected - filled)
    if missing:
        raise KeyError(f"checkpoint in {folder} lacks {len(missing)} tensors, e.g. {missing[:5]}")


def load_hunyuan_transformer(
    path: str | Path, *, dtype=torch.float32, device="cpu"
) -> HunyuanVideo15Transformer:
    folder = transformer_dir(path)
    model = empty_model(read_config(folder), dtype, device)
    load_weights(model, folder)
    return model.eval()


@torch.no_grad()
def random_init(model: HunyuanVideo15Transformer, seed: int = 0) -> HunyuanVideo15Transformer:
    """Deterministic random weights (same on every rank and device): norms 1, the rest N(0, 0.02)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name and p.ndim == 1 and name.endswith("weight"):
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32) * 0.02)
    return model
