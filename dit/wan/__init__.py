"""Wan2.1 and Wan2.2: the DiT (diffusers' `WanTransformer3DModel` and the original `WanModel` checkpoint
formats), image-to-video, two experts, the VAE and UMT5; importing the package registers its family record
(`dit.wan.family`)."""

from dit.families import register_family
from dit.wan.config import WanConfig
from dit.wan.family import FAMILY
from dit.wan.model import WanModel
from dit.wan.state_dict import export_state_dict, lora_resolver, resolver

__all__ = ["WanConfig", "WanModel", "export_state_dict", "lora_resolver", "resolver"]

register_family(FAMILY)
