"""constraints.txt pins what the suite runs with, and every way of installing Ithaca installs those pins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_constraints_pin_the_packages_this_suite_runs_with():
    """A dependency added to pyproject.toml, or an upgrade in .venv, without scripts/lock.py run after it."""
    out = subprocess.run([sys.executable, "scripts/lock.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_setup_and_the_image_install_with_the_constraints():
    assert "-c constraints.txt -e '.[test]'" in (ROOT / "scripts" / "setup.sh").read_text()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "constraints.txt ./" in dockerfile and "pip install -c constraints.txt ." in dockerfile
