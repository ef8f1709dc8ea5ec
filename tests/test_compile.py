"""Regional torch.compile (`PipelineConfig.compile`, dit/compile.py) gives the eager pipeline's latents at one
rank and under Ulysses 2 (gloo), for Wan and HunyuanVideo-1.5: the sequence-parallel attention op runs
eagerly between compiled graphs, so its collectives survive compilation. Inductor, as in production (its
CPU C++ build costs seconds per graph; the FX graph cache makes reruns faster).

Dynamo's counters prove the blocks were compiled (the test cannot pass on eager forwards), and under
sequence parallelism that dynamo broke each block's graph at the disabled attention op instead of tracing it.
`auto` attention on a (fake) CUDA tensor resolves inside a graph without breaking it.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

from dit.pipeline import GenerationRequest
from parallel.kernels import resolve_backend
from testing.hopper_compile import HOPPER
from tests.distributed import run_distributed

REQUEST = dict(prompt="a lighthouse at dusk", negative_prompt="blurry", num_frames=9, height=48, width=48,
               num_inference_steps=2, guidance_scale=5.0, seed=3)  # fmt: skip
MODELS = ("tiny", "tiny-joint")


def _eager_and_compiled(model: str, ulysses: int | None = None) -> dict:
    """On this rank: eager and compiled final latents, and dynamo's graph and graph-break counts."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import parallel
    from dit.pipeline import PipelineConfig, load_pipeline

    torch._dynamo.reset()
    counters.clear()
    mesh = parallel.init_parallel(ulysses=ulysses)
    req = GenerationRequest(**REQUEST)
    eager = load_pipeline(PipelineConfig(model=model, device="cpu"), mesh)
    compiled = load_pipeline(PipelineConfig(model=model, device="cpu", compile=True), mesh)
    got = dict(eager=eager.denoise(req), compiled=compiled.denoise(req))
    breaks = sum(n for reason, n in counters["graph_break"].items() if "disable" in reason)
    got |= dict(graphs=counters["stats"]["unique_graphs"], breaks=breaks)
    if ulysses is None:  # a third text length (HunyuanVideo-1.5's): its graph is one already made
        other = GenerationRequest(**REQUEST | dict(prompt="a lighthouse at dusk over a stormy sea, waves"))
        got |= dict(other_eager=eager.denoise(other), other_compiled=compiled.denoise(other))
        got |= dict(graphs_after=counters["stats"]["unique_graphs"])
    return got


@pytest.mark.parametrize("model", MODELS)
def test_compiled_matches_eager_on_one_rank(model):
    """One graph serves every block: Wan pads its text to a fixed length; HunyuanVideo-1.5's prompt and
    negative prompt differ in length, so dynamo compiles the block again with the text length symbolic (its
    first block once saw other strides than the rest: a third), and any later length reuses that graph."""
    got = _eager_and_compiled(model)
    assert got["graphs"] == got["graphs_after"] == {"tiny": 1, "tiny-joint": 2}[model]
    torch.testing.assert_close(got["compiled"], got["eager"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got["other_compiled"], got["other_eager"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # compiles on 2 ranks
def test_compiled_matches_eager_under_ulysses():
    ranks = run_distributed(2, _many, MODELS, timeout=240)
    for rank in ranks:
        for model, got in zip(MODELS, rank, strict=True):
            assert got["graphs"] >= 2, model  # graphs before and after the attention op
            assert got["breaks"] >= 1, model  # dynamo stopped at the disabled collective op
            torch.testing.assert_close(got["compiled"], got["eager"], rtol=1e-4, atol=1e-4)


def _many(models):
    return [_eager_and_compiled(model, ulysses=2) for model in models]


def test_the_switch_reaches_the_pipeline_from_every_entry_point():
    """`ithaca generate/parity --compile` and `ITHACA_COMPILE` (serve → worker argv → worker flags); off by
    default everywhere."""
    import argparse

    from dit.cli import add_subcommands
    from dit.cli_args import pipeline_argv, pipeline_config
    from server.config import ServeConfig, add_arguments, from_args

    cli = argparse.ArgumentParser()
    add_subcommands(cli.add_subparsers())
    assert pipeline_config(cli.parse_args(["generate", "x", "--compile"])).compile is True
    assert pipeline_config(cli.parse_args(["generate", "x"])).compile is False
    assert "--compile" in pipeline_argv(cli.parse_args(["parity", "--compile"]))
    assert "--compile" not in pipeline_argv(cli.parse_args(["parity"]))

    def worker_config(environ: dict) -> ServeConfig:
        serve, worker = argparse.ArgumentParser(), argparse.ArgumentParser()
        add_arguments(serve)
        add_arguments(worker, worker_only=True)
        argv = from_args(serve.parse_args([]), environ=environ).worker_argv()
        return from_args(worker.parse_args(argv), environ={})

    assert ServeConfig().compile is False
    assert worker_config({"ITHACA_COMPILE": "1"}).compile is True
    assert worker_config({}).compile is False


def test_auto_attention_on_cuda_resolves_without_a_graph_break():
    """`auto` on a CUDA tensor (a fake one, on an sm_90 stand-in) resolves inside a compiled block without a
    graph break: it once retried `import flash_attn` at every attention call (the GPU image has no
    flash-attn), which broke every compiled block's graph (bench/compile_capture.py found it)."""
    with mock.patch("torch.cuda.get_device_properties", lambda device=None: HOPPER), FakeTensorMode():
        q = torch.empty(1, 8, 2, 16, device="cuda", dtype=torch.bfloat16)
        traced = torch._dynamo.explain(lambda q: (q * 2, resolve_backend("auto", q, None)))(q)
    assert traced.graph_count == 1 and not traced.break_reasons, traced.break_reasons
