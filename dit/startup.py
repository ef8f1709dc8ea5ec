"""One rank's start-up, the same for `ithaca generate`, `parity`'s runs and the server's worker group: the
layout of this torchrun launch (auto degrees resolved for the model), the ranks numbered by node, the mesh,
the pipeline, and with `comm` auto the exchange chosen by measurement on the loaded model (`dit.comm_choice`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import parallel
from dit.settings import PipelineConfig
from dit.shape import launch_layout
from parallel.launch import number_ranks_by_node
from parallel.plan import Choice


@dataclass
class Started:
    mesh: parallel.ParallelMesh
    pipe: Any  # a `dit.pipeline.Pipeline`, or what `load` gave
    choice: Choice  # the layout and why
    probe: parallel.ProbeResult | None  # comm auto: the exchanges timed; else None


def start(
    config: PipelineConfig,
    ulysses=None,
    ring=None,
    cfg=None,
    *,
    node_rank: int = 0,
    load: Callable | None = None,
    allow_lossy_comm: bool = False,
    comm_probe_timeout: float = 60.0,
    report: Callable[[Choice], None] = lambda choice: None,
    video: dict | None = None,
) -> Started:
    """Start this rank: degrees as `parallel.plan.choose` takes them (ints, "auto" or None); `node_rank`: this
    machine's number in a group across machines (rank 0, the replica leader, on node 0); `load(config, mesh)`:
    the pipeline's loader (default `dit.pipeline.load_pipeline`; the server's tests pass a fake's);
    `report(choice)` hears the layout on global rank 0 before the model loads; `video`: the video auto
    degrees are chosen for (`dit.shape.plan_layout`; default: the model's). ValueError: machines that
    disagree (`parallel.launch.number_ranks_by_node`), or settings the loader refuses."""
    choice = launch_layout(
        config.model, ulysses, ring, cfg, sampler=config.sampler, timesteps=config.timesteps, video=video
    )
    layout = choice.layout
    # every machine the same model and layout, each its own node number
    agree = {"model": config.model, "ulysses": layout.ulysses, "ring": layout.ring, "cfg": layout.cfg}
    number_ranks_by_node(node_rank, agree)
    if os.environ.get("RANK", "0") == "0":
        report(choice)
    backend = "gloo" if config.device == "cpu" else None
    mesh = parallel.init_parallel(ulysses=layout.ulysses, ring=layout.ring, cfg=layout.cfg, backend=backend)
    if load is None:
        from dit.pipeline import load_pipeline as load
    auto = config.comm == "auto"  # measured below, once the model is in place
    pipe = load(replace(config, comm="alltoall") if auto else config, mesh)
    probe = pipe.choose_comm(allow_lossy_comm, comm_probe_timeout) if auto else None
    return Started(mesh, pipe, choice, probe)
