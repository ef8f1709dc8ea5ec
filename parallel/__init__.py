"""Sequence-parallel attention: process mesh, Ulysses (plain / FP8 / P2P), ring, hybrid, kernels."""

from parallel.attention import attention, cfg_all_gather
from parallel.comm import COMM_MODES, CommConfig, CommStats, count_comm
from parallel.kernels import local_attention
from parallel.mesh import ParallelMesh, init_parallel
from parallel.sharding import SequenceShardInfo, gather_sequence, shard_sequence

__all__ = [
    "COMM_MODES",
    "CommConfig",
    "CommStats",
    "ParallelMesh",
    "SequenceShardInfo",
    "attention",
    "cfg_all_gather",
    "count_comm",
    "gather_sequence",
    "init_parallel",
    "local_attention",
    "shard_sequence",
]
