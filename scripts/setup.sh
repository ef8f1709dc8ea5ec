#!/usr/bin/env bash
# Creates .venv and installs Ithaca with its test extras. On a machine without a GPU, torch is pinned to the
# CPU build first (torch==2.13.0); set ITHACA_TORCH_SPEC to change it (GPU boxes: see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q "${ITHACA_TORCH_SPEC:-torch==2.13.0}"
pip install -q -e '.[test]'
