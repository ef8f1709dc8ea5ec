"""HunyuanVideo-1.5: our model vs diffusers' HunyuanVideo15Transformer3DModel with the same saved weights."""

from __future__ import annotations

import pytest
import torch

from dit import load_transformer
from dit.hunyuan import HunyuanVideo15Config, HunyuanVideo15Transformer
from dit.hunyuan.state_dict import map_key

TINY = dict(
    in_channels=5,
    out_channels=3,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    num_refiner_layers=1,
    text_embed_dim=12,
    text_embed_2_dim=10,
    image_embed_dim=8,
    rope_axes_dim=(4, 6, 6),
)


def save_reference(tmp_path, seed=0, **overrides):
    """A tiny diffusers model with every parameter randomised (so a wrong key mapping cannot hide), saved."""
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    ref = HunyuanVideo15Transformer3DModel(**{**TINY, **overrides}).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            base = 1.0 if ("norm" in name and p.ndim == 1 and name.endswith("weight")) else 0.0
            p.copy_(base + 0.2 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    return ref


def make_inputs(
    cfg: dict, batch, frames, height, width, valid, valid_2, text_len=9, text_2_len=5, image=False
):
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(batch, text_len, dtype=torch.long)
    mask_2 = torch.zeros(batch, text_2_len, dtype=torch.long)
    for i in range(batch):
        mask[i, : valid[i]] = 1
        mask_2[i, : valid_2[i]] = 1
    image_embeds = torch.randn(batch, 6, cfg["image_embed_dim"], generator=g)
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], frames, height, width, generator=g),
        timestep=torch.tensor([700.0, 130.0][:batch]),
        encoder_hidden_states=torch.randn(batch, text_len, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=mask,
        encoder_hidden_states_2=torch.randn(batch, text_2_len, cfg["text_embed_2_dim"], generator=g),
        encoder_attention_mask_2=mask_2,
        image_embeds=image_embeds if image else torch.zeros_like(image_embeds),
    )


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


CASES = {
    # batch 2, odd latent sizes, different paddings per sample (one sample without any ByT5 token)
    "t2v-b2-odd": (dict(), dict(batch=2, frames=3, height=5, width=7, valid=[5, 9], valid_2=[2, 0])),
    # spatial patch 2, image-to-video (image tokens valid), heavy padding
    "i2v-patch2": (
        dict(patch_size=2),
        dict(batch=1, frames=2, height=6, width=4, valid=[2], valid_2=[5], image=True),
    ),
    # temporal patch 2, batch 2 with no padding at all, three heads
    "patch-t2-nopad": (
        dict(patch_size_t=2, num_attention_heads=3),
        dict(batch=2, frames=4, height=3, width=3, valid=[9, 9], valid_2=[5, 5], image=True),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_diffusers(tmp_path, case):
    overrides, shape = CASES[case]
    ref = save_reference(tmp_path, **overrides)
    ours = load_transformer(tmp_path)
    inputs = make_inputs({**TINY, **overrides}, **shape)
    with torch.no_grad():
        expected = ref(**inputs, return_dict=False)[0]
        got = ours(**inputs)
    assert got.shape == expected.shape
    assert torch.isfinite(expected).all()
    assert rel_err(got, expected) <= 1e-5


def test_meanflow_timestep_r(tmp_path):
    ref = save_reference(tmp_path, use_meanflow=True)
    ours = load_transformer(tmp_path)
    inputs = make_inputs(TINY, batch=2, frames=1, height=4, width=5, valid=[3, 7], valid_2=[1, 4])
    inputs["timestep_r"] = torch.tensor([300.0, 10.0])
    with torch.no_grad():
        assert rel_err(ours(**inputs), ref(**inputs, return_dict=False)[0]) <= 1e-5


def test_text_padding_is_excluded_exactly(tmp_path):
    """Changing what sits in padded text positions, or adding more padding, leaves the output unchanged."""
    save_reference(tmp_path)
    ours = load_transformer(tmp_path)
    inputs = make_inputs(TINY, batch=1, frames=2, height=3, width=3, valid=[4], valid_2=[2])
    with torch.no_grad():
        base = ours(**inputs)
        noisy = dict(inputs)
        noisy["encoder_hidden_states"] = inputs["encoder_hidden_states"].clone()
        noisy["encoder_hidden_states"][:, 4:] = 1e3
        longer = dict(inputs)
        longer["encoder_hidden_states"] = torch.cat(
            [inputs["encoder_hidden_states"], torch.randn(1, 6, 12)], 1
        )
        longer["encoder_attention_mask"] = torch.cat(
            [inputs["encoder_attention_mask"], torch.zeros(1, 6).long()], 1
        )
        assert torch.equal(ours(**noisy), base)
        assert rel_err(ours(**longer), base) <= 1e-6


def test_key_mapping_covers_the_reference_and_loads_bf16(tmp_path):
    ref = save_reference(tmp_path, use_meanflow=True)
    ours = HunyuanVideo15Transformer(HunyuanVideo15Config(**TINY, use_meanflow=True))
    names = dict(ours.named_parameters())
    for key in ref.state_dict():
        name, slot = map_key(key)
        assert name in names, key
    model = load_transformer(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ref_q = ref.transformer_blocks[1].attn.add_k_proj.weight
    got = model.blocks[1].attn.txt_qkv.weight[ref_q.shape[0] : 2 * ref_q.shape[0]]
    assert torch.equal(got, ref_q.to(torch.bfloat16))
