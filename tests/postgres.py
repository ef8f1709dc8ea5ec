"""A throwaway PostgreSQL cluster for the store tests: `initdb` into a temporary folder, served on a Unix
socket in that folder only (no TCP port), stopped and removed at the end of the session.

Skipped when the PostgreSQL server binaries are not installed (Debian: `apt-get install postgresql`),
unless ITHACA_REQUIRE_POSTGRES=1 (CI sets it): then their absence fails the tests.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile

import pytest

REQUIRED = os.environ.get("ITHACA_REQUIRE_POSTGRES") == "1"


def _bin_dir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


class Cluster:
    """`listen`: also serve TCP on this address (port 5432), trusting `trust_net` (the two-box tests' own
    network); `wrap(argv)`: how to run its tools (in a network namespace: `Hosts.argv`)."""

    def __init__(self, bin_dir: str, listen: str = "", trust_net: str | None = None, wrap=lambda argv: argv):
        self.bin_dir, self.listen, self.wrap = bin_dir, listen, wrap
        self.dir = tempfile.mkdtemp(prefix="ithaca-pg-")  # short: a socket path has at most 107 bytes
        self.data = os.path.join(self.dir, "data")
        # PostgreSQL refuses to run as root: as root, run it as the `postgres` user the package creates
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.prefix:
            shutil.chown(self.dir, "postgres")
        self._counter = itertools.count()
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        if trust_net:
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
                f.write(f"host all all {trust_net} trust\n")
        self.start()

    def start(self) -> None:
        options = f"-k {self.dir} -c listen_addresses='{self.listen}' -c fsync=off -c full_page_writes=off"
        self._run(
            "pg_ctl", "-D", self.data, "-o", options, "-w", "-l", os.path.join(self.dir, "log"), "start"
        )

    def pause(self) -> None:
        """Stop the server as an operator would (`pg_ctl -m fast stop`: every connection closed); `start`
        serves the same data again."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def cut_connections(self, url: str) -> None:
        """End every other connection to `url`'s database (`pg_terminate_backend`), as a failover does."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as db:
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    def _run(self, tool: str, *args: str) -> None:
        argv = self.wrap([*self.prefix, os.path.join(self.bin_dir, tool), *args])
        subprocess.run(argv, check=True, capture_output=True)

    def url(self, database: str = "postgres", tcp: bool = False) -> str:
        """The URL of `database`, over the Unix socket or (`tcp`) over the network at `listen`."""
        if tcp:
            return f"postgresql://postgres@{self.listen}:5432/{database}"
        return f"postgresql://postgres@/{database}?host={self.dir}"

    def new_database(self, tcp: bool = False) -> str:
        """A fresh, empty database (made over the socket); returns its URL (`url`'s `tcp`)."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._counter)}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name, tcp)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"ITHACA_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def started_cluster(**kwargs):
    """A running `Cluster(bin_dir, **kwargs)`, stopped and removed on leaving; skipped (or failed under
    ITHACA_REQUIRE_POSTGRES=1) where there is none."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'psycopg[binary]')")
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable(
            "the PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql"
        )
    try:
        cluster = Cluster(bin_dir, **kwargs)
    except subprocess.CalledProcessError as e:
        _unavailable(f"could not start a PostgreSQL cluster: {e.stderr.decode(errors='replace')[-500:]}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres_cluster():
    """The session's cluster (skipped, or failed under ITHACA_REQUIRE_POSTGRES=1, where there is none)."""
    with started_cluster() as cluster:
        yield cluster
