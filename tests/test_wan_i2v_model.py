"""Wan2.1 image-to-video DiT (image embedder, image K/V in cross-attention) against diffusers'
WanTransformer3DModel, in both checkpoint layouts and sequence-parallel."""

import json

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from dit import build_random, load_transformer, parallelize
from dit.presets import PRESETS
from dit.wan import WanConfig, WanModel, export_state_dict, lora_resolver
from tests.distributed import run_distributed

# dim 24; the image embedder maps 20-wide image tokens to it
TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=9, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=48, num_layers=2, image_dim=20,
            added_kv_proj_dim=24)  # fmt: skip
SHAPE = (3, 4, 6)  # latent frames, height, width → 18 tokens
IMAGE_TOKENS = 257  # CLIP ViT-H: 256 patches + the class token


def reference(folder, **overrides):
    """A diffusers model with every parameter drawn at random (its init leaves norms at 1 and pos_embed at 0,
    which would hide a swapped or dropped weight), saved to `folder`."""
    torch.manual_seed(0)
    ref = WanTransformer3DModel(**{**TINY, **overrides}).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ref.save_pretrained(folder)
    return ref


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(cfg, images=1, batch=2):
    """Latents, timesteps, text and image tokens; FLF2V (images=2) passes two image entries per sample."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, cfg["in_channels"], *SHAPE, generator=g)
    t = torch.tensor([999.0, 250.0])[:batch]
    text = torch.randn(batch, 512, cfg["text_dim"], generator=g)  # Wan pads every prompt to 512 tokens
    image = torch.randn(images * batch, IMAGE_TOKENS, cfg["image_dim"], generator=g)
    return x, t, text, image


CASES = {
    "i2v": ({}, {}),
    "flf2v": ({"pos_embed_seq_len": 2 * IMAGE_TOKENS}, {"images": 2}),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_diffusers(tmp_path, case):
    overrides, shape = CASES[case]
    ref = reference(tmp_path, **overrides)
    ours = load_transformer(tmp_path)
    x, t, text, image = inputs({**TINY, **overrides}, **shape)
    with torch.no_grad():
        want = ref(x, t, text, encoder_hidden_states_image=image, return_dict=False)[0]
        got = ours(x, t, text, encoder_hidden_states_image=image)
        without = ours(x, t, text, encoder_hidden_states_image=torch.zeros_like(image))
    assert got.shape == want.shape == (2, TINY["out_channels"], *SHAPE)
    err = rel_err(got, want)
    print(f"{case}: rel err {err:.2e}")
    assert err <= 1e-5
    assert rel_err(without, got) > 1e-3  # the image is heard


def test_bf16_matches_diffusers(tmp_path):
    """Same precision policy as diffusers' bf16 load: the image embedder's LayerNorms stay fp32."""
    reference(tmp_path)
    ours = load_transformer(tmp_path, dtype=torch.bfloat16)
    assert ours.img_embed.norm1.weight.dtype == ours.img_embed.norm2.weight.dtype == torch.float32
    ref = WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16).eval()
    x, t, text, image = (a.bfloat16() if a.ndim > 1 else a for a in inputs(TINY))
    with torch.no_grad():
        got = ours(x, t, text, encoder_hidden_states_image=image)
        want = ref(x, t, text, encoder_hidden_states_image=image, return_dict=False)[0]
    assert got.dtype == torch.bfloat16
    assert rel_err(got, want) <= 1e-2


@pytest.mark.parametrize("flf2v", [False, True], ids=["i2v", "flf2v"])
def test_original_wan_keys_round_trip(tmp_path, flf2v):
    # the original layout fixes the image widths: CLIP's 1280 in, the model width for the image K/V
    overrides = {"image_dim": 1280, "pos_embed_seq_len": 2 * IMAGE_TOKENS if flf2v else None}
    ref = reference(tmp_path / "diffusers", **overrides)
    ours = load_transformer(tmp_path / "diffusers")
    back = export_state_dict(ours, "diffusers")
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    original = export_state_dict(ours, "original")
    for key in (
        "img_emb.proj.4.bias",
        "blocks.1.cross_attn.v_img.weight",
        "blocks.0.cross_attn.norm_k_img.weight",
    ):
        assert key in original, key
    assert ("img_emb.emb_pos" in original) == flf2v
    folder = tmp_path / "original"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(ours.config.to_original()))
    save_file(
        {k: v.contiguous() for k, v in original.items()}, folder / "diffusion_pytorch_model.safetensors"
    )
    again = load_transformer(folder)
    assert again.config == ours.config
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x, t, text, image = inputs({**TINY, **overrides}, images=2 if flf2v else 1)
    with torch.no_grad():
        assert torch.equal(
            again(x, t, text, encoder_hidden_states_image=image),
            ours(x, t, text, encoder_hidden_states_image=image),
        )
    # LoRA files name the image weights either way
    resolve = lora_resolver(ours.config)
    for key in ("blocks.0.cross_attn.v_img.weight", "blocks.0.attn2.add_v_proj.weight"):
        assert resolve(key) == ("blocks.0.cross_attn.kv_img.weight", 1, 2)
    assert resolve("img_emb.proj.1.weight") == resolve(
        "condition_embedder.image_embedder.ff.net.0.proj.weight"
    )


def test_wan22_i2v_original_layout_has_no_image_embedder(tmp_path):
    """Wan2.2 I2V A14B's original config reads as Wan2.1 I2V's (model_type i2v, in_dim 36) but its weights
    have no image embedder: the checkpoint's key names decide, and it loads as a model without image K/V."""
    ours = build_random({"_class_name": "WanTransformer3DModel", **TINY, "image_dim": None,
                         "added_kv_proj_dim": None})  # fmt: skip
    config = ours.config.to_original() | {"model_type": "i2v"}  # as the published high/low_noise_model
    (tmp_path / "config.json").write_text(json.dumps(config))
    original = export_state_dict(ours, "original")
    save_file(
        {k: v.contiguous() for k, v in original.items()}, tmp_path / "diffusion_pytorch_model.safetensors"
    )
    again = load_transformer(tmp_path)
    assert again.config == ours.config and again.config.image_dim is None
    x, t, text, _ = inputs(TINY)
    with torch.no_grad():
        assert torch.equal(again(x, t, text), ours(x, t, text))


def test_original_config_states_only_wan_image_widths():
    with pytest.raises(ValueError, match="cannot express"):
        WanConfig.from_diffusers(PRESETS["tiny-i2v-random"]).to_original()
    cfg = WanConfig.from_original({"model_type": "flf2v", "dim": 48, "num_heads": 4})
    assert (cfg.image_dim, cfg.added_kv_proj_dim, cfg.pos_embed_seq_len) == (1280, 48, 514)
    assert WanConfig.from_original({"model_type": "ti2v", "in_dim": 48}).image_dim is None


def test_presets():
    model = load_transformer("tiny-i2v-random")
    cfg = model.config
    assert (cfg.in_channels, cfg.out_channels, cfg.image_dim, cfg.added_kv_proj_dim) == (36, 16, 32, cfg.dim)
    out = model(
        torch.randn(1, 36, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 512, cfg.text_dim),
        encoder_hidden_states_image=torch.randn(1, IMAGE_TOKENS, cfg.image_dim),
    )  # fmt: skip
    assert out.shape == (1, 16, 2, 4, 4) and torch.isfinite(out).all()
    # published configs: as many parameters as diffusers' model of the same config (meta device, no memory)
    for name, billions in (("wan2.1-i2v-14b-480p", 16.4), ("wan2.2-ti2v-5b", 5.0)):
        with torch.device("meta"):
            ref = WanTransformer3DModel(**{k: v for k, v in PRESETS[name].items() if not k.startswith("_")})
            ours = WanModel(WanConfig.from_diffusers(PRESETS[name]))
        n_ref, n_ours = (sum(p.numel() for p in m.parameters()) for m in (ref, ours))
        assert n_ref == n_ours and round(n_ours / 1e9, 1) == billions, (name, n_ours)


SP_CONFIG = PRESETS["tiny-i2v-random"]
SP_CASES = [("alltoall", dict(ulysses=2)), ("alltoall", dict(ulysses=1, ring=2))]


def _sp_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, SP_CONFIG["in_channels"], 3, 6, 10, generator=g)  # 45 tokens: padded at world 2
    text = torch.randn(2, 512, SP_CONFIG["text_dim"], generator=g)
    image = torch.randn(2, IMAGE_TOKENS, SP_CONFIG["image_dim"], generator=g)
    return (x, torch.tensor([999.0, 250.0]), text), {"encoder_hidden_states_image": image}


def _sp_forwards(cases):
    import parallel

    results = []
    for comm, degrees in cases:
        model = parallelize(build_random(SP_CONFIG, seed=3), parallel.init_parallel(**degrees), comm=comm)
        args, kwargs = _sp_inputs()
        with torch.no_grad():
            results.append(model(*args, **kwargs))
    return results


def test_sequence_parallel_matches_single_process():
    args, kwargs = _sp_inputs()
    with torch.no_grad():
        want = build_random(SP_CONFIG, seed=3)(*args, **kwargs)
    for rank, outs in enumerate(run_distributed(2, _sp_forwards, SP_CASES, timeout=240)):
        for (comm, degrees), out in zip(SP_CASES, outs, strict=True):
            err = rel_err(out, want)
            print(f"{comm} {degrees} rank {rank}: rel err {err:.2e}")
            assert err <= 1e-5
