"""constraints.txt: every package Ithaca and its tests need, pinned at the version this environment runs, so a
fresh setup (scripts/setup.sh, CI, the Docker image) installs what the suite last passed with, not whatever a
registry published since.

    .venv/bin/python scripts/lock.py          # rewrite it from .venv (after a deliberate upgrade)
    .venv/bin/python scripts/lock.py --check  # exit 1 when it differs (tests/test_lock.py)

The walk starts at Ithaca's requirements with its test extra and follows each installed package's own. torch
is left out with all it alone pulls in (sympy, networkx, CUDA libraries...): the torch build varies by
machine (CPU here, CUDA on GPU boxes, another release where ITHACA_TORCH_SPEC says) and brings its own
requirements. Triton too (setup.sh pins it where torch brought none).
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
OWN = ("torch", "triton")  # installed by setup.sh's own pins, per machine
HEADER = "# Written by scripts/lock.py from the environment the suite passed in; do not edit by hand.\n"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist_name: str, extras: set[str]) -> list[Requirement]:
    found = []
    for line in distribution(dist_name).requires or []:
        req = Requirement(line)
        env = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(e) for e in env):
            found.append(req)
    return found


def pins() -> dict[str, str]:
    """{normalised name: installed version} of everything reached from ithaca[test], torch's tree apart."""
    seen: dict[str, str] = {}
    walked: set[tuple[str, frozenset[str]]] = set()  # asked for again with other extras: walked again
    todo = [(r, frozenset(r.extras)) for r in _requires("ithaca", {"test"})]
    while todo:
        req, extras = todo.pop()
        name = _name(req.name)
        if name in OWN or (name, extras) in walked:
            continue
        walked.add((name, extras))
        try:
            seen[name] = distribution(req.name).version
        except PackageNotFoundError:
            raise SystemExit(f"{req.name} (as {req}) is not installed: run scripts/setup.sh") from None
        todo += [(r, frozenset(r.extras)) for r in _requires(req.name, set(extras))]
    return seen


def render() -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins().items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with constraints.txt instead of writing it")
    args = p.parse_args()
    text = render()
    if not args.check:
        LOCK.write_text(text)
        return 0
    locked, here = set(LOCK.read_text().splitlines()), set(text.splitlines())
    if locked == here:
        return 0
    pinned, installed = (" ".join(sorted(d)) or "nothing else" for d in (locked - here, here - locked))
    print(f"constraints.txt pins {pinned}; this environment has {installed}. scripts/setup.sh installs the "
          "pins; after a deliberate upgrade or a new dependency, scripts/lock.py writes them anew.",
          file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main())
