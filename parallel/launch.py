"""Launch helpers: run a function on N local CPU processes joined like torchrun would (gloo), without
torchrun; number the ranks of a torchrun launch across machines by the operator's node numbers, checking
that the machines give distinct numbers and the same settings."""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta

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


def forked_context():
    """Forkserver, torch preloaded: a fresh single-threaded process that imported torch (safe to fork;
    nothing in it touched a device or started a thread) instead of a spawn per rank, whose `import torch`
    cost 2.3 s of CPU each (the tests' gloo pools: 67 s spawned, 26 s forked; tests/distributed.py)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def spawn_local(fn, nproc: int, *args) -> None:
    """fn(*args) on nproc processes (`forked_context`) with torchrun's env set; fn calls
    parallel.init_parallel()."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forked_context()
    mp.start_processes(_entry, args=(nproc, port, fn, args), nprocs=nproc, start_method="forkserver")


def check_node_rank(node_rank: int, environ=os.environ) -> int:
    """The number of machines of this torchrun group (1 without torchrun, or on one machine); ValueError for
    a node rank that numbers none of them, which on one machine would be ignored without a word."""
    nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
    if nodes == 1 and node_rank != 0:
        raise ValueError(
            f"--node-rank {node_rank}: this run is one machine (node 0); --node-rank numbers the machines "
            "of a run across machines, under torchrun --nnodes 2 or more"
        )
    if not 0 <= node_rank < nodes:
        raise ValueError(f"--node-rank {node_rank} is not one of the {nodes} machines, 0 to {nodes - 1}")
    return nodes


def number_ranks_by_node(
    node_rank: int, agree: dict | None = None, environ=os.environ, timeout: float = 300.0
) -> None:
    """Under torchrun across machines, make this process's rank `node_rank * LOCAL_WORLD_SIZE + LOCAL_RANK`.

    torchrun's c10d rendezvous numbers the machines in an order of its own (by their addresses), so global
    rank 0 may land on any of them; the operator's node numbers (node 0: the one that must hold rank 0) are
    the only stable order. Each machine's ranks stay one contiguous block, as torchrun gives them, so groups
    of contiguous ranks (a Ulysses group) still stay inside a machine; only the blocks' order changes, the
    same way on every machine. Call before the process group is initialised (it reads RANK).

    Every rank first tells the others, through torchrun's store, its node number and `agree` (settings
    every machine must share, e.g. the degrees), and reads theirs: a node number given to two machines, or
    settings that differ, raise the same ValueError on every rank within moments (the group would otherwise
    hang until a timeout), as do machines running different numbers of ranks or a node number out of range.
    One machine: nothing to do.
    """
    nodes = check_node_rank(node_rank, environ)
    if nodes == 1 or "LOCAL_RANK" not in environ:
        return
    local, world = int(environ["LOCAL_WORLD_SIZE"]), int(environ["WORLD_SIZE"])
    if local * nodes != world:
        raise ValueError(
            f"the {nodes} machines of the group run different numbers of ranks ({world} in all, {local} "
            "here): give every machine the same --nproc"
        )
    _check_nodes(node_rank, agree or {}, environ, timeout)
    rank = str(node_rank * local + int(environ["LOCAL_RANK"]))
    environ.update(RANK=rank, GROUP_RANK=str(node_rank), ROLE_RANK=rank)


def _check_nodes(node_rank: int, agree: dict, environ, timeout: float) -> None:
    """Exchange (node number, `agree`, host name) with every rank through torchrun's store; ValueError when
    two machines give the same node number or any setting differs."""
    store = torch.distributed.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False,
                                       timeout=timedelta(seconds=timeout))  # fmt: skip
    prefix = f"ithaca/nodes/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"  # one launch of the group
    mine = {"node": node_rank, "machine": int(environ["GROUP_RANK"]), "host": socket.gethostname(), **agree}
    store.set(prefix + environ["RANK"], json.dumps(mine))
    keys = [prefix + str(r) for r in range(int(environ["WORLD_SIZE"]))]
    store.wait(keys)
    told = [json.loads(v) for v in store.multi_get(keys)]
    machines: dict[int, set] = {}  # node number → torchrun's numbers of the machines that gave it
    for t in told:
        machines.setdefault(t["node"], set()).add(t["machine"])
    for node, given in sorted(machines.items()):
        if len(given) > 1:
            hosts = ", ".join(sorted({t["host"] for t in told if t["node"] == node}))
            count = int(environ["GROUP_WORLD_SIZE"])
            raise ValueError(
                f"--node-rank {node} is given on {len(given)} machines ({hosts}): give each of the {count} "
                "machines its own number"
            )
    for name, value in agree.items():
        differ = {t["node"]: t.get(name) for t in told if t.get(name) != value}
        if differ:
            other, theirs = next(iter(sorted(differ.items())))
            raise ValueError(
                f"the machines disagree on {name}: {value} on node {node_rank}, {theirs} on node {other}: "
                "give every machine the same settings"
            )
