"""The Triton path on the edges that once compiled and then crashed while running (issue 13): zero-size
tensors, 0-dim operands, bool and integer values, NaN and inf. Each is compared with eager, forward and
backward where differentiable (`assert_matches_eager` with codegen="triton", fallback="raise": nothing may
fall back to eager here)."""
import os

import pytest
import torch

import passline
from passline.testing import assert_matches_eager


def _triton(fn, inputs, **kw):
    be = assert_matches_eager(fn, inputs, codegen="triton", **kw)
    assert be.reports and all(r.codegen == "triton" for r in be.reports)
    return be


# -- zero-size tensors: a kernel with no points launches nothing, its outputs are still allocated --------
ZERO_SIZE = {
    "rsqrt": (lambda x: torch.rsqrt(x), lambda: [torch.rand(1, 0, 3, requires_grad=True)]),
    "celu": (lambda x: torch.nn.functional.celu(x), lambda: [torch.randn(1, 0, 3, requires_grad=True)]),
    "new_zeros": (lambda x: x.new_zeros((2, 0)) + 1, lambda: [torch.randn(3, 4)]),
    "roll": (lambda x: torch.roll(x * 2, 1, 0), lambda: [torch.randn(0, 0, 0, requires_grad=True)]),
    "prelu": (lambda x, w: torch.nn.functional.prelu(x, w),
              lambda: [torch.randn(0, 3, 4, requires_grad=True), torch.rand(3, requires_grad=True)]),
    # reductions: no rows (no kernel), and rows reducing over nothing (each identity)
    "sum_no_rows": (lambda x: (x.sum(1), x.amax(1)), lambda: [torch.randn(0, 5, requires_grad=True)]),
    "sum_over_nothing": (lambda x: (x.sum(1), x.prod(1), (x > 0).any(1)),
                         lambda: [torch.randn(4, 0, requires_grad=True)]),
    # a mix-order backward (LayerNorm) over zero rows: no kernel, and the weight's gradient sums no rows
    "layer_norm_no_rows": (torch.nn.LayerNorm(8), lambda: [torch.randn(0, 8, requires_grad=True)]),
    "batch_norm_empty_spatial": (lambda x, m, v: torch.ops.aten._native_batch_norm_legit(x, None, None, m, v, False,
                                                                                         0.1, 1e-5)[0],
                                 lambda: [torch.randn(3, 2, 0), torch.zeros(2), torch.ones(2)]),
}


@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_zero_size(name):
    fn, inputs = ZERO_SIZE[name]
    device = os.environ.get("PASSLINE_TEST_DEVICE")
    if device:  # eager must run the case there (CUDA's batch norm raises on an empty spatial dim)
        try:
            fn(*[x.detach().to(device) for x in inputs()])
        except RuntimeError as e:
            pytest.skip(f"eager raises on {device}: {type(e).__name__}")
    _triton(fn, inputs())


def test_zero_size_outputs_have_eager_shape_strides_and_dtype():
    fn = lambda x: (x * 2, (x > 0), x.sum(0), x.new_zeros((2, 0), dtype=torch.int64))
    x = torch.randn(0, 3)
    torch._dynamo.reset()
    ours = torch.compile(fn, backend=passline.backend(codegen="triton", fallback="raise"))(x)
    for a, b in zip(ours, fn(x)):
        # strides: torch's contiguous strides treat a 0 dim as 1 ((1, 1) for (2, 0)), passline's
        # layouts (0, 1); with no element either addresses nothing and both are contiguous
        assert (a.shape, a.dtype, a.is_contiguous()) == (b.shape, b.dtype, b.is_contiguous())
        if a.numel() == 0 and 0 not in a.shape[1:]:
            assert a.stride() == b.stride()
    assert torch.equal(ours[2], torch.zeros(3))


# -- 0-dim operands and bool results: loads of one address are [1] blocks, never 0-d values ---------------
ZERO_DIM = {
    "logical_or": (lambda x, y: torch.logical_or(x, y), lambda: [torch.randn(5), torch.tensor(0.0)]),
    "logical_xor": (lambda x, y: torch.logical_xor(x, y), lambda: [torch.randn(5), torch.tensor(1.5)]),
    "logical_and_bool": (lambda x, y: torch.logical_and(x > 0, y), lambda: [torch.randn(5), torch.tensor(True)]),
    "logical_not": (lambda x: torch.logical_not(x), lambda: [torch.tensor(0.0)]),
    "pow_0dim_exponent": (lambda x, e: torch.pow(x, e), lambda: [torch.rand(5, requires_grad=True) + 0.5,
                                                                    torch.tensor(2.5, requires_grad=True)]),
    "pow_0dim_base": (lambda b, x: torch.pow(b, x), lambda: [torch.tensor(1.7, requires_grad=True),
                                                                torch.randn(2, 3, requires_grad=True)]),
    "pow_negative_base_integral_exponent": (lambda x, e: torch.pow(x, e), lambda: [torch.randn(6), torch.tensor(3.0)]),
    "float_power": (lambda x, e: torch.float_power(x, e), lambda: [torch.rand(4, dtype=torch.float64) + 0.1,
                                                                     torch.tensor(2.0, dtype=torch.float64)]),
    "all_0dim": (lambda x, y: (x * y + 1, torch.where(x > y, x, y), x == y), lambda: [
        torch.tensor(0.3, requires_grad=True), torch.tensor(-1.2, requires_grad=True)]),
    "where_0dim_condition": (lambda c, x, y: torch.where(c, x, y), lambda: [torch.tensor(False), torch.randn(3, 4),
                                                                              torch.tensor(7.0)]),
    "add_0dim_grad": (lambda x, s: x * s + s, lambda: [torch.randn(4, 3, requires_grad=True),
                                                        torch.tensor(0.5, requires_grad=True)]),
    # reductions of a 0-dim tensor: a reduction over no dims is still a reduction kernel
    "reductions_of_0dim": (lambda x: (x.sum(), x.sum(0), x.argmax(), x.amax(), (x > 0).any(), x.mean()),
                           lambda: [torch.tensor(3.0, requires_grad=True)]),
    "reduction_with_0dim": (lambda x, s: ((x > s) | (s < 0)).sum(1), lambda: [torch.randn(6, 9), torch.tensor(0.2)]),
}


@pytest.mark.parametrize("name", sorted(ZERO_DIM))
def test_zero_dim_operands_and_bool_results(name):
    fn, inputs = ZERO_DIM[name]
    _triton(fn, inputs())


# -- bool and integer tensors, scalars, NaN and inf ---------------------------------------------------------
def test_bool_and_integer_tensors():
    a = torch.rand(4, 5) > 0.5
    b = torch.rand(4, 5) > 0.5
    i = torch.randint(-9, 9, (4, 5))
    fn = lambda a, b, i: (a & b, a | ~b, a ^ b, torch.logical_not(a), a.sum(1), a.any(0), (i * 3 - 1) // 2,
                          i % 4, torch.where(a, i, -i), i.abs(), (i > 0) == a, a.to(torch.float32) * 2)
    _triton(fn, [a, b, i])


RAISES_AS_EAGER = {
    # an integer division by zero raises on the CPU: the interpreter's kernels returned 0 (numpy's)
    "floordiv_by_zero": lambda i, z: i // z,
    "remainder_by_zero": lambda i, z: (i % z).sum(),
    "fmod_by_zero": lambda i, z: torch.fmod(i, z[:, :1]),
    "floordiv_by_scalar_zero": lambda i, z: i // 0,
    # eager refuses these; the kernels computed 1 - True and 7 ** -1 (0)
    "sub_of_bools": lambda i, z: (i > 0) - 0,
    "int_to_negative_power": lambda i, z: i ** -1,
}


@pytest.mark.parametrize("codegen", ["reference", "triton"])
@pytest.mark.parametrize("name", sorted(RAISES_AS_EAGER))
def test_errors_eager_raises_are_raised(name, codegen):
    fn = RAISES_AS_EAGER[name]
    i, z = torch.randint(-9, 9, (5, 7)), torch.randint(1, 4, (5, 7))
    z[3, 0] = 0
    with pytest.raises(Exception) as eager:
        fn(i, z)
    with pytest.raises(Exception, match=str(eager.value)[:30].replace("(", r"\(")):
        torch._dynamo.reset()
        torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(i, z)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_assertions_run_and_raise_as_eager(codegen):
    """`torch._assert_async` in a compiled program has no result anyone reads: dce removed it, and a
    failed check passed silently. It runs now, raising as eager does, and passes where the check holds."""
    def fn(x):
        torch._assert_async((x > 0).all(), "all positive")
        return x * 2

    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(fn, backend=be)
    x = torch.rand(5) + 1
    torch.testing.assert_close(compiled(x), x * 2)
    with pytest.raises(RuntimeError, match="all positive"):
        fn(-x)
    with pytest.raises(RuntimeError, match="all positive"):
        compiled(-x)
    assert len(be.reports) == 1


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_run_time_asserts_on_sizes_are_kept(codegen):
    """dynamo's run-time asserts on sizes (`torch._check` under dynamic shapes: `_assert_scalar`) stay in
    the generated call: called with sizes that break the check, it raises (the reference backend once
    passed the condition to aten unevaluated, a sympy comparison)."""
    def fn(x):
        torch._check(x.shape[0] * x.shape[1] < 200, lambda: "plane too big")
        return x * 2

    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise", capture=True)
    compiled = torch.compile(fn, backend=be, dynamic=True)
    torch.testing.assert_close(compiled(torch.ones(5, 7)), torch.full((5, 7), 2.0))
    if not any(n.target is torch.ops.aten._assert_scalar.default for n in be.reports[0].gm.graph.nodes):
        pytest.skip("no run-time assert in this torch's graph: the check is left to dynamo's guards")
    runner = be.reports[0].runner  # its arguments: the two sizes, then the tensor
    torch.testing.assert_close(runner(6, 7, torch.ones(6, 7))[0], torch.full((6, 7), 2.0))
    with pytest.raises(RuntimeError, match="plane too big"):
        runner(30, 9, torch.ones(30, 9))


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_a_check_of_a_value_read_from_a_tensor_does_not_crash(codegen):
    """`torch._check(n >= 2)` on `n = t.item()`: passline binds no such value at run time, so the assertion
    cannot be evaluated; it is dropped (unchecked, as before assertions were kept), not a crash."""
    def fn(x):
        n = (x > 0).sum().item()
        torch._check(n >= 2)
        return x * 3

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        out = torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(torch.ones(5))
    torch.testing.assert_close(out, torch.full((5,), 3.0))


def test_integer_division_checks_only_lanes_inside_the_masks():
    # masked lanes hold a load's 0: no division by zero there (7 x 13 leaves partial blocks)
    i = torch.randint(-50, 50, (7, 13))
    z = torch.randint(1, 9, (7, 13)) * torch.where(torch.rand(7, 13) > 0.5, 1, -1)
    fn = lambda i, z: ((i // z).sum(1), (i % z).amax(0), torch.fmod(i, z[:, :1]), i.t() // z.t())
    for variant in ["persistent", "looped"]:
        _triton(fn, [i, z], kernel_variant=variant)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_cumprod_backward_argmaxes_bools(codegen):
    """cumprod's backward finds each row's first zero with an argmax over bools, which torch.argmax
    (the reference backend's, the oracle's) refuses: the reference backend argmaxes them as uint8."""
    x = torch.randn(3, 5, 7)
    x[0, 1, 2] = x[2, 3, 0] = 0.0  # rows with a zero take the backward's other branch
    assert_matches_eager(lambda x: torch.cumprod(x, -1), [x.requires_grad_()], codegen=codegen)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
@pytest.mark.parametrize("fn", [lambda x: torch.argmax(x, 1), lambda x: torch.argmin(x), lambda x: x.argmax(0) + 1])
def test_argmax_of_bools_raises_as_eager(codegen, fn):
    """Eager refuses torch.argmax/argmin of a bool tensor while their meta kernels do not: the op runs as the
    extern call, which raises eager's error, instead of returning an index eager never would. (max.dim's
    indices of bools, which eager gives, are still generated: the check after the two raises.)"""
    x = torch.rand(4, 5) > 0.5
    with pytest.raises(RuntimeError, match="does not support bool input"):
        fn(x)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="does not support bool input"):
        torch.compile(fn, backend=passline.backend(codegen=codegen))(x)
    be = assert_matches_eager(lambda x: torch.max(x, 1), [x], codegen=codegen, fallback="raise")
    assert "argmax" in be.reports[0].graph.format()


def test_python_scalars_and_bfloat16():
    x = torch.randn(8, 8, dtype=torch.bfloat16, requires_grad=True)
    _triton(lambda x: (torch.pow(x, 2.0) * 0.5 + 3, torch.logical_or(x, x > 1), torch.logical_not(x),
                       torch.clamp(x, min=-0.5)), [x])


def test_nan_and_inf_through_pow_logical_and_0dim():
    x = torch.tensor([0.0, -1.0, 2.0, float("nan"), float("inf"), float("-inf")])
    e = torch.tensor(float("nan"))
    fn = lambda x, e: (torch.pow(x, 2.0), torch.pow(x, e), torch.logical_or(x, e), torch.logical_and(x, x),
                       torch.nan_to_num(x), torch.isinf(x) | torch.isnan(e))
    _triton(fn, [x, e])


def test_extern_result_dtype_follows_the_ir():
    # the CPU kernel returns bfloat16 statistics where the meta function (and so the IR) says float32: a
    # kernel loading them must read float32 (the interpreter raised "Cannot bitcast ... size 16 to 32")
    fn = lambda x, w, b, m, v: torch.ops.aten._batch_norm_with_update(x, w, b, m, v, 0.5, 1e-5)[:3]
    x = torch.randn(5, 4, 3, dtype=torch.bfloat16)
    w, b = torch.rand(4, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16)
    m, v = torch.zeros(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)
    torch._dynamo.reset()
    be = passline.backend(codegen="triton", fallback="raise")
    ours = torch.compile(fn, backend=be)(x, w, b, m.clone(), v.clone())
    for a, e in zip(ours, fn(x, w, b, m.clone(), v.clone())):
        torch.testing.assert_close(a.float(), e.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_checkpointed_dropout_replays_its_mask(codegen):
    """torch.utils.checkpoint around a dropout: aot_autograd wraps the dropout in run_and_save_rng_state
    (forward) and run_with_rng_state (backward's recomputation), higher-order operators passline refused
    ("not an aten op"). Now externs: the same masks as eager from the same seed, forward and backward."""
    import copy

    from torch.utils.checkpoint import checkpoint

    torch._dynamo.reset()
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(12, 13), torch.nn.GELU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(13, 12))
    compiled_block = copy.deepcopy(block)
    be = passline.backend(fallback="raise", codegen=codegen, check=True)
    compiled = torch.compile(lambda x: checkpoint(compiled_block, x, use_reentrant=False).sin(), backend=be)
    for seed in (1, 2):
        x = torch.randn(3, 5, 12)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch.manual_seed(seed)
        want = checkpoint(block, xa, use_reentrant=False).sin()
        want.backward(torch.ones_like(want))
        torch.manual_seed(seed)
        got = compiled(xb)
        got.backward(torch.ones_like(got))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(xb.grad, xa.grad)
        for p, q in zip(compiled_block.parameters(), block.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert len(be.reports) == 2 and all(r.check.ok for r in be.reports)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_data_dependent_sizes_are_refused_when_compiled(codegen):
    """With dynamo capturing nonzero and item (capture_dynamic_output_shape_ops, capture_scalar_outputs),
    a result's size or value is an unbacked symbol u0 that no graph input carries: the runners, which bind
    sizes from the inputs, failed at run time (TypeError: Cannot convert symbols to int). Refused at compile
    time instead: fallback="raise" says why, the default fallback runs the graph eagerly, as eager."""
    def fn(x, w):
        idx = (x.sum(-1) > 0).nonzero().squeeze(-1)
        n = (x > 0).sum().item()
        return torch.zeros_like(x).index_add(0, idx, x[idx] * w) * n

    x = torch.randn(7, 4)
    x[0] = 1.0
    w = torch.randn(4, requires_grad=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="known only at run time"):
            torch.compile(fn, backend=passline.backend(fallback="raise", codegen=codegen))(x, w)
        torch._dynamo.reset()
        be = passline.backend(fallback="eager", codegen=codegen)
        with pytest.warns(UserWarning, match="known only at run time"):
            got = torch.compile(fn, backend=be)(x, w)
        torch.testing.assert_close(got, fn(x, w))
        assert be.failures
    torch._dynamo.reset()


ITEM_USES = {
    "a size": lambda x: torch.zeros(x.abs().sum().long().item()).sum(),
    "a slice's end": lambda x: x[:, : x.abs().sum().long().item() % 5].sum(),
    "an arange's end": lambda x: torch.arange(x.abs().sum().long().item()).float().mean(),
    "a clamp's bound": lambda x: x.clamp(max=(x > 0).sum().item() * 0.25),
    "a comparison's operand": lambda x: torch.where(x > (x > 0).sum().item() - 1.5, x, 0.0),
    "an exponent": lambda x: x.abs() ** ((x > 0).sum().item() % 3 + 1),
    "a roll's shift": lambda x: x.roll((x > 0).sum().item(), 1),
}


@pytest.mark.parametrize("use", sorted(ITEM_USES))
def test_a_captured_item_used_as_a_size_or_a_scalar_is_refused_when_compiled(use):
    """With capture_scalar_outputs an `.item()` (an unbacked symbol no input binds) used as a size or as an op's
    scalar argument compiled, then failed at the first call inside the runner ("Cannot convert symbols to int"),
    past the fallback (the sixty-first session's campaign): refused when compiled, the default fallback runs the
    graph eagerly, as eager."""
    fn = ITEM_USES[use]
    x = torch.randn(4, 5)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="known only at run time"):
            torch.compile(fn, backend=passline.backend(fallback="raise"))(x)
        torch._dynamo.reset()
        with pytest.warns(UserWarning, match="known only at run time"):
            got = torch.compile(fn, backend=passline.backend())(x)
        torch.testing.assert_close(got, fn(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_a_captured_item_returned_or_compared_is_refused_when_compiled(codegen):
    """`if x.max().item() > 0.5:` with capture_scalar_outputs: the graph returns `item > 0.5` (and an int item
    returned as it is) for dynamo to branch on, a value no runner binds; the call failed evaluating it
    ("float() argument must be ... not 'StrictGreaterThan'"), past the fallback. Refused when compiled."""
    def branch(x):
        h = torch.tanh(x)
        if h.abs().max().item() > 0.5:
            h = h * 0.5
        return h * 2

    def count(x):
        return x.argmax().item(), x * 2

    x = torch.randn(4, 6)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for fn in (branch, count):
            torch._dynamo.reset()
            with pytest.raises(Exception, match="known only at run time"):
                torch.compile(fn, backend=passline.backend(fallback="raise", codegen=codegen))(x)
            torch._dynamo.reset()
            be = passline.backend(codegen=codegen)
            with pytest.warns(UserWarning, match="known only at run time"):
                got = torch.compile(fn, backend=be)(x)
            want = fn(x)
            if fn is count:
                assert got[0] == want[0]
                got, want = got[1], want[1]
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()


def test_a_refusal_at_the_first_call_falls_back_like_one_at_compile_time(monkeypatch):
    """With the default fallback, a graph passline compiled but cannot run (a NotImplementedError at its
    first call: once, sizes computed through floats) runs its aten code instead, with a warning and a
    record in `failures`, forward and backward; a graph that writes its inputs is not re-run (it may have
    written some before failing), so there the error stays."""
    from passline.backends.reference import ReferenceRunner

    def refuse(self, *args):
        raise NotImplementedError("index expression the runner cannot evaluate")

    monkeypatch.setattr(ReferenceRunner, "__call__", refuse)
    torch._dynamo.reset()
    be = passline.backend(codegen="reference")
    fn = lambda x: (x * 2).sin().sum(-1)  # noqa: E731
    compiled = torch.compile(fn, backend=be)
    x = torch.randn(4, 5, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    with pytest.warns(UserWarning, match="runs it eagerly from now on"):
        out = compiled(x)
        out.sum().backward()
    fn(xe).sum().backward()
    torch.testing.assert_close(out, fn(xe))
    torch.testing.assert_close(x.grad, xe.grad)
    assert [kind for kind, _ in be.failures] == ["forward", "backward"]
    torch.testing.assert_close(compiled(x), fn(x))  # later calls: eagerly, no new failure
    assert len(be.failures) == 2

    torch._dynamo.reset()
    be = passline.backend(codegen="reference")
    mutating = torch.compile(lambda y: y.add_(1).sum(), backend=be)
    with pytest.raises(NotImplementedError, match="cannot evaluate"):
        mutating(torch.randn(3))


@pytest.mark.parametrize("order", [("plain", "retain"), ("retain", "plain", "retain")])
def test_a_backward_that_retains_its_graph_after_one_that_did_not(order):
    """aot_autograd refuses `backward(retain_graph=True)` once a backward with donated buffers ran without it;
    passline donates none (it writes over a saved tensor only where nothing else holds it), so training steps
    may retain their graphs or not, in any order, and match eager (a step, then one that retains, raised)."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=passline.backend(codegen="triton", fallback="raise"))
    x = torch.randn(8, 16)
    for step in order:
        grads = []
        for fn, mod in ((compiled, model), (twin, twin)):
            xi = x.clone().requires_grad_()
            loss = fn(xi).square().sum()
            if step == "retain":
                loss.backward(retain_graph=True)
            loss.backward()
            grads.append([p.grad for p in mod.parameters()] + [xi.grad])
            mod.zero_grad(set_to_none=True)
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
