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
    world = dist.get_world_size(group)
    first = torch.tensor([world if error is None else dist.get_rank(group)], device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    if int(first) == world:
        return None
    box = [error]
    dist.broadcast_object_list(box, group_src=int(first), group=group, device=device)
    return box[0]
