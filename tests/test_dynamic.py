"""Dynamic shapes on real models: size arithmetic (SymInt/SymFloat/SymBool nodes) lowered to sympy, one
passline compile per graph across sizes, training (`loss.backward()`) matching eager at every size."""
import copy
import math
import os

import pytest
import torch
from hypothesis import given, settings
from test_layouts import ConvBlock
from test_real_models import RMSNorm, SwiGLUBlock, TransformerBlock

import passline
from passline.testing import programs, tolerance

CODEGENS = ["reference", "triton"]
DEVICE = os.environ.get("PASSLINE_TEST_DEVICE") or "cpu"


class LlamaBlock(torch.nn.Module):
    """RMSNorm, rotary embeddings sliced to the sequence length, SDPA, SwiGLU."""

    def __init__(self, d=32, heads=2, max_len=64):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.out = torch.nn.Linear(d, d, bias=False)
        self.mlp = SwiGLUBlock(d, 2 * d)
        inv = 1.0 / 10000 ** (torch.arange(0, d // heads, 2).float() / (d // heads))
        angles = torch.outer(torch.arange(max_len).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rope(self, x):  # x: (b, heads, t, hd)
        t = x.shape[-2]
        cos, sin = self.cos[:t], self.sin[:t]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        return self.mlp(self.norm2(x))


class ConvPool1d(torch.nn.Sequential):
    """adaptive_avg_pool1d saves an unsqueezed (b, c, 1, L) activation that arrives with stride 0 on its
    size-1 dim, where its layout says L: the length once bound from it was 0 (a segfault in the extern)."""

    def __init__(self):
        super().__init__(torch.nn.Conv1d(3, 5, 3, padding=1), torch.nn.BatchNorm1d(5), torch.nn.GELU(),
                         torch.nn.AdaptiveAvgPool1d(2))


class StridedConvBN(torch.nn.Sequential):
    """A batch equal to the channel count is specialized with it (duck sizing), so BatchNorm's
    `numel / channels` (its unbiased running variance) is a fraction of sizes over a number: once an index
    value `(h + 1)*(24*h + 24)/6` that no backend evaluates."""

    def __init__(self):
        super().__init__(torch.nn.Conv2d(4, 6, 3, stride=2, padding=1), torch.nn.BatchNorm2d(6))


class Stem(torch.nn.Sequential):
    """ResNet's stem: a strided conv, BatchNorm, ReLU and a 3x3 max-pool of stride 2, channels_last."""

    def __init__(self):
        super().__init__(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                         torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        self.to(memory_format=torch.channels_last)


MODELS = {
    "conv1d_pool": (ConvPool1d, [(2, 3, 5), (2, 3, 7), (3, 3, 13)]),
    "conv_stride_bn": (StridedConvBN, [(4, 4, 8, 6), (4, 4, 9, 7), (4, 4, 7, 5)]),
    "gpt": (TransformerBlock, [(2, 8, 32), (2, 13, 32), (3, 5, 32)]),
    "llama": (LlamaBlock, [(2, 8, 32), (2, 11, 32), (3, 17, 32)]),  # batch 1 would specialize
    # height != width on the first call: dynamo's duck sizing would otherwise tie them and recompile
    "resnet": (ConvBlock, [(2, 4, 8, 6), (3, 4, 6, 9), (5, 4, 7, 5)]),
    # the pool's input sizes of one parity: torch 2.11's meta of a strided pool guards on it
    "stem": (Stem, [(2, 3, 16, 12), (3, 3, 12, 20), (2, 3, 20, 8)]),
}


def train_at_sizes(make, shapes, codegen, dynamic):
    """A training step at each size, compiled once; returns the backend. Compares loss inputs' and
    parameters' gradients with eager at every size."""
    torch.manual_seed(0)
    model = make().to(DEVICE)
    ours = copy.deepcopy(model)
    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(ours, backend=be, dynamic=dynamic)
    for shape in shapes:
        x = torch.randn(*shape, device=DEVICE)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_a, out_b = compiled(xa), model(xb)
        torch.testing.assert_close(out_a, out_b, **tolerance(torch.float32), msg=lambda m, shape=shape: f"{shape}: {m}")
        out_a.square().mean().backward()
        out_b.square().mean().backward()
        torch.testing.assert_close(xa.grad, xb.grad, **tolerance(torch.float32),
                                   msg=lambda m, shape=shape: f"{shape} dx: {m}")
        for (name, pa), pb in zip(ours.named_parameters(), model.parameters()):
            torch.testing.assert_close(pa.grad, pb.grad, **tolerance(torch.float32),
                                       msg=lambda m, shape=shape, name=name: f"{shape} grad of {name}: {m}")
            pa.grad = pb.grad = None
    return be


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_models_train_like_eager_with_one_compile(name, codegen):
    make, shapes = MODELS[name]
    be = train_at_sizes(make, shapes, codegen, dynamic=True)
    assert [r.name.rstrip("0123456789") for r in be.reports] == ["forward", "backward"], \
        [r.name for r in be.reports]
    # sizes are symbols in the IR, not the first call's numbers
    assert any(not str(s).isdigit() for n in be.reports[0].graph.leaf_nodes() for s in getattr(n, "ranges", ()))


@pytest.mark.parametrize("name", ["gpt", "llama", "stem"])
def test_dynamic_graphs_schedule_like_static_ones(name):
    # a reshape of symbolic sizes, (s0, s1, 32) -> (s0*s1, 32), is a view as it is for numbers (the
    # comparisons of ATen's view rule proven with dynamo's lower bounds: sizes are at least 2), so the
    # dynamic graphs fuse into as many kernels, with as many extern calls, as the static ones; the stem's
    # pool too (sizes `(s0 - 1)//2 + 1` split to and clamped at, see test_pooling)
    make, shapes = MODELS[name]
    counts = {}
    for dynamic in (False, True):
        be = train_at_sizes(make, shapes[:1], "reference", dynamic=dynamic)
        counts[dynamic] = [(r.kernels, r.externs) for r in be.reports]
    assert counts[True] == counts[False], counts


# automatic dynamic makes dynamic only the dimensions it saw change: a varying sequence length, a
# varying batch
VARYING = {"gpt": [(2, t, 32) for t in (8, 13, 5, 9, 21)], "resnet": [(n, 4, 8, 6) for n in (2, 3, 5, 4, 7)]}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(VARYING))
def test_automatic_dynamic_compiles_once_more_then_never(name, codegen):
    # no flag: dynamo compiles the first size statically, the second with symbolic sizes, then reuses it
    be = train_at_sizes(MODELS[name][0], VARYING[name], codegen, dynamic=None)
    assert [r.name.rstrip("0123456789") for r in be.reports] == ["forward", "backward"] * 2, \
        [r.name for r in be.reports]


@pytest.mark.parametrize("codegen", CODEGENS)
def test_size_values_in_loop_bodies_and_outputs(codegen):
    # a SymFloat (numel / 4), a modulus and a max of sizes used as values inside kernels
    def fn(x):
        n, m = x.shape
        return x * (x.numel() / 4) + (n % 3) - torch.sym_max(n, m)

    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for shape in [(5, 3), (7, 9), (12, 4)]:
        x = torch.randn(*shape, device=DEVICE)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(be.reports) == 1


def test_integer_size_values_are_written_without_fractions():
    import sympy

    from passline.ir.index import FloorDiv
    from passline.lowering.sizes import _integral

    h = sympy.Symbol("h", integer=True, positive=True)
    assert _integral((h + 1) * (18 * h + 18) / 6) == 3 * h**2 + 6 * h + 3
    half = _integral(h * (h + 1) / 2)  # integer-valued, fractions after expanding: the exact quotient
    assert half == FloorDiv(h**2 + h, 2)
    assert all(int(half.subs(h, v)) == v * (v + 1) // 2 for v in range(1, 9))


def test_a_size_function_passline_cannot_evaluate_is_refused_at_compile_time():
    import sympy

    from passline.lowering.sizes import translate

    with pytest.raises(NotImplementedError, match="is not a size function"):
        translate(sympy.Function("Unknown")(sympy.Symbol("s0", integer=True)))


@settings(max_examples=25, deadline=None)
@given(programs())
def test_random_programs_with_symbolic_sizes_match_eager(program):
    torch._dynamo.reset()
    be = passline.backend(codegen="reference", fallback="raise")
    ours = torch.compile(program, backend=be, dynamic=True)(*program.inputs)
    for a, b in zip(ours, program(*program.inputs)):
        torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)


def test_a_size_is_never_bound_from_a_size_one_dims_stride():
    """The stride of a size-1 dim is anything: a symbol is bound from it only when nothing else binds it."""
    import sympy

    from passline.backends.reference import _Bindings, size_sources
    from passline.ir import Buffer, Layout
    from passline.lowering import GraphInput
    from passline.pipeline import SchedulerGraph

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    first = GraphInput("a", buffer=Buffer("a", Layout((2, 1, s0), (s0, s0, 1), torch.float32)))
    only = GraphInput("b", buffer=Buffer("b", Layout((1, 3), (s1, 1), torch.float32)))
    graph = SchedulerGraph([first, only])
    args = [torch.randn(2, 1, 7).as_strided((2, 1, 7), (7, 0, 1)), torch.randn(1, 3)]
    bind = _Bindings.read(size_sources(graph), args)
    assert bind.values == {s0: 7, s1: 3}


@pytest.mark.parametrize("codegen", CODEGENS)
def test_int_and_float_scalar_arguments_beside_symbolic_sizes(codegen):
    """Under dynamic=True a Python int argument is a symbol ranged [-int_oo, int_oo] and a float one a float
    range; the size bounds cat and reshape ask the ShapeEnv for skip them (int(-int_oo) once failed the
    compile: a DenseNet block beside BatchNorm's float momentum)."""
    def fn(x, k, eps):
        y = torch.cat([x, x + k], 1) * eps
        return y.reshape(-1), torch.cat([y], 0)

    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for n, k, eps in [(5, -9, 0.5), (7, 4, 0.25), (3, 2, 1.5)]:
        x = torch.randn(2, n, device=DEVICE)
        for a, b in zip(compiled(x, k, eps), fn(x, k, eps)):
            torch.testing.assert_close(a, b)
    assert len(be.reports) == 1


@pytest.mark.parametrize("codegen", CODEGENS)
def test_backward_of_a_fixed_table_sliced_to_a_symbolic_length(codegen):
    """`pos[:seq]` of a learned position table: its backward is a slice_scatter whose end is a size symbol,
    a value only as an IndexValue (it was a Constant the backends could not print)."""
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(7, 4))

        def forward(self, x):
            return x * self.pos[: x.shape[1]] + self.pos[1: x.shape[1] + 1:2].sum(0)

    torch._dynamo.reset()
    model = Positions().to(DEVICE)
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(model, backend=be, dynamic=True)
    for n in (3, 5, 6):
        x = torch.randn(2, n, 4, device=DEVICE)
        compiled(x).sum().backward()
        ours, model.pos.grad = model.pos.grad, None
        model(x).sum().backward()
        torch.testing.assert_close(ours, model.pos.grad)
        model.pos.grad = None
    assert len(be.reports) == 2


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_slice_whose_int_arguments_dynamo_made_symbols_trains(codegen):
    """A slice's ints held in an object's attribute (as a fuzz program's steps hold them): dynamo makes them
    size symbols under dynamic=True, and the backward's slice_scatter then has a symbolic step, which
    lowering refused with a TypeError (found by a dynamic-shape fuzz campaign); it runs as the extern."""
    from passline.testing import Input, TensorProgram

    program = TensorProgram.build(
        inputs=[Input((6,), "float32", "contiguous", seed=272, requires_grad=True)],
        steps=["v1 = slice(v0, 0, 5, 1)", "v2 = reshape(v1, 1)", "v3 = log_softmax(v2, -1)", "v4 = add(v0, v2)"],
        outputs=(4, 1))
    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(program, backend=be, dynamic=True)
    ours, ref = (program.inputs[0].detach().clone().to(DEVICE).requires_grad_() for _ in range(2))
    out, expected = compiled(ours), program(ref)
    sum(o.sum() for o in out).backward()
    sum(o.sum() for o in expected).backward()
    for a, b in zip(out, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(ours.grad, ref.grad)


FLOAT_SIZED = {
    # int(n * 0.29) is 28 at n = 100 in Python floats (the rational 29/100 * 100 is 29): eager's rounding
    "slice_times_float": lambda x: x[:, : int(x.shape[1] * 0.29)].exp(),
    "slice_truediv": lambda x: x[:, : int(x.shape[1] / 3)] * 2,
    "pad_ceil_div": lambda x: torch.nn.functional.pad(x, (0, math.ceil(x.shape[1] / 4))) * 2,
    "view_sqrt": lambda x: x.view(x.shape[0], int(x.shape[1] ** 0.5), -1).sum(-1),
    "interpolate_half": lambda x: torch.nn.functional.interpolate(x.view(1, *x.shape), scale_factor=0.5,
                                                                  mode="nearest").view(x.shape[0], -1),
    "interpolate_linear": lambda x: torch.nn.functional.interpolate(x.view(1, *x.shape), scale_factor=1.5,
                                                                    mode="linear").view(x.shape[0], -1),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", list(FLOAT_SIZED))
def test_sizes_computed_through_floats_train_like_eager(name, codegen):
    """A size computed through float arithmetic (`int(n * 0.5)`, `math.ceil(n / 4)`, an interpolation's
    scale) is a size symbol of its own, bound per call in Python floats as eager computed it: such
    graphs compiled and then failed their first call (no index printer evaluates a float)."""
    torch._dynamo.reset()
    fn = FLOAT_SIZED[name]
    be = passline.backend(codegen=codegen, fallback="raise")
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for n in (100, 9, 16, 31):
        if name == "view_sqrt":
            n = {100: 100, 9: 9, 16: 16, 31: 36}[n]
        x = torch.randn(3, n, device=DEVICE)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = compiled(xa), fn(xb)
        assert ya.shape == yb.shape
        torch.testing.assert_close(ya, yb, **tolerance(torch.float32))
        g = torch.randn_like(yb)
        ya.backward(g)
        yb.backward(g)
        torch.testing.assert_close(xa.grad, xb.grad, **tolerance(torch.float32))
    assert len(be.reports) == 2  # one forward and one backward graph for every size


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_a_squeeze_of_a_dim_whose_size_expression_is_one_drops_it(codegen):
    # found by fuzzing: `x[:, ::3]` of 2 columns has ceil(s/3) columns, 1 here; torch drops that dim in a
    # squeeze (with a guard), passline kept it: (5, 1) where eager gives (5,), and a 0-dim squeeze of a
    # (1,) slice failed in aot_autograd's view replay
    def fn(x, y):
        v = x[:, 0::3].narrow(0, 0, x.shape[0] - 1)
        w = y[3::2]
        return v.squeeze(1), v.squeeze(), w.squeeze(0), w.unsqueeze(0)

    x, y = torch.randn(6, 2), torch.randn(5)
    torch._dynamo.reset()
    got = torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"), dynamic=True)(x, y)
    for g, w in zip(got, fn(x, y)):
        assert g.shape == w.shape and torch.equal(g, w)
