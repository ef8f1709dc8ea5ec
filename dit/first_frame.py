"""First-frame conditioning every family may use: an image as pixels, a vision tower's features of it
(`ImageEncoder`), and diffusers' `expand_timesteps` sampling, where an image's latents stand in for the first
latent frame (`FirstFrame`: Wan2.2 TI2V-5B). Family-free: the families' image-to-video modules import it."""

from __future__ import annotations

import importlib.util

import numpy as np
import torch
from torch import nn


def pixels(image: np.ndarray) -> torch.Tensor:
    """uint8 `[H, W, 3]` → a one-frame video `[1, 3, 1, H, W]` in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None, :, None].float() / 127.5 - 1


def image_processor(name: str):
    """transformers' image processor class `name` (CLIPImageProcessor), its PIL form where torchvision is
    absent: the one transformers falls back to then (as diffusers' pipelines get it), without the warning
    it prints on every load."""
    import transformers

    return getattr(transformers, name if importlib.util.find_spec("torchvision") else name + "Pil")


class ImageEncoder:
    """A vision tower's features of an image: the hidden states of `layer` (Wan's CLIP: -2, the penultimate,
    as diffusers' `WanImageToVideoPipeline.encode_image`), or the last ones for None (HunyuanVideo-1.5's
    SigLIP); `preprocess`: the processor's options. `fitted`: the tower sees the image fitted to the video
    (HunyuanVideo-1.5's reference crops it first), else the image as given, which its processor resizes
    (Wan's reference)."""

    def __init__(
        self, processor, model: nn.Module, layer: int | None = None, fitted: bool = False, **preprocess
    ):
        self.processor, self.model, self.layer, self.preprocess = processor, model, layer, preprocess
        self.fitted = fitted

    @torch.no_grad()
    def encode(self, image) -> torch.Tensor:
        """`image`: a PIL image or uint8 [H, W, 3]."""
        device = next(self.model.parameters()).device
        # channels last said, not guessed: an image 1 or 3 pixels tall read as channels first
        inputs = self.processor(
            images=image, return_tensors="pt", input_data_format="channels_last", **self.preprocess
        )
        hidden = self.layer is not None
        out = self.model(
            pixel_values=inputs.pixel_values.to(device, self.model.dtype), output_hidden_states=hidden
        )
        return out.hidden_states[self.layer] if hidden else out.last_hidden_state


def with_first_frame(latents: torch.Tensor, first_frame: torch.Tensor) -> torch.Tensor:
    """`latents` with their first latent frame replaced by `first_frame`, in their dtype."""
    return torch.cat([first_frame.to(latents), latents[:, :, 1:]], dim=2)


class FirstFrame(nn.Module):
    """A transformer sampled as diffusers' `expand_timesteps` pipelines (Wan2.2 TI2V-5B). Its timestep is per
    token (all the step's); given `first_frame` (an image's latents), those stand in for the
    first latent frame of every step's input and its tokens see timestep 0 (clean), while the sampler keeps
    stepping its own latents; the pipeline puts the frame into the final latents too. Every rank of a
    replica holds the same latents and frame, so every rank replaces alike."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer, self.config = transformer, transformer.config

    def forward(self, latents, timestep, first_frame=None, **text):
        f, h, w = latents.shape[-3:]
        _, ph, pw = self.config.patch_size
        frames = torch.ones(f, device=latents.device)  # float32, as diffusers' mask
        if first_frame is not None:
            latents = with_first_frame(latents, first_frame)
            frames[0] = 0
        per_token = frames.repeat_interleave((h // ph) * (w // pw))  # tokens run frame by frame
        return self.transformer(latents, timestep[:, None] * per_token, **text)
