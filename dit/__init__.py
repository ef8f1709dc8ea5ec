"""Video DiT models, weight loading and the sequence-parallel step."""

from dit.loading import Family, build_random, load_transformer, register_family
from dit.parallelize import parallelize, register_parallelizer

__all__ = [
    "Family",
    "build_random",
    "load_transformer",
    "parallelize",
    "register_family",
    "register_parallelizer",
]
