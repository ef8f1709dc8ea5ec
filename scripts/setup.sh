#!/usr/bin/env bash
# Creates .venv and installs Ithaca with its test extras. On a machine without a GPU, torch is pinned to the
# CPU build first (torch==2.13.0); set ITHACA_TORCH_SPEC to change it (GPU boxes: see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q "${ITHACA_TORCH_SPEC:-torch==2.13.0}"
pip install -q -e '.[test]'
# CPU torch ships no Triton (a CUDA torch brings its own): the tests run the kernels under Triton 3.9's
# interpreter, and compile them for Hopper with the GPU image's Triton, 3.6.0, kept apart in .venv/hopper-triton
# (tests/test_hopper_compile.py).
python -c "import triton" 2>/dev/null || pip install -q triton==3.9.0
[ -d .venv/hopper-triton/triton ] || pip install -q --no-deps --target .venv/hopper-triton triton==3.6.0
