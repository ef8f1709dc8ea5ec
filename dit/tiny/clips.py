"""What the tiny model trains on, shared by its training (dit.tiny.train) and its live-preview map
(dit.tiny.preview_map): the training's config, its stable seeds and its rendered clips, each a function of
(seed, index) alone."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from dit.tiny.language import SIZES, Scene, training_scenes
from dit.tiny.render import render

MODEL_DIR = Path(__file__).resolve().parent / "model"  # the shipped weights


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    frames: int = 17
    height: int = 64
    width: int = 64
    max_tokens: int = 16  # the longest caption is 9 tokens with </s>
    # VAE: Wan's compression (×4 time, ×8 space), 16 latent channels, trained on 17-frame clips (on 9, the
    # frames past the ninth drifted in colour)
    vae_base_dim: int = 8
    vae_steps: int = 2400
    vae_batch: int = 4  # 2 rendered small squares as circles even from exact latents (bench: 0–1 of 16)
    vae_frames: int = 17
    vae_lr: float = 1e-3
    encoder_steps: int = 300
    # DiT: 4 heads (Ulysses 2 and 4), dim 128
    heads: int = 4
    head_dim: int = 32
    layers: int = 4
    ffn_dim: int = 512
    text_dim: int = 64
    clips: int = 4000  # rendered once, as latents, for the DiT
    dit_steps: int = 3000
    dit_batch: int = 32
    dit_lr: float = 1e-3
    ema: float = 0.999
    caption_dropout: float = 0.1
    shift: float = 3.0  # training noise levels follow Wan's shifted schedule
    preview_clips: int = 128  # rendered clips the live-preview map is fitted on (dit.tiny.preview_map)


def stable_seed(*keys) -> int:
    """A stable seed from keys (Python's hash() of a string changes with every process)."""
    return int.from_bytes(hashlib.sha256(repr(keys).encode()).digest()[:8], "little") >> 2


def seeded(cfg: TrainConfig, *keys) -> torch.Generator:
    return torch.Generator().manual_seed(stable_seed(cfg.seed, *keys))


def random_scene(rng: random.Random) -> Scene:
    c, s, d = rng.choice(training_scenes()).combo
    return Scene(c, s, d, rng.choice((None, None, *SIZES)))


def clip(cfg: TrainConfig, index: int, frames: int) -> tuple[Scene, torch.Tensor]:
    """Clip number `index` (its scene and pixels depend on nothing else)."""
    rng = random.Random(stable_seed(cfg.seed, "clip", index))
    scene = random_scene(rng)
    return scene, render(scene, frames, cfg.height, cfg.width, seeded(cfg, 1, index))
