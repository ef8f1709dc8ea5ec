"""Pick the sequence-parallel exchange by measurement: every mode the caller allows (by default `comm_modes`:
each of `COMM_MODES`, then each overlapped in head chunks) runs the attention call a model issues (public
`parallel.attention` on random q/k/v of the model's shard shape) on every rank of the replica, and the
fastest mode that worked on every rank wins (by a margin: `choose`). All modes compute the same local
attention, so their differences are the exchange and how much of it hides behind the attention.

Measured on the 2-core CPU dev box (gloo, float32, one thread a rank, torch 2.13.0, 2026-11-23; ms per
attention call, the range of two probes): compute dominates and the ranks share two cores, so the order
shifts between probes, which is why a later mode must win by the margin.
    ranks  [B, S_local, H, D]   alltoall   fp8       p2p       p2p+fp8
    2      [1, 40, 4, 32]       2.9-7.3    4.3-8.3   6.8-7.9   8.2-8.4   (trained tiny's default video)
    2      [1, 1024, 8, 64]     109-198    152-210   155-170   200-213
    4      [1, 20, 4, 32]       7.5-9.5    6.3-10.6  10.8-11.3 12.7-19.1
    4      [1, 1024, 8, 64]     405-496    424-537   502-565   445-696

Bounds: the modes run on copies of the mesh's sequence-parallel groups, created with the probe's timeout, so
a collective a peer never joins raises on gloo instead of hanging; and each mode runs in a thread joined with
that timeout, so a rank stuck outside any collective is cut off too (its thread is abandoned). After each mode
every rank shares its (median ms, error) over the gloo control group: the rows, and so the choice, are the
same on every rank, and a mode that failed or timed out anywhere is ruled out everywhere. The next mode after
a failure gets fresh groups (a peer may still be blocked in the old ones). Probe groups are never destroyed:
a group re-created over the same ranks (local synchronisation names it by its ranks) would rendezvous
through the destroyed one's store keys, and gloo then connects to stale addresses.

NCCL: the per-group timeout drives the watchdog, not an exception in the caller. Under the default
TORCH_NCCL_ASYNC_ERROR_HANDLING=3 a collective still pending `timeout_s` after it was issued makes the
watchdog tear the whole process down, so a mode that hangs on NCCL crashes the rank (the server's supervisor
then sees a failed group) rather than being ruled out. With TORCH_NCCL_ASYNC_ERROR_HANDLING=2 the watchdog
aborts only the probe's communicator instead, so the process should live on with the mode ruled out (not
tested here: that needs two GPUs). Modes that raise rather than hang are ruled out on either backend.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from parallel.comm import comm_config, comm_modes
from parallel.mesh import ParallelMesh
from parallel.sequence_attention import attention

_SP_GROUPS = ("ulysses_group", "ring_group", "sp_group")
_MAX_ERROR = 300  # characters of an error kept in a row (gloo's timeout messages run long)


@dataclass(frozen=True)
class ProbeRow:
    mode: str
    ms: float | None  # the slowest rank's median per attention call; None when ruled out
    # why it was ruled out: "rank R: timed out ..." or "rank R: <the error>" for each failing (global) rank
    error: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    shape: tuple[int, ...]  # q/k/v shard shape [B, S_local, H, D] probed
    dtype: str
    rows: tuple[ProbeRow, ...]  # one per mode probed, exact ones first; none when sp size is 1
    chosen: str | None  # see `choose`; None when every mode was ruled out

    def summary(self) -> str:
        """One line for logs: each mode's time or error, then the choice."""
        parts = [f"{r.mode} {r.ms:.2f} ms" if r.error is None else f"{r.mode} ({r.error})" for r in self.rows]
        return f"{', '.join(parts) or 'no all-to-all (ulysses 1)'} -> {self.chosen}"


def is_lossy(mode: str) -> bool:
    cfg = comm_config(mode)
    return cfg.fp8_in or cfg.fp8_out


def probe_comm(
    mesh: ParallelMesh,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    modes: Sequence[str] | None = None,
    *,
    allow_lossy: bool = False,
    iters: int = 5,
    margin: float = 0.05,
    timeout_s: float = 60.0,
    backend: str = "auto",
    device: torch.device | str | None = None,
) -> ProbeResult:
    """Time one attention call of q/k/v shard shape `shape` [B, S_local, H, D] in each of `modes` (default:
    `comm_modes` for its heads; the FP8 ones only when `allow_lossy`, after the exact ones), on every rank
    of `mesh`'s replica together (collective), on `device` (default the mesh's) with attention kernel
    `backend`. Each mode: one untimed call (communicator set-up, the FP8 quantiser's compile on CUDA), then
    `iters` timed calls; its row holds the slowest rank's median. `timeout_s` bounds each mode as a whole,
    first call included, so it must cover iters + 1 calls. The choice follows `choose` with `margin`. Every
    rank returns the same result."""
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    modes = comm_modes(shape[2], mesh.ulysses_size) if modes is None else modes
    for mode in modes:
        comm_config(mode)  # ValueError for an unknown one
    # exact modes first: a lossy one must then beat the best exact one by the margin (`choose`)
    candidates = sorted((m for m in modes if allow_lossy or not is_lossy(m)), key=is_lossy)
    if not candidates:
        raise ValueError(f"no mode of {list(modes)} to probe (the FP8 ones need allow_lossy=True)")
    shape, name = tuple(shape), str(dtype).removeprefix("torch.")
    if mesh.ulysses_size == 1:  # no all-to-all to time: the ring's exchange is its own, whatever the mode
        return ProbeResult(shape, name, (), candidates[0])
    device = torch.device(device) if device is not None else mesh.device
    rows, probe_mesh = [], None
    for mode in candidates:
        if probe_mesh is None:  # first mode, or the last one failed and may have left its groups broken
            probe_mesh = replace(mesh, validate=False, **_timed_groups(mesh, timeout_s))
        run = partial(_time_mode, probe_mesh, shape, dtype, device, mode, iters, backend)
        ms, error = _bounded(run, timeout_s)
        views = [None] * dist.get_world_size(mesh.control_group)
        dist.all_gather_object(views, (ms, error), group=mesh.control_group)
        errors = [
            f"rank {dist.get_global_rank(mesh.control_group, r)}: {e}"
            for r, (_, e) in enumerate(views)
            if e is not None
        ]
        if errors:
            rows.append(ProbeRow(mode, None, "; ".join(errors)))
            probe_mesh = None
        else:
            rows.append(ProbeRow(mode, max(m for m, _ in views)))
    return ProbeResult(shape, name, tuple(rows), choose(rows, margin))


def choose(rows: Sequence[ProbeRow], margin: float) -> str | None:
    """The first working mode, replaced by each later one that is faster than it by more than `margin`
    (relative): a mode within timing noise of an earlier one never wins, so the rows' order is the preference
    (the probe puts exact modes before lossy ones) and repeated probes of a close race keep one answer."""
    best = None
    for row in rows:
        if row.error is None and (best is None or row.ms < best.ms * (1 - margin)):
            best = row
    return None if best is None else best.mode


def _timed_groups(mesh: ParallelMesh, timeout_s: float) -> dict:
    """Fresh groups over the same ranks as the mesh's sequence-parallel ones (one per distinct rank list),
    with the probe's timeout. Local synchronisation: only a group's own ranks create it, so other replicas
    need not take part."""
    backend = mesh.backend or dist.get_backend()
    made, out = {}, {}
    for name in _SP_GROUPS:  # the same order on every rank
        group = getattr(mesh, name)
        if group is None:
            continue
        ranks = tuple(dist.get_process_group_ranks(group))
        if ranks not in made:
            made[ranks] = dist.new_group(
                list(ranks),
                timeout=timedelta(seconds=timeout_s),
                backend=backend,
                use_local_synchronization=True,
            )
        out[name] = made[ranks]
    return out


def _bounded(fn: Callable[[], float], timeout_s: float) -> tuple[float | None, str | None]:
    """(fn(), None), or (None, why) when it raised or ran past timeout_s (its thread is then abandoned)."""
    box: dict = {}

    def run():
        try:
            box["ms"] = fn()
        except Exception as e:  # noqa: BLE001 - any failure rules the mode out
            box["error"] = f"{type(e).__name__}: {e}"[:_MAX_ERROR]

    thread = threading.Thread(target=run, name="comm-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None, f"timed out after {timeout_s:g} s"
    return box.get("ms"), box.get("error")


def _time_mode(mesh, shape, dtype, device, mode: str, iters: int, backend: str) -> float:
    """Median ms of `iters` attention calls after one untimed call (runs in the probe's thread)."""
    cuda = device.type == "cuda"
    if cuda:  # the current device is per thread
        torch.cuda.set_device(device)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device) for _ in range(3))
    times = []
    with torch.inference_mode():
        for _ in range(iters + 1):
            start = time.perf_counter()
            attention(q, k, v, mesh, comm=mode, backend=backend)
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3
