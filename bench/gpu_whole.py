"""The GPU kit's `whole-job` section: Wan2.1-14B 480p/81 frames through `Pipeline.generate` as a worker runs
it (the MP4 streamed during the decode by the server's own `StreamedVideo`), split by phase, on one GPU; and
the same job MODELLED for 8 GPUs from the measured parts.

Real-size parts from random weights, built on the device (no download, no network): the DiT from its preset
(bf16, drawn on the GPU), the published Wan VAE config, a UMT5-XXL-shaped encoder behind byte tokens padded to
Wan's 512. The timings are the model's, not its outputs'.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from bench.gpu_kit import GIB, Kit, Report, Skip, drawn_on_device
from dit.text_encoder import ByteTokenizer, TextEncoder

PRESET = "wan2.1-14b"
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64)
NEEDS_GIB = 70  # DiT 28 + UMT5-XXL 11 in bf16, the 32760-token activations and the fp32 VAE decode's peak
CFG_TIMED_STEPS = 2  # the 40-step CFG row times these many and multiplies: 40 would take minutes at 14B
NVLINK = 450e9  # bytes/s per direction, as bench/gpu_modelled.py's table
PHASES = ("encode", "steps", "decode", "mp4", "total")
TARGETS = dict(fp8=9.0, bf16=11.0, gpus8=2.5, mp4_tail=0.3)  # issue 28: seconds


class RandomUMT5(TextEncoder):
    """UMT5's encoder at a given shape with random weights behind byte tokens (the real tokenizer is a
    download): the encode's cost is the encoder's, 512 tokens as Wan pads every prompt."""

    def __init__(self, shape: dict, dtype: torch.dtype, device: torch.device):
        from dit.wan.umt5 import UMT5Config, UMT5Encoder
        from dit.weights import random_init

        super().__init__(ByteTokenizer(max_tokens=512))
        with torch.device("meta"):
            model = UMT5Encoder(UMT5Config(**shape))
        self.model = random_init(model.to_empty(device=device).to(dtype), on_device=True).eval()

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask)


def build(kit: Kit):
    """The pipeline with real-size parts (toy ones under --cpu-smoke)."""
    from dit.pipeline import PipelineConfig, load_pipeline
    from dit.presets import PRESETS
    from dit.wan.vae import WanVAE, WanVAEConfig, tiny_vae

    preset = kit.pick(PRESET, "tiny-random")
    config = PipelineConfig(
        model=preset, device=kit.device.type, dtype=kit.pick("bfloat16", "float32"), preview_every=0
    )
    with drawn_on_device():
        pipe = load_pipeline(config)
    text = kit.pick(UMT5_XXL, dict(UMT5_XXL, vocab_size=384, d_model=32, d_ff=64, num_layers=1, num_heads=4))
    pipe.text_encoder = RandomUMT5(dict(text, d_model=PRESETS[preset]["text_dim"]), kit.dtype, kit.device)
    vae = kit.pick(lambda: WanVAE(WanVAEConfig()), lambda: tiny_vae(16))().to(kit.device).eval()
    pipe.vae = vae  # float32, as served by default (--vae-dtype)
    return pipe


def run_job(kit: Kit, pipe, req, name: str) -> dict:
    """One job, as the worker runs it, by phase (seconds): encode, steps, decode (to the last frame handed to
    the MP4), mp4 (its close after the last frame), total (to the closed MP4)."""
    from server.writers import StreamedVideo

    sync = torch.cuda.synchronize if kit.cuda else (lambda: None)
    marks: dict[str, float] = {}
    video = StreamedVideo(str(kit.tmp), name, attempt=1, fps=16)

    def on_phase(phase: str) -> None:
        sync()  # the previous phase's kernels belong to it
        marks[phase] = time.perf_counter()

    def on_frames(frames) -> None:
        marks["last frame"] = time.perf_counter()  # frames reach the host decoded: the decode is done so far
        video.frames(frames)

    sync()
    start = time.perf_counter()
    frames = pipe.generate(req, None, on_phase, on_frames=on_frames)
    video.close(frames)
    end = time.perf_counter()
    return dict(
        encode=marks["denoising"] - marks["encoding"],
        steps=marks["decoding"] - marks["denoising"],
        decode=marks["last frame"] - marks["decoding"],
        mp4=end - marks["last frame"],
        total=end - start,
        frames=frames.shape,
        path=video.path,
    )


def modelled_8(shape_of, encode: float, step: float, steps: int, decode: float, mp4: float, frames) -> dict:
    """The job on 8 GPUs from one GPU's parts: the step as parallel/plan.py's estimate for the fastest of
    gpu_modelled's layouts on NVLink (compute / sp degree + the all-to-all bytes at 450 GB/s); the decode as
    one band of eight plus the uint8 frames' gather to the leader at that bandwidth; encode and MP4 as
    measured (the leader's alone)."""
    from bench.gpu_modelled import LAYOUTS
    from parallel.plan import Links, estimate

    shape = shape_of()
    forward = step / (2 if shape.guided else 1)
    options = [estimate(layout, shape, forward, Links(NVLINK, NVLINK)) for layout in LAYOUTS]
    best = min((e for e in options if e.step_s is not None), key=lambda e: e.step_s)
    gather = frames[0] * frames[1] * frames[2] * frames[3] * 7 / 8 / NVLINK
    parts = dict(encode=encode, steps=steps * best.step_s, decode=decode / 8 + gather, mp4=mp4)
    return parts | dict(total=sum(parts.values()), layout=best.layout.name)


def whole_job(kit: Kit, report: Report) -> None:
    """Wan2.1-14B 480p 81 frames: 4 unguided steps (a distilled schedule's cost) and 40 guided ones, by phase,
    bf16 and with --quant fp8; the 8-GPU figures modelled from them."""
    from dit.fp8_linear import quantise
    from dit.pipeline import GenerationRequest
    from dit.shape import model_shape
    from dit.video import read_mp4

    if kit.cuda:
        total = torch.cuda.get_device_properties(kit.device).total_memory / GIB
        if total < NEEDS_GIB:
            raise Skip(f"needs about {NEEDS_GIB} GiB of GPU memory, this GPU has {total:.0f}")
    kit.free()
    frames, height, width = kit.pick((81, 480, 832), (5, 32, 32))
    pipe = build(kit)
    size = dict(num_frames=frames, height=height, width=width)
    request = partial(GenerationRequest, **size)
    # compiles nothing (eager) but warms cuDNN, the allocator and ffmpeg at this size: a server's --warmup
    run_job(kit, pipe, request("warm-up", num_inference_steps=1, guidance_scale=1.0), "warm-up")
    fp8_ok = not kit.cuda or torch.cuda.get_device_capability(kit.device) >= (8, 9)
    rows, modelled = [], []
    judged = {}
    for quant in ("none", "fp8"):
        if quant == "fp8":
            if not fp8_ok:
                rows.append(["4 steps, no CFG", "fp8", "skipped: FP8 GEMMs need compute capability 8.9+"])
                break
            quantise(pipe.model)  # in place, after bf16's rows: the weights as --quant fp8 leaves them
        dtype = kit.pick("bf16", "fp32") if quant == "none" else "fp8"
        # a file of each job's own: the check of judged["none"]'s MP4 read fp8's, written over it
        fast_req = request(f"a fox, {quant}", num_inference_steps=4, guidance_scale=1.0)
        fast = run_job(kit, pipe, fast_req, f"a-{quant}")
        cfg_req = request(f"a fox, {quant}, cfg", num_inference_steps=CFG_TIMED_STEPS)
        cfg = run_job(kit, pipe, cfg_req, f"b-{quant}")
        step_cfg = cfg["steps"] / CFG_TIMED_STEPS
        cfg40 = dict(cfg, steps=40 * step_cfg)
        cfg40["total"] = cfg40["encode"] + cfg40["steps"] + cfg40["decode"] + cfg40["mp4"]
        judged[quant] = fast
        for what, job, guidance, steps in (
            ("4 steps, no CFG", fast, 1.0, 4),
            (f"40 steps, CFG 5 ({CFG_TIMED_STEPS} timed × {40 // CFG_TIMED_STEPS})", cfg40, 5.0, 40),
        ):
            rows.append([what, dtype, *_cells(job)])
            shape_of = partial(model_shape, pipe.config.model, frames=frames, height=height, width=width,
                               guidance=guidance)  # fmt: skip
            step = job["steps"] / steps
            m = modelled_8(shape_of, job["encode"], step, steps, job["decode"], job["mp4"], job["frames"])
            modelled.append([what, dtype, m["layout"], *_cells(m)])
            if steps == 4:
                judged[quant, "8"] = m["total"]
    phases = ["encode s", "steps s", "decode s", "MP4 closed after last frame s", "to closed MP4 s"]
    report.table(
        f"MEASURED on one GPU: {kit.pick(PRESET, 'tiny-random')} {frames}×{height}×{width}, eager, the VAE "
        "decoder float32, the MP4 streamed during the decode (server.writers.StreamedVideo)",
        ["job", "DiT", *phases],
        rows,
    )
    report.table(
        "MODELLED for 8 GPUs from the measured parts: steps = the layout's modelled step (parallel/plan.py: "
        "compute / sp degree + all-to-all bytes at 450 GB/s NVLink); decode = decode / 8 + the uint8 frames' "
        "gather at 450 GB/s (band-parallel, halo rows left out); encode and MP4 as measured",
        ["job", "DiT", "layout", *phases],
        modelled,
    )
    report.target("4-step whole job, bf16, one GPU", judged["none"]["total"], TARGETS["bf16"], "s")
    report.target("4-step whole job, fp8, one GPU", judged.get("fp8", {}).get("total"), TARGETS["fp8"], "s")
    best8 = min(v for k, v in judged.items() if isinstance(k, tuple))
    report.target("4-step whole job, 8 GPUs MODELLED (best DiT)", best8, TARGETS["gpus8"], "s")
    report.target("MP4 closed after the last frame", judged["none"]["mp4"], TARGETS["mp4_tail"], "s")
    written = read_mp4(judged["none"]["path"]).frames.shape
    report.expect("the streamed MP4 holds every frame", written[:3] == (frames, height, width), str(written))
    report.note(
        "Eager DiT (no --compile: its one-off compile would not fit the kit's budget); the wan-14b section "
        "measures what compile gains per forward. The 4-step rows are 4 unguided steps of the default "
        "sampler: a distilled schedule (--timesteps) costs the same per step. The encode is a fresh "
        "prompt's (the negative one, as served, comes from the text cache after the first job)."
    )


def _cells(job: dict) -> list[str]:
    return [f"{job[k]:.3f}" for k in PHASES]
