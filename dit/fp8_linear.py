"""FP8 linear layers (`--quant fp8`): the DiT's large linear layers as float8 GEMMs.

A quantised layer keeps its weight in float8_e4m3 with one scale per output channel (quantised once, when
the model has loaded and its LoRAs are merged: the peak is the bf16 load's, the steady weight memory half of
it; or read as stored from a pre-quantised checkpoint, dit.fp8_checkpoint), quantises its input per token
at run time and multiplies with `torch._scaled_mm` (row-wise scales; it runs on the CPU too, so the path is
tested without a GPU). Which library: bench/fp8_linear.py measured
`_scaled_mm` and torchao's float8 on an H200 (bench/RESULTS.md, 2026-11-24): the same function, within noise
of each other compiled; `_scaled_mm` needs no extra package on the device image.

What is quantised: the linear layers inside the transformer blocks (attention Q/K/V/O, cross-attention, the
FFN), not the blocks' modulation, the embeddings, the time projections or the head, and only layers whose
sizes the GPU GEMM takes (multiples of 16), so the CPU runs what a GPU would. A token's scale depends on that
token alone, so a sequence-parallel rank quantises its tokens as one rank would.
"""

from __future__ import annotations

import torch
from torch import nn

from dit.weights import host_copy

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
QUANTS = ("none", "fp8")


def quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [M, K] → (float8_e4m3 [M, K], float32 scales [M, 1]) with x ≈ q · scale, each row's largest
    magnitude at e4m3's largest value."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


class Fp8Linear(nn.Module):
    """`nn.Linear`'s function with an FP8 weight and FP8 activations (see the module's docstring)."""

    # kept in their dtype when the model materialises (dit.weights.materialize)
    stored_dtypes = ("weight", "weight_scale")

    def __init__(self, linear: nn.Linear, stored: bool = False):
        """`linear` quantised, or with `stored` empty float8 weights and scales on `linear`'s device for a
        pre-quantised checkpoint to fill (dit.fp8_checkpoint): no copy in the model dtype is ever made."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight
        if stored:
            weight = torch.empty(w.shape, dtype=E4M3, device=w.device)
            scale = torch.empty(w.shape[0], 1, dtype=torch.float32, device=w.device)
        else:
            weight, scale = quantise_rows(w.detach())
        self.weight = nn.Parameter(weight, requires_grad=False)
        # [N, 1], one per output channel (LightX2V's layout too): fused projections' parts stack along dim 0
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.bias = linear.bias

    @torch.no_grad()
    def requantise(self, weight: torch.Tensor) -> None:
        """Quantise `weight` (in the model dtype) into this layer, in place: the bytes and scales a layer
        built from it would hold (dit.lora_switch: a LoRA per request merged into the unquantised base)."""
        q, scale = quantise_rows(weight)
        self.weight.copy_(q)
        self.weight_scale.copy_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, scale = _quantise_input(x.reshape(-1, self.in_features))
        # row-wise scaled GEMMs give bf16 on CUDA; the CPU gives the input's dtype directly
        out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
        w, w_scale = self.weight.t(), self.weight_scale.t()  # `_scaled_mm`'s scale_b: [1, N]
        y = torch._scaled_mm(q, w, scale_a=scale, scale_b=w_scale, out_dtype=out_dtype)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3"


def _quantise_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantise_rows(x)`: on CUDA outside torch.compile by one Triton kernel (dit.fp8_rows_kernel, the same
    bytes); inside, Inductor fuses this function's ops itself."""
    if x.is_cuda and not torch.compiler.is_compiling():
        from dit import fp8_rows_kernel  # Triton: CUDA builds of torch only

        return fp8_rows_kernel.quantise_rows(x)
    return quantise_rows(x)


def quantised(name: str, module: nn.Module) -> bool:
    """Whether `quantise` turns this layer (by its name in the model) into FP8."""
    inside_block = ".blocks." in f".{name}"
    modulation = any(part.endswith("_mod") or part == "modulation" for part in name.split("."))
    sizes = isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
    return inside_block and not modulation and sizes


@torch.no_grad()
def quantise(model: nn.Module, keep: dict[str, torch.Tensor] | None = None) -> int:
    """Replace the model's large linear layers by `Fp8Linear`s, one at a time (each bf16 weight is freed as
    its FP8 copy is made); the number replaced. `keep`: filled with a host copy of each weight quantised, in
    the model dtype, by its parameter name (pinned when on a GPU), the base a LoRA per request merges into."""
    targets = [(name, module) for name, module in model.named_modules() if quantised(name, module)]
    for name, module in targets:
        if keep is not None:
            keep[f"{name}.weight"] = host_copy(module.weight)
        replace_module(model, name, Fp8Linear(module))
    return len(targets)


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, module)
