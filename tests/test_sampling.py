"""`dit.sampling.denoise` runs from the first sigma to the last at small and large flow shifts and step
counts up to the pipeline's limit, including those where UniPC's integer timesteps repeat (shift 12: 85-100
steps, 20: 51-100). The model below gives the exact velocity of the straight path from `x0` through the
current latents, so every flow sampler must land on `x0` (renoise too, whatever noise it draws);
tests/test_pipeline_folder.py compares whole runs with diffusers' WanPipeline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dit.sampling import SAMPLERS, denoise, make_scheduler
from parallel.mesh import ParallelMesh


class StraightPath(nn.Module):
    """The velocity `(x - x0) / σ` of the straight path from `x0` through `x`, σ the scheduler's current sigma
    (not t / 1000: UniPC hands the model integer timesteps)."""

    def __init__(self, x0: torch.Tensor, scheduler):
        super().__init__()
        self.x0, self.scheduler = nn.Parameter(x0), scheduler

    def forward(self, x, t, **text):
        return (x - self.x0) / self.scheduler.sigmas[self.scheduler.step_index or 0]


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("shift", [1.0, 3.0, 12.0, 20.0])
def test_the_run_lands_on_the_path_end(sampler, shift):
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 1, 4, generator=generator)
    mesh = ParallelMesh(device=torch.device("cpu"))
    for steps in (1, 2, 3, 50, 51, 85, 92, 100):
        scheduler = make_scheduler(sampler, shift)
        got = denoise(StraightPath(x0, scheduler), noise, cond={}, uncond=None, scheduler=scheduler,
                      steps=steps, guidance=1.0, mesh=mesh)  # fmt: skip
        assert (got - x0).abs().max() <= 1e-5 * x0.abs().max(), (steps, (got - x0).abs().max())
