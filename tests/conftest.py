import pytest

from testing.server_process import ServerProcess
from tests import distributed
from tests.postgres import postgres_cluster  # noqa: F401  (the PostgreSQL store tests' cluster)


@pytest.fixture(scope="session", autouse=True)
def _shutdown_dist_pool():
    yield
    distributed.shutdown()


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """`ithaca serve` of the trained tiny model: a real worker group of 2 CPU ranks (gloo), an API key, at
    most 4 jobs queued. One for the session: the tests that only submit jobs share it (test_server_e2e.py,
    test_web_page.py), as starting a group costs ~20 s on 2 cores."""
    srv = ServerProcess(tmp_path_factory.mktemp("tiny-server"), "--max-queue", "4", "--nproc", "2",
                        api_key="tiny-server-key")  # fmt: skip
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()
