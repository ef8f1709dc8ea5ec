"""Building blocks of the HunyuanVideo-1.5 transformer that are not specific to the dual-stream blocks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dit.rowwise import RowwiseLinear


def timestep_sinusoid(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """[B] -> [B, dim] float32, cosine half first (diffusers `Timesteps(flip_sin_to_cos=True, shift=0)`)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class MLP2(nn.Module):
    """linear -> activation -> linear (timestep and pooled-text embedders, the feed-forwards)."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int, act: nn.Module):
        super().__init__()
        self.linear_1 = RowwiseLinear(dim_in, hidden)
        self.act = act
        self.linear_2 = RowwiseLinear(hidden, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class TimestepEmbedder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.mlp = MLP2(256, dim, dim, nn.SiLU())

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_sinusoid(t).to(self.mlp.linear_1.weight.dtype))


class RMSNorm(nn.Module):
    """RMS norm over the head dim, statistics in fp32 (diffusers `RMSNorm` semantics)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(var + self.eps)).to(self.weight.dtype) * self.weight


def rope_3d(grid: tuple[int, int, int], axes_dim, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [F*H*W, sum(axes_dim)] float32 for a (t, h, w) token grid, pairs interleaved per axis."""
    axes = torch.meshgrid(*[torch.arange(n, dtype=torch.float32, device=device) for n in grid], indexing="ij")
    cos, sin = [], []
    for pos, dim in zip(axes, axes_dim, strict=True):
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        angles = torch.outer(pos.reshape(-1), inv)
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] with cos/sin [S, D]: rotate interleaved (even, odd) pairs, in fp32."""
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    cos, sin = cos[None, :, None], sin[None, :, None]
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """LayerNorm without affine (eps 1e-6), then per-sample scale/shift ([B, D] each)."""
    x = F.layer_norm(x, x.shape[-1:], eps=1e-6)
    return x * (1 + scale[:, None]) + shift[:, None]


class Modulation(nn.Module):
    """silu(temb) -> linear -> n vectors of width dim (adaLN)."""

    def __init__(self, dim: int, n: int, cond_dim: int | None = None):
        super().__init__()
        self.n = n
        self.linear = RowwiseLinear(cond_dim or dim, n * dim)

    def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(temb)).chunk(self.n, dim=-1)


class ByT5Projection(nn.Module):
    """Second text encoder (ByT5 glyph tokens) -> model width."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim_in)
        self.linear_1 = RowwiseLinear(dim_in, hidden)
        self.linear_2 = RowwiseLinear(hidden, hidden)
        self.linear_3 = RowwiseLinear(hidden, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.linear_1(self.norm(x)))
        return self.linear_3(F.gelu(self.linear_2(x)))


class ImageProjection(nn.Module):
    """SigLIP image embeddings (image-to-video) -> model width."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.norm_in = nn.LayerNorm(dim_in)
        self.linear_1 = RowwiseLinear(dim_in, dim_in)
        self.linear_2 = RowwiseLinear(dim_in, dim_out)
        self.norm_out = nn.LayerNorm(dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_out(self.linear_2(F.gelu(self.linear_1(self.norm_in(x)))))
