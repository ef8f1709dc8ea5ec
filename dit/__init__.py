"""Video DiT models, weight loading and the sequence-parallel step."""

from dit.families import ModelFamily, register_family
from dit.loading import build_random, load_transformer
from dit.parallelize import parallelize

__all__ = [
    "ModelFamily",
    "build_random",
    "load_transformer",
    "parallelize",
    "register_family",
]
