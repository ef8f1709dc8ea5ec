"""Wan's video VAE in Ithaca's own code (`WanVAE`, layers in `dit.wan.vae_layers`): diffusers'
`AutoencoderKLWan` config keys, state-dict keys and numbers (float32 rounding apart), loaded from a pipeline
folder's `vae/` or a tiny random one; Wan2.1's layout and Wan2.2's (residual levels on 2×2-patchified pixels).

The VAE is float32 whatever the DiT runs in (as in diffusers' Wan examples), but for the decoder under
`--vae-dtype` (`dit.vae_frames.cast_decoder`): bfloat16 moves some values by several levels
(bench/vae_dtype.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dit.vae_frames import check_vae, decode_frames
from dit.wan.vae_layers import CausalConv3d, Decoder3d, Encoder3d, reset
from dit.weights import checkpoint_files, load_safetensors, materialize

# Wan2.1's VAE compresses time ×4 (frames = 4k+1) and space ×8: the family's default, and diffusers' when a
# VAE config gives no scale factors.
WAN_COMPRESSION = (4, 8)
# Wan2.2's VAE (TI2V-5B): residual blocks on 2×2-patchified pixels (12 channels in and out) and 48 latent
# channels; space ×16 (×8 by the decoder, ×2 by the patches). The published config's layout keys.
WAN22_Z_DIM = 48
WAN22_LAYOUT = dict(is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16)
# Wan2.1's latent statistics: diffusers' defaults for a config without them
WAN21_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
              0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]  # fmt: skip
WAN21_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
             3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]  # fmt: skip


@dataclass
class WanVAEConfig:
    """diffusers' `AutoencoderKLWan` config (its keys and defaults: the published Wan2.1 VAE)."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: list[int] = field(default_factory=lambda: [1, 2, 4, 4])
    num_res_blocks: int = 2
    attn_scales: list[float] = field(default_factory=list)
    temperal_downsample: list[bool] = field(default_factory=lambda: [False, True, True])
    dropout: float = 0.0
    latents_mean: list[float] = field(default_factory=lambda: list(WAN21_MEAN))
    latents_std: list[float] = field(default_factory=lambda: list(WAN21_STD))
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    @classmethod
    def read(cls, path: Path) -> WanVAEConfig:
        """A `config.json` (diffusers' extra keys, like `_class_name`, ignored)."""
        data = json.loads(Path(path).read_text())
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


class WanVAE(nn.Module):
    """`encode`: video `[B, in_channels / patch², F, H, W]` in [-1, 1] → its latents' mean (the mode of the
    diagonal Gaussian; the log-variance is never needed); `decode`: latents → video clamped to [-1, 1]."""

    def __init__(self, config: WanVAEConfig):
        super().__init__()
        c = self.config = config
        self.encoder = Encoder3d(c.in_channels, c.base_dim, c.z_dim * 2, c.dim_mult, c.num_res_blocks,
                                 c.attn_scales, c.temperal_downsample, c.dropout, c.is_residual)  # fmt: skip
        self.quant_conv = CausalConv3d(c.z_dim * 2, c.z_dim * 2, 1)
        self.post_quant_conv = CausalConv3d(c.z_dim, c.z_dim, 1)
        self.decoder = Decoder3d(c.decoder_base_dim or c.base_dim, c.z_dim, c.dim_mult, c.num_res_blocks,
                                 c.temperal_downsample[::-1], c.dropout, c.out_channels,
                                 c.is_residual)  # fmt: skip

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Frames 1 + 4k (extra frames dropped) → 1 + k latent frames: the first frame, then 4 at a time."""
        x = patchify(x, self.config.patch_size)
        chunks = [x[:, :, :1]] + [x[:, :, 1 + 4 * i : 5 + 4 * i] for i in range((x.shape[2] - 1) // 4)]
        reset(self.encoder)
        out = torch.cat([self.encoder(chunk) for chunk in chunks], 2)
        reset(self.encoder)
        return self.quant_conv(out)[:, : self.config.z_dim]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.cat(list(self.decode_chunks(z)), 2)

    def decode_chunks(self, z: torch.Tensor) -> Iterator[torch.Tensor]:
        """The video of one latent frame at a time (the first → 1 frame, each next → 4), as each is decoded:
        a writer can take the first frames while the decoder makes the next."""
        x = self.post_quant_conv(z)
        reset(self.decoder)
        for i in range(x.shape[2]):
            out = self.decoder(x[:, :, i : i + 1], first_chunk=i == 0)
            yield unpatchify(out, self.config.patch_size).clamp(-1.0, 1.0)
        reset(self.decoder)


def patchify(x: torch.Tensor, p: int | None) -> torch.Tensor:
    """`[B, C, F, H, W]` → `[B, C·p·p, F, H/p, W/p]`, channels ordered (C, column in patch, row in patch)."""
    if not p or p == 1:
        return x
    b, c, f, h, w = x.shape
    x = x.view(b, c, f, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * p * p, f, h // p, w // p)


def unpatchify(x: torch.Tensor, p: int | None) -> torch.Tensor:
    """`patchify` reversed."""
    if not p or p == 1:
        return x
    b, cpp, f, h, w = x.shape
    x = x.view(b, cpp // (p * p), p, p, f, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cpp // (p * p), f, h * p, w * p)


def tiny_config(z_dim: int) -> WanVAEConfig:
    """Wan's VAE layout and compression with a few channels: Wan2.2's for its 48 latent channels, Wan2.1's
    (time ×4, space ×8) otherwise."""
    layout = WAN22_LAYOUT if z_dim == WAN22_Z_DIM else {}
    return WanVAEConfig(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim, **layout)  # fmt: skip


def tiny_vae(z_dim: int, *, seed: int = 0) -> WanVAE:
    """`tiny_config`'s VAE, random weights from a fixed seed (the same as diffusers' class draws)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanVAE(tiny_config(z_dim)).eval()


def read_vae(folder: str | Path, device: torch.device | str = "cpu") -> WanVAE:
    """A VAE folder (`config.json` and safetensors), built on the meta device and filled in place."""
    with torch.device("meta"):
        vae = WanVAE(WanVAEConfig.read(Path(folder) / "config.json"))
    materialize(vae, dtype=torch.float32, device=device)
    return load_safetensors(vae, checkpoint_files(folder), lambda key: (key, 0, 1)).eval()


def save_vae(vae: WanVAE, folder: str | Path) -> None:
    """`folder`/config.json and diffusion_pytorch_model.safetensors, as diffusers' `save_pretrained` lays
    them out (its `from_pretrained` loads them)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"_class_name": "AutoencoderKLWan", **asdict(vae.config)}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in vae.state_dict().items()}
    save_file(tensors, folder / "diffusion_pytorch_model.safetensors", metadata={"format": "pt"})


def compression(folder: str | Path | None, z_dim: int) -> tuple[int, int]:
    """The (time, space) compression of the VAE `load_vae` gives, known before it loads (it sizes the
    latents on every rank): the scale factors of the folder's `vae/config.json`, else the tiny VAE's."""
    if folder is not None and (Path(folder) / "vae").is_dir():
        config = json.loads((Path(folder) / "vae" / "config.json").read_text())
    else:
        config = WAN22_LAYOUT if z_dim == WAN22_Z_DIM else {}
    time, space = WAN_COMPRESSION
    return config.get("scale_factor_temporal", time), config.get("scale_factor_spatial", space)


def load_vae(folder: str | Path | None, *, z_dim: int, device: torch.device | str) -> WanVAE:
    """`folder/vae` when present, otherwise the tiny VAE with the DiT's latent channels; ValueError unless its
    layers compress as its config's scale factors say (`compression`)."""
    if folder is not None and (Path(folder) / "vae").is_dir():
        vae = read_vae(Path(folder) / "vae", device)
    else:
        vae = tiny_vae(z_dim).to(device)
    cfg = vae.config
    found = (2 ** sum(cfg.temperal_downsample), 2 ** (len(cfg.dim_mult) - 1) * (cfg.patch_size or 1))
    return check_vae(vae, cfg.z_dim, z_dim, found, compression(folder, z_dim))


def _statistics(vae: WanVAE) -> tuple[torch.Tensor, torch.Tensor]:
    """The latents' per-channel mean and std, to broadcast over `[1, C, f, h, w]`, on the VAE's device."""
    device = next(vae.parameters()).device
    cfg = vae.config
    return tuple(torch.tensor(v, dtype=torch.float32, device=device).view(1, -1, 1, 1, 1)
                 for v in (cfg.latents_mean, cfg.latents_std))  # fmt: skip


@torch.no_grad()
def decode(vae: WanVAE, latents: torch.Tensor, group=None, on_frames=None, go_on=None) -> np.ndarray | None:
    """Latents `[1, C, f, h, w]` (the DiT's normalised space) → uint8 frames `[F, H, W, 3]`. With a group,
    every rank of it decodes a band of rows (`dit.vae_frames.decode_frames`); `on_frames` gets each latent
    frame's frames as they are decoded (where the frames go), and `go_on` may stop the decode at each."""
    mean, std = _statistics(vae)
    return decode_frames(vae, latents.to(mean.device, torch.float32) * std + mean, group, on_frames, go_on)


@torch.no_grad()
def encode(vae: WanVAE, video: torch.Tensor) -> torch.Tensor:
    """A video `[1, 3, F, H, W]` in [-1, 1] → its latents' mode in the DiT's normalised space (as diffusers'
    Wan image-to-video conditions on the first frame), float32 on the VAE's device."""
    mean, std = _statistics(vae)
    return (vae.encode(video.to(mean.device, torch.float32)) - mean) / std
