"""Mutations of graph inputs (BatchNorm's running statistics, `buf.add_(1)`): aot_autograd keeps their
`copy_` in the graph and passline stores the new values from the kernel computing them (an in-place
Pointwise, lowering/mutation.py), checked against eager step by step."""
import copy
import os

import pytest
import torch
from torch import nn

import passline
from passline.ir import Extern, members
from passline.pipeline.graph import VerificationError

CODEGENS = ["reference", "triton"]
STATS = ("running_mean", "running_var", "num_batches_tracked")


@pytest.fixture(autouse=True)
def _on_the_test_device():
    """Modules and tensors made here live on $PASSLINE_TEST_DEVICE when it is set (a GPU run)."""
    device = passline.settings.test_device
    if not device:
        yield
        return
    with torch.device(device):
        yield


def _in_place(report) -> list:
    """(in-place member, the scheduler node running it) for every write into a graph input."""
    return [(m, n) for n in report.graph.nodes() for m in members(n) if getattr(m, "in_place", False)]


def _copy_externs(report) -> list:
    return [n for n in report.graph.nodes() if isinstance(n, Extern) and "copy_" in str(n.op)]


def _batchnorm(kind: str):
    """(module, input maker) for BatchNorm2d channels_last / contiguous and BatchNorm1d."""
    if kind == "1d":
        return nn.BatchNorm1d(6), lambda: torch.randn(4, 6)
    module = nn.BatchNorm2d(3)
    fmt = torch.channels_last if kind == "2d_channels_last" else torch.contiguous_format
    return module.to(memory_format=fmt), lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=fmt)


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("kind", ["2d_channels_last", "2d", "1d"])
def test_batchnorm_training_updates_running_stats_like_eager(kind, codegen):
    torch.manual_seed(0)
    module, make = _batchnorm(kind)
    eager = copy.deepcopy(module)
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(module, backend=be)
    for step in range(1, 4):
        x = make().requires_grad_()
        x_e = x.detach().clone().requires_grad_()
        y, y_e = compiled(x), eager(x_e)
        torch.testing.assert_close(y, y_e)
        assert y.stride() == y_e.stride()
        (y * y).sum().backward()
        (y_e * y_e).sum().backward()
        torch.testing.assert_close(x.grad, x_e.grad)
        torch.testing.assert_close(module.weight.grad, eager.weight.grad)
        torch.testing.assert_close(module.bias.grad, eager.bias.grad)
        for name in STATS:  # written by the compiled forward itself, step after step
            torch.testing.assert_close(getattr(module, name), getattr(eager, name), msg=f"{name}, step {step}")
        assert int(module.num_batches_tracked) == step
    forward = be.reports[0]
    assert forward.name.startswith("forward")
    assert not _copy_externs(forward)
    written = {m.output.name for m, _ in _in_place(forward)}
    assert len(written) == 3  # running mean, running variance, batch count: each a graph input
    # each new value is stored by the kernel computing it: the statistics kernel (a reduction) writes the
    # running mean and variance, the batch count's increment writes the count; no kernel only copies
    for m, node in _in_place(forward):
        assert len(members(node)) > 1, f"{m.name} runs alone"
    stats_kernel = {node.name for m, node in _in_place(forward) if m.output.dtype == torch.float32}
    assert len(stats_kernel) == 1
    assert any(type(m).__name__ == "Reduction" for m in members(forward.graph.node(stats_kernel.pop())))
    # statistics (+ running stats), normalization, batch count (+ its store): no launch added for the writes
    assert forward.kernels == 3


@pytest.mark.parametrize("codegen", CODEGENS)
def test_batchnorm_eval_reads_running_stats_without_writing(codegen):
    torch.manual_seed(0)
    module, make = _batchnorm("2d_channels_last")
    module.running_mean.uniform_(-1, 1)
    module.running_var.uniform_(0.5, 2)
    module.eval()
    eager = copy.deepcopy(module)
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(module, backend=be)
    for _ in range(2):
        x = make()
        torch.testing.assert_close(compiled(x), eager(x))
    for name in STATS:
        torch.testing.assert_close(getattr(module, name), getattr(eager, name))
    assert all(not _in_place(r) and not _copy_externs(r) for r in be.reports)


def add_one(x, buf, w):
    buf.add_(1)
    return x * w + buf


def copy_broadcast_cast(x, buf):
    buf.copy_(x.sin())  # float32 [5] into float64 [4, 5]: broadcast and cast, as copy_ does
    return x.cos()


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("fn, shapes, grads, kernels", [
    (add_one, [((4, 5), torch.float32)] * 3, (), 1),
    (add_one, [((4, 5), torch.float32)] * 3, (0, 2), 1),  # a training graph: x and w need gradients
    (copy_broadcast_cast, [((5,), torch.float32), ((4, 5), torch.float64)], (), 2),
    # buf's new value needs a gradient (it is x.sin()): aot_autograd applies that mutation itself, after
    # the graph (only inputs that need no gradient keep their copy_ in the graph)
    (copy_broadcast_cast, [((5,), torch.float32), ((4, 5), torch.float64)], (0,), None),
], ids=["add_", "add_-grad", "copy_", "copy_-grad"])
def test_input_mutated_in_place_like_eager(fn, shapes, grads, kernels, codegen):
    torch.manual_seed(0)
    args = [torch.randn(s, dtype=dt) for s, dt in shapes]
    ref = [a.clone() for a in args]
    for k in grads:
        args[k].requires_grad_()
        ref[k].requires_grad_()
    be = passline.backend(codegen=codegen, fallback="raise")
    out, out_e = torch.compile(fn, backend=be)(*args), fn(*ref)
    torch.testing.assert_close(out, out_e)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.detach(), r.detach())  # the mutated input too
    if grads:
        out.sum().backward()
        out_e.sum().backward()
        for k in grads:
            torch.testing.assert_close(args[k].grad, ref[k].grad)
    first = be.reports[0]
    assert not _copy_externs(first)
    if kernels is None:
        assert not _in_place(first)
        return
    (write,) = _in_place(first)
    assert first.graph.input_buffers()[write[0].output.name] == write[0].output
    # the new value is stored where it is computed (add_: one kernel for the add, its store and x * w + buf)
    assert first.kernels == kernels


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("fn", [lambda x, y: (x.fill_(3), x * 2)[1], lambda x, y: (x.copy_(y * 0 + 5), x + 1)[1]],
                         ids=["fill", "copy_of_a_new_value"])
def test_an_input_overwritten_with_a_value_read_elsewhere_is_still_written(fn, codegen):
    # found by fuzzing: inline_pointwise recomputed the new value in its other reader, and then dropped the
    # node writing it into the input as unread — the caller's tensor kept its old values (the output was right)
    x, y = torch.zeros(4), torch.randn(4)
    want_x, want = x.clone(), fn(x.clone(), y)
    torch._dynamo.reset()
    got = torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(x, y)
    fn(want_x, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, want_x)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_overwrite_read_at_other_points_is_its_own_kernel(codegen):
    """x.copy_(x.t().contiguous()): the transposed read must finish before any of x is overwritten, so
    the write is not fused into the kernel reading x (each program would overwrite what another reads)."""
    def transpose_into(x, y):
        x.copy_(x.t().contiguous())
        return y * 2

    x, y = torch.randn(5, 5), torch.randn(3)
    x_e = x.clone()
    be = passline.backend(codegen=codegen, fallback="raise")
    torch.compile(transpose_into, backend=be)(x, y)
    transpose_into(x_e, y)
    torch.testing.assert_close(x, x_e)
    ((m, node),) = _in_place(be.reports[0])
    assert members(node) == (m,)
    # fuse tried the pair and said why not
    assert be.reports[0].metrics.fusion_failures["in place"] >= 1


def test_verify_rejects_an_in_place_write_into_a_non_input():
    from passline.ir import Buffer, Layout, Load, Pointwise
    from passline.ir.index import VarKind, loop_vars
    from passline.lowering import GraphInput

    (i0,) = loop_vars(VarKind.OUTER, 1)
    a = Buffer("a", Layout.contiguous((4,), torch.float32))
    b = Buffer("b", Layout.contiguous((4,), torch.float32))
    graph = passline.SchedulerGraph([GraphInput("a", a)])
    graph.add_node(Pointwise("w", (4,), Load("a", i0, torch.float32), b, in_place=True))
    with pytest.raises(VerificationError, match="not a graph input"):
        graph.verify()
    # an in-place write that reads its target elsewhere than it writes races with itself
    graph = passline.SchedulerGraph([GraphInput("a", a)])
    graph.add_node(Pointwise("w", (4,), Load("a", 3 - i0, torch.float32), a, in_place=True))
    with pytest.raises(VerificationError, match="other points"):
        graph.verify()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_compiled_output_can_be_written_in_place(codegen):
    """What a graph break leaves to eager (`y[i[0]] = ...` after compiled scatters): the user writes into a
    tensor the compiled graph returned. The reference backend returned every output as an as_strided view
    of its buffer, which autograd refuses to write in place (a view made inside a custom Function)."""
    def fn(a, i):
        y = torch.zeros(5, 3)
        y.index_add_(0, i, a)
        return y, y * 2

    a = torch.randn(4, 3, requires_grad=True)
    i = torch.tensor([0, 2, 2, 4])
    torch._dynamo.reset()
    y, z = torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(a, i)
    y[1] = z[2] * 3
    (y * torch.arange(15.0).view(5, 3)).sum().backward()
    ae = a.detach().clone().requires_grad_()
    ye, ze = fn(ae, i)
    ye[1] = ze[2] * 3
    (ye * torch.arange(15.0).view(5, 3)).sum().backward()
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(a.grad, ae.grad)


def _centered_then_doubled(x):
    y = x - x.mean(-1, keepdim=True)  # the row's second pass reads x after the mean's loop
    x.mul_(2)
    return y


def _weighted_then_overwritten(x, b, z):
    s = (x * b[:, None]).sum(-1)  # each step of the row's loop reads b[row]
    b.copy_(z)
    return s


@pytest.mark.parametrize("fn, shapes", [(_centered_then_doubled, [(3, 70000)]),
                                        (_weighted_then_overwritten, [(3, 70000), (3,), (3,)])],
                         ids=["whole-elements", "per-row"])
def test_an_in_place_write_comes_after_every_loop_that_reads_the_old_value(fn, shapes):
    # rows too wide to hold (a looped kernel, a loop per reduction phase): the write into the input went in
    # its own phase, before a later loop's reads of the old value (the centered rows came out of the doubled
    # x; the weighted sum used z), both off by hundreds; it now goes last
    torch.manual_seed(0)
    inputs = [torch.randn(s) for s in shapes]
    want_inputs = [t.clone() for t in inputs]
    want = fn(*want_inputs)
    be = passline.backend(codegen="triton", fallback="raise")
    torch._dynamo.reset()
    got = torch.compile(fn, backend=be)(*inputs)
    if not passline.settings.test_device and not os.environ.get("PASSLINE_TEST_TARGET"):  # (a GPU may split
        # these few rows instead)
        assert [k.chosen for r in be.reports for k in r.kernel_info] == ["looped"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # sums of 70000 in another order
    for g, w in zip(inputs, want_inputs):
        torch.testing.assert_close(g, w)


def test_verify_names_a_pass_that_drops_an_input_write():
    # the write inline_pointwise once dropped (x.fill_ above) is now an invariant: every input the program
    # writes as lowered is still written after each pass
    @passline.register_pass("t_drop_input_write")
    def drop(graph, ctx):
        for node in list(graph.nodes()):
            if node.mutates:
                graph.remove_node(node.name)
        return graph

    try:
        be = passline.backend(codegen="reference", fallback="raise", pipeline="t_drop_input_write")
        torch._dynamo.reset()
        wrapped = "VerificationError: after pass 't_drop_input_write': input arg0_1 is no longer written in place"
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=wrapped):
            torch.compile(lambda x: (x.add_(1), x * 2)[1], backend=be)(torch.zeros(4))
    finally:
        passline.unregister_pass("t_drop_input_write")
