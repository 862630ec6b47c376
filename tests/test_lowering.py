"""Each lowering family, compiled through passline and compared with eager."""
import pytest
import torch

import passline
from passline.ir import Extern, Pointwise, Reduction
from passline.testing import assert_matches_eager

torch.manual_seed(0)
A = torch.randn(6, 8)
B = torch.randn(8)
P = torch.rand(6, 8) + 0.1  # positive
INTS = torch.randint(-5, 6, (6, 8))
J = torch.randint(1, 4, (6, 8))

ELEMENTWISE = {
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2.5), (A, B)),
    "sub_mul_div": (lambda a, b: (a - b) * b / (b + 3.0), (A, B)),
    "rsub_scalar": (lambda a: 1 - a, (A,)),
    "int_true_div": (lambda i, j: i / j, (INTS, J)),
    "floor_div_rem": (lambda i, j: (i // j) + (i % j), (INTS, J)),
    "float_floor_trunc_div": (lambda a: torch.div(a, 0.7, rounding_mode="floor")
                              + torch.div(a, 0.3, rounding_mode="trunc"), (A,)),
    "pow": (lambda a, p: p.pow(a) + a.pow(2) + 2 ** a, (A, P)),
    "comparisons": (lambda a, b: (a > b) & (a <= 0.5) | (a == b) ^ (a != 0.1), (A, B)),
    "where": (lambda a, b: torch.where(a > 0, a, b), (A, B)),
    "where_scalar": (lambda a: torch.where(a > 0, a, 0.0), (A,)),
    "clamp": (lambda a: a.clamp(-0.5, 0.5) + a.clamp(min=0.1) + a.clamp_max(0.2), (A,)),
    "max_min": (lambda a, b: torch.maximum(a, b) - torch.minimum(a, b), (A, B)),
    "unary_math": (lambda p: p.exp() + p.log() + p.sqrt() + p.rsqrt() + p.tanh() + p.sigmoid()
                   + p.erf() + p.reciprocal() + p.log1p() + p.expm1() + p.sin() + p.cos(), (P,)),
    "abs_neg_relu_sign": (lambda a: a.abs() - a.neg() + a.relu() + a.sign(), (A,)),
    "round_floor_ceil": (lambda a: (a * 3).round() + a.floor() + a.ceil() + a.trunc(), (A,)),
    "gelu_silu": (lambda a: torch.nn.functional.gelu(a) + torch.nn.functional.silu(a)
                  + torch.nn.functional.gelu(a, approximate="tanh"), (A,)),
    "casts": (lambda a, i: a.to(torch.bfloat16).float() + i.to(torch.float32) + (a > 0).int(), (A, INTS)),
    "int_ops": (lambda i, j: (i * j + i - j) & 7 | (i ^ j), (INTS, J)),
    "nan_inf": (lambda a: torch.where(a > 0.5, a / 0.0, a) + torch.where(a < -1, a.log(), a), (A,)),
    "isnan": (lambda a: torch.isnan(a.log()) | torch.isinf(a / 0), (A,)),
    "bf16_math": (lambda a: (a.to(torch.bfloat16) * 3.1).exp(), (A,)),
    "masked_fill": (lambda a: a.masked_fill(a > 0, -1.0), (A,)),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(name):
    fn, args = ELEMENTWISE[name]
    be = assert_matches_eager(fn, list(args))
    nodes = passline.last_report().graph.leaf_nodes()
    assert all(isinstance(n, Pointwise) for n in nodes), passline.last_report().graph.format()
    assert be.reports


X = torch.randn(4, 6, 8)
VIEWS = {
    "view_reshape": lambda x: (x.view(24, 8) + 1).reshape(4, 48),
    "permute": lambda x: x.permute(2, 0, 1) * 2,
    "transpose_reshape": lambda x: x.transpose(0, 2).reshape(8, 24) + 1,
    "expand": lambda x: x[:, :1, :].expand(4, 6, 8) + x,
    "unsqueeze_squeeze": lambda x: x.unsqueeze(1).squeeze(1).unsqueeze(-1) * 3,
    "slice": lambda x: x[1:3, ::2, 3:-1] + 1,
    "select": lambda x: x[2, :, 3] + x[-1, :, 0],
    "t": lambda x: x[0].t() + 1,
    "flatten_unflatten": lambda x: x.flatten().view(2, 2, 6, 8).sum(0),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views(name):
    assert_matches_eager(VIEWS[name], [X.clone().requires_grad_()])
    for r in passline.last_report().graph.leaf_nodes():
        assert not isinstance(r, Extern)


SPLITS = {
    "chunk": lambda x: [t * (k + 1) for k, t in enumerate(x.chunk(3, dim=1))],  # 6 -> 2, 2, 2
    "chunk_uneven": lambda x: [t.sin() for t in x.chunk(3, dim=-1)],  # 8 -> 3, 3, 2
    "split_sizes": lambda x: [t.exp() for t in torch.split(x, [1, 3, 2], dim=1)],
    "split_size": lambda x: [t + 1 for t in x.split(3, dim=0)],  # 4 -> 3, 1
    "unbind": lambda x: [t.cos() for t in x.unbind(1)],
    "swiglu": lambda x: (lambda a, b: a * torch.sigmoid(b))(*x.chunk(2, dim=-1)),
    "transposed": lambda x: [t + 1 for t in x.transpose(0, 2).chunk(4, dim=0)],
}


@pytest.mark.parametrize("codegen", ["triton", "reference"])
@pytest.mark.parametrize("name", sorted(SPLITS))
def test_split_chunk_unbind_are_views(name, codegen):
    """Slices of the input, no extern call (RoPE's and SwiGLU's chunk were one per use); the backward
    (a cat of the pieces' gradients) too."""
    be = assert_matches_eager(SPLITS[name], [X.clone().requires_grad_()], codegen=codegen)
    externs = [str(n.op) for r in be.reports for n in r.graph.nodes() if isinstance(n, Extern)]
    assert externs == [], externs


def test_chunk_of_a_symbolic_size_runs():
    """chunk's pieces of a dynamic size are floor divisions of it (torch's FloorDiv in the traced shapes):
    the split stays an extern call, and what reads its pieces evaluates those sizes (it failed at run time)."""
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")

    def f(x):
        a, b = x.chunk(2, dim=-1)
        return a * torch.sigmoid(b)

    g = torch.compile(f, backend=be, dynamic=True)
    for n in (4, 6, 10):
        x = torch.randn(3, 5, 2 * n)
        torch.testing.assert_close(g(x), f(x))
    assert len(be.reports) == 1


R = torch.randn(5, 6, 7)
REDUCTIONS = {
    "sum_all": lambda x: x.sum(),
    "sum_dims_keepdim": lambda x: x.sum((0, 2), keepdim=True),
    "mean": lambda x: x.mean(1),
    "amax_amin": lambda x: x.amax(-1) - x.amin(0).sum(),
    "prod": lambda x: (x * 0.5 + 1).prod(1),
    "var_mean": lambda x: torch.var_mean(x, dim=(0, 1), correction=0),
    "var_unbiased": lambda x: x.var(-1),
    "std": lambda x: x.std(0),
    "argmax_argmin": lambda x: x.argmax(1).sum() + x.argmin(-1, keepdim=True),
    "argmax_flat": lambda x: x.argmax(),
    "any_all": lambda x: (x > 1).any(1) & (x > -3).all(1),
    "max_dim": lambda x: (x.max(1).values.sum(), x.min(-1, keepdim=True)[1]),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "int_sum": lambda x: (x > 0).sum(1),
    "bf16_sum": lambda x: x.to(torch.bfloat16).sum(-1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name):
    assert_matches_eager(REDUCTIONS[name], [R.clone()])
    nodes = passline.last_report().graph.leaf_nodes()
    assert any(isinstance(n, Reduction) for n in nodes)
    assert not any(isinstance(n, Extern) for n in nodes)


def test_constants():
    # constants made where the input is (PASSLINE_TEST_DEVICE=cuda runs this on the GPU)
    fn = lambda x: (x + torch.full((6, 8), 2.5, device=x.device)
                    + torch.ones(8, device=x.device) * torch.arange(8, device=x.device) + torch.zeros_like(x))
    assert_matches_eager(fn, [A])
    assert not any(isinstance(n, Extern) for n in passline.last_report().graph.leaf_nodes())


@pytest.mark.parametrize("codegen", ["triton", "reference"])
def test_integer_constants_outside_their_dtype_wrap_as_eager(codegen):
    # the reference backend made int32 + 2**31's constant with torch.tensor(2**31, dtype=int32), which raised
    # "value cannot be converted to type int32 without overflow" at run time; torch wraps the scalar (-2**31)
    x = torch.tensor([0, 1, -1, 2**31 - 1, -2**31, 12345, -7], dtype=torch.int32)
    s = torch.tensor([0, 1, -1, 32767, -32768, 1234, -7], dtype=torch.int16)
    assert_matches_eager(lambda x, s: (x + 2**31, x * 2**33, x - 2**32 - 5, x // 2**31, s + 40000, s // -300),
                         [x, s], codegen=codegen)


def test_op_without_lowering_runs_as_extern():
    fn = lambda x: torch.cumsum(x * 2, 1) + 1
    assert_matches_eager(fn, [A.clone().requires_grad_()])
    ops = [str(n.op) for r in [passline.last_report()] for n in r.graph.leaf_nodes() if isinstance(n, Extern)]
    assert ops, "cumsum should be an extern call"


def test_extern_gets_non_strided_view_as_copy():
    # reshape of a transposed tensor is not a strided view: mm must get a materialized copy
    fn = lambda x: (x.t().reshape(8, 6) + 0) @ torch.ones(6, 3, device=x.device)
    assert_matches_eager(fn, [A])


def test_complex_runs_as_extern():
    fn = lambda z: (z * z + 1).abs()
    z = torch.randn(4, 5, dtype=torch.complex64)
    assert_matches_eager(fn, [z])
    assert any(isinstance(n, Extern) for n in passline.last_report().graph.leaf_nodes())


def test_matmul_is_extern_and_correct():
    fn = lambda x, w: torch.relu(x @ w) + 1
    assert_matches_eager(fn, [A.clone().requires_grad_(), torch.randn(8, 5, requires_grad=True)])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_ignores_targets_after_the_first_minus_one(reduction):
    """torch's decomposition of multilabel_margin_loss_forward (which runs at the autograd key, before any
    decomposition table) counted the positions after a row's -1 terminator as targets too; passline
    replaces the function in dynamo's graph with a correct one. Rows: a terminator mid-row, one first
    (no targets), none (every entry a target, duplicates included); a 1-D input too."""
    F = torch.nn.functional
    x = torch.randn(3, 5, requires_grad=True)
    t = torch.tensor([[1, 3, -1, 0, 2], [-1, 1, 2, 3, 4], [2, 2, 0, 4, 1]])
    fn = lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction)  # noqa: E731
    assert_matches_eager(fn, [x, t])
    assert_matches_eager(fn, [torch.randn(5, requires_grad=True), torch.tensor([4, 0, -1, 1, 1])])
    assert_matches_eager(torch.nn.MultiLabelMarginLoss(reduction=reduction), [x, t])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_weight_norm_trains_in_half_precision(dtype):
    """weight_norm's norms stay float32 for float16 as for bfloat16 (eager's accumulation type): torch's
    decomposition kept float16 norms, and the backward's aten kernel refused them at the first step."""
    torch.manual_seed(0)
    m = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 5, 3, padding=2)).to(dtype)
    x = torch.randn(2, 3, 16, dtype=dtype, requires_grad=True)
    assert_matches_eager(m, [x])


def _same_bits(got, want) -> bool:
    """Equal values, NaN where eager has NaN and the sign of every zero."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    nan = want.isnan()
    return torch.equal(got.isnan(), nan) and torch.equal(got[~nan], want[~nan]) \
        and torch.equal(got[~nan].signbit(), want[~nan].signbit())


_f16 = torch.tensor([-0.0, 0.0, 1e-7, 0.1, 1.0], dtype=torch.float16)
_bf16_small = torch.tensor([1e-40, -1e-40, 1e-39, 1e-38, 0.0, 2.0], dtype=torch.bfloat16)
EDGE_VALUES = {  # found by fuzzing (thirty-sixth session): each was wrong before, under one codegen or both
    "f16 >= 1e-30 (the scalar rounded to 0)": (lambda x: x >= 1e-30, [_f16]),
    "f16 == 0.1": (lambda x: x == 0.1, [_f16]),
    "f16 != 0-d float64": (lambda x: torch.ne(x, torch.tensor(1e-30, dtype=torch.float64)), [_f16]),
    "bf16 == 0.1": (lambda x: x == 0.1, [torch.tensor([0.1, 0.2], dtype=torch.bfloat16)]),
    "int64 <= f16 (2049 as 2048, max as inf)": (
        lambda a, b: a <= b, [torch.tensor([2049, 2 ** 63 - 1, 5]),
                              torch.tensor([2048.0, float("inf"), 5.0], dtype=torch.float16)]),
    "int32 == bf16": (lambda a, b: a == b, [torch.tensor([257, 7], dtype=torch.int32),
                                            torch.tensor([256.0, 7.0], dtype=torch.bfloat16)]),
    "floor/round/ceil/trunc of ints": (lambda x: (x.floor(), x.round(), x.ceil(), x.trunc()),
                                       [torch.tensor([3, -2, 7])]),
    "bf16 trunc division (quotient rounded first)": (
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        [torch.tensor([-2.5517578125, 2.5517578125], dtype=torch.bfloat16),
         torch.tensor([-0.0654296875, 0.0654296875], dtype=torch.bfloat16)]),
    "sums of -0.0 are +0.0": (lambda x: (x.sum(1), x.mean(1)), [torch.full((4, 16), -0.0)]),
    "bf16 subnormals": (lambda x: (x != 0, x.float() * 1e30, (x.float() * 3).to(torch.bfloat16)), [_bf16_small]),
    "log1p near float32's largest": (torch.log1p, [torch.tensor([3e38, 1e38, 1e30, 2.0])]),
    "pow(f64, 1) exact": (lambda x: torch.floor_divide(torch.pow(x, True), x),
                          [torch.tensor([0.246, 70000.0, 1.1], dtype=torch.float64)]),
    "pow(2, x) float32": (lambda x: torch.pow(2, x), [torch.tensor([54.00613784790039, 89.0, 10.5])]),
    "softmax of an empty int tensor": (lambda x: torch.softmax(x, -1), [torch.zeros(0, dtype=torch.int64)]),
    "bf16 + int32 tensor (rounded to bf16 first), bf16 * 0-d float32 (a CPU scalar: taken whole)": (
        lambda x, i, s: (x + i, x * s, torch.where(x > 0, x, s), torch.clamp(x, max=s)),
        [torch.tensor([-65536.0, -65520.0, 0.0, 1.0, 100.0], dtype=torch.bfloat16),
         torch.tensor([65520], dtype=torch.int32), torch.tensor(0.1)]),
    "f16 * 0-d float32 past float16's precision and range": (
        lambda x, a, b, c: (x * a, x * b, x * c),
        [torch.tensor([1.0, 2.0, 65504.0, 1e-4], dtype=torch.float16), torch.tensor(2.98e-8), torch.tensor(0.1),
         torch.tensor(16777217.0)]),
    "scalars a dtype holds (uint8 -1 wraps, -inf, where's unchecked float)": (
        lambda t, h: (torch.where(t > 1, t, -1), h.masked_fill(h > 0, float("-inf")), torch.where(h > 0, h, -1e9)),
        [torch.tensor([0, 3, 250], dtype=torch.uint8), torch.tensor([1.0, -2.0], dtype=torch.float16)]),
}
EAGER_RAISES = {
    "int - False": (lambda x: x - False, [torch.tensor([1, 2, 3], dtype=torch.int32)]),
    "softmax of ints": (lambda x: torch.softmax(x, -1), [torch.tensor([[1, 2, 3]])]),
    "clamp of bools": (lambda x: torch.clamp(x, min=False), [torch.tensor([True, False])]),
    # a scalar its dtype cannot hold ("value cannot be converted to type ... without overflow")
    "where(u8, 300)": (lambda t: torch.where(t > 1, t, 300), [torch.tensor([0, 3, 250], dtype=torch.uint8)]),
    "clamp(f16, max=1e5)": (lambda x: torch.clamp(x, max=1e5), [torch.tensor([1.0, 7e4], dtype=torch.float16)]),
    "masked_fill(f16, -1e9)": (lambda x: x.masked_fill(x > 0, -1e9), [torch.tensor([1.0, -2.0], dtype=torch.float16)]),
    "full_like(f16, 7e4)": (lambda x: torch.full_like(x, 7e4), [torch.zeros(2, dtype=torch.float16)]),
    "where(i32 > 0, 1e39, i32): a float32 scalar_tensor": (lambda x: torch.where(x > 0, 1e39, x),
                                                          [torch.arange(-3, 4, dtype=torch.int32)]),
}


@pytest.mark.parametrize("codegen", ["reference", "triton"])
@pytest.mark.parametrize("case", sorted(EDGE_VALUES))
def test_edge_values_as_eager(case, codegen):
    fn, inputs = EDGE_VALUES[case]
    want = fn(*[x.clone() for x in inputs])
    torch._dynamo.reset()
    got = torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(*inputs)
    for g, w in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
        assert _same_bits(g, w), (case, g, w)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
@pytest.mark.parametrize("case", sorted(EAGER_RAISES))
def test_what_eager_refuses_is_refused(case, codegen):
    # such ops stay aten calls (Extern), which raise as eager does, rather than lowerings that compute a value
    fn, inputs = EAGER_RAISES[case]
    with pytest.raises(Exception) as eager:
        fn(*inputs)
    torch._dynamo.reset()
    with pytest.raises(type(eager.value)):
        torch.compile(fn, backend=passline.backend(codegen=codegen, fallback="raise"))(*inputs)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_a_zero_tensor_is_zeros_in_memory(codegen):
    """torch.func.jacfwd's backward makes `aten._efficientzerotensor` (a zero gradient with no storage): run as an
    aten call it reached a Triton kernel as a null pointer; it is lowered as zeros (a campaign's find; the reference
    codegen passed before too: it is the control)."""
    from torch.func import jacfwd

    def step(x, w):
        return jacfwd(lambda v: torch.sin(w @ v))(x).sum()

    x, w = torch.randn(3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, fallback="raise")
    torch.compile(step, backend=be)(x, w).backward()
    step(ex, ew).backward()
    torch.testing.assert_close(x.grad, ex.grad)
    torch.testing.assert_close(w.grad, ew.grad)


MIXED_NORMS = {  # a bfloat16 activation into a norm whose parameters are float32 (eager's "mixed type")
    "batch_norm": lambda: torch.nn.BatchNorm2d(6),
    "batch_norm_channels_last": lambda: torch.nn.BatchNorm2d(6).to(memory_format=torch.channels_last),
    "group_norm": lambda: torch.nn.GroupNorm(3, 6),
    "instance_norm": lambda: torch.nn.InstanceNorm2d(6, affine=True),
    "layer_norm": lambda: torch.nn.LayerNorm([7, 5]),
}


@pytest.mark.parametrize("codegen", ["reference", "triton"])
@pytest.mark.parametrize("norm", sorted(MIXED_NORMS))
def test_mixed_type_norms_keep_their_statistics_in_float32(norm, codegen):
    # eager's kernels keep the saved mean and inverse std float32 when the input is bfloat16 and a parameter
    # float32; torch's decompositions rounded them to bfloat16, and the float32 weight's gradient carried
    # bfloat16's error (BatchNorm: 6.8e-2 off eager, which is 1.8e-6 off float64)
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 7, 5) * 3 + 1).bfloat16()
    if norm.endswith("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    assert_matches_eager(MIXED_NORMS[norm](), [x.requires_grad_()], codegen=codegen)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_float16_layer_norm_backward_reads_its_statistics_in_float32(codegen):
    # a float16 LayerNorm's mean and inverse std are saved in float16 on the CPU (as eager's); torch's backward
    # decomposition took rstd / N in float16, subnormal at 9001 wide with inputs of std 100 (1.1e-6): the input
    # gradient was 45x further from float64's than eager's (a fuzz campaign's find, docs/testing.md)
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(9001)
    with torch.no_grad():
        ln.weight.normal_(), ln.bias.normal_()
    x = (torch.randn(3, 9001) * 100).half().requires_grad_()
    assert_matches_eager(ln.half(), [x], codegen=codegen)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_autocast_conv_batchnorm_trains_like_eager(codegen):
    # autocast hands the BatchNorm after a convolution a bfloat16 activation, its parameters float32
    class ConvBN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.relu(self.bn(self.conv(x))).float().mean((2, 3))

    torch.manual_seed(1)
    assert_matches_eager(ConvBN(), [torch.randn(4, 3, 7, 5, requires_grad=True)], codegen=codegen)


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_linalg_checks_run_and_raise_as_eager(codegen):
    # torch.linalg's solve, inv and cholesky check their results with _linalg_check_errors, which aot_autograd
    # orders with an effect token (with_effects): the graph compiles (no fallback), trains as eager, and a
    # singular matrix raises eager's LinAlgError
    def f(a, b):
        m = a.mT @ a + torch.eye(4)
        return torch.linalg.solve(m, b).tanh().sum() + torch.linalg.inv(m).sum() + torch.linalg.cholesky(m).sum()

    torch.manual_seed(0)
    be = assert_matches_eager(f, [torch.randn(6, 4, requires_grad=True), torch.randn(4, 3, requires_grad=True)],
                              codegen=codegen)
    assert not be.failures

    def g(m):
        return torch.linalg.inv(m) * 2

    compiled = torch.compile(g, backend=passline.backend(codegen=codegen, fallback="raise"))
    assert torch.allclose(compiled(torch.eye(3) * 4), torch.eye(3) / 2)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        compiled(torch.zeros(3, 3))
