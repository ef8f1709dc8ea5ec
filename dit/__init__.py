"""Video DiT models, weight loading and the sequence-parallel step. The names below load on first use
(`parallel.lazy`): the settings, presets and request checks import no torch."""

from parallel.lazy import lazy_exports

_EXPORTS = {
    "ModelFamily": "dit.families",
    "register_family": "dit.families",
    "build_random": "dit.loading",
    "load_transformer": "dit.loading",
    "parallelize": "dit.sequence_parallel",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
