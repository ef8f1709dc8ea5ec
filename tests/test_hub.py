"""A model by its Hugging Face Hub name (`dit.hub`), offline: a Hub cache laid out as huggingface_hub lays it
out (models--ORG--NAME/snapshots/REV, refs/main) holding the shipped tiny folder, and HF_HUB_OFFLINE=1, so
no test touches the network. `generate` and `serve` take the name; a name that is not cached is one line and
exit 2."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from dit.presets import SHIPPED
from dit.video import read_mp4
from testing.server_process import FAKE, ServerProcess

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--tiny-video"
    shutil.copytree(SHIPPED["tiny"], repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def _ithaca(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *argv], env=os.environ | env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip


@pytest.mark.slow  # real processes
def test_generate_takes_a_hub_name_and_its_folder_defaults(hub_env, tmp_path):
    out = tmp_path / "v.mp4"
    name = f"acme/tiny-video@{REVISION}"
    run = _ithaca(hub_env, "generate", "a red circle moving right", "--model-path", name, "--steps", "2",
                  "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert read_mp4(out).frames.shape == (17, 64, 64, 3)  # the folder's own defaults (its ithaca.json)


@pytest.mark.parametrize(
    ("command", "name"), [("generate", "acme/not-cached"), ("serve", "acme/tiny-video@v9")]
)
def test_a_name_that_is_not_cached_offline_is_one_line(hub_env, command, name):
    argv = [command, "a red circle"] if command == "generate" else [command]
    run = _ithaca(hub_env, *argv, "--model-path", name)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "not in the Hugging Face cache" in line and "HF_HUB_OFFLINE" in line and name in line, line


@pytest.mark.parametrize("name", ["org/na--me", "org/name."])
def test_a_name_the_hubs_rules_refuse_names_the_option(hub_env, monkeypatch, name):
    """huggingface_hub's own words, naming no option (nor, from serve, the variable it came from)."""
    from dit.hub import local_model

    for key, value in hub_env.items():
        monkeypatch.setenv(key, value)
    refused = rf"^--model-path {re.escape(name)}: not a folder here, nor a Hub repository name"
    with pytest.raises(ValueError, match=refused):
        local_model(name)


@pytest.mark.slow  # real processes
def test_serve_takes_a_hub_name(hub_env, tmp_path):
    """The API process resolves the name; its worker group loads the cached folder."""
    srv = ServerProcess(tmp_path, "--pipeline-module", FAKE, "--model-path", "acme/tiny-video", env=hub_env)
    try:
        srv.wait()
        model = srv.client.get("/limits").json()["model"]
        assert model.endswith(os.path.join("models--acme--tiny-video", "snapshots", REVISION)), model
    finally:
        srv.stop()


def test_a_snapshot_a_download_left_incomplete_says_download_it_again(hub_env, tmp_path, monkeypatch):
    """It was refused as a folder lacking a part, named by its cache path, with a copy's advice."""
    from dit.hub import local_model

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--partial" / "snapshots" / REVISION
    shutil.copytree(SHIPPED["tiny"], snapshot)
    shutil.rmtree(snapshot / "vae")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(REVISION)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read at import: no network asked
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    with pytest.raises(ValueError) as e:
        local_model("acme/partial")
    assert str(e.value).startswith("--model-path acme/partial: its cached snapshot ")
    assert "names vae/, which the folder lacks" in str(
        e.value
    ) and "download it again (hf download acme/partial)" in str(e.value)
