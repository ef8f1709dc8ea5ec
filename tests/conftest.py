import pytest

from tests import distributed
from tests.postgres import postgres_cluster  # noqa: F401  (the PostgreSQL store tests' cluster)


@pytest.fixture(scope="session", autouse=True)
def _shutdown_dist_pool():
    yield
    distributed.shutdown()
