"""A stand-in ffmpeg (point IMAGEIO_FFMPEG_EXE at it) that fails as a full disk, a killed ffmpeg or a stalled
disk would, for the MP4 writer's error paths: a shell script that runs the real ffmpeg for other outputs."""

from __future__ import annotations

from pathlib import Path

import imageio_ffmpeg

# sh, with "$real" the real ffmpeg and "$out" the output file
DIES_MID_WRITE = (
    'head -c 64 > /dev/null; printf "part of an MP4" > "$out"; '
    'echo "Error writing output: No space left on device" >&2; exit 1'
)
FAILS_AT_CLOSE = (  # x264 writes most of a short file, and its index, after the last frame
    '"$real" "$@"; printf "part" > "$out"; '
    'echo "[out#0/mp4] Error closing file: No space left on device" >&2; exit 1'
)
STALLS = "cat > /dev/null; exec sleep 60"  # exec: a kill reaches the process holding the pipes
STALLS_MID_WRITE = "head -c 64 > /dev/null; exec sleep 60"  # its disk stalled: it takes no more frames


def fake_ffmpeg(folder: str | Path, failure: str, only: str = "") -> str:
    """The script's path: `failure` for an output whose path holds `only` (any output when empty)."""
    real = imageio_ffmpeg._utils._get_ffmpeg_exe()  # not IMAGEIO_FFMPEG_EXE: that may be this script
    script = Path(folder) / "fake-ffmpeg"
    script.write_text(
        f'#!/bin/sh\nreal="{real}"\nfor out; do :; done\n'
        f'case "$out" in\n  *{only}*) {failure} ;;\n  *) exec "$real" "$@" ;;\nesac\n'
    )
    script.chmod(0o755)
    return str(script)
