"""HunyuanVideo-1.5 DiT forward time: ours vs diffusers' HunyuanVideo15Transformer3DModel with the same
weights, in the same run.

    python bench/hunyuan.py                        # CPU: a small config, 17x128x128 video, fp32
    python bench/hunyuan.py --compile --json       # adds torch.compile for both; JSON after the table
    python bench/hunyuan.py --preset hunyuanvideo-1.5-480p-t2v   # CUDA default: 480x848, 121 frames, bf16

The latent is (frames-1)/4+1 x height/16 x width/16 (the HunyuanVideo-1.5 VAE strides). Both models get the
same text-to-video inputs: Qwen text with --valid-text of --text-len tokens real, 8 of 256 ByT5 tokens real,
and the all-zero SigLIP embedding that means "no image" (diffusers masks those 729 tokens; ours drops them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench import common  # noqa: E402
from bench.common import add_run_args, check_run, check_video_size, compare, device_name, report  # noqa: E402
from bench.entry import run_main  # noqa: E402
from dit.hunyuan.config import PRESETS, HunyuanVideo15Config  # noqa: E402
from dit.hunyuan.model import HunyuanVideo15Transformer  # noqa: E402
from dit.hunyuan.state_dict import resolve  # noqa: E402
from dit.pipeline import DTYPES  # noqa: E402
from dit.weights import load_state, materialize, random_init  # noqa: E402

SMALL = dataclasses.replace(
    PRESETS["hunyuanvideo-1.5-480p-t2v"], num_layers=4, num_attention_heads=8, attention_head_dim=64,
    rope_axes_dim=(16, 24, 24), text_embed_dim=512, text_embed_2_dim=64, image_embed_dim=64,
)  # fmt: skip


def models(config: HunyuanVideo15Config, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """diffusers' model and ours, allocated directly in dtype on device, sharing one set of random weights."""
    from diffusers import HunyuanVideo15Transformer3DModel

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            ref = HunyuanVideo15Transformer3DModel(**config.to_dict())
            ours = HunyuanVideo15Transformer(config)
    finally:
        torch.set_default_dtype(default)
    random_init(ref.to_empty(device=device), seed, on_device=True)  # shared by both: GPU-drawn is fast
    load_state(materialize(ours, dtype=dtype, device=device), ref.state_dict(), resolve)
    return ref.eval().requires_grad_(False), ours.eval().requires_grad_(False)


def hunyuan_inputs(cfg, frames: int, height: int, width: int, text_len: int, valid_text: int, device, dtype):
    """(forward keyword arguments, image tokens) for a text-to-video forward (seed 0): `valid_text` of
    `text_len` Qwen tokens real, 8 of 256 ByT5 tokens real, the all-zero SigLIP embedding ("no image")."""
    grid = ((frames - 1) // 4 + 1, height // 16, width // 16)
    g = torch.Generator(device=device).manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g, device=device, dtype=dtype)
    mask = torch.arange(text_len, device=device)[None] < valid_text
    mask_2 = torch.arange(256, device=device)[None] < 8
    inputs = dict(
        hidden_states=rand(1, cfg.in_channels, *grid),
        timestep=torch.tensor([500.0], device=device, dtype=dtype),
        encoder_hidden_states=rand(1, text_len, cfg.text_embed_dim),
        encoder_attention_mask=mask.long(),
        encoder_hidden_states_2=rand(1, 256, cfg.text_embed_2_dim),
        encoder_attention_mask_2=mask_2.long(),
        image_embeds=torch.zeros(1, 729, cfg.image_embed_dim, device=device, dtype=dtype),
    )
    tokens = grid[0] * (grid[1] // cfg.patch_size) * (grid[2] // cfg.patch_size)
    return inputs, tokens


def main(argv=None) -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = "hunyuanvideo-1.5-480p-t2v" if cuda else "small"
    p.add_argument("--preset", default=default, help="small or a HunyuanVideo-1.5 preset")
    p.add_argument("--layers", type=int, help="override num_layers (quick runs of big presets)")
    p.add_argument("--frames", type=int, default=121 if cuda else 17)
    p.add_argument("--height", type=int, default=480 if cuda else 128)
    p.add_argument("--width", type=int, default=848 if cuda else 128)
    p.add_argument("--text-len", type=int, default=1000 if cuda else 64)
    p.add_argument("--valid-text", type=int, default=120 if cuda else 24, help="real tokens of --text-len")
    add_run_args(p, DTYPES, cuda)
    args = p.parse_args(argv)
    check_video_size(p, args)
    common.check_preset(p, args.preset, PRESETS)
    if not 1 <= args.valid_text <= args.text_len:  # it ran, and its title read "text 999/64"
        p.error(f"--valid-text {args.valid_text}: the real tokens of --text-len {args.text_len}, 1 to it")

    cfg = SMALL if args.preset == "small" else PRESETS[args.preset]
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    check_run(p, args, lambda: HunyuanVideo15Transformer(cfg))
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    ref, ours = models(cfg, dtype, device)
    size = (args.frames, args.height, args.width)
    inputs, tokens = hunyuan_inputs(cfg, *size, args.text_len, args.valid_text, device, dtype)

    fns = {"diffusers": lambda **kw: ref(**kw, return_dict=False)[0], "ours": ours}
    rows, diff = compare(fns, lambda fn: fn(**inputs), args, device)
    name = device_name(device)
    title = (
        f"{args.preset} ({cfg.num_layers} layers, dim {cfg.inner_dim}), "
        f"{args.frames}x{args.height}x{args.width}"
        f" -> {tokens} tokens, text {args.valid_text}/{args.text_len} + 8/256 ByT5, {args.dtype}, {name}, "
        f"torch {torch.__version__}"
    )
    report(title, rows, diff, args, tokens=tokens, device_name=name)


if __name__ == "__main__":
    run_main(main)
