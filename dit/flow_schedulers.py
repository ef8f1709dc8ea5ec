"""Flow-matching schedulers, torch only: UniPC multistep (Wan's sampler) and flow-match Euler, plain or
"renoise". Each computes what diffusers' `UniPCMultistepScheduler` / `FlowMatchEulerDiscreteScheduler`
computes, operation for operation (the same float64/float32 schedule arithmetic, the same float32 steps),
for the option values real Wan, HunyuanVideo-1.5 and LightX2V folders use; sampling thus never imports
diffusers (seconds at start-up).

A scheduler is made from a folder's scheduler config (diffusers' keys; unknown keys and options without
effect on flow sampling are ignored, as diffusers ignores them); an option value outside `SUPPORTED` is a
ValueError naming the option and the values supported. Unlike diffusers' schedulers, a run always begins at
the first timestep by position (as diffusers' pipelines set with `set_begin_index(0)`: a large shift with many
steps repeats UniPC's integer timesteps, 999, 999, and a lookup by value would take the second), and `step`
takes no timestep. The state a denoising checkpoint saves (`dit.denoise_state`: every attribute but
`config`) keeps diffusers' attribute names, so a checkpoint taken with diffusers' schedulers resumes here
exactly."""

from __future__ import annotations

import numpy as np
import torch


def _shifted(sigmas, shift: float):
    """The flow shift s → shift·s / (1 + (shift − 1)·s), in the array's own type and dtype."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


class _FlowScheduler:
    DIFFUSERS_CLASS: str  # the diffusers class whose `_class_name` it reads and whose numbers it gives
    SHIFT_KEY: str  # the class's name for the flow shift
    DEFAULTS: dict  # diffusers' defaults of the options that matter here
    SUPPORTED: dict  # option → the values supported (an option not named here takes any value)

    def __init__(self, config: dict):
        self.config = {**self.DEFAULTS, **{k: v for k, v in config.items() if k in self.DEFAULTS}}
        for key, allowed in self.SUPPORTED.items():
            if self.config[key] not in allowed:
                raise ValueError(
                    f"{self.DIFFUSERS_CLASS} option {key} {self.config[key]!r} is not supported; supported: "
                    f"{', '.join(map(repr, allowed))}"
                )

    @property
    def step_index(self) -> int:
        return self._step_index

    def take_rows(self, rows: list[int]) -> None:
        """Keep only these rows of a batch's state (its jobs that go on): none kept here."""


class UniPCFlowScheduler(_FlowScheduler):
    """UniPC multistep (predictor, then corrector at the next step) on flow sigmas, predicting x0 from the
    model's velocity: diffusers' `UniPCMultistepScheduler` with `prediction_type="flow_prediction"` and
    `use_flow_sigmas`."""

    DIFFUSERS_CLASS, SHIFT_KEY = "UniPCMultistepScheduler", "flow_shift"
    DEFAULTS = {
        "num_train_timesteps": 1000, "flow_shift": 1.0, "solver_order": 2, "solver_type": "bh2",
        "lower_order_final": True, "disable_corrector": [], "final_sigmas_type": "zero",
        "prediction_type": "epsilon", "use_flow_sigmas": False, "predict_x0": True, "thresholding": False,
        "solver_p": None, "use_karras_sigmas": False, "use_exponential_sigmas": False,
        "use_beta_sigmas": False, "use_dynamic_shifting": False, "shift_terminal": None,
        "timestep_spacing": "linspace",
    }  # fmt: skip
    SUPPORTED = {
        "prediction_type": ("flow_prediction",), "use_flow_sigmas": (True,), "predict_x0": (True,),
        "solver_order": (1, 2, 3), "solver_type": ("bh1", "bh2"), "lower_order_final": (True, False),
        "final_sigmas_type": ("zero", "sigma_min"), "thresholding": (False,), "solver_p": (None,),
        "use_karras_sigmas": (False,), "use_exponential_sigmas": (False,), "use_beta_sigmas": (False,),
        "use_dynamic_shifting": (False,), "shift_terminal": (None,),
        "timestep_spacing": ("linspace", "leading", "trailing"),  # no effect with flow sigmas
    }  # fmt: skip

    def __init__(self, config: dict):
        super().__init__(config)
        c = self.config
        # Combinations whose last step diffusers computes as NaN or inf (or fails to solve), refused here.
        if c["solver_type"] == "bh1" and c["final_sigmas_type"] == "zero":
            raise ValueError(f"{self.DIFFUSERS_CLASS}: solver_type 'bh1' needs final_sigmas_type 'sigma_min'")
        if not c["lower_order_final"] and c["solver_order"] > 1:
            raise ValueError(f"{self.DIFFUSERS_CLASS}: lower_order_final false needs solver_order 1")

    def set_timesteps(self, num_inference_steps: int, device=None) -> None:
        """`num_inference_steps` shifted flow sigmas from 1 (less 1e-6) towards 1/num_train_timesteps, then
        the final one; integer timesteps (truncated) on `device`, sigmas on the CPU as diffusers keeps
        them. Clears the history."""
        n, c = self.config["num_train_timesteps"], self.config
        sigmas = _shifted(np.linspace(1, 1 / n, num_inference_steps + 1)[:-1], c["flow_shift"])
        if np.fabs(sigmas[0] - 1) < 1e-6:
            sigmas[0] -= 1e-6
        last = sigmas[-1] if c["final_sigmas_type"] == "sigma_min" else 0
        self.sigmas = torch.from_numpy(np.concatenate([sigmas, [last]]).astype(np.float32))
        self.timesteps = torch.from_numpy(sigmas * n).to(device=device, dtype=torch.int64)
        self.model_outputs = [None] * c["solver_order"]  # the last x0 predictions, newest last
        self.lower_order_nums, self.this_order, self.last_sample, self._step_index = 0, 0, None, 0

    def step(self, model_output: torch.Tensor, sample: torch.Tensor, generator=None) -> torch.Tensor:
        """The sample at the next sigma from the model's velocity at this one (`generator`: unused)."""
        c, i = self.config, self._step_index
        x0 = sample - self.sigmas[i] * model_output
        if i > 0 and i - 1 not in c["disable_corrector"] and self.last_sample is not None:
            sample = self._update(self.last_sample, i - 1, self.this_order, x0)
        self.model_outputs = [*self.model_outputs[1:], x0]
        order = c["solver_order"]
        if c["lower_order_final"]:
            order = min(order, len(self.timesteps) - i)
        self.this_order = min(order, self.lower_order_nums + 1)  # the first steps lack the history
        self.last_sample = sample
        prev = self._update(sample, i, self.this_order)
        self.lower_order_nums = min(self.lower_order_nums + 1, c["solver_order"])
        self._step_index += 1
        return prev

    def take_rows(self, rows: list[int]) -> None:
        """Keep only these rows of the history (a batch's jobs that go on): each row's is its own."""
        index = lambda x: None if x is None else x[torch.tensor(rows, device=x.device)]  # noqa: E731
        self.model_outputs = [index(x) for x in self.model_outputs]
        self.last_sample = index(self.last_sample)

    def _update(self, x: torch.Tensor, s: int, order: int, model_t: torch.Tensor | None = None):
        """UniPC's B(h) update of `x` from sigma index `s` to `s + 1` with the last `order` x0 predictions
        (`model_outputs`, newest last): the predictor, or with `model_t` (the x0 predicted at `s + 1`) the
        corrector."""
        device, sigmas = x.device, self.sigmas

        def lam(sigma):  # log-SNR of flow sigma σ: log(1 − σ) − log σ
            return torch.log(1 - sigma) - torch.log(sigma)

        sigma_t, sigma_s0 = sigmas[s + 1].to(device), sigmas[s].to(device)
        alpha_t, lambda_s0 = 1 - sigma_t, lam(sigma_s0)
        h = lam(sigma_t) - lambda_s0
        m0 = self.model_outputs[-1]
        rks, d1s = [], []
        for k in range(1, order):
            rk = (lam(sigmas[s - k].to(device)) - lambda_s0) / h
            rks.append(rk)
            d1s.append((self.model_outputs[-(k + 1)] - m0) / rk)
        rks = torch.stack([*rks, torch.ones((), device=device)])
        hh = -h
        h_phi_1 = torch.expm1(hh)
        h_phi_k, factorial, rs, bs = h_phi_1 / hh - 1, 1, [], []
        b_h = hh if self.config["solver_type"] == "bh1" else torch.expm1(hh)
        for k in range(1, order + 1):
            rs.append(torch.pow(rks, k - 1))
            bs.append(h_phi_k * factorial / b_h)
            factorial *= k + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        r, b = torch.stack(rs), torch.stack(bs)
        x_t = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0
        if model_t is None:  # predictor
            if d1s:
                rhos = _half(x) if order == 2 else _solve(r[:-1, :-1], b[:-1], x)
                x_t = x_t - alpha_t * b_h * torch.einsum("k,bkc...->bc...", rhos, torch.stack(d1s, dim=1))
        else:  # corrector
            rhos = _half(x) if order == 1 else _solve(r, b, x)
            res = torch.einsum("k,bkc...->bc...", rhos[:-1], torch.stack(d1s, dim=1)) if d1s else 0
            x_t = x_t - alpha_t * b_h * (res + rhos[-1] * (model_t - m0))
        return x_t.to(x.dtype)


def _half(x: torch.Tensor) -> torch.Tensor:  # UniPC's fixed coefficient where the solve would be 1×1
    return torch.ones(1, dtype=x.dtype, device=x.device) * 0.5


def _solve(r: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve(r, b).to(x.device).to(x.dtype)


class FlowMatchEulerScheduler(_FlowScheduler):
    """Flow-match Euler: x' = x + (σ' − σ)·v; with `stochastic_sampling` ("renoise") the predicted clean
    latents x0 = x − σ·v noised afresh to the next sigma, x' = (1 − σ')·x0 + σ'·ε, ε from the step's
    generator. diffusers' `FlowMatchEulerDiscreteScheduler`."""

    DIFFUSERS_CLASS, SHIFT_KEY = "FlowMatchEulerDiscreteScheduler", "shift"
    DEFAULTS = {
        "num_train_timesteps": 1000, "shift": 1.0, "stochastic_sampling": False,
        "use_dynamic_shifting": False, "invert_sigmas": False, "shift_terminal": None,
        "use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False,
    }  # fmt: skip
    SUPPORTED = {
        "stochastic_sampling": (False, True), "use_dynamic_shifting": (False,), "invert_sigmas": (False,),
        "shift_terminal": (None,), "use_karras_sigmas": (False,), "use_exponential_sigmas": (False,),
        "use_beta_sigmas": (False,),
    }  # fmt: skip

    def set_timesteps(self, num_inference_steps: int | None = None, device=None, sigmas=None) -> None:
        """Shifted float32 sigmas and a final 0, and timesteps = 1000·sigma, on `device`: the
        given unshifted `sigmas` (float32, as diffusers casts them), else `num_inference_steps` of them
        evenly spaced in timestep over the range diffusers derives (its training sigmas, shifted once more
        at construction)."""
        n, shift = self.config["num_train_timesteps"], self.config["shift"]
        if sigmas is None:
            ends = _shifted(torch.tensor([float(n), 1.0]) / n, shift)  # diffusers' sigma_max, sigma_min
            sigmas = np.linspace(ends[0].item() * n, ends[1].item() * n, num_inference_steps) / n
        else:
            sigmas = np.array(sigmas).astype(np.float32)
        shifted = torch.from_numpy(_shifted(sigmas, shift)).to(dtype=torch.float32, device=device)
        self.timesteps = shifted * n
        self.sigmas = torch.cat([shifted, torch.zeros(1, device=device)])
        self._step_index = 0

    def step(self, model_output: torch.Tensor, sample: torch.Tensor, generator=None) -> torch.Tensor:
        """The sample at the next sigma (float32 arithmetic, returned in the model output's dtype)."""
        sample = sample.to(torch.float32)
        sigma, sigma_next = self.sigmas[self._step_index], self.sigmas[self._step_index + 1]
        if self.config["stochastic_sampling"]:
            x0 = sample - sigma * model_output
            noise = _draw(sample.shape, generator, sample.dtype, sample.device)
            prev = (1.0 - sigma_next) * x0 + sigma_next * noise.to(sample.device)
        else:
            prev = sample + (sigma_next - sigma) * model_output
        self._step_index += 1
        return prev.to(model_output.dtype)


def _draw(shape, generator, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Standard normal noise of `shape` from `generator`; from a list of generators (a batch's, dit.batch)
    each row from its own, as that job's solo run draws it. A CPU generator draws on the CPU whatever the
    sample's device (diffusers' randn_tensor)."""
    if isinstance(generator, list):
        return torch.cat([_draw((1, *shape[1:]), g, dtype, device) for g in generator])
    drawn = device if generator is None else generator.device
    return torch.randn(shape, generator=generator, device=drawn, dtype=dtype)


FlowScheduler = UniPCFlowScheduler | FlowMatchEulerScheduler
