"""Video DiT models, weight loading and the sequence-parallel step. The names below load on first use
(`parallel.lazy`): the settings, presets and request checks import no torch."""

from parallel.lazy import lazy_exports

_MODULES = {
    "dit.families": ("ModelFamily", "register_family"),
    "dit.loading": ("build_random", "load_transformer"),
    "dit.sequence_parallel": ("parallelize",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
