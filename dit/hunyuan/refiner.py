"""The token refiner: a few bidirectional transformer blocks over the main (Qwen) text embedding,
conditioned on the timestep and the masked mean of the text."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dit.hunyuan.layers import MLP2, Modulation, TimestepEmbedder
from dit.rowwise import RowwiseLinear


class RefinerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = RowwiseLinear(dim, 3 * dim)
        self.proj = RowwiseLinear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLP2(dim, int(dim * mlp_ratio), dim, nn.SiLU())
        self.gates = Modulation(dim, 2)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).transpose(1, 3).unbind(2)
        # Padding queries attend to the valid keys; their outputs are dropped before the main blocks.
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        attn = self.proj(attn.transpose(1, 2).flatten(2))
        gate_attn, gate_mlp = self.gates(temb)
        x = x + attn * gate_attn[:, None]
        return x + self.mlp(self.norm2(x)) * gate_mlp[:, None]


class TokenRefiner(nn.Module):
    def __init__(self, dim_in: int, dim: int, heads: int, num_layers: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.time_embed = TimestepEmbedder(dim)
        self.pooled_embed = MLP2(dim_in, dim, dim, nn.SiLU())
        self.proj_in = RowwiseLinear(dim_in, dim)
        self.blocks = nn.ModuleList(RefinerBlock(dim, heads, mlp_ratio) for _ in range(num_layers))

    def forward(self, text: torch.Tensor, timestep: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.float().unsqueeze(-1)
        pooled = ((text * weights).sum(dim=1) / weights.sum(dim=1)).to(text.dtype)
        temb = self.time_embed(timestep) + self.pooled_embed(pooled)
        x = self.proj_in(text)
        key_mask = mask[:, None, None, :]
        for block in self.blocks:
            x = block(x, temb, key_mask)
        return x
