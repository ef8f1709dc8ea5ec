"""The bench scripts refuse what cannot run in one line (argparse's exit 2) instead of a traceback, an
out-of-memory kill or a hang: a model too big for the device, a device this machine lacks, a count of 0,
and a case whose process died."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from bench import common, forward, vae_attention


def _refusal(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_model_that_cannot_fit_or_a_device_not_here_is_one_line(capsys, monkeypatch):
    """wan2.1-14b on a CPU box took all its memory until the kernel killed the process."""
    monkeypatch.setattr(common, "_available_host_memory", lambda: 2**30)
    said = _refusal(capsys, forward.main, ["--preset", "wan2.1-1.3b", "--device", "cpu"])
    assert "error: 2 models of 1.42 B parameters in float32 need 10.6 GiB" in said
    assert said.endswith("cpu has 1.0 GiB free (try --layers or a smaller --preset)")
    if not torch.cuda.is_available():
        said = _refusal(capsys, forward.main, ["--device", "cuda"])
        assert "error: --device cuda: no CUDA device here (torch" in said
    assert _refusal(capsys, forward.main, ["--iters", "0"]).endswith("--iters: must be at least 1, got 0")


def test_a_case_whose_process_died_ends_the_run():
    """Its parent waited on the queue for good."""
    ctx = mp.get_context("spawn")
    queue, proc = ctx.Queue(), ctx.Process(target=os._exit, args=(3,))
    proc.start()
    with pytest.raises(SystemExit, match="a case failed \\(exit code 3\\)"):
        vae_attention._result(queue, proc, "a case")


@pytest.mark.parametrize(
    "module, argv, says",
    [
        ("bench.attention", ["--nproc", "0"], "--nproc: must be at least 1, got 0"),  # ZeroDivisionError
        ("bench.forward", ["--preset", "nosuch"], "--preset 'nosuch' is not small or one of"),  # KeyError
        ("bench.forward", ["--height", "100"], "--height 100: a multiple of 16"),  # timed 96, said 100
        (
            "bench.forward",
            ["--family", "hunyuanvideo-1.5", "--frames", "6"],
            "--frames 6: the VAE takes 4k+1",
        ),
        ("bench.job", ["--models", "nosuch"], "--models: nosuch: neither a model name"),  # FileNotFoundError
        ("bench.lora_switch", ["--model", "nosuch"], "--model 'nosuch' is neither a folder nor one of"),
        # said with exit 1, as a failure would be
        ("bench.attention", ["--nproc", "2", "--heads", "3"], "--heads 3 must divide by --nproc 2"),
        ("bench.job", ["--iters", "0"], "--iters: must be at least 1, got 0"),  # IndexError
        (
            "bench.job",
            ["--models", "tiny", "--request", "num_inference_steps=0"],  # a traceback, after a load
            "tiny: num_inference_steps must be an integer between 1 and 50, got 0",
        ),
        ("bench.quality", ["--cache", "bogus"], "argument --cache: cache must be off, fbcache, or fbcache:"),
        ("bench.quality", ["--attn", "fp9"], "invalid choice: 'fp9'"),  # ran after the 72 reference videos
        ("bench.quality", ["--quant", "bogus"], "invalid choice: 'bogus'"),  # ran, rows labelled bogus
        (
            "bench.quality",
            ["--guidance", "-1"],
            "tiny: guidance_scale must be between 1.0 and 20.0, got -1.0",
        ),
        ("bench.quality", ["--model", "nosuch"], "nosuch: neither a model name"),  # tracebacks, after a load
        ("parallel.demo", ["--nproc", "0"], "--nproc must be 1 or more, got 0"),  # nothing run, exit 0
        ("parallel.demo", ["--text", "0"], "--text must be 1 or more, got 0"),  # a traceback from every rank
        ("parallel.demo", ["--nproc", "4", "--heads", "3"], "--heads 3 cannot split over 4 ranks"),
        ("bench.fp8_accumulation", ["--bogus"], "unrecognized arguments: --bogus"),  # ran whatever it got
        ("bench.layouts", ["--worlds", "2", "--heads", "4"], "--worlds 2 divides every --heads (4)"),
        # tracebacks, some after a server or the whole benchmark ran; a budget of -1 ran, skipping all
        ("bench.vae_decode", ["--ranks", "0"], "--ranks: must be at least 1, got 0"),  # FileNotFoundError
        ("bench.vae_decode", ["--threads", "0"], "--threads: must be at least 1, got 0"),  # the default ran
        ("bench.job", ["--queued", "-1"], "--queued: must be at least 0, got -1"),
        ("bench.lora_switch", ["--iters", "0"], "--iters: must be at least 1, got 0"),
        ("bench.first_job", ["--jobs", "0"], "--jobs: must be at least 1, got 0"),
        ("bench.gpu", ["--budget", "-1"], "--budget: must be at least 0, got -1.0"),
    ],
)
def test_a_count_or_choice_that_cannot_work_is_one_line(capsys, module, argv, says):
    import importlib

    assert says in _refusal(capsys, importlib.import_module(module).main, argv)


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [  # each a traceback (a spawn's, a KeyError's, a ZeroDivisionError's), or a run of nonsense
        ("batch", ["--model", "nosuch"], "nosuch: neither a model name"),
        ("batch", ["--ranks", "0"], "argument --ranks: must be at least 1, got 0"),
        ("batch", ["--iters", "0"], "argument --iters: must be at least 1, got 0"),
        ("hunyuan", ["--preset", "nosuch"], "--preset 'nosuch' is not small or one of tiny-joint"),
        ("hunyuan", ["--valid-text", "999"], "--valid-text 999: the real tokens of --text-len 64, 1 to it"),
        ("lora_switch", ["--rank", "0", "--no-latents"], "argument --rank: must be at least 1, got 0"),
    ],
)
def test_a_bench_refuses_what_cannot_run_in_one_line(capsys, script, argv, says):
    import importlib

    main = importlib.import_module(f"bench.{script}").main
    assert says in _refusal(capsys, main, argv)


def test_ctrl_c_ends_a_bench_in_one_line(capsys):
    """A traceback of wherever it landed, 18 to 47 lines."""
    from bench.entry import run_main

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        run_main(interrupted)
    assert stop.value.code == 130 and capsys.readouterr().err.endswith(": interrupted\n")
