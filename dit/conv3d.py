"""A VAE's 3D convolution on the CPU through oneDNN where torch would pick its own slow kernel.

For one video through a kernel of at most 3×3 with fewer than 20480 (channel, frame, row) triples, torch's
conv3d (ATen's `use_mkldnn` heuristic) runs its native `slow_conv3d_forward` rather than oneDNN's: 4-5× slower
on the tiny model's VAE and a latent frame at a time in HunyuanVideo-1.5's streamed decode (measured on the
2-core CPU box, torch 2.13: [1, 8, 6, 66, 66] × [8, 8, 3, 3, 3] 4.14 → 0.82 ms). oneDNN sums in another
order: about 2e-6 relative from torch's kernel, float32. Training (autograd on) keeps torch's choice."""

from __future__ import annotations

import torch
from torch import nn

MKLDNN = torch.backends.mkldnn.is_available()


def conv3d(conv: nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """`conv`'s forward of `x` (hooks not run again: call it from a module's own forward), oneDNN's on a CPU
    float32 inference where its padding reaches the kernel (zeros mode, explicit sizes)."""
    fast = MKLDNN and x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
    if fast and conv.padding_mode == "zeros" and not isinstance(conv.padding, str):
        geometry = (conv.padding, conv.stride, conv.dilation, conv.groups)
        return torch.mkldnn_convolution(x, conv.weight, conv.bias, *geometry)
    return nn.Conv3d.forward(conv, x)
