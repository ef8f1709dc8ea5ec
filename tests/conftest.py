import pytest

from testing.server_process import ServerProcess
from tests import distributed
from tests.postgres import postgres_cluster  # noqa: F401  (the PostgreSQL store tests' cluster)
from tests.triton_interpreter import interpreter  # noqa: F401  (the Triton kernel tests' interpreter)


@pytest.fixture(scope="session", autouse=True)
def _shutdown_dist_pool():
    yield
    distributed.shutdown()


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """`ithaca serve` of the trained tiny model: a real worker group of 2 CPU ranks (gloo), an API key, at
    most 4 jobs queued, a LoRA catalogue of one (`glow`, testing/loras.py), a warm-up at 48×80, 9 frames.
    One for the session: the tests that only submit jobs share it (test_server_e2e.py, test_web_page.py), as
    starting a group costs ~20 s on 2 cores."""
    from testing.loras import write_lora

    loras = tmp_path_factory.mktemp("tiny-loras")
    write_lora(loras / "glow.safetensors")
    flags = ("--max-queue", "4", "--nproc", "2", "--lora-dir", str(loras), "--warmup", "48x80x9")
    srv = ServerProcess(tmp_path_factory.mktemp("tiny-server"), *flags, api_key="tiny-server-key")
    try:
        srv.wait()
        srv.first_ready = srv.client.get("/ready").json()  # what the group said when it first was ready
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def tiny_pipe():
    """The trained tiny model on one CPU process, as `generate` loads it but with previews (every 2 steps).
    Shared: tests must not change it."""
    from dit.pipeline import PipelineConfig, load_pipeline

    return load_pipeline(PipelineConfig(model="tiny", device="cpu"))


@pytest.fixture(scope="session")
def tiny_scenes(tiny_pipe):
    """All 72 scenes of the tiny model's language at its defaults (17 frames of 64×64, 12 steps), each read
    back by the detector, with its previews: the model's quality bar (test_tiny_model.py) and its previews'
    colour (test_preview.py) from one set of videos. 18 scenes a batch (tests/test_batch.py holds a batch to
    its solo runs): every video and preview its solo run's bit for bit, in 11 s instead of 18 (measured on
    the 2-core CPU box, 2026-11-28)."""
    from dit.tiny.language import all_scenes
    from dit.tiny.score import generate_and_read

    return generate_and_read(tiny_pipe, all_scenes(), batch=18)
