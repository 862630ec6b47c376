"""The scheduling passes: dce, inline_pointwise, fuse, reorder_loops, mix_order_reduction — on hand-built graphs and
on real forward/backward graphs, always checked against eager."""
import pytest
import sympy
import torch
from modules import MIXED, RMSNorm

import passline
from passline.ir import (
    Buffer,
    Cast,
    Constant,
    Extern,
    FusedNode,
    Layout,
    Load,
    MixOrderNode,
    Op,
    Pointwise,
    Reduction,
    TensorArg,
    loop_vars,
    walk,
)
from passline.ir.loops import members, shape
from passline.lowering import GraphInput, Program
from passline.pipeline import SchedulerGraph
from passline.testing import assert_matches_eager
from passline.testing.synthetic import chain_and_fanout

F32, I64 = torch.float32, torch.int64
i0, i1 = loop_vars("i", 2)
(r0,) = loop_vars("r", 1)


def pw(name, src, size=(4, 8), index=None, op="add"):
    index = index if index is not None else size[1] * i0 + i1
    return Pointwise(name, size, Op(op, (Load(src, index, F32), Constant(1.0, F32)), F32),
                     Buffer(name, Layout.contiguous(size, F32)), origins=(name,))


def graph(*nodes, outputs=(), size=(4, 8)):
    x = GraphInput("x", buffer=Buffer("x", Layout.contiguous(size, F32)))
    outs = [TensorArg(n, size, (size[1], 1)) for n in outputs]
    return SchedulerGraph.from_program(Program((x,), tuple(nodes), tuple(outs)))


def run(text, g):
    return passline.PassManager(text).run(g)


# -- dce ----------------------------------------------------------------------------------------------
def test_dce_removes_dead_nodes_to_a_fixed_point_and_keeps_side_effects():
    rand = Extern("r", torch.ops.aten.rand.default, ([4, 8],), (), (Buffer("r", Layout.contiguous([4, 8], F32)),))
    g = graph(pw("a", "x"), pw("dead1", "a"), pw("dead2", "dead1"), rand, pw("b", "a"), outputs=["b"])
    out, (rec,) = run("dce", g)
    assert sorted(out.names()) == ["a", "b", "r"]
    assert rec.stats == {"dce_removed": 2}


# -- inline_pointwise ----------------------------------------------------------------------------------
def _weighted(w_dtype=F32, body_dtype=F32):
    """x [4, 8] times p = w + 1 over [8] (p's body computed in `body_dtype`, stored as `w_dtype`)."""
    w = GraphInput("w", buffer=Buffer("w", Layout.contiguous([8], F32)))
    x = GraphInput("x", buffer=Buffer("x", Layout.contiguous([4, 8], F32)))
    p = Pointwise("p", (8,), Op("add", (Load("w", i0, F32), Constant(1.0, F32)), body_dtype),
                  Buffer("p", Layout.contiguous([8], w_dtype)))
    c = Pointwise("c", (4, 8), Op("mul", (Load("x", 8 * i0 + i1, F32), Cast(Load("p", i1, w_dtype), F32)), F32),
                  Buffer("c", Layout.contiguous([4, 8], F32)))
    return SchedulerGraph.from_program(Program((w, x), (p, c), (TensorArg("c", (4, 8), (8, 1)),)))


def test_inline_pointwise_recomputes_a_broadcast_producer_in_its_consumer():
    from passline.backends.reference import ReferenceRunner

    w, x = torch.randn(8), torch.randn(4, 8)
    g = _weighted()
    out, (rec,) = run("inline_pointwise", g.copy())
    assert out.names() == ["c"] and rec.stats == {"inlined_pointwise": 1}
    assert "p" not in out.node("c").read_names() and set(out.node("c").read_names()) == {"w", "x"}
    torch.testing.assert_close(ReferenceRunner(out)(w, x)[0], x * (w + 1))
    # the stored value was rounded to bfloat16: the recomputed one is rounded the same way
    g = _weighted(torch.bfloat16)
    out, _ = run("inline_pointwise", g.copy())
    assert out.names() == ["c"]
    assert torch.equal(ReferenceRunner(out)(w, x)[0], ReferenceRunner(g)(w, x)[0])
    assert torch.equal(ReferenceRunner(out)(w, x)[0], x * (w + 1).bfloat16().float())


def test_inline_pointwise_gates():
    # an output stays; so does a producer the consumer can fuse with (same loop nest)
    g = _weighted()
    g.outputs = g.outputs + (TensorArg("p", (8,), (1,)),)
    assert sorted(run("inline_pointwise", g)[0].names()) == ["c", "p"]
    g = graph(pw("a", "x"), pw("b", "a"), outputs=["b"])
    assert sorted(run("inline_pointwise", g)[0].names()) == ["a", "b"]
    # two loads are over max_loads=1 by default, allowed with max_loads=2
    fn = lambda x, a, b: x * (a + b)
    args = [torch.randn(6, 8), torch.randn(8), torch.randn(8)]
    for text, kernels in (("inline_pointwise, fuse", 2), ("inline_pointwise(max_loads=2), fuse", 1)):
        assert assert_matches_eager(fn, args, pipeline=text, codegen="reference").reports[0].kernels == kernels


@pytest.mark.parametrize("fn, x_shape, inlined, kernels_before", [
    (lambda x, w: x * w.float(), (6, 8), 1, 2),                               # a weight cast, read by row
    (lambda x, w: x + w.float().exp()[:, None][:6] * 2, (6, 8), 3, 3),        # a chain, a column broadcast
    # into a column reduction: fusion alone already made it one kernel (a per-column prologue)
    (lambda x, w: (x.t() * (w.float() + 1)).sum(0), (8, 6), 2, 1),
])
def test_inline_pointwise_matches_eager(fn, x_shape, inlined, kernels_before):
    x, w = torch.randn(*x_shape), torch.randn(8).bfloat16()
    assert assert_matches_eager(fn, [x, w]).reports[0].kernels == 1
    # inline_pointwise's own count, without recompute_columns (which reads a column reduction's producers
    # through first, the third case's included)
    pipeline = passline.DEFAULT_PIPELINE.replace("recompute_columns, dce, ", "")
    report = assert_matches_eager(fn, [x, w], pipeline=pipeline).reports[0]
    assert report.metrics.counters["inlined_pointwise"] == inlined
    assert report.kernels == 1
    without = pipeline.replace("inline_pointwise, ", "")
    assert assert_matches_eager(fn, [x, w], pipeline=without).reports[0].kernels == kernels_before


def test_inline_pointwise_removes_the_weight_cast_of_a_norm_backward():
    model = torch.nn.LayerNorm(64).to(torch.bfloat16)
    be = assert_matches_eager(model, [torch.randn(128, 64, dtype=torch.bfloat16, requires_grad=True)], pipeline=MIXED)
    bwd = be.reports[-1]
    assert bwd.metrics.counters["inlined_pointwise"] >= 1
    (mix,) = bwd.graph.nodes()  # the weight cast was a node of its own: now only the mix-order node
    assert isinstance(mix, MixOrderNode)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inline_pointwise_folds_cross_entropy_backward_into_one_kernel(dtype):
    """Cross-entropy backward's per-row factors (the target where it is not ignored, the upstream gradient
    over the count of targets, the one-hot's row sum) are made from the inputs alone and broadcast over the
    vocabulary: recomputed in the [rows, vocabulary] kernel, not launched ahead of it."""
    logits = torch.randn(48, 300, dtype=dtype, requires_grad=True)
    target = torch.randint(0, 300, (48,))
    target[::5] = -100  # ignored rows: the factors must still be zero there
    fn = lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, label_smoothing=0.1)
    bwd = assert_matches_eager(fn, [logits, target]).reports[-1]
    assert bwd.metrics.counters["inlined_broadcast"] >= 1
    assert bwd.kernels == 1, bwd.graph.format()
    off = passline.DEFAULT_PIPELINE.replace("inline_pointwise", "inline_pointwise(broadcast_ratio=0)")
    assert assert_matches_eager(fn, [logits, target], pipeline=off).reports[-1].kernels > 1


@pytest.mark.parametrize("grad", [False, True])
def test_inline_pointwise_lets_label_smoothing_read_the_logits_in_one_kernel(grad):
    """Label smoothing adds a pass over the logits (their row sum) whose per-row result reads the mask
    `target == ignore_index`, a graph output when training (saved for backward). Fused with the target's
    term it tied the two passes over the logits into a cycle; recomputed by its readers from the target,
    the max, log-sum-exp and row sum are one kernel."""
    logits = torch.randn(48, 300, requires_grad=grad)
    target = torch.randint(0, 300, (48,))
    target[::5] = -100
    fn = lambda x, t: torch.nn.functional.cross_entropy(x, t, label_smoothing=0.1)

    def logit_readers(report):  # kernels that loop over rows x vocabulary (the target's logit is a gather)
        return [n.name for n in report.graph.nodes()
                if n.numel * getattr(n, "reduction_numel", 1) == logits.numel()]

    fwd = assert_matches_eager(fn, [logits, target]).reports[0]
    assert fwd.metrics.counters["inlined_input"] >= 1
    assert len(logit_readers(fwd)) == 1, fwd.graph.format()
    # without the recompute, fuse gets there too now: the pair the cycle refused is tried again once the
    # path through the mask has joined the row kernel (test_fuse_retries_a_pair_whose_path_closes_later)
    off = passline.DEFAULT_PIPELINE.replace("inline_pointwise", "inline_pointwise(input_max_ops=0)")
    assert len(logit_readers(assert_matches_eager(fn, [logits, target], pipeline=off).reports[0])) == 1


def test_inline_pointwise_recomputes_a_value_of_one_input_point_only_where_it_pays():
    """A mask of the input read by two loops is recomputed in each; an output stays as well. A mask of a
    wider input (int64 → bool) is recomputed only when some loop of the graph is much bigger than it."""
    mask = Pointwise("m", (8,), Op("eq", (Load("t", i0, I64), Constant(-100, I64)), torch.bool),
                     Buffer("m", Layout.contiguous([8], torch.bool)))
    a = Pointwise("a", (8,), Op("where", (Load("m", i0, torch.bool), Constant(0.0, F32), Load("x", i0, F32)), F32),
                  Buffer("a", Layout.contiguous([8], F32)))
    b = Pointwise("b", (8,), Op("where", (Load("m", i0, torch.bool), Load("x", i0, F32), Constant(1.0, F32)), F32),
                  Buffer("b", Layout.contiguous([8], F32)))
    big = Pointwise("big", (8, 16), Op("mul", (Load("y", 16 * i0 + i1, F32), Constant(2.0, F32)), F32),
                    Buffer("big", Layout.contiguous([8, 16], F32)))

    def program(*nodes, outputs):
        inputs = [GraphInput(n, buffer=Buffer(n, Layout.contiguous(size, dtype)))
                  for n, size, dtype in (("t", [8], I64), ("x", [8], F32), ("y", [8, 16], F32))]
        outs = [TensorArg(n.name, n.output.layout.size, n.output.layout.stride) for n in nodes
                if n.name in outputs]
        return SchedulerGraph.from_program(Program(tuple(inputs), tuple(nodes), tuple(outs)))

    out, (rec,) = run("inline_pointwise(max_ops=0)", program(mask, a, b, big, outputs="m a b big"))
    assert rec.stats["inlined_input"] == 1 and "m" in out.names() and not out.consumers("m")
    assert all("t" in out.node(n).read_names() for n in ("a", "b"))
    out, (rec,) = run("inline_pointwise(max_ops=0)", program(mask, a, b, big, outputs="a b big"))
    assert rec.stats["inlined_input"] == 1 and "m" not in out.names()
    # no loop 8x bigger than the mask: the int64 target is not read twice in place of the bool mask
    out, (rec,) = run("inline_pointwise(max_ops=0)", program(mask, a, b, outputs="a b"))
    assert not rec.stats.get("inlined_input") and "m" in out.names()


def test_inline_pointwise_broadcasts_only_values_of_the_inputs_into_bigger_loops():
    """A per-row value computed from a reduction stays a node (fusion decides where it runs), and so does a
    value of the inputs read by a loop of its own size."""
    s = Reduction("s", (4,), (8,), "sum", Load("x", 8 * i0 + r0, F32), Buffer("s", Layout.contiguous([4], F32)))
    f = Pointwise("f", (4,), Op("mul", (Load("s", i0, F32), Constant(2.0, F32)), F32),
                  Buffer("f", Layout.contiguous([4], F32)))
    big = Pointwise("big", (4, 8), Op("mul", (Load("x", 8 * i0 + i1, F32), Load("f", i0, F32)), F32),
                    Buffer("big", Layout.contiguous([4, 8], F32)))
    out, (rec,) = run("inline_pointwise(max_ops=0)", graph(s, f, big, outputs=["big"]))
    assert "f" in out.names() and not rec.stats.get("inlined_broadcast")
    # the same factor made from the input itself (x's first column), read by the [4, 8] loop: recomputed
    g = Pointwise("g", (4,), Op("mul", (Load("x", 8 * i0, F32), Constant(2.0, F32)), F32),
                  Buffer("g", Layout.contiguous([4], F32)))
    big = Pointwise("big", (4, 8), Op("mul", (Load("x", 8 * i0 + i1, F32), Load("g", i0, F32)), F32),
                    Buffer("big", Layout.contiguous([4, 8], F32)))
    out, (rec,) = run("inline_pointwise(max_ops=0, broadcast_ratio=8)", graph(g, big, outputs=["big"]))
    assert out.names() == ["big"] and rec.stats["inlined_broadcast"] == 1
    # ... unless the loop is not big enough
    out, (rec,) = run("inline_pointwise(max_ops=0, broadcast_ratio=16, chain_max_ops=0)",
                      graph(g, big, outputs=["big"]))
    assert "g" in out.names() and not rec.stats.get("inlined_broadcast")
    # (with chains on, one load of x and one operation: recomputed as a chain, whatever the ratio)
    out, (rec,) = run("inline_pointwise(max_ops=0, broadcast_ratio=16)", graph(g, big, outputs=["big"]))
    assert out.names() == ["big"] and rec.stats["inlined_chain"] == 1


# -- fuse -----------------------------------------------------------------------------------------------
def test_fuse_chain_and_siblings():
    g = graph(pw("a", "x"), pw("b", "a"), pw("c", "b"), pw("s1", "x", op="mul"), outputs=["c", "s1"])
    out, _ = run("fuse", g)
    (node,) = out.nodes()
    assert isinstance(node, FusedNode) and set(node.member_names()) == {"a", "b", "c", "s1"}


def test_fuse_prologue_reduction_epilogue():
    red = Reduction("s", (4,), (8,), "sum", Load("a", 8 * i0 + r0, F32), Buffer("s", Layout.contiguous([4], F32)))
    epi = Pointwise("e", (4,), Op("mul", (Load("s", i0, F32), Constant(2.0, F32)), F32),
                    Buffer("e", Layout.contiguous([4], F32)))
    g = graph(pw("a", "x"), red, epi)
    g.outputs = (TensorArg("e", (4,), (1,)),)
    out, _ = run("fuse", g)
    (node,) = out.nodes()
    assert node.ranges == (4,) and node.reduction_ranges == (8,)
    assert [m.name for m in node.nodes] == ["a", "s", "e"]


def test_fuse_refusal_reasons():
    from passline.pipeline.metrics import Metrics

    shifted = pw("b", "a", size=(3, 6), index=6 * i0 + i1 + 6)  # reads a one row further on
    # same numel as a, shares x with a, loops that split to no nest of a's: 4 x 6 against 3 x 8 (a 2 x 16
    # against 4 x 8 would fuse, both split to 2 x 2 x 8: fuse's common_loops)
    other = pw("c", "x", size=(3, 8))
    g = graph(pw("a", "x", size=(4, 6)), shifted, other, size=(4, 6))
    g.outputs = (TensorArg("b", (3, 6), (6, 1)), TensorArg("c", (3, 8), (8, 1)))
    m = Metrics()
    out, _ = passline.PassManager("fuse").run(g, m)
    assert len(out) == 3
    assert {(r.a, r.b, r.reason) for r in m.refusals} == {("a", "b", "different numel"),
                                                          ("a", "c", "loop structure")}
    assert m.fusion_failures == {"different numel": 1, "loop structure": 1}


def test_fuse_indexing_mismatch_in_one_loop_nest():
    from passline.pipeline.metrics import Metrics

    # b reads a at a constant column: same loop nest, other points
    g = graph(pw("a", "x"), pw("b", "a", index=8 * i0), outputs=["b"])
    m = Metrics()
    out, _ = passline.PassManager("fuse").run(g, m)
    assert len(out) == 2 and [r.reason for r in m.refusals] == ["indexing mismatch"]


def test_fuse_respects_max_nodes():
    out, _ = run("fuse(max_nodes=2)", graph(pw("a", "x"), pw("b", "a"), pw("c", "b"), outputs=["c"]))
    assert sorted(len(getattr(n, "nodes", (n,))) for n in out.nodes()) == [1, 2]


def test_fuse_never_creates_a_cycle():
    # a -> ext -> b and a -> b: fusing a with b would put ext both before and after the group
    ext = Extern("e", torch.ops.aten.cumsum.default, (TensorArg("a", (4, 8), (8, 1)), 1), (),
                 (Buffer("e", Layout.contiguous([4, 8], F32)),))
    b = Pointwise("b", (4, 8), Op("add", (Load("a", 8 * i0 + i1, F32), Load("e", 8 * i0 + i1, F32)), F32),
                  Buffer("b", Layout.contiguous([4, 8], F32)))
    from passline.pipeline.metrics import Metrics

    m = Metrics()
    out, _ = passline.PassManager("fuse").run(graph(pw("a", "x"), ext, b, outputs=["b"]), m)
    assert len(out) == 3
    assert "cycle" in {r.reason for r in m.refusals}


@pytest.mark.parametrize("upcast", [False, True])
def test_fuse_retries_a_pair_whose_path_closes_later(upcast):
    """Cross-entropy's gather of the target logit (minus the row's max and log-sum) ranks first, before the
    row statistics it reads are one group: refused then for a path through them. Tried again once they are,
    it joins the row kernel, logits cast to float32 first or not (with the cast, it used to fuse into the
    mean over rows instead: 8192 dependent gathers in one program, 12 us of an H200's 19)."""
    x, t = torch.randn(64, 100, dtype=torch.bfloat16), torch.randint(0, 100, (64,))
    be = assert_matches_eager(lambda x, t: torch.nn.functional.cross_entropy(x.float() if upcast else x, t),
                              [x, t])
    graph = be.reports[0].graph
    rows = [n for n in graph.nodes() if tuple(getattr(n, "reduction_ranges", ())) == (100,)]
    assert len(rows) == 1 and be.reports[0].kernels == 2, graph.format()
    assert any(ld.indirect for m in rows[0].nodes for ld in walk(m.body) if isinstance(ld, Load)), graph.format()


def test_fuse_joins_independent_one_point_nodes_and_only_those():
    """Nodes of one point each that share nothing join one kernel (launches saved: `small`); one reading
    another's result through an extern call does not (a cycle), nor do nodes of more points than `small`."""
    from passline.pipeline.metrics import Metrics

    def one(name, src, index=0):
        return pw(name, src, size=(1,), index=sympy.Integer(index))

    ext = Extern("e", torch.ops.aten.cumsum.default, (TensorArg("c", (1,), (1,)), 0), (),
                 (Buffer("e", Layout.contiguous([1], F32)),))
    g = graph(one("a", "x"), one("b", "x", 5), one("c", "x", 9), ext, one("d", "e"), one("w", "x", 3),
              outputs=["a", "b", "d", "w"])
    g.outputs = tuple(TensorArg(n, (1,), (1,)) for n in ("a", "b", "d", "w"))
    m = Metrics()
    out, _ = passline.PassManager("fuse(horizontal=false)").run(g.copy(), m)
    groups = sorted(sorted(n.member_names() if isinstance(n, FusedNode) else [n.name]) for n in out.nodes()
                    if not isinstance(n, Extern))
    # a, b, c and w share no buffer and none depends on another; d reads c through the extern
    assert groups == [["a", "b", "c", "w"], ["d"]], groups
    assert "cycle" in {r.reason for r in m.refusals}
    out, _ = passline.PassManager("fuse(horizontal=false, small=0)").run(g.copy())
    assert len(out) == 6
    # four points each: not small at small=1, small at small=4
    g4 = graph(pw("a", "x", size=(4,), index=i0), pw("b", "x", size=(4,), index=i0 + 4), outputs=[])
    g4.outputs = tuple(TensorArg(n, (4,), (1,)) for n in "ab")
    assert len(passline.PassManager("fuse(horizontal=false)").run(g4.copy())[0]) == 2
    assert len(passline.PassManager("fuse(horizontal=false, small=4)").run(g4.copy())[0]) == 1


def test_small_pairs_do_not_ride_a_grown_group():
    """A pair that is a candidate only for being small is judged by its groups when its turn comes: the sum's
    one-point division has by then joined the sum (a vertical fusion, ranked first), so the in-place bumps,
    one point each, join each other and not the sum's kernel (no saving there; a kernel holding an in-place
    write is neither timed nor mixed)."""
    def f(x, scale, count):
        s = x.sum() / 7
        scale.mul_(0.9)
        count.add_(1)
        return s

    be = passline.backend(codegen="reference", fallback="raise")
    x, scale, count = torch.randn(1000), torch.ones(()), torch.zeros((), dtype=torch.long)
    out = torch.compile(f, backend=be)(x, scale, count)
    torch.testing.assert_close(out, x.sum() / 7)
    assert scale.item() == pytest.approx(0.9) and count.item() == 1
    graph = be.reports[0].graph
    writes = [n for n in graph.nodes() if getattr(n, "mutates", ())]
    assert len(writes) == 1 and shape(writes[0]) == ((), ()), graph.format()
    assert len(members(writes[0])) >= 2, graph.format()  # the two bumps: one kernel


@pytest.mark.parametrize("codegen", ["triton", "reference"])
def test_batchnorm_counters_are_bumped_in_one_kernel(codegen):
    """Each training BatchNorm adds one to its `num_batches_tracked`, a one-point kernel of its own: with
    fuse's `small`, a model's counters are one kernel. The counters, running statistics, outputs and
    gradients stay eager's, with a norm used twice (two bumps of one counter, in order)."""
    import copy

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)
            self.b1, self.b2 = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
            self.b3 = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.b1(self.c1(x)).relu()
            y = self.b2(self.c2(y))
            return self.b1(self.b3(y) * 2)  # b1 again: its counter bumped twice

    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)
    be = passline.backend(codegen=codegen, fallback="raise")
    f = torch.compile(net, backend=be)
    for _ in range(2):
        x = torch.randn(2, 3, 10, 10)
        f(x).square().sum().backward()
        ref(x).square().sum().backward()
    graph = be.reports[0].graph
    bumps = [n for n in graph.nodes() if not isinstance(n, Extern) and shape(n) == ((), ())]
    # three counters (b1's bumped twice, one after the other in the kernel): one kernel
    assert len(bumps) == 1 and len(bumps[0].nodes) >= 4, graph.format()
    assert len(bumps[0].mutates) == 3, graph.format()  # each counter written back once
    for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    for (name, a), b in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("n", [1000, 10000])
def test_fuse_scales_to_large_graphs(n):
    out, records = passline.PassManager("fuse").run(chain_and_fanout(n))
    # a chain of n/2 and a fan-out of n/2, in groups of at most 64 nodes
    assert len(out) == 2 * -(-(n // 2) // 64)
    assert all(len(node.nodes) <= 64 for node in out.nodes())


# -- end to end -------------------------------------------------------------------------------------
def test_layer_norm_forward_is_one_kernel():
    be = assert_matches_eager(torch.nn.LayerNorm(64), [torch.randn(128, 64)])
    assert be.reports[0].kernels == 1


def minimum_bytes(report) -> int:
    """Every graph input read once, every output written once, plus the mix-order workspace written
    and read back: what a perfect single pass moves."""
    g = report.graph
    inputs = sum(b.nbytes for b in g.input_buffers().values())
    outputs = sum(g.buffers()[o.buffer].nbytes for o in g.outputs
                  if isinstance(o, TensorArg) and o.buffer not in g.input_buffers())
    workspace = sum(2 * int(n.workspace_bytes()) for n in g.nodes() if isinstance(n, MixOrderNode))
    return inputs + outputs + workspace


# Many short rows, and few long ones (one block of 16 split rows). The interpreter's reductions cost a
# Python call per element, so the shapes are small (once (512, 64) and (16, 1024)), and odd against the
# blocks: 100 rows are not a whole number of 16-row splits, 48 and 200 columns are not powers of two
# (masked tiles). Not fewer rows: at 12 the weight and workspace bytes, per column, make the unmixed
# pipeline's extra reads of x and dy under half of the minimum (bfloat16 RMSNorm: 1.48x, 1.52x at 16).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(100, 48), (16, 200)])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norm_backward_mix_order(norm, shape, dtype):
    rows, cols = shape
    model = (torch.nn.LayerNorm(cols) if norm == "layer_norm" else RMSNorm(cols)).to(dtype)
    x = torch.randn(rows, cols, dtype=dtype, requires_grad=True)
    be = assert_matches_eager(model, [x], pipeline=MIXED)
    bwd = be.reports[-1]
    big = [n for n in bwd.graph.nodes() if any(
        b.layout.numel == rows * cols for b in getattr(n, "output_buffers", lambda: ())())]
    mixed = [n for n in bwd.graph.nodes() if isinstance(n, MixOrderNode)]
    assert len(mixed) == 1 and big == mixed, bwd.graph.format()
    assert bwd.bytes_accessed <= 1.15 * minimum_bytes(bwd)
    plain = assert_matches_eager(model, [x], pipeline="dce, repeat(fuse, reorder_loops)").reports[-1]
    assert plain.bytes_accessed >= 1.5 * minimum_bytes(bwd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(100, 48), (3, 20, 48)])  # small: see test_norm_backward_mix_order
def test_bias_gradient_mixes_with_the_pointwise_gradient(shape, dtype):
    # gelu(h + b) backward: dh is pointwise over rows x columns and db is its sum over the rows; as one
    # mix-order node (no row reduction) h and dy are read once, dh written once, db summed on the way
    fn = lambda h, b: torch.nn.functional.gelu(h + b)
    h = torch.randn(*shape, dtype=dtype, requires_grad=True)
    b = torch.randn(shape[-1], dtype=dtype, requires_grad=True)
    bwd = assert_matches_eager(fn, [h, b], pipeline=MIXED).reports[-1]
    (mix,) = [n for n in bwd.graph.nodes() if isinstance(n, MixOrderNode)]
    assert len(bwd.graph) == 1 and mix.rows == h.numel() // shape[-1] and mix.columns == shape[-1]
    assert bwd.bytes_accessed <= 1.15 * minimum_bytes(bwd)
    plain = assert_matches_eager(fn, [h, b], pipeline="dce, repeat(fuse, reorder_loops)").reports[-1]
    workspace = 2 * int(mix.workspace_bytes())  # written, then read by the finishing kernel
    assert plain.kernels == 2  # dh read back by the column sum instead of the workspace
    assert plain.bytes_accessed - bwd.bytes_accessed == h.numel() * h.element_size() - workspace


def test_mix_order_never_reads_a_column_epilogue_inside_the_row_loop():
    # x * exp(x.sum(0)) on a transposed x: memory_order runs the product's loops column-first, so it fits
    # the column side of a mix with x.sum(1); but it reads exp(x.sum(0)), an epilogue of the column sum
    # that only the finishing kernel computes (kept: the backward saves it). Merged so, the main kernel
    # loaded that buffer before any kernel had written it (every element of the product wrong). The
    # other pairing is right: the sum over x's columns as the row side, whose epilogue runs per row
    from passline.backends.triton.kernel import generate_mix
    from passline.backends.triton.printer import Unsupported

    fn = lambda x: (x.sum(1), x * x.sum(0).exp())
    be = assert_matches_eager(fn, [torch.randn(12, 16).t().requires_grad_()], codegen="triton", pipeline=MIXED)
    forward = be.reports[0]
    (mix,) = [n for n in forward.graph.nodes() if isinstance(n, MixOrderNode)]
    assert {m.body.name for m in mix.row.members() if isinstance(m, Pointwise) and isinstance(m.body, Op)} >= {"exp"}
    assert any("needs a finished column result inside the row loop" in f.detail
               for f in forward.metrics.refusals if f.pass_name == "mix_order_reduction")
    # the generator refuses the wrong pairing too, should one reach it
    (column,) = mix.column_groups
    with pytest.raises(Unsupported, match="computed only after the row loop"):
        generate_mix(MixOrderNode("wrong", column, (mix.row,), 16), forward.graph, True,
                     {"XBLOCK": 16, "RBLOCK": 16, "SPLIT": 16})


def test_transpose_fuses_only_with_reorder_loops():
    fn = lambda x: (x.exp().t() + 1).sin()
    x = torch.randn(16, 24)
    without = assert_matches_eager(fn, [x], pipeline="dce, fuse").reports[0]
    with_ = assert_matches_eager(fn, [x], pipeline="dce, fuse, reorder_loops, fuse").reports[0]
    assert without.kernels == 2 and with_.kernels == 1
    assert with_.metrics.counters["num_loop_reordering"] == 1
    assert without.metrics.counters["num_loop_reordering"] == 0


def test_reorder_loops_permutes_a_pointwise_group():
    # fuse makes groups on both sides of the transpose before reorder_loops sees the pair ([exp, mul] over
    # [16, 24], [add, sin] over [24, 16]): the group's loops are permuted as one, every member alike
    fn = lambda x: ((x.exp() * 2).t() + 1).sin()
    x = torch.randn(16, 24)
    without = assert_matches_eager(fn, [x], pipeline="dce, fuse").reports[0]
    with_ = assert_matches_eager(fn, [x], pipeline="dce, fuse, reorder_loops, fuse").reports[0]
    assert [len(n.members()) for n in without.graph.nodes()] == [2, 2]
    assert with_.kernels == 1 and with_.metrics.counters["num_loop_reordering"] == 1


def test_explain_gives_the_recorded_reason():
    fn = lambda x: (x.exp().t() + 1).sin()
    report = assert_matches_eager(fn, [torch.randn(16, 24)], pipeline="dce, fuse").reports[0]
    text = passline.explain(report, "buf0", "buf1")
    assert "not fused" in text and "loop order mismatch" in text
    report = assert_matches_eager(fn, [torch.randn(16, 24)], pipeline="dce, fuse, reorder_loops, fuse").reports[0]
    assert "run in one kernel" in passline.explain(report, "buf0", "buf1")


@pytest.mark.parametrize("pipeline", ["dce", "fuse", "fuse(horizontal=false)", "fuse, reorder_loops",
                                      "reorder_loops, fuse", "fuse, mix_order_reduction",
                                      "dce, repeat(fuse, reorder_loops; max_iter=2), "
                                      "mix_order_reduction(split_rows=4)"])
def test_every_pass_keeps_results(pipeline):
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 32), torch.nn.GELU())
    assert_matches_eager(model, [torch.randn(24, 32, requires_grad=True)], pipeline=pipeline)
    assert_matches_eager(lambda x: torch.softmax(x.t() * 2, -1).sum(0), [torch.randn(12, 20)], pipeline=pipeline)


def test_memory_order_walks_channels_last_outputs_in_memory_order():
    # hand facts: a channels_last [2, 8, 5, 5] output has strides (200, 1, 40, 8), so its loops run
    # N, H, W, C (C innermost, stride 1); a contiguous output is left alone; results match eager
    from passline.testing import assert_matches_eager

    x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    be = assert_matches_eager(lambda x: torch.relu(x) * 2, [x], pipeline="memory_order")
    nodes = be.reports[0].graph.nodes()
    assert [n.ranges for n in nodes] == [(2, 5, 5, 8)] * len(nodes)
    assert be.reports[0].metrics.counters["num_memory_order"] == len(nodes)
    be = assert_matches_eager(lambda x: torch.relu(x) * 2, [x.contiguous()], pipeline="memory_order")
    assert be.reports[0].metrics.counters["num_memory_order"] == 0
    # a channels_last conv block trains like eager with the default pipeline, which runs the pass
    block = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    block = block.to(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last).requires_grad_()
    be = assert_matches_eager(block, [x])
    assert sum(r.metrics.counters["num_memory_order"] for r in be.reports) > 0


WITHOUT_MERGE = passline.DEFAULT_PIPELINE.replace("merge_loops, ", "")



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_flattened_views_cast_fuses_with_or_without_merge_loops(dtype):
    """GPT's loss: cross-entropy of a float32 cast over [B, T, V] viewed as [B*T, V]: the cast and the
    log-softmax's reductions over [B*T | V] differ in loop structure, and as the target gather reads the cast
    too it is not inlined (its full-size float32 output would be written and read back). merge_loops merges
    the cast to [B*T*V], and fuse splits it to [B*T, V] and fuses it with the reductions. Without merge_loops,
    fuse merges the cast's [B, T] loops into the reductions' rows itself (`merged_to_reduction`; its load
    walks them as one, so no division): the same kernels either way, no "loop structure" refusal left."""
    def fn(x, t):
        return torch.nn.functional.cross_entropy(x.float().flatten(0, 1), t.flatten())

    x = torch.randn(2, 3, 40, dtype=dtype, requires_grad=True)
    t = torch.randint(0, 40, (2, 3))
    be = assert_matches_eager(fn, [x, t], codegen="triton")
    new = be.reports[0]
    assert new.metrics.counters["merged_loops"] >= 1 and new.metrics.counters["split_loops"] >= 1
    assert new.metrics.counters["merged_to_reduction"] == 0
    old = assert_matches_eager(fn, [x, t], codegen="reference", pipeline=WITHOUT_MERGE).reports[0]
    assert old.metrics.counters["merged_to_reduction"] >= 1 and "FloorDiv" not in old.graph.format()
    for report in (new, old):
        assert "loop structure" not in {r.reason for r in report.metrics.refusals}
    assert len(new.graph.nodes()) == len(old.graph.nodes()) == 2, old.graph.format()


def test_merge_loops_merges_only_what_walks_memory_as_one():
    """(2, 3, 4) contiguous, read plain and through a transpose of its last two dims: dims 0 and 1 walk
    memory as one loop in every index (coefficients 12 and 4, 12 == 4 * 3) and merge; dims 1 and 2 do not,
    as the transposed read gives dim 2 the larger stride."""
    def fn(x):
        return x * 2 + x.transpose(1, 2).contiguous().transpose(1, 2)

    be = assert_matches_eager(fn, [torch.randn(2, 3, 4)], codegen="reference", pipeline="merge_loops")
    sizes = sorted(tuple(int(s) for s in n.ranges) for n in be.reports[0].graph.nodes())
    assert (6, 4) in sizes or (24,) in sizes, be.reports[0].graph.format()
    merged = be.reports[0].metrics.counters["merged_loops"]
    assert merged >= 1


def test_merge_pointwise_divides_only_what_does_not_walk_a_run_as_one():
    """[2, 5, 6] merged to [10, 6]: the store and a contiguous load take j in place of (i0, i1), no division;
    a broadcast over i1 (a [2, 6] operand) reads i0 back as j // 5 and an index value of i1 as (j // 1) % 5.
    No merge of a nest that is not a refinement, nor of a store that does not walk the run as one."""
    from passline.ir.body import IndexValue
    from passline.ir.index import FloorDiv, ModularIndexing
    from passline.ir.loops import merge_pointwise

    i0, i1, i2 = loop_vars("i", 3)
    j0, j1 = loop_vars("i", 2)  # the merged node's loops: named anew from i0 (the same symbols as i0, i1)
    first = Op("eq", (IndexValue(i1, torch.int64), Constant(0, torch.int64)), torch.bool)
    body = Op("where", (first, Load("g", 6 * i0 + i2, torch.float32), Load("x", 30 * i0 + 6 * i1 + i2, torch.float32)),
              torch.float32)
    node = Pointwise("buf0", (2, 5, 6), body, Buffer("buf0", Layout.contiguous((2, 5, 6), torch.float32)))
    merged = merge_pointwise(node, (10, 6))
    assert merged.ranges == (10, 6) and merged.output.layout.size == (10, 6)
    assert merged.output.layout.stride == (6, 1) and merged.store_index() == 6 * j0 + j1
    indices = {v.buffer: v.index for v in walk(merged.body) if isinstance(v, Load)}
    assert indices == {"g": 6 * FloorDiv(j0, 5) + j1, "x": 6 * j0 + j1}
    (value,) = [v.expr for v in walk(merged.body) if isinstance(v, IndexValue)]
    assert value == ModularIndexing(j0, 1, 5)
    assert merge_pointwise(node, (2, 30)).ranges == (2, 30)  # the inner run (5, 6) merged instead
    assert merge_pointwise(node, (4, 15)) is None  # no run of its loops makes 4
    # stored with dims 1 and 2 swapped (strides 30, 1, 5): (i0, i1) no longer walk as one, 30 != 1 * 5
    transposed = Pointwise("buf0", (2, 5, 6), body, Buffer("buf0", Layout((2, 5, 6), (30, 1, 5), torch.float32)))
    assert merge_pointwise(transposed, (10, 6)) is None


class _ClassToken(torch.nn.Module):
    """ViT's ends: a class token and position embeddings joined to the patches, a norm, a SiLU, a norm, and
    the class token's row taken."""

    def __init__(self, d, tokens):
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, d))
        self.pos = torch.nn.Parameter(torch.randn(1, tokens, d))
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, patches):
        x = self.norm1(torch.cat([self.cls.expand(patches.shape[0], -1, -1), patches], 1) + self.pos)
        return self.norm2(x * torch.sigmoid(x))[:, 0]


@pytest.mark.parametrize("tokens, dtype", [(7, torch.float32), (197, torch.bfloat16)])
def test_a_class_tokens_select_backward_merges_into_the_norms_backward(tokens, dtype):
    """The class token's select backward, where(t == 0, grad[b, c], 0) over [B, T, C], cannot merge its
    (b, t) loops (an index value of t, a broadcast over it), and the norm's backward reduces over [B*T | C]:
    fuse merges it into that nest by division, and the whole backward is one mix-order kernel and its column
    sums (the patches' and the position embedding's sums over the batch); the forward's cat and position add
    run inside the first norm. Were they refused, each would be a kernel writing a [B, T, C] buffer.
    MIXED: on a GPU target rows this few would not mix (too few programs for the SMs)."""
    model = _ClassToken(40, tokens).to(dtype)
    be = assert_matches_eager(model, [torch.randn(3, tokens - 1, 40, dtype=dtype, requires_grad=True)],
                              codegen="triton", pipeline=MIXED)
    fwd, bwd = be.reports
    assert fwd.kernels == 1 and fwd.metrics.counters["merged_to_reduction"] >= 1, fwd.graph.format()
    assert bwd.metrics.counters["merged_to_reduction"] >= 1
    (mix,) = [n for n in bwd.graph.nodes() if isinstance(n, MixOrderNode)]
    rest = [n for n in bwd.graph.nodes() if n is not mix]
    # the parameters' column sums (with their casts) are all the rest: no pointwise kernel over [B, T, C]
    assert all(shape(n)[1] for n in rest), bwd.graph.format()
    assert "ModularIndexing" in bwd.graph.format().split("column reductions")[1].split("\nbuf")[0]


def test_merged_by_division_under_dynamic_shapes():
    """Run-time batch and token counts: the division is by a size symbol; one compile serves both sizes."""
    model = _ClassToken(24, 5)
    torch._dynamo.reset()
    be = passline.backend(codegen="triton")
    compiled = torch.compile(lambda p, pos: model.norm1(torch.cat([model.cls.expand(p.shape[0], -1, -1), p], 1) + pos)
                             [:, 0], backend=be, dynamic=True)
    for batch, tokens in ((3, 5), (4, 9)):
        p = torch.randn(batch, tokens - 1, 24, requires_grad=True)
        pos = torch.randn(1, tokens, 24, requires_grad=True)
        g = torch.randn(batch, 24)
        out = compiled(p, pos)
        out.backward(g)
        ref_p, ref_pos = p.detach().clone().requires_grad_(), pos.detach().clone().requires_grad_()
        ref = model.norm1(torch.cat([model.cls.expand(batch, -1, -1), ref_p], 1) + ref_pos)[:, 0]
        ref.backward(g)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(p.grad, ref_p.grad)
        torch.testing.assert_close(pos.grad, ref_pos.grad)
    assert len(be.reports) == 2 and sum(r.metrics.counters["merged_to_reduction"] for r in be.reports) >= 2


# -- recompute_columns, tile_rows -------------------------------------------------------------------
WIDE = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(max_row_bytes=16)") \
    .replace("recompute_columns", "recompute_columns(min_row_bytes=16)")  # rows of 24 count as too wide to mix


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_recompute_columns_sums_norm_gradients_from_the_inputs(codegen):
    """LayerNorm's backward on rows too wide to mix: dw and db are summed from x and dy in one column kernel,
    not from float32 [rows, columns] buffers the row kernel writes for them."""
    x = torch.randn(6, 24, dtype=torch.bfloat16, requires_grad=True)
    for pipeline, recomputed, kernels in ((WIDE, 2, 2), (WIDE.replace("recompute_columns(min_row_bytes=16), dce, ", ""),
                                                           0, 3)):
        torch.manual_seed(0)
        backward = assert_matches_eager(torch.nn.LayerNorm(24).bfloat16(), [x], pipeline=pipeline,
                                        codegen=codegen).reports[1]
        graph = backward.graph
        read_back = [b for n in graph.nodes() for b in n.output_names()
                     if graph.readers(b) and graph.buffers()[b].layout.numel == 6 * 24]
        assert backward.metrics.counters["recomputed_columns"] == recomputed, graph.format()
        assert backward.kernels == kernels and (read_back == []) == bool(recomputed), graph.format()


def test_mix_order_leaves_a_sum_over_one_row_alone():
    # found by `make fuzz`: a pointwise node over (2, 1) and a row sum over its width of 1, which the pass saw as
    # a column sum over one row of 2 columns and mixed into a nest (1 | 2) its pointwise member did not fit (the
    # verifier caught it after the pass). A sum over a size-1 dim has nothing to mix: the graph runs as lowered
    from torch.fx.experimental.proxy_tensor import make_fx

    from passline.lowering import decomposition_table, lower_graph

    def f(x):
        return x.mean(1), x.abs()

    x = torch.randn(2, 1)
    graph = SchedulerGraph.from_program(lower_graph(make_fx(f, decomposition_table=decomposition_table())(x)))
    out, _ = passline.PassManager(passline.Pipeline.parse("mix_order_reduction(min_rows=1)")).run(graph)
    assert out.verify() is None and not any(type(n).__name__ == "MixOrderNode" for n in out.nodes())
    assert_matches_eager(f, [x], pipeline="mix_order_reduction(min_rows=1)", codegen="reference")


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_mix_order_takes_no_pointwise_columns_of_one_row(codegen):
    # found by fuzzing: a softmax over [1, n] with min_rows=1 — its pointwise nodes over (1, n) looked like
    # columns of one row each and were mixed as column sides with nothing to reduce; the Triton backend then
    # failed to compile the mix kernel (no partial sums to finish). Such a pair is refused
    pipeline = "mix_order_reduction(min_rows=1)"
    be = assert_matches_eager(lambda x: torch.softmax(x, 1), [torch.randn(1, 4)], pipeline=pipeline, codegen=codegen)
    assert not any(type(n).__name__ == "MixOrderNode" for r in be.reports for n in r.graph.nodes())


def test_recompute_columns_leaves_rows_mix_order_takes():
    """Below min_row_bytes the column sums are mix_order_reduction's (computed from the row side's values in
    the row kernel, the inputs read once): nothing is recomputed and the backward is one mixed kernel."""
    from passline.ir import MixOrderNode

    x = torch.randn(64, 24, requires_grad=True)
    backward = assert_matches_eager(torch.nn.LayerNorm(24), [x], codegen="reference", pipeline=MIXED).reports[1]
    assert backward.metrics.counters["recomputed_columns"] == 0
    assert [type(n) for n in backward.graph.nodes()] == [MixOrderNode], backward.graph.format()


@pytest.mark.parametrize("dtype, width, mixed", [(torch.float32, 5000, True), (torch.float32, 8192, True),
                                                 (torch.float32, 8193, False), (torch.bfloat16, 8193, False)])
def test_mix_order_gate_counts_a_rows_elements(dtype, width, mixed):
    """mix_order_reduction's gate is the bytes a row takes in registers, 4 an element at least (values are float32
    there whatever the input's dtype), up to 32 KB: float32 rows of 4097-8192 mix as bfloat16 ones do (gated by the
    input's 16 KB they ran as two kernels reading x and dy twice, 1.27-1.65x Inductor's time at 5000 wide on an
    H100); neither dtype mixes past 8192 (blocks of 16384: 1.5-1.8x), where recompute_columns takes the sums."""
    from passline.ir import MixOrderNode
    from passline.passes.legality import MIX_ROW_BYTES, row_bytes

    assert (row_bytes(width, dtype.itemsize) <= MIX_ROW_BYTES) == mixed
    x = torch.randn(8, width, dtype=dtype, requires_grad=True)
    backward = assert_matches_eager(torch.nn.LayerNorm(width).to(dtype), [x], codegen="reference",
                                    pipeline=MIXED).reports[1]
    nodes = backward.graph.nodes()
    assert any(isinstance(n, MixOrderNode) for n in nodes) == mixed, backward.graph.format()
    assert (backward.metrics.counters["recomputed_columns"] == 0) == mixed, backward.graph.format()


@pytest.mark.parametrize("width, mixed", [(5000, True), (12345, False)])
def test_mix_order_gate_under_dynamic_shapes_decides_as_at_the_traced_sizes(width, mixed):
    """A run-time row count leaves the width gates as they are, and a run-time width is gated at its traced
    value: until the twenty-first session a dynamic batch skipped the row gate (a bfloat16 LayerNorm 12345 wide
    was mixed, blocks of 16384, measured 1.5-1.8x Inductor's time static) and a run-time width skipped both."""
    import torch.nn.functional as F

    from passline.ir import MixOrderNode

    def mixes(graph):
        return any(isinstance(n, MixOrderNode) for n in graph.nodes())

    torch._dynamo.reset()  # a dynamic batch, the width a parameter's (a number)
    x = torch.randn(16, width, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    # MIXED: the row gate (16 rows fill no GPU's SMs) left out, the width gates kept
    be = passline.backend(fallback="raise", codegen="reference", pipeline=MIXED)
    torch.compile(torch.nn.LayerNorm(width).bfloat16(), backend=be)(x).float().sum().backward()
    assert be.reports[-1].graph.hints and mixes(be.reports[-1].graph) == mixed, be.reports[-1].graph.format()

    torch._dynamo.reset()  # rows and width both run-time sizes
    ins = [torch.randn(16, width, requires_grad=True), torch.randn(width, requires_grad=True)]
    ref = [t.detach().clone().requires_grad_() for t in ins]
    be = passline.backend(fallback="raise", codegen="reference", pipeline=MIXED)
    f = torch.compile(lambda x, w: F.layer_norm(x, (x.shape[-1],), w), backend=be, dynamic=True)
    f(*ins).sum().backward()
    F.layer_norm(ref[0], (width,), ref[1]).sum().backward()
    graph = be.reports[-1].graph
    assert any(not b.layout.size[-1].is_number for b in graph.input_buffers().values() if b.layout.size)  # width
    assert mixes(graph) == mixed and (be.reports[-1].metrics.counters["recomputed_columns"] == 0) == mixed, \
        graph.format()
    for a, b in zip(ins, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_a_float32_row_of_5000_mixes_in_one_kernel_through_triton():
    """The mixed kernel of a float32 RMSNorm backward 5000 wide (blocks of 8192) matches eager through Triton's
    interpreter: one mixed node, its kernel and the finishing sum over the row blocks."""
    from modules import RMSNorm

    from passline.ir import MixOrderNode

    x = torch.randn(12, 5000, requires_grad=True)
    backward = assert_matches_eager(RMSNorm(5000), [x], codegen="triton", pipeline=MIXED).reports[1]
    assert [type(n) for n in backward.graph.nodes()] == [MixOrderNode], backward.graph.format()


@pytest.mark.parametrize("rows, tiled", [(512, True), (200, False)])
def test_tile_rows_runs_per_row_pointwise_work_as_a_row_kernel(rows, tiled):
    """Cross-entropy's gradient (per-row max, log-sum-exp and target) becomes a (rows | classes) group when
    a GPU of 132 SMs would get two rows each; with fewer rows it stays flat. Both match eager through
    Triton's interpreter (the tiled group runs as a row kernel)."""
    from passline.ir import FusedNode

    pipeline = passline.DEFAULT_PIPELINE.replace("tile_rows", "tile_rows(sms=132)")
    x, t = torch.randn(rows, 40, requires_grad=True), torch.randint(0, 40, (rows,))
    backward = assert_matches_eager(lambda x, t: torch.nn.functional.cross_entropy(x, t), [x, t],
                                    pipeline=pipeline, codegen="triton").reports[1]
    groups = [n for n in backward.graph.nodes() if isinstance(n, FusedNode) and n.numel * max(1, n.reduction_numel)
              == rows * 40]
    assert len(groups) == 1 and bool(groups[0].reduction_ranges) == tiled, backward.graph.format()
    assert backward.metrics.counters["row_tiles"] == int(tiled)
    if tiled:
        (info,) = [k for k in backward.kernel_info if k.kind == "reduction"]
        assert "[:, None]" in info.source  # per-row operands load as [rows, 1]


def test_a_square_matrix_row_and_column_sums_stay_apart():
    """A row sum and a column sum of a square matrix have equal sizes: fuse must see they reduce over
    different axes (their reads of the shared input are each other's transposes) and refuse, as for any
    transposed pair; fused, the column sum's loads walked memory a row apart (a float32 LayerNorm backward
    8192 x 8192 took 2.3 ms, 5.5x Inductor's, once recompute_columns made its column sums read x and dy)."""
    from passline.ir import FusedNode, Reduction
    from passline.ir.body import loads
    from passline.ir.loops import members

    x = torch.randn(24, 24, requires_grad=True)
    backward = assert_matches_eager(torch.nn.LayerNorm(24), [x], pipeline=WIDE, codegen="reference").reports[1]
    graph = backward.graph
    # dw recomputes dy * xhat from the inputs (db sums float32 dy as it is: nothing to recompute)
    assert backward.metrics.counters["recomputed_columns"] == 1, graph.format()

    def walks(m):  # how a reduction member reads the [24, 24] input: along its rows or down its columns
        (r,) = m.reduction_vars
        return {"columns" if ld.index.coeff(r) == 24 else "rows" for ld in loads(m.body)
                if ld.buffer == "primals_3" and r in ld.index.free_symbols}

    for node in graph.nodes():
        if isinstance(node, FusedNode):
            kinds = set().union(*(walks(m) for m in members(node) if isinstance(m, Reduction)))
            assert kinds != {"rows", "columns"}, graph.format()


def test_tile_rows_leaves_symbolic_rows_flat_and_one_hot_sums_works_dynamic():
    """Under dynamic shapes the one-hot sum still goes (its size is a symbol) and the gradient stays a flat
    pointwise kernel (the tiled form is not yet measured there); one compile across sizes, eager's values."""
    torch._dynamo.reset()
    pipeline = passline.DEFAULT_PIPELINE.replace("tile_rows", "tile_rows(sms=1)")
    be = passline.backend(pipeline=pipeline, codegen="triton", fallback="raise")
    fn = torch.compile(lambda x, t: torch.nn.functional.cross_entropy(x, t), backend=be, dynamic=True)
    for n, c in [(5, 7), (9, 13)]:
        x, t = torch.randn(n, c, requires_grad=True), torch.randint(0, c, (n,))
        x2 = x.detach().clone().requires_grad_()
        fn(x, t).backward()
        torch.nn.functional.cross_entropy(x2, t).backward()
        torch.testing.assert_close(x.grad, x2.grad)
    backward = be.reports[1]
    assert len(be.reports) == 2 and backward.metrics.counters["one_hot_sums"] == 1
    assert backward.metrics.counters["row_tiles"] == 0, backward.graph.format()


def test_peak_memory_finishes_a_branch_before_starting_the_next():
    # hand facts: two branches each build an [n, n] float32 product and sum it to [n]. In program order
    # (both products, then both sums) the two products are alive at once: 2·n²·4 bytes and the first sum's
    # n·4. Finishing each branch first keeps one product and both sums: n²·4 + 2·n·4. Results match eager.
    from passline.testing import assert_matches_eager

    def f(x):
        a = x[:, None] * x[None, :]
        b = x[:, None] + x[None, :]
        return a.sum(1), b.sum(1)

    n = 64
    x = torch.randn(n)
    kinds = lambda be: [type(node).__name__ for node in be.reports[0].graph.nodes()]  # noqa: E731
    be = assert_matches_eager(f, [x], pipeline="dce")
    assert kinds(be) == ["Pointwise", "Pointwise", "Reduction", "Reduction"]
    be = assert_matches_eager(f, [x], pipeline="peak_memory")
    assert kinds(be) == ["Pointwise", "Reduction", "Pointwise", "Reduction"]
    assert be.reports[0].metrics.counters["peak_bytes_saved"] == (2 * n * n * 4 + n * 4) - (n * n * 4 + 2 * n * 4)
    # a graph already in its best order is left as it is
    be = assert_matches_eager(lambda x: (x[:, None] * x[None, :]).sum(1), [x], pipeline="peak_memory")
    assert be.reports[0].metrics.counters["peak_bytes_saved"] == 0


def test_peak_memory_runs_a_tied_heads_weight_gradient_late_and_trains_like_eager():
    # GPT-2's LM head shares the embedding's weight. In the backward, the head's weight gradient (vocabulary
    # × width) is an extern matmul ready right after the logits' gradient; run there, it is allocated on
    # top of every saved activation. The backward's saved activations are released (freed at their last
    # use), the forward's inputs it saved (primals_*) are not; the pass moves the matmul after the layer
    # norm's backward, which frees activations, and lowers the estimated peak; gradients match eager.
    from passline.testing import assert_matches_eager

    class Tied(torch.nn.Module):
        def __init__(self, vocab=512, d=32):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.fc = torch.nn.Linear(d, 4 * d)
            self.out = torch.nn.Linear(4 * d, d)
            self.norm = torch.nn.LayerNorm(d)

        def forward(self, x, idx, target):
            x = x + self.emb(idx)
            x = x + self.out(torch.relu(self.fc(x)))
            logits = self.norm(x) @ self.emb.weight.t()
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    torch.manual_seed(0)
    idx, target = torch.randint(0, 512, (4, 32)), torch.randint(0, 512, (4, 32))
    x = torch.randn(4, 32, 32, requires_grad=True)  # (an input that requires grad: a training step)
    be = assert_matches_eager(Tied(), [x, idx, target], pipeline=MIXED)  # (128 rows: mixed on a GPU target too)
    backward = next(r for r in be.reports if r.name.startswith("backward"))
    graph = backward.graph
    names = {i.name for i in graph.inputs if i.buffer is not None}
    assert graph.released == {n for n in names if not n.startswith("primals_")} and graph.released != names
    # known from the graph's own inputs (its incoming gradients), however it is compiled: a probe, a replay
    # or bisect orders the backward as the training step did; a forward releases nothing
    from passline.backends.dynamo import released_inputs

    assert released_inputs(graph) == graph.released
    forward = next(r for r in be.reports if r.name.startswith("forward"))
    assert forward.graph.released == frozenset()
    assert backward.metrics.counters["peak_bytes_saved"] > 0
    order = graph.names()
    head = [n for n in order if getattr(graph.node(n), "op", None) is torch.ops.aten.mm.default
            and list(graph.node(n).outputs[0].layout.size) == [512, 32]]
    norm = [n for n in order if type(graph.node(n)).__name__ == "MixOrderNode"]
    assert len(head) == 1 and norm and order.index(head[0]) > order.index(norm[0])


def test_peak_memory_never_counts_a_column_sides_read_as_storage():
    """The estimate follows codegen: a mix-order node's output may lie over a dying input its row side reads
    where it stores, but not over one its column side reads (dy summed over the rows while dh = gelu'(h) * dy
    is stored): that output is allocated."""
    from passline.backends.triton.kernel import overwritable
    from passline.ir import MixOrderNode, read_after_store
    from passline.passes.peak_memory import _Memory

    def f(a, w, h):
        dy = a @ w  # dies at the mix node, read by both sides
        return torch.ops.aten.gelu_backward(dy, h), dy.sum(0)

    from passline.backends.dynamo import FxStage
    from passline.lowering import decomposition_table

    example = [torch.randn(64, 32), torch.randn(32, 256), torch.randn(64, 256)]
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, decomposition_table())(*example)
    be = passline.backend(fallback="raise", codegen="reference", pipeline=MIXED)
    be._compiler("inference", FxStage())(gm, example)
    graph = be.reports[0].graph
    mem = _Memory(graph)
    left = dict(mem.users)
    for name, node in graph.items():
        if isinstance(node, MixOrderNode):
            dying = [b for b in mem.uses[name] if left.get(b) == 1 and b in mem.freeable]
            (dy,) = [b for b in dying if b in read_after_store(node)]
            assert not any(dy in bs for bs in overwritable(node, graph).values())
            alloc, _ = mem.step(name, left)
            assert alloc >= 64 * 256 * 4, (alloc, graph.format())  # dh, not over dy
            break
        for b in mem.uses[name]:
            left[b] -= 1
    else:
        raise AssertionError(graph.format())


def test_set_order_needs_every_node_once():
    from passline.testing.synthetic import chain_and_fanout

    graph = chain_and_fanout(20)
    names = graph.names()
    with pytest.raises(ValueError, match="every node"):
        graph.set_order(names[:-1])
    graph.set_order(list(reversed(names)))  # the edges still decide where they order two nodes
    assert graph.names() != names or len(graph.nx.edges) == 0
    graph.verify()


def test_peak_memory_keeps_random_draws_and_in_place_writes_in_their_places():
    # hand facts: the big random draw comes first in program order and the small one later; least peak
    # first would start with the small one (it adds least), so each draw would get the other's numbers:
    # eager's stream is matched only with the draws in program order. An in-place update of an input (a
    # running statistic) keeps its place among all the nodes.
    def f(x):
        r1 = torch.rand(64, 64)
        y = (x[:, None] + x[None, :]).sum(1)
        r2 = torch.rand(64)
        return r1.sum(1) * r2, y

    x = torch.randn(64)
    be = passline.backend(codegen="reference", pipeline="peak_memory", fallback="raise")
    compiled = torch.compile(f, backend=be)
    torch.manual_seed(0)
    out = compiled(x)
    torch.manual_seed(0)
    ref = f(x)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    draws = [n.name for n in be.reports[0].graph.nodes() if getattr(n, "op", None) is torch.ops.aten.rand.default]
    assert [be.reports[0].graph.node(n).outputs[0].layout.size for n in draws] == [(64, 64), (64,)]
    # the draws keep their order among themselves only: the other branch still moves (the big draw is summed
    # before the [64, 64] sum of x is made)
    assert be.reports[0].metrics.counters["peak_bytes_saved"] > 0

    def g(x, stat):
        y = (x[:, None] * x[None, :]).sum(1)
        stat.mul_(0.9).add_(y.mean() * 0.1)  # read before the big branch below, written in place
        return (x[:, None] + x[None, :]).sum(1) + stat
    stat = torch.zeros(1)
    be = passline.backend(codegen="reference", pipeline="peak_memory", fallback="raise")
    s1, s2 = stat.clone(), stat.clone()
    out = torch.compile(g, backend=be)(x, s1)
    torch.testing.assert_close(out, g(x, s2))
    torch.testing.assert_close(s1, s2)


def test_pad_linear_pads_misaligned_output_rows_and_trains_like_eager():
    # hand facts: 1001 output features of 2-byte elements are 2002-byte rows, 7 features short of 16-byte
    # rows (1008); the weight (and bias) get 7 zero rows, the matmul writes 1008 columns and the rest of the
    # graph reads the first 1001. A tied embedding's gradient still adds up; values match eager.
    from passline.testing import assert_matches_eager

    class Head(torch.nn.Module):
        def __init__(self, n=1001, d=64, bias=True):
            super().__init__()
            self.emb = torch.nn.Embedding(n, d)
            self.head = torch.nn.Linear(d, n, bias=bias)
            self.head.weight = self.emb.weight

        def forward(self, x, idx, t):
            logits = self.head(x + self.emb(idx)).float().flatten(0, 1)
            return torch.nn.functional.cross_entropy(logits, t.flatten(), ignore_index=-100)

    torch.manual_seed(0)
    pipeline = passline.DEFAULT_PIPELINE.replace("pad_linear", "pad_linear(any_device=true, min_features=1000, "
                                                               "min_rows=32)")
    for bias, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
        idx, t = torch.randint(0, 1001, (2, 16)), torch.randint(0, 1001, (2, 16))
        t[0, :5] = -100
        be = assert_matches_eager(Head(bias=bias).to(dtype), [x, idx, t], pipeline=pipeline, codegen="reference")
        forward = be.reports[0]
        assert forward.metrics.counters["linears_padded"] == 1
        pads = [n.args[1] for n in forward.gm.graph.nodes if n.target is torch.ops.aten.constant_pad_nd.default]
        assert pads[0] == [0, 0, 0, 7 if dtype == torch.bfloat16 else 3]  # float32: 4004-byte rows, 3 short
        # the backward writes the logits' gradient padded in one kernel, computed there (inline_pointwise's
        # cone move): no buffer of the unpadded [32, 1001] logits is stored, and no extern pads anything
        backward = be.reports[1]
        sizes = {tuple(int(s) for s in b.layout.size) for b in backward.graph.buffers().values()}
        assert (32, 1001) not in sizes and (2, 16, 1001) not in sizes, backward.graph.format()
        assert backward.metrics.counters["inlined_cone"] >= 1
        assert not [n for n in backward.graph.nodes() if "constant_pad" in repr(n)]
        # its reads of the padded logits are at the positions it stores (the pad's `col < 1001` makes the
        # clamp idle, and the padded storage holds every column): no Min left in any load
        assert "Min(" not in backward.graph.format(), backward.graph.format()
    # under dynamic shapes too (the rows counted at the traced sizes), at two batch sizes
    for batch in (2, 3):
        x = torch.randn(batch, 16, 64, dtype=torch.bfloat16, requires_grad=True)
        idx, t = torch.randint(0, 1001, (batch, 16)), torch.randint(0, 1001, (batch, 16))
        be = assert_matches_eager(Head().bfloat16(), [x, idx, t], pipeline=pipeline, codegen="reference", dynamic=True)
        assert be.reports[0].metrics.counters["linears_padded"] == 1 and be.reports[1].metrics.counters["inlined_cone"]
    # left alone: aligned rows (1024 features), too few features, too few rows, a CPU target, and an output
    # returned as it is
    lin = torch.nn.Linear(8, 1001)
    x = torch.randn(4, 8)
    for fn, text in ((torch.nn.Linear(8, 1024), "pad_linear(any_device=true, min_rows=1)"),
                     (lin, "pad_linear(any_device=true, min_features=2000, min_rows=1)"), (lin, "pad_linear"),
                     (lin, "pad_linear(any_device=true, min_features=1, min_rows=4)"),
                     (lambda x: lin(x).relu(), "pad_linear(any_device=true, min_features=1, min_rows=5)")):
        be = assert_matches_eager(fn, [x], pipeline=text, codegen="reference")
        assert be.reports[0].metrics.counters["linears_padded"] == 0
    be = assert_matches_eager(lambda x: lin(x).relu(), [x],
                              pipeline="pad_linear(any_device=true, min_features=1, min_rows=4)", codegen="reference")
    assert be.reports[0].metrics.counters["linears_padded"] == 1
