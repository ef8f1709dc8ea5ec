"""Run a function on N local CPU processes joined like torchrun would (gloo), without torchrun."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _entry(rank: int, world: int, port: int, fn, args) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    fn(*args)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def spawn_local(fn, nproc: int, *args) -> None:
    """fn(*args) on nproc spawned processes with torchrun's env set; fn calls parallel.init_parallel()."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_entry, args=(nproc, port, fn, args), nprocs=nproc)
