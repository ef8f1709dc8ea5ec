"""`ithaca serve` settings: flags, ITHACA_* environment variables, defaults, and what reaches the workers."""

from __future__ import annotations

import argparse

import pytest

from server.config import ServeConfig, add_arguments, from_args


def _parse(argv: list[str], env: dict) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), environ=env)


def test_defaults_env_and_flag_precedence():
    default = _parse([], {})
    assert (default.preset, default.device, default.nproc, default.host, default.port) == (
        "tiny",
        "cpu",
        2,
        "127.0.0.1",
        8000,
    )
    env = {
        "ITHACA_NPROC": "8",
        "ITHACA_ULYSSES": "8",
        "ITHACA_API_KEY": "",
        "ITHACA_WORKERS": "0",
        "ITHACA_MODEL_PATH": "/models/wan",
        "ITHACA_JOB_TIMEOUT": "90.5",
        "ITHACA_CFG": "2",
    }
    config = _parse(["--cfg", "1"], env)
    assert (config.nproc, config.ulysses, config.cfg, config.job_timeout) == (8, 8, 1, 90.5)
    assert config.api_key is None and config.workers is False and config.model == "/models/wan"
    argv = config.worker_argv()
    assert argv[argv.index("--model-path") + 1] == "/models/wan" and "--api-key" not in argv
    assert _parse(["--no-workers"], {"ITHACA_WORKERS": "1"}).workers is False


def test_a_bad_value_names_its_variable_or_flag(capsys):
    for env, says in (
        ({"ITHACA_NPROC": "abc"}, "ITHACA_NPROC: 'abc' is not an integer"),
        ({"ITHACA_JOB_TIMEOUT": "soon"}, "ITHACA_JOB_TIMEOUT: 'soon' is not a finite number"),
        ({"ITHACA_JOB_TIMEOUT": "nan"}, "ITHACA_JOB_TIMEOUT: 'nan' is not a finite number"),
        ({"ITHACA_JOB_TIMEOUT": "-1"}, "ITHACA_JOB_TIMEOUT: must be more than 0, not -1.0"),
        ({"ITHACA_POLL_INTERVAL": "0"}, "ITHACA_POLL_INTERVAL: must be more than 0, not 0.0"),
        ({"ITHACA_MAX_QUEUE": "-5"}, "ITHACA_MAX_QUEUE: must be 1 or more, not -5"),
        ({"ITHACA_PORT": "70000"}, "ITHACA_PORT: must be 0 to 65535, not 70000"),
        (
            {"ITHACA_LOG_LEVEL": "verbose"},
            "ITHACA_LOG_LEVEL: must be one of debug, info, warning, error, critical, not 'verbose'",
        ),
        (
            {"ITHACA_WORKERS": "maybe"},
            "ITHACA_WORKERS: 'maybe' is not a boolean (1/0, true/false, yes/no, on/off)",
        ),
        ({"ITHACA_MAX_BATCH": "0"}, "ITHACA_MAX_BATCH: must be 1 or more, not 0"),
        ({"ITHACA_DATA_DIR": ""}, "ITHACA_DATA_DIR: must not be empty, not ''"),
        ({"ITHACA_INSTANCE": " "}, "ITHACA_INSTANCE: must not be empty, not ' '"),
        ({"ITHACA_RESTART_BUDGET": "0"}, "ITHACA_RESTART_BUDGET: must be 1 or more, not 0"),  # it acted as 1
    ):
        with pytest.raises(ValueError) as e:
            _parse([], env)
        assert str(e.value) == says
    with pytest.raises(SystemExit):
        _parse(["--ring", "two"], {})
    assert "argument --ring: 'two' is not an integer" in capsys.readouterr().err
    # a store each connection would see afresh (every request a 500), or a file named after the query
    for url in (
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite:///jobs/",
        "sqlite:////srv/jobs.db?mode=ro",
        "sqlite:///.",
    ):
        with pytest.raises(ValueError, match="must name a file the server's processes share"):
            _parse([], {"ITHACA_STORE": url})
    assert _parse([], {"ITHACA_STORE": "sqlite:////srv/jobs.db"}).db_path == "/srv/jobs.db"


def test_the_workers_read_no_variable_a_flag_overrode():
    """`ITHACA_PORT=abc ithaca serve --port 8001`: the server takes the flag; its worker ranks read the
    environment again for every setting and died three times over (exit 1). What the supervisor sets for
    them (ITHACA_NODE_RANK) they still read."""
    env = {"ITHACA_PORT": "abc", "ITHACA_KEEP_HOURS": "-1", "ITHACA_NPROC": "abc"}
    config = _parse(["--port", "8001", "--keep-hours", "1", "--nproc", "1"], env)
    parser = argparse.ArgumentParser()
    add_arguments(parser, worker_only=True)
    supervisor = {"ITHACA_NNODES": "2", "ITHACA_NODE_RANK": "1"}
    worker = from_args(parser.parse_args(config.worker_argv()), environ=env | supervisor, worker_only=True)
    assert worker.worker_argv() == config.worker_argv() and (worker.nnodes, worker.node_rank) == (2, 1)


def test_an_error_names_the_variable_behind_a_flag(tmp_path, monkeypatch, capsys):
    from server.cli import main

    monkeypatch.setenv("ITHACA_ULYSSES", "3")
    monkeypatch.setenv("ITHACA_DEVICE", "cpu")  # named nowhere in the error: not noted
    assert main(["serve", "--data-dir", str(tmp_path), "--nproc", "2"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("1x1x2 (--ulysses is ITHACA_ULYSSES='3')")
    assert main(["serve", "--data-dir", str(tmp_path), "--nproc", "2", "--ulysses", "3"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("1x1x2")  # the flag's own value: nothing to add


def test_step_cache_default_reaches_the_workers():
    assert _parse([], {}).cache == "off"
    config = _parse([], {"ITHACA_CACHE": "fbcache:0.05"})
    argv = config.worker_argv()
    assert argv[argv.index("--cache") + 1] == "fbcache:0.05"
    with pytest.raises(ValueError, match="ITHACA_CACHE.*threshold"):
        _parse([], {"ITHACA_CACHE": "fbcache:7"})


def test_vae_dtype_reaches_the_workers_and_generate():
    from dit.cli import add_subcommands
    from dit.cli_args import pipeline_config

    assert _parse([], {}).vae_dtype == "float32"
    config = _parse([], {"ITHACA_VAE_DTYPE": "bfloat16"})
    argv = config.worker_argv()
    assert config.vae_dtype == "bfloat16" and argv[argv.index("--vae-dtype") + 1] == "bfloat16"
    worker = argparse.ArgumentParser()
    add_arguments(worker, worker_only=True)
    assert from_args(worker.parse_args(argv), environ={}).pipeline.vae_dtype == "bfloat16"
    assert _parse(["--vae-dtype", "float16"], {"ITHACA_VAE_DTYPE": "bfloat16"}).vae_dtype == "float16"
    generate = argparse.ArgumentParser().add_subparsers()
    add_subcommands(generate)
    args = generate.choices["generate"].parse_args(["a fox", "--vae-dtype", "bfloat16"])
    assert pipeline_config(args).vae_dtype == "bfloat16"
