"""Band-parallel VAE decode: every rank of a group decodes a band of rows of every frame, and group rank 0
gets the video, equal to the VAE's own `decode` on one rank (same weights; float32 to rounding).

The split is on the latent grid (`parallel.RowBands`), so at every resolution of the decoder (each upsampling
doubles the rows) a band is a whole number of rows. Inside `banded(vae, bands)`:
- every convolution that pads rows (3×3 spatial kernels) takes those rows from the neighbouring bands instead
  and pads only at the image's true top and bottom, as the layer itself does (zeros, or replicate). Its time
  padding and a causal VAE's cache of earlier frames stay as they are: the cached frames carry their halo;
- the attention blocks, which mix the whole frame, all-gather the band, run unchanged and keep this rank's
  rows. They run at the lowest resolution, so the whole frame is small there. A block with a `band_rows`
  attribute is told this rank's rows of the whole frame, `(start, stop)`, and gives back only those (its
  queries for the other rows are the other ranks' work);
- every other decoder layer is row-local (norms over channels, SiLU, nearest upsampling, pixel shuffles, 1×1
  convolutions); a layer class not known to be is refused rather than decoded wrong.

This module knows no family: torch's own layers are known here, and each family's VAE module `register`s its
layer classes (which are row-local, which gathered, how a convolution of its own pads rows) when it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

import torch
from torch import nn

from dit.callbacks import goes_on
from dit.failures import DecodeCancelled, GenerationFailed, alike
from parallel import RowBands

ROWS = -2  # every decoder tensor is [..., H, W]
FRAMES = 2  # and a video [B, C, F, H, W]
ENCODER_PARTS = ("encoder", "quant_conv")  # not run by decode
EDGES = {"zeros": "zeros", "constant": "zeros", "replicate": "replicate"}  # a layer's pad mode → halo edge


class RowPadding(NamedTuple):
    """How a convolution pads rows: its padding attribute, that value without row padding, the rows above and
    below, the pad mode, and the nn.ConvNd that runs."""

    attr: str
    unpadded: tuple
    top: int
    bottom: int
    mode: str | None
    conv: nn.Module


PaddingReader = Callable[[nn.Module], RowPadding]
_ROW_LOCAL: set[type] = {nn.SiLU, nn.Dropout, nn.Identity, nn.ModuleList, nn.Sequential}
_GATHERED: set[type] = set()
_PADDED: dict[type, PaddingReader] = {}


def register(*, row_local=(), gathered=(), padded: dict[type, PaddingReader] | None = None) -> None:
    """A family's VAE layer classes: `row_local` (their children are looked at in turn), `gathered` (blocks
    that run on the whole frame), `padded` (convolutions that pad rows in their own way → their
    `RowPadding`). Registering again is harmless."""
    _ROW_LOCAL.update(row_local)
    _GATHERED.update(gathered)
    _PADDED.update(padded or {})


def _row_padding(module: nn.Module) -> RowPadding | None:
    """A convolution's `RowPadding`, or None for another layer."""
    for cls, read in _PADDED.items():
        if isinstance(module, cls):
            return read(module)
    if isinstance(module, nn.Conv2d | nn.Conv3d):
        # `padding` reaches the kernel in zeros mode only (other modes pad from a copy taken at init)
        p, i = module.padding, len(module.padding) - 2
        mode = module.padding_mode if module.padding_mode == "zeros" else None
        return RowPadding("padding", (*p[:i], 0, *p[i + 1 :]), p[i], p[i], mode, module)
    return None


def _halo_hook(bands: RowBands, before: int, after: int, edge: str):
    def hook(module, args):
        return (bands.exchange(args[0], ROWS, before, after, edge), *args[1:])

    return hook


def _gather_hooks(bands: RowBands):
    sizes = []

    def before(module, args):
        whole, at = bands.all_gather(args[0], ROWS)
        sizes.append(at)
        if hasattr(module, "band_rows"):
            start = sum(at[: bands.rank])
            module.band_rows = (start, start + at[bands.rank])
        return (whole, *args[1:])

    def after(module, args, out):
        at = sizes.pop()
        if hasattr(module, "band_rows"):  # it gave back this rank's rows alone
            module.band_rows = None
            return out
        return bands.own(out, ROWS, at)

    return before, after


def _plan(module: nn.Module, bands: RowBands, hooks: list, patches: list) -> None:
    """Collect the hooks and attribute changes that make `module` decode its band."""
    if isinstance(module, tuple(_GATHERED)):
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
    if isinstance(module, nn.Upsample) and module.mode in ("nearest", "nearest-exact") and _integral(module):
        return  # row i of the output is row i // factor of the input
    if not isinstance(module, tuple(_ROW_LOCAL)):
        raise ValueError(f"banded decode: {type(module).__name__} is not known to be row-local")
    for child in module.children():
        _plan(child, bands, hooks, patches)


def _integral(upsample: nn.Upsample) -> bool:
    factors = upsample.scale_factor if isinstance(upsample.scale_factor, tuple) else [upsample.scale_factor]
    return upsample.size is None and all(float(f).is_integer() for f in factors)


def decoder_parts(vae: nn.Module) -> list[nn.Module]:
    """The VAE's children that `decode` runs (all but `ENCODER_PARTS`)."""
    return [child for name, child in vae.named_children() if name not in ENCODER_PARTS]


@contextmanager
def banded(vae: nn.Module, bands: RowBands):
    """Within the block `vae.decode` takes this rank's band of the latent rows (`bands`) and returns its band
    of the video; every rank of `bands.group` decodes at the same time. The VAE is restored on exit."""
    if getattr(vae, "use_tiling", False):
        raise ValueError("banded decode splits the frame itself: disable the VAE's tiling")
    hooks, patches = [], []
    for child in decoder_parts(vae):
        _plan(child, bands, hooks, patches)
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    handles = []
    try:
        for module, attr, value in patches:
            setattr(module, attr, value)
        handles = [add(hook) for add, hook in hooks]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, attr, value in saved:
            setattr(module, attr, value)


@torch.no_grad()
def decode(
    vae: nn.Module, z: torch.Tensor, group=None, finish=None, on_chunk=None, go_on=None
) -> torch.Tensor | None:
    """`finish(vae.decode(z))` (`[1, C, f, h, w]` → `[1, 3, F, H, W]`), collective over `group` when one is
    given (every rank passes the same z): the video on group rank 0, None on the others. `finish`, elementwise
    (e.g. the uint8 conversion; default none), runs on each band, so the leader gathers its smaller result;
    a GenerationFailed it raises on one rank is raised on every rank.
    With fewer latent rows than ranks (a video a few latent rows tall), group rank 0 decodes alone.
    `on_chunk` (group rank 0) gets the video's frames as they are decoded: a VAE with `decode_chunks` gives
    them a chunk at a time (each gathered as it comes), another all at once. `go_on(decoded, frames)`
    (group rank 0) is asked as each chunk is decoded, before it is handed on (`decoded` of the `frames`
    latent frames); False stops the decode: DecodeCancelled on every rank, at the same chunk."""
    finish = finish or (lambda video: video)
    frames = z.shape[FRAMES]

    def checked(video: torch.Tensor, decoded: int) -> torch.Tensor:  # group rank 0's chunk
        if go_on is not None and not goes_on(go_on(decoded, frames)):
            raise DecodeCancelled(decoded, frames)
        return finish(video)

    if group is None:
        return _joined(vae, z, checked, on_chunk)
    bands = RowBands.split(z.shape[ROWS], group)
    if min(bands.sizes) == 0:
        return _joined(vae, z, checked, on_chunk) if bands.rank == 0 else None
    own_finish = checked if bands.rank == 0 else lambda band, decoded: finish(band)
    with banded(vae, bands):
        own = bands.own(z, ROWS, list(bands.sizes))

        # a GenerationFailed of one band's `finish`, or the leader's stop, is every rank's before the gather
        def finished(band: torch.Tensor, decoded: int) -> torch.Tensor | None:
            step = partial(own_finish, band, decoded)
            return bands.gather(alike(step, group, band.device, (GenerationFailed, DecodeCancelled)), ROWS)

        return _joined(vae, own, finished, on_chunk)


def _joined(vae: nn.Module, z: torch.Tensor, finish, on_chunk) -> torch.Tensor | None:
    """`finish(chunk, latent frames decoded so far)` of every chunk `vae` decodes `z` into (one latent frame
    each, or the whole video), handed to `on_chunk` and joined in time (None where `finish` gives None: a
    rank that only sent its band)."""
    parts = []
    if hasattr(vae, "decode_chunks"):
        chunks = enumerate(vae.decode_chunks(z), 1)
    else:
        chunks = [(z.shape[FRAMES], _decoded(vae, z))]
    for decoded, chunk in chunks:
        part = finish(chunk, decoded)
        if part is not None:
            if on_chunk is not None:
                on_chunk(part)
            parts.append(part)
    return torch.cat(parts, 2) if parts else None


def _decoded(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    out = vae.decode(z)
    return out if isinstance(out, torch.Tensor) else out.sample  # diffusers' VAEs return a DecoderOutput
