"""The public sequence-parallel attention: the mesh's degrees pick Ulysses (ring 1), ring (ulysses 1) or
the hybrid (Ulysses all-to-all inside each ulysses group, ring across ring groups over the gathered spans)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.comm import CommConfig, _all_gather_single, all_gather, comm_config
from parallel.mesh import ParallelMesh
from parallel.overlap import overlapped_ulysses
from parallel.ring import ring_attention
from parallel.sharding import SequenceShardInfo, local_info
from parallel.ulysses import head_range, head_splits, joint_attention, ulysses_in, ulysses_out


def _check_local(q, k, v, text, text_mask, causal):
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"q, k, v must share one [B, S_local, H, D] shape, got {[tuple(t.shape) for t in (q, k, v)]}"
        )
    if not (q.is_floating_point() and q.dtype == k.dtype == v.dtype):  # a matmul's error deep inside, or none
        raise ValueError(f"q, k, v must share one floating-point dtype, got {[t.dtype for t in (q, k, v)]}")
    if text is None:
        return
    tq, tk, tv = text
    B, _, H, D = q.shape
    if (
        tk is None
        or tv is None
        or tk.shape != tv.shape
        or tk.dim() != 4
        or tk.shape[0] != B
        or tk.shape[2:] != (H, D)
    ):
        raise ValueError(
            f"text k/v must be [B={B}, T, H={H}, D={D}], got {tk is not None and tuple(tk.shape)}"
        )
    if tq is not None and tq.shape != tk.shape:
        raise ValueError(f"text q must match text k {tuple(tk.shape)}, got {tuple(tq.shape)}")
    if tq is None and causal:
        raise ValueError("causal attention needs text queries too: use text=(tq, tk, tv) or causal=False")
    if text_mask is not None and (text_mask.dtype != torch.bool or text_mask.shape != tk.shape[:2]):
        raise ValueError(
            f"text_mask must be bool [B, T]={tuple(tk.shape[:2])}, "
            f"got {text_mask.dtype} {tuple(text_mask.shape)}"
        )


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # as `_check_across_ranks` codes them


def _check_across_ranks(mesh: ParallelMesh, q, text, causal: bool) -> None:
    """Every rank of this sp group must bring the same shapes, dtype and causal flag (one tiny gloo
    all-gather): a dtype that differs aborted a rank, a causal flag mixed the results without a word."""
    T = -1 if text is None else text[1].shape[1]
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    meta = torch.tensor([*q.shape, T, int(text is not None and text[0] is not None), dtype, int(causal)])
    rows = torch.empty(dist.get_world_size(mesh.control_group) * meta.numel(), dtype=meta.dtype)
    _all_gather_single(
        rows, meta, group=mesh.control_group
    )  # not all_gather(): not counted as attention comm
    rows = rows.view(-1, meta.numel())
    mine = rows[mesh.cfg_rank * mesh.sp_size : (mesh.cfg_rank + 1) * mesh.sp_size]
    if not (mine == meta).all():
        said = [
            [*row[:6], str(_DTYPES[row[6]]) if row[6] >= 0 else "other", bool(row[7])]
            for row in mine.tolist()
        ]
        raise ValueError(
            "shapes, dtypes or causal flags differ across sp ranks "
            f"([B, S_local, H, D, T, has_text_q, dtype, causal] per rank): {said}"
        )


def attention(
    q,
    k,
    v,
    mesh: ParallelMesh,
    *,
    info: SequenceShardInfo | None = None,
    text=None,
    text_mask=None,
    text_first: bool = False,
    comm: str | CommConfig = "alltoall",
    causal: bool = False,
    backend: str = "auto",
):
    """Exact attention of this rank's image shard q/k/v [B, S_local, H, D] over the whole (unpadded) sequence,
    plus optional joint text (tq, tk, tv) [B, T, H, D] replicated on every rank. Returns out, or
    (out, text_out) when text queries are given (text_out [B, T, H, D], identical on every rank). text_mask
    [B, T] bool marks real text keys; text_out at padded positions carries no meaning (zero in a batch)."""
    cfg = comm_config(comm)
    _check_local(q, k, v, text, text_mask, causal)
    info = local_info(q, mesh, info)
    U, H = mesh.ulysses_size, q.shape[2]
    if H < U:
        raise ValueError(f"{H} heads cannot split over ulysses={U}: every rank needs a head (ulysses <= {H})")
    if mesh.validate and mesh.control_group is not None:
        _check_across_ranks(mesh, q, text, causal)

    args = (text_mask, text_first, causal, backend)

    def attend(q, k, v, text):
        if mesh.ring_size == 1:
            return joint_attention(q, k, v, info.span_valid(0), text, *args)
        return ring_attention(q, k, v, info, mesh.ring_group, text, *args)

    if U == 1:
        out, text_out = attend(q, k, v, text)
        return out if text_out is None else (out, text_out)
    chunks = min(cfg.chunks, H // U)  # every rank keeps a head in every chunk
    if chunks > 1:
        out, text_out = overlapped_ulysses(
            q, k, v, text, mesh.ulysses_group, U, mesh.ulysses_rank, cfg, chunks, attend
        )
    else:
        heads = head_range(H, U, mesh.ulysses_rank)
        text = None if text is None else tuple(t if t is None else t[:, :, heads] for t in text)
        out, text_out = attend(*ulysses_in(q, k, v, mesh.ulysses_group, U, mesh.ulysses_rank, cfg), text)
        out = ulysses_out(out, mesh.ulysses_group, U, H, cfg)
    if text_out is not None:
        text_out = _gather_heads(text_out, mesh.ulysses_group, head_splits(H, U))
    return out if text_out is None else (out, text_out)


def _gather_heads(x: torch.Tensor, group, splits: list[int]) -> torch.Tensor:
    """[B, T, h, D] from every rank (rank i holds splits[i] heads) → [B, T, H, D] in head order (= rank
    order). One all-gather; uneven splits travel padded to the largest and are sliced back."""
    pad = max(splits) - x.shape[2]
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, x.shape[3])], 2)
    parts = all_gather(x, group)  # [P, B, T, max, D]
    if len(set(splits)) == 1:
        return parts.permute(1, 2, 0, 3, 4).flatten(2, 3)
    return torch.cat([p[:, :, :n] for p, n in zip(parts, splits, strict=True)], 2)


def cfg_all_gather(x: torch.Tensor, mesh: ParallelMesh) -> torch.Tensor:
    """[cfg_size, *x.shape]: x from every cfg rank, in cfg-rank order (one all-gather)."""
    return x[None] if mesh.cfg_size == 1 else all_gather(x, mesh.cfg_group)
