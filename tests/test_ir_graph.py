"""IR units, SchedulerGraph.verify() on deliberately broken graphs, and the reference backend."""
import attrs
import pytest
import sympy
import torch

from passline.backends.reference import ReferenceRunner
from passline.ir import (
    Buffer,
    Cast,
    Constant,
    Extern,
    FloorDiv,
    Layout,
    Load,
    ModularIndexing,
    Op,
    Pointwise,
    Reduction,
    TensorArg,
    loop_vars,
    walk,
)
from passline.ir.index import least, provably_nonnegative
from passline.lowering import GraphInput, Program
from passline.lowering.tensor import TensorRef, compute_stride
from passline.pipeline import SchedulerGraph, VerificationError

i0, i1 = loop_vars("i", 2)
(r0,) = loop_vars("r", 1)
F32 = torch.float32


def test_index_functions_simplify():
    assert FloorDiv(i0 * 8 + 3, 8) == i0
    assert FloorDiv(sympy.Integer(17), 5) == 3
    assert ModularIndexing(i0, 1, 1) == 0
    assert ModularIndexing(sympy.Integer(17), 2, 3) == 2


def test_least_values_of_size_expressions():
    """ir.index.least: a lower bound over every size at least its bound (dynamo's: a backed size >= 2)."""
    from torch.utils._sympy.functions import FloorDiv as SizeFloorDiv

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert least(FloorDiv(s0, 2) - 1, {s0: 2}) == 0 and least(SizeFloorDiv(s0, 2) - 1, {s0: 2}) == 0
    assert least(FloorDiv(s0, 2) - 1) == -1  # s0 = 1 allowed without the bound
    assert provably_nonnegative(SizeFloorDiv(s0 - 1, 2), {s0: 2}) and not provably_nonnegative(s0 - 3, {s0: 2})
    assert least(s0 - s1, {s0: 2, s1: 2}) is None  # no upper bound of s1: nothing known
    assert least(sympy.Max(s0 - 5, 1) * s1, {s0: 2, s1: 3}) == 3
    assert least(sympy.Min(s0, s1 - 1), {s0: 4, s1: 2}) == 1


def test_layout_and_buffer():
    lay = Layout.contiguous([4, 5], F32)
    assert lay.stride == (5, 1) and lay.numel == 20 and lay.storage_span == 20 and lay.is_contiguous()
    t = Layout([5, 4], [1, 5], F32)
    assert not t.is_contiguous() and t.storage_span == 20
    assert Buffer("b", lay).nbytes == 80
    assert "stride" in repr(t)


def test_views_are_index_rewrites():
    ref = TensorRef.of(Buffer("x", Layout.contiguous([4, 6], F32)))
    assert ref.permute([1, 0]).strided()[0] == (1, 6)
    assert ref.slice(1, sympy.Integer(2), sympy.Integer(2), sympy.Integer(2)).strided() == ((6, 2), 2)
    # reshape of a transpose cannot be strided: it goes through floor division and modulus
    flat = ref.permute([1, 0]).reshape([24])
    assert flat.strided() is None and flat.index.has(ModularIndexing)
    assert compute_stride([4, 6], [6, 1], [2, 2, 6]) == (12, 6, 1)
    assert compute_stride([4, 6], [1, 4], [24]) is None


def test_body_dag_and_node_deps():
    x = Load("x", 8 * i0 + i1, F32)
    body = Op("add", (x, Op("mul", (x, Constant(2.0, F32)), F32)), F32)
    assert sum(isinstance(v, Load) for v in walk(body)) == 1  # shared load visited once
    node = Pointwise("p", [4, 8], body, Buffer("p", Layout.contiguous([4, 8], F32)))
    assert [d.buffer for d in node.reads()] == ["x"] and node.writes()[0].index == 8 * i0 + i1
    with pytest.raises(ValueError):
        Op("frobnicate", (x,), F32)
    assert attrs.evolve(node, body=Cast(x, F32)) != node


def _graph(*nodes, outputs=None, inputs=(("x", [4, 8]),)):
    ins = [GraphInput(n, buffer=Buffer(n, Layout.contiguous(s, F32))) for n, s in inputs]
    last = nodes[-1]
    outs = outputs if outputs is not None else [TensorArg(last.output.name, last.output.layout.size,
                                                           last.output.layout.stride)]
    return SchedulerGraph.from_program(Program(tuple(ins), tuple(nodes), tuple(outs)))


def pw(name, reads, size=(4, 8), dtype=F32):
    body = Op("add", tuple(Load(b, 8 * i0 + i1, F32) for b in reads) + (Constant(1.0, F32),) * (2 - len(reads)), F32)
    return Pointwise(name, size, Cast(body, dtype) if dtype != F32 else body,
                     Buffer(name, Layout.contiguous(size, dtype)))


def test_verify_accepts_good_graph_and_runs():
    g = _graph(pw("a", ["x"]), pw("b", ["a", "x"]))
    g.verify()
    x = torch.randn(4, 8)
    (out,) = ReferenceRunner(g)(x)
    torch.testing.assert_close(out, (x + 1) + x)
    assert g.consumers("a") == ["b"] and g.producer("a") == "a" and g.has_path("a", "b")


def test_verify_missing_producer():
    g = _graph(pw("b", ["ghost", "x"]))
    with pytest.raises(VerificationError, match="ghost.*node b"):
        g.verify()


def test_verify_cycle():
    g = _graph(pw("a", ["b"]), pw("b", ["a"]))
    with pytest.raises(VerificationError, match="cycle"):
        g.verify()


def test_verify_missing_edge():
    g = _graph(pw("a", ["x"]), pw("b", ["a"]))
    g.nx.remove_edge("a", "b")
    with pytest.raises(VerificationError, match="without a dependency edge.*node b"):
        g.verify()


def test_verify_dtype_mismatch():
    a = pw("a", ["x"])
    bad = attrs.evolve(a, body=Cast(a.body, torch.float16))
    with pytest.raises(VerificationError, match="body is torch.float16.*node a"):
        _graph(bad).verify()
    wrong_load = Pointwise("b", (4, 8), Load("x", 8 * i0 + i1, torch.int32),
                           Buffer("b", Layout.contiguous([4, 8], torch.int32)))
    with pytest.raises(VerificationError, match="loads x as torch.int32"):
        _graph(wrong_load).verify()


def test_verify_out_of_bounds_index_and_ranges():
    oob = Pointwise("a", (4, 8), Load("x", 9 * i0 + i1, F32), Buffer("a", Layout.contiguous([4, 8], F32)))
    with pytest.raises(VerificationError, match="outside x"):
        _graph(oob).verify()
    short = Pointwise("a", (4, 7), Load("x", 8 * i0 + i1, F32), Buffer("a", Layout.contiguous([4, 8], F32)))
    with pytest.raises(VerificationError, match="do not cover"):
        _graph(short).verify()


def test_verify_output_not_produced():
    g = _graph(pw("a", ["x"]), outputs=[TensorArg("nope", (4, 8), (8, 1))])
    with pytest.raises(VerificationError, match="output nope"):
        g.verify()


def test_reference_reduction_and_extern():
    red = Reduction("s", (4,), (8,), "sum", Load("x", 8 * i0 + r0, F32), Buffer("s", Layout.contiguous([4], F32)))
    mm = Extern("m", torch.ops.aten.mm.default, (TensorArg("x", (4, 8), (8, 1)), TensorArg("x", (8, 4), (1, 8))),
                (), (Buffer("m", Layout.contiguous([4, 4], F32)),))
    g = _graph(red, mm, outputs=[TensorArg("s", (4,), (1,)), TensorArg("m", (4, 4), (4, 1))])
    g.verify()
    x = torch.randn(4, 8)
    s, m = ReferenceRunner(g)(x)
    torch.testing.assert_close(s, x.sum(1))
    torch.testing.assert_close(m, x @ x.t())


def test_reference_is_vectorized():
    import time

    n = 1 << 22
    node = Pointwise("a", (n,), Op("exp", (Load("x", i0, F32),), F32), Buffer("a", Layout.contiguous([n], F32)))
    g = _graph(node, inputs=(("x", [n]),))
    x = torch.randn(n)
    t = time.perf_counter()
    (out,) = ReferenceRunner(g)(x)
    assert time.perf_counter() - t < 5.0  # a Python loop per element would take minutes
    torch.testing.assert_close(out, x.exp())


def test_substitute_renames_clamps_as_xreplace_does():
    """`ir.index.substitute` rebuilds Min/Max without sympy's evaluation for a one-to-one renaming of
    loop variables (sympy's pairwise comparison of a clamp's arguments took most of a ResNet's pass
    time): the result must be exactly what xreplace gives, and anything else goes through xreplace."""
    from passline.ir.index import VarKind, loop_vars, size_var, substitute

    i0, i1, i2 = loop_vars(VarKind.OUTER, 3)
    r0, r1 = loop_vars(VarKind.REDUCTION, 2)
    s0 = size_var("s0")
    exprs = [143 * i0 + sympy.Min(10, sympy.Max(0, i2 - 1) + 1) + 11 * sympy.Min(12, sympy.Max(0, i1 - 1)),
             sympy.Min(s0 // 2 - 1, sympy.Max(0, i0 - 2) + i1) * s0 + i2,
             sympy.Max(i0, i1 + 1) + sympy.Min(i0 - i1, 3),
             i0 + 2 * i1]
    renamings = [{i0: i1, i1: i0}, {i0: r0, i1: r1, i2: i0}, {i2: r0}]
    for e in exprs:
        for m in renamings:
            assert substitute(e, m) == e.xreplace(m), (e, m)
    # not a renaming onto fresh symbols: xreplace's own result (Max(i1, i1 + 1) evaluates to i1 + 1)
    e = sympy.Max(i0, i1 + 1)
    for m in ({i0: i1}, {i0: i2, i1: i2}, {i0: 2 * i1}, {i0: s0}):
        assert substitute(e, m) == e.xreplace(m)
    assert substitute(e, {i0: i1}) == i1 + 1
