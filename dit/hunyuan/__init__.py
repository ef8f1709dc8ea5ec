"""HunyuanVideo-1.5 family: joint image+text attention DiT in the diffusers
`HunyuanVideo15Transformer3DModel` weight layout. Importing it registers its family record
(`dit.hunyuan.family`), so `dit.load_transformer` accepts its folders and preset names."""

from dit.families import register_family
from dit.hunyuan.config import HunyuanVideo15Config
from dit.hunyuan.family import FAMILY
from dit.hunyuan.model import HunyuanVideo15Transformer
from dit.hunyuan.parallelize import parallelize_hunyuan
from dit.hunyuan.t2v import HunyuanI2V, HunyuanT2V

register_family(FAMILY)

__all__ = [
    "HunyuanI2V",
    "HunyuanT2V",
    "HunyuanVideo15Config",
    "HunyuanVideo15Transformer",
    "parallelize_hunyuan",
]
