#!/usr/bin/env bash
# Download the wheels bench/gpu.py needs on the lent GPU machine, whose image lacks them and which cannot reach
# a package index: pure-Python wheels (and three manylinux x86_64 binaries: pydantic-core, imageio-ffmpeg,
# nvidia-cudnn-frontend) for CPython 3.12 into .whl/ (49 MB of the 64 MiB a device call carries). Versions
# are constraints.txt's, the ones the suite runs with (the two below it lacks are pinned here); the GPU image
# already holds torch, transformers, accelerate, safetensors, huggingface-hub, numpy, pillow, regex, requests,
# anyio, h11, click, httpx, annotated-doc and zipp. The one-call device command that installs them is at the
# top of bench/gpu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PINNED=(
    diffusers importlib-metadata                                      # the models and their reference
    fastapi starlette uvicorn python-multipart                        # ithaca serve
    pydantic pydantic-core annotated-types typing-inspection
    typing-extensions opentelemetry-api                               # pydantic and fastapi's imports
)
WHEELS=(
    # MP4 writing. 0.6.0, not constraints.txt's 0.8.1: its bundled ffmpeg makes a 68 MB wheel, over the device
    # call's 64 MiB limit on what travels; 0.6.0's is 29 MB and has the same write_frames/read_frames API.
    imageio-ffmpeg==0.6.0
    nvidia-cudnn-frontend==1.32.0    # cuDNN's FP8 attention, timed beside ours (bench/cudnn_fp8.py; 12 MB)
)
for name in "${PINNED[@]}"; do
    WHEELS+=("$(grep -x "$name==.*" constraints.txt)") || { echo "constraints.txt pins no $name" >&2; exit 1; }
done
rm -rf .whl
for spec in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$spec" 2>&1 | { grep -v "^WARNING: Location" || true; }
done
ls .whl | wc -l | xargs echo "wheels in .whl/:"
du -sh .whl
