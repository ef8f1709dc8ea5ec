"""Local attention kernel dispatch, `[B, S, H, D]` layout, optional key mask, causal flag and log-sum-exp.

auto: flash-attn when importable on CUDA (and no key mask) → SDPA preferring cuDNN on Hopper (599 vs 373
TFLOP/s for the flash backend at S=32760, H=40, D=128 on an H100) → SDPA. The LSE path (for the ring merge)
exists on every backend: flash-attn's softmax_lse, the CUDA efficient-attention op, the CPU flash op, or
`math` (fp32 scores, the reference; fp64 for fp64 inputs). `fp8` (`parallel.fp8_attention`: e4m3 Q, K, V and
P, lossy) only when asked for: `auto` never picks it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from parallel.fp8_attention import fp8_attention

BACKENDS = ("auto", "flash", "cudnn", "sdpa", "math", "fp8")


try:  # optional (the `gpu` extra): looked up here, once, not inside a compiled block, where a failed
    # import would break dynamo's graph at every attention call
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None


def resolve_backend(backend: str, q: torch.Tensor, key_mask) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "flash" and (flash_attn_func is None or not q.is_cuda):  # it called None
        raise ValueError("backend='flash' needs flash-attn installed and CUDA tensors; use auto or sdpa")
    if backend != "auto":
        return backend
    if not q.is_cuda:
        return "sdpa"
    if flash_attn_func is not None and key_mask is None and q.dtype in (torch.float16, torch.bfloat16):
        return "flash"
    # device properties, not capability: dynamo folds them into a constant instead of tracing the query
    return "cudnn" if torch.cuda.get_device_properties(q.device).major == 9 else "sdpa"


def _cudnn_first():
    order = [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
    return sdpa_kernel(order, set_priority=True)


def _bool_mask(key_mask, causal: bool, Sq: int, Sk: int, device) -> torch.Tensor | None:
    """[B or 1, 1, Sq or 1, Sk] bool (True = attend), or None when causal alone says it all."""
    if key_mask is None:
        return None
    mask = key_mask[:, None, None, :]
    if causal:
        mask = mask & torch.ones(Sq, Sk, dtype=torch.bool, device=device).tril()
    return mask


def _math(q, k, v, mask, causal):
    acc = acc_dtype(q)
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = s.logsumexp(-1)
    return (torch.exp(s - lse[..., None]) @ v.to(acc)).to(q.dtype), lse


def local_attention(q, k, v, *, key_mask=None, causal=False, backend="auto", return_lse=False):
    """softmax(q kᵀ/√D) v per head. q [B, Sq, H, D], k/v [B, Sk, H, D]; key_mask [B, Sk] bool (True =
    real key); causal: query i sees keys j ≤ i (needs Sq == Sk). Returns out [B, Sq, H, D] in q's dtype,
    and with return_lse also lse [B, Sq, H] (fp32; fp64 for fp64 inputs)."""
    Sq, Sk = q.shape[1], k.shape[1]
    if causal and Sq != Sk:
        raise ValueError(f"causal attention needs as many queries as keys, got {Sq} and {Sk}")
    if Sq == 0 or Sk == 0:  # nothing to attend (a sample's text all padding, cut away): the CPU op dies on it
        out, lse = q.new_zeros(q.shape), q.new_full(q.shape[:-1], float("-inf"), dtype=acc_dtype(q))
        return (out, lse) if return_lse else out
    backend = resolve_backend(backend, q, key_mask)
    if backend == "fp8":
        out, lse = fp8_attention(q, k, v, key_mask=key_mask, causal=causal)
        return _keyless(out, lse, key_mask, causal) if return_lse else out
    if backend == "flash" and key_mask is None:
        out = flash_attn_func(q, k, v, causal=causal, return_attn_probs=return_lse)
        return (out[0], out[1].transpose(1, 2)) if return_lse else out
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = _bool_mask(key_mask, causal, Sq, Sk, q.device)
    is_causal = causal and mask is None
    # masked LSE calls only ever attend to the few text keys: the math path is cheap there and avoids the raw
    # CUDA op's bias alignment rules
    if backend == "math" or (return_lse and q.is_cuda and (q.dtype == torch.float64 or mask is not None)):
        out, lse = _math(qt, kt, vt, mask, is_causal)
    elif return_lse:
        if q.is_cuda:
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                qt, kt, vt, None, True, 0.0, is_causal
            )[:2]
            lse = lse[..., :Sq]  # the op pads the LSE's sequence dim
        else:  # the CPU flash op takes an additive mask of q's dtype
            bias = (
                None
                if mask is None
                else torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
            )
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qt, kt, vt, 0.0, is_causal, attn_mask=bias
            )
    else:
        with _cudnn_first() if backend == "cudnn" else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal)
        lse = None
    out = out.transpose(1, 2)
    return _keyless(out, lse.transpose(1, 2), key_mask, causal) if return_lse else out


def acc_dtype(q) -> torch.dtype:
    """What the LSE, the math path's scores and the ring's merge are kept in: float32, or float64."""
    return torch.promote_types(q.dtype, torch.float32)


def _keyless(out, lse, key_mask, causal):
    """(out [B, Sq, H, D], lse [B, Sq, H]) with every query row that sees no key at all (its keys all masked)
    as a merge takes "no keys": out 0 and lse -inf. The kernels disagree there: the CPU flash op answers 0
    and lse 0 (a merge then weighs a zero output in), the math path NaN and -inf (NaN times a zero weight is
    NaN)."""
    if key_mask is None:
        return out, lse
    seen = key_mask.cumsum(-1) > 0 if causal else key_mask.any(-1, keepdim=True)  # [B, Sq or 1]
    blind = ~seen[..., None]
    return out.masked_fill(blind[..., None], 0), lse.masked_fill(blind, float("-inf"))
