"""Ithaca's Triton kernels compile for Hopper (sm_90) at Wan2.1-14B's shapes, and what they compile to is
what their GPU rows need (bench/hopper_compile.py, in a process of its own: it swaps Triton's driver for a
compile-only one) with the GPU image's Triton, 3.6.0, which setup.sh keeps in .venv/hopper-triton on a CPU
machine (elsewhere the installed Triton). No GPU needed; skipped where no Triton is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_speed import FP8_LAUNCHES, attend_settings
from parallel.fp8_attention_format import KEY_BLOCK
from testing.hopper_compile import HOPPER_SMEM

ROOT = Path(__file__).resolve().parents[1]
HOPPER_TRITON = ROOT / ".venv" / "hopper-triton"

pytestmark = [
    pytest.mark.skipif(
        not (importlib.util.find_spec("triton") or HOPPER_TRITON.is_dir()),
        reason="no Triton here to compile the kernels with (setup.sh installs one beside CPU torch)",
    ),
    pytest.mark.slow,  # compiles 17 kernels: 10 s
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> list[dict]:
    env = os.environ | {"TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton-cache"))}
    env.pop("TRITON_INTERPRET", None)
    if HOPPER_TRITON.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOPPER_TRITON), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "bench/hopper_compile.py", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)["rows"]


def test_every_kernel_compiles_within_hoppers_shared_memory(compiled):
    kernels = [r["kernel"] for r in compiled]
    assert kernels.count("_attend") == len(FP8_LAUNCHES) + 1  # every timed launch, and attend's defaults
    assert kernels.count("_quantise_q") == kernels.count("_quantise_v") == 2 and "_quantise_rows" in kernels
    assert all(r["shared"] <= HOPPER_SMEM for r in compiled), compiled


def test_no_kernel_takes_a_float_argument(compiled):
    """torch.compile captures the kernels, and Inductor passes their float arguments as fp64 (Triton's own
    launch: fp32): the quantisers' scales turned fp64 and `div_rn` refused to compile
    (bench/compile_capture.py found it, on the device image's torch). Their float constants are constexpr."""
    assert not [(r["kernel"], r["float_args"]) for r in compiled if r["float_args"]]


def test_the_quantisers_keep_everything_in_registers(compiled):
    assert all(r["spilled"] == 0 for r in compiled if r["kernel"] != "_attend"), compiled


def test_no_kernel_reads_or_writes_a_byte_at_a_time_at_the_14bs_32760_keys(compiled):
    """32760 is no multiple of 16: V's keys, a row of the V quantiser's output and the attention kernel's
    V tile once took single-byte accesses (64 loads a thread a key block, outside the copy pipeline) until
    V's rows were padded as K's. Left: the key mask's bytes, which the MMA's layout spreads over threads, and
    the wire packer, whose peers' rows start n·(D + 4) bytes apart."""
    for r in compiled:
        if "key mask" not in r["case"] and "wire" not in r["case"]:
            assert r["byte_accesses"] == 0, r
    for r in compiled:
        if r["kernel"] == "_attend":
            assert r["async_copies"] >= 8 * r["stages"], r  # K's and V's tiles through the copy pipeline


def test_attention_runs_both_products_on_fp8_tensor_cores_and_sums_each_block_in_fp32(compiled):
    """Every launch: Q·Kᵀ and P·V as e4m3 wgmma; with two-level accumulation P·V's sum leaves the MMA after
    one key block (without, never); a thread spills at most a few bytes, outside the loops (Triton 3.6.0:
    with 4 warps a program 24-344 bytes, so bench/gpu.py times none such)."""
    rows = [r for r in compiled if r["kernel"] == "_attend"]
    for r in rows:
        two_level = json.loads(r["launch"])["two_level"]
        assert r["e4m3_wgmma"] > 0 and len(r["imprecise_acc"]) in (2, 4), r  # a loop or two: Q·Kᵀ, P·V each
        assert set(r["imprecise_acc"][1::2]) == {KEY_BLOCK if two_level else 2**30}, r
        assert r["spilled"] <= 16, r
    assert rows[-1]["launch"] == json.dumps(attend_settings(FP8_LAUNCHES[0]))  # the masked call's defaults


def test_attention_leaves_the_masking_out_of_its_leading_whole_blocks(compiled):
    """Only blocks with keys past Sk, dropped by the mask or in the future need the masking: the main loop
    takes the leading blocks whose keys all count (without a mask every whole block: Wan's self-attention;
    with one, as many as `attend` counts on the device: joint attention's image keys) and leaves out a
    compare and a select per score and the mask's bytes (bench/RESULTS.md has the counts)."""
    for r in compiled:
        if r["kernel"] == "_attend":
            main, rest = (loop["instructions"] for loop in r["loops"])
            assert main < 0.85 * rest, r


def test_no_loop_touches_spilled_registers(compiled):
    """A few bytes a thread may spill around a loop (Triton 3.6.0: 8 at 128 queries), none inside one."""
    for r in compiled:
        assert all(loop["stack"] == 0 for loop in r["loops"]), r
