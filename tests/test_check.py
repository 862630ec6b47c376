"""The accuracy guard, passline.backend(check=True): first calls checked against the reference backend."""
import copy
import math
import warnings

import attrs
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import passline
from passline.backends import check as check_module
from passline.backends import dynamo
from passline.backends.check import AccuracyError, worst_mismatch
from passline.ir import Constant, Op, Pointwise
from passline.testing import tolerance


@pytest.fixture
def sign_flip():
    """A wrong pass: rewrites every pointwise node harmlessly (times 1), but flips the sign of the 3rd."""
    @passline.register_pass("t_check_flip", replace=True)
    def t_check_flip(graph, ctx):
        for k, node in enumerate([n for n in graph.nodes() if isinstance(n, Pointwise)], 1):
            if node.body.dtype.is_floating_point and ctx.decide("rewrite", node):
                factor = -1.0 if k == 3 else 1.0
                body = Op("mul", (node.body, Constant(factor, node.body.dtype)), node.body.dtype)
                graph.replace_node(node.name, attrs.evolve(node, body=body))
        return graph

    yield "t_check_flip"
    passline.unregister_pass("t_check_flip")


@pytest.fixture
def oracle_runs(monkeypatch):
    """Counts the guard's oracle calls (the compiled runners are built elsewhere, so they are not counted)."""
    calls = []

    class Counting(check_module.ReferenceRunner):
        def __call__(self, *args):
            calls.append(self)
            return super().__call__(*args)

    monkeypatch.setattr(check_module, "ReferenceRunner", Counting)
    return calls


def check_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "passline check" in str(w.message)]


def train(model, x, steps=2):
    """Plain SGD steps; returns the losses, the input's gradient and the final parameters."""
    losses = []
    for _ in range(steps):
        model.zero_grad()
        x.grad = None
        loss = model(x).square().mean()
        loss.backward()
        losses.append(loss.detach())
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return losses, x.grad, [p.detach() for p in model.parameters()]


def assert_same_training(compiled_model, eager_model, x):
    got = train(compiled_model, x.clone().requires_grad_())
    want = train(eager_model, x.clone().requires_grad_())
    for a, b in zip(got[0] + [got[1]] + got[2], want[0] + [want[1]] + want[2]):
        torch.testing.assert_close(a, b, **tolerance(torch.float32))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU())


# -- (a) a correct model trains, checked once per graph ---------------------------------------------------
@pytest.mark.parametrize("codegen", ["reference", "triton"])  # triton: the interpreter, on CPU tensors
def test_correct_model_trains_checked_once(codegen, oracle_runs):
    torch._dynamo.reset()
    model = make_model()
    eager = copy.deepcopy(model)
    # capture composes: the guard checks the call whose inputs capture keeps
    be = passline.backend(codegen=codegen, check=True, capture=True, fallback="raise")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert_same_training(torch.compile(model, backend=be), eager, torch.randn(8, 16))
    assert check_warnings(record) == []
    assert [r.name for r in be.reports] == ["forward0", "backward1"]
    for r in be.reports:
        assert r.check.ok and r.check.mismatch is None and r.check.culprit is None, r.check
        assert r.check.seconds > 0 and r.seconds["check"] > 0 and r.inputs is not None
        assert r.codegen == codegen
    # two training steps, one oracle run per graph: the second step ran the compiled runners alone
    assert len(oracle_runs) == 2
    assert be.failures == []


def test_a_sliced_input_of_a_dynamic_graph_is_checked_in_its_own_layout():
    """BatchNorm in training writes its running statistics in place, so the oracle runs on copies of the
    inputs; a sliced input's copy keeps its strides (clone() made it contiguous, and the oracle of a
    dynamic-shape graph, whose stride symbols bind from its inputs, failed its first call)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, eager = torch.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    be = passline.backend(codegen="reference", check=True, fallback="raise")
    compiled = torch.compile(model, backend=be, dynamic=True)
    for b in (2, 4):
        x = torch.randn(b, 3, 5, 15)[..., 1::2].requires_grad_()
        xe = x.detach().clone().requires_grad_()
        out, want = compiled(x), eager(xe)
        torch.testing.assert_close(out, want, **tolerance(torch.float32))
        out.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, **tolerance(torch.float32))
    torch.testing.assert_close(model.running_var, eager.running_var)
    assert be.reports and all(r.check.ok for r in be.reports)


# -- (b) a wrong pass is caught, named, worked around and saved ---------------------------------------------
def test_wrong_pass_warns_falls_back_bisects_and_saves(sign_flip, tmp_path, oracle_runs):
    torch._dynamo.reset()
    model = make_model()
    eager = copy.deepcopy(model)
    be = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference", check=True, dump_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        # both steps give eager's values: the checking call returns them, later calls run eagerly
        assert_same_training(torch.compile(model, backend=be), eager, torch.randn(8, 16))
    messages = check_warnings(record)
    bad = [r for r in be.reports if not r.check.ok]
    assert bad and len(messages) == len(bad)  # one warning per wrong graph, none on the second step
    assert len(oracle_runs) == len(be.reports)  # and the oracle ran only on first calls
    for r, message in zip(bad, messages):
        c = r.check
        assert f"graph {r.name} " in message and sign_flip in message and "decision #3 rewrite(" in message
        assert c.bisect.pass_name == sign_flip and c.bisect.pass_index == 2 and c.bisect.decision.index == 3
        assert c.bisect.minimal_pipeline == f"dce, {sign_flip}"
        assert c.error > c.tolerance["atol"] and f"output {c.output} " in message
        assert c.mismatch.node and f"node {c.mismatch.node!r}" in message  # the FX node behind the output
        assert c.reproducer.startswith(str(tmp_path)) and c.reproducer in message
        assert not passline.replay(c.reproducer).matches  # the reproducer shows the failure on its own
    assert {kind for kind, _ in be.failures} == {r.name.rstrip("0123456789") for r in bad}


def test_wrong_pass_raises_under_fallback_raise(sign_flip):
    torch._dynamo.reset()
    be = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference", check=True, fallback="raise")
    fn = lambda x: ((x * 2 + 1).exp() - 3).tanh()
    with pytest.raises(AccuracyError, match=f"graph inference0 .*{sign_flip}"):
        torch.compile(fn, backend=be)(torch.randn(8, 4))


def test_code_generator_bug_names_no_pass(monkeypatch, tmp_path):
    """With a wrong runner even the empty pipeline mismatches: the culprit is the code generator."""
    class OffByOne(dynamo.ReferenceRunner):
        def __call__(self, *args):
            return [o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                    for o in super().__call__(*args)]

    monkeypatch.setattr(dynamo, "ReferenceRunner", OffByOne)  # the compiled runner; the oracle is untouched
    torch._dynamo.reset()
    be = passline.backend(pipeline="dce", codegen="reference", check=True, dump_dir=str(tmp_path))
    fn = lambda x: x.exp() * 2
    x = torch.randn(6)
    with pytest.warns(UserWarning, match="graph inference0 .*no pass: the code generator"):
        got = torch.compile(fn, backend=be)(x)
    torch.testing.assert_close(got, fn(x))
    c = be.reports[0].check
    assert not c.ok and c.bisect.pass_index is None and c.error == pytest.approx(1.0)
    assert (tmp_path / "repro-inference0.pt").exists()


def test_inputs_written_in_place_are_restored_before_the_fallback(sign_flip):
    """The guard's oracle sees the inputs as they were, and the eager fallback writes them once."""
    def fn(x):
        torch.ops.aten.add_.Tensor(x, 1)
        return (x * 2).exp() - 3

    x0 = torch.randn(5)
    gm = make_fx(fn)(x0.clone())
    be = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference", check=True)
    guard = be.compile_aten(gm, [x0.clone()], "graph")
    assert guard.mutated == [0]
    x = x0.clone()
    with pytest.warns(UserWarning, match="passline check"):
        (out,) = check_module._as_list(guard(x))
    torch.testing.assert_close(x, x0 + 1)  # not x0 + 2: the runner's write was undone first
    torch.testing.assert_close(out, fn(x0.clone()))


def test_random_graphs_are_checked_on_the_runners_draws():
    """The oracle draws a dropout's mask from the generator state the compiled runner started from (it
    used to draw a new one and call every dropout graph wrong); the user's generator ends where eager's does."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 24), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Dropout(0.5))
    be = passline.backend(codegen="reference", check=True, fallback="raise")
    compiled = torch.compile(model, backend=be)
    x = torch.randn(9, 13, requires_grad=True)
    torch.manual_seed(1)
    got = compiled(x)
    got.backward(torch.ones_like(got))
    after = torch.rand(3)
    assert all(r.check.ok for r in be.reports) and len(be.reports) == 2
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(x))  # the same masks as eager, and the same draws after it
    torch.testing.assert_close(after, torch.rand(3))


def test_wrong_pass_on_a_random_graph_is_bisected_with_the_same_draws(sign_flip):
    torch._dynamo.reset()
    be = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference", check=True)
    fn = lambda x: (torch.nn.functional.dropout(x * 2 + 1, 0.5).exp() - 3).tanh()
    x = torch.randn(8, 4)
    torch.manual_seed(2)
    with pytest.warns(UserWarning, match=f"graph inference0 .*{sign_flip}.*decision #3"):
        got = torch.compile(fn, backend=be)(x)
    after = torch.rand(3)
    torch.manual_seed(2)
    torch.testing.assert_close(got, fn(x))  # the fallback drew the runner's mask
    torch.testing.assert_close(after, torch.rand(3))  # and the probes drew nothing of the user's


def test_a_failing_oracle_leaves_the_graph_compiled_and_says_so(monkeypatch):
    class Failing(check_module.ReferenceRunner):
        def __call__(self, *args):
            raise RuntimeError("out of memory (pretend)")

    monkeypatch.setattr(check_module, "ReferenceRunner", Failing)  # the oracle only
    fn = lambda x: x.exp() * 2
    x = torch.randn(6)
    torch._dynamo.reset()
    be = passline.backend(pipeline="dce", codegen="reference", check=True)
    with pytest.warns(UserWarning, match="graph inference0 could not be checked.*out of memory"):
        torch.testing.assert_close(torch.compile(fn, backend=be)(x), fn(x))
    c = be.reports[0].check
    assert c.ok is None and "out of memory" in c.message and be.failures == []
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="out of memory"):  # fallback="raise" shows the error itself
        torch.compile(fn, backend=passline.backend(pipeline="dce", codegen="reference", check=True,
                                                   fallback="raise"))(x)


# -- (c) PASSLINE_CHECK=1 (or passline.settings(check=True)) switches it on --------------------------------
def test_environment_variable_enables_the_guard(sign_flip):
    fn = lambda x: ((x * 2 + 1).exp() - 3).tanh()
    x = torch.randn(8, 4)
    assert passline.Settings.from_environ({"PASSLINE_CHECK": "1"}).check
    assert not passline.Settings.from_environ({}).check
    torch._dynamo.reset()
    with passline.settings(check=False):
        off = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference")
    assert not off.check and not torch.allclose(torch.compile(fn, backend=off)(x), fn(x))  # off by default
    assert off.reports[0].check is None

    torch._dynamo.reset()
    with passline.settings(check=True):
        on = passline.backend(pipeline=f"dce, {sign_flip}", codegen="reference")
        assert on.check and not passline.backend(check=False).check  # an explicit argument wins
    with pytest.warns(UserWarning, match="passline check: graph inference0"):
        torch.testing.assert_close(torch.compile(fn, backend=on)(x), fn(x))
    assert on.reports[0].check.bisect.pass_name == sign_flip


# -- (d) integers and bools exact, floats by dtype, NaN where NaN -------------------------------------------
def test_integer_outputs_are_compared_exactly():
    @passline.register_pass("t_int_plus_one", replace=True)
    def t_int_plus_one(graph, ctx):
        """Adds 1 to every int64 pointwise result (a wrong pass)."""
        for node in [n for n in graph.nodes() if isinstance(n, Pointwise)]:
            if node.body.dtype == torch.int64 and ctx.decide("bump", node):
                body = Op("add", (node.body, Constant(1, torch.int64)), torch.int64)
                graph.replace_node(node.name, attrs.evolve(node, body=body))
        return graph

    try:
        # values near 1e5: off by one is well within float32's rtol (1e-4 of 1e5 = 10), but not exact
        fn = lambda x: ((x * 1e5).to(torch.int64) + 7, x > 0)
        x = torch.randn(16)
        torch._dynamo.reset()
        be = passline.backend(pipeline="dce, t_int_plus_one", codegen="reference", check=True)
        with pytest.warns(UserWarning, match="tolerance exact"):
            ints, bools = torch.compile(fn, backend=be)(x)
        assert torch.equal(ints, fn(x)[0]) and torch.equal(bools, fn(x)[1])
        c = be.reports[0].check
        assert c.output == 0 and c.tolerance == dict(atol=0, rtol=0) and c.error in (1.0, 2.0)
    finally:
        passline.unregister_pass("t_int_plus_one")


def test_comparison_rules():
    f = torch.tensor([1.0, 2.0, float("nan"), float("inf")])
    assert worst_mismatch([f.clone(), torch.tensor([True])], [f, torch.tensor([True])]) is None
    assert worst_mismatch([f + 5e-5], [f]) is None  # within float32's tolerance; NaN meets NaN, inf inf
    # bools exact
    m = worst_mismatch([f, torch.tensor([True, False])], [f, torch.tensor([True, True])], ["a", "b"])
    assert (m.output, m.node, m.error, m.atol, m.rtol) == (1, "b", 1.0, 0, 0)
    # NaN where the oracle has a number (or the reverse) is an infinite error, reported as such
    m = worst_mismatch([torch.tensor([1.0, float("nan")])], [torch.tensor([1.0, 2.0])])
    assert m.error == math.inf and m.what == "NaN positions"
    m = worst_mismatch([torch.tensor([float("inf")])], [torch.tensor([float("-inf")])])
    assert m.error == math.inf and m.what == "values"
    # the dtype's tolerance: 1e-2 apart passes in bfloat16, not in float32; the worst output is named
    b = torch.tensor([1.0, 2.0])
    assert worst_mismatch([(b + 1e-2).bfloat16()], [b.bfloat16()]) is None
    m = worst_mismatch([b + 1e-3, b + 1e-2], [b, b])
    assert m.output == 1 and m.error == pytest.approx(1e-2) and m.atol == 1e-4
    # shapes, dtypes and non-tensor outputs must agree exactly
    assert "shape" in worst_mismatch([b[:1]], [b]).what and "dtype" in worst_mismatch([b.double()], [b]).what
    assert worst_mismatch([3, None], [3, None]) is None and worst_mismatch([3], [4]).error == math.inf
