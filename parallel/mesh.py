"""Process mesh: world → data-parallel replicas × cfg × ring × ulysses, with one process group per axis.

Rank layout (ulysses innermost: a Ulysses group is contiguous ranks inside a node; ring strided by ulysses):
    rank = ((dp_rank * cfg + cfg_rank) * ring + ring_rank) * ulysses + ulysses_rank
A gloo control group over each replica always exists, so idle ranks wait on CPU, never inside NCCL.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from parallel.local_group import launched
from parallel.plan import fit_degrees


@dataclass(frozen=True)
class ParallelMesh:
    world_size: int = 1
    rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    ulysses_size: int = 1
    ulysses_rank: int = 0
    ring_size: int = 1
    ring_rank: int = 0
    cfg_size: int = 1
    cfg_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    ulysses_group: object = None
    ring_group: object = None
    sp_group: object = None
    cfg_group: object = None
    control_group: object = None
    replica_group: object = None  # the backend's group over the whole replica (the VAE decodes across it)
    replica_leader: int = 0
    validate: bool = False  # cross-rank shape check before every attention call (one tiny gloo all-gather)

    @property
    def sp_size(self) -> int:
        return self.ring_size * self.ulysses_size

    @property
    def sp_rank(self) -> int:
        return self.ring_rank * self.ulysses_size + self.ulysses_rank

    @property
    def is_replica_leader(self) -> bool:
        return self.rank == self.replica_leader

    def broadcast_object(self, obj=None):
        """obj from the replica leader to every rank of this replica (gloo control group)."""
        if self.control_group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.replica_leader, group=self.control_group)
        return box[0]

    def gather_object(self, obj):
        """Every rank's obj, in rank order, on the replica leader (None on the others; gloo control group)."""
        if self.control_group is None:
            return [obj]
        got = [None] * self.sp_size * self.cfg_size if self.is_replica_leader else None
        dist.gather_object(obj, got, dst=self.replica_leader, group=self.control_group)
        return got

    def barrier(self) -> None:
        if self.control_group is not None:
            dist.barrier(group=self.control_group)

    def close(self) -> None:
        """Ends the process group before the interpreter does: a gloo group left to its exit may abort the
        process ("terminate called without an active exception", signal 6)."""
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _rendezvous(timeout: float) -> dict:
    """`init_process_group`'s store, rank and world size; empty under torchrun (its `env://`)."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", 0))
    if world == 1:  # one rank meets no one: an in-memory store spares a TCP store's client its loopback
        # name lookup (a resolver timeout where no DNS answers; parallel/local_group.py)
        return {"store": dist.HashStore(), "rank": 0, "world_size": 1}
    if "ITHACA_LOCAL_GROUP" not in os.environ:
        return {}
    # parallel.local_group: rank 0 serves the store on the socket the launcher bound, the others connect
    fd = os.environ.get("ITHACA_STORE_FD")
    if fd is not None:
        os.set_inheritable(int(fd), False)  # not the encoder's, nor any other process this rank starts
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = dist.TCPStore(*address, world, is_master=fd is not None, timeout=timedelta(seconds=timeout),
                          master_listen_fd=None if fd is None else int(fd))  # fmt: skip
    return {"store": store, "rank": rank, "world_size": world}


_MESHES: dict[tuple, ParallelMesh] = {}  # groups are collective to create: build each mesh once per process


def dist_timeout(environ=os.environ) -> float:
    """Seconds each collective may take: ITHACA_DIST_TIMEOUT, else 600. ValueError naming the variable for a
    value that is not a number of seconds above 0, which the commands check before any rank starts (read by
    the ranks, "abc" ended them with float()'s message, naming nothing, and -5 with torch's traceback)."""
    text = environ.get("ITHACA_DIST_TIMEOUT", "600")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"ITHACA_DIST_TIMEOUT must be a number of seconds above 0, not {text!r}")
    return seconds


def init_parallel(
    ulysses: int | None = None,
    ring: int = 1,
    cfg: int = 1,
    backend: str | None = None,
    timeout: float | None = None,
) -> ParallelMesh:
    """Build the mesh from the torchrun environment (or reuse the default group); no env → world 1."""
    if not dist.is_initialized() and not launched():
        fit_degrees(1, ulysses, ring, cfg)
        return ParallelMesh(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    # every group's, not the default group's alone: torch gives a new group 30 minutes whatever that has
    timeout = timedelta(seconds=timeout or dist_timeout())
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timeout, **_rendezvous(timeout.total_seconds()))
    backend = backend or dist.get_backend()
    world, rank = dist.get_world_size(), dist.get_rank()
    u, r, c = fit_degrees(world, ulysses, ring, cfg)
    key = (u, r, c, backend, id(dist.group.WORLD))  # a re-initialised default group invalidates the cache
    if key in _MESHES:
        return _MESHES[key]

    replica = u * r * c
    dp_rank, rest = divmod(rank, replica)
    cfg_rank, rest = divmod(rest, r * u)
    ring_rank, ulysses_rank = divmod(rest, u)

    def grid(d, cf, ri, ul):  # global rank of a mesh coordinate
        return ((d * c + cf) * r + ri) * u + ul

    def make(rank_lists, size, be=backend):  # every rank creates every group, in the same order
        mine = None
        for ranks in rank_lists:
            g = dist.new_group(ranks, backend=be, timeout=timeout) if size > 1 else None
            if rank in ranks:
                mine = g
        return mine

    D = world // replica
    ulysses_groups = [
        [grid(d, cf, ri, x) for x in range(u)] for d in range(D) for cf in range(c) for ri in range(r)
    ]
    ring_groups = [
        [grid(d, cf, x, ul) for x in range(r)] for d in range(D) for cf in range(c) for ul in range(u)
    ]
    sp_groups = [[grid(d, cf, 0, 0) + x for x in range(r * u)] for d in range(D) for cf in range(c)]
    cfg_groups = [
        [grid(d, x, ri, ul) for x in range(c)] for d in range(D) for ri in range(r) for ul in range(u)
    ]
    replicas = [list(range(d * replica, (d + 1) * replica)) for d in range(D)]
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if backend == "nccl" else torch.device("cpu")
    groups = dict(  # created in this order on every rank
        ulysses_group=make(ulysses_groups, u),
        ring_group=make(ring_groups, r),
        sp_group=make(sp_groups, r * u),
        cfg_group=make(cfg_groups, c),
        control_group=make(replicas, replica, "gloo") if replica > 1 else None,
    )
    # without CFG the sp group is the replica: no second communicator over the same ranks
    groups["replica_group"] = make(replicas, replica) if c > 1 else groups["sp_group"]
    mesh = ParallelMesh(
        world_size=world,
        rank=rank,
        device=device,
        backend=backend,
        ulysses_size=u,
        ulysses_rank=ulysses_rank,
        ring_size=r,
        ring_rank=ring_rank,
        cfg_size=c,
        cfg_rank=cfg_rank,
        dp_size=D,
        dp_rank=dp_rank,
        **groups,
        replica_leader=dp_rank * replica,
        validate=os.environ.get("ITHACA_VALIDATE", "0") == "1",
    )
    _MESHES[key] = mesh
    return mesh
