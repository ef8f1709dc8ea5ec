"""Deployment files, checked without a Docker engine: compose validation by docker-compose, the settings an
8×GPU box needs, no committed secret, and the server started exactly as the container's entrypoint would."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testing.server_process import REPO, ServerProcess

DEPLOY = os.path.join(REPO, "deploy")
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.replicas.yml")
# what docker-compose.boxes.yml insists an operator sets (it refuses to start without them)
BOXES_ENV = {
    "ITHACA_STORE": "postgresql://ithaca@db.internal:5432/ithaca",
    "ITHACA_SHARED_VIDEOS_HOST_DIR": "/mnt/ithaca-videos",
    "ITHACA_INSTANCE": "box-a",
    "ITHACA_DB_PASSWORD": "secret",
}


def _compose(name: str) -> dict:
    with open(os.path.join(DEPLOY, name)) as f:
        return yaml.safe_load(f)


def _services(name: str) -> dict:
    return _compose(name)["services"]


def _dockerfile() -> str:
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        return f.read()


def _dockerfile_env() -> dict[str, str]:
    """The image's ENV settings (`ENV A=1 \\ B=2` blocks), `$VAR` references left as written."""
    text = _dockerfile().replace("\\\n", " ")
    env = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(item.split("=", 1) for item in shlex.split(line[4:]))
    return env


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", str(duration)))


def _docker_compose_config(name: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing; .ci/run installs Debian's docker-compose")
        pytest.skip("Debian's docker-compose is not installed here (CI installs it)")
    return subprocess.run(
        [exe, "-f", os.path.join(DEPLOY, name), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | (env or {}),
    )


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_docker_compose_validates(name):
    out = _docker_compose_config(name)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert resolved["services"], "no services after resolution"


def test_boxes_share_one_postgresql_store_and_one_videos_folder():
    """docker-compose.boxes.yml: each box's `ithaca` is the one-box service (GPUs, NCCL settings, health
    check) plus the shared PostgreSQL store, a shared videos folder and its own instance name; the settings
    that must be given are refused when missing. The database box's file (docker-compose.db.yml) needs its
    password alone (under the boxes' file it needed every GPU box's settings too)."""
    out = _docker_compose_config("docker-compose.boxes.yml", BOXES_ENV)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    box, one_box = services["ithaca"], _services("docker-compose.yml")["ithaca"]
    for key in ("deploy", "ipc", "ulimits", "healthcheck", "stop_grace_period"):
        assert box[key] == one_box[key], key
    env = box["environment"]
    assert env["ITHACA_STORE"] == BOXES_ENV["ITHACA_STORE"] and env["ITHACA_INSTANCE"] == "box-a"
    assert f"{BOXES_ENV['ITHACA_SHARED_VIDEOS_HOST_DIR']}:{env['ITHACA_RESULTS_DIR']}:rw" in box["volumes"]
    for missing in BOXES_ENV:
        env = {k: v for k, v in BOXES_ENV.items() if k != missing}
        out = _docker_compose_config("docker-compose.boxes.yml", env | {missing: ""})
        assert out.returncode != 0 and missing in out.stderr, (missing, out.stderr)
    only = {name: "" for name in BOXES_ENV} | {"ITHACA_DB_PASSWORD": "secret"}
    out = _docker_compose_config("docker-compose.db.yml", only)
    assert out.returncode == 0, out.stderr
    database = yaml.safe_load(out.stdout)["services"]["postgres"]["environment"]
    assert database["POSTGRES_PASSWORD"] == box["environment"]["PGPASSWORD"] == "secret"
    assert database["POSTGRES_DB"] == "ithaca" and BOXES_ENV["ITHACA_STORE"].endswith("/ithaca")
    out = _docker_compose_config("docker-compose.db.yml", only | {"ITHACA_DB_PASSWORD": ""})
    assert out.returncode != 0 and "ITHACA_DB_PASSWORD" in out.stderr


def test_every_setting_the_deploy_guide_lists_reaches_the_container():
    """deploy/.env fills only the `${...}` that an `environment:` line names: a setting of the guide's table
    without its line was dropped without a word (ITHACA_WARMUP, ITHACA_DTYPE, ITHACA_VAE_DTYPE...)."""
    with open(os.path.join(DEPLOY, "README.md")) as f:
        guide = f.read()
    table = guide[guide.index("## Settings") :]
    table = table[: table.index("\n## ")]
    listed = {name for row in table.splitlines() if row.startswith("| `ITHACA")
              for name in re.findall(r"`(ITHACA_[A-Z_]+)`", row.split("|")[1])}  # fmt: skip
    assert {"ITHACA_WARMUP", "ITHACA_VAE_DTYPE", "ITHACA_STORE"} <= listed
    for name in COMPOSE_FILES:
        for service, svc in _services(name).items():
            given = set(svc["environment"])
            assert listed <= given, (name, service, sorted(listed - given))
    # and each from its own variable in .env, but those the guide says the files make: an ITHACA_MODEL_PATH
    # set there was dropped in silence (the files make it of ITHACA_MODEL_DIR)
    replicas = {"ITHACA_MODEL_PATH", "ITHACA_NPROC", "ITHACA_INSTANCE"}
    made = {"docker-compose.yml": {"ITHACA_MODEL_PATH"}, "docker-compose.replicas.yml": replicas,
            "docker-compose.boxes.yml": {"ITHACA_MODEL_PATH"}}  # fmt: skip
    exceptions = (
        "`ITHACA_MODEL_PATH` (`/models/$ITHACA_MODEL_DIR`",
        "`ITHACA_NPROC` (4",
        "`ITHACA_INSTANCE` (",
    )
    for said in exceptions:
        assert said in guide, said
    marked = {name: f"from-env-{name.lower()}" for name in listed}
    for name, own in made.items():
        out = _docker_compose_config(name, BOXES_ENV | marked)
        for service, svc in yaml.safe_load(out.stdout)["services"].items():
            if "ITHACA_NPROC" in svc.get("environment", {}):  # a server's, not the database's
                wrong = {n for n in listed - own if svc["environment"].get(n) != marked[n]}
                assert not wrong, (name, service, sorted(wrong))
    substituted = set()
    for path in glob.glob(os.path.join(DEPLOY, "docker-compose*.yml")):
        with open(path) as f:
            substituted |= set(re.findall(r"\$\{(ITHACA_[A-Z_]+)", f.read()))
    with open(os.path.join(DEPLOY, "env.example")) as f:  # where an operator looks for them: it named 19
        example = set(re.findall(r"^#? ?(ITHACA_[A-Z_]+)=", f.read(), re.M))
    assert substituted <= example, sorted(substituted - example)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_has_what_an_8_gpu_box_needs(name):
    services = _services(name)
    gpus_claimed = []
    for svc_name, svc in services.items():
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), svc_name
        gpus_claimed += [i for d in devices for i in d.get("device_ids", [])]
        assert all(d.get("count") == "all" or d.get("device_ids") for d in devices)
        # NCCL needs shared memory between ranks and unlimited locked memory.
        assert svc.get("ipc") == "host" or svc.get("shm_size"), svc_name
        assert svc["ulimits"]["memlock"] == -1
        # the loopback peer's name answered without DNS (an air-gapped box: 10 s per rank at start otherwise)
        assert "ipv4-loopback:::ffff:127.0.0.1" in svc["extra_hosts"], svc_name
        assert svc["restart"] in ("always", "unless-stopped")
        env = svc["environment"]
        for key in ("ITHACA_MODEL_PATH", "ITHACA_NPROC", "ITHACA_ULYSSES", "ITHACA_CFG", "ITHACA_COMM"):
            assert key in env, (svc_name, key)
        # The stop grace period must cover the server's own drain of a running job.
        grace = float(re.sub(r"\$\{ITHACA_SHUTDOWN_GRACE:-(\d+)\}", r"\1", str(env["ITHACA_SHUTDOWN_GRACE"])))
        assert _seconds(svc["stop_grace_period"]) > grace
        health = svc["healthcheck"]
        assert "/ready" in " ".join(health["test"]) and _seconds(health["start_period"]) >= 300
        volumes = svc["volumes"]
        assert any(v.endswith(":/models:ro") for v in volumes), "weights mounted read-only"
        assert any(re.search(r":/data(:rw)?$", v) for v in volumes), "a volume for jobs and videos"
    assert len(gpus_claimed) == len(set(gpus_claimed)), "two replicas claim the same GPU"
    if len(services) > 1:  # replicas share one job store and must tell their jobs apart
        instances = {svc["environment"]["ITHACA_INSTANCE"] for svc in services.values()}
        assert len(instances) == len(services)


def test_the_installed_package_holds_every_file_it_reads():
    """The image installs the package (`pip install .`): a data file its package-data leaves out is missing
    there alone (the page's icon was)."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    for package, folder in (("server", "web"), ("dit", "tiny/model")):
        root = Path(REPO, package)
        data = {path for path in (root / folder).rglob("*") if path.is_file() and path.suffix != ".py"}
        installed = {path for pattern in package_data[package] for path in root.glob(pattern)}
        assert data and data <= installed, sorted(str(path.relative_to(root)) for path in data - installed)


def test_dockerfile_runs_the_server_as_non_root_with_a_ready_healthcheck():
    text = _dockerfile()
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*--start-period", text, re.M) and "/ready" in text
    assert re.search(r'^ENTRYPOINT \["ithaca", "serve"\]', text, re.M)
    assert re.search(r"^ARG FLASH_ATTN=0", text, re.M), "flash-attn is an opt-in build argument"
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+", text, re.M)


def test_no_secret_is_committed():
    tracked = subprocess.run(
        ["git", "ls-files", "deploy"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "deploy/.env" not in tracked
    for path in tracked:
        with open(os.path.join(REPO, path)) as f:
            for line in f:
                m = re.match(r"\s*(?:ENV\s+)?ITHACA_API_KEY(?:=|:\s)\s*(\S*)", line)
                if m:  # only empty, a ${...} reference, or the documented placeholder
                    assert m.group(1) in ("", "change-me") or m.group(1).startswith("${"), (path, line)
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=REPO)
    assert ignored.returncode == 0, "deploy/.env must be git-ignored"


def _container_env(tmp_path) -> dict[str, str]:
    """The environment the container's entrypoint sees, moved to this CPU machine: the image's ENV and the
    compose service's environment with its defaults, then only what a CPU box must differ in."""
    env = dict(_dockerfile_env())
    for key, value in _services("docker-compose.yml")["ithaca"]["environment"].items():
        env[key] = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
    env.pop("PATH", None)
    env.pop("VIRTUAL_ENV", None)
    env.update(
        ITHACA_MODEL_PATH="",  # no weights here: empty means unset, so the tiny preset serves
        ITHACA_DEVICE="cpu",
        ITHACA_DTYPE="float32",
        ITHACA_NPROC="2",
        ITHACA_HOST="127.0.0.1",
        ITHACA_DATA_DIR=str(tmp_path),
        ITHACA_API_KEY="deploy-test-key",
    )
    return env


@pytest.mark.slow  # a real server
def test_server_starts_from_the_container_environment(tmp_path):
    env = _container_env(tmp_path)
    assert {env[f"ITHACA_{k}"] for k in ("ULYSSES", "RING", "CFG", "COMM")} == {"auto"}
    srv = ServerProcess(tmp_path, env=env, entrypoint_only=True)
    try:
        srv.wait("/ready", timeout=180)
        assert srv.client.get("/ready").status_code == 200
        assert srv.client.get("/ready", headers={"Authorization": ""}).status_code == 401
    finally:
        srv.stop()
