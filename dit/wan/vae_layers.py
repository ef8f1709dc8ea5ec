"""The layers of Wan's video VAE (`dit.wan.vae.WanVAE`) in torch alone, with diffusers' `AutoencoderKLWan`
parameter names and creation order (a seed gives the same random weights).

Both directions run causally in time, a chunk of frames at a time (the decoder one latent frame, the encoder
1 then 4 frames): every causal convolution keeps the last frames of its previous input (`CausalConv3d.cache`)
and prepends them to the next chunk, so a chunk sees the frames before it as the whole video would; the first
chunk sees zeros. `reset` clears that state around a video. The first chunk also skips the time resampling:
its one frame stays one frame (`Resample`, `dup_up`), so 1 + 4k frames ↔ 1 + k latent frames.

Banded decode (`dit.vae_parallel`): the decoder's layers are registered at the end of this module, as
row-local but for the attention block, which mixes the whole frame, with how the causal convolution pads rows
(the upsamplers' nn.Conv2d pads itself, which the band decode knows). The cached frames keep the halo rows
they came with.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from dit import vae_parallel
from dit.conv3d import conv3d


class CausalConv3d(nn.Conv3d):
    """A Conv3d padded 2p frames before (none after) in time and p in space, zeros, given `padding` p. With a
    time kernel over several frames it prepends the last frames of its previous input (`cache`) instead of
    zeros. It pads with F.pad (`pad`, in F.pad's order), not in the kernel: on CPUs, torch's native conv3d
    (taken for small inputs, `dit.conv3d`) runs a third slower padding itself."""

    def __init__(self, in_dim: int, out_dim: int, kernel, stride=1, padding=0):
        super().__init__(in_dim, out_dim, kernel, stride=stride)
        t, h, w = nn.modules.utils._triple(padding)
        self.pad = (w, w, h, h, 2 * t, 0)
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = list(self.pad)
        if front := pad[4]:
            if self.cache is not None:
                x = torch.cat([self.cache, x], 2)
                pad[4] -= self.cache.shape[2]
            self.cache = x[:, :, -front:].clone()
        return conv3d(self, F.pad(x, pad) if any(pad) else x)


class RMSNorm(nn.Module):
    """x / ‖x‖ over channels × √C × gamma (computed in float32)."""

    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *(1,) * (2 if images else 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.normalize's x / max(‖x‖, 1e-12), from the sum of squares: the CPU's norm over the channel dim
        # took 3-8× as long (the tiny model's decode: 226 → 165 ms); 2.5e-7 from it, relative
        x32 = x.float()
        inverse = torch.rsqrt((x32 * x32).sum(1, keepdim=True)).clamp_max(1e12)
        return (x32 * inverse).to(x.dtype) * self.scale * self.gamma


class Resample(nn.Module):
    """×2 (`upsample*`: nearest, then a 3×3 convolution) or ÷2 (`downsample*`: a stride-2 3×3 convolution) in
    rows and columns, frame by frame; the `*3d` modes also ×2 / ÷2 frames by a causal time convolution, from
    the second chunk on."""

    def __init__(self, dim: int, mode: str, upsample_out_dim: int | None = None):
        super().__init__()
        self.mode = mode
        if mode.startswith("upsample"):
            up = nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact")
            self.resample = nn.Sequential(up, nn.Conv2d(dim, upsample_out_dim or dim // 2, 3, padding=1))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        if mode == "upsample3d":  # each frame → 2 frames: 2C channels of a causal conv, interleaved in time
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":  # 2 frames → 1: the previous chunk's last frame and this chunk's
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))
        self.started, self.last = False, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if self.mode == "upsample3d":
            if self.started:
                x = self.time_conv(x).view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5)
                x = x.reshape(b, c, 2 * t, h, w)
            self.started = True
        t = x.shape[2]
        x = self.resample(x.transpose(1, 2).reshape(b * t, c, h, w))
        x = x.view(b, t, *x.shape[1:]).transpose(1, 2)
        if self.mode == "downsample3d":
            last = x[:, :, -1:].clone()
            if self.last is not None:
                x = self.time_conv(torch.cat([self.last, x], 2))
            self.last = last
        return x


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(in_dim, images=False)
        self.conv1 = CausalConv3d(in_dim, out_dim, 3, padding=1)
        self.norm2 = RMSNorm(out_dim, images=False)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = CausalConv3d(out_dim, out_dim, 3, padding=1)
        self.conv_shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_shortcut(x)
        x = self.conv1(F.silu(self.norm1(x)))
        x = self.conv2(self.dropout(F.silu(self.norm2(x))))
        return x + h


class AttentionBlock(nn.Module):
    """One head of self-attention over the pixels of each frame."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = self.norm(x.transpose(1, 2).reshape(b * t, c, h, w))
        qkv = self.to_qkv(y).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous()
        y = F.scaled_dot_product_attention(*qkv.chunk(3, dim=-1))
        y = self.proj(y.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w))
        return y.view(b, t, c, h, w).transpose(1, 2) + x


class MidBlock(nn.Module):
    def __init__(self, dim: int, dropout: float):
        super().__init__()
        first = ResidualBlock(dim, dim, dropout)
        self.attentions = nn.ModuleList([AttentionBlock(dim)])
        self.resnets = nn.ModuleList([first, ResidualBlock(dim, dim, dropout)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


def avg_down(x: torch.Tensor, out_dim: int, factor_t: int, factor_s: int) -> torch.Tensor:
    """Wan2.2's shortcut down: each factor_t × factor_s × factor_s block of pixels (frames padded before to a
    multiple of factor_t) → channels, averaged in groups down to `out_dim`."""
    x = F.pad(x, (0, 0, 0, 0, -x.shape[2] % factor_t, 0))
    b, c, t, h, w = x.shape
    t, h, w = t // factor_t, h // factor_s, w // factor_s
    x = x.view(b, c, t, factor_t, h, factor_s, w, factor_s).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, out_dim, c * factor_t * factor_s**2 // out_dim, t, h, w).mean(2)


def dup_up(x: torch.Tensor, out_dim: int, factor_t: int, factor_s: int, first_chunk: bool) -> torch.Tensor:
    """Wan2.2's shortcut up (`avg_down` reversed, channels repeated): the first chunk keeps its last frame."""
    b, c, t, h, w = x.shape
    x = x.repeat_interleave(out_dim * factor_t * factor_s**2 // c, dim=1)
    x = x.view(b, out_dim, factor_t, factor_s, factor_s, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, out_dim, t * factor_t, h * factor_s, w * factor_s)
    return x[:, :, factor_t - 1 :] if first_chunk else x


class ResidualDownBlock(nn.Module):
    """Wan2.2's encoder level: residual blocks and a downsampler, plus the input through `avg_down`."""

    def __init__(self, in_dim, out_dim, dropout, num_res_blocks, temporal: bool, down: bool):
        super().__init__()
        self.out_dim, self.factor_t, self.factor_s = out_dim, 2 if temporal else 1, 2 if down else 1
        dims = [in_dim] + [out_dim] * num_res_blocks
        self.resnets = nn.ModuleList(ResidualBlock(i, o, dropout) for i, o in pairwise(dims))
        self.downsampler = Resample(out_dim, "downsample3d" if temporal else "downsample2d") if down else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = avg_down(x, self.out_dim, self.factor_t, self.factor_s)
        for resnet in self.resnets:
            x = resnet(x)
        return (x if self.downsampler is None else self.downsampler(x)) + shortcut


class UpBlock(nn.Module):
    """Wan2.1's decoder level: residual blocks, then `upsample_mode`'s resampler (none on the last level)."""

    def __init__(self, in_dim, out_dim, num_res_blocks, dropout, upsample_mode: str | None):
        super().__init__()
        dims = [in_dim] + [out_dim] * (num_res_blocks + 1)
        self.resnets = nn.ModuleList(ResidualBlock(i, o, dropout) for i, o in pairwise(dims))
        self.upsamplers = nn.ModuleList([Resample(out_dim, upsample_mode)]) if upsample_mode else None

    def forward(self, x: torch.Tensor, first_chunk: bool = False) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.upsamplers is None else self.upsamplers[0](x)


class ResidualUpBlock(nn.Module):
    """Wan2.2's decoder level: residual blocks and an upsampler, plus the input through `dup_up` (the last
    level neither upsamples nor adds its input)."""

    def __init__(self, in_dim, out_dim, num_res_blocks, dropout, temporal: bool, up: bool):
        super().__init__()
        self.out_dim, self.factor_t = out_dim, 2 if temporal else 1
        dims = [in_dim] + [out_dim] * (num_res_blocks + 1)
        self.resnets = nn.ModuleList(ResidualBlock(i, o, dropout) for i, o in pairwise(dims))
        mode = "upsample3d" if temporal else "upsample2d"
        self.upsampler = Resample(out_dim, mode, upsample_out_dim=out_dim) if up else None

    def forward(self, x: torch.Tensor, first_chunk: bool = False) -> torch.Tensor:
        shortcut = x
        for resnet in self.resnets:
            x = resnet(x)
        if self.upsampler is None:
            return x
        return self.upsampler(x) + dup_up(shortcut, self.out_dim, self.factor_t, 2, first_chunk)


class Encoder3d(nn.Module):
    def __init__(self, in_channels, dim, z_dim, dim_mult, num_res_blocks, attn_scales, temperal_downsample,
                 dropout, is_residual):  # fmt: skip
        super().__init__()
        dims = [dim * u for u in [1, *dim_mult]]
        self.conv_in = CausalConv3d(in_channels, dims[0], 3, padding=1)
        blocks, scale = [], 1.0
        for i, (in_dim, out_dim) in enumerate(pairwise(dims)):
            down = i != len(dim_mult) - 1
            temporal = down and temperal_downsample[i]
            if is_residual:
                blocks.append(ResidualDownBlock(in_dim, out_dim, dropout, num_res_blocks, temporal, down))
                continue
            for _ in range(num_res_blocks):
                blocks.append(ResidualBlock(in_dim, out_dim, dropout))
                if scale in attn_scales:
                    blocks.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if down:
                blocks.append(Resample(out_dim, "downsample3d" if temporal else "downsample2d"))
                scale /= 2
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = MidBlock(out_dim, dropout)
        self.norm_out = RMSNorm(out_dim, images=False)
        self.conv_out = CausalConv3d(out_dim, z_dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.norm_out(self.mid_block(x))))


class Decoder3d(nn.Module):
    def __init__(self, dim, z_dim, dim_mult, num_res_blocks, temperal_upsample, dropout, out_channels,
                 is_residual):  # fmt: skip
        super().__init__()
        dims = [dim * u for u in [dim_mult[-1], *dim_mult[::-1]]]
        self.conv_in = CausalConv3d(z_dim, dims[0], 3, padding=1)
        self.mid_block = MidBlock(dims[0], dropout)
        blocks = []
        for i, (in_dim, out_dim) in enumerate(pairwise(dims)):
            up = i != len(dim_mult) - 1
            temporal = up and temperal_upsample[i]
            if is_residual:
                blocks.append(ResidualUpBlock(in_dim, out_dim, num_res_blocks, dropout, temporal, up))
            else:  # Wan2.1's upsamplers halve the channels: the next level starts from half
                mode = ("upsample3d" if temporal else "upsample2d") if up else None
                blocks.append(UpBlock(in_dim // 2 if i else in_dim, out_dim, num_res_blocks, dropout, mode))
        self.up_blocks = nn.ModuleList(blocks)
        self.norm_out = RMSNorm(out_dim, images=False)
        self.conv_out = CausalConv3d(out_dim, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, first_chunk: bool = False) -> torch.Tensor:
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x, first_chunk)
        return self.conv_out(F.silu(self.norm_out(x)))


def reset(module: nn.Module) -> None:
    """Forget the previous chunks in every layer of `module`: the next chunk starts a video."""
    for layer in module.modules():
        if isinstance(layer, CausalConv3d):
            layer.cache = None
        elif isinstance(layer, Resample):
            layer.started, layer.last = False, None


def _row_padding(conv: CausalConv3d) -> vae_parallel.RowPadding:
    p = conv.pad
    return vae_parallel.RowPadding("pad", (*p[:2], 0, 0, *p[4:]), p[2], p[3], "zeros", conv)


# Every decoder layer keeps rows apart (norms over channels, convolutions, shortcuts that spread a row over
# the rows it upsamples to) but attention, which runs on the whole frame.
vae_parallel.register(
    row_local=(Decoder3d, MidBlock, UpBlock, ResidualUpBlock, ResidualBlock, Resample, RMSNorm),
    gathered=(AttentionBlock,),
    padded={CausalConv3d: _row_padding},
)
