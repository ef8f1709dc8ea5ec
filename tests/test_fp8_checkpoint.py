"""Pre-quantised FP8 checkpoints (dit.fp8_checkpoint): the trained tiny model's transformer written the way
LightX2V's converter writes its FP8 Wan checkpoints (and its ComfyUI mode), loaded with `--quant fp8` as the
stored bytes and scales without a copy in the model dtype, dequantised without it, and denoising exactly as
`--quant fp8` does on the dequantised weights."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from dit import load_transformer
from dit.fp8_linear import E4M3, E4M3_MAX, Fp8Linear, quantise_rows
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.wan import export_state_dict

TINY = Path(__file__).resolve().parents[1] / "dit" / "tiny" / "model"
# LightX2V's converter quantises the 2-D weights whose third name part is one of these (converter.py's
# `wan_dit` key_idx 2 / target_keys), per naming
QUANTISED = {"original": ("self_attn", "cross_attn", "ffn"), "diffusers": ("attn1", "attn2", "ffn")}
# the float8 layers' weight shapes in the model (q|k|v, cross k|v, ffn in and out); no other weight has one
FP8_SHAPES = {(384, 128), (256, 128), (512, 128), (128, 512)}


def lightx2v_fp8(w: torch.Tensor, comfyui: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """tools/convert/quant/quant.py `QuantWeightFP8.load_fp8_weight` (ModelTC/LightX2V): amax / 448 per
    output channel ([out, 1]), or of the whole tensor in ComfyUI mode, round to nearest e4m3."""
    amax = w.abs().max() if comfyui else w.abs().amax(dim=1, keepdim=True).clamp(min=1e-5)
    scale = amax / E4M3_MAX
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def write_fp8(folder: Path, naming: str, comfyui: bool = False, prefix: str = "") -> dict:
    """The trained tiny transformer as a pre-quantised checkpoint folder; {key: (float8, scale)}."""
    model = load_transformer("tiny")
    state, stored = export_state_dict(model, naming), {}
    for key in list(state):
        if state[key].dim() == 2 and key.split(".")[2:3] and key.split(".")[2] in QUANTISED[naming]:
            q, scale = stored[key] = lightx2v_fp8(state[key], comfyui)
            state[key] = q
            state[key.replace(".weight", ".scale_weight") if comfyui else key + "_scale"] = scale
    if comfyui:
        state["scaled_fp8"] = torch.empty(0, dtype=E4M3)
    folder.mkdir(parents=True)
    diffusers = {"_class_name": "WanTransformer3DModel", **model.config.to_diffusers()}
    config = model.config.to_original() if naming == "original" else diffusers
    (folder / "config.json").write_text(json.dumps(config))
    save_file({prefix + k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors")
    return stored


class Allocations(TorchDispatchMode):
    """The (dtype, shape) of every tensor an operator allocates while active (not on the meta device)."""

    def __init__(self):
        super().__init__()
        self.made = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self.made.add((t.dtype, tuple(t.shape)))
        return out


@pytest.mark.parametrize(
    ("naming", "comfyui", "prefix"),
    [("original", False, ""), ("diffusers", False, ""), ("original", True, "model.diffusion_model.")],
    ids=["lightx2v", "lightx2v-diffusers-names", "comfyui-scaled"],
)
def test_a_prequantised_checkpoint_loads_as_stored(tmp_path, naming, comfyui, prefix):
    stored = write_fp8(tmp_path / "fp8", naming, comfyui, prefix)
    with Allocations() as fp8_load:
        model = load_transformer(tmp_path / "fp8", quant="fp8")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert len(layers) == 7 * 4  # self q|k|v, o; cross q, k|v, o; ffn 0, 2 in each of 4 blocks
    names = {"original": "blocks.1.self_attn.{}.weight", "diffusers": "blocks.1.attn1.to_{}.weight"}[naming]
    parts = [stored[names.format(p)] for p in "qkv"]
    qkv = layers["blocks.1.self_attn.qkv"]
    assert torch.equal(qkv.weight.view(torch.uint8), torch.cat([q for q, _ in parts]).view(torch.uint8))
    scales = torch.cat([s.expand(q.shape[0], 1) for q, s in parts])
    assert qkv.weight_scale.shape == (384, 1) and torch.equal(qkv.weight_scale, scales)
    # one layer against a float64 product of the stored weight and the per-token quantised input
    x = torch.randn(5, 128, dtype=torch.float32) * torch.logspace(-1, 1, 5)[:, None]
    xq, xs = quantise_rows(x)
    want = (xq.double() * xs.double()) @ (torch.cat([q for q, _ in parts]).double() * scales.double()).t()
    want = want + qkv.bias.double()
    assert ((qkv(x).double() - want).abs().max() / want.abs().max()).item() < 1e-6
    # no tensor of a float8 layer's shape was ever made in another dtype (no float32 detour)...
    detours = {(d, s) for d, s in fp8_load.made if s in FP8_SHAPES and d != E4M3}
    assert not detours, detours
    # ...which the dequantising load (no --quant fp8) does make: the same weights, stored · scale
    with Allocations() as plain_load:
        plain = load_transformer(tmp_path / "fp8")
    assert (torch.float32, (384, 128)) in plain_load.made
    assert not any(isinstance(m, Fp8Linear) for m in plain.modules())
    assert torch.equal(plain.blocks[1].self_attn.qkv.weight, torch.cat([q.float() * s for q, s in parts]))
    tiny = load_transformer("tiny")
    assert torch.equal(plain.head.proj.weight, tiny.head.proj.weight)  # unquantised tensors as stored
    assert torch.equal(model.blocks[2].modulation, tiny.blocks[2].modulation)


def test_a_lora_merges_into_the_dequantised_weights(tmp_path):
    stored = write_fp8(tmp_path / "fp8", "original")
    diff = torch.randn(128, 128) * 1e-2
    save_file({"diffusion_model.blocks.0.self_attn.q.diff": diff}, tmp_path / "q.safetensors")
    model = load_transformer(tmp_path / "fp8", quant="fp8", loras=[(str(tmp_path / "q.safetensors"), 1.0)])
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())  # the pipeline quantises after
    q, scale = stored["blocks.0.self_attn.q.weight"]
    assert torch.allclose(model.blocks[0].self_attn.qkv.weight[:128], q.float() * scale + diff, atol=1e-6)


def _pipeline_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for part in TINY.iterdir():
        if part.name != "transformer":
            (folder / part.name).symlink_to(part)
    return folder


def test_a_denoise_equals_quant_fp8_of_the_dequantised_weights(tmp_path):
    """Per-channel amax / 448 scales round-trip: the dequantised weights quantise back to the same bytes and
    scales, so the two pipelines run the same GEMMs."""
    prequantised = _pipeline_folder(tmp_path, "prequantised")
    stored = write_fp8(prequantised / "transformer", "original")
    for q, scale in stored.values():
        again, again_scale = quantise_rows(q.float() * scale)
        assert torch.equal(again.view(torch.uint8), q.view(torch.uint8)) and torch.equal(again_scale, scale)
    dequantised = _pipeline_folder(tmp_path, "dequantised")
    (dequantised / "transformer").mkdir()
    shutil.copy(TINY / "transformer" / "config.json", dequantised / "transformer")
    plain = load_transformer(prequantised)  # dequantised as it loads, checked above
    save_file(export_state_dict(plain, "diffusers"), dequantised / "transformer" / "model.safetensors")
    request = GenerationRequest(
        prompt="a red ball moves left", num_frames=9, height=32, width=32, num_inference_steps=3, seed=3
    )
    latents = [
        load_pipeline(PipelineConfig(model=str(f), quant="fp8", preview_every=0)).denoise(request)
        for f in (prequantised, dequantised)
    ]
    assert torch.equal(*latents)


def test_unknown_scale_layouts_are_clear_errors(tmp_path):
    write_fp8(tmp_path / "fp8", "original")
    path = tmp_path / "fp8" / "model.safetensors"
    state = load_file(path)
    state["blocks.0.ffn.0.weight_scale"] = torch.ones(4, 1)  # block-wise 128×128 of a [512, 128] weight
    save_file(state, path)
    with pytest.raises(ValueError, match=r"blocks\.0\.ffn\.0\.weight_scale: a scale of shape \(4, 1\)"):
        load_transformer(tmp_path / "fp8", quant="fp8")
    state["blocks.0.ffn.0.weight_scale"] = torch.ones(512, 1)
    state["blocks.0.ffn.2.weight"] = state["blocks.0.ffn.2.weight"].float().to(torch.float8_e5m2)
    save_file(state, path)
    with pytest.raises(ValueError, match=r"blocks\.0\.ffn\.2\.weight: float8_e5m2 weights are not supported"):
        load_transformer(tmp_path / "fp8")


@pytest.mark.parametrize(
    ("damage", "says"),
    [  # each loaded, and made noise: NaN latents blamed on the sampler's shift, or a video of nothing
        ("nan", r"blocks\.0\.ffn\.0\.weight_scale: non-finite scales: the checkpoint is damaged"),
        ("negative", r"blocks\.0\.ffn\.0\.weight_scale: negative scales"),
        ("zero", r"blocks\.0\.ffn\.0\.weight_scale: only zero scales"),
        ("lost", r"^2 float8 weight\(s\) have no scale where \d+ others have one: blocks\.0\.ffn\.0\.weight, "
                 r"blocks\.1\.ffn\.0\.weight; read as scale 1"),
    ],
)  # fmt: skip
def test_scales_no_converter_writes_are_clear_errors(tmp_path, damage, says):
    write_fp8(tmp_path / "fp8", "original")
    path = tmp_path / "fp8" / "model.safetensors"
    state = load_file(path)
    key = "blocks.0.ffn.0.weight_scale"
    if damage == "lost":  # a bad copy or conversion dropped them
        del state[key], state["blocks.1.ffn.0.weight_scale"]
    else:
        state[key] = {"nan": state[key] * float("nan"), "negative": -state[key], "zero": state[key] * 0}[
            damage
        ]
    save_file(state, path)
    with pytest.raises(ValueError, match=says):
        load_transformer(tmp_path / "fp8")


def test_a_lora_per_request_on_a_prequantised_checkpoint(tmp_path):
    """`--lora-dir` dequantises the stored layers as `--lora` does; a job's set is merged, then quantised."""
    folder = _pipeline_folder(tmp_path, "prequantised")
    write_fp8(folder / "transformer", "original")
    loras = tmp_path / "loras"
    loras.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "diffusion_model.blocks.0.self_attn.q.diff": torch.randn(128, 128, generator=g) * 1e-2,
            "diffusion_model.blocks.1.ffn.0.lora_down.weight": torch.randn(4, 128, generator=g) * 0.1,
            "diffusion_model.blocks.1.ffn.0.lora_up.weight": torch.randn(512, 4, generator=g) * 0.1,
        },
        loras / "q.safetensors",
    )
    request = GenerationRequest(
        prompt="a red ball moves left", num_frames=5, height=32, width=32, num_inference_steps=2, seed=3
    )

    def load(**config):
        return load_pipeline(PipelineConfig(model=str(folder), quant="fp8", preview_every=0, **config))

    pipe = load(lora_dir=str(loras))
    base = pipe.denoise(request)
    assert torch.equal(base, load().denoise(request))  # the stored bytes, quantised again
    got = pipe.denoise(dataclasses.replace(request, loras=[["q", 0.5]]))
    assert torch.equal(got, load(loras=((str(loras / "q.safetensors"), 0.5),)).denoise(request))
    assert not torch.equal(got, base) and torch.equal(pipe.denoise(request), base)
