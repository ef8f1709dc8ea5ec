"""Triton kernels compiled for Hopper (sm_90) on a machine without a GPU, to read what the GPU would run.

Triton compiles ahead of time for any target it knows: `compile_only()` makes a stand-in driver that names
an sm_90 device and turns every kernel launch inside it into a compile (`JITFunction.run(warmup=True)`), so
the kernels' own Python wrappers, given meta tensors of the real shapes, produce the cubin the GPU would
load, specialised as a launch there specialises it. `usage()` reads its registers, spilled bytes and shared
memory (Triton's bundled cuobjdump and the launch metadata); `fp8_mmas()` its FP8 tensor-core instructions
and how each accumulates; `memory()` how it reaches global memory; `loops()` the size of its loops.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

import torch

HOPPER_SMEM = 227 * 1024  # the shared memory one block may opt into on an H100/H200
# an H100 (SXM) as `torch.cuda.get_device_properties` reports it, for code that asks the device without one
HOPPER = SimpleNamespace(name="sm_90 stand-in", major=9, minor=0, multi_processor_count=132,
                         regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                         max_threads_per_block=1024, warp_size=32, total_memory=80 << 30,
                         shared_memory_per_block_optin=HOPPER_SMEM, L2_cache_size=50 << 20)  # fmt: skip


@dataclass
class Compiled:
    kernel: str  # the @triton.jit function's name
    binary: object  # triton's CompiledKernel


@contextmanager
def compile_only(capability: int = 90):
    """Inside: Triton targets a CUDA device of `capability` and every launch compiles instead of running
    (the FP8 attention wrappers' CUDA check is lifted: their tensors are meta). Yields the list the
    compiled kernels are appended to, in launch order."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class CompileOnly(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

        def get_active_torch_device(self):
            return torch.device("meta")

        def get_benchmarker(self):
            raise NotImplementedError

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    compiled: list[Compiled] = []
    run = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        binary = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(Compiled(self.fn.__name__, binary))
        return binary

    with (
        mock.patch.object(driver, "_active", CompileOnly()),  # set_active's, restored as it was on exit
        mock.patch.object(JITFunction, "run", compile_instead),
        mock.patch("parallel.fp8_attention_kernel.check_device", lambda t: None),
        mock.patch("parallel.fp8_qkv_kernel.check_device", lambda t: None),
    ):
        yield compiled


def _cuobjdump(binary, *flags: str) -> str:
    """What the cuobjdump Triton ships prints for the kernel's cubin."""
    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, *flags, f.name], capture_output=True, text=True)
    return out.stdout + out.stderr


def float_arguments(binary) -> dict:
    """The launch's scalar float arguments, by name. Triton's own launch passes a Python float as fp32, but
    Inductor, re-emitting a kernel torch.compile captured, as fp64: such a value belongs in a constexpr."""
    floats = ("fp16", "bf16", "fp32", "fp64")
    return dict(float_args=[name for name, ty in binary.src.signature.items() if ty in floats])


def usage(binary) -> dict:
    """Registers a thread, bytes a thread spills to its stack, and shared memory a block (bytes)."""
    out = _cuobjdump(binary, "--dump-resource-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if found is None:
        raise RuntimeError(f"cuobjdump named no registers: {out}")
    return dict(registers=int(found[1]), spilled=int(found[2]), shared=binary.metadata.shared)


def fp8_mmas(binary) -> dict:
    """The FP8 tensor-core products (e4m3 wgmma instructions in the PTX) and, per tt.dot, after how many
    products its fp32 accumulator takes over from the MMA's own (2**30: never; Hopper's FP8 MMA keeps 13
    bits of mantissa, so a long chain of them truncates)."""
    ptx, ttgir = binary.asm["ptx"], binary.asm["ttgir"]
    return dict(
        e4m3_wgmma=len(re.findall(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx)),
        imprecise_acc=[int(n) for n in re.findall(r"warp_group_dot .*maxNumImpreciseAcc = (\d+)", ttgir)],
    )


def memory(binary) -> dict:
    """Global-memory instructions a thread issues (in the PTX: unrolled, each once): single-byte loads and
    stores (what a row that is no multiple of 16 bytes costs: no vector access), and asynchronous 16-byte
    copies to shared memory (the software pipeline's loads)."""
    ptx = binary.asm["ptx"]
    return dict(
        byte_accesses=len(re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*\.[bsu]8\b", ptx)),
        async_copies=len(re.findall(r"cp\.async\.cg\.shared\.global", ptx)),
    )


def loops(binary) -> list[dict]:
    """Each loop of the machine code (SASS, from cuobjdump: a backward branch's span), in program order: the
    instructions one iteration issues and how many of them touch the stack (spilled registers)."""
    sass = _cuobjdump(binary, "-sass")
    code = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    found = []
    for at, text in code:
        branch = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x)([0-9a-f]*)", text)
        if branch and branch[1] and int(branch[1], 16) < at:
            body = [t for a, t in code if int(branch[1], 16) <= a <= at]
            found.append(
                dict(instructions=len(body), stack=sum(bool(re.search(r"\b[LS]TL\b", t)) for t in body))
            )
    return found
