"""The FP8 format every FP8 path here uses: float8_e4m3fn, whose largest finite value is 448 (the wire
format of parallel.fp8, its Triton packer, and FP8 attention's operands)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
