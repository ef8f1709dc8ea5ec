#!/usr/bin/env bash
# Creates .venv and installs Ithaca with its test extras. On a machine without a GPU, torch is pinned to the
# CPU build first (torch==2.13.0); set ITHACA_TORCH_SPEC to change it (GPU boxes: see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
# pip takes torch: it looks in the machine's own wheel folders (the CPU build lies there), uv does not.
# Bytecode is compiled at install, pip's and uv's (--compile-bytecode) alike: where PYTHONDONTWRITEBYTECODE is
# set (the project's machines), a module without it is compiled again at every import in every process.
pip install -q "${ITHACA_TORCH_SPEC:-torch==2.13.0}"
# The rest from PyPI through uv (in a seventh of pip's time) at the versions constraints.txt pins, the ones the
# suite last passed with (scripts/lock.py writes it), with torch held at the release pip installed, so no
# dependency can swap it for another. The torch pin leaves out the build's local label: uv holds an installed
# 2.11.0+cu130 to `torch==2.11.0` but finds no `torch==2.11.0+cu130`.
pip install -q --no-compile uv
python -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" \
    > .venv/torch-constraint.txt
uv pip install -q --compile-bytecode -c .venv/torch-constraint.txt -c constraints.txt -e '.[test]'
# CPU torch ships no Triton (a CUDA torch brings its own): the tests run the kernels under Triton 3.9's
# interpreter, and compile them for Hopper with the GPU image's Triton, 3.6.0, kept apart in .venv/hopper-triton
# (tests/test_hopper_compile.py).
python -c "import triton" 2>/dev/null || uv pip install -q --compile-bytecode triton==3.9.0
[ -d .venv/hopper-triton/triton ] || uv pip install -q --compile-bytecode --no-deps --target .venv/hopper-triton triton==3.6.0
