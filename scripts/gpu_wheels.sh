#!/usr/bin/env bash
# Download the wheels bench/gpu.py needs on the lent GPU machine, whose image lacks them and which cannot reach
# a package index: pure-Python wheels (and three manylinux x86_64 binaries: pydantic-core, imageio-ffmpeg,
# nvidia-cudnn-frontend) for CPython 3.12 into .whl/ (49 MB of the 64 MiB a device call carries). Versions
# are the ones this repo's .venv runs (the frontend is not in it); the GPU image already holds torch,
# transformers, accelerate, safetensors, huggingface-hub, numpy, pillow, regex, requests, anyio, h11, click,
# httpx, annotated-doc and zipp. The one-call device command that installs them is at the top of bench/gpu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    diffusers==0.42.1 importlib-metadata==10.2.0                      # the models and their reference
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34   # ithaca serve
    pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0 opentelemetry-api==1.45.2               # pydantic and fastapi's imports
    # MP4 writing. 0.6.0, not .venv's 0.8.1: its bundled ffmpeg makes a 68 MB wheel, over the device call's
    # 64 MiB limit on what travels; 0.6.0's is 29 MB and has the same write_frames/read_frames API.
    imageio-ffmpeg==0.6.0
    nvidia-cudnn-frontend==1.32.0    # cuDNN's FP8 attention, timed beside ours (bench/cudnn_fp8.py; 12 MB)
)
rm -rf .whl
for spec in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$spec" 2>&1 | { grep -v "^WARNING: Location" || true; }
done
ls .whl | wc -l | xargs echo "wheels in .whl/:"
du -sh .whl
