"""Property tests: random programs x random pipelines match eager, forward and a training step
(loss.backward(), every input's .grad), values and strides, on inputs of every layout; every pass keeps
verify() and the graph's results; idempotent passes are idempotent. `make fuzz` runs them long and
randomized; PASSLINE_FUZZ_LAYOUTS=contiguous,transposed restricts the input layouts drawn."""
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import passline
from passline.backends.reference import ReferenceRunner
from passline.testing import LAYOUTS, assert_matches_eager, assert_same_strides, pipelines, programs, tolerance

FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
FAILURES = pathlib.Path(os.environ.get("PASSLINE_FUZZ_DIR", "fuzz_failures"))
# to tell a layout bug from the rest: PASSLINE_FUZZ_LAYOUTS=contiguous runs the properties on
# contiguous inputs only
LAYOUTS_DRAWN = tuple(os.environ.get("PASSLINE_FUZZ_LAYOUTS", ",".join(LAYOUTS)).split(","))


def save_reproducer(program, pipeline, error) -> None:
    """Keep a failing example: its program, pipeline and inputs, re-runnable with torch.load."""
    FAILURES.mkdir(exist_ok=True)
    n = len(list(FAILURES.glob("*.pt")))
    torch.save({"program": repr(program), "steps": program.steps, "inputs": program.inputs,
                "outputs": program.outputs, "pipeline": str(pipeline), "error": repr(error)[:2000]},
               FAILURES / f"failure{n}.pt")


def check(program, pipeline, codegen, dynamic=None):
    try:
        assert_matches_eager(program, list(program.inputs), pipeline=pipeline, codegen=codegen, dynamic=dynamic)
    except Exception as e:
        if FUZZ:
            save_reproducer(program, pipeline, e)
        raise


# floating-point inputs are requires_grad leaves: assert_matches_eager checks a training step too
@settings(max_examples=10_000 if FUZZ else 160)
@given(programs(layouts=LAYOUTS_DRAWN, requires_grad=True), pipelines())
def test_random_programs_and_pipelines_match_eager_reference(program, pipeline):
    check(program, pipeline, "reference")


@settings(max_examples=10_000 if FUZZ else 35)
@given(programs(layouts=LAYOUTS_DRAWN, requires_grad=True), pipelines())
def test_random_programs_and_pipelines_match_eager_triton(program, pipeline):
    check(program, pipeline, "triton")


# the same with symbolic sizes (dynamic=True): a slice's int held in the program became a size symbol, and the
# backward's slice_scatter with a symbolic step failed lowering (found by the first 30 examples of a campaign)
@settings(max_examples=10_000 if FUZZ else 40)
@given(programs(layouts=LAYOUTS_DRAWN, requires_grad=True), pipelines())
def test_random_programs_and_pipelines_match_eager_with_dynamic_shapes(program, pipeline):
    check(program, pipeline, "reference", dynamic=True)


@settings(max_examples=10_000 if FUZZ else 10)
@given(programs(layouts=LAYOUTS_DRAWN, requires_grad=True), pipelines())
def test_random_programs_and_pipelines_match_eager_with_dynamic_shapes_triton(program, pipeline):
    check(program, pipeline, "triton", dynamic=True)


def lowered(program):
    from torch.fx.experimental.proxy_tensor import make_fx

    from passline.lowering import decomposition_table, lower_graph
    from passline.pipeline import SchedulerGraph

    gm = make_fx(program, decomposition_table=decomposition_table())(*program.inputs)
    return SchedulerGraph.from_program(lower_graph(gm))


# scheduler-stage passes: the FX-stage ones rewrite dynamo's graphs (tests/test_linear_cross_entropy.py)
BUILTIN = sorted(n for n, info in passline.passes().items() if not n.startswith("t_") and info.stage == "scheduler")


@settings(max_examples=10_000 if FUZZ else 100)
@given(programs(layouts=LAYOUTS_DRAWN), pipelines())
def test_random_pipelines_on_lowered_programs_match_eager(program, pipeline):
    """The same property without dynamo: lower once with make_fx, run the pipeline, compare the
    reference backend's results with eager PyTorch's (fast enough for long campaigns)."""
    try:
        graph = lowered(program)
        out, _ = passline.PassManager(pipeline).run(graph)
        got = ReferenceRunner(out)(*program.inputs)
        for k, (a, b) in enumerate(zip(got, program(*program.inputs))):
            torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)
            assert_same_strides(a, b, f"output {k}")  # lowering gives outputs eager's strides
    except Exception as e:
        if FUZZ:
            save_reproducer(program, pipeline, e)
        raise


@pytest.mark.parametrize("name", BUILTIN)
@settings(max_examples=2000 if FUZZ else 25)
@given(program=programs(), data=st.data())
def test_every_pass_keeps_verify_and_results(name, program, data):
    graph = lowered(program)
    expected = ReferenceRunner(graph.copy())(*program.inputs)
    options = data.draw(pipelines(names=[name], max_len=1))
    out, _ = passline.PassManager(options if len(options) else name).run(graph)  # verifies after the pass
    got = ReferenceRunner(out)(*program.inputs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)


@pytest.mark.parametrize("name", [n for n in BUILTIN if passline.passes()[n].idempotent])
@settings(max_examples=1000 if FUZZ else 20)
@given(program=programs())
def test_idempotent_passes_are_idempotent(name, program):
    graph, _ = passline.PassManager(name).run(lowered(program))
    _, (again,) = passline.PassManager(name).run(graph)
    assert not again.changed


# The strategies and the checks themselves: inputs have the layout their spec names, programs print as
# code that rebuilds them, the training check never fires on a backend known to be right and does
# fire on one that stores outputs row-major.

@settings(max_examples=10_000 if FUZZ else 200)
@given(programs(requires_grad=True))
def test_inputs_have_their_layout_and_programs_print_as_code(program):
    from passline.testing import Input, TensorProgram  # noqa: F401  (names the repr uses)

    for spec, x in zip(program.specs, program.inputs):
        shape, stride = x.shape, x.stride()
        assert tuple(shape) == spec.shape and x.is_leaf
        assert x.requires_grad == (x.is_floating_point() and spec.layout != "expanded")
        big = [d for d, n in enumerate(shape) if n > 1]
        if spec.layout == "sliced":
            assert x.storage_offset() > 0
            assert not x.is_contiguous() or len(big) == 0
        elif spec.layout == "expanded":
            assert all(stride[d] == 0 for d in spec.dims)
        elif spec.layout in ("transposed", "permuted") and len(big) >= 2:
            order = spec.order or tuple(reversed(range(len(shape))))
            inner = [d for d in reversed(order) if shape[d] > 1]  # innermost first
            assert [stride[d] for d in inner] == sorted(stride[d] for d in inner) and not x.is_contiguous()
        elif spec.layout == "channels_last":
            assert x.is_contiguous(memory_format=torch.channels_last)
        elif spec.layout == "channels_last_3d":
            assert x.is_contiguous(memory_format=torch.channels_last_3d)
        else:
            assert x.is_contiguous()
    again = eval(repr(program))
    assert again.steps == program.steps and again.outputs == program.outputs
    for a, b in zip(again.inputs, program.inputs):
        assert (a.stride(), a.storage_offset(), a.requires_grad) == (b.stride(), b.storage_offset(), b.requires_grad)
        assert torch.equal(a, b)


def test_every_layout_is_drawn():
    seen = set()

    @settings(max_examples=300)
    @given(programs())
    def collect(program):
        seen.update(spec.layout for spec in program.specs)

    collect()
    assert seen == set(LAYOUTS)


@settings(max_examples=2000 if FUZZ else 30)
@given(programs(requires_grad=True))
def test_training_check_passes_on_a_correct_backend(program):
    """aot_eager (AOTAutograd, eager kernels) is right by construction: any failure here is the
    check's or the strategy's (say, a layout whose eager strides AOTAutograd cannot reproduce)."""
    import unittest.mock

    with unittest.mock.patch.object(passline, "backend", lambda **kw: "aot_eager"):
        assert_matches_eager(program, list(program.inputs))


def test_training_check_catches_row_major_outputs():
    """A backend whose forward stores every output row-major (the bug layouts invite) fails the check
    on a transposed input, and passes it on a contiguous one."""
    import unittest.mock

    from torch._dynamo.backends.common import aot_autograd

    def row_major(gm, example_inputs):
        def run(args):
            return [o.contiguous() if isinstance(o, torch.Tensor) else o for o in gm(*args)]
        run._boxed_call = True
        return run

    def fn(x):
        return (x * x).exp()

    with unittest.mock.patch.object(passline, "backend", lambda **kw: aot_autograd(fw_compiler=row_major)):
        assert_matches_eager(fn, [torch.randn(7, 3, requires_grad=True)])
        with pytest.raises(AssertionError, match=r"output 0: strides \(3, 1\), eager has \(1, 7\)"):
            assert_matches_eager(fn, [torch.randn(3, 7).t().requires_grad_()])


def test_training_check_catches_a_wrong_backward():
    """A backend whose backward doubles every gradient passes the forward checks and fails on .grad."""
    import unittest.mock

    from torch._dynamo.backends.common import aot_autograd

    def doubled(gm, example_inputs):
        def run(args):
            return [2 * o if isinstance(o, torch.Tensor) else o for o in gm(*args)]
        run._boxed_call = True
        return run

    def forward(gm, example_inputs):
        return gm.forward

    def fn(x):
        return (x * x).exp()

    backend = aot_autograd(fw_compiler=forward, bw_compiler=doubled)
    with unittest.mock.patch.object(passline, "backend", lambda **kw: backend):
        assert_matches_eager(fn, [torch.randn(7, 3)])  # no input requires grad: forward only
        with pytest.raises(AssertionError, match="grad of input 0"):
            assert_matches_eager(fn, [torch.randn(3, 7).t().requires_grad_()])


def test_the_check_catches_a_small_error_in_every_small_value():
    """A backend 1% off everywhere, on a float16 softmax over 777 columns (values ~1e-3, under float16's atol of
    2e-3): the element-wise check let it through; the whole tensor's error fails it, in the forward's output and
    in the backward's gradient. A sum of x - x.mean() (zero but for rounding in both) and its gradient (zero in
    exact arithmetic) still pass, judged against float64."""
    import unittest.mock

    from torch._dynamo.backends.common import aot_autograd

    def off(gm, example_inputs):
        def run(args):
            return [1.01 * o if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in gm(*args)]
        run._boxed_call = True
        return run

    def forward(gm, example_inputs):
        return gm.forward

    def softmax(x):
        return torch.softmax(x.float(), -1).half()

    torch.manual_seed(0)
    x = torch.randn(5, 777).half()
    with unittest.mock.patch.object(passline, "backend", lambda **kw: aot_autograd(fw_compiler=off)):
        with pytest.raises(AssertionError, match="output 0: relative error over the whole tensor"):
            assert_matches_eager(softmax, [x])
    backend = aot_autograd(fw_compiler=forward, bw_compiler=off)
    with unittest.mock.patch.object(passline, "backend", lambda **kw: backend):
        with pytest.raises(AssertionError, match="grad of input 0: relative error over the whole tensor"):
            assert_matches_eager(softmax, [x.clone().requires_grad_()])
    y = (torch.randn(64, 300) * 3).requires_grad_()
    assert_matches_eager(lambda y: (y - y.mean(-1, keepdim=True)).sum(-1), [y], codegen="reference")


def test_training_check_compares_a_modules_parameter_gradients():
    """An nn.Module's parameters are trained in two copies, eager's and the compiled one's, and their .grad
    compared: a backward that doubles every gradient fails on the weight's even where no input requires grad
    (one shared module accumulated both runs' .grad, and nothing compared them). The caller's module is left
    as it was."""
    import unittest.mock

    from torch._dynamo.backends.common import aot_autograd

    def doubled(gm, example_inputs):
        def run(args):
            return [2 * o if isinstance(o, torch.Tensor) else o for o in gm(*args)]
        run._boxed_call = True
        return run

    backend = aot_autograd(fw_compiler=lambda gm, example_inputs: gm.forward, bw_compiler=doubled)
    model = torch.nn.Linear(5, 3)
    with unittest.mock.patch.object(passline, "backend", lambda **kw: backend):
        with pytest.raises(AssertionError, match="grad of parameter weight"):
            assert_matches_eager(model, [torch.randn(4, 5)], backward=True)
    with unittest.mock.patch.object(passline, "backend", lambda **kw: "aot_eager"):
        assert_matches_eager(torch.nn.BatchNorm1d(5), [torch.randn(8, 5, requires_grad=True)])  # and buffers
    assert model.weight.grad is None


def test_float32_parameter_gradients_are_judged_against_float64_too():
    """A float32 LayerNorm applied twice over 2048 rows: eager's bias gradient is 1.3e-4 from the float64
    step, past float32's tolerance, and passline's (mix-order column sums) 2.3e-5; the check passes it by the
    float64 judge. A dropped term in a float32 gradient still fails."""
    import copy

    from passline.testing import _assert_module_matches, _Float64Step, loss_weights, train_step

    class Shared(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln, self.b = torch.nn.LayerNorm(d), torch.nn.Parameter(torch.randn(d))

        def forward(self, x):
            gelu = torch.nn.functional.gelu
            return gelu(self.ln(x) + self.b) + self.ln(x * 2) + gelu(x + self.b)

    torch.manual_seed(11)
    assert_matches_eager(Shared(128), [torch.randn(2048, 128).requires_grad_()], kernel_variant="mix_order")

    lin = torch.nn.Linear(16, 4, bias=False)
    x = torch.randn(64, 16)
    ours, start = copy.deepcopy(lin), copy.deepcopy(lin)
    w = loss_weights(train_step(lin, [x])[0])
    train_step(ours, [x], w)
    with torch.no_grad():
        ours.weight.grad[:, 1:] *= 1.01  # off by 1%, past the tolerance and far past eager's rounding
    with pytest.raises(AssertionError, match="farther from the float64 step"):
        _assert_module_matches(ours, lin, True, True, _Float64Step(start, [x], w))


def test_low_precision_parameter_gradients_are_judged_against_float64():
    """A bfloat16 or float16 parameter's .grad outside the tolerance passes only where, element by element, it
    is about as close to the same step in float64 as eager's: a gradient with dropped terms fails though
    eager's largest rounding error is large elsewhere, and one that eager overflows (inf) must be inf too."""
    import copy

    from passline.testing import _assert_module_matches, _Float64Step, loss_weights, train_step

    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 4, bias=False).bfloat16()
    x = torch.randn(64, 16, dtype=torch.bfloat16)
    x[:, 0] *= 1000  # one large input feature: its column of dW is ~1000x the others, and so is eager's error
    ours, start = copy.deepcopy(lin), copy.deepcopy(lin)  # before a step
    w = loss_weights(train_step(lin, [x])[0])
    train_step(ours, [x], w)
    _assert_module_matches(ours, lin, True, True, _Float64Step(start, [x], w))  # the same computation: passes
    with torch.no_grad():
        ours.weight.grad[:, 1:] = 0  # a dropped term
    with pytest.raises(AssertionError, match="farther from the float64 step"):
        _assert_module_matches(ours, lin, True, True, _Float64Step(start, [x], w))

    lin = torch.nn.Linear(4, 2, bias=False).half()
    x = torch.ones(64, 4, dtype=torch.float16)
    x[:, 0] = 3000.0  # eager's float16 dW overflows in that column
    ours, start, w = copy.deepcopy(lin), copy.deepcopy(lin), [torch.ones(64, 2)]
    train_step(lin, [x], w)
    train_step(ours, [x], w)
    with torch.no_grad():
        ours.weight.grad.zero_()
    with pytest.raises(AssertionError, match="farther from the float64 step"):
        _assert_module_matches(ours, lin, True, True, _Float64Step(start, [x], w))


def test_input_gradients_are_judged_against_float64_too():
    """An input's .grad outside the tolerance passes where it is about as close to the float64 step as eager's
    (a long-K matmul's dX sums over K), and fails where a term is dropped; a function that cannot run in float64
    has no oracle, and the tolerance alone decides."""
    from passline.testing import _assert_grad_close, _Float64Step, loss_weights, tolerance, train_step

    torch.manual_seed(0)
    w = torch.randn(4096, 8, dtype=torch.bfloat16)
    x = torch.randn(16, 4096, dtype=torch.bfloat16, requires_grad=True)
    fn = lambda x: (x @ w).t() @ (x @ w)  # noqa: E731 - dX sums over 4096 and then 8 products in bfloat16
    eager_x = x.detach().clone().requires_grad_()
    weights = loss_weights(train_step(fn, [eager_x])[0])
    oracle = _Float64Step(lambda x: (x @ w.double()).t() @ (x @ w.double()), [x], weights)
    exact = oracle.input_grad(0)
    assert exact.dtype == torch.float64
    # passline's stand-in: the float64 gradient rounded once, closer to it than eager's bfloat16 sums
    ours = exact.bfloat16()
    with pytest.raises(AssertionError):  # outside bfloat16's tolerance of eager's (7.6% of elements, by 16)
        torch.testing.assert_close(ours, eager_x.grad, **tolerance(torch.bfloat16))
    _assert_grad_close(ours, eager_x.grad, "grad of input 0", lambda: exact)
    dropped = ours.clone()
    dropped[:, ::2] = 0
    with pytest.raises(AssertionError, match="farther from the float64 step"):
        _assert_grad_close(dropped, eager_x.grad, "grad of input 0", lambda: exact)
    with pytest.raises(AssertionError, match="grad of input 0"):  # no oracle: the tolerance decides
        _assert_grad_close(dropped, eager_x.grad, "grad of input 0", lambda: None)
    bad = _Float64Step(lambda x: x.view(torch.int16).float(), [x], weights)  # bfloat16-only: no float64 step
    assert bad.input_grad(0) is None


# [B, T, C] work whose (B, T) loops merge_loops cannot merge (pads and cats along T, position adds, row broadcasts,
# masks of T, a select) read by reductions over C or over B*T: fuse merges it into the reductions' nests by
# division (`merged_to_reduction`), which programs() rarely draws (about 1 example in 100). float32: in bfloat16
# two LayerNorms in a row give gradients ~1.5 ulp from the float64 step where eager's fused kernels stay within
# 0.5, as torch's own decompositions do run eagerly (backend="aot_eager_decomp_partition": the same values)
_TOKEN_OPS = {
    "pad": lambda x, pos, row, w, k: F.pad(x, (0, 0, 1, 1), value=0.5)[:, 1:-1],
    "cat": lambda x, pos, row, w, k: torch.cat([row[:, None, :], x[:, 1:]], 1),
    "pos": lambda x, pos, row, w, k: x + pos[:, :x.shape[1]],
    "row": lambda x, pos, row, w, k: x * row[:, None, :],
    "mask": lambda x, pos, row, w, k: torch.where((torch.arange(x.shape[1]) % 3 == k % 3)[None, :, None], x, -x),
    "silu": lambda x, pos, row, w, k: F.silu(x),
    "norm": lambda x, pos, row, w, k: F.layer_norm(x, x.shape[-1:], w, None),
}
_TOKEN_LOSSES = {
    "select": lambda x, k: x[:, k % x.shape[1]].float().square().sum(),
    "rows": lambda x, k: x.float().sum(-1).square().sum(),
    "flat_softmax": lambda x, k: x.flatten(0, 1).float().softmax(-1).mul(x.flatten(0, 1).float()).sum(),
    "columns": lambda x, k: x.float().sum((0, 1)).square().sum(),
}


@settings(max_examples=10_000 if FUZZ else 25)
@given(st.integers(1, 4), st.integers(2, 9), st.sampled_from([3, 8, 33]), st.just(torch.float32),
       st.lists(st.sampled_from(sorted(_TOKEN_OPS)), min_size=1, max_size=5),
       st.lists(st.sampled_from(sorted(_TOKEN_LOSSES)), min_size=1, max_size=2), st.integers(0, 8))
def test_token_programs_merged_into_reductions_match_eager(batch, tokens, width, dtype, ops, losses, k):
    def fn(x, pos, row, w):
        for op in ops:
            x = _TOKEN_OPS[op](x, pos, row, w, k)
        return sum(_TOKEN_LOSSES[name](x, k) for name in losses)

    g = torch.Generator().manual_seed(k)
    inputs = [torch.randn(*shape, generator=g).to(dtype).requires_grad_()
              for shape in ((batch, tokens, width), (1, 9, width), (batch, width))]
    inputs.append((torch.randn(width, generator=g) + 1).to(dtype).requires_grad_())
    assert_matches_eager(fn, inputs, codegen="reference")


def test_the_strategies_are_public_and_imported_at_their_first_use():
    """`passline.testing`'s strategies (programs, pipelines, LAYOUTS, ...) are there for a user's `from ... import`,
    while `import passline` (a training script's) does not import hypothesis: compile-time code imports
    passline.testing for its tolerances, and hypothesis cost every process's first call ~0.06 s."""
    import subprocess
    import sys

    code = ("import sys, passline; assert 'hypothesis' not in sys.modules\n"
            "from passline.testing import Input, TensorProgram, programs; assert 'hypothesis' in sys.modules\n"
            "import passline.testing as t; assert {'LAYOUTS', 'pipelines'} <= set(dir(t))\n"
            "try:\n    t.nothing\nexcept AttributeError as e:\n    assert 'nothing' in str(e)\nprint('ok')")
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(passline.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
