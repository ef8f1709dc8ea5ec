"""Start-up on a box without DNS: seconds until one machine's ranks meet, torch's launcher against
parallel.local_group, and `ithaca serve --nproc 1` (tiny model) from start to /ready; here as the box is, and
in namespaces where the host name is in no hosts file and the DNS server never answers (testing/no_dns.py),
with and without the IPv4-mapped loopback address named in /etc/hosts. Needs root (namespaces).

    python bench/startup_dns.py [--timeout 120]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.entry import run_main  # noqa: E402
from parallel.local_group import local_group  # noqa: E402
from testing.no_dns import run_without_dns, unavailable  # noqa: E402

RANK = """
import torch, torch.distributed as dist
{join}
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()  # a gloo group left to the interpreter's exit may abort
"""
# how each script's ranks meet: torch's launcher, env://; parallel.local_group's, through init_parallel
JOIN = {"plain": 'dist.init_process_group("gloo")', "rank": "import parallel; parallel.init_parallel()"}


def _serve_once(data_dir: str, timeout: float) -> None:
    """Inside the box: `ithaca serve --nproc 1`, wait for /ready, print the seconds, stop it."""
    from testing.server_process import ServerProcess

    start = time.monotonic()
    srv = ServerProcess(data_dir, "--nproc", "1")
    try:
        srv.wait(timeout=timeout)
        print(f"{time.monotonic() - start:.1f}")
    finally:
        srv.stop()


def _cell(rc, seconds: float, out: str, timeout: float, questions: int | None) -> str:
    """Seconds: what the command printed last (serve's start to /ready, without its stop), else its run."""
    last = (out.strip().splitlines() or [""])[-1]
    seconds = float(last) if rc == 0 and last.replace(".", "", 1).isdigit() else seconds
    if rc is not None and rc != 0:
        text = f"failed ({rc})"
    else:
        text = f"{seconds:.1f} s" if rc == 0 else f"not done after {timeout:g} s"
    return text if questions is None else f"{text}, {questions} DNS questions"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a start-up counts as hung")
    p.add_argument("--serve-once", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_once:
        return _serve_once(args.serve_once, args.timeout)
    if reason := unavailable():
        sys.exit(f"startup_dns: {reason}")
    commands = {
        "torch.distributed.run --standalone, 2 ranks meet": lambda d: [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            f"{d}/plain.py"],
        "parallel.local_group, 2 ranks meet": lambda d: [*local_group(2), f"{d}/rank.py"],
        "ithaca serve --nproc 1: start to /ready": lambda d: [
            sys.executable, os.path.abspath(__file__), "--serve-once", f"{d}/serve", "--timeout",
            str(args.timeout)],
    }  # fmt: skip
    print("| start-up | DNS answers (this box) | DNS never answers | never answers, loopback in /etc/hosts |")
    print("| --- | ---: | ---: | ---: |")
    for name, command in commands.items():
        cells = []
        with tempfile.TemporaryDirectory() as d:
            for script, join in JOIN.items():
                with open(f"{d}/{script}.py", "w") as f:
                    f.write(RANK.format(join=join))
            start = time.monotonic()
            try:
                done = subprocess.run(command(d), capture_output=True, text=True, timeout=args.timeout)
                rc, out = done.returncode, done.stdout
            except subprocess.TimeoutExpired:
                rc, out = None, ""
            cells.append(_cell(rc, time.monotonic() - start, out, args.timeout, None))
            for named in (False, True):
                run = run_without_dns(
                    command(d), d, answer="silent", name_loopback=named, timeout=args.timeout
                )
                cells.append(_cell(run.rc, run.seconds, run.out, args.timeout, len(run.asked)))
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    run_main(main)
