"""`dit.sampling.denoise` runs from the first sigma to the last at small and large flow shifts and step
counts up to the pipeline's limit, including those where UniPC's integer timesteps repeat (shift 12: 85-100
steps, 20: 51-100). The model below gives the exact velocity of a straight path from `x0` to the noise, so
every flow sampler must land on `x0`; tests/test_pipeline_folder.py compares whole runs with diffusers'
WanPipeline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dit.sampling import SAMPLERS, denoise, make_scheduler
from parallel.mesh import ParallelMesh


class StraightPath(nn.Module):
    """The velocity `noise - x0` of the path `x_σ = (1 - σ)·x0 + σ·noise`, whatever `x` and `t`."""

    def __init__(self, velocity: torch.Tensor):
        super().__init__()
        self.velocity = nn.Parameter(velocity)

    def forward(self, x, t, **text):
        return self.velocity


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("shift", [1.0, 3.0, 12.0, 20.0])
def test_the_run_lands_on_the_path_end(sampler, shift):
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 1, 4, generator=generator)
    model, mesh = StraightPath(noise - x0), ParallelMesh(device=torch.device("cpu"))
    for steps in (1, 2, 3, 50, 51, 85, 92, 100):
        scheduler = make_scheduler(sampler, shift)
        got = denoise(model, noise, cond={}, uncond=None, scheduler=scheduler, steps=steps, guidance=1.0,
                      mesh=mesh)  # fmt: skip
        assert (got - x0).abs().max() <= 1e-5 * x0.abs().max(), (steps, (got - x0).abs().max())
