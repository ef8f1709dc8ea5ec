"""FP8 (e4m3) wire format: one fp32 scale per (token, head) row = absmax / 448, payload and scales in one
uint8 buffer per peer, so any backend (gloo included, which cannot carry float8) moves it as plain bytes.

The quantiser is a handful of elementwise ops plus a row max; eager torch runs them as separate kernels
(0.92 ms for one rank's Wan-14B QKV shard at P=8 on an H200; torch.compile's fusion 0.27 ms): `compiled=True`
packs CUDA tensors with one Triton kernel instead (`parallel.fp8_kernel`, 0.092 ms, the same bytes).
"""

from __future__ import annotations

import torch

from parallel.e4m3 import FP8, FP8_MAX


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] → (e4m3 payload [..., D], fp32 scale [..., 1])."""
    x = x.float()
    # times the fp32 reciprocal, as CUDA torch divides by a scalar: the same bytes on every device
    scale = (x.abs().amax(-1, keepdim=True) * (1 / FP8_MAX)).clamp_min(1e-12)
    return (x / scale).to(FP8), scale


def dequantize(payload: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (payload.float() * scale).to(dtype)


def _pack(x: torch.Tensor) -> torch.Tensor:
    P = x.shape[0]
    payload, scale = quantize(x)
    # flatten before the dtype view: Inductor may give the size-1 scale dim any stride, and a float→byte
    # view needs the last stride to be 1 (CUDA compile failed on [8, 3, 1, 4095, 5, 1] otherwise)
    return torch.cat([payload.reshape(P, -1).view(torch.uint8), scale.reshape(P, -1).view(torch.uint8)], 1)


def pack(x: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """x [P, ..., D] (chunk i for peer i) → uint8 [P, n*D + 4n] with n = rows per peer; `compiled`: one fused
    kernel for a CUDA tensor whose D is a multiple of 4 (its scales then sit 4-byte aligned)."""
    if compiled and x.is_cuda and x.shape[-1] % 4 == 0:
        from parallel import fp8_kernel  # Triton: CUDA builds of torch only

        return fp8_kernel.pack(x)
    return _pack(x)


def pack_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x [N, D] → flat uint8: for each peer in turn, its rows' payload (rows[i]·D bytes), then their scales
    (rows[i]·4 bytes): `pack`'s layout for chunks of different sizes."""
    payload, scale = quantize(x)
    payload, scale = payload.view(torch.uint8), scale.view(torch.uint8)  # [N, D], [N, 4]
    pieces = [
        t.reshape(-1) for p, s in zip(payload.split(rows), scale.split(rows), strict=True) for t in (p, s)
    ]
    return torch.cat(pieces)


def unpack_rows(buf: torch.Tensor, rows: list[int], D: int, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of pack_rows: flat uint8 → [sum(rows), D] in `dtype`."""
    parts = buf.split([r * (D + 4) for r in rows])
    payload = torch.cat([p[: r * D] for p, r in zip(parts, rows, strict=True)]).view(FP8).view(-1, D)
    scale = torch.cat([p[r * D :] for p, r in zip(parts, rows, strict=True)]).view(torch.float32).view(-1, 1)
    return dequantize(payload, scale, dtype)


def unpack(buf: torch.Tensor, shape: torch.Size | tuple, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of pack: uint8 [P, bytes] → tensor of `shape` ([P, ..., D]) in `dtype`."""
    nD = buf.shape[1] * shape[-1] // (shape[-1] + 4)
    payload = buf[:, :nD].contiguous().view(FP8).view(shape)
    scale = buf[:, nD:].contiguous().view(torch.float32).view(*shape[:-1], 1)
    return dequantize(payload, scale, dtype)
