"""dit/flow_schedulers.py against diffusers' own schedulers, step by step on random tensors: the same
timesteps and sigmas, every step's sample within float32 rounding, for each config real folders use
(Wan2.1's published UniPC, solver orders 1–3, bh1, HunyuanVideo-1.5's flow-match Euler, fixed schedules,
renoise); a checkpoint of diffusers' UniPC history resumes ours; sampling set-up imports no diffusers."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dit.denoise_state import capture, restore
from dit.presets import SHIPPED
from dit.sampling import FixedSchedule, make_scheduler

# Wan2.1-T2V-*-Diffusers/scheduler/scheduler_config.json (the shipped tiny folder's is written from it)
WAN21 = json.loads((SHIPPED["tiny"] / "scheduler" / "scheduler_config.json").read_text())
SHAPE = (1, 4, 3, 4, 4)  # a latent video's [B, C, F, H, W]

# (sampler, flow shift, config overrides or None for the sampler's default config, steps, unshifted sigmas)
CASES = {
    "wan21-unipc": ("unipc", 3.0, {}, 8, None),
    "unipc-order-1": ("unipc", 3.0, {"solver_order": 1}, 6, None),
    "unipc-order-3": ("unipc", 5.0, {"solver_order": 3}, 10, None),
    "unipc-bh1-sigma-min": ("unipc", 3.0, {"solver_type": "bh1", "final_sigmas_type": "sigma_min"}, 7, None),
    "unipc-no-corrector-order-1": (
        "unipc", 3.0, {"solver_order": 1, "lower_order_final": False, "disable_corrector": [0, 2]}, 5, None,
    ),
    "unipc-shift-12-90-steps": ("unipc", 12.0, {}, 90, None),  # integer timesteps 999, 999: by position
    "unipc-default": ("unipc", 3.0, None, 6, None),
    "hunyuan-euler": ("euler", 5.0, {}, 8, np.linspace(1.0, 0.0, 9)[:-1].tolist()),
    "euler-steps": ("euler", 7.0, {}, 6, None),
    "euler-lightx2v": ("euler", 5.0, None, 4, FixedSchedule((1000, 750, 500, 250)).sigmas),
    "renoise-lightx2v": ("renoise", 5.0, None, 4, FixedSchedule((1000, 750, 500, 250)).sigmas),
    "renoise-steps": ("renoise", 3.0, {}, 5, None),
}  # fmt: skip


def _pair(sampler: str, shift: float, overrides: dict | None):
    """(ours, diffusers') from the same config: Wan2.1's UniPC or HunyuanVideo-1.5's published flow-match
    Euler (diffusers' full key set, shift 5) with `overrides`; None: the sampler's default config."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    cls = UniPCMultistepScheduler if sampler == "unipc" else FlowMatchEulerDiscreteScheduler
    hunyuan = {k: v for k, v in FlowMatchEulerDiscreteScheduler(shift=5.0).config.items() if k[0] != "_"}
    published = WAN21 if sampler == "unipc" else hunyuan
    config = None if overrides is None else {**published, **overrides}
    ours = make_scheduler(sampler, shift, config)
    key = "flow_shift" if sampler == "unipc" else "shift"
    base = {"prediction_type": "flow_prediction", "use_flow_sigmas": True} if sampler == "unipc" else {}
    renoise = {"stochastic_sampling": sampler == "renoise"} if sampler != "unipc" else {}
    theirs = cls.from_config({**(base if config is None else config), key: shift, **renoise})
    return ours, theirs


def _set(scheduler, steps: int, sigmas) -> None:
    if sigmas is None:
        scheduler.set_timesteps(steps)
    else:
        scheduler.set_timesteps(sigmas=sigmas)


def _start(case: str):
    sampler, shift, overrides, steps, sigmas = CASES[case]
    ours, theirs = _pair(sampler, shift, overrides)
    _set(ours, steps, sigmas)
    _set(theirs, steps, sigmas)
    theirs.set_begin_index(0)  # as diffusers' pipelines do
    return ours, theirs


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("case", CASES)
def test_every_step_is_diffusers(case):
    ours, theirs = _start(case)
    assert torch.equal(ours.timesteps, theirs.timesteps) and ours.timesteps.dtype == theirs.timesteps.dtype
    assert torch.equal(ours.sigmas, theirs.sigmas) and ours.sigmas.dtype == theirs.sigmas.dtype
    torch.manual_seed(0)
    x = y = torch.randn(SHAPE)
    gen_ours, gen_theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for i, t in enumerate(theirs.timesteps):
        v = torch.randn(SHAPE)
        x = ours.step(v, x, gen_ours)
        noise = {"generator": gen_theirs} if "renoise" in case else {}
        y = theirs.step(v, t, y, return_dict=False, **noise)[0]
        assert x.dtype == y.dtype and torch.isfinite(x).all()
        assert _rel(x, y) <= 1e-6, (case, i, _rel(x, y))


def test_a_checkpoint_of_diffusers_unipc_history_resumes_ours():
    """A checkpoint taken before Ithaca had its own schedulers holds diffusers' attributes; ours resumes."""
    ours, theirs = _start("unipc-order-3")
    x = torch.randn(SHAPE)
    outputs = [torch.randn(SHAPE) for _ in theirs.timesteps]
    for t, v in zip(theirs.timesteps[:4], outputs, strict=False):
        x = theirs.step(v, t, x, return_dict=False)[0]
    held = SimpleNamespace(**{k: v for k, v in vars(theirs).items() if k != "_internal_dict"}, config={})
    state = capture(4, x, held, None, None)
    state.sampler = None  # such a checkpoint kept no sampler (a state's class and config came after it)
    x = restore(state, ours, None, None, "cpu")
    for t, v in zip(theirs.timesteps[4:], outputs[4:], strict=True):
        want = theirs.step(v, t, x, return_dict=False)[0]
        x = ours.step(v, x)
        assert _rel(x, want) <= 1e-6


@pytest.mark.parametrize(
    "sampler, option, value, supported",
    [
        ("unipc", "prediction_type", "epsilon", "'flow_prediction'"),
        ("unipc", "solver_order", 4, "1, 2, 3"),
        ("euler", "use_dynamic_shifting", True, "False"),
    ],
)
def test_an_unsupported_option_value_is_refused_by_name(sampler, option, value, supported):
    config = WAN21 if sampler == "unipc" else {}
    refused = rf"option {option} {value!r} is not supported; supported: {supported}$"
    with pytest.raises(ValueError, match=refused):
        make_scheduler(sampler, 3.0, {**config, option: value})
    with pytest.raises(ValueError, match="solver_type 'bh1' needs final_sigmas_type 'sigma_min'"):
        make_scheduler("unipc", 3.0, {**WAN21, "solver_type": "bh1"})  # diffusers' last step would be NaN


def test_sampling_setup_imports_no_diffusers():
    code = (
        "import sys, torch\n"
        "from dit.presets import SHIPPED\n"
        "from dit.families import model_family, pick_scheduler\n"
        "for sampler in ('unipc', 'euler', 'renoise'):\n"
        "    s = pick_scheduler(model_family(str(SHIPPED['tiny'])), SHIPPED['tiny'], sampler)[2]\n"
        "    s.set_timesteps(4)\n"
        "    s.step(torch.zeros(1, 4, 2, 2, 2), torch.ones(1, 4, 2, 2, 2), torch.Generator())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'diffusers'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
