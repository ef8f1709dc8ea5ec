"""Band-parallel VAE decode: every rank of a group decodes a band of rows of every frame, and group rank 0
gets the video, equal to diffusers' own `decode` on one rank (same weights; float32 to rounding).

The split is on the latent grid (`parallel.RowBands`), so at every resolution of the decoder (each upsampling
doubles the rows) a band is a whole number of rows. Inside `banded(vae, bands)`:
- every convolution that pads rows (the 3×3 spatial kernels: `WanCausalConv3d`, the `Conv2d` of Wan's
  upsamplers, `HunyuanVideo15CausalConv3d`) takes those rows from the neighbouring bands instead and pads only
  at the image's true top and bottom, as the layer itself does (Wan: zeros, HunyuanVideo-1.5: replicate). Its
  time padding and diffusers' causal feature cache stay as they are: Wan's cached frames take the same halo;
- the attention blocks, which mix the whole frame (Wan: within each frame; HunyuanVideo-1.5: causally over
  all frames), all-gather the band, run unchanged and keep this rank's rows. They run at the lowest
  resolution, so the whole frame is small there;
- every other decoder layer is row-local (RMS norms over channels, SiLU, nearest upsampling, pixel shuffles,
  1×1 convolutions; Wan2.2's residual up blocks, whose shortcut `DupUp3D` spreads each row's channels over 2
  output rows, and its VAE's final unpatchify, which does the same outside any layer); a layer class not
  listed here is refused rather than decoded wrong.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from diffusers.models.autoencoders import autoencoder_kl_hunyuanvideo15 as hy
from diffusers.models.autoencoders import autoencoder_kl_wan as wan
from torch import nn

from parallel import RowBands

ROWS = -2  # every decoder tensor is [..., H, W]
ENCODER_PARTS = ("encoder", "quant_conv")  # not run by decode
GATHERED = (wan.WanAttentionBlock, hy.HunyuanVideo15AttnBlock)
ROW_LOCAL = (
    wan.WanDecoder3d, wan.WanMidBlock, wan.WanUpBlock, wan.WanResidualBlock, wan.WanResample, wan.WanRMS_norm,
    wan.WanResidualUpBlock, wan.DupUp3D,
    hy.HunyuanVideo15Decoder3D, hy.HunyuanVideo15MidBlock, hy.HunyuanVideo15UpBlock3D,
    hy.HunyuanVideo15ResnetBlock, hy.HunyuanVideo15Upsample, hy.HunyuanVideo15RMS_norm,
    nn.SiLU, nn.Dropout, nn.Identity, nn.ModuleList, nn.Sequential,
)  # fmt: skip
EDGES = {"zeros": "zeros", "constant": "zeros", "replicate": "replicate"}  # a layer's pad mode → halo edge


def _row_padding(module: nn.Module):
    """(padding attribute, its value without row padding, rows above, rows below, pad mode, the nn.ConvNd that
    runs) of a convolution, or None for another layer."""
    if isinstance(module, wan.WanCausalConv3d):  # pads itself with F.pad (W, W, H, H, T, 0), zeros
        p = module._padding
        return "_padding", (*p[:2], 0, 0, *p[4:]), p[2], p[3], "zeros", module
    if isinstance(module, hy.HunyuanVideo15CausalConv3d):  # the same layout, in its pad_mode
        p = module.time_causal_padding
        return "time_causal_padding", (*p[:2], 0, 0, *p[4:]), p[2], p[3], module.pad_mode, module.conv
    if isinstance(module, nn.Conv2d | nn.Conv3d):
        # `padding` reaches the kernel in zeros mode only (other modes pad from a copy taken at init)
        p, i = module.padding, len(module.padding) - 2
        mode = module.padding_mode if module.padding_mode == "zeros" else None
        return "padding", (*p[:i], 0, *p[i + 1 :]), p[i], p[i], mode, module
    return None


def _halo_hook(bands: RowBands, before: int, after: int, edge: str):
    def hook(module, args):
        x, *rest = args
        cache = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
        if cache is None:
            return (bands.exchange(x, ROWS, before, after, edge), *rest)
        # Wan's causal conv prepends the frames it cached from the last chunk: one exchange serves both
        t = cache.shape[2]
        both = bands.exchange(torch.cat([cache.to(x.device), x], 2), ROWS, before, after, edge)
        return (both[:, :, t:], both[:, :, :t], *rest[1:])

    return hook


def _gather_hooks(bands: RowBands):
    sizes = []

    def before(module, args):
        whole, at = bands.all_gather(args[0], ROWS)
        sizes.append(at)
        return (whole, *args[1:])

    def after(module, args, out):
        return bands.own(out, ROWS, sizes.pop())

    return before, after


def _plan(module: nn.Module, bands: RowBands, hooks: list, patches: list) -> None:
    """Collect the hooks and attribute changes that make `module` decode its band."""
    if isinstance(module, GATHERED):
        before, after = _gather_hooks(bands)
        hooks += [(module.register_forward_pre_hook, before), (module.register_forward_hook, after)]
        return
    if (padding := _row_padding(module)) is not None:
        attr, unpadded, top, bottom, mode, conv = padding
        own = top if attr == "padding" else 0  # rows the nn.ConvNd pads itself
        geometry = (conv.stride[ROWS], conv.dilation[ROWS], conv.padding[ROWS], conv.kernel_size[ROWS])
        if geometry != (1, 1, own, top + bottom + 1) or mode not in EDGES:
            raise ValueError(f"banded decode: {type(module).__name__} is not a stride-1 'same' convolution")
        if top + bottom:
            hooks.append((module.register_forward_pre_hook, _halo_hook(bands, top, bottom, EDGES[mode])))
            patches.append((module, attr, unpadded))
        return
    if isinstance(module, wan.WanUpsample) and module.mode in ("nearest", "nearest-exact"):
        return  # an integer factor: row i of the output is row i // factor of the input
    if not isinstance(module, ROW_LOCAL):
        raise ValueError(f"banded decode: {type(module).__name__} is not known to be row-local")
    for child in module.children():
        _plan(child, bands, hooks, patches)


@contextmanager
def banded(vae: nn.Module, bands: RowBands):
    """Within the block `vae.decode` takes this rank's band of the latent rows (`bands`) and returns its band
    of the video; every rank of `bands.group` decodes at the same time. The VAE is restored on exit."""
    if getattr(vae, "use_tiling", False):
        raise ValueError("banded decode splits the frame itself: disable the VAE's tiling")
    hooks, patches = [], []
    for name, child in vae.named_children():
        if name not in ENCODER_PARTS:
            _plan(child, bands, hooks, patches)
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    handles = []
    try:
        for module, attr, value in patches:
            setattr(module, attr, value)
        handles = [register(hook) for register, hook in hooks]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, attr, value in saved:
            setattr(module, attr, value)


@torch.no_grad()
def decode(vae: nn.Module, z: torch.Tensor, group=None, finish=None) -> torch.Tensor | None:
    """`finish(vae.decode(z))` (`[1, C, f, h, w]` → `[1, 3, F, H, W]`), collective over `group` when one is
    given (every rank passes the same z): the video on group rank 0, None on the others. `finish`, elementwise
    (e.g. the uint8 conversion; default none), runs on each band, so the leader gathers its smaller result.
    With fewer latent rows than ranks (a video a few latent rows tall), group rank 0 decodes alone."""
    finish = finish or (lambda video: video)
    if group is None:
        return finish(vae.decode(z, return_dict=False)[0])
    bands = RowBands.split(z.shape[ROWS], group)
    if min(bands.sizes) == 0:
        return finish(vae.decode(z, return_dict=False)[0]) if bands.rank == 0 else None
    with banded(vae, bands):
        band = vae.decode(bands.own(z, ROWS, list(bands.sizes)), return_dict=False)[0]
    return bands.gather(finish(band), ROWS)
