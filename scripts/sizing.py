"""GPU memory per rank for a deployment, computed from the model shapes (no weights, no GPU).

Parameter counts come from building each component on the meta device from its published config, so they are
exact for those configs. Activation memory is an estimate from the tensor shapes of one DiT block's forward
(see `activation_bytes`): sequence parallelism divides activations by the number of ranks, while every rank
holds a full copy of the DiT's weights and of the VAE (each rank decodes a band of rows). Only the replica
leader holds the text encoder(s) (it encodes the prompts and broadcasts the conditioning), so the table gives
the leader's memory and the other ranks'. A two-expert model (Wan2.2 A14B) has rows with both experts on the
device and with the idle one in host memory. `python scripts/sizing.py` prints the table in deploy/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

BF16 = 2
FP32 = 4  # the VAE decodes in float32 whatever the DiT runs in
GIB = 1024**3


@dataclass(frozen=True)
class Resolution:
    name: str
    height: int
    width: int
    frames: int = 81


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of one text-to-video model."""

    name: str
    preset: str  # dit preset of the transformer
    text_encoder: str  # a name `text_encoder_params` knows
    vae: str  # diffusers VAE class, built with its default (published) config
    vae_spatial: int  # pixels per latent pixel
    vae_temporal: int  # frames per latent frame
    resolutions: tuple[Resolution, ...]
    experts: int = 1  # Wan2.2 A14B: two transformers of the preset's shape (dit.wan.experts)
    vae_config: tuple = ()  # (key, value) pairs over the VAE class's default config (Wan2.2's VAE)


# Wan2.2-TI2V-5B-Diffusers/vae/config.json: ×16 in space (×8 by its layers, ×2 by its patch), 48 channels
WAN22_VAE = (("base_dim", 160), ("decoder_base_dim", 256), ("z_dim", 48), ("dim_mult", [1, 2, 4, 4]),
             ("is_residual", True), ("in_channels", 12), ("out_channels", 12), ("patch_size", 2),
             ("scale_factor_spatial", 16))  # fmt: skip

MODELS = (
    ModelShape(
        "Wan2.1 1.3B", "wan2.1-1.3b", "umt5-xxl", "AutoencoderKLWan", 8, 4, (Resolution("480p", 480, 832),)
    ),
    ModelShape(
        "Wan2.1 14B",
        "wan2.1-14b",
        "umt5-xxl",
        "AutoencoderKLWan",
        8,
        4,
        (Resolution("480p", 480, 832), Resolution("720p", 720, 1280)),
    ),  # fmt: skip
    ModelShape(
        "Wan2.2 A14B",
        "wan2.2-t2v-a14b",
        "umt5-xxl",
        "AutoencoderKLWan",
        8,
        4,
        (Resolution("480p", 480, 832), Resolution("720p", 720, 1280)),
        experts=2,
    ),  # fmt: skip
    ModelShape(
        "Wan2.1 I2V 14B",
        "wan2.1-i2v-14b-480p",
        "umt5-xxl+clip-vit-h",
        "AutoencoderKLWan",
        8,
        4,
        (Resolution("480p", 480, 832), Resolution("720p", 720, 1280)),
    ),  # fmt: skip
    ModelShape(
        "Wan2.2 TI2V-5B",
        "wan2.2-ti2v-5b",
        "umt5-xxl",
        "AutoencoderKLWan",
        16,
        4,
        (Resolution("720p", 704, 1280, 121),),
        vae_config=WAN22_VAE,
    ),  # fmt: skip
    ModelShape(
        "HunyuanVideo-1.5",
        "hunyuanvideo-1.5-480p-t2v",
        "qwen2.5-vl-7b+byt5",
        "AutoencoderKLHunyuanVideo15",
        16,
        4,
        (Resolution("480p", 480, 848), Resolution("720p", 720, 1280)),
    ),  # fmt: skip
)


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def transformer_shape(preset: str) -> tuple[int, dict]:
    """(parameter count, config json) of a dit preset, built on the meta device."""
    from dit.families import presets, weight_format

    config_json = presets()[preset]
    weights = weight_format(config_json["_class_name"])
    with torch.device("meta"):
        model = weights.build(weights.parse_config(config_json))
    return count_params(model), config_json


def text_encoder_params(name: str) -> int:
    """Published text-encoder configs, built on the meta device through transformers."""
    import transformers as tf

    with torch.device("meta"):
        if name.startswith("umt5-xxl"):  # Wan: the UMT5-XXL encoder only
            cfg = tf.UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                num_heads=64, feed_forward_proj="gated-gelu")  # fmt: skip
            umt5 = count_params(tf.UMT5EncoderModel(cfg))
            if name == "umt5-xxl":
                return umt5
            if name == "umt5-xxl+clip-vit-h":  # Wan2.1 I2V: and the CLIP ViT-H/14 image encoder
                clip = tf.CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                           num_attention_heads=16, image_size=224, patch_size=14)  # fmt: skip
                return umt5 + count_params(tf.CLIPVisionModel(clip))
        if (
            name == "qwen2.5-vl-7b+byt5"
        ):  # HunyuanVideo-1.5: Qwen2.5-VL-7B language model + ByT5-small glyph encoder
            qwen = tf.Qwen2Config(
                vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4,
            )  # fmt: skip
            byt5 = tf.T5Config(vocab_size=384, d_model=1472, d_kv=64, d_ff=3584, num_layers=12, num_heads=6,
                               feed_forward_proj="gated-gelu")  # fmt: skip
            return count_params(tf.Qwen2Model(qwen)) + count_params(tf.T5EncoderModel(byt5))
    raise KeyError(name)


def vae_params(class_name: str, config: tuple = ()) -> int:
    import diffusers

    with torch.device("meta"):
        return count_params(getattr(diffusers, class_name)(**dict(config)))


def tokens(model: ModelShape, res: Resolution, patch: tuple[int, int, int]) -> int:
    f = (res.frames - 1) // model.vae_temporal + 1
    h, w = res.height // model.vae_spatial, res.width // model.vae_spatial
    return (f // patch[0]) * (h // patch[1]) * (w // patch[2])


def activation_bytes(seq: int, dim: int, ffn: int, ranks: int) -> int:
    """Peak live activations of one block's forward on one rank, bf16, batch 1 (CFG passes run one at a time).

    Live across the block: the fp32 residual stream and its modulated copy (s·d·(4+2)). Attention phase:
    fused QKV (3·s·d), its all-to-all send and receive buffers (2·3·s·d), the attention output and its
    return all-to-all (2·s·d), plus kernel workspace of the same order (s·d). FFN phase: the hidden
    activation and its GELU (2·s·ffn). `s` is the per-rank share of the tokens.
    """
    s = -(-seq // ranks)
    attention = (3 + 6 + 2 + 1) * s * dim * BF16
    ffn_phase = 2 * s * ffn * BF16
    return s * dim * (4 + BF16) + max(attention, ffn_phase)


def table(ranks_list=(1, 2, 4, 8)) -> list[dict]:
    rows = []
    for model in MODELS:
        dit_params, cfg = transformer_shape(model.preset)
        text_params, vae = text_encoder_params(model.text_encoder), vae_params(model.vae, model.vae_config)
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("attention_head_dim")
        dim = heads * head_dim
        ffn = cfg.get("ffn_dim") or int(dim * cfg.get("mlp_ratio", 4.0))
        patch = tuple(cfg["patch_size"]) if isinstance(cfg.get("patch_size"), list) else (
            cfg.get("patch_size_t", 1), cfg.get("patch_size", 1), cfg.get("patch_size", 1))  # fmt: skip
        # two experts: both on the device, or the idle one in host memory (`offload_idle_expert`)
        residency = {1: ""} if model.experts == 1 else {2: ", both experts", 1: ", idle expert on host"}
        for (resident, named), res in itertools.product(residency.items(), model.resolutions):
            seq = tokens(model, res, patch)
            for ranks in ranks_list:
                act = activation_bytes(seq, dim, ffn, ranks)
                # every rank: the DiT(s) on the device, its share of the activations, the VAE
                other = (resident * dit_params * BF16 + act + vae * FP32) / GIB
                rows.append(
                    dict(
                        model=model.name + named,
                        resolution=res.name,
                        tokens=seq,
                        ranks=ranks,
                        dit_params_b=resident * dit_params / 1e9,  # on the device
                        text_params_b=text_params / 1e9,
                        vae_params_b=vae / 1e9,
                        activations_gib=act / GIB,
                        leader_gib=other + text_params * BF16 / GIB,  # + the text encoder(s)
                        other_gib=other if ranks > 1 else None,
                        ulysses_heads=(-(-heads // ranks), heads // ranks),  # busiest, least busy rank
                    )  # fmt: skip
                )
    return rows


def _heads_per_rank(most: int, least: int) -> str:
    return str(most) if most == least else f"{most} or {least} (uneven)"


def markdown(rows: list[dict]) -> str:
    out = [
        "| model | res | tokens | ranks | DiT params | text (+ image) encoder params | VAE params (fp32) "
        "| activations/rank (GiB) "
        "| leader: DiT + encoders + VAE (GiB) | other ranks: DiT + VAE (GiB) "
        "| Ulysses: heads per rank |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        other = "—" if r["other_gib"] is None else f"{r['other_gib']:.1f}"
        out.append(
            f"| {r['model']} | {r['resolution']} | {r['tokens']} | {r['ranks']} | {r['dit_params_b']:.2f} B "
            f"| {r['text_params_b']:.2f} B | {r['vae_params_b']:.2f} B | {r['activations_gib']:.2f} "
            f"| {r['leader_gib']:.1f} | {other} "
            f"| {_heads_per_rank(*r['ulysses_heads'])} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print(markdown(table()))


if __name__ == "__main__":
    main()
