"""The GPU kit's speed sections: median of several CUDA-event-timed calls after warm-up, on random non-zero
inputs, each figure beside its reference from the same run, with the peak GPU memory of each."""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from bench.common import rel_diff
from bench.gpu_kit import Kit, Report, fmt, gib
from bench.gpu_timing import time_built
from parallel import fp8, local_attention
from parallel.ulysses import pack_out, pack_qkv, unpack_out, unpack_qkv

WAN_14B_SHAPE = (32760, 40, 128)  # Wan2.1-14B at 480x832, 81 frames: tokens, heads, head dim


def _rand(kit: Kit, *shape) -> torch.Tensor:
    return torch.randn(*shape, device=kit.device, dtype=kit.dtype)


def attention_speed(kit: Kit, report: Report) -> None:
    """local_attention TFLOP/s per backend at the 14B shape and at one rank's share for P=8 (H/8 heads); the
    fp8 backend beside them (lossy: not a candidate for the best exact backend)."""
    from bench.gpu_correct import attention_backends

    S, H, D = kit.pick(WAN_14B_SHAPE, (512, 8, 64))
    rows, best, fp8_tflops = [], {}, None
    for heads in (H, H // 8):
        q, k, v = (_rand(kit, 1, S, heads, D) for _ in "qkv")
        for backend in [*attention_backends(kit), "fp8"]:  # fp8: the kernel on CUDA, its emulation here
            if kit.cuda and backend == "math":  # fp32 S×S scores: 172 GiB at 40 heads
                rows.append([backend, heads, "skipped: the reference path, not a speed candidate", "–", "–"])
                continue
            sec, _, peak = kit.time(
                lambda b=backend, q=q, k=k, v=v: local_attention(q, k, v, backend=b), warmup=3, iters=10
            )
            tflops = _tflops(S, heads, D, sec)  # fp8 too (bf16-equivalent), its quantise included
            if backend != "fp8":
                best[heads] = max(best.get(heads, 0.0), tflops)
            elif heads == H:
                fp8_tflops = tflops
            rows.append([backend, heads, f"{sec * 1e3:.2f}", fmt(tflops), gib(peak)])
        if kit.cuda and heads == H:
            rows.append(_cudnn_fp8_row(kit, report, q, k, v))
            rows += _fp8_parts(kit, report, q, k, v)
    report.table(
        f"attention, S={S}, D={D}, {kit.dtype}", ["backend", "heads", "ms", "TFLOP/s", "peak GiB"], rows
    )
    report.target(f"attention at S={S} H={H} D={D}, best backend", best.get(H), 580, "TFLOP/s", higher=True)
    what = f"FP8 attention at S={S} H={H} D={D}, bf16-equivalent"
    report.target(what, fp8_tflops, 900, "TFLOP/s", higher=True)


def _tflops(S: int, heads: int, D: int, sec: float) -> float:
    """An attention call's TFLOP/s: its two S×S products over `heads` heads of size D in `sec` seconds."""
    return 4 * S * S * heads * D / sec / 1e12


# the attention kernel's launches timed alone, the default first: (block_m, warps, stages, two_level). None
# spills a register on sm_90 (bench/hopper_compile.py --sweep: with 4 warps a program, two-level accumulation
# spills 24-344 bytes a thread, so none is timed); the last is the default with the MMA's own accumulation.
FP8_LAUNCHES = ((128, 8, 3, True), (128, 8, 2, True), (64, 8, 3, True), (64, 8, 2, True), (128, 8, 3, False))


def attend_settings(launch: tuple) -> dict:
    """One of FP8_LAUNCHES as `fp8_attention_kernel.attend`'s keyword arguments."""
    return dict(zip(("block_m", "warps", "stages", "two_level"), launch, strict=True))


def _fp8_parts(kit: Kit, report: Report, q, k, v) -> list[list]:
    """backend fp8's two parts at the same shape: the Q/K/V quantiser (torch's and the fused Triton one that
    the backend runs) and the attention kernel alone per launch setting; the fastest setting in a note."""
    from parallel import fp8_attention_kernel, fp8_qkv_kernel
    from parallel.fp8_attention_format import quantize_qkv

    S, heads, D = q.shape[1], q.shape[2], q.shape[3]
    rows = []
    for name, quantise in (("torch", quantize_qkv), ("fused Triton", fp8_qkv_kernel.quantize_qkv)):
        sec, z, peak = kit.time(lambda f=quantise: f(q, k, v), warmup=3, iters=10)
        rows.append([f"fp8 quantise Q/K/V only ({name})", heads, f"{sec * 1e3:.2f}", "–", gib(peak)])
    speeds = {}
    for launch in FP8_LAUNCHES:
        at = attend_settings(launch)
        sec, _, peak = kit.time(
            lambda at=at: fp8_attention_kernel.attend(z, S, dtype=q.dtype, **at), warmup=2, iters=5
        )
        speeds[launch] = tflops = _tflops(S, heads, D, sec)
        what = f"fp8 kernel only, block_m {launch[0]}, {launch[1]} warps, {launch[2]} stages, " + (
            "two-level accumulation" if launch[3] else "MMA accumulation"
        )
        rows.append([what, heads, f"{sec * 1e3:.2f}", fmt(tflops), gib(peak)])
    best = max(speeds, key=speeds.get)
    default = FP8_LAUNCHES[0]
    report.note(
        f"FP8 attention kernel at S={S} H={heads}: fastest launch {attend_settings(best)}, "
        f"{speeds[best]:.0f} TFLOP/s, against {speeds[default]:.0f} at the default {attend_settings(default)}"
    )
    return rows


def _cudnn_fp8_row(kit: Kit, report: Report, q, k, v) -> list:
    """cuDNN's FP8 SDPA (bench/cudnn_fp8.py: per-tensor scales) at the same shape, its error and ours against
    the bf16 SDPA output in a note; a row saying why where the frontend cannot run it."""
    from bench.cudnn_fp8 import CudnnFp8Attention

    S, heads, D = q.shape[1], q.shape[2], q.shape[3]
    try:
        attend = CudnnFp8Attention(tuple(q.shape), kit.device)
        sec, out, peak = kit.time(lambda: attend(q, k, v), warmup=3, iters=10)
    except Exception as e:  # no wheel, an old cuDNN, a graph its engines refuse: the row says which
        return ["cudnn-fp8 (per-tensor)", heads, f"unavailable: {type(e).__name__}: {str(e)[:120]}", "–", "–"]
    bf16 = local_attention(q, k, v, backend="sdpa")
    ours = local_attention(q, k, v, backend="fp8")
    report.note(
        f"‖Δ‖/‖bf16 SDPA‖ at S={S} H={heads}: cuDNN FP8 (per-tensor scales) {rel_diff(out, bf16):.2e}, "
        f"ours (--attn-backend fp8) {rel_diff(ours, bf16):.2e}"
    )
    return ["cudnn-fp8 (per-tensor)", heads, f"{sec * 1e3:.2f}", fmt(_tflops(S, heads, D, sec)), gib(peak)]


def ulysses_shard(kit: Kit, report: Report) -> None:
    """Pack, FP8 quantise and unpack of one rank's Q/K/V shard (and the output's way back) at P=8."""
    S, H, D = kit.pick(WAN_14B_SHAPE, (512, 8, 64))
    P = 8
    L = S // P
    q, k, v = (_rand(kit, 1, L, H, D) for _ in "qkv")
    send = pack_qkv(q, k, v, P)
    wire = fp8.pack(send)
    out = _rand(kit, 1, S, H // P, D)  # this rank's heads of the attention output
    back = pack_out(out, P)
    ops = [
        ("pack Q/K/V (pack_qkv)", lambda: pack_qkv(q, k, v, P), 3 * q.nbytes),
        ("FP8 quantise, eager (fp8.pack)", lambda: fp8.pack(send), send.nbytes),
        ("FP8 quantise, fused (Triton)", lambda: fp8.pack(send, compiled=True), send.nbytes),
        ("FP8 dequantise (fp8.unpack)", lambda: fp8.unpack(wire, send.shape, kit.dtype), wire.nbytes),
        ("unpack Q/K/V (unpack_qkv)", lambda: unpack_qkv(send), send.nbytes),
        ("pack output (pack_out)", lambda: pack_out(out, P), out.nbytes),
        ("unpack output (unpack_out)", lambda: unpack_out(back), back.nbytes),
    ]
    rows, ms = [], {}
    for name, fn, read in ops:
        if "fused" in name and not kit.cuda:
            rows.append([name, "skipped: fp8.pack fuses CUDA tensors only", "–", "–"])
            continue
        sec, res, _ = kit.time(fn, warmup=3, iters=20)
        moved = read + sum(t.nbytes for t in (res if isinstance(res, tuple) else (res,)))
        ms[name] = sec * 1e3
        rows.append([name, f"{sec * 1e3:.3f}", fmt(moved / sec / 1e9), f"{moved / 2**20:.0f}"])
    report.table(
        f"one rank's share at P={P}: L={L} tokens × {H} heads × {D}, {kit.dtype}",
        ["op", "ms", "GB/s (read + written)", "MiB moved"],
        rows,
    )
    report.target("pack of one rank's QKV shard at P=8", ms.get("pack Q/K/V (pack_qkv)"), 0.2, "ms")
    report.target("FP8 quantise of that shard (fused)", ms.get("FP8 quantise, fused (Triton)"), 0.12, "ms")


def _time_model(kit: Kit, build, call, modes: list[str]) -> tuple[dict, float | None]:
    """Build one model (`build()` → (module, fn)), time `call(fn)` in each mode, return {mode: (seconds,
    output on the CPU)} and its peak GiB; the model dies with this frame, before the next one is built."""
    model, fn = build()
    return time_built(kit, model, fn, call, modes)


def _forwards(kit: Kit, models: dict, call, compile: bool) -> tuple[list[list], dict]:
    """Time each model of `models` (name → builder, built one after the other so each peak is its own)
    eager and, with `compile` on CUDA, regionally compiled. Table rows and {(model, mode): (seconds, out)}."""
    modes = ["eager", "compile"] if compile and kit.cuda else ["eager"]
    runs, rows = {}, []
    with torch.inference_mode():
        for who, build in models.items():
            timings, peak = _time_model(kit, build, call, modes)
            for mode, (sec, out) in timings.items():
                runs[who, mode] = sec, out
                rows.append([who, mode, f"{sec:.3f}", f"{sec / runs['diffusers', mode][0]:.3f}×", gib(peak)])
    if modes == ["eager"]:
        why = (
            "CUDA only in this kit (Inductor's CPU build is too slow for the smoke)" if compile else "not run"
        )
        rows.append(["both", "compile", f"skipped: {why}", "–", "–"])
    return rows, runs


def _wan(kit: Kit, report: Report, preset: str, target: float, fp8_target: float) -> None:
    from bench.forward import diffusers_model, ours_from, wan_inputs
    from bench.gpu_fp8 import BOTH, fp8_rows
    from dit.presets import PRESETS

    config = dict(kit.pick(PRESETS[preset], PRESETS["tiny-random"]))
    frames, height, width, text = kit.pick((81, 480, 832, 512), (5, 32, 32, 16))
    holder = {}

    def diffusers():
        holder["ref"] = ref = diffusers_model(config, kit.dtype, kit.device, seed=0)
        holder["inputs"], holder["tokens"] = wan_inputs(
            ref.config, frames, height, width, text, kit.device, kit.dtype
        )
        return ref, lambda *a: ref(*a, return_dict=False)[0]

    def ours():
        model = ours_from(holder.pop("ref"), config, kit.dtype, kit.device)  # diffusers' weights, then freed
        holder["ours"] = model  # kept for the FP8 rows
        return model, model

    call = lambda fn: fn(*holder["inputs"])  # noqa: E731
    rows, runs = _forwards(kit, {"diffusers": diffusers, "ours": ours}, call, compile=True)
    mode = "compile" if ("ours", "compile") in runs else "eager"
    sec = runs["ours", mode][0]
    more, fp8_seconds = fp8_rows(
        kit, holder.pop("ours"), call, mode, runs["ours", mode][1], runs["diffusers", mode][0]
    )
    tokens = holder["tokens"]
    size = f"{frames}×{height}×{width} → {tokens} tokens, text {text}, {kit.dtype}"
    report.table(
        f"{preset} forward, {size} (regional compile for both); the FP8 rows on ours' weights, their error "
        "against ours' output in the same mode",
        ["model", "mode", "s/forward", "vs diffusers", "peak GiB", "max |Δ| / max |ours|", "mean |Δ|"],
        [row + ["–", "–"] for row in rows] + more,
    )
    diff = rel_diff(runs["ours", "eager"][1], runs["diffusers", "eager"][1])
    report.check("ours vs diffusers, eager outputs (loose: gross breakage only)", diff, 0.1)
    report.target(f"{preset} forward, ours {mode}", sec, target, "s")
    report.target(f"{preset} forward, ours {mode}, quant + attn fp8", fp8_seconds.get(BOTH), fp8_target, "s")
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    kit.figures[preset] = dict(
        seconds=sec,
        mode=mode,
        tokens=tokens,
        heads=heads,
        head_dim=head_dim,
        layers=config["num_layers"],
        latent=tuple(holder["inputs"][0].shape),
    )
    if fp8_seconds:  # the modelled 8-GPU table's second compute figure
        fastest = min(fp8_seconds, key=fp8_seconds.get)
        kit.figures[preset]["fp8"] = dict(seconds=fp8_seconds[fastest], what=f"{fastest}, {mode}")


def wan_14b(kit: Kit, report: Report) -> None:
    _wan(kit, report, "wan2.1-14b", 2.6, 1.9)


def wan_1_3b(kit: Kit, report: Report) -> None:
    _wan(kit, report, "wan2.1-1.3b", 0.45, 0.35)


def hunyuan(kit: Kit, report: Report) -> None:
    """HunyuanVideo-1.5 480p forward (121 frames), ours vs diffusers, eager."""
    from bench.hunyuan import SMALL, hunyuan_inputs
    from bench.hunyuan import models as hunyuan_models
    from dit.hunyuan.config import PRESETS

    cfg = kit.pick(PRESETS["hunyuanvideo-1.5-480p-t2v"], dataclasses.replace(SMALL, num_layers=1))
    size = kit.pick((121, 480, 848, 1000, 120), (5, 32, 32, 16, 8))
    holder = {}

    def diffusers():
        holder["ref"], holder["ours"] = ref, _ = hunyuan_models(cfg, kit.dtype, kit.device)
        holder["inputs"], holder["tokens"] = hunyuan_inputs(cfg, *size, kit.device, kit.dtype)
        return ref, lambda **kw: ref(**kw, return_dict=False)[0]

    def ours():
        del holder["ref"]
        model = holder.pop("ours")
        return model, model

    rows, runs = _forwards(
        kit, {"diffusers": diffusers, "ours": ours}, lambda fn: fn(**holder["inputs"]), compile=False
    )
    frames, height, width, text, valid = size
    report.table(
        f"HunyuanVideo-1.5 forward, {frames}×{height}×{width} → {holder['tokens']} tokens, "
        f"text {valid}/{text} + 8/256 ByT5, {kit.dtype} (both models resident)",
        ["model", "mode", "s/forward", "vs diffusers", "peak GiB"],
        rows,
    )
    report.check(
        "ours vs diffusers, outputs (loose: gross breakage only)",
        rel_diff(runs["ours", "eager"][1], runs["diffusers", "eager"][1]),
        0.1,
    )


def vae_decode(kit: Kit, report: Report) -> None:
    """Wan's VAE (published config, random weights) decoding 81 frames at 480p, single rank, its decoder in
    each `--vae-dtype`; the frames of each against float32's (bench/vae_dtype.py's figures)."""
    from bench.vae_dtype import differences
    from dit.pipeline import DTYPES
    from dit.vae_frames import cast_decoder
    from dit.wan.vae import WanVAE, WanVAEConfig, decode, tiny_vae

    vae = kit.pick(lambda: WanVAE(WanVAEConfig()), lambda: tiny_vae(16))().to(kit.device).eval()  # published
    frames, height, width = kit.pick((81, 480, 832), (5, 32, 32))
    latents = torch.randn(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8, device=kit.device)
    rows, reference = [], None
    # each dtype plainly, then the two settings issue 28 names for float32 and bfloat16: the decoder and
    # latents channels-last (NDHWC convolutions), and cuDNN's benchmark mode (its fastest conv3d algorithm)
    settings = ("channels-last", "cudnn.benchmark")
    runs = [(name, "plain") for name in DTYPES] + [(n, s) for s in settings for n in ("float32", "bfloat16")]
    for name, setting in runs:  # float32 plain first: the reference
        cast = cast_decoder(copy.deepcopy(vae), DTYPES[name])
        z = latents
        if setting == "channels-last":
            for param in cast.parameters():  # the conv3d weights (Module.to refuses the other ranks)
                if param.dim() == 5:
                    param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
            z = z.contiguous(memory_format=torch.channels_last_3d)
        torch.backends.cudnn.benchmark = setting == "cudnn.benchmark"
        try:
            sec, video, peak = kit.time(lambda cast=cast, z=z: decode(cast, z), warmup=1, iters=2)
        finally:
            torch.backends.cudnn.benchmark = False
        reference = video if reference is None else reference
        diff = differences(video, reference)
        rows.append([name, setting, f"{sec:.3f}", gib(peak), diff["max_diff"], f"{diff['over_bound']:.3%}"])
        del cast
        kit.free()
    report.table(
        f"VAE decode (dit.wan.vae.decode, to uint8 on the host): {tuple(latents.shape)} → {frames} frames",
        ["--vae-dtype", "setting", "s", "peak GiB", "max |Δ| vs float32 (levels)", "share > 2 levels"],
        rows,
    )
    report.note(
        "One rank decodes the whole video: the replica's band-parallel decode (dit.vae_parallel) needs "
        "one GPU per rank; bench/vae_decode.py measures it at 1/2/4 ranks on CPU."
    )


def text_encode(kit: Kit, report: Report) -> None:
    """UMT5-XXL (Wan's text encoder: published shape, random weights) encoding one 512-token prompt."""
    import transformers as tf

    from dit.weights import random_init

    shape = kit.pick(
        dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64),
        dict(vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4),
    )
    with torch.device("meta"):
        encoder = tf.UMT5EncoderModel(tf.UMT5Config(**shape, feed_forward_proj="gated-gelu")).to(kit.dtype)
    encoder = random_init(encoder.to_empty(device=kit.device), on_device=True).eval()
    ids = torch.randint(1, shape["vocab_size"], (1, 512), device=kit.device)
    mask = (torch.arange(512, device=kit.device) < 120)[None].long()  # Wan pads every prompt to 512 tokens
    with torch.inference_mode():
        sec, _, peak = kit.time(lambda: encoder(ids, mask).last_hidden_state, warmup=2, iters=5)
    params = sum(p.numel() for p in encoder.parameters()) / 1e9
    report.table(
        f"text encode (UMT5 encoder, {params:.2f} B parameters, {kit.dtype})",
        ["what", "s", "peak GiB"],
        [["one prompt: 120 real of 512 tokens", f"{sec:.4f}", gib(peak)]],
    )


def job_phases(kit: Kit, report: Report) -> None:
    """The whole Wan2.1-1.3B job through `Pipeline.generate`, split by phase with its `on_phase` callback."""
    import importlib.util

    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline

    steps = kit.pick(4, 2)
    sync = torch.cuda.synchronize if kit.cuda else (lambda: None)
    pipe = load_pipeline(
        PipelineConfig(
            model=kit.pick("wan2.1-1.3b", "tiny"),
            device=kit.device.type,
            dtype=kit.pick("bfloat16", "float32"),
        )
    )
    frames, height, width = kit.pick((81, 480, 832), (9, 64, 64))
    req = GenerationRequest(
        "a red fox running through snow",
        num_frames=frames,
        height=height,
        width=width,
        num_inference_steps=steps,
        guidance_scale=5.0,
    )
    marks, stamps = {}, []

    def on_phase(name: str) -> None:
        sync()  # the previous phase's kernels belong to it
        marks[name] = time.perf_counter()

    def on_step(step: int, total: int) -> None:
        sync()
        stamps.append(time.perf_counter())

    kit.free()
    if kit.cuda:
        torch.cuda.reset_peak_memory_stats()
    video = pipe.generate(req, on_step, on_phase)
    sync()
    end = time.perf_counter()
    peak = torch.cuda.max_memory_allocated() / 2**30 if kit.cuda else None
    encode, first = marks["denoising"] - marks["encoding"], stamps[0] - marks["denoising"]
    later = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    mean_step = sum(later) / len(later)
    decode = end - marks["decoding"]
    rows = [
        ["encoding (tiny stand-in encoder)", f"{encode:.3f}"],
        ["first step (2 forwards: CFG)", f"{first:.3f}"],
        [f"mean of steps 2–{steps}", f"{mean_step:.3f}"],
        ["decoding (tiny stand-in VAE)", f"{decode:.3f}"],
    ]
    if importlib.util.find_spec("imageio_ffmpeg"):
        from dit.video import write_mp4

        start = time.perf_counter()
        write_mp4(video, kit.tmp / "job.mp4", fps=16)
        rows.append(["writing the MP4", f"{time.perf_counter() - start:.3f}"])
    else:
        rows.append(["writing the MP4", "skipped: imageio-ffmpeg not installed"])
    projected = encode + first + 49 * mean_step + decode
    rows.append(["projected 50-step job (first + 49 × mean step + encode + decode)", f"{projected:.1f}"])
    report.table(
        f"{pipe.config.model} job, {frames}×{height}×{width}, {steps} steps, guidance 5, "
        f"peak {gib(peak)} GiB",
        ["phase", "s"],
        rows,
    )
    report.note(
        "A preset without a folder pairs the DiT with tiny random text encoder and VAE (no weights "
        "here): the real UMT5 and VAE costs are the text and vae sections' figures."
    )
