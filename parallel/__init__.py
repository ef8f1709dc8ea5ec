"""Sequence-parallel attention: process mesh, Ulysses (plain / FP8 / P2P), ring, hybrid, kernels; row bands
with halo exchange (band-parallel convolution)."""

from parallel.agree import first_failure
from parallel.attention import attention, cfg_all_gather
from parallel.comm import (
    COMM_MODES,
    CommConfig,
    CommStats,
    all_reduce_sum,
    comm_config,
    comm_modes,
    count_comm,
    overlapped,
)
from parallel.halo import RowBands, band_sizes, exchange_halo, gather_bands
from parallel.kernels import local_attention
from parallel.mesh import ParallelMesh, init_parallel
from parallel.probe import ProbeResult, ProbeRow, probe_comm
from parallel.sharding import SequenceShardInfo, gather_sequence, real_tokens, shard_sequence

__all__ = [
    "COMM_MODES",
    "CommConfig",
    "CommStats",
    "ParallelMesh",
    "ProbeResult",
    "ProbeRow",
    "RowBands",
    "SequenceShardInfo",
    "all_reduce_sum",
    "attention",
    "band_sizes",
    "cfg_all_gather",
    "comm_config",
    "comm_modes",
    "count_comm",
    "exchange_halo",
    "first_failure",
    "gather_bands",
    "gather_sequence",
    "init_parallel",
    "local_attention",
    "overlapped",
    "probe_comm",
    "real_tokens",
    "shard_sequence",
]
