"""What a batch's samples compute equals what each computes alone, bit for bit (dit.rowwise for the models'
layers, parallel.padded_text for attention over texts padded to the batch's longest); the float64
reference for the padded attention itself is tests/test_parallel_attention.py's (B = 2, masked text)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.utils._pytree import tree_leaves

from dit.rowwise import RowwiseLinear, real_rows
from parallel.ulysses import joint_attention


@pytest.mark.parametrize(
    "shape, features",
    [((3, 12, 512), (512, 128)), ((2, 128, 2048), (2048, 64)), ((3, 64), (64, 384))],
    ids=["few rows", "long reduction", "one row each"],  # the cases where a folded batch measured different
)
def test_rowwise_linear_gives_each_sample_its_solo_product(shape, features):
    torch.manual_seed(0)
    layer = RowwiseLinear(*features)
    x = torch.randn(shape)
    alone = torch.cat([nn.functional.linear(x[b : b + 1], layer.weight, layer.bias) for b in range(shape[0])])
    assert torch.equal(layer(x), alone)
    assert layer.state_dict().keys() == nn.Linear(*features).state_dict().keys()


def test_real_rows_runs_each_samples_real_tokens_and_zeros_the_padding():
    torch.manual_seed(0)
    layer, x = RowwiseLinear(16, 8), torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    got = real_rows(layer, x, mask)
    assert torch.equal(got[0], layer(x[:1])[0]) and torch.equal(got[1, :3], layer(x[1:, :3])[0])
    assert not got[1, 3:].any()


def _one_graph_and_close(fn, *args, tol: float) -> None:
    """fn traced by dynamo in one graph, and compiled (eager backend) within `tol` of its eager run."""
    traced = torch._dynamo.explain(fn)(*args)
    assert (traced.graph_count, traced.graph_break_count) == (1, 0), traced.break_reasons
    eager, compiled = fn(*args), torch.compile(fn, backend="eager")(*args)
    for got, want in zip(tree_leaves(compiled), tree_leaves(eager), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_padded_batches_compile_into_one_graph():
    """Under torch.compile neither the layers' rows nor the attention's text keys are picked by the mask's
    data (that broke the graph of every HunyuanVideo-1.5 block of a batch with padded text:
    bench/compile_capture.py): the padded rows are zeroed and the attention keeps the mask."""
    torch.manual_seed(0)
    layer, x = RowwiseLinear(16, 8), torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    _one_graph_and_close(lambda x, mask: real_rows(layer, x, mask), x, mask, tol=1e-6)
    S, T, H, D = 7, 5, 2, 8
    q, k, v = (torch.randn(2, S, H, D) for _ in range(3))
    text = tuple(torch.randn(2, T, H, D) for _ in range(3))

    def attend(q, k, v, text, mask):  # the real rows (padded text rows: zero eagerly, attended when compiled)
        img, txt = joint_attention(q, k, v, S, text, mask, False, False, "auto")
        return img, txt * mask[:, :, None, None]

    _one_graph_and_close(attend, q, k, v, text, mask, tol=1e-5)


def test_padded_text_attention_equals_each_samples_unpadded_run():
    torch.manual_seed(0)
    S, T, H, D = 7, 6, 2, 8
    q, k, v = (torch.randn(2, S, H, D) for _ in range(3))
    text = tuple(torch.randn(2, T, H, D) for _ in range(3))
    mask = torch.tensor([[True] * T, [True] * 4 + [False] * 2])
    img, txt = joint_attention(q, k, v, S, text, mask, False, False, "auto")
    for b, n in enumerate((T, 4)):
        own = tuple(t[b : b + 1, :n] for t in text)
        img_b, txt_b = joint_attention(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], S, own, None, False, False, "auto"
        )
        assert torch.equal(img[b : b + 1], img_b) and torch.equal(txt[b : b + 1, :n], txt_b)
