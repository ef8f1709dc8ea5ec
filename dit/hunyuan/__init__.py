"""HunyuanVideo-1.5 family: joint image+text attention DiT in the diffusers
`HunyuanVideo15Transformer3DModel` weight layout. Importing it registers the family and its presets with
`dit.loading`, so `dit.load_transformer` accepts its folders and preset names."""

from dit.hunyuan.config import DIFFUSERS_CLASS_NAME, PRESETS, HunyuanVideo15Config
from dit.hunyuan.model import HunyuanVideo15Transformer
from dit.hunyuan.parallelize import parallelize_hunyuan
from dit.hunyuan.state_dict import resolve
from dit.hunyuan.t2v import HunyuanI2V, HunyuanT2V
from dit.loading import Family, register_family
from dit.parallelize import register_parallelizer
from dit.presets import register_preset

register_family(
    Family(
        class_name=DIFFUSERS_CLASS_NAME,
        parse_config=HunyuanVideo15Config.from_dict,
        build=HunyuanVideo15Transformer,
        resolver=lambda config: resolve,
    )
)
for _model_class in (HunyuanVideo15Transformer, HunyuanT2V):  # HunyuanI2V is a HunyuanT2V
    register_parallelizer(_model_class, parallelize_hunyuan)
for _name, _config in PRESETS.items():
    register_preset(_name, {"_class_name": DIFFUSERS_CLASS_NAME, **_config.to_dict()})

__all__ = [
    "HunyuanI2V",
    "HunyuanT2V",
    "HunyuanVideo15Config",
    "HunyuanVideo15Transformer",
    "parallelize_hunyuan",
]
