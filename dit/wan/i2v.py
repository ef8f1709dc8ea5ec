"""Wan image-to-video (diffusers' `WanImageToVideoPipeline`): the model samples 16 latent channels and sees
36: the noisy latents followed by a conditioning volume, a 4-channel mask of the frames given (the first
frame, spread over the 4 frames of the first latent frame) and the VAE latents of a video that is the image
then black frames. Wan2.1's I2V transformer also attends to the image's CLIP features
(`encoder_hidden_states_image`: the penultimate hidden states of the folder's `image_encoder/`, preprocessed
by its `image_processor/`); Wan2.2 A14B I2V has no image encoder.

The replica leader builds both from the request's image (`Pipeline.image_condition`) and they travel to the
other ranks with the text conditioning, as keyword arguments of `WanI2V`, which concatenates the volume to the
latents.

Wan2.2 TI2V-5B samples as diffusers' `expand_timesteps` pipelines (`dit.first_frame.FirstFrame`): 48 latent
channels in and out, a timestep per token, and an optional image whose latents stand in for the first
latent frame.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dit.first_frame import ImageEncoder, image_processor, pixels
from dit.wan import vae as wan_vae

MASK_CHANNELS = 4  # the VAE's time compression: one mask channel per frame of a latent frame
EXPAND_TIMESTEPS_PRESETS = ("tiny-ti2v-random", "wan2.2-ti2v-5b")  # sampled as `dit.first_frame.FirstFrame`


def is_i2v(cfg) -> bool:
    """Whether a transformer of this parsed config is image-to-video: it takes the mask and the image's
    latents beside the noisy ones."""
    return cfg.in_channels == cfg.out_channels + MASK_CHANNELS + cfg.out_channels


class WanI2V(nn.Module):
    """The transformer as the pipeline samples it: `config.in_channels` is the sampled latents' channels."""

    takes_image = True

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer
        self.config = replace(transformer.config, in_channels=transformer.config.out_channels)

    def forward(self, latents, timestep, encoder_hidden_states, condition, encoder_hidden_states_image=None):
        image = (
            {}
            if encoder_hidden_states_image is None
            else {"encoder_hidden_states_image": encoder_hidden_states_image}
        )
        x = torch.cat([latents, condition.to(latents.dtype)], dim=1)
        return self.transformer(x, timestep, encoder_hidden_states, **image)


def wrap(transformer: nn.Module) -> nn.Module:
    """The Wan family's adapter: image-to-video transformers get `WanI2V`, text-to-video ones none."""
    return WanI2V(transformer) if is_i2v(transformer.config) else transformer


def load_image_encoder(folder: Path | None, model: nn.Module, dtype, device) -> ImageEncoder | None:
    """The folder's CLIP vision encoder when the transformer takes image features (Wan2.1 I2V), a tiny random
    one of its `image_dim` for a preset, None otherwise."""
    image_dim = getattr(getattr(model, "transformer", model).config, "image_dim", None)
    if image_dim is None:
        return None
    from transformers import CLIPVisionModel

    processor_class = image_processor("CLIPImageProcessor")
    if folder is not None and (folder / "image_encoder").is_dir():
        encoder = CLIPVisionModel.from_pretrained(folder / "image_encoder", torch_dtype=dtype)
        processor = processor_class.from_pretrained(folder / "image_processor")
    else:
        encoder, processor = tiny_image_encoder(image_dim), processor_class(crop_size=32, size=32)
    return ImageEncoder(processor, encoder.to(device, dtype).eval(), layer=-2)


def tiny_image_encoder(hidden: int, seed: int = 0):
    """A CLIP vision tower of `hidden` features on 32-pixel images (5 tokens), random weights from `seed`."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=16)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CLIPVisionModel(config).eval()


def latent_condition(vae, image: np.ndarray, num_frames: int) -> torch.Tensor:
    """The conditioning volume `[1, 4 + C, f, h, w]` of an image already at the video's size (uint8
    [H, W, 3]): the mask of the given frame and the latents of the image followed by black frames."""
    t, _ = wan_vae.WAN_COMPRESSION
    first = pixels(image)
    video = torch.cat([first, first.new_zeros(1, 3, num_frames - 1, *first.shape[-2:])], dim=2)
    latents = wan_vae.encode(vae, video)
    f, h, w = latents.shape[-3:]
    mask = torch.zeros(1, 1, (f - 1) * t + t, h, w, device=latents.device)
    mask[:, :, :t] = 1  # the first frame given, repeated over the first latent frame's t frames
    mask = mask.view(1, f, t, h, w).transpose(1, 2)
    return torch.cat([mask, latents], dim=1)


def expand_timesteps(folder: Path | None, model: str) -> bool:
    """Whether the model samples as `FirstFrame`: a folder's `model_index.json` says `expand_timesteps`."""
    if folder is None:
        return model in EXPAND_TIMESTEPS_PRESETS
    index = folder / "model_index.json"
    return index.is_file() and json.loads(index.read_text()).get("expand_timesteps") is True


def frame_latents(vae, image: np.ndarray) -> torch.Tensor:
    """The latents `[1, C, 1, h, w]` of an image at the video's size (uint8 [H, W, 3]) as a one-frame video,
    float32: `FirstFrame`'s `first_frame`."""
    return wan_vae.encode(vae, pixels(image))
