"""Indirect indexing (issue 16): gather, advanced indexing, index_select, embedding, take_along_dim, and
the writes (scatter, scatter_add, index_put, embedding backward), forward and backward against eager on
the reference backend and in generated Triton code; bounds errors; the verifier; what passes do with it.

Runs on CUDA with PASSLINE_TEST_DEVICE=cuda (the bounds-error test then runs its GPU case in a
subprocess: a device-side assert ends the CUDA context)."""
import os
import re
import subprocess
import sys

import attrs
import pytest
import sympy
import torch
import torch.nn.functional as F
from modules import MIXED

import passline
from passline.ir import Buffer, Indirect, Layout, Load, Pointwise, Reduction, indirect_var, loads, loop_vars
from passline.ir.loops import members
from passline.lowering import GraphInput
from passline.pipeline.graph import SchedulerGraph, VerificationError
from passline.testing import assert_matches_eager

DEVICE = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
CODEGENS = ["reference", "triton"]


def _g(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def _ints(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


# name -> (fn, inputs); indices include duplicates (their gradients are summed) and, where eager allows
# them, negative values
READS = {
    "gather": (lambda x, i: torch.gather(x, 1, i), lambda: [_g(5, 7), _ints(0, 7, 5, 9)]),
    "gather_dim0_int32": (lambda x, i: torch.gather(x.t(), 0, i),
                          lambda: [_g(5, 7), _ints(0, 7, 3, 5, dtype=torch.int32)]),
    "index_slice": (lambda x, i: x[i, 2:5], lambda: [_g(5, 7), _ints(-5, 5, 8)]),
    "index_broadcast": (lambda x, a, b: x[a, b], lambda: [_g(5, 7), _ints(-5, 5, 4, 1), _ints(-7, 7, 3)]),
    "index_nonadjacent": (lambda x, a, b: x[a, :, b], lambda: [_g(4, 5, 6), _ints(0, 4, 2, 1), _ints(0, 6, 3)]),
    "index_select": (lambda x, i: torch.index_select(x, 1, i), lambda: [_g(5, 7), _ints(0, 7, 9, dtype=torch.int32)]),
    "embedding": (lambda i, w: F.embedding(i, w), lambda: [_ints(0, 10, 3, 8), _g(10, 6)]),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, 1), lambda: [_g(5, 7), _ints(-7, 7, 5, 4)]),
    "argmax_gather": (lambda x: torch.gather(x * 2, 1, x.argmax(1, keepdim=True)), lambda: [_g(5, 7)]),
}


def _externs(be, which=0):
    return [str(n.op) for n in be.reports[which].graph.leaf_nodes() if n.kind == "extern"]


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(READS))
def test_reads_match_eager(name, codegen):
    fn, make = READS[name]
    be = assert_matches_eager(fn, make(), codegen=codegen)
    assert _externs(be) == [], be.reports[0].graph.format()  # the forward: no aten call
    assert not be.reports[0].codegen_reason.count("reference backend:"), be.reports[0].codegen_reason


EDGES = {  # shapes and layouts the lowerings must place right (generated code only: the fragile side)
    "index_none_first": (lambda x, i: x[:, i], lambda: [_g(5, 7), _ints(-7, 7, 2, 3)]),
    "index_three_broadcast": (lambda x, a, b, c: x[a, b, c],
                              lambda: [_g(3, 4, 5), _ints(0, 3, 2, 1, 1), _ints(0, 4, 1, 6, 1), _ints(0, 5, 7)]),
    "gather_empty": (lambda x, i: torch.gather(x, 1, i), lambda: [_g(5, 7), torch.zeros(5, 0, dtype=torch.long)]),
    "gather_smaller_transposed": (lambda x, i: torch.gather(x, -1, i.t()),
                                  lambda: [_g(4, 7).permute(1, 0), _ints(0, 4, 2, 6)]),
    "embedding_3d_expanded_weight": (lambda i, w: F.embedding(i, w.expand(9, 5)),
                                     lambda: [_ints(0, 9, 2, 3, 4), _g(1, 5)]),
    "index_select_0d": (lambda x, i: torch.index_select(x, 0, i), lambda: [_g(5, 7), torch.tensor(3)]),
    "index_put_0d_value": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                           lambda: [_g(6, 4), _ints(0, 6, 5), torch.randn((), requires_grad=True)]),
    "scatter_add_int": (lambda x, i: x.scatter_add(1, i, torch.ones_like(i)),
                        lambda: [_ints(0, 5, 3, 6), _ints(0, 6, 3, 8)]),
    "nll_loss_3d": (lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, ignore_index=0),
                    lambda: [_g(2, 5, 3), _ints(0, 5, 2, 3)]),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_cases_match_eager(name):
    fn, make = EDGES[name]
    be = assert_matches_eager(fn, make(), codegen="triton")
    for k, r in enumerate(be.reports):
        assert _externs(be, k) == [] and "reference backend:" not in r.codegen_reason, r.graph.format()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_reads(dtype):
    torch.manual_seed(0)  # low-precision sums of duplicate rows: a fixed draw, not whatever the worker left
    assert_matches_eager(lambda i, w, x, j: (F.embedding(i, w) * 2, torch.gather(x, 1, j)),
                         [_ints(0, 10, 3, 8), _g(10, 6, dtype=dtype), _g(4, 9, dtype=dtype), _ints(0, 9, 4, 5)],
                         codegen="triton")


def test_argmax_index_is_proven_and_other_indices_are_checked():
    be = assert_matches_eager(READS["argmax_gather"][0], READS["argmax_gather"][1](), codegen="reference")
    text = be.reports[0].graph.format()
    assert "in [0, 7), proven" in text, text
    be = assert_matches_eager(READS["gather"][0], READS["gather"][1](), codegen="reference")
    assert "in [0, 7))" in be.reports[0].graph.format()


OUT_OF_RANGE = [
    ("gather", lambda x, i: torch.gather(x, 1, i), [torch.randn(5, 7), torch.tensor([[0], [7], [1], [2], [3]])],
     "index 7 is out of bounds for dimension 1 (gather) with size 7"),
    ("gather_negative", lambda x, i: torch.gather(x, 1, i), [torch.randn(5, 7), torch.full((5, 1), -1)],
     "index -1 is out of bounds for dimension 1 (gather) with size 7"),
    ("index", lambda x, i: x[i] + 1, [torch.randn(5, 7), torch.tensor([0, -6])],
     "index -6 is out of bounds for dimension 0 (index) with size 5"),
    ("embedding", lambda i, w: F.embedding(i, w), [torch.tensor([1, 10]), torch.randn(10, 3)],
     "index 10 is out of bounds for dimension 0 (embedding) with size 10"),
    # eager's index_add/index_copy refuse negative indices; torch's decompositions into index_put wrapped
    # them (index_add(0, [-1, 0], ..) added into the last row)
    ("index_add_negative", lambda x, i, s: x.index_add(0, i, s), [torch.zeros(4, 2), torch.tensor([-1, 0]),
                                                                  torch.ones(2, 2)],
     "index -1 is out of bounds for dimension 0 (index_add) with size 4"),
    ("index_copy_negative", lambda x, i, s: x.index_copy(1, i, s), [torch.zeros(2, 4), torch.tensor([0, -2]),
                                                                    torch.ones(2, 2)],
     "index -2 is out of bounds for dimension 1 (index_copy) with size 4"),
    # index_fill counts negative indices from the end, as eager; one below -n is out of range as given (the
    # op named is index_copy, which torch's decomposition of index_fill calls)
    ("index_fill_below", lambda x, i: x.index_fill(0, i, 5.0), [torch.zeros(4, 2), torch.tensor([-5, 0])],
     "index -5 is out of bounds for dimension 0"),
    # gathers along a dim the gathered value does not vary along (broadcast, or of size 1): inline_pointwise
    # recomputed the value there, with no load left to carry the index's check, and returned a result where
    # eager raises (found by fuzzing; cross-entropy over one class with a target of 1 is the same case)
    ("gather_broadcast", lambda x, i: torch.gather(x.expand(3, 5) * 2, 1, i), [torch.randn(3, 1),
                                                                                torch.tensor([[0], [7], [0]])],
     "index 7 is out of bounds for dimension 1 (gather) with size 5"),
    ("index_broadcast", lambda x, i: (x.expand(4, 5) * 2)[i], [torch.randn(1, 5), torch.tensor([0, 6])],
     "index 6 is out of bounds for dimension 0 (index) with size 4"),
    ("embedding_broadcast", lambda i, w: F.embedding(i, w.expand(4, 5) * 2), [torch.tensor([0, 6]), torch.randn(1, 5)],
     "index 6 is out of bounds for dimension 0 (embedding) with size 4"),
    ("cross_entropy_one_class", lambda x, t: F.cross_entropy(x, t), [torch.randn(3, 1), torch.tensor([0, 1, 0])],
     "index 1 is out of bounds for dimension 1 (gather) with size 1"),
]


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("case", OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_index_is_an_error(case, codegen):
    name, fn, inputs, message = case
    if DEVICE == "cuda" and codegen == "triton":
        pytest.skip("covered by test_out_of_range_device_assert (a device assert ends the CUDA context)")
    inputs = [x.to(DEVICE) for x in inputs]
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        torch._dynamo.reset()
        torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(*inputs)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_out_of_range_index_under_dynamic_shapes_is_named(codegen):
    # found by fuzzing: under dynamic shapes the interpreter's check got the bound as a one-element array and
    # failed converting it (a TypeError) instead of naming the index and its bound
    if DEVICE == "cuda" and codegen == "triton":
        pytest.skip("covered by test_out_of_range_device_assert (a device assert ends the CUDA context)")
    torch._dynamo.reset()
    f = torch.compile(lambda x, i: torch.gather(x, 1, i), backend=passline.backend(codegen=codegen, fallback="raise"),
                      dynamic=True)
    x = torch.randn(4, 5, device=DEVICE)
    f(x, torch.tensor([[0], [1], [2], [3]], device=DEVICE))
    with pytest.raises(Exception, match=r"index 7 is out of bounds for dimension 1 \(gather\) with size 5"):
        f(x, torch.tensor([[0], [7], [1], [2]], device=DEVICE))


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's device-side assert")
@pytest.mark.parametrize("fn, what", [("torch.gather(x, 1, i)", "gather"),
                                      # an index only compared (a one-hot): checked after the kernel's store
                                      ("torch.zeros_like(x).scatter(1, i, -1.0) * x", "scatter")])
def test_out_of_range_device_assert(fn, what):
    script = f"""
import torch, passline
f = torch.compile(lambda x, i: {fn}, backend=passline.backend(codegen="triton", fallback="raise"))
x = torch.randn(5, 7, device="cuda")
f(x, torch.tensor([[0], [1], [2], [3], [4]], device="cuda"))
torch.cuda.synchronize()
print("in range ok", flush=True)
f(x, torch.tensor([[0], [7], [2], [3], [4]], device="cuda"))
torch.cuda.synchronize()
print("no error")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PASSLINE_AUTOTUNE="0"))
    out = r.stdout + r.stderr
    assert "in range ok" in out and "no error" not in out and r.returncode != 0, out[-3000:]
    message = f"index out of bounds for dimension 1 ({what}) with size 7"
    assert message in out or "device-side assert" in out, out[-3000:]


def test_gpu_kernel_source_asserts_unproven_indices():
    """The GPU form of a kernel (generated on any machine): tl.device_assert on each unproven index, in a
    kernel compiled with debug=True (without which Triton drops device asserts); none for a proven one."""
    from passline.backends.triton import compat
    from passline.backends.triton import kernel as kgen

    for name, want in (("gather", True), ("argmax_gather", False)):
        fn, make = READS[name]
        be = assert_matches_eager(fn, make(), codegen="reference")
        graph = be.reports[0].graph
        (node,) = [n for n in graph.nodes() if any(ld.indirect for m in members(n) for ld in loads(m.body))]
        src = kgen.generate(node, graph, interpret=False, variant="persistent", blocks={}).source
        source = kgen.generate(node, graph, interpret=False, variant="persistent", blocks={})
        assert ("tl.device_assert(" in src) == want and ("@triton.jit(debug=True)" in src) == want, src
        assert source.checks == want
        # debug=True makes Triton assert on int32 overflow of each add/mul unless the launch turns that off
        # (compat.CHECKED_OPTIONS, passed by a checked variant's launches); where this Triton cannot, a
        # checking kernel indexes in int64
        int64 = want and compat.CHECKED_OPTIONS is None
        assert ("tl.program_id(0).to(tl.int64)" in src) == int64, src
        assert "_check_index(" not in src.split("def _check_index")[0]
        isrc = kgen.generate(node, graph, interpret=True, variant="persistent", blocks={}).source
        assert ("_check_index(t" in isrc) == want and "tl.device_assert(" not in isrc


def test_gpu_kernels_check_an_index_only_compared_after_their_stores():
    """On a GPU, an index no address is made from (a one-hot's compare; cross-entropy's gradient, in its
    persistent and looped forms) is asserted after the kernel's stores, where the assert holds no memory
    access back; one that addresses memory (a gather) before its load."""
    from passline.backends.triton import kernel as kgen

    def lines(fn, inputs, variants, report=0, **options):
        be = assert_matches_eager(fn, inputs, codegen="reference", **options)
        graph = be.reports[report].graph  # 0: the forward, -1: the backward
        (node,) = [n for n in graph.nodes() if "device_assert" in
                   kgen.generate(n, graph, interpret=False, variant=variants[0], blocks={}).source]
        for v in variants:
            src = kgen.generate(node, graph, interpret=False, variant=v, blocks={}).source
            yield [ln.strip() for ln in src.split("\ndef ")[-1].splitlines() if ln.strip()]

    def first(body, what):
        return min(k for k, ln in enumerate(body) if ln.startswith(what))

    for body in lines(lambda x, i: torch.zeros_like(x).scatter(1, i, -1.0) * x, [_g(5, 7), _ints(0, 7, 5, 1)],
                      ["persistent"]):
        assert first(body, "tl.device_assert(") > first(body, "tl.store("), body
    # the gradient as a row kernel (tile_rows plans for one SM: on a CPU target it would stay flat), its
    # target's two checks hoisted before the looped form's loop (in its scope), then deferred past the loop
    pipeline = re.sub(r"\btile_rows\b", "tile_rows(sms=1)", passline.DEFAULT_PIPELINE)
    ce = (lambda x, t: F.cross_entropy(x, t), [_g(64, 300), _ints(0, 300, 64)])
    for body in lines(*ce, ["persistent", "looped"], report=-1, pipeline=pipeline):
        asserts = [k for k, ln in enumerate(body) if ln.startswith("tl.device_assert(")]
        assert asserts and min(asserts) > max(k for k, ln in enumerate(body) if ln.startswith("tl.store(")), body
        assert all(not body[k].startswith("for ") for k in range(min(asserts), len(body))), body
    assert any(ln.startswith("for roffset") for ln in body), body  # the looped form: the checks after its loop
    # a compare of an index a gather checked already, inside a looped kernel's loop: that gather's check, once,
    # before the loop (not one a step)
    onehot_and_gather = (lambda x, i: (x * torch.zeros_like(x).scatter(1, i, 1.0)).sum(1, keepdim=True)
                         - torch.gather(x, 1, i) + x.amax(1, keepdim=True))
    for body in lines(onehot_and_gather, [_g(6, 3000), _ints(0, 3000, 6, 1)], ["looped"]):
        loop = first(body, "for roffset")
        assert [ln for ln in body[loop:] if ln.startswith("tl.device_assert(")] == [], body
        assert len([ln for ln in body[:loop] if ln.startswith("tl.device_assert(")]) == 1, body
    for body in lines(lambda x, i: torch.gather(x, 1, i), [_g(5, 7), _ints(0, 7, 5, 9)], ["persistent"]):
        gather = next(k for k, ln in enumerate(body) if "tl.load(p_primals_1 +" in ln)  # x[i]
        assert first(body, "tl.device_assert(") < gather < first(body, "tl.store("), body


def test_one_hot_math_is_an_int32_compare_and_a_select_of_row_values():
    """Cross-entropy's gradient per element: the one-hot's compare of a position with the checked target runs
    in int32 (both fit), and `where(i1 == target, -1, 0) * scale` selects between the row's two products
    (computed before a looped kernel's loop) instead of multiplying each element."""
    from passline.backends.triton import kernel as kgen

    pipeline = re.sub(r"\btile_rows\b", "tile_rows(sms=1)", passline.DEFAULT_PIPELINE)  # a row kernel
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t), [_g(64, 300), _ints(0, 300, 64)],
                              codegen="triton", pipeline=pipeline)
    graph = be.reports[-1].graph
    (node,) = [n for n in graph.nodes() if "device_assert" in
               kgen.generate(n, graph, interpret=False, variant="persistent", blocks={}).source]
    for variant in ("persistent", "looped"):
        body = kgen.generate(node, graph, interpret=False, variant=variant, blocks={}).source.split("\ndef ")[-1]
        lines = {m[1]: (k, m[2]) for k, m in enumerate(re.finditer(r"(t\d+) = (.*)", body))}
        (hot,) = [v for v, (_, src) in lines.items() if re.fullmatch(r"\(q0 == t\d+\)", src)]
        narrowed = lines[re.search(r"== (t\d+)", lines[hot][1])[1]][1]
        assert narrowed.endswith(".to(tl.int32)"), body
        selects = [(v, m.groups()) for v, (_, src) in lines.items()
                   if (m := re.fullmatch(rf"tl.where\({hot}, (t\d+), (t\d+)\)", src))]
        # the one-hot (dead code now, dropped by Triton) and the select of the row's products
        (select,) = [(v, gs) for v, gs in selects if all(" * " in lines[b][1] for b in gs)]
        assert not any(re.search(rf"\b{v}\b \*|\* {v}\b", src) for v, _ in selects for _, src in lines.values()), body
        if variant == "looped":
            loop = body.index("for roffset")
            assert all(body.index(f"{b} = ") < loop for b in select[1]), body


@pytest.mark.parametrize("codegen", ["triton", "reference"])
def test_index_compares_that_do_not_fit_int32_stay_int64(codegen):
    # truncated to int32, 2**32 + 3 would equal position 3; a position past 2**31 cannot be compared in int32
    # either (those stay int64), and the ones that fit give eager's values
    def fn(x):
        pos = torch.arange(x.shape[1], device=x.device)
        far = (x * (pos == 2 ** 32 + 3)).sum(1)
        below = (x * (pos[None, :] <= torch.arange(x.shape[0], device=x.device)[:, None])).sum(1)
        return far, below, x * (pos + 2 ** 31 > 2 ** 31 + 2)

    assert_matches_eager(fn, [_g(6, 9)], codegen=codegen)


@pytest.mark.parametrize("variant", ["persistent", "looped"])
def test_indirect_reads_inside_reductions(variant):
    """Gathered values reduced in the same kernel, in both reduction forms (the looped one loads its
    indices and checks them inside the loop over row blocks)."""
    be = assert_matches_eager(lambda x, i, e, w: ((torch.gather(x, 1, i) * 2).sum(1), F.embedding(e, w).amax(-1)),
                              [_g(6, 40), _ints(0, 40, 6, 33), _ints(0, 9, 5), _g(9, 70)], codegen="triton",
                              kernel_variant=variant)
    chosen = {k.chosen for r in be.reports for k in r.kernel_info if k.kind == "reduction"}
    assert chosen == {variant}


def _graph_with(body, ranges=(5,), idx_size=(5,), x_size=(7,)):
    i = Buffer("idx", Layout.contiguous(idx_size, torch.int64))
    x = Buffer("x", Layout.contiguous(x_size, torch.float32))
    node = Pointwise("buf0", ranges, body, Buffer("buf0", Layout.contiguous(ranges, torch.float32)))
    g = SchedulerGraph([GraphInput("idx", buffer=i), GraphInput("x", buffer=x)])
    g.add_node(node)
    return g


def test_verify_checks_indirect_indices():
    (i0,) = loop_vars("i", 1)
    t0, t1 = indirect_var(0), indirect_var(1)
    idx = Load("idx", i0, torch.int64)
    _graph_with(Load("x", t0, torch.float32, (Indirect(t0, idx, 7),))).verify()
    with pytest.raises(VerificationError, match="does not bind"):
        _graph_with(Load("x", t1, torch.float32, (Indirect(t0, idx, 7),))).verify()
    with pytest.raises(VerificationError, match="outside x"):  # positions [0, 8) of a 7-element buffer
        _graph_with(Load("x", t0, torch.float32, (Indirect(t0, idx, 8),))).verify()
    with pytest.raises(VerificationError, match="bound to a torch.float32 value"):
        _graph_with(Load("x", t0, torch.float32, (Indirect(t0, Load("x", i0, torch.float32), 7),))).verify()


def test_index_producer_fuses_and_indirect_read_of_a_producer_does_not():
    """The index computation (a where on the target) fuses into the gather; the tensor read through the
    index is needed whole, so its producer is not fused with the gather (an indexing mismatch) — unless
    inline_pointwise recomputes it at the gathered positions, as it does by default for a cheap one."""
    def fn(x, t):  # an index of x's own shape: only the indirect read keeps exp and gather apart
        return torch.gather(x.exp(), 1, torch.where(t >= 0, t, 0)) * 3

    inputs = [_g(6, 9), _ints(-1, 9, 6, 9)]
    no_recompute = passline.DEFAULT_PIPELINE.replace("inline_pointwise", "inline_pointwise(indirect_max_loads=0)")
    be = assert_matches_eager(fn, inputs, codegen="triton", pipeline=no_recompute)
    report = be.reports[0]
    (fused,) = [n for n in report.graph.nodes() if n.kind == "fused"]
    origins = {o for m in fused.members() for o in m.origins}
    assert {"where", "gather", "mul"} <= origins and "exp" not in origins, report.graph.format()
    assert report.metrics.fusion_failures["indexing mismatch"] >= 1

    be = assert_matches_eager(fn, inputs, codegen="triton")  # default: exp(x) recomputed at the gather
    graph = be.reports[0].graph
    assert len(graph.nodes()) == 1 and be.reports[0].metrics.counters["inlined_indirect"] == 1, graph.format()
    assert "exp(load(primals_1[t0 + 9*i0]; t0 = " in graph.format(), graph.format()


def test_dot_dump_marks_indirect_reads():
    from passline.pipeline.dump import to_dot

    fn, make = READS["embedding"]
    be = assert_matches_eager(fn, make(), codegen="reference")
    dot = to_dot(be.reports[0].graph)
    assert "[indirect]\", style=dashed" in dot, dot


CROSS_ENTROPY = {
    "mean": dict(),
    "ignore_index_label_smoothing_sum": dict(ignore_index=1, label_smoothing=0.1, reduction="sum"),
    "none": dict(reduction="none"),
}


@pytest.mark.parametrize("kind", sorted(CROSS_ENTROPY))
def test_cross_entropy_reads_the_logits_once_each_way(kind):
    """Forward: the target's logit is gathered from the logits themselves (the log-softmax recomputed at the
    target by inline_pointwise), so no [tokens, vocabulary] buffer is written, and the row statistics come
    from one fused reduction kernel. Backward: one kernel over the logits (the one-hot is a pull)."""
    n, c = 6, 11
    target = _ints(0, c, n)
    target[0] = 1  # an ignored row, where ignore_index=1
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t, **CROSS_ENTROPY[kind]), [_g(n, c), target],
                              codegen="triton")
    for report in be.reports:
        graph = report.graph
        assert _externs(be, be.reports.index(report)) == [], graph.format()
        full = [b for node in graph.nodes() for b in node.output_names()
                if graph.buffers()[b].layout.numel == n * c and (graph.readers(b) or b in graph.output_names())]
        # kernels reading the logits (or log-softmax) whole; the loss kernel reads one logit per row
        kernels = [node for node in graph.nodes()
                   if any(graph.buffers()[ld.buffer].layout.numel == n * c and not ld.indirect
                          for m in members(node) for ld in loads(m.body))]
        if report is be.reports[0]:
            assert full == [] and report.metrics.counters["inlined_indirect"] >= 1, graph.format()
        else:
            assert len(full) == 1, graph.format()  # the gradient itself
        assert len(kernels) == 1, graph.format()  # each way, one kernel reads the logits


def test_cross_entropy_of_upcast_batched_logits_writes_no_float_copy():
    """A language model's tail: bfloat16 logits [batch, time, vocabulary], upcast, flattened. merge_loops
    flattens the upcast to one loop; the loss still gathers the target's logit through it (inline_pointwise
    runs again after merge_loops and maps a flat node's loop from the gathered index), so the forward
    writes no float32 copy of the logits (GPT-2's step held one: 1.5 GB at 8x1024x50304)."""
    b, t, c = 2, 3, 11
    target = _ints(0, c, b * t).view(b, t)
    x = _g(b, t, c, dtype=torch.bfloat16)
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x.float().flatten(0, 1), t.flatten()), [x, target],
                              codegen="triton")
    graph = be.reports[0].graph
    written = [name for node in graph.nodes() for name in node.output_names()  # stored: read by a kernel or returned
               if graph.buffers()[name].layout.numel == b * t * c
               and (graph.readers(name) or name in graph.output_names())]
    assert written == [] and be.reports[0].metrics.counters["inlined_indirect"] >= 1, graph.format()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_online_softmax_reads_wide_rows_once(dtype):
    """Rows too wide to keep (the looped form, forced here): the sum of exponentials is accumulated in
    the max's loop with online rescaling, so cross-entropy's forward reads the logits once; rows of -inf,
    with NaN, with +inf and mostly -inf give eager's values."""
    x = torch.randn(7, 300, dtype=dtype)
    x[1, :] = float("-inf")
    x[2, 5], x[2, 250:] = float("-inf"), float("-inf")
    x[3, 7], x[4, 100] = float("nan"), float("inf")
    x[5, :290] = float("-inf")
    be = assert_matches_eager(lambda x: torch.log_softmax(x, -1), [x], codegen="triton", kernel_variant="looped")
    (k,) = [k for k in be.reports[0].kernel_info if k.kind == "reduction"]
    # max and sum together, then the stored log-softmax (a loop each: the plain one's header; at an unaligned
    # width each has an aligned twin for programs of one row too, kernel.KernelWriter._aligned_loop)
    assert _plain_loops(k.source) == 2
    t = _ints(0, 300, 7)
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t), [_g(7, 300, dtype=dtype), t], codegen="triton",
                              kernel_variant="looped")
    assert [_plain_loops(k.source) for k in be.reports[0].kernel_info if k.kind == "reduction"] == [1, 1]


def _plain_loops(source: str) -> int:
    """A looped kernel's loops over its rows, less the aligned loops that twin them (`range(0, rhead + W, ...)`)."""
    return source.count("for roffset in range(") - source.count("for roffset in range(0, rhead")


# -- writes ---------------------------------------------------------------------------------------------
def _rows_of_distinct(n_rows, width, k, dim=1):
    """Distinct positions per row (a plain scatter's duplicates are undefined in eager)."""
    rows = torch.stack([torch.randperm(width)[:k] for _ in range(n_rows)])
    return rows if dim == 1 else rows.t().contiguous()


WRITES = {  # the backward of the reads above is a write too (scatter_add, index_put accumulate)
    "scatter": (lambda x, i, s: x.scatter(1, i, s), lambda: [_g(5, 7), _rows_of_distinct(5, 7, 3), _g(5, 3)]),
    "scatter_value_dim0": (lambda x, i: x.scatter(0, i, 2.5), lambda: [_g(5, 7), _rows_of_distinct(7, 5, 2, dim=0)]),
    "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s), lambda: [_g(5, 7), _ints(0, 7, 5, 9), _g(5, 9)]),
    "index_put": (lambda x, i, v: torch.index_put(x, (i,), v), lambda: [_g(6, 4), torch.randperm(6)[:3], _g(3, 4)]),
    "index_put_accumulate": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                             lambda: [_g(6, 4), _ints(-6, 6, 9), _g(4)]),
    "index_put_two_indices": (lambda x, a, b, v: torch.index_put(x, (a, b), v, accumulate=True),
                              lambda: [_g(5, 6), _ints(0, 5, 4, 1), _ints(-6, 6, 3), _g(1, 3)]),
    "embedding_padding_idx": (lambda i, w: F.embedding(i, w, padding_idx=2) * 3,
                              lambda: [_ints(0, 6, 4, 9), _g(6, 5)]),
    "index_add_alpha": (lambda x, i, s: x.index_add(1, i, s, alpha=-2.5), lambda: [_g(4, 5), _ints(0, 5, 7), _g(4, 7)]),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s * 2), lambda: [_g(6, 3), torch.randperm(6)[:4], _g(4, 3)]),
    # eager's index_fill wraps negative indices (torch's decomposition calls index_copy, which does not)
    "index_fill_negative": (lambda x, i: x.index_fill(1, i, 2.5), lambda: [_g(3, 4), torch.tensor([-1, 1, -4])]),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_match_eager(name, codegen):
    fn, make = WRITES[name]
    be = assert_matches_eager(fn, make(), codegen=codegen)
    for r in be.reports:  # forward and backward
        assert _externs(be, be.reports.index(r)) == [], r.graph.format()
        assert "reference backend:" not in r.codegen_reason, r.codegen_reason


@pytest.mark.parametrize("codegen", CODEGENS)
def test_an_empty_index_writes_nothing_and_trains(codegen):
    """An empty index: index_copy's and index_fill's backwards scatter a zero-size expanded value over no
    point (a loop of [0, 2] points loading it at [0]); verify took that load for one outside its buffer."""
    empty = torch.zeros(0, dtype=torch.long)
    assert_matches_eager(lambda x, i, s: x.index_copy(0, i, s), [_g(6, 2), empty, _g(0, 2)], codegen=codegen)
    assert_matches_eager(lambda x, i: x.index_fill(1, i, 1.5), [_g(6, 2), empty], codegen=codegen)


def test_duplicate_indices_are_summed_in_embedding_backward():
    """Every row hit many times: the atomic adds (or index_put_ with accumulate on the reference) sum them."""
    for codegen in CODEGENS:
        ids = torch.tensor([[1, 1, 1, 3], [3, 1, 0, 1]])
        be = assert_matches_eager(lambda i, w: F.embedding(i, w), [ids, _g(4, 3)],
                                  codegen=codegen)
        (scatter,) = [n for n in be.reports[1].graph.nodes() if n.kind == "scatter"]
        assert scatter.mode == "add" and "[0, 4), wraps" in be.reports[1].graph.format()


def test_deterministic_mode_keeps_float_accumulation_in_aten():
    torch.use_deterministic_algorithms(True)
    try:
        be = assert_matches_eager(lambda i, w: F.embedding(i, w), [_ints(0, 6, 7), _g(6, 3)], codegen="reference")
    finally:
        torch.use_deterministic_algorithms(False)
    assert _externs(be, 0) == [] and _externs(be, 1) == ["aten.index_put.default"]


def test_one_hot_scatter_is_a_pointwise_pull():
    """scatter(zeros, 1, target[:, None], -1.0) (cross-entropy's backward) has one position per row: it
    lowers to a where over the logits' shape, no Scatter node, and fuses with the gradient's math."""
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t), [_g(6, 11), _ints(0, 11, 6)], codegen="triton")
    backward = be.reports[1].graph
    assert not [n for n in backward.leaf_nodes() if n.kind in ("scatter", "extern")], backward.format()
    assert "in [0, 11))" in backward.format()  # the target is still checked


ONE_HOT_SUMS = {
    "mean": dict(),
    "ignore_index": dict(ignore_index=1),
    "sum": dict(reduction="sum"),
    "none": dict(reduction="none"),
    "label_smoothing": dict(label_smoothing=0.1, ignore_index=1),  # a constant per row added to the one-hot
}


def _class_sums(graph, classes: int) -> list:
    return [m.name for node in graph.nodes() for m in members(node)
            if isinstance(m, Reduction) and m.reduction_numel == classes]


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("kind", sorted(ONE_HOT_SUMS))
def test_cross_entropy_backward_sums_no_one_hot(kind, codegen):
    """one_hot_sums: log_softmax's backward sums nll_loss's one-hot gradient over each row, which is the
    target's element: the backward reduces nothing over the classes (one pointwise pass over the logits),
    and the target is still checked."""
    n, c = 6, 11
    target = _ints(0, c, n)
    target[0] = 1  # ignored where ignore_index=1
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t, **ONE_HOT_SUMS[kind]), [_g(n, c), target],
                              codegen=codegen)
    backward = be.reports[1]
    assert backward.metrics.counters["one_hot_sums"] == 1, backward.graph.format()
    assert _class_sums(backward.graph, c) == [], backward.graph.format()
    assert "in [0, 11))" in backward.graph.format()
    # without the pass, the same graph sums the one-hot over the classes
    without = passline.DEFAULT_PIPELINE.replace("one_hot_sums, ", "")
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t, **ONE_HOT_SUMS[kind]), [_g(n, c), target],
                              pipeline=without, codegen="reference")
    assert len(_class_sums(be.reports[1].graph, c)) == 1


@pytest.mark.parametrize("codegen", CODEGENS)
def test_one_hot_sum_of_infinite_and_nan_factors_is_eagers_nan(codegen):
    """sum_r where(r == t, a, 0) * c: where c is infinite or NaN, every unselected 0 * c is NaN and so is
    eager's sum; the rewrite keeps that (its `off * (n - 1)` term), and a one-hot times a value that
    depends on r is left a reduction."""
    def f(x, t, c):
        hot = torch.zeros_like(x).scatter(1, t[:, None], -2.0)
        return (hot * c[:, None]).sum(1), (hot * x).sum(1)

    x, t = torch.randn(5, 9), _ints(0, 9, 5)
    c = torch.tensor([1.5, float("inf"), float("-inf"), float("nan"), -0.25])
    be = assert_matches_eager(f, [x, t, c], codegen=codegen)
    graph = be.reports[0].graph
    assert be.reports[0].metrics.counters["one_hot_sums"] == 1, graph.format()
    assert len(_class_sums(graph, 9)) == 1  # (hot * x).sum(1): x depends on the column


def test_one_hot_sum_still_checks_the_target():
    def f(x, t):
        return (torch.zeros_like(x).scatter(1, t[:, None], 1.0) * 3.0).sum(1)

    with pytest.raises(Exception, match=r"index 9 is out of bounds"):
        torch._dynamo.reset()
        torch.compile(f, backend=passline.backend(codegen="reference", fallback="raise"))(
            torch.randn(3, 9), torch.tensor([0, 9, 2]))


def _scatter_graph(read_after: bool):
    from passline.ir import Scatter

    (i0,) = loop_vars("i", 1)
    t0 = indirect_var(0)
    idx = Buffer("idx", Layout.contiguous((3,), torch.int64))
    src = Buffer("src", Layout.contiguous((3,), torch.float32))
    acc = Buffer("acc", Layout.contiguous((5,), torch.float32))
    init = Pointwise("acc", (5,), Load("src", sympy.S.Zero, torch.float32), acc)
    b = Indirect(t0, Load("idx", i0, torch.int64), 5)
    sc = Scatter("sc", (3,), Load("src", i0, torch.float32), acc, t0, (b,), "add")
    nodes = [init, sc]
    outputs = []
    if read_after:
        out = Buffer("out", Layout.contiguous((5,), torch.float32))
        nodes.append(Pointwise("out", (5,), Load("acc", i0, torch.float32), out))
        from passline.ir import TensorArg
        outputs = [TensorArg("out", (5,), (1,))]
    g = SchedulerGraph([GraphInput("idx", buffer=idx), GraphInput("src", buffer=src)], outputs)
    for n in nodes:
        g.add_node(n)
    return g


def test_scatter_is_ordered_before_later_readers_and_verify_checks_it():
    g = _scatter_graph(read_after=True)
    g.verify()
    assert g.has_path("acc", "sc") and g.has_path("sc", "out")  # init, then the scatter, then the read
    g.nx.remove_edge("sc", "out")  # what a careless pass could do: the read no longer waits for the write
    with pytest.raises(VerificationError, match="not ordered with out"):
        g.verify()


def test_replacing_a_group_keeps_its_side_of_a_scatter():
    """A fused group's program position is its first member's: one whose later member reads a scatter's
    result sits *before* the scatter in program order. Replacing that group (fuse's loop split does)
    once re-derived its edges from that position and put the read before the scatter."""
    from passline.ir import FusedNode

    g = _scatter_graph(read_after=True)
    (i0,) = loop_vars("i", 1)
    early = Pointwise("early", (5,), Load("src", sympy.S.Zero, torch.float32),
                      Buffer("early", Layout.contiguous((5,), torch.float32)))
    g.add_node(early, order=-1)  # runs first, fused below with `out`, the scatter's reader
    group = FusedNode("group", (g.node("early"), g.node("out")), (sympy.Integer(5),), ())
    g.merge(["early", "out"], group)
    assert g.has_path("sc", "group")
    g.replace_node("group", attrs.evolve(group))
    assert g.has_path("sc", "group") and not g.has_path("group", "sc")
    g.verify()


def test_a_node_added_before_a_scatter_still_reads_its_result():
    """A buffer the graph makes and then scatters into is read for its final value, wherever the reader's
    program position says it runs: a group (mix_order_reduction's, split_reductions' nodes) takes its
    first member's position, which may come before the scatter."""
    g = _scatter_graph(read_after=True)
    (i0,) = loop_vars("i", 1)
    out = Buffer("late", Layout.contiguous((5,), torch.float32))
    late = Pointwise("late", (5,), Load("acc", i0, torch.float32), out)
    g.add_node(late, order=-1)  # program order says first; the scatter's write says after it
    assert g.has_path("sc", "late") and not g.has_path("late", "sc")
    g.verify()


def test_softmax_topk_backward_mixes_after_the_scatter():
    """topk's backward scatters into zeros; the softmax backward reading it and the bias gradient's column
    sum became a MixOrderNode placed at its first member's position, before the scatter (an MoE router's
    gradients all wrong)."""
    def fn(x, b):
        probs = (x + b).softmax(-1)
        return probs.topk(2, dim=-1).values, probs.mean(0)

    for codegen in ("reference", "triton"):
        be = assert_matches_eager(fn, [_g(10, 4), _g(4)], codegen=codegen, pipeline=MIXED)  # 10 rows on a GPU too
        assert be.reports[1].metrics.counters["codegen_mix_order_reduction"] == 1


def test_interpolate_and_reflection_pad_backward_sum_their_scatters():
    """The two backwards scatter-add into zero-filled buffers that a later sum reads; fuse put the sum's
    group on the wrong side of the scatters (every gradient element wrong)."""
    fn = lambda x: (F.interpolate(x, size=(4, 9), mode="bilinear", align_corners=True),  # noqa: E731
                    F.pad(x, (1, 2, 2, 1), mode="reflect"))
    assert_matches_eager(fn, [_g(2, 3, 5, 6)], codegen="reference")


def test_dce_keeps_a_read_scatter_and_removes_an_unread_one():
    out, _ = passline.PassManager("dce").run(_scatter_graph(read_after=True))
    assert sorted(out.names()) == ["acc", "out", "sc"]
    out, _ = passline.PassManager("dce").run(_scatter_graph(read_after=False))
    assert out.names() == []


def test_scatter_nodes_do_not_fuse():
    """A scatter's write positions meet no loop point of another node: it stays its own kernel (refused
    with a reason), and the nodes before and after it fuse only among themselves."""
    be = assert_matches_eager(lambda x, i, s: (x * 2).scatter_add(1, i, s * 3).exp(),
                              [_g(5, 7), _ints(0, 7, 5, 9), _g(5, 9)], codegen="reference")
    report = be.reports[0]
    assert report.metrics.fusion_failures["scatter"] >= 1
    scatter = [n for n in report.graph.nodes() if n.kind == "scatter"]
    assert len(scatter) == 1, report.graph.format()


def test_dynamic_shapes_one_compile():
    """Bounds, index tensors and scatter targets with symbolic sizes: one forward and one backward graph
    serve every size (the bounds are kernel arguments)."""
    be = passline.backend(codegen="triton", fallback="raise")
    f = torch.compile(lambda i, w, x, a: (F.embedding(i, w) * 2, x[a] + 1, F.cross_entropy(x, a)),
                      backend=be, dynamic=True)
    for n in (5, 9):
        w = torch.randn(n + 3, 4, device=DEVICE, requires_grad=True)
        x = torch.randn(n, n, device=DEVICE, requires_grad=True)
        i, a = torch.randint(0, n + 3, (n, 2), device=DEVICE), torch.randint(0, n, (n,), device=DEVICE)
        grads = []
        for fn in (f, lambda *xs: (F.embedding(xs[0], xs[1]) * 2, xs[2][xs[3]] + 1, F.cross_entropy(xs[2], xs[3]))):
            outs = fn(i, w, x, a)
            sum((o * 1.3).sum() for o in outs).backward()
            grads.append((outs, w.grad, x.grad))
            w.grad = x.grad = None
        for got, want in zip(grads[0][0] + grads[0][1:], grads[1][0] + grads[1][1:]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert len(be.reports) == 2


def test_gpu_kernels_compile_with_their_asserts_and_atomics(tmp_path):
    """The GPU form of a checked gather and of an atomic scatter compiles for an H100/H200 (sm_90) on any
    machine (Triton compiles without a GPU), and the bounds check survives into the PTX as __assertfail.
    Compiled in a fresh process without TRITON_INTERPRET: in this one (the test suite runs under the
    interpreter) Triton's own helper functions were made for the interpreter when it was imported, and a GPU
    compile that reaches one failed depending on which tests ran before."""
    import json
    import re
    import subprocess
    import sys

    from passline.backends.triton import kernel as kgen

    be = assert_matches_eager(lambda i, w: F.embedding(i, w), [_ints(0, 10, 3, 8), _g(10, 6)], codegen="reference")
    types = {torch.float32: "*fp32", torch.int64: "*i64"}
    jobs = []
    for report in be.reports:
        graph = report.graph
        for node in graph.nodes():
            src = kgen.generate(node, graph, interpret=False, variant="persistent", blocks={})
            if "device_assert" not in src.source:
                continue
            path = tmp_path / f"{src.fn_name}_{len(jobs)}.py"
            path.write_text(src.source)
            ptr = {"p_" + re.sub(r"\W", "_", v): types[graph.buffers()[v].dtype] for k, v in src.args if k == "buffer"}
            jobs.append({"path": str(path), "fn": src.fn_name, "ptr": ptr,
                         "kind": "atomic" if "tl.atomic_add" in src.source else "gather"})
    script = tmp_path / "compile.py"
    script.write_text("""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
out = {}
for job in json.loads(sys.argv[1]):
    spec = importlib.util.spec_from_file_location(job["fn"], job["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = getattr(module, job["fn"])
    sig = {a: job["ptr"].get(a, "constexpr" if a == "XBLOCK" else "i32") for a in jit.arg_names}
    try:
        compiled = triton.compile(ASTSource(jit, signature=sig, constexprs={"XBLOCK": 128}),
                                  target=GPUTarget("cuda", 90, 32), options={"debug": True})
    except RuntimeError as e:  # no CUDA toolchain in this Triton build
        print(json.dumps({"skip": str(e)}))
        sys.exit(0)
    out[job["kind"]] = "__assertfail" in compiled.asm["ptx"]
print(json.dumps(out))
""")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script), json.dumps(jobs)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"Triton cannot compile for CUDA here: {result['skip']}")
    assert result == {"gather": True, "atomic": True}


def test_position_embedding_at_an_arange_is_proven_in_range():
    # GPT's position embedding: embedding(weight, arange(T)); the arange's values lie in [0, T) by
    # construction (its body is the bare loop variable), so no bounds check is generated
    w = torch.randn(10, 4, device=DEVICE, requires_grad=True)
    be = assert_matches_eager(lambda w: F.embedding(torch.arange(6, device=w.device), w), [w])
    assert [r.externs for r in be.reports] == [0, 0]
    (fw,) = [r for r in be.reports if r.name.startswith("forward")]
    indirect = [b for n in fw.graph.nodes() for m in members(n) for ld in loads(m.body) for b in ld.indirect]
    assert indirect and all(b.proven for b in indirect)


# -- EmbeddingBag: replaced in dynamo's graph by a gather and a reduction per bag ------------------------
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("bags", ["rows", "offsets", "offsets_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_bag_trains_as_eager(mode, bags, dtype):
    """nn.EmbeddingBag compiles (fallback="raise": its aten op used to be refused, the whole graph run eagerly)
    and trains as eager: outputs, the weight's and the per-sample weights' gradients; a padding index left
    out of sums, means and maxima, empty bags zeros, a bag's repeated row (a tie) and all-zero rows for max
    (eager's gradient goes to the bag's first maximum). (Entries past an include_last_offset's last offset
    are not tested: eager's own kernels disagree there, its CPU sum leaving them out of the output but not of
    the gradient, its mean out of the sum but not of the count.)"""
    import copy

    torch._dynamo.reset()  # each case compiles EmbeddingBag.forward again: past dynamo's limit it runs eagerly
    torch.manual_seed(0)
    eb = torch.nn.EmbeddingBag(20, 6, mode=mode, padding_idx=3, include_last_offset=bags == "offsets_last")
    with torch.no_grad():
        eb.weight[10:14] = 0.0  # equal rows: ties a max resolves to the first entry
    eb = eb.to(dtype)
    ref = copy.deepcopy(eb)
    if bags == "rows":
        idx, off = torch.tensor([[1, 5, 5, 3], [3, 3, 3, 3], [10, 11, 12, 0], [19, 2, 7, 12]]), None
    else:  # bags [0, 3) [3, 3) [3, 7) [7, 9) [9, ...): an empty one, one of padding only
        idx = torch.tensor([4, 4, 9, 3, 3, 3, 3, 11, 10, 0, 13, 12])
        off = torch.tensor([0, 3, 3, 7, 9] + ([12] if bags == "offsets_last" else []))
    psw = torch.rand(idx.shape, dtype=dtype, requires_grad=True) if mode == "sum" else None
    psw_ref = psw.detach().clone().requires_grad_(True) if psw is not None else None
    f = torch.compile(eb, backend=passline.backend(fallback="raise"))
    y, y_ref = f(idx, off, per_sample_weights=psw), ref(idx, off, per_sample_weights=psw_ref)
    cot = torch.randn(y_ref.shape).to(dtype)
    (y * cot).sum().backward()
    (y_ref * cot).sum().backward()
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(eb.weight.grad, ref.weight.grad, **tol)
    if psw is not None:
        torch.testing.assert_close(psw.grad, psw_ref.grad, **tol)


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_embedding_bag_indices_out_of_range_raise(mode):
    torch._dynamo.reset()
    eb = torch.nn.EmbeddingBag(8, 4, mode=mode)
    f = torch.compile(eb, backend=passline.backend(fallback="raise"))
    for bad in (-1, 8):
        with pytest.raises(Exception, match=f"index {bad} is out of bounds"):
            f(torch.tensor([1, bad, 2]), torch.tensor([0, 2]))


@pytest.mark.parametrize("two_d", [False, True])
def test_embedding_bag_max_takes_a_nan_only_as_a_bags_first_entry(two_d):
    """Eager's max keeps a running maximum from a bag's first entry, replaced only by a greater one: a NaN
    first entry is the result (and gets the gradient), a later NaN is passed over, -inf ties go to the first."""
    import copy

    torch._dynamo.reset()
    nan, inf = float("nan"), float("inf")
    eb = torch.nn.EmbeddingBag(6, 2, mode="max", padding_idx=4)
    with torch.no_grad():
        eb.weight.copy_(torch.tensor([[nan, 1.0], [2.0, nan], [3.0, -inf], [-inf, -inf], [0.5, 0.5], [nan, nan]]))
    ref = copy.deepcopy(eb)
    if two_d:
        idx, off = torch.tensor([[0, 1], [1, 0], [2, 3], [3, 3], [4, 0], [4, 5], [5, 2]]), None
    else:
        idx, off = torch.tensor([0, 1, 2, 1, 0, 3, 4, 0, 5, 2, 3, 3]), torch.tensor([0, 2, 4, 6, 8, 10])
    f = torch.compile(eb, backend=passline.backend(fallback="raise"))
    with torch.no_grad():  # the value alone: one reduction of the rows, the first entry's NaN taken apart
        torch.testing.assert_close(f(idx, off), ref(idx, off), equal_nan=True)
    y, y_ref = f(idx, off), ref(idx, off)
    cot = torch.arange(1.0, y_ref.numel() + 1).reshape(y_ref.shape)
    (y * cot).sum().backward()
    (y_ref * cot).sum().backward()
    torch.testing.assert_close(y, y_ref, equal_nan=True)
    torch.testing.assert_close(eb.weight.grad, ref.weight.grad, equal_nan=True)


def test_embedding_bag_padding_is_never_a_maximum_nor_a_nan_gradient():
    """Padding entries, masked to -inf, tie a column whose other entries are all -inf: the maximum is still
    the first non-padding entry's (and its gradient), never the padding row's. A padding row holding inf or
    NaN gives its per-sample weight a zero gradient, not inf times zero (found by the session's fuzzing)."""
    torch._dynamo.reset()
    inf, nan = float("inf"), float("nan")
    w = torch.tensor([[5.0, 1.0], [-inf, 2.0], [nan, -inf]])
    fmax = lambda i, w: F.embedding_bag(i, w, mode="max", padding_idx=0)  # noqa: E731
    idx = torch.tensor([[0, 1], [1, 0], [0, 2]])  # padding first, last; a NaN first non-padding entry
    we, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    ye, yc = fmax(idx, we), torch.compile(fmax, backend=passline.backend(fallback="raise"))(idx, wc)
    ye.sum().backward()
    yc.sum().backward()
    torch.testing.assert_close(yc, ye, equal_nan=True)
    torch.testing.assert_close(wc.grad, we.grad)
    torch._dynamo.reset()
    wi = torch.tensor([[1.0, inf], [2.0, 3.0], [nan, 5.0]])
    fsum = lambda i, w, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=2)  # noqa: E731
    f = torch.compile(fsum, backend=passline.backend(fallback="raise"))
    for i, o in ((torch.tensor([2, 1, 0, 2]), torch.tensor([0, 2])), (torch.tensor([[0, 2], [2, 1]]), None)):
        pe, pc = torch.ones(i.shape, requires_grad=True), torch.ones(i.shape, requires_grad=True)
        fsum(i, wi, o, pe).sum().backward()
        f(i, wi, o, pc).sum().backward()
        torch.testing.assert_close(pc.grad, pe.grad)
        # a padding entry's own weight inf or NaN (1 / length with inf at the padding slots) is skipped too
        p = torch.where(i == 2, torch.tensor([inf, nan])[torch.arange(i.numel()) % 2].view(i.shape), 1.0)
        finite = torch.arange(6.0).view(3, 2)
        torch.testing.assert_close(f(i, finite, o, p), fsum(i, finite, o, p))


@pytest.mark.parametrize("offsets", [[0, 2, 9], [0, 3, 2], [1, 3], "last"])
def test_embedding_bag_invalid_offsets_raise(offsets):
    """Offsets past the input's end, decreasing, or not starting at 0 (eager's CPU sum and mean raise; what its max
    returns there is no bag's value), or with include_last_offset a last offset short of the input's length (the
    CSR form the option means; eager's kernels disagree there, its sum's output leaving the entries after it out,
    its gradient and its max taking them in): passline raises, where its scatter over bags would have gone on."""
    torch._dynamo.reset()
    last = offsets == "last"
    f = torch.compile(lambda i, w, o: F.embedding_bag(i, w, o, mode="sum", include_last_offset=last),
                      backend=passline.backend(fallback="raise"))
    with pytest.raises(RuntimeError, match="offsets"):
        f(torch.tensor([1, 2, 3, 4]), torch.randn(6, 3), torch.tensor([0, 2, 3] if last else offsets))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_without_offsets_is_empty(mode):
    """No offsets at all (no bags) with entries: eager's sum and mean return a [0, dim] result, and so does passline
    (its scatter had put every entry in bag -1)."""
    torch._dynamo.reset()
    w = torch.randn(6, 3, requires_grad=True)
    f = torch.compile(lambda i, w, o: F.embedding_bag(i, w, o, mode=mode), backend=passline.backend(fallback="raise"))
    y = f(torch.tensor([1, 2, 3]), w, torch.tensor([], dtype=torch.long))
    assert y.shape == (0, 3)
    y.sum().backward()
    torch.testing.assert_close(w.grad, torch.zeros(6, 3))


@pytest.mark.parametrize("last", [False, True])
def test_embedding_bag_mean_counts_a_bags_entries_from_its_offsets(last):
    """Without a padding index a bag's count is the distance to the next offset (the last bag's to the end,
    or to the last offset with include_last_offset): empty bags, a bag of one, inference and training."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    eb = torch.nn.EmbeddingBag(10, 3, mode="mean", include_last_offset=last)
    ref = copy.deepcopy(eb)
    idx = torch.tensor([1, 2, 3, 9, 9, 0, 4, 5])
    off = torch.tensor([0, 0, 3, 4, 4] + ([8] if last else []))  # bags of 0, 3, 1, 0 and 4 entries
    f = torch.compile(eb, backend=passline.backend(fallback="raise"))
    with torch.no_grad():
        torch.testing.assert_close(f(idx, off), ref(idx, off))
    y, y_ref = f(idx, off), ref(idx, off)
    cot = torch.randn(y_ref.shape)
    (y * cot).sum().backward()
    (y_ref * cot).sum().backward()
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(eb.weight.grad, ref.weight.grad)


def test_embedding_bag_offsets_on_a_gpu_run_atens_kernel_where_it_is_faster():
    """The rule that sends bags given by offsets to aten's kernel (measured on an H200: a max, or a forward
    without gradients) and keeps ours elsewhere — always on the CPU, whose aten kernel disagrees with its
    meta function's shapes."""
    from types import SimpleNamespace

    from passline.lowering.decompositions import _aten_bags

    def w(device, dtype=torch.float32):
        return SimpleNamespace(device=torch.device(device), dtype=dtype)

    assert not any(_aten_bags(w("cpu"), mode, grad) for mode in ("sum", "mean", "max") for grad in (False, True))
    assert all(_aten_bags(w("cuda"), mode, False) for mode in ("sum", "mean", "max"))
    assert _aten_bags(w("cuda"), "max", True) and not _aten_bags(w("cuda", torch.bfloat16), "max", True)
    assert not _aten_bags(w("cuda"), "sum", True) and not _aten_bags(w("cuda"), "mean", True)
