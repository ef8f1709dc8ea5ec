"""Process mesh layout, control group, cfg all-gather and sequence sharding (gloo, 4 ranks, one call)."""

import pytest
import torch

from tests.distributed import COLLECTIVE_TIMEOUT_S, run_distributed


def _mesh_facts():
    import torch.distributed as dist

    import parallel

    facts = {}
    for degrees in (
        dict(ulysses=2, cfg=2),
        dict(ulysses=2, ring=2),
        dict(ulysses=2),
        dict(ulysses=1, ring=2),
    ):
        m = parallel.init_parallel(**degrees)
        got = parallel.cfg_all_gather(torch.tensor([float(m.rank)]), m)
        obj = m.broadcast_object({"leader": m.rank} if m.is_replica_leader else None)
        m.barrier()
        facts[str(degrees)] = dict(
            u=(m.ulysses_size, m.ulysses_rank),
            r=(m.ring_size, m.ring_rank),
            c=(m.cfg_size, m.cfg_rank),
            dp=(m.dp_size, m.dp_rank),
            sp=(m.sp_size, m.sp_rank),
            leader=m.replica_leader,
            cfg_gather=got.flatten().tolist(),
            broadcast=obj,
            replica=dist.get_process_group_ranks(m.replica_group),  # the VAE decodes across it
            # ITHACA_DIST_TIMEOUT (tests.distributed's 15 s) bounds every group's collectives: torch gives a
            # new group 30 minutes, so a rank stuck before an all-to-all held the others that long
            timeouts={
                g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                for g in (m.ulysses_group, m.ring_group, m.sp_group, m.cfg_group, m.control_group)
                if g is not None
            },
        )
    x = torch.arange(2 * 11 * 3, dtype=torch.float32).view(2, 11, 3)
    for layout in ("contiguous", "zigzag"):
        m = parallel.init_parallel(ulysses=2, ring=2)
        local, info = parallel.shard_sequence(x, m, layout=layout)
        facts[layout] = (
            tuple(local.shape),
            info.padded_len,
            torch.equal(parallel.gather_sequence(local, m, info), x),
        )
    return facts


def test_mesh_layout_groups_and_sharding():
    results = run_distributed(4, _mesh_facts)
    for rank, f in enumerate(results):
        cfg = f["{'ulysses': 2, 'cfg': 2}"]
        assert cfg["u"] == (2, rank % 2) and cfg["c"] == (2, rank // 2) and cfg["dp"] == (1, 0)
        assert cfg["cfg_gather"] == [rank % 2, rank % 2 + 2] and cfg["broadcast"] == {"leader": 0}
        assert cfg["replica"] == [0, 1, 2, 3]  # both CFG halves: they hold the same final latents
        assert all(d["timeouts"] == {COLLECTIVE_TIMEOUT_S} for d in f.values() if isinstance(d, dict))
        hyb = f["{'ulysses': 2, 'ring': 2}"]
        assert hyb["r"] == (2, rank // 2) and hyb["sp"] == (4, rank) and hyb["cfg_gather"] == [rank]
        dp = f["{'ulysses': 2}"]  # two data-parallel replicas of 2 ranks, each with its own leader
        assert dp["dp"] == (2, rank // 2) and dp["leader"] == 2 * (rank // 2)
        assert dp["broadcast"] == {"leader": 2 * (rank // 2)}
        assert dp["replica"] == [2 * (rank // 2), 2 * (rank // 2) + 1]
        ring = f["{'ulysses': 1, 'ring': 2}"]
        assert ring["r"] == (2, rank % 2) and ring["dp"] == (2, rank // 2)
        assert f["contiguous"] == ((2, 3, 3), 12, True)
        assert f["zigzag"] == ((2, 4, 3), 16, True)


def test_world_one_mesh_and_bad_degrees():
    import parallel

    m = parallel.init_parallel()
    assert (m.world_size, m.sp_size, m.is_replica_leader) == (1, 1, True)
    assert m.broadcast_object("x") == "x" and parallel.cfg_all_gather(torch.ones(2), m).shape == (1, 2)
    with pytest.raises(ValueError, match="valid ulysses x ring x cfg for world size 1: 1x1x1"):
        parallel.init_parallel(ulysses=2)


def test_one_rank_meets_no_store():
    """A one-rank group (`serve --nproc 1`) makes its process group on an in-memory store: under torchrun
    the rank would be a client of the launcher's store (under parallel.local_group, rank 0 would serve one),
    but nothing listens at MASTER_ADDR:MASTER_PORT here, and it starts all the same, without a connection
    whose client would look up a loopback name."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    # torchrun's environment for one rank: a client of the launcher's store (TORCHELASTIC_USE_AGENT_STORE)
    env = os.environ | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ITHACA_DIST_TIMEOUT": "20",
                        "TORCHELASTIC_USE_AGENT_STORE": "True"}  # fmt: skip
    code = "from parallel import init_parallel; m = init_parallel(); print(m.world_size, m.ulysses_size)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["1", "1"], done.stderr[-2000:]
