"""The `ithaca` console script end to end: `generate` writes a playable MP4, bad input exits 2 with the field
named, `parity --nproc 2` compares 1 rank with 2 (torchrun subprocesses, gloo on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from dit.video import read_mp4

ITHACA = shutil.which("ithaca") or str(Path(sys.executable).parent / "ithaca")


def _run(*args, cwd):
    return subprocess.run([ITHACA, *args], capture_output=True, text=True, cwd=cwd, timeout=240)


def test_generate_writes_the_mp4_as_asked(tmp_path):
    proc = _run("generate", "a red fox running through snow", "--out", "video.mp4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    video = read_mp4(tmp_path / "video.mp4")
    assert video.frames.shape == (9, 64, 64, 3)  # tiny's defaults
    assert (video.fps, video.codec, video.pix_fmt) == (16.0, "h264", "yuv420p")
    assert "wrote video.mp4: 9 frames 64x64 @ 16 fps" in proc.stdout

    proc = _run("generate", "a fox", "--out", "small.mp4", "--frames", "5", "--height", "32", "--width", "48",
                "--steps", "2", "--fps", "8", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    video = read_mp4(tmp_path / "small.mp4")
    assert (video.frames.shape, video.fps) == ((5, 32, 48, 3), 8.0)


def test_generate_rejects_bad_input(tmp_path):
    proc = _run("generate", "a fox", "--frames", "8", cwd=tmp_path)
    assert proc.returncode == 2
    assert "num_frames must be 4k+1 between 5 and 33, got 8" in proc.stderr
    assert not (tmp_path / "video.mp4").exists()


def test_parity_two_ranks(tmp_path):
    proc = _run("parity", "--nproc", "2", "--modes", "alltoall,cfg,hybrid", "--steps", "2", "--frames", "5",
                "--height", "32", "--width", "48", "--json", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    rows = {row["mode"]: row for row in report["rows"]}
    assert report["ok"] and rows["alltoall"]["status"] == rows["cfg"]["status"] == "ok"
    assert rows["alltoall"]["layout"] == "2x1x1" and rows["cfg"]["layout"] == "1x1x2"
    assert rows["cfg"]["latents_rel"] <= 1e-5 and rows["cfg"]["frames_max_abs"] <= 1
    assert rows["hybrid"]["status"] == "skipped"  # needs 4 ranks


def test_generate_picks_the_hunyuan_family_from_the_preset(tmp_path):
    proc = _run("generate", 'a neon sign reading "OPEN"', "--preset", "tiny-joint", "--out", "joint.mp4",
                "--frames", "5", "--height", "32", "--width", "48", "--steps", "2", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_mp4(tmp_path / "joint.mp4").frames.shape == (5, 32, 48, 3)
    proc = _run("generate", "a fox", "--preset", "tiny-joint", "--height", "40", cwd=tmp_path)
    assert proc.returncode == 2 and "height must be a multiple of 16" in proc.stderr  # ×16 VAE
