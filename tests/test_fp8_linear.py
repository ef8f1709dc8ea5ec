"""FP8 linear layers (`--quant fp8`, dit.fp8_linear) on the CPU, where `torch._scaled_mm` runs too: the layer
is the scaled product it claims (float64 reference), the quantiser picks the blocks' large layers of each
family and nothing else, each family's denoising stays within the FP8 bound of its unquantised run, every
sequence-parallel layout gives one rank's FP8 latents, and the trained tiny model still draws what it is
asked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dit.fp8_linear import E4M3_MAX, Fp8Linear, quantise, quantise_rows
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed
from tests.triton_interpreter import needs_triton

REQUEST = dict(prompt="a lighthouse at dusk", negative_prompt="blurry", num_frames=9, height=48, width=48,
               num_inference_steps=3, guidance_scale=5.0, seed=7)  # fmt: skip
# The relative difference of the final latents from the unquantised run's (max |Δ| / max |x|), 3 steps at
# guidance 5 on random weights, measured on the 2-core CPU box, 2026-11-25: 3.5e-2 (tiny-random, Wan) and
# 1.4e-1 (tiny-joint, HunyuanVideo-1.5). e4m3 keeps 3 mantissa bits: one GEMM is ~3.7e-2 off
# (bench/RESULTS.md, 2026-11-24); a broken GEMM (garbage) is ~1.
FP8_REL = 0.25


def test_the_layer_is_the_scaled_product():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(2, 5, 64) * torch.logspace(-2, 2, 5)[None, :, None]  # tokens of very different sizes
    fp8 = Fp8Linear(linear)
    q, scale = quantise_rows(x.reshape(-1, 64))
    assert q.dtype == torch.float8_e4m3fn and (q.float().abs().amax(1) == E4M3_MAX).all()
    want = (q.double() * scale.double()) @ (fp8.weight.double() * fp8.weight_scale.double()).t()
    got = fp8(x)
    assert got.shape == (2, 5, 48) and got.dtype == x.dtype
    want = want + linear.bias.double()
    error = (got.reshape(-1, 48).double() - want).abs().amax(1) / want.abs().amax(1)
    assert error.max() < 1e-6, error  # float32 accumulation, per token of any size
    exact = linear(x)
    rel = ((got - exact).norm() / exact.norm()).item()
    assert rel < 0.06, rel  # e4m3: about 3.7e-2 on random data
    assert fp8.weight.dtype == torch.float8_e4m3fn and fp8.weight.element_size() == 1


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        ("tiny-random", {"head.proj", "text_embed.0", "text_embed.2", "time_embed.mlp.0", "time_embed.proj"}),
        ("tiny-joint", {"blocks.0.img_mod.linear", "blocks.0.txt_mod.linear", "proj_out", "norm_out.linear"}),
    ],
)
def test_the_blocks_large_layers_are_quantised_and_nothing_else(model, kept):
    from dit.families import presets
    from dit.loading import build_random

    net = build_random(presets()[model])
    linears = {name for name, m in net.named_modules() if isinstance(m, nn.Linear)}
    count = quantise(net)
    fp8 = {name for name, m in net.named_modules() if isinstance(m, Fp8Linear)}
    assert count == len(fp8) > 0 and all(".blocks." in f".{name}" for name in fp8)
    assert kept <= linears - fp8  # modulation, embeddings, time projections and the head stay
    if model == "tiny-random":
        assert {"blocks.0.self_attn.qkv", "blocks.0.cross_attn.kv", "blocks.0.ffn.0"} <= fp8


@pytest.mark.parametrize("model", ["tiny-random", "tiny-joint"])
def test_each_family_denoises_within_the_fp8_bound(model):
    req = GenerationRequest(**REQUEST | ({"width": 80} if model == "tiny-joint" else {}))
    exact, fp8 = (
        load_pipeline(PipelineConfig(model=model, device="cpu", quant=quant, preview_every=0)).denoise(req)
        for quant in ("none", "fp8")
    )
    rel = ((fp8 - exact).abs().max() / exact.abs().max()).item()
    print(f"{model}: fp8 linear layers, relative difference {rel:.2e}")
    assert 0 < rel <= FP8_REL


def _fp8_latents(layouts):
    import parallel

    out = []
    for ulysses, ring, cfg in layouts:
        mesh = parallel.init_parallel(ulysses=ulysses, ring=ring, cfg=cfg)
        config = PipelineConfig(model="tiny-random", device="cpu", quant="fp8", preview_every=0)
        out.append(load_pipeline(config, mesh).denoise(GenerationRequest(**REQUEST)))
    return out


def test_every_layout_gives_one_ranks_fp8_latents():
    """A token's activation scale is its own, so a rank quantises its tokens as one rank would."""
    one = _fp8_latents([(1, 1, 1)])[0]
    layouts = [(2, 1, 1), (1, 2, 1), (1, 1, 2)]
    ranks = run_distributed(2, _fp8_latents, layouts, timeout=240)
    for i, layout in enumerate(layouts):
        rel = ((ranks[0][i] - one).abs().max() / one.abs().max()).item()
        print(
            f"ulysses x ring x cfg {layout}, fp8 linear layers: relative difference from one rank {rel:.2e}"
        )
        # Ulysses and CFG: `ithaca parity`'s float32 tolerance. The ring merges its blocks' partial
        # attentions in another order: a float32 rounding there can carry an activation across an e4m3
        # rounding boundary (one step is 12.5 % of that element), which the later layers dilute: 2.1e-5 on an
        # Intel box, 1.6e-2 on an AMD EPYC one (2026-11-25), well inside FP8's error against bf16 (FP8_REL).
        assert rel <= (0.05 if layout[1] > 1 else 1e-4), (layout, rel)


def _rows_kernel_vs_torch():
    from dit import fp8_rows_kernel

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 2600, generator=g) * torch.logspace(-3, 3, 7)[:, None]).bfloat16()
    x[3] = 0
    for rows in (x, x[:, 100:2148]):
        (q, scale), (want_q, want_scale) = fp8_rows_kernel.quantise_rows(rows), quantise_rows(rows)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)


@needs_triton
def test_the_cuda_input_quantiser_gives_the_torch_bytes(interpreter):
    """dit.fp8_rows_kernel (what an FP8 layer runs on CUDA outside torch.compile) under Triton's interpreter:
    every byte and scale of `quantise_rows`, on bf16 rows wider than a load, a strided view, a zero row."""
    interpreter(_rows_kernel_vs_torch)
