"""Wan2.1-architecture video DiT, numerically equal to diffusers' `WanTransformer3DModel` (the reference).

Shapes follow diffusers: latents `[B, C, F, H, W]`, timestep `[B]` or per-token `[B, S]` (Wan2.2 style),
text `[B, T, text_dim]`. Differences from the reference are layout only: q/k/v (and cross-attention k/v) are
one fused projection, and q/k RMSNorm weights are stacked so q and k are normalised and rotated in one pass.
Image-to-video (Wan2.1 I2V / FLF2V, config `image_dim` and `added_kv_proj_dim`) adds diffusers' image
embedder, whose tokens precede the text in the cross-attention context, and per-block image K/V projections
(fused like the text's): the queries attend to the image tokens separately and the two outputs are summed.
The context is the pair (text tokens, image tokens or None), so the split needs no fixed text length
(diffusers and the original take the last 512 context tokens as text: the same wherever, as in every Wan
pipeline, the text is padded to 512 tokens; the tiny text encoders pad to 16).

Precision follows diffusers: LayerNorms, modulation and the gated residuals run in fp32; the time-embedding
MLP, the modulation tables and the cross-attention and image-embedder LayerNorms stay fp32 when the model is
loaded in a lower dtype (`FP32_PARAMS`, diffusers' `_keep_in_fp32_modules`).

Parallel code never enters here: the sequence-parallel layer (`dit.parallelize`) hooks the module
boundaries (`patch_embed` output, `rope` output, `time_embed` input, `head` output) and replaces
`SelfAttention.attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dit.rowwise import RowwiseConv3d, RowwiseLinear, rowwise
from dit.wan.config import WanConfig
from parallel import local_attention

FP32_PARAMS = ("time_embed.mlp.", ".modulation", "head.modulation", ".norm_cross.", "img_embed.norm")


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 LayerNorm (no affine) then `* (1 + scale) + shift`, as diffusers; returns fp32."""
    return torch.addcmul(shift, F.layer_norm(x.float(), x.shape[-1:], eps=eps), 1 + scale)


def fp32_layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm` computed in fp32 whatever the weights' and x's dtype, back in x's (diffusers' FP32LayerNorm)."""
    w, b = norm.weight.float(), norm.bias.float()
    return F.layer_norm(x.float(), norm.normalized_shape, w, b, norm.eps).type_as(x)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE (pairs (2i, 2i+1)) as a real-valued rotation in fp32; cos/sin `[S, 1, 1, D/2]`."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


class PatchEmbed(nn.Module):
    """Conv3d patchify → tokens `[B, S, dim]` in (frame, height, width) raster order."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.proj = RowwiseConv3d(cfg.in_channels, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2).contiguous()


class RotaryEmbedding(nn.Module):
    """3D RoPE tables for a (frames, height, width) token grid: head_dim split t/h/w, h = w = 2*(head_dim//6).

    Computed per call in float64 like diffusers (no buffers, so a meta-built model needs no re-init).
    Returns cos, sin of shape `[S, 1, 1, head_dim/2]` (fp32), broadcasting over `[B, S, 2, H, D/2]`.
    """

    def __init__(self, cfg: WanConfig):
        super().__init__()
        hw = 2 * (cfg.head_dim // 6)
        self.dims = (cfg.head_dim - 2 * hw, hw, hw)
        self.theta = cfg.rope_theta

    def forward(self, grid: tuple[int, int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        angles = []
        for axis, (n, dim) in enumerate(zip(grid, self.dims, strict=True)):
            inv = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
            a = torch.outer(torch.arange(n, dtype=torch.float64, device=device), inv)
            shape = [1, 1, 1, -1]
            shape[axis] = n
            angles.append(a.view(shape).expand(*grid, -1))
        angles = torch.cat(angles, dim=-1).reshape(-1, 1, 1, sum(self.dims) // 2)
        return angles.cos().float(), angles.sin().float()


class TimeEmbedding(nn.Module):
    """Sinusoidal timestep → MLP (kept fp32) → `temb [B, S|1, dim]`, block modulation `[B, S|1, 6, dim]`."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.freq_dim = cfg.freq_dim
        self.mlp = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.proj = nn.Linear(cfg.dim, 6 * cfg.dim)

    def forward(self, timestep: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rowwise(self._embed, timestep, dtype)  # a batch's rows each as alone (dit.rowwise)

    def _embed(self, timestep: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        t = timestep if timestep.ndim == 2 else timestep[:, None]  # [B] → [B, 1]: one path for both forms
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.flatten().float()[:, None] * freqs
        sincos = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # flip_sin_to_cos=True
        mlp_dtype = self.mlp[0].weight.dtype
        temb = self.mlp(sincos.to(mlp_dtype)).to(dtype).unflatten(0, t.shape)
        mod = self.proj(F.silu(temb)).unflatten(-1, (6, -1))
        return temb, mod


class SelfAttention(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.eps = cfg.eps
        self.qkv = RowwiseLinear(cfg.dim, 3 * cfg.dim)
        self.qk_norm = nn.Parameter(torch.ones(2 * cfg.dim))  # RMSNorm weights of q then k (across all heads)
        self.out = RowwiseLinear(cfg.dim, cfg.dim)
        self.attention = local_attention  # the one op the parallel layer replaces: (q, k, v) [B, S, H, D]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (3, -1))  # [B, S, 3, dim]
        qk = F.rms_norm(qkv[:, :, :2], qkv.shape[-1:], eps=self.eps) * self.qk_norm.view(2, -1)
        qk = apply_rope(qk.unflatten(-1, (self.num_heads, -1)), cos, sin)  # [B, S, 2, H, D]
        v = qkv[:, :, 2].unflatten(-1, (self.num_heads, -1))
        out = self.attention(qk[:, :, 0], qk[:, :, 1], v)
        return self.out(out.flatten(2).type_as(x))


class CrossAttention(nn.Module):
    """Attention from the video tokens to the (replicated) text, and image tokens where the model has image
    K/V: always local, never sequence-parallel."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.eps = cfg.eps
        self.q = RowwiseLinear(cfg.dim, cfg.dim)
        self.kv = RowwiseLinear(cfg.dim, 2 * cfg.dim)
        self.norm_q = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.norm_k = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.out = RowwiseLinear(cfg.dim, cfg.dim)
        self.attention = local_attention  # the kernel choice is set from outside (`dit.parallelize`)
        self.kv_img = self.norm_k_img = None
        if cfg.added_kv_proj_dim is not None:
            self.kv_img = RowwiseLinear(cfg.added_kv_proj_dim, 2 * cfg.dim)
            self.norm_k_img = nn.RMSNorm(cfg.dim, eps=cfg.eps)

    def forward(self, x: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        """`context`: (text tokens, image tokens or None)."""
        text, image = context
        q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))
        out = self._attend(q, text, self.kv, self.norm_k)
        if image is not None:
            out = out + self._attend(q, image, self.kv_img, self.norm_k_img)
        return self.out(out.flatten(2).type_as(x))

    def _attend(
        self, q: torch.Tensor, context: torch.Tensor, kv: nn.Linear, norm_k: nn.RMSNorm
    ) -> torch.Tensor:
        k, v = kv(context).chunk(2, dim=-1)
        k = norm_k(k).unflatten(-1, (self.num_heads, -1))
        return self.attention(q, k, v.unflatten(-1, (self.num_heads, -1)))


def _modulation(rows: int, dim: int) -> nn.Parameter:
    """A learned modulation table, random as the reference initialises it; empty on the meta device, where
    the weights come from a file (a division of meta tensors runs torch's reference ops, whose first use
    imports dynamo: 0.7 s of every start-up)."""
    empty = torch.empty(1, rows, dim)
    return nn.Parameter(empty if empty.is_meta else torch.randn(1, rows, dim) / dim**0.5)


class Block(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.eps = cfg.eps
        self.self_attn = SelfAttention(cfg)
        self.norm_cross = nn.LayerNorm(cfg.dim, eps=cfg.eps) if cfg.cross_attn_norm else None
        self.cross_attn = CrossAttention(cfg)
        self.ffn = nn.Sequential(
            RowwiseLinear(cfg.dim, cfg.ffn_dim),
            nn.GELU(approximate="tanh"),
            RowwiseLinear(cfg.ffn_dim, cfg.dim),
        )
        self.modulation = _modulation(6, cfg.dim)

    def forward(self, x, context, mod, cos, sin):
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + mod.float()).unbind(2)
        h = modulate(x, shift1, scale1, self.eps).type_as(x)
        x = torch.addcmul(x.float(), self.self_attn(h, cos, sin), gate1).type_as(x)
        h = x if self.norm_cross is None else fp32_layer_norm(self.norm_cross, x)
        x = x + self.cross_attn(h, context)
        h = modulate(x, shift2, scale2, self.eps).type_as(x)
        return torch.addcmul(x.float(), self.ffn(h).float(), gate2).type_as(x)


class ImageEmbedding(nn.Module):
    """Image-encoder tokens → context tokens: fp32 LayerNorm, GELU MLP, fp32 LayerNorm (diffusers'
    WanImageEmbedding). FLF2V's first- and last-frame tokens arrive as consecutive batch entries; they are
    joined per sample and given learned positions."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.image_dim)
        self.ff = nn.Sequential(
            RowwiseLinear(cfg.image_dim, cfg.image_dim), nn.GELU(), RowwiseLinear(cfg.image_dim, cfg.dim)
        )
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.pos_embed = None
        if cfg.pos_embed_seq_len is not None:
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_embed_seq_len, cfg.image_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pos_embed is not None:
            x = x.reshape(-1, 2 * x.shape[1], x.shape[2]) + self.pos_embed
        return fp32_layer_norm(self.norm2, self.ff(fp32_layer_norm(self.norm1, x)))


class Head(nn.Module):
    """Final modulated fp32 LayerNorm and projection to patch pixels `[B, S, C * prod(patch)]`."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.eps = cfg.eps
        self.modulation = _modulation(2, cfg.dim)
        self.proj = RowwiseLinear(cfg.dim, cfg.out_channels * math.prod(cfg.patch_size))

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.unsqueeze(0) + temb.unsqueeze(2)).unbind(2)
        return self.proj(modulate(x, shift, scale, self.eps).type_as(x))


class WanModel(nn.Module):
    step_cache = None  # a dit.cache.StepCache while a generation with step caching runs

    def __init__(self, config: WanConfig):
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embed = PatchEmbed(config)
        self.rope = RotaryEmbedding(config)
        self.time_embed = TimeEmbedding(config)
        self.text_embed = nn.Sequential(
            RowwiseLinear(config.text_dim, dim), nn.GELU(approximate="tanh"), RowwiseLinear(dim, dim)
        )
        self.img_embed = ImageEmbedding(config) if config.image_dim is not None else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.head = Head(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_image: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`encoder_hidden_states_image`: an image-to-video model's image-encoder tokens `[B, N, image_dim]`
        (FLF2V: `[2B, N, image_dim]`, each sample's first then last frame)."""
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = self.config.patch_size
        grid = (f // pt, h // ph, w // pw)
        x = self.patch_embed(hidden_states)
        cos, sin = self.rope(grid, x.device)
        temb, mod = self.time_embed(timestep, encoder_hidden_states.dtype)
        text = self.text_embed(encoder_hidden_states.to(x.dtype))
        image = encoder_hidden_states_image
        context = (text, None if image is None else self.img_embed(image.to(x.dtype)))

        def run(x, blocks):
            for block in blocks:
                x = block(x, context, mod, cos, sin)
            return x

        if self.step_cache is None:
            x = run(x, self.blocks)
        else:  # dit.cache: the first block always, the others unless the step is skipped
            x = self.step_cache.run(x, lambda h: run(h, self.blocks[:1]), lambda h: run(h, self.blocks[1:]))
        x = self.head(x, temb)  # [B, S, C*pt*ph*pw]
        x = x.reshape(b, *grid, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, -1, grid[0] * pt, grid[1] * ph, grid[2] * pw)
