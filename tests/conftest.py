import pytest

from tests import distributed


@pytest.fixture(scope="session", autouse=True)
def _shutdown_dist_pool():
    yield
    distributed.shutdown()
