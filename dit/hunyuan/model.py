"""HunyuanVideo-1.5 video DiT: dual-stream blocks with joint image+text attention.

Numerically equal to diffusers' `HunyuanVideo15Transformer3DModel` (the reference). Differences of form:
q/k/v projections are fused per stream; text padding is dropped from the attention instead of masked in a
full [S+T, S+T] matrix (valid text tokens are packed first, the batch is trimmed to its longest valid text);
the model holds two replaceable hooks so `dit.hunyuan.parallelize` can make it sequence-parallel without
touching this file: `attention` (the joint attention op) and `sequence` (shard image tokens, gather back).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dit.hunyuan.config import BYT5_HIDDEN_DIM, HunyuanVideo15Config
from dit.hunyuan.layers import (
    MLP2,
    ByT5Projection,
    ImageProjection,
    Modulation,
    RMSNorm,
    TimestepEmbedder,
    apply_rope,
    modulate,
    rope_3d,
)
from dit.hunyuan.refiner import TokenRefiner
from dit.rowwise import RowwiseConv3d, RowwiseLinear, real_rows
from parallel.ulysses import joint_attention

# Condition-type ids added to each text source (diffusers `cond_type_embed`).
COND_TEXT, COND_BYT5, COND_IMAGE = 0, 1, 2


@dataclass
class LocalJointAttention:
    """Single-process joint attention: image tokens first, text after; text padding keys excluded exactly.

    Same call shape as `parallel.attention` without the mesh: q/k/v `[B, S, H, D]`, text=(tq, tk, tv)
    `[B, T, H, D]`, text_mask `[B, T]` bool or None -> (out `[B, S, H, D]`, text_out `[B, T, H, D]`).
    """

    backend: str = "auto"

    def __call__(self, q, k, v, *, text, text_mask=None, info=None):
        return joint_attention(q, k, v, q.shape[1], text, text_mask, False, False, self.backend)


class LocalSequence:
    """Identity sharding hook; `dit.hunyuan.parallelize` swaps in one that shards over the mesh."""

    def shard(self, x: torch.Tensor, *aligned: torch.Tensor):
        """x [B, S, C] and tensors aligned with its sequence ([S, ...]) -> (x_local, aligned_local, info)."""
        return x, aligned, None

    def gather(self, x: torch.Tensor, info) -> torch.Tensor:
        return x

    def real_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's real tokens of a block output (all of them: nothing is sharded or padded)."""
        return x


class JointAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        head_dim = dim // heads
        self.img_qkv = RowwiseLinear(dim, 3 * dim)
        self.txt_qkv = RowwiseLinear(dim, 3 * dim)
        self.img_norm_q, self.img_norm_k = RMSNorm(head_dim), RMSNorm(head_dim)
        self.txt_norm_q, self.txt_norm_k = RMSNorm(head_dim), RMSNorm(head_dim)
        self.img_out = RowwiseLinear(dim, dim)
        self.txt_out = RowwiseLinear(dim, dim)

    def forward(self, x, txt, rope, text_mask, op, info):
        q, k, v = self.img_qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)
        q = apply_rope(self.img_norm_q(q), *rope)
        k = apply_rope(self.img_norm_k(k), *rope)
        tq, tk, tv = real_rows(self.txt_qkv, txt, text_mask).unflatten(-1, (3, self.heads, -1)).unbind(2)
        tq, tk = self.txt_norm_q(tq), self.txt_norm_k(tk)
        out, txt_out = op(
            q, k, v.contiguous(), text=(tq, tk, tv.contiguous()), text_mask=text_mask, info=info
        )
        txt_out = real_rows(self.txt_out, txt_out.flatten(2).to(x.dtype), text_mask)
        return self.img_out(out.flatten(2).to(x.dtype)), txt_out


class DualStreamBlock(nn.Module):
    """Image and text streams with their own adaLN modulation and MLPs, joined in one attention."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.img_mod = Modulation(dim, 6)
        self.txt_mod = Modulation(dim, 6)
        self.attn = JointAttention(dim, heads)
        self.img_mlp = MLP2(dim, hidden, dim, nn.GELU(approximate="tanh"))
        self.txt_mlp = MLP2(dim, hidden, dim, nn.GELU(approximate="tanh"))

    def forward(self, x, txt, temb, rope, text_mask, op, info):
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.img_mod(temb)
        t_shift_a, t_scale_a, t_gate_a, t_shift_m, t_scale_m, t_gate_m = self.txt_mod(temb)
        attn, txt_attn = self.attn(
            modulate(x, shift_a, scale_a), modulate(txt, t_shift_a, t_scale_a), rope, text_mask, op, info
        )
        x = x + attn * gate_a[:, None]
        txt = txt + txt_attn * t_gate_a[:, None]
        x = x + gate_m[:, None] * self.img_mlp(modulate(x, shift_m, scale_m))
        txt = txt + t_gate_m[:, None] * real_rows(
            self.txt_mlp, modulate(txt, t_shift_m, t_scale_m), text_mask
        )
        return x, txt


def pack_text(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Join text sources in order, move each sample's valid tokens first (stable: image, ByT5, main text, as
    the reference orders them) and padding last, zero the padding, trim the batch to its longest valid text.
    Returns (tokens [B, T, C], mask [B, T] bool, or None when no padding is left)."""
    tokens = torch.cat([t for t, _ in parts], dim=1)
    mask = torch.cat([m for _, m in parts], dim=1)
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    mask = torch.gather(mask, 1, order)
    tokens = torch.gather(tokens, 1, order[..., None].expand_as(tokens)) * mask[..., None]
    keep = int(mask.sum(dim=1).max())
    # copied to standard strides (`.contiguous()` keeps a size-1 batch's stride): the first block would
    # otherwise see other strides than the rest, and torch.compile compile it a second time
    tokens, mask = tokens[:, :keep].clone(memory_format=torch.contiguous_format), mask[:, :keep]
    return tokens, (None if bool(mask.all()) else mask)


class HunyuanVideo15Transformer(nn.Module):
    step_cache = None  # a dit.cache.StepCache while a generation with step caching runs

    def __init__(self, config: HunyuanVideo15Config):
        super().__init__()
        self.config = config
        dim, heads = config.inner_dim, config.num_attention_heads
        self.patch_embed = RowwiseConv3d(
            config.in_channels, dim, kernel_size=config.patch, stride=config.patch
        )
        self.image_embedder = ImageProjection(config.image_embed_dim, dim)
        self.text_refiner = TokenRefiner(config.text_embed_dim, dim, heads, config.num_refiner_layers)
        self.byt5_proj = ByT5Projection(config.text_embed_2_dim, BYT5_HIDDEN_DIM, dim)
        self.time_embed = TimestepEmbedder(dim)
        # MeanFlow (super-resolution) models add an embedding of the reference timestep.
        self.time_embed_r = TimestepEmbedder(dim) if config.use_meanflow else None
        self.cond_type_embed = nn.Embedding(3, dim)
        self.blocks = nn.ModuleList(
            DualStreamBlock(dim, heads, config.mlp_ratio) for _ in range(config.num_layers)
        )
        self.norm_out = Modulation(dim, 2)
        self.proj_out = RowwiseLinear(dim, config.patch_size_t * config.patch_size**2 * config.out_channels)
        self.attention = LocalJointAttention()
        self.sequence = LocalSequence()

    def _text_tokens(self, timestep, text, text_mask, text_2, text_mask_2, image_embeds):
        batch = text.shape[0]
        ones = lambda t: torch.ones(batch, t.shape[1], dtype=torch.bool, device=t.device)
        text_mask = ones(text) if text_mask is None else text_mask.bool()
        cond = self.cond_type_embed.weight
        parts = [(self.text_refiner(text, timestep, text_mask) + cond[COND_TEXT], text_mask)]
        if text_2 is not None:
            mask_2 = ones(text_2) if text_mask_2 is None else text_mask_2.bool()
            parts.insert(0, (self.byt5_proj(text_2) + cond[COND_BYT5], mask_2))
        # As in the reference, all-zero image embeddings mean text-to-video: the image tokens are all padding.
        if image_embeds is not None and bool((image_embeds != 0).any()):
            parts.insert(0, (self.image_embedder(image_embeds) + cond[COND_IMAGE], ones(image_embeds)))
        return pack_text(parts)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        timestep_r: torch.Tensor | None = None,
        encoder_hidden_states_2: torch.Tensor | None = None,
        encoder_attention_mask_2: torch.Tensor | None = None,
        image_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cfg = self.config
        b, _, f, h, w = hidden_states.shape
        grid = (f // cfg.patch_size_t, h // cfg.patch_size, w // cfg.patch_size)
        rope = rope_3d(grid, cfg.rope_axes_dim, cfg.rope_theta, hidden_states.device)

        temb = self.time_embed(timestep)
        if timestep_r is not None:
            temb = temb + self.time_embed_r(timestep_r)
        txt, text_mask = self._text_tokens(
            timestep,
            encoder_hidden_states,
            encoder_attention_mask,
            encoder_hidden_states_2,
            encoder_attention_mask_2,
            image_embeds,
        )

        x = self.patch_embed(hidden_states).flatten(2).transpose(1, 2)
        x, rope, info = self.sequence.shard(x, *rope)

        def run(x, blocks):
            nonlocal txt  # the text stream flows on through the blocks run; only x leaves the last one
            for block in blocks:
                x, txt = block(x, txt, temb, rope, text_mask, self.attention, info)
            return x

        if self.step_cache is None:
            x = run(x, self.blocks)
        else:  # dit.cache: the first block always, the others unless the step is skipped
            x = self.step_cache.run(x, lambda h: run(h, self.blocks[:1]), lambda h: run(h, self.blocks[1:]))

        scale, shift = self.norm_out(temb)
        x = self.proj_out(modulate(x, shift, scale))
        x = self.sequence.gather(x, info)

        pt, ph, pw = cfg.patch
        x = x.reshape(b, *grid, -1, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return x.reshape(b, -1, grid[0] * pt, grid[1] * ph, grid[2] * pw)
