"""FP8 attention (`backend="fp8"`, parallel.fp8_attention) on the CPU: the quantiser and the emulation against
float64 references with bounds derived from e4m3 (3 mantissa bits: a normal value rounds within u = 2^-4 of
itself, a subnormal within 2^-10 of its scale), the Triton kernel against the emulation under Triton's
interpreter (setup.sh installs triton beside CPU torch, which ships none), Ulysses and ring on gloo
against one rank, and one denoising of each family's tiny config against its exact run."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from parallel.fp8_attention import emulate
from parallel.fp8_attention_format import KEY_BLOCK, P_SCALE, quantize_qkv
from parallel.kernels import local_attention, resolve_backend
from tests.distributed import run_distributed
from tests.triton_interpreter import needs_triton

U = 2.0**-4  # e4m3's unit roundoff
SUB = 2.0**-10  # half of e4m3's subnormal step (2^-9), in units of the scale


def _inputs(B=2, S=300, H=3, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 170:] = False  # batch 1: its last 130 keys are padding (a whole key block and part of one)
    return q, k, v, mask


def _attention64(q, k, v, mask, causal=False):
    """float64 softmax(q kᵀ/√D) v and its LSE, [B, S, H, D] and [B, S, H]."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    lse = s.logsumexp(-1)
    w = torch.exp(s - lse[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", w, v), lse.transpose(1, 2), w


def _dequantised(z, Sk):
    """The float64 Q, K, V the FP8 payloads and scales stand for, [B, S, H, D]."""
    B, H, _, D = z.q.shape
    q = z.q.double() * z.q_scale.double()[..., None]
    k = (z.k.double().view(B, H, -1, KEY_BLOCK, D) * z.k_scale.double()[..., None, None]).flatten(2, 3)
    v = z.v_t.double() * z.v_scale.double()[..., None]
    return q.transpose(1, 2), k[:, :, :Sk].transpose(1, 2), v.permute(0, 3, 1, 2)[:, :Sk]


def test_quantised_inputs_are_within_e4m3_rounding():
    q, k, v, mask = _inputs()
    z = quantize_qkv(q, k, v, mask)
    assert z.q.dtype == z.k.dtype == z.v_t.dtype == torch.float8_e4m3fn
    assert z.k_scale.shape == (2, 3, 3) and z.v_scale.shape == (2, 3, 64)  # 300 keys: 3 blocks of 128
    keep = mask[:, :, None, None]
    for x, deq, scale in zip(
        (q, k * keep, v * keep),
        _dequantised(z, q.shape[1]),
        (z.q_scale.transpose(1, 2)[..., None], None, None),
        strict=True,
    ):
        # |x - x̂| ≤ u|x| + 2^-10·scale, with scale ≤ the largest |x| / 448 of any block
        scale = x.abs().amax() / P_SCALE if scale is None else scale.double()
        assert ((x - deq).abs() <= U * x.abs() + SUB * scale + 1e-12).all()
    assert (z.k[1, :, 256:].float() == 0).all()  # the padded keys of batch 1's last block count as 0
    assert z.v_t.shape[-1] == 384 and (z.v_t[..., 300:].float() == 0).all()  # V's keys padded as K's


@pytest.mark.parametrize("causal", [False, True])
def test_emulation_is_attention_of_the_quantised_inputs_up_to_p_rounding(causal):
    """Against float64 attention of the dequantised Q, K, V, only P's rounding remains: each weight within
    u of itself (2^-10/448 absolute below e4m3's normals), so |Δout| ≤ u·Σ w|v| + 2^-10/448·Σ|v|; the LSE
    sees no rounding of P at all (fp32 only)."""
    q, k, v, mask = _inputs()
    z = quantize_qkv(q, k, v, mask)
    out, lse = emulate(z, q.shape[1], mask, causal, torch.float64)
    qd, kd, vd = _dequantised(z, q.shape[1])
    want, want_lse, w = _attention64(qd, kd, vd, mask, causal)
    vabs = vd.abs()
    bound = U * torch.einsum("bhqk,bkhd->bqhd", w, vabs) + SUB / P_SCALE * vabs.sum(1, keepdim=True)
    assert ((out - want).abs() <= bound * 1.001 + 1e-6).all()
    assert (lse - want_lse).abs().max() < 1e-4
    assert out.dtype == torch.float64 and lse.dtype == torch.float32


def test_fp8_backend_against_float64_attention():
    """End to end (quantised Q, K, V and P) on unit Gaussians: ‖Δ‖/‖ref‖ measured 5.2e-2 for out, LSE max
    |Δ| 2.6e-2 (logits of unit size, each off by ~u); a lost scale or a wrong mask is off by ~1."""
    q, k, v, mask = _inputs()
    out, lse = local_attention(*(t.float() for t in (q, k, v)), key_mask=mask, backend="fp8", return_lse=True)
    want, want_lse, _ = _attention64(q, k, v, mask)
    rel = ((out.double() - want).norm() / want.norm()).item()
    assert out.dtype == torch.float32 and rel < 0.08, rel
    assert (lse - want_lse).abs().max() < 0.12


def test_the_accumulator_model_truncates_the_running_output():
    """`emulate(mma_bits=13)`, the model of the kernel without two-level accumulation: every key block
    truncates the running output toward zero by under 2^-13 of itself, so with V's mean 1 the output
    shrinks, by less than 8 blocks' worth (S=1000), and 23 bits are the exact emulation."""
    q, k, v, _ = _inputs(S=1000, H=2, D=64)
    z = quantize_qkv(q.float(), k.float(), v.float() + 1)
    exact, model = emulate(z, 1000)[0], emulate(z, 1000, mma_bits=13)[0]
    assert torch.equal(emulate(z, 1000, mma_bits=23)[0], exact)
    shrink = (exact - model) / exact
    assert shrink.min() >= 0 and 1e-6 < shrink.mean() and shrink.max() < 8 * 2.0**-13, shrink


def test_auto_never_picks_fp8():
    q = torch.randn(1, 4, 2, 8)
    assert resolve_backend("auto", q, None) == "sdpa" and resolve_backend("fp8", q, None) == "fp8"
    assert resolve_backend("auto", q.bfloat16(), torch.ones(1, 4, dtype=torch.bool)) != "fp8"


def _needs_cuda():
    from parallel import fp8_attention_kernel

    del os.environ["TRITON_INTERPRET"]  # the wrapper checks the device unless the kernel is interpreted
    try:
        q, k, v, mask = _inputs(S=8)
        with pytest.raises(RuntimeError, match="needs CUDA"):
            fp8_attention_kernel.attend(quantize_qkv(q, k, v), 8)
    finally:
        os.environ["TRITON_INTERPRET"] = "1"


@needs_triton
def test_kernel_needs_cuda(interpreter):
    interpreter(_needs_cuda)


def _kernel_vs_emulation(D, causal, masked):
    from parallel import fp8_attention_kernel

    q, k, v, mask = _inputs(S=300, H=2, D=D)
    mask = mask if masked else None  # unmasked, not causal: two whole key blocks skip the masking
    z = quantize_qkv(q, k, v, mask)
    out, lse = fp8_attention_kernel.attend(z, 300, mask, causal, torch.float32, block_m=64, warps=4)
    want, want_lse = emulate(z, 300, mask, causal, torch.float32)
    assert (out - want).abs().max() < 1e-5 and (lse - want_lse).abs().max() < 1e-5


@needs_triton
@pytest.mark.parametrize(("D", "causal", "masked"), [(32, False, True), (40, True, True), (64, False, False)])
def test_kernel_matches_the_emulation_in_the_interpreter(interpreter, D, causal, masked):
    """The same bytes in, the same steps: only fp32 summation order differs (measured ≤ 2.4e-7)."""
    interpreter(_kernel_vs_emulation, D, causal, masked)


def _fused_vs_torch_quantiser(Sq, D, masked):
    from parallel import fp8_qkv_kernel

    _, k, v, mask = (t if t.dtype == torch.bool else t.bfloat16() for t in _inputs(S=300, D=D))
    q = _inputs(S=Sq, D=D, seed=1)[0].bfloat16().transpose(1, 2).contiguous().transpose(1, 2) * 30
    mask = mask if masked else None
    got, want = fp8_qkv_kernel.quantize_qkv(q, k, v, mask), quantize_qkv(q, k, v, mask)
    for field in dataclasses.fields(want):  # q, k, v_t and their scales
        a, b = getattr(got, field.name), getattr(want, field.name)
        a, b = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (a, b))
        assert a.shape == b.shape and torch.equal(a, b), field.name


@needs_triton
@pytest.mark.parametrize(("Sq", "D", "masked"), [(150, 40, True), (300, 64, False)])
def test_the_fused_quantiser_gives_the_torch_quantisers_bytes(interpreter, Sq, D, masked):
    """parallel.fp8_qkv_kernel (CUDA's quantiser) in the interpreter: every byte and scale of the torch one,
    on bf16 inputs, Q a strided view, keys not a multiple of the block, a key mask."""
    interpreter(_fused_vs_torch_quantiser, Sq, D, masked)


def _layouts_vs_one_rank(S: int, H: int, D: int, T: int) -> dict:
    import parallel
    from parallel.ulysses import joint_attention

    q, k, v, _ = _inputs(S=S, H=H, D=D)
    tq, tk, tv, _ = _inputs(S=T, H=H, D=D, seed=1)
    q, k, v, tq, tk, tv = (t.float() for t in (q, k, v, tq, tk, tv))
    text_mask = torch.ones(2, T, dtype=torch.bool)
    text_mask[1, -2:] = False
    one, one_text = joint_attention(q, k, v, S, (tq, tk, tv), text_mask, False, False, "fp8")
    keys = torch.cat([torch.ones(2, S, dtype=torch.bool), text_mask], 1)
    truth = _attention64(q.double(), *(torch.cat([a, b], 1).double() for a, b in ((k, tk), (v, tv))), keys)[0]
    errs = {"one rank vs float64": ((one.double() - truth[:, :S]).norm() / truth[:, :S].norm()).item()}
    for ulysses, ring in ((2, 1), (1, 2)):
        mesh = parallel.init_parallel(ulysses=ulysses, ring=ring)
        shards = [parallel.shard_sequence(t, mesh) for t in (q, k, v)]
        out, text_out = parallel.attention(
            *(s for s, _ in shards), mesh, info=shards[0][1], text=(tq, tk, tv), text_mask=text_mask,
            backend="fp8",
        )  # fmt: skip
        out = parallel.gather_sequence(out, mesh, shards[0][1])
        errs[ulysses, ring] = [
            ((a - b).norm() / b.norm()).item() for a, b in ((out, one), (text_out, one_text))
        ]
        errs[f"{ulysses}x{ring} vs float64"] = (
            (out.double() - truth[:, :S]).norm() / truth[:, :S].norm()
        ).item()
    return errs


def test_ulysses_and_ring_give_one_ranks_fp8_attention():
    """Ulysses: every rank holds whole sequences of its heads, so it quantises them as one rank does
    (measured: bitwise equal). Ring: a rank's K blocks and V channels take their scales from its own span
    and P is rounded against its block's running max, so its rounding differs from one rank's but is no
    larger: measured ‖Δ‖/‖one rank‖ 4.1e-2 (image) and 4.0e-2 (text), and 5.25e-2 from float64 against one
    rank's 5.31e-2 (S=300 in two spans of 150 keys, 5 text keys)."""
    errs = run_distributed(2, _layouts_vs_one_rank, 300, 4, 32, 5)[0]
    assert max(errs[2, 1]) < 1e-6 and errs["2x1 vs float64"] == pytest.approx(errs["one rank vs float64"])
    assert max(errs[1, 2]) < 0.06, errs
    assert errs["1x2 vs float64"] < 1.1 * errs["one rank vs float64"], errs


@pytest.mark.parametrize("model", ["tiny-random", "tiny-joint"])
def test_each_family_denoises_within_the_fp8_attention_bound(model):
    """test_fp8_linear's request (3 steps at guidance 5, random weights), the final latents' max |Δ| / max |x|
    from the exact run, measured on the 2-core CPU box, 2026-11-25: FP8 attention 1.4e-2 (tiny-random, Wan)
    and 3.7e-2 (tiny-joint, HunyuanVideo-1.5); with FP8 linear layers too 3.2e-2 and 1.5e-1 (FP8 linear
    layers alone: 3.5e-2 and 1.4e-1)."""
    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
    from tests.test_fp8_linear import REQUEST

    req = GenerationRequest(**REQUEST | ({"width": 80} if model == "tiny-joint" else {}))
    runs = {
        (attn, quant): load_pipeline(
            PipelineConfig(model=model, device="cpu", attn_backend=attn, quant=quant, preview_every=0)
        ).denoise(req)
        for attn, quant in (("auto", "none"), ("fp8", "none"), ("fp8", "fp8"))
    }
    exact = runs["auto", "none"]
    rel = {key: ((x - exact).abs().max() / exact.abs().max()).item() for key, x in runs.items()}
    assert 0 < rel["fp8", "none"] <= 0.1 and rel["fp8", "fp8"] <= 0.3, rel
