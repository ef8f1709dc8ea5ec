"""Jobs that resume where they stopped, the server side: the store records `resumed_from_step`, the sweep
keeps only the checkpoints of jobs that may run again, and a server killed mid-job (API and group together)
is followed by one that resumes the job (with its LoRA) from its checkpoint and ignores, with a log line, a
checkpoint made for another request (the same one with another LoRA set included) or malformed. Real
servers (uvicorn, the launcher, 1 rank) running the FAKE INSTANT PIPELINE (testing/fake_pipeline.py, slowed by
ITHACA_FAKE_STEP_S); tests/test_server_faults.py kills a rank of the real tiny model and compares the resumed
video's frames with an uninterrupted run's."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
import torch

from dit.denoise_state import DenoiseState, save_file
from server import videos
from server.store import JobStore
from testing.server_process import FAKE, ServerProcess, wait_until

FLAGS = ["--pipeline-module", FAKE, "--nproc", "1", "--checkpoint-every", "2", "--instance", "resume-box"]
SLOW = {"ITHACA_FAKE_STEP_S": "0.25"}


def test_the_store_records_the_resumed_step_and_each_new_run_clears_it(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job, _ = store.create({"prompt": "a"})
    store.claim("w", "box")
    store.set_resumed(job.id, "w", 4, 10)
    got = store.get(job.id)
    assert (got.resumed_from_step, got.step, got.total_steps, got.progress) == (4, 4, 10, 36)
    store.set_resumed(job.id, "other", 6, 10)  # no longer this worker's: left as it was
    assert store.get(job.id).resumed_from_step == 4
    store.requeue_or_fail(store.get(job.id), max_attempts=3, reason="interrupted")
    assert store.get(job.id).resumed_from_step is None
    store.set_resumed(job.id, "w", 2, 10)  # not running: nothing to record
    assert store.get(job.id).resumed_from_step is None
    store.claim("w", "box")
    assert store.get(job.id).resumed_from_step is None  # from the start unless the worker says otherwise


def test_the_sweep_keeps_the_checkpoints_of_jobs_that_may_run_again(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    folder = str(tmp_path / "videos")
    queued, running, done = (store.create({"prompt": p})[0] for p in "abc")
    for _ in "abc":
        store.claim("w", "box")
    store.requeue_or_fail(store.get(queued.id), max_attempts=2, reason="interrupted")
    store.finish(done.id, "w", "completed", video="c.mp4")
    for name in (queued.id, running.id, done.id, "unknown"):
        os.makedirs(os.path.join(folder, "checkpoints"), exist_ok=True)
        open(videos.checkpoint_path(folder, name), "wb").close()
    removed = videos.sweep(store, folder)
    assert sorted(removed) == sorted([f"{done.id}.pt", "unknown.pt"])
    assert sorted(os.listdir(os.path.join(folder, "checkpoints"))) == sorted(
        [f"{queued.id}.pt", f"{running.id}.pt"]
    )


def test_a_checkpoint_key_holds_the_settings_that_change_the_numbers():
    """The settings part of a job checkpoint's key, as `ithaca serve` takes them (its device as given, the
    LoRAs read, the cache as written): what earlier versions wrote, so their checkpoints still resume. The
    VAE decoder's dtype is not part of it: it changes no latents."""
    import argparse

    from dit.settings import checkpoint_key
    from server.config import add_arguments, from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"ITHACA_DEVICE": "cuda", "ITHACA_LORA": "a.safetensors:0.5", "ITHACA_CACHE": "fbcache",
           "ITHACA_QUANT": "fp8", "ITHACA_VAE_DTYPE": "bfloat16"}  # fmt: skip
    config = from_args(parser.parse_args(["--dtype", "bfloat16", "--compile"]), environ=env)
    assert checkpoint_key(config.pipeline) == {
        "device": "cuda", "dtype": "bfloat16", "attn_backend": "auto", "text_encoder_device": None,
        "compile": True, "sampler": None, "flow_shift": None, "timesteps": None, "quant": "fp8",
        "loras": (("a.safetensors", 0.5),), "cache": "fbcache", "comm": "auto",
    }  # fmt: skip


@pytest.mark.slow
def test_a_killed_server_resumes_its_job_and_ignores_a_foreign_checkpoint(tmp_path):
    folder = str(tmp_path / "videos")
    (tmp_path / "loras").mkdir()
    for name in ("a", "b"):  # the fake pipeline's catalogue: the names alone
        (tmp_path / "loras" / f"{name}.safetensors").touch()
    flags = [*FLAGS, "--lora-dir", str(tmp_path / "loras"), "--lora-patience", "0"]  # oldest first
    first = ServerProcess(tmp_path, *flags, env=SLOW)
    try:
        first.wait()
        job = first.submit(prompt="resume me", num_inference_steps=12, loras=[{"name": "a"}])
        other = first.submit(prompt="queued behind it", num_inference_steps=4)
        torn = first.submit(prompt="a malformed checkpoint", num_inference_steps=2)
        twin = first.submit(prompt="resume me", num_inference_steps=12, loras=[{"name": "b"}])
        path = videos.checkpoint_path(folder, job["id"])
        wait_until(lambda: first.client.get(f"/jobs/{job['id']}").json()["step"] >= 5, 30, "step 5")
        saved = torch.load(path, weights_only=True)["state"]["step"]
        assert saved in (2, 4)  # every 2 steps, none yet after step 5's
        stranger = DenoiseState(
            step=3, latents=torch.zeros(1), scheduler={}, generator=torch.Generator().get_state()
        )
        save_file(videos.checkpoint_path(folder, other["id"]), stranger, {"model": "another"})
        torch.save({"format": 1, "state": {}}, videos.checkpoint_path(folder, torn["id"]))  # loads: no key
    finally:
        first.stop(signal.SIGKILL)  # the API and its group, mid-job
    # the twin's request is the job's but for its LoRA set: the job's checkpoint is not the twin's
    shutil.copy(path, videos.checkpoint_path(folder, twin["id"]))

    second = ServerProcess(tmp_path, *flags, env=SLOW)
    try:
        second.wait()
        resumed, fresh, started_over, twin = (second.wait_job(j["id"]) for j in (job, other, torn, twin))
        assert resumed["status"] == "completed" and resumed["attempts"] == 2
        assert resumed["request"]["loras"] == [["a", 1.0]] and twin["request"]["loras"] == [["b", 1.0]]
        assert twin["status"] == "completed" and twin["resumed_from_step"] is None
        assert (
            f"job {twin['id']}: its checkpoint is ignored, starting from the first step: made for another"
            in (second.log())
        )
        assert (
            resumed["resumed_from_step"] >= saved
            and resumed["timings"]["steps"] == 12 - resumed["resumed_from_step"]
        )
        assert fresh["status"] == "completed" and fresh["resumed_from_step"] is None
        assert "its checkpoint is ignored, starting from the first step: made for another" in second.log()
        assert started_over["status"] == "completed" and started_over["resumed_from_step"] is None
        assert "its checkpoint is ignored, starting from the first step: malformed (no readable key)" in (
            second.log()
        )
        assert not os.listdir(os.path.join(folder, "checkpoints"))  # each went with its job

        running = second.submit(prompt="cancel me", num_inference_steps=40)
        wait_until(lambda: os.path.exists(videos.checkpoint_path(folder, running["id"])), 30, "a checkpoint")
        assert second.client.delete(f"/jobs/{running['id']}").status_code == 200
        assert second.wait_job(running["id"])["status"] == "cancelled"
        assert not os.path.exists(videos.checkpoint_path(folder, running["id"]))
    finally:
        second.stop()


def test_a_checkpoint_the_full_disk_refused_is_logged_as_that(tmp_path, monkeypatch, caplog):
    """torch.save's own error on a full disk is "unexpected pos": the warning says the disk is full."""
    from types import SimpleNamespace

    from server.writers import CheckpointWriter

    def full(obj, name):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2112 vs 2006")

    caplog.set_level("INFO", logger="ithaca.worker")
    real_save = torch.save
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr("shutil.disk_usage", lambda folder: SimpleNamespace(free=0))
    writer = CheckpointWriter(str(tmp_path))
    state = DenoiseState(step=1, latents=torch.zeros(1), scheduler={}, generator=None)
    for step, save in ((1, full), (2, full), (3, real_save), (4, full)):  # said once a stretch, not a step
        monkeypatch.setattr(torch, "save", save)
        writer.submit("a" * 32, step, (state, {}))
        assert writer.flush(10)
    said = [r.getMessage() for r in caplog.records if "written" in r.getMessage()]
    full_at = f" not written: its disk is full (0 KiB free in {tmp_path}) (said once until one is written)"
    assert said == [f"checkpoint of job {'a' * 32} at step 1{full_at}",
                    f"checkpoints are written again (job {'a' * 32}, step 3)",
                    f"checkpoint of job {'a' * 32} at step 4{full_at}"]  # fmt: skip
