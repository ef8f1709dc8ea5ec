"""One failure, raised alike on every rank: a rank whose own share of the work failed (a band of the video
that overflowed) tells its group, so every rank raises the same error at the same point and none waits in a
collective the failed rank never joins. One small all-reduce a call; the error crosses only when there is
one."""

from __future__ import annotations

import torch
import torch.distributed as dist


def first_failure(error: BaseException | None, group, device: torch.device) -> BaseException | None:
    """On every rank of `group`: the `error` of its lowest rank that had one, None when no rank did.
    `device`: where the backend's tensors live (the data's)."""
    return failures(error, group, device)[0]


def failures(error: BaseException | None, group, device: torch.device) -> tuple[BaseException | None, bool]:
    """`first_failure`, and whether every rank of `group` had an error (each may then raise its own)."""
    world = dist.get_world_size(group)
    # MIN of (rank, failed): the lowest failing rank, and 1 only when every rank failed
    seen = torch.tensor(
        [world if error is None else dist.get_rank(group), int(error is not None)], device=device
    )
    dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=group)
    first, every = int(seen[0]), bool(seen[1])
    if first == world:
        return None, False
    box = [error]
    dist.broadcast_object_list(box, group_src=first, group=group, device=device)
    return box[0], every
