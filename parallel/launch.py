"""Launch helpers: run a function on N local CPU processes joined like torchrun would (gloo), without
torchrun; number the ranks of a torchrun launch across machines by the operator's node numbers."""

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


def number_ranks_by_node(node_rank: int, environ=os.environ) -> None:
    """Under torchrun across machines, make this process's rank `node_rank * LOCAL_WORLD_SIZE + LOCAL_RANK`.

    torchrun's c10d rendezvous numbers the machines in an order of its own (by their addresses), so global
    rank 0 may land on any of them; the operator's node numbers (node 0: the one that must hold rank 0) are
    the only stable order. Each machine's ranks stay one contiguous block, as torchrun gives them, so groups
    of contiguous ranks (a Ulysses group) still stay inside a machine; only the blocks' order changes, the
    same way on every machine. Call before the process group is initialised (it reads RANK). ValueError when
    the machines run different numbers of ranks or `node_rank` is out of range. One machine: nothing to do.
    """
    nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
    if nodes == 1 or "LOCAL_RANK" not in environ:
        return
    local, world = int(environ["LOCAL_WORLD_SIZE"]), int(environ["WORLD_SIZE"])
    if local * nodes != world:
        raise ValueError(
            f"the {nodes} machines of the group run different numbers of ranks ({world} in all, {local} "
            "here): give every machine the same --nproc"
        )
    if not 0 <= node_rank < nodes:
        raise ValueError(f"node rank {node_rank} is not one of the {nodes} machines, 0 to {nodes - 1}")
    rank = str(node_rank * local + int(environ["LOCAL_RANK"]))
    environ.update(RANK=rank, GROUP_RANK=str(node_rank), ROLE_RANK=rank)
