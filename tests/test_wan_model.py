"""Wan DiT against diffusers' WanTransformer3DModel (the reference) and the checkpoint formats we load."""

import json

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from dit import load_transformer
from dit.presets import PRESETS
from dit.wan import WanConfig, WanModel, export_state_dict
from dit.wan.model import FP32_PARAMS

TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=48, num_layers=2, cross_attn_norm=True, eps=1e-6)  # fmt: skip


def reference(tmp_path, seed=0, **overrides):
    torch.manual_seed(seed)
    ref = WanTransformer3DModel(**{**TINY, **overrides}).eval()
    ref.save_pretrained(tmp_path)
    return ref


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(cfg, frames, height, width, batch=2, text_len=7, per_token=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cfg["in_channels"], frames, height, width, generator=g)
    pt, ph, pw = cfg["patch_size"]
    tokens = (frames // pt) * (height // ph) * (width // pw)
    t = torch.rand(batch, tokens, generator=g) * 1000 if per_token else torch.tensor([999.0, 3.5])[:batch]
    return x, t, torch.randn(batch, text_len, cfg["text_dim"], generator=g)


@pytest.mark.parametrize(
    "overrides, shape, per_token",
    [
        ({}, (3, 6, 10), False),  # 45 tokens
        ({}, (1, 4, 4), True),
        ({"num_attention_heads": 3, "attention_head_dim": 16, "cross_attn_norm": False}, (2, 2, 6), False),
        ({"patch_size": (2, 2, 2), "out_channels": 6, "eps": 1e-5}, (4, 6, 2), True),
    ],
    ids=["odd-grid", "per-token-t", "no-cross-norm", "patch-t2"],
)
def test_forward_matches_diffusers(tmp_path, overrides, shape, per_token):
    ref = reference(tmp_path, **overrides)
    ours = load_transformer(tmp_path)
    assert isinstance(ours.config, WanConfig)
    x, t, ctx = inputs({**TINY, **overrides}, *shape, per_token=per_token)
    with torch.no_grad():
        want = ref(x, t, ctx, return_dict=False)[0]
        got = ours(x, t, ctx)
    assert got.shape == want.shape == (2, ref.config.out_channels, *shape)
    assert rel_err(got, want) <= 1e-5


def test_pipeline_folder_and_sharded_index(tmp_path):
    torch.manual_seed(0)
    ref = WanTransformer3DModel(**TINY).eval()
    ref.save_pretrained(tmp_path / "transformer", max_shard_size="20KB")
    assert (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    ours = load_transformer(tmp_path)  # whole pipeline folder → its transformer/
    x, t, ctx = inputs(TINY, 2, 4, 6)
    with torch.no_grad():
        assert rel_err(ours(x, t, ctx), ref(x, t, ctx, return_dict=False)[0]) <= 1e-5


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_original_wan_keys_round_trip(tmp_path, prefix):
    ref = reference(tmp_path / "diffusers")
    ours = load_transformer(tmp_path / "diffusers")
    # ours → diffusers names gives back the reference's state dict exactly
    back = export_state_dict(ours, "diffusers")
    assert back.keys() == ref.state_dict().keys() and all(
        torch.equal(back[k], v) for k, v in ref.state_dict().items()
    )
    # ours → original Wan names → a WanModel folder → loads to the same model
    orig = tmp_path / "original"
    orig.mkdir()
    (orig / "config.json").write_text(json.dumps(ours.config.to_original()))
    save_file({prefix + k: v.contiguous() for k, v in export_state_dict(ours, "original").items()},
              orig / "diffusion_pytorch_model.safetensors")  # fmt: skip
    again = load_transformer(orig)
    assert again.config == ours.config
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert "blocks.0.norm3.weight" in export_state_dict(ours, "original")  # original norm3 = cross-attn norm


def test_checkpoint_mismatch_is_reported(tmp_path):
    ref = reference(tmp_path)
    sd = ref.state_dict()
    sd["blocks.0.attn1.extra.weight"] = torch.zeros(1)
    del sd["blocks.1.attn1.to_k.bias"]
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "diffusion_pytorch_model.safetensors")
    with pytest.raises(
        ValueError, match=r"1 unexpected key.*extra.*1 missing parameter.*blocks\.1\.self_attn\.qkv"
    ):
        load_transformer(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_transformer(tmp_path / "nowhere")


def test_bf16_load(tmp_path):
    reference(tmp_path)
    ours = load_transformer(tmp_path, dtype=torch.bfloat16)
    for name, p in ours.named_parameters():
        kept = any(k in "." + name for k in FP32_PARAMS)
        assert p.dtype == (torch.float32 if kept else torch.bfloat16), name
    assert sum(p.numel() for p in ours.parameters() if p.dtype == torch.bfloat16) > 0.9 * sum(
        p.numel() for p in ours.parameters()
    )
    # same precision policy as diffusers' bf16 load (_keep_in_fp32_modules): the outputs agree closely
    ref = WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16).eval()
    x, t, ctx = (a.bfloat16() if a.is_floating_point() and a.ndim > 1 else a for a in inputs(TINY, 3, 6, 10))
    with torch.no_grad():
        got, want = ours(x, t, ctx), ref(x, t, ctx, return_dict=False)[0]
    assert got.dtype == torch.bfloat16
    assert rel_err(got, want) <= 1e-2


def test_presets():
    tiny = load_transformer("tiny-random")
    again = load_transformer("tiny-random")
    assert all(torch.equal(a, b) for a, b in zip(tiny.parameters(), again.parameters(), strict=True))
    cfg = tiny.config
    out = tiny(
        torch.randn(1, cfg.in_channels, 5, 8, 8), torch.tensor([500.0]), torch.randn(1, 4, cfg.text_dim)
    )
    assert out.shape == (1, cfg.out_channels, 5, 8, 8) and torch.isfinite(out).all()
    # published configs: as many parameters as diffusers' model of the same config (meta device, no memory)
    for name in ("wan2.1-1.3b", "wan2.1-14b"):
        with torch.device("meta"):
            ref = WanTransformer3DModel(**{k: v for k, v in PRESETS[name].items() if not k.startswith("_")})
            ours = WanModel(WanConfig.from_diffusers(PRESETS[name]))
        n_ref, n_ours = (sum(p.numel() for p in m.parameters()) for m in (ref, ours))
        assert n_ref == n_ours, name
    assert round(n_ours / 1e9, 1) == 14.3
