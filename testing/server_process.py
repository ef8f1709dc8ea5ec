"""`ithaca serve` as a real process on a free loopback port (server tests, bench/server_overhead.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = "testing.fake_pipeline"  # the fake instant pipeline (see testing/fake_pipeline.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`ithaca serve --data-dir DIR --port P ...`; logs go to DIR/server-<port>.log."""

    def __init__(
        self,
        data_dir: str,
        *flags: str,
        api_key: str | None = None,
        env: dict | None = None,
        entrypoint_only: bool = False,
        restarts: bool = False,
    ):
        """`entrypoint_only`: no flags at all, as a container's `ithaca serve` entrypoint runs; every setting
        comes from `env` (the port and API key too). `restarts`: the test kills worker groups; otherwise
        `stop` fails on a group that died, which the server's re-queue would hide from the test."""
        self.restarts = restarts
        self.unready_reasons: list[str] = []  # what /ready said while `wait` waited for it
        env = dict(env or {})
        self.data_dir, self.port = str(data_dir), free_port()
        self.api_key = env.get("ITHACA_API_KEY") if entrypoint_only else api_key
        self.url = f"http://127.0.0.1:{self.port}"
        os.makedirs(self.data_dir, exist_ok=True)
        self.log_path = os.path.join(self.data_dir, f"server-{self.port}.log")
        if entrypoint_only:
            env["ITHACA_PORT"] = str(self.port)
            args = []
        else:
            args = ["--data-dir", self.data_dir, "--port", str(self.port), "--log-level", "info", *flags]
            if api_key:
                args += ["--api-key", api_key]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "serve", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_shell_environment() | {"PYTHONUNBUFFERED": "1"} | env,
            )
        self.client = httpx.Client(base_url=self.url, headers=self.headers(), timeout=30)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def wait(self, path: str = "/ready", timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                reply = self.client.get(path)
                if reply.status_code == 200:
                    return
                if path == "/ready" and reply.status_code == 503:  # why not ready, each reason once
                    reason = reply.json()["reason"]
                    self.unready_reasons += [] if reason in self.unready_reasons else [reason]
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{path} not ready after {timeout} s:\n{self.log()[-4000:]}")

    def wait_job(
        self, job_id: str, timeout: float = 120.0, done=("completed", "failed", "cancelled")
    ) -> dict:
        deadline = time.monotonic() + timeout
        job = {"status": "unknown"}
        while time.monotonic() < deadline:
            reply = self.client.get(f"/jobs/{job_id}")
            if reply.status_code != 503:  # the job store did not answer (Retry-After): as a client, retry
                job = reply.json()
                if job["status"] in done:
                    return job
            time.sleep(0.05)
        raise TimeoutError(f"job {job_id} still {job['status']} after {timeout} s:\n{self.log()[-4000:]}")

    def submit(self, **body) -> dict:
        r = self.client.post("/generate", json=body)
        assert r.status_code == 202, r.text
        return r.json()

    def events(self, job_id: str) -> list[tuple[str, dict]]:
        """The job's Server-Sent Events, (name, data) each, to the stream's end."""
        events, name = [], None
        with self.client.stream("GET", f"/jobs/{job_id}/events") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
        return events

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        # a group that died, or a rank that aborted on its way out (a gloo group left to the exit)
        died = re.search(r".*(worker group.* exited with code|ended with signal 6).*", self.log())
        if died and not self.restarts:
            raise AssertionError(f"a worker group died: {died.group(0)}\n{self.log()[-4000:]}")
        return self.proc.returncode


def group_pids(data_dir) -> tuple[list[int], list[int]]:
    """(launcher pids, rank pids) of the worker groups serving `data_dir`, found by their command lines."""
    launchers, ranks = [], []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"server.worker" in argv and str(data_dir).encode() in argv:
            launcher = {b"parallel.local_group", b"parallel.torchrun"} & set(argv)
            (launchers if launcher else ranks).append(int(pid))
    return launchers, ranks


def wait_until(condition, timeout: float, what: str) -> float:
    """Poll `condition()` until true; returns the seconds it took, fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _shell_environment() -> dict[str, str]:
    """This process's environment as an operator's shell would give it: without what torch set in it (an
    earlier test's compile sets TORCHINDUCTOR_CACHE_DIR, which a server's ranks must not inherit)."""
    return {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
