"""Triton's CPU interpreter for the kernel tests, in a process of its own.

Whether a kernel runs interpreted is decided when it is decorated, and Triton's own library functions
(`tl.zeros`, `tl.max`...) are decorated when Triton is first imported: in a test process torch.compile may
import Triton long before a test sets TRITON_INTERPRET=1, and an interpreted kernel calling a compiled
`tl.zeros` fails. So the tests run their bodies (module-level functions) in one spawned worker that has
TRITON_INTERPRET=1 from its start.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import multiprocessing

import pytest

needs_triton = pytest.mark.skipif(
    not importlib.util.find_spec("triton"),
    reason="triton is not installed: the kernels are checked here under Triton's CPU interpreter (setup.sh "
    "installs it on a CPU machine; bench/gpu.py checks them on CUDA)",
)


@pytest.fixture(scope="session")
def interpreter():
    """Runs `interpreter(fn, *args)` in the interpreted worker and returns its result (its exception, raised
    here, fails the test). One worker for the session: each costs an `import torch`."""
    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        pool.submit(int).result(timeout=120)  # the worker starts, and keeps the variable, now
    yield lambda fn, *args: pool.submit(fn, *args).result(timeout=300)
    pool.shutdown(cancel_futures=True)
