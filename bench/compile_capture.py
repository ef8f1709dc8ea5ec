"""What torch.compile captures of one transformer block on CUDA under `--quant fp8` and `--attn-backend fp8`,
on a machine without a GPU: the graphs and graph breaks of one regionally compiled block (dit/compile.py's
unit), the Triton kernels captured in them (FP8 attention and its quantisers) and the FP8 GEMMs. A graph
break inside a block would cost a compiled forward its fusion and recompile per block.

The block runs on fake CUDA tensors (shapes and dtypes only, nothing computed), with Triton's driver stood
in by an sm_90 one (testing/hopper_compile.py) and dynamo's Triton support switched on as a GPU would; the
graphs go through AOT autograd (`aot_eager`). Inductor's lowering needs a real device: bench/gpu.py's FP8
forward rows compile the whole model there. Needs a CUDA build of torch (a CPU build cannot make CUDA
tensors, even fake ones), e.g. the GPU image's; the block's inputs come from one bf16 forward on the CPU.

    python bench/compile_capture.py
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline  # noqa: E402
from testing.hopper_compile import compile_only  # noqa: E402

MODELS = ("tiny-random", "tiny-joint")  # Wan2.1 and HunyuanVideo-1.5 at tiny sizes
# (quant, attn_backend); not `auto` (on Hopper: `cudnn`): SDPA's fake kernel asks the CUDA driver whether
# cuDNN can run, so plain `sdpa` stands for the bf16 attention
VARIANTS = (("fp8", "fp8"), ("none", "fp8"), ("fp8", "sdpa"), ("none", "sdpa"))
REQUEST = dict(prompt="a red circle", num_frames=9, height=48, width=48, num_inference_steps=1)


class _Captured(Exception):
    pass


def _block_inputs(model: str):
    """(transformer, args, kwargs) of the first block's first call in a bf16 CPU denoise."""
    pipe = load_pipeline(PipelineConfig(model=model, device="cpu"))
    inner = getattr(pipe.model, "transformer", pipe.model)
    got = {}

    def stop(_, args, kwargs):
        got.update(args=args, kwargs=kwargs)
        raise _Captured

    hook = inner.blocks[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        pipe.denoise(GenerationRequest(**REQUEST))
    except _Captured:
        pass
    finally:
        hook.remove()
    return inner, got["args"], got["kwargs"]


@contextmanager
def _fake_cuda():
    """Fake CUDA tensors on an sm_90 stand-in: Triton's target, dynamo's Triton support and the device
    properties `parallel.kernels` asks for are a Hopper's; an eager Triton launch only compiles."""
    import torch.utils._triton as triton_utils
    from torch._subclasses.fake_tensor import FakeTensorMode

    with ExitStack() as stack:
        stack.enter_context(compile_only())
        stack.enter_context(mock.patch.object(triton_utils, "has_triton", lambda: True))
        hopper = SimpleNamespace(major=9, minor=0, name="sm_90 stand-in")
        stack.enter_context(mock.patch("torch.cuda.get_device_properties", lambda device=None: hopper))
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        yield


def capture(model: str, quant: str, attn: str, inputs) -> dict:
    """One row: the first block of `model` under (quant, attn), compiled and called on fake CUDA tensors."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters
    from torch.utils._pytree import tree_map

    bf16, args, kwargs = inputs
    inner = load_pipeline(PipelineConfig(model=model, device="cpu", quant=quant, attn_backend=attn)).model
    inner = getattr(inner, "transformer", inner)
    # HunyuanVideo-1.5 hands each block its attention op: this pipeline's, not the bf16 one's
    args = [inner.attention if a is getattr(bf16, "attention", None) else a for a in args]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    block = inner.blocks[0]
    block.compile(backend=backend)  # as dit/compile.py compiles each block, but through AOT autograd only
    with _fake_cuda():
        block.to("cuda")
        cuda = lambda t: t.to("cuda") if isinstance(t, torch.Tensor) else t  # noqa: E731
        block(*tree_map(cuda, args), **tree_map(cuda, kwargs))
    ops = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    breaks = counters["graph_break"]
    return dict(model=model, quant=quant, attn=attn, graphs=len(graphs), breaks=sum(breaks.values()),
                break_reasons=sorted(breaks), triton=sum("triton_kernel_wrapper" in o for o in ops),
                scaled_mm=sum("_scaled_mm" in o for o in ops), ops=len(ops))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    args = p.parse_args()
    if not torch.backends.cuda.is_built():
        sys.exit("compile_capture: needs a CUDA build of torch (no GPU needed); this one is CPU-only")
    rows = []
    for model in MODELS:
        inputs = _block_inputs(model)
        rows += [capture(model, quant, attn, inputs) for quant, attn in VARIANTS]
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": rows}))
        return
    import triton

    print(f"torch {torch.__version__}, Triton {triton.__version__}: one block on fake CUDA tensors (sm_90)\n")
    print("| model | --quant | --attn-backend | graphs | graph breaks | Triton kernels in them | FP8 GEMMs "
          "| ops |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['quant']} | {r['attn']} | {r['graphs']} | {r['breaks']} | {r['triton']} "
              f"| {r['scaled_mm']} | {r['ops']} |")  # fmt: skip
    for r in rows:
        for reason in r["break_reasons"]:
            print(f"- {r['model']} {r['quant']}/{r['attn']}: {reason}")


if __name__ == "__main__":
    main()
