"""A LoRA for a tiny Wan model, built in code: the servers' `--lora-dir` in tests."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

# original Wan module → our parameter (one matrix each, no fused parts)
_MODULES = {"self_attn.o": "self_attn.out", "ffn.2": "ffn.2"}


def write_lora(path, model: str = "tiny", *, seed: int = 0, rank: int = 4, scale: float = 1.0) -> str:
    """A rank-`rank` LoRA in the original Wan layout on every block's attention output and FFN output of the
    `model` preset, its factors drawn from `seed` (`scale`: the size of its change); returns the path."""
    import dit

    params = dict(dit.load_transformer(model, device="meta").named_parameters())
    blocks = sorted({int(name.split(".")[1]) for name in params if name.startswith("blocks.")})
    g, state = torch.Generator().manual_seed(seed), {}
    for i in blocks:
        for module, ours in _MODULES.items():
            out, fan_in = params[f"blocks.{i}.{ours}.weight"].shape
            key = f"diffusion_model.blocks.{i}.{module}"
            state[f"{key}.lora_down.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            state[f"{key}.lora_up.weight"] = scale * torch.randn(out, rank, generator=g) / rank**0.5
    save_file(state, str(path))
    return str(path)
