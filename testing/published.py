"""An API app without a worker group that answers as if a worker had loaded a model: the model's limits,
defaults and vocabulary published in the store the way a replica's heartbeat publishes them."""

from __future__ import annotations

import dataclasses

from fastapi import FastAPI

from dit.image import ImageLimits
from dit.pipeline import TINY_LIMITS
from server import limits as server_limits
from server.app import create_app
from server.config import ServeConfig
from server.store import JobStore


def publish(
    store: JobStore,
    model_limits,
    image_limits: ImageLimits | None = None,
    vocabulary: dict | None = None,
    loras: list[dict] | None = None,
    model: str = "tiny-random",
) -> None:
    """A ready replica of `model`'s heartbeat carrying `model_limits` (a pipeline's `limits`) and the LoRA
    catalogue `loras` (None: no --lora-dir)."""
    described = server_limits.describe(model_limits, image_limits)
    info = {"limits": described, "defaults": server_limits.defaults(described), "model": model}
    info |= {"vocabulary": vocabulary, "loras": loras}
    store.heartbeat("test/g/replica0", instance="test", group_id="g", state="ready", info=info)


def published_app(
    tmp_path, model_limits=None, vocabulary: dict | None = None, loras: list[dict] | None = None, **settings
) -> FastAPI:
    """The app on `tmp_path` (tiny-random's settings plus `settings`), with `model_limits` and the LoRA
    catalogue `loras` published (None: as before any worker published)."""
    config = ServeConfig(workers=False, data_dir=str(tmp_path), preset="tiny-random", **settings)
    app = create_app(config)
    if model_limits is not None:
        publish(app.state.services.store, model_limits, config.image_limits, vocabulary, loras)
    return app


# a LoRA catalogue as a worker publishes it (dit.lora_catalogue): one LoRA that fits, a pair that does not
LORA_CATALOGUE = [
    {"name": "style", "experts": False, "fits": True, "error": None},
    {"name": "wan22/pair", "experts": True, "fits": False, "error": "a pair for a two-expert model"},
]
# the random tiny preset's byte tokenizer: a token per byte, so long prompts are cheap to make
TINY_RANDOM_TOKENS = 128


def tiny_random_app(
    tmp_path, vocabulary: dict | None = None, loras: list[dict] | None = None, **settings
) -> FastAPI:
    """`published_app` of the tiny model's limits with the random preset's prompt length."""
    model = dataclasses.replace(TINY_LIMITS, max_prompt_tokens=TINY_RANDOM_TOKENS)
    return published_app(tmp_path, model, vocabulary, loras, **settings)
