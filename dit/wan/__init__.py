"""Wan2.1-architecture DiT; registers the diffusers (`WanTransformer3DModel`) and original (`WanModel`)
checkpoint formats."""

from dit.loading import Family, register_family
from dit.wan.config import WanConfig
from dit.wan.model import FP32_PARAMS, WanModel
from dit.wan.state_dict import export_state_dict, key_map, normalize_key

__all__ = ["WanConfig", "WanModel", "export_state_dict", "resolver"]


def resolver(config: WanConfig, naming: str):
    """Checkpoint key → (our parameter, part, parts); None for keys the reference ignores; KeyError else."""
    table = key_map(config, naming)

    def resolve(key: str):
        key = normalize_key(key, naming)
        return None if key is None else table[key]

    return resolve


def lora_resolver(config: WanConfig):
    """LoRA files name Wan's weights either way, diffusers' or the original's, whatever the checkpoint's:
    LightX2V's LoRAs use the original names on diffusers folders (a name both use is the same weight)."""
    table = {**key_map(config, "original"), **key_map(config, "diffusers")}
    return table.__getitem__


register_family(
    Family(
        "WanTransformer3DModel",
        WanConfig.from_diffusers,
        WanModel,
        lambda c: resolver(c, "diffusers"),
        FP32_PARAMS,
        lora_resolver,
    )
)


def complete_original(config_json: dict, keys: set[str]) -> dict:
    """An original config whose checkpoint has no image embedder (Wan2.2 I2V A14B: `model_type` i2v, like
    Wan2.1 I2V's, but no CLIP image tokens) gains `image_encoder: false`."""
    if config_json.get("model_type") in ("i2v", "flf2v") and not any("img_emb." in k for k in keys):
        return config_json | {"image_encoder": False}
    return config_json


register_family(
    Family(
        "WanModel",
        WanConfig.from_original,
        WanModel,
        lambda c: resolver(c, "original"),
        FP32_PARAMS,
        lora_resolver,
        complete_original,
    )
)

from dit.wan import family  # noqa: E402,F401  (registers the pipeline parts)
