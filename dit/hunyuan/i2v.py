"""HunyuanVideo-1.5 image-to-video (diffusers' `HunyuanVideo15ImageToVideoPipeline`): the same transformer
as text-to-video, given the first frame's VAE latents and a mask (1 on the first latent frame) where
text-to-video passes zeros, and the image's SigLIP features as `image_embeds`.

The transformer's config does not say which task it was trained for, so the folder does: its
`model_index.json` names the image-to-video pipeline, or it has an `image_encoder/`. The replica leader
builds the conditioning from the request's image (`Pipeline.image_condition`) and it travels to the other
ranks with the text conditioning.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dit.first_frame import ImageEncoder, image_processor, pixels
from dit.hunyuan import vae

PIPELINE_CLASS_NAME = "HunyuanVideo15ImageToVideoPipeline"
PRESETS = ("tiny-joint-i2v",)  # the presets that are image-to-video


def is_i2v(folder: Path | None, model: str) -> bool:
    """Whether the folder (or, without one, the preset `model`) is image-to-video."""
    if folder is None:
        return model in PRESETS
    index = folder / "model_index.json"
    name = json.loads(index.read_text()).get("_class_name") if index.is_file() else None
    return name == PIPELINE_CLASS_NAME or (folder / "image_encoder").is_dir()


def load_image_encoder(folder: Path | None, model: nn.Module, dtype, device) -> ImageEncoder | None:
    """An image-to-video model's SigLIP encoder: the folder's `image_encoder/` + `feature_extractor/`, or a
    tiny random one of the transformer's `image_embed_dim` for a preset; None for text-to-video."""
    if not getattr(model, "takes_image", False):
        return None
    from transformers import SiglipVisionModel

    processor_class = image_processor("SiglipImageProcessor")
    if folder is not None:
        encoder = SiglipVisionModel.from_pretrained(folder / "image_encoder", dtype=dtype)
        processor = processor_class.from_pretrained(folder / "feature_extractor")
    else:
        encoder = tiny_image_encoder(model.transformer.config.image_embed_dim)
        processor = processor_class(size={"height": 32, "width": 32})
    # the reference's `_get_image_embeds`: the image cropped to the video, resized by the processor, the last
    # hidden states
    model = encoder.to(device, dtype).eval()
    return ImageEncoder(processor, model, fitted=True, do_resize=True, do_convert_rgb=True)


def tiny_image_encoder(hidden: int, seed: int = 0):
    """A SigLIP vision tower of `hidden` features on 32-pixel images (4 tokens), random weights from
    `seed`."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                                num_attention_heads=2, image_size=32, patch_size=16)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SiglipVisionModel(config).eval()


def latent_condition(vae_model, image: np.ndarray, num_frames: int) -> torch.Tensor:
    """The conditioning `[1, C + 1, f, h, w]` of an image already at the video's size (uint8 [H, W, 3]), as
    the reference's `prepare_cond_latents_and_mask`: the image's latents in the first latent frame and zeros
    after, then the mask of that frame."""
    first = vae.encode(vae_model, pixels(image))
    frames = (num_frames - 1) // vae.COMPRESSION[0] + 1
    latents = F.pad(first, (0, 0, 0, 0, 0, frames - 1))
    mask = torch.zeros_like(latents[:, :1])
    mask[:, :, 0] = 1
    return torch.cat([latents, mask], dim=1)


def closest_size(height: int, width: int, target: int) -> tuple[int, int]:
    """Of the video sizes of about target² pixels (multiples of the VAE's 16, aspect ratios up to 4), the
    one whose aspect ratio is closest to height:width: diffusers' `calculate_default_height_width`, which
    sizes the reference's videos (text-to-video's default from 9:16, image-to-video's from the image)."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=vae.COMPRESSION[1])
    height, width = processor.calculate_default_height_width(height, width, target)
    return height, width
