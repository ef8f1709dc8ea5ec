"""HunyuanVideo-1.5's VAE decoded a latent frame at a time, as diffusers decodes the whole video at once.

diffusers' `AutoencoderKLHunyuanVideo15` decodes every frame in one call: no frame reaches the MP4 before the
last is decoded, and at 720p and 121 frames one full-resolution activation of its last block (128 channels)
is 57 GB in float32 (diffusers' pipeline turns on tiling, whose blended tiles are not exact). Its decoder is
causal in time, though, so `streamed(vae)` gives it `decode_chunks(z)`, as Wan's VAE has: the first latent
frame (→ 1 frame), then one at a time (→ 4), each layer carrying from chunk to chunk what the next needs:
- a causal convolution (time kernel k): its last k − 1 input frames, where the video's first chunk had the
  replicate padding of its first frame;
- an upsampler that doubles time: whether the chunk opens the video (its first frame is not doubled);
- the attention block (the mid-block's, at the lowest resolution): the keys and values of the frames before.

The attention also drops diffusers' `[S, S]` float mask over all S = frames × rows × columns positions,
filled by a Python loop of S steps (at 480p and 121 frames S = 49290: 9.7 GB and 49290 fills a decode, on
every rank of the band-parallel decode): each frame's queries attend to the keys up to their frame, one call
per frame, so memory grows linearly in S; in the banded decode each rank runs its own rows' queries only.
Without a chunk loop (`vae.decode`) the decoder runs as diffusers'. Either way its convolutions run on CPUs
through oneDNN where torch would pick its slow native kernel (`dit.conv3d`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from dit.conv3d import conv3d


class _Stream:
    """One chunked decode's carried state: each layer's, and whether the next chunk opens the video."""

    def __init__(self):
        self.first, self.carried = True, {}


def streamed(vae: nn.Module) -> nn.Module:
    """`vae` (diffusers' HunyuanVideo-1.5 VAE) with `decode_chunks` and its decoder's layers able to carry
    state between chunks (the attention mask-free in every decode)."""
    from diffusers.models.autoencoders import autoencoder_kl_hunyuanvideo15 as hy

    forwards = {hy.HunyuanVideo15CausalConv3d: _causal_conv, hy.HunyuanVideo15Upsample: _upsample,
                hy.HunyuanVideo15AttnBlock: _attention}  # fmt: skip
    for module in vae.decoder.modules():
        if type(module) in forwards:
            module.forward, module.stream = MethodType(forwards[type(module)], module), None
        if isinstance(module, hy.HunyuanVideo15AttnBlock):
            module.band_rows = None  # the banded decode's rows of this rank (dit.vae_parallel)
    vae.decode_chunks = MethodType(_decode_chunks, vae)
    return vae


def _decode_chunks(vae: nn.Module, z: torch.Tensor) -> Iterator[torch.Tensor]:
    """The video `[1, 3, n, H, W]` of one latent frame of `z` at a time, as each is decoded."""
    stream = _Stream()
    carriers = [m for m in vae.decoder.modules() if hasattr(m, "stream")]
    for module in carriers:
        module.stream = stream
    try:
        for at in range(z.shape[2]):
            yield vae.decoder(z[:, :, at : at + 1])
            stream.first = False
    finally:
        for module in carriers:
            module.stream = None


def _causal_conv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`HunyuanVideo15CausalConv3d.forward`, its time padding taken from the frames before in a stream. Reads
    `time_causal_padding` (W, W, H, H, k − 1, 0) at each call: the banded decode changes its rows."""
    pad, mode = conv.time_causal_padding, conv.pad_mode
    if conv.stream is None:
        return conv3d(conv.conv, F.pad(x, pad, mode=mode))
    keep, before = pad[4], conv.stream.carried.get(conv)
    timed = F.pad(x, (0, 0, 0, 0, keep, 0), mode=mode) if before is None else torch.cat([before, x], 2)
    if keep:
        conv.stream.carried[conv] = timed[:, :, -keep:].clone()  # not a view: the chunk's tensor may go
    return conv3d(conv.conv, F.pad(timed, (*pad[:4], 0, 0), mode=mode))


def _upsample(up: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`HunyuanVideo15Upsample.forward`; past a stream's first chunk, no frame is the video's first."""
    if up.stream is None or up.stream.first or not up.add_temporal_upsample:
        return type(up).forward(up, x)
    rearrange = up._dcae_upsample_rearrange
    shortcut = rearrange(x, r1=2, r2=2, r3=2).repeat_interleave(repeats=up.repeats, dim=1)
    return rearrange(up.conv(x), r1=2, r2=2, r3=2) + shortcut


def _attention(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`HunyuanVideo15AttnBlock.forward` of `x` `[B, C, F, H, W]`: one head of C channels, each frame's
    positions attending to those of its frame and the frames before it (in a stream, earlier chunks' too).
    In the banded decode (`band_rows`: this rank's rows of the whole frame `x`) only those rows' queries run
    and only those rows come back."""
    normed = block.norm(x)
    b, c, f, h, w = x.shape
    top, bottom = block.band_rows or (0, h)
    k, v = (proj(normed).flatten(2).transpose(1, 2).unsqueeze(1) for proj in (block.to_k, block.to_v))
    q = block.to_q(normed[..., top:bottom, :]).flatten(2).transpose(1, 2).unsqueeze(1)
    if block.stream is not None:
        before = block.stream.carried.get(block)
        if before is not None:
            k, v = torch.cat([before[0], k], 2), torch.cat([before[1], v], 2)
        block.stream.carried[block] = (k, v)
    n, m = h * w, (bottom - top) * w  # key and query positions a frame
    past = k.shape[2] - f * n  # positions of earlier chunks
    frames = [F.scaled_dot_product_attention(q[:, :, i * m : (i + 1) * m], k[:, :, : past + (i + 1) * n],
                                             v[:, :, : past + (i + 1) * n]) for i in range(f)]  # fmt: skip
    out = torch.cat(frames, dim=2).squeeze(1).reshape(b, f, bottom - top, w, c).permute(0, 4, 1, 2, 3)
    return block.proj_out(out) + x[..., top:bottom, :]
