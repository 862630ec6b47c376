"""aten.constant_pad_nd lowered as a Pointwise gather (passline/lowering/pad.py): values, gradients and
strides against eager on both codegens — pads and cuts on every dimension, strided inputs, fill values,
integer dtypes, dynamic sizes — and the extern it falls back to."""
import re

import pytest
import torch
import torch.nn.functional as F

import passline
from passline.ir import Extern
from passline.testing import assert_matches_eager

CODEGENS = ["reference", "triton"]
aten = torch.ops.aten


def _leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).requires_grad_()


def _pads(be):
    return [n for r in be.reports for n in r.graph.nodes()
            if isinstance(n, Extern) and n.op == aten.constant_pad_nd.default]


PADS = {
    "last_right": (0, 3),
    "last_both": (2, 1),
    "two_dims": (1, 2, 3, 0),
    "cut_last": (0, -2),
    "cut_and_pad": (-1, 2, 2, -3),
    "three_dims": (1, 1, 0, 2, 1, 0),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("pad", sorted(PADS))
def test_pad_matches_eager(codegen, pad):
    x = _leaf(3, 5, 7, seed=1)

    def fn(x):  # a producer and a consumer, so the gather has math on both sides to fuse with
        return F.pad(x.sin(), PADS[pad], value=0.5) * 2

    be = assert_matches_eager(fn, [x], codegen=codegen)
    assert not _pads(be), be.reports[0].graph.format()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_pad_of_strided_inputs(codegen):
    # a transposed input, a channels_last one and a slice: the gather reads each through its strides
    t = _leaf(6, 4, seed=2).detach().t().requires_grad_()
    c = _leaf(2, 4, 3, 5, seed=3).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    s = _leaf(5, 9, seed=4).detach()[1:, 2:8].requires_grad_()

    def fn(t, c, s):
        return F.pad(t, (1, 2)), F.pad(c, (1, 1, 2, 0)), F.pad(s, (-1, 3, 0, 1), value=-2.0)

    be = assert_matches_eager(fn, [t, c, s], codegen=codegen)
    assert not _pads(be)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.bfloat16])
def test_pad_of_other_dtypes(dtype):
    x = (torch.arange(12).reshape(3, 4) % 3).to(dtype)
    value = True if dtype == torch.bool else 7

    def fn(x):
        return torch.constant_pad_nd(x, (1, 2, 0, 1), value)

    be = assert_matches_eager(fn, [x], codegen="reference")
    assert not _pads(be)


def test_pad_everything_cut_or_empty_input():
    # a dimension cut to nothing and padded: every point is the fill value, no load at all
    x = _leaf(3, 4, seed=5)

    def fn(x):
        return F.pad(x, (-4, 2), value=3.0) + 1

    be = assert_matches_eager(fn, [x], codegen="reference")
    assert not _pads(be)


def test_pad_under_dynamic_shapes():
    # sizes are symbols: the clamp and the bound are expressions in them, and a second size reuses the graph
    be = passline.backend(codegen="reference", fallback="raise")
    fn = torch.compile(lambda x: F.pad(x * 2, (1, 2, 0, 1)), backend=be, dynamic=True)
    for shape in [(3, 5), (4, 9), (2, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(fn(x), F.pad(x * 2, (1, 2, 0, 1)))
    assert not _pads(be)


class _PaddedLinear(torch.nn.Module):
    """pad_linear's rewrite written out: the padded weight's gradient is the first N rows of the padded
    one's (a cut), the output the first N columns of the padded one's."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 13)

    def forward(self, x):
        w = F.pad(self.lin.weight, (0, 0, 0, 3))
        b = F.pad(self.lin.bias, (0, 3))
        return F.linear(x, w, b)[..., :13].relu().sum()


def test_pad_of_a_linear_weight_trains_like_eager():
    torch.manual_seed(0)
    be = assert_matches_eager(_PaddedLinear(), [torch.randn(4, 8, requires_grad=True)], codegen="reference")
    assert not _pads(be)


def test_a_pad_of_rows_takes_its_producers_computation():
    """inline_pointwise's pad rule: a pad of rows 30 -> 32 (at most 9/8 of the points) computes its
    producer's pointwise chain itself, one kernel, no [5, 30] buffer. Its clamp `Min(i1, 29)` is dropped only
    where every unclamped read stays inside its buffer: a [5, 32] matmul result read as [:, :30] holds every
    column; an input of exactly [5, 30] does not (row 4's columns 30 and 31 would be past its end)."""
    x, y, w = _leaf(5, 30, seed=6), _leaf(5, 30, seed=8), _leaf(30, 32, seed=7)

    def from_inputs(x, y):  # two loads a point: too many for the rules that recompute a node in its readers
        return F.pad((x * y).sin() + 1, (0, 2))

    def from_matmul(x, w, y):
        return F.pad(((x @ w)[:, :30] * y).sin() + 1, (0, 2))

    for fn, args, clamped in ((from_inputs, [x, y], True), (from_matmul, [x, w, y], None)):
        be = assert_matches_eager(fn, args, codegen="reference")
        forward = be.reports[0]
        text = forward.graph.format()
        assert forward.metrics.counters["inlined_cone"] == 1 and forward.kernels == 1, text
        buffers = forward.graph.buffers()
        stored = [tuple(buffers[b].layout.size) for n in forward.graph.nodes() for b in n.output_names()]
        assert (5, 30) not in stored, text
        loads = re.findall(r"load\((\w+)\[([^\]]*)\]", text)
        # y, [5, 30], stays clamped in both; the matmul's [5, 32] result is read where the pad stores
        inputs = forward.graph.input_buffers()
        assert loads and all(("Min(" in index) == (clamped if clamped is not None else buffer in inputs)
                             for buffer, index in loads), text
