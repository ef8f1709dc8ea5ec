"""Sequence-parallel attention: process mesh, Ulysses (plain / FP8 / P2P), ring, hybrid, kernels; row bands
with halo exchange (band-parallel convolution). The names below load on first use (`parallel.lazy`)."""

from parallel.lazy import lazy_exports

_MODULES = {
    "parallel.agree": ("failures", "first_failure"),
    "parallel.sequence_attention": ("attention", "cfg_all_gather"),
    "parallel.comm": (
        "COMM_MODES",
        "CommConfig",
        "CommStats",
        "all_reduce_sum",
        "comm_config",
        "comm_modes",
        "count_comm",
        "overlapped",
    ),
    "parallel.halo": ("RowBands", "band_sizes", "exchange_halo", "gather_bands"),
    "parallel.kernels": ("local_attention",),
    "parallel.mesh": ("ParallelMesh", "init_parallel"),
    "parallel.probe": ("ProbeResult", "ProbeRow", "probe_comm"),
    "parallel.sharding": ("SequenceShardInfo", "gather_sequence", "real_tokens", "shard_sequence"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
