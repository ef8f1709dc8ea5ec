"""What torch.compile makes of one transformer block on CUDA under `--quant fp8` and `--attn-backend fp8`, on
a machine without a GPU: the graphs and graph breaks of one regionally compiled block (dit/compile.py's unit),
the Triton kernels and FP8 GEMMs captured in them, and Inductor's compilation of the block for sm_90: every
kernel it generates and every captured kernel as Inductor re-emits it, compiled by Triton. A graph break
inside a block costs a compiled forward its fusion; a kernel Inductor cannot compile fails the first compiled
job on the device.

The block runs on fake CUDA tensors (shapes and dtypes only, nothing computed). Triton's driver is an sm_90
stand-in (testing/hopper_compile.py), dynamo's Triton support is on as on a GPU, and the CUDA queries
Inductor makes are answered as an H100's; the compiled code is never run. Needs a CUDA build of torch (a CPU
build cannot make CUDA tensors, even fake ones), e.g. the GPU image's; the block's inputs come from a bf16
denoise on the CPU of one job, and for the FP8 rows also of a batch of two whose prompts differ in length
(padded text: the attention's key mask in the graph).

    python bench/compile_capture.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.entry import run_main  # noqa: E402
from dit.batch import BatchJob, denoise_batch  # noqa: E402
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from testing.hopper_compile import HOPPER, compile_only  # noqa: E402

MODELS = ("tiny-random", "tiny-joint")  # Wan2.1 and HunyuanVideo-1.5 at tiny sizes: every variant, batches
# the other families' tiny presets (two experts, TI2V-5B's, image-to-video): FP8 alone
FAMILIES = ("tiny-moe-random", "tiny-ti2v-random", "tiny-i2v-random", "tiny-joint-i2v")
# (quant, attn_backend); not `auto` (on Hopper: `cudnn`): SDPA's fake kernel asks the CUDA driver whether
# cuDNN can run, so plain `sdpa` stands for the bf16 attention
VARIANTS = (("fp8", "fp8"), ("none", "fp8"), ("fp8", "sdpa"), ("none", "sdpa"))
REQUEST = dict(num_frames=9, height=64, width=64, num_inference_steps=1)  # TI2V-5B's: multiples of 32
IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)  # for the I2V models
# a batch of two jobs whose prompts differ in length: padded text, so the attention's key mask is in the graph
PROMPTS = ("a red circle", "the big violet ball sliding slowly to the left across the frame")


class _Captured(Exception):
    pass


def _block_inputs(model: str, jobs: int):
    """(transformer, args, kwargs) of the first block's first call in a bf16 CPU denoise of one job (with an
    image for the I2V models) or a batch of `jobs`."""
    pipe = load_pipeline(PipelineConfig(model=model, device="cpu"))
    inner = getattr(pipe.model, "transformer", pipe.model)
    got = {}

    def stop(_, args, kwargs):
        got.update(args=args, kwargs=kwargs)
        raise _Captured

    hook = inner.blocks[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        if jobs == 1:  # an image-to-video job runs alone
            image = dict(image=IMAGE) if "i2v" in model else {}
            pipe.denoise(GenerationRequest(PROMPTS[0], **REQUEST, **image))
        else:
            denoise_batch(pipe, [BatchJob(GenerationRequest(p, **REQUEST)) for p in PROMPTS[:jobs]])
    except _Captured:
        pass
    finally:
        hook.remove()
    return inner, got["args"], got["kwargs"]


@contextmanager
def _fake_hopper(compiled: list):
    """Fake CUDA tensors on an sm_90 stand-in (an H100's properties). Inductor compiles in this process,
    into a fresh cache, without the padding passes that time matmuls on the device; each kernel it compiles
    is named in `compiled` instead of getting a launcher."""
    import torch._inductor.config as inductor_config
    import torch._inductor.runtime.triton_helpers as helpers
    import torch._inductor.runtime.triton_heuristics as heuristics
    import torch.utils._triton as triton_utils
    from torch._dynamo.device_interface import CudaInterface
    from torch._subclasses.fake_tensor import FakeTensorMode

    precompile = heuristics.CachingAutotuner._precompile_worker

    def record(self):
        precompile(self)
        compiled.append(self.fn.__name__)

    with ExitStack() as stack:
        cache = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(compile_only())
        for patch in (
            mock.patch.object(triton_utils, "has_triton", lambda: True),  # dynamo captures Triton launches
            mock.patch("torch.cuda.get_device_properties", lambda device=None: HOPPER),
            mock.patch("torch.cuda.current_device", lambda: 0),
            mock.patch("torch.cuda.device_count", lambda: 1),
            mock.patch.object(CudaInterface, "get_device_properties", staticmethod(lambda d=None: HOPPER)),
            mock.patch.object(CudaInterface, "get_compute_capability", staticmethod(lambda d=None: 90)),
            mock.patch.object(CudaInterface, "is_available", staticmethod(lambda: True)),
            mock.patch.object(helpers, "set_driver_to_gpu", lambda: None),  # keeps the stand-in driver
            mock.patch.object(heuristics.CachingAutotuner, "_precompile_worker", record),
            mock.patch.object(heuristics.CachingAutotuner, "_make_launchers", lambda self: None),
            mock.patch.object(inductor_config, "shape_padding", False),
            mock.patch.object(inductor_config, "comprehensive_padding", False),
            mock.patch.object(inductor_config, "compile_threads", 1),
            # this pass runs ops on the device to find constants
            mock.patch.object(inductor_config, "joint_graph_constant_folding", False),
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}),
        ):
            stack.enter_context(patch)
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        yield


def capture(model: str, quant: str, attn: str, inputs) -> dict:
    """One row: the first block of `model` under (quant, attn), compiled and called on fake CUDA tensors."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx
    from torch.utils._pytree import tree_map

    bf16, args, kwargs = inputs
    inner = load_pipeline(PipelineConfig(model=model, device="cpu", quant=quant, attn_backend=attn)).model
    inner = getattr(inner, "transformer", inner)
    # HunyuanVideo-1.5 hands each block its attention op: this pipeline's, not the bf16 one's
    args = [inner.attention if a is getattr(bf16, "attention", None) else a for a in args]
    ops, compiled, failed = [], [], []
    inductor = attn != "sdpa"  # Inductor's SDPA lowering asks the driver which kernel can run

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        try:
            if inductor:
                compile_fx(gm, example_inputs)
        except Exception as e:  # noqa: BLE001 (the row says what Inductor could not do)
            lines = str(e).strip().splitlines() or [""]  # a compile error's first line and its cause (last)
            failed.append(f"{type(e).__name__}: {lines[0][:120]} … {lines[-1][:200]}")
        return gm.forward  # the graph as traced: fake tensors, nothing run

    torch._dynamo.reset()
    counters.clear()
    block = inner.blocks[0]
    block.compile(backend=backend)  # as dit/compile.py compiles each block
    with _fake_hopper(compiled):
        block.to("cuda")
        cuda = lambda t: t.to("cuda") if isinstance(t, torch.Tensor) else t  # noqa: E731
        try:
            block(*tree_map(cuda, args), **tree_map(cuda, kwargs))
        except Exception as e:  # noqa: BLE001 (a fake tensor cannot run what a break left eager: say so)
            failed.append(f"the block stopped after a graph break: {type(e).__name__}: {str(e)[:200]}")
    breaks = counters["graph_break"]
    ours = sorted({k for k in compiled if not k.startswith("triton_")})  # Inductor names its own triton_*
    return dict(model=model, quant=quant, attn=attn, graphs=counters["stats"]["unique_graphs"],
                breaks=sum(breaks.values()), break_reasons=sorted(w.strip().splitlines()[0] for w in breaks),
                triton=sum("triton_kernel_wrapper" in o for o in ops),
                scaled_mm=sum("_scaled_mm" in o for o in ops), ops=len(ops),
                inductor=inductor, inductor_kernels=len(compiled), captured_compiled=ours,
                inductor_failed=failed)  # fmt: skip


COLUMNS = ("model", "jobs", "quant", "attn", "graphs", "breaks", "triton", "scaled_mm", "ops")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    args = p.parse_args()
    if not torch.backends.cuda.is_built():
        p.error("needs a CUDA build of torch (no GPU needed); this one is CPU-only")
    rows = []
    for model in MODELS:
        inputs = _block_inputs(model, 1)
        rows += [capture(model, quant, attn, inputs) | dict(jobs=1) for quant, attn in VARIANTS]
        rows.append(capture(model, "fp8", "fp8", _block_inputs(model, 2)) | dict(jobs=2))
    rows += [capture(model, "fp8", "fp8", _block_inputs(model, 1)) | dict(jobs=1) for model in FAMILIES]
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": rows}))
        return
    import triton

    print(f"torch {torch.__version__}, Triton {triton.__version__}: one block on fake CUDA tensors (sm_90)\n")
    head = ["model", "jobs", "--quant", "--attn-backend", "graphs", "graph breaks", "Triton kernels in them",
            "FP8 GEMMs", "ops", "Inductor: kernels compiled", "of them ours"]  # fmt: skip
    print("| " + " | ".join(head) + " |\n| --- | ---: | --- | --- |" + " ---: |" * 6 + " --- |")
    for r in rows:
        done = "failed" if r["inductor_failed"] else r["inductor_kernels"] if r["inductor"] else "needs a GPU"
        cells = [r[k] for k in COLUMNS]
        cells += [done, ", ".join(r["captured_compiled"]) or "–"]
        print("| " + " | ".join(map(str, cells)) + " |")
    for r in rows:
        for why in r["break_reasons"] + r["inductor_failed"]:
            print(f"- {r['model']} ({r['jobs']} jobs) {r['quant']}/{r['attn']}: {why}")


if __name__ == "__main__":
    run_main(main)
