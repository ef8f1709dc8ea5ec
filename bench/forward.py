"""DiT forward time: ours vs diffusers' WanTransformer3DModel with the same weights, in the same run.

    python bench/forward.py                      # CPU: a small Wan config at 128x128, 33 frames, fp32
    python bench/forward.py --family hunyuanvideo-1.5 [...]   # the options of bench/hunyuan.py
    python bench/forward.py --compile --json     # adds torch.compile for both; JSON after the table
    python bench/forward.py --preset wan2.1-14b  # CUDA default: 480x832, 81 frames (32760 tokens), bf16

Frames/height/width are video sizes; the latent is (frames-1)/4+1 × height/8 × width/8 (Wan VAE strides).
Times are the median of --iters forwards after --warmup ones (compiled runs warm up more). No asserts: this
prints numbers; tests/test_wan_model.py checks exactness.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.common import (  # noqa: E402
    add_run_args,
    check_preset,
    check_run,
    check_video_size,
    compare,
    device_name,
    report,
)
from bench.entry import run_main  # noqa: E402
from dit.families import weight_format  # noqa: E402
from dit.loading import build_empty  # noqa: E402
from dit.presets import PRESETS  # noqa: E402
from dit.weights import load_state, random_init  # noqa: E402

SMALL = {
    **PRESETS["wan2.1-1.3b"],
    "num_layers": 4,
    "num_attention_heads": 8,
    "attention_head_dim": 64,
    "ffn_dim": 1536,
    "text_dim": 512,
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def diffusers_model(config_json: dict, dtype: torch.dtype, device: torch.device, seed: int):
    """diffusers' model allocated directly in dtype on device, random weights, `_keep_in_fp32_modules` in fp32
    (what `from_pretrained(torch_dtype=...)` does)."""
    from diffusers import WanTransformer3DModel

    kwargs = {k: v for k, v in config_json.items() if not k.startswith("_")}
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            ref = WanTransformer3DModel(**kwargs)
    finally:
        torch.set_default_dtype(default)
    ref.to_empty(device=device)
    random_init(ref, seed, on_device=True)  # timing and ours-vs-diffusers only: the GPU draws them fast
    with torch.device(device):  # its RoPE tables are non-persistent buffers: to_empty left them garbage
        ref.rope = type(ref.rope)(ref.rope.attention_head_dim, ref.rope.patch_size, ref.rope.max_seq_len)
    keep = WanTransformer3DModel._keep_in_fp32_modules
    for name, module in ref.named_modules():
        if any(k in name.split(".") for k in keep):
            module.float()
    return ref.eval().requires_grad_(False)


def ours_from(ref, config_json: dict, dtype: torch.dtype, device: torch.device):
    family, config, model = build_empty(config_json, dtype, device)
    load_state(model, ref.state_dict(), family.resolver(config))
    return model.eval().requires_grad_(False)


def wan_inputs(cfg, frames: int, height: int, width: int, text_len: int, device, dtype):
    """((latents, timestep, text), image tokens) for a Wan forward of a frames×height×width video (seed 0)."""
    grid = ((frames - 1) // 4 + 1, height // 8, width // 8)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, cfg.in_channels, *grid, generator=g, device=device, dtype=dtype)
    t = torch.tensor([500.0], device=device)
    ctx = torch.randn(1, text_len, cfg.text_dim, generator=g, device=device, dtype=dtype)
    tokens = grid[0] * (grid[1] // cfg.patch_size[1]) * (grid[2] // cfg.patch_size[2])
    return (x, t, ctx), tokens


def _family(argv: list[str]) -> tuple[str, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--family", choices=("wan", "hunyuanvideo-1.5"), default="wan")
    known, rest = p.parse_known_args(argv)
    return known.family, rest


def main(argv=None) -> None:
    family, argv = _family(sys.argv[1:] if argv is None else argv)
    if family == "hunyuanvideo-1.5":
        from bench.hunyuan import main as hunyuan_main

        return hunyuan_main(argv)
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="wan2.1-14b" if cuda else "small", help="small or a dit preset")
    p.add_argument("--layers", type=int, help="override num_layers (quick runs of big presets)")
    p.add_argument("--frames", type=int, default=81 if cuda else 33)
    p.add_argument("--height", type=int, default=480 if cuda else 128)
    p.add_argument("--width", type=int, default=832 if cuda else 128)
    p.add_argument("--text-len", type=int, default=512 if cuda else 64)
    add_run_args(p, DTYPES, cuda)
    args = p.parse_args(argv)
    check_video_size(p, args)
    check_preset(p, args.preset, PRESETS)

    config_json = dict(SMALL if args.preset == "small" else PRESETS[args.preset])
    if args.layers:
        config_json["num_layers"] = args.layers
    weights = weight_format(config_json["_class_name"])
    check_run(p, args, lambda: weights.build(weights.parse_config(config_json)))
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    ref = diffusers_model(config_json, dtype, device, seed=0)
    ours = ours_from(ref, config_json, dtype, device)
    cfg = ours.config
    inputs, tokens = wan_inputs(cfg, args.frames, args.height, args.width, args.text_len, device, dtype)
    fns = {"diffusers": lambda *a: ref(*a, return_dict=False)[0], "ours": ours}
    rows, diff = compare(fns, lambda fn: fn(*inputs), args, device)
    name = device_name(device)
    size = f"{args.frames}x{args.height}x{args.width}"
    title = f"{args.preset} ({cfg.num_layers} layers, dim {cfg.dim}), {size} -> {tokens} tokens, "
    title += f"text {args.text_len}, {args.dtype}, {name}, torch {torch.__version__}"
    report(title, rows, diff, args, tokens=tokens, device_name=name)


if __name__ == "__main__":
    run_main(main)
