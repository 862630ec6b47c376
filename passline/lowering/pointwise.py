"""Lowerings of elementwise aten ops to Pointwise nodes.

Type promotion follows torch's own rules (`torch._prims_common.elementwise_dtypes`): operands are
cast to the computation dtype (float32 for bfloat16/float16, like eager's opmath), the op runs,
and the result is cast to the dtype FX recorded for the node.
"""
from __future__ import annotations

import numbers

import numpy
import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from ..ir import Constant, IndexValue, Op
from ..ir.body import COMPARISONS, LOGICAL_OPS
from .context import LoweringContext, cast, upcast
from .registry import lowering
from .sizes import scalar_body
from .tensor import TensorRef

aten = torch.ops.aten
prims = torch.ops.prims


def meta(x):
    """The FakeTensor/scalar FX recorded for an argument (FX nodes) or the value itself."""
    if isinstance(x, torch.fx.Node):
        return x.meta["val"]
    return x


def out_meta(node: torch.fx.Node):
    return node.meta["val"]


def broadcast_load(x: TensorRef, idx, ndim: int):
    """Load x at the point `idx` of a result with `ndim` dims, broadcasting size-1 and missing dims."""
    lead = ndim - x.ndim
    return x.load([sympy.S.Zero if x.size[d] == 1 else idx[d + lead] for d in range(x.ndim)])


def value(x, idx, ndim: int, dtype: torch.dtype):
    """The value of an operand (tensor, Python number or SymInt expression) as `dtype`."""
    if isinstance(x, TensorRef):
        return cast(broadcast_load(x, idx, ndim), dtype)
    if isinstance(x, sympy.Expr):
        return scalar_body(x, dtype)
    if isinstance(x, (bool, numbers.Number)):
        if dtype.is_floating_point:
            return Constant(float(x), dtype)
        return Constant(bool(x) if dtype == torch.bool else int(x), dtype)
    raise TypeError(f"unsupported operand {x!r}")


def promote(node: torch.fx.Node, operands, kind):
    """The computation dtype by torch's rules for this node's operands (float32 for low-precision floats)."""
    compute, _ = elementwise_dtypes(*_promotion_metas(operands), type_promotion_kind=kind)
    return upcast(compute)


def _promotion_metas(operands) -> list:
    """The operands as torch's promotion takes them. A size takes part by its type alone: a stand-in of that
    type, never int(SymInt), which would guard on (specialize to) this call's value and recompile at the next
    size."""
    stand_in = {torch.SymInt: 1, torch.SymFloat: 1.0, torch.SymBool: True}
    return [stand_in.get(type(m), m) for m in map(meta, operands)]


def pointwise_op(ctx: LoweringContext, node, name: str, operands, fx_operands, kind):
    out = out_meta(node)
    compute = promote(node, fx_operands, kind)
    result = torch.bool if name in COMPARISONS | LOGICAL_OPS else compute
    nd = out.dim()
    common = _common_dtype(fx_operands)

    def inner(idx):
        return Op(name, tuple(operand(a, idx, nd, common, compute, name in COMPARISONS) for a in operands), result)

    return ctx.pointwise(out.shape, out.dtype, inner)


def operand(a, idx, nd: int, common: torch.dtype, compute: torch.dtype, compare: bool = False):
    """An operand's value for an op whose operands torch promotes to `common`, computed in `compute`.

    Where `common` is float16 or bfloat16, eager casts each tensor operand of another dtype to it before the op
    (TensorIterator's common dtype): an int32 65520 added to a bfloat16 tensor is 65536. A 0-d CPU tensor is
    eager's "CPU scalar", which arithmetic takes whole in float32 (opmath), as a Python number: `x_f16 *
    torch.tensor(0.1)` multiplies by 0.1, not by its float16 (on a GPU a 0-d GPU tensor is cast like any
    other). A comparison rounds every operand, a Python float too (`x_f16 == 0.1` is True where x holds 0.1's
    float16; `x_f16 != torch.tensor(1e-30)` is False at 0)."""
    if common in (torch.float16, torch.bfloat16):
        if isinstance(a, TensorRef) and a.dtype != common:
            if not compare and a.ndim == 0 and a.buffer.layout.device.type == "cpu":
                return value(a, idx, nd, compute)
            return cast(value(a, idx, nd, common), compute)
        if compare and isinstance(a, numbers.Real) and not isinstance(a, bool):
            return value(_rounded(a, common), idx, nd, compute)
    return value(a, idx, nd, compute)


def _rounded(x, dtype: torch.dtype) -> float:
    """A Python number as `dtype` holds it, computed on the host (lowering runs under FakeTensorMode):
    to float16 by numpy; to bfloat16 through float32 with round-to-nearest-even, as c10 converts a double."""
    with numpy.errstate(over="ignore"):  # past the dtype's range is inf, as eager's conversion
        f = numpy.float32(x)
        if dtype == torch.float16:
            return float(numpy.float16(x))
    if numpy.isnan(f) or numpy.isinf(f):
        return float(f)
    bits = int(f.view(numpy.uint32))
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
    return float(numpy.uint32(bits).view(numpy.float32))


def _common_dtype(fx_operands) -> torch.dtype:
    """The dtype torch's promotion gives an op's operands (before opmath's float32)."""
    return elementwise_dtypes(*_promotion_metas(fx_operands), type_promotion_kind=KIND.DEFAULT)[1]


ROUNDINGS = ("floor", "ceil", "trunc", "round")


def _register(name: str, kind, *ops):
    def lower(ctx, node, *args, **kwargs):
        if kwargs:
            return NotImplemented
        if name in ROUNDINGS and not out_meta(node).dtype.is_floating_point:
            return _copy_like(ctx, node, args[0])  # an integer is its own floor (eager returns a copy)
        return pointwise_op(ctx, node, name, args, node.args, kind)

    lower.__name__ = f"lower_{name}"
    lowering(*ops)(lower)


for _name, _kind, _ops in [
    ("mul", KIND.DEFAULT, [aten.mul.Tensor, aten.mul.Scalar]),
    ("truediv", KIND.INT_TO_FLOAT, [aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor]),
    ("floordiv", KIND.DEFAULT, [aten.floor_divide.default, aten.floor_divide.Scalar]),
    ("remainder", KIND.DEFAULT, [aten.remainder.Tensor, aten.remainder.Scalar]),
    ("fmod", KIND.DEFAULT, [aten.fmod.Tensor, aten.fmod.Scalar]),
    ("pow", KIND.BOOL_TO_LONG, [aten.pow.Tensor_Tensor, aten.pow.Scalar]),
    ("maximum", KIND.DEFAULT, [aten.maximum.default]),
    ("minimum", KIND.DEFAULT, [aten.minimum.default]),
    ("atan2", KIND.INT_TO_FLOAT, [aten.atan2.default]),
    ("copysign", KIND.INT_TO_FLOAT, [aten.copysign.Tensor, aten.copysign.Scalar]),
    ("hypot", KIND.DEFAULT, [aten.hypot.default]),
    ("eq", KIND.ALWAYS_BOOL, [aten.eq.Tensor, aten.eq.Scalar]),
    ("ne", KIND.ALWAYS_BOOL, [aten.ne.Tensor, aten.ne.Scalar]),
    ("lt", KIND.ALWAYS_BOOL, [aten.lt.Tensor, aten.lt.Scalar]),
    ("le", KIND.ALWAYS_BOOL, [aten.le.Tensor, aten.le.Scalar]),
    ("gt", KIND.ALWAYS_BOOL, [aten.gt.Tensor, aten.gt.Scalar]),
    ("ge", KIND.ALWAYS_BOOL, [aten.ge.Tensor, aten.ge.Scalar]),
    ("logical_and", KIND.ALWAYS_BOOL, [aten.logical_and.default]),
    ("logical_or", KIND.ALWAYS_BOOL, [aten.logical_or.default]),
    ("logical_xor", KIND.ALWAYS_BOOL, [aten.logical_xor.default]),
    ("bitwise_and", KIND.DEFAULT, [aten.bitwise_and.Tensor, aten.bitwise_and.Scalar]),
    ("bitwise_or", KIND.DEFAULT, [aten.bitwise_or.Tensor, aten.bitwise_or.Scalar]),
    ("bitwise_xor", KIND.DEFAULT, [aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar]),
    ("bitwise_left_shift", KIND.DEFAULT, [aten.bitwise_left_shift.Tensor]),
    ("bitwise_right_shift", KIND.DEFAULT, [aten.bitwise_right_shift.Tensor]),
]:
    _register(_name, _kind, *_ops)

for _name, _kind in [
    ("neg", KIND.DEFAULT), ("abs", KIND.COMPLEX_TO_FLOAT), ("relu", KIND.DEFAULT),
    ("sign", KIND.DEFAULT), ("floor", KIND.DEFAULT), ("ceil", KIND.DEFAULT), ("trunc", KIND.DEFAULT),
    ("bitwise_not", KIND.DEFAULT), ("logical_not", KIND.ALWAYS_BOOL), ("isnan", KIND.ALWAYS_BOOL),
    ("isinf", KIND.ALWAYS_BOOL), ("signbit", KIND.ALWAYS_BOOL),
] + [(n, KIND.INT_TO_FLOAT) for n in
     "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan tanh sinh cosh asin acos atan asinh "
     "acosh atanh sigmoid erf erfc erfinv reciprocal lgamma digamma".split()]:
    _register(_name, _kind, getattr(aten, _name).default)

_register("round", KIND.DEFAULT, aten.round.default)


def _bool_tensor(x) -> bool:
    m = meta(x)
    return isinstance(m, torch.Tensor) and m.dtype == torch.bool


@lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def lower_add_sub(ctx, node, a, b, *, alpha=1):
    name = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if name == "sub" and any(_bool_tensor(a) or isinstance(a, bool) for a in node.args[:2]):
        return NotImplemented  # eager raises (no `-` with a bool, tensor or scalar): the aten call raises as it does
    if alpha == 1:
        return pointwise_op(ctx, node, name, (a, b), node.args, KIND.DEFAULT)
    out = out_meta(node)
    compute = promote(node, node.args, KIND.DEFAULT)

    def inner(idx):
        scaled = Op("mul", (value(b, idx, out.dim(), compute), value(alpha, idx, 0, compute)), compute)
        return Op(name, (value(a, idx, out.dim(), compute), scaled), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def lower_rsub(ctx, node, a, b, *, alpha=1):
    if alpha != 1 or any(map(_bool_tensor, node.args[:2])):
        return NotImplemented
    return pointwise_op(ctx, node, "sub", (b, a), node.args[::-1], KIND.DEFAULT)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def lower_div_mode(ctx, node, a, b, *, rounding_mode=None):
    compute = promote(node, node.args, KIND.INT_TO_FLOAT)
    if rounding_mode == "floor":
        return pointwise_op(ctx, node, "floordiv", (a, b), node.args, KIND.DEFAULT)
    if rounding_mode is None:
        return pointwise_op(ctx, node, "truediv", (a, b), node.args, KIND.INT_TO_FLOAT)
    if not out_meta(node).dtype.is_floating_point:
        return NotImplemented  # integer truncating division: leave it to aten
    out = out_meta(node)

    def inner(idx):
        q = Op("truediv", (value(a, idx, out.dim(), compute), value(b, idx, out.dim(), compute)), compute)
        # eager divides float16/bfloat16 as that dtype and truncates the rounded quotient (38.99 -> 39.0 -> 39)
        return Op("trunc", (cast(cast(q, out.dtype), compute),), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


def overflows(x, dtype: torch.dtype) -> bool:
    """Whether eager refuses to convert the Python number `x` to `dtype` ("value cannot be converted to type
    ... without overflow": c10::overflows), as `where` and `clamp` convert their scalars: past a float
    dtype's finite range (inf and NaN pass), outside an integer dtype's (an unsigned one also takes
    negatives down to -max, which wrap)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or dtype == torch.bool:
        return False
    if dtype.is_floating_point:
        return bool(x == x) and abs(x) != float("inf") and abs(x) > torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    if isinstance(x, float) and x != x:
        return True
    if info.min == 0 and x < 0:
        return -x > info.max
    return x < info.min or x > info.max


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def lower_where(ctx, node, cond, a, b):
    if any(overflows(v, out_meta(node).dtype) for v in (a, b)):
        return NotImplemented  # eager raises: the aten call raises as it does
    out = out_meta(node)
    compute = promote(node, node.args[1:], KIND.DEFAULT)
    common = _common_dtype(node.args[1:])

    def inner(idx):
        return Op("where", (value(cond, idx, out.dim(), torch.bool), operand(a, idx, out.dim(), common, compute),
                            operand(b, idx, out.dim(), common, compute)), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def lower_masked_fill(ctx, node, x, mask, fill):
    if overflows(fill, out_meta(node).dtype):
        return NotImplemented  # eager raises (masked_fill(x_f16, m, -1e9)): the aten call raises as it does
    out = out_meta(node)
    compute = upcast(out.dtype)

    def inner(idx):
        return Op("where", (value(mask, idx, out.dim(), torch.bool), value(fill, idx, out.dim(), compute),
                            value(x, idx, out.dim(), compute)), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor,
          aten.clamp_max.default, aten.clamp_max.Tensor)
def lower_clamp(ctx, node, x, lo=None, hi=None):
    if out_meta(node).dtype == torch.bool or any(overflows(v, out_meta(node).dtype) for v in (lo, hi)):
        return NotImplemented  # eager raises (no clamp of bools; a bound past the dtype): the aten call does too
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    out = out_meta(node)
    given = [a for a in node.args if a is not None]
    compute, common = promote(node, given, KIND.DEFAULT), _common_dtype(given)

    def inner(idx):
        v = operand(x, idx, out.dim(), common, compute)
        # maximum/minimum propagate NaN from x, as clamp does
        if lo is not None:
            v = Op("maximum", (v, operand(lo, idx, out.dim(), common, compute)), compute)
        if hi is not None:
            v = Op("minimum", (v, operand(hi, idx, out.dim(), common, compute)), compute)
        return v

    return ctx.pointwise(out.shape, out.dtype, inner)


def _copy_like(ctx, node, x):
    out = out_meta(node)
    if not isinstance(x, TensorRef):
        return NotImplemented
    return ctx.pointwise(out.shape, out.dtype, lambda idx: cast(broadcast_load(x, idx, out.dim()), out.dtype))


@lowering(prims.convert_element_type.default, aten.clone.default, aten.lift_fresh_copy.default,
          aten.to.dtype)
def lower_convert(ctx, node, x, *args, **kwargs):
    return _copy_like(ctx, node, x)


@lowering(aten._to_copy.default)
def lower_to_copy(ctx, node, x, *, dtype=None, device=None, layout=None, pin_memory=None,
                  non_blocking=False, memory_format=None):
    if device is not None and torch.device(device) != x.buffer.layout.device:
        return NotImplemented  # device moves are aten's job
    return _copy_like(ctx, node, x)


@lowering(aten.copy.default)
def lower_copy(ctx, node, dst, src, non_blocking=False):
    return _copy_like(ctx, node, src)


def _fill(ctx, node, fill):
    out = out_meta(node)
    return ctx.pointwise(out.shape, out.dtype, lambda idx: value(fill, idx, 0, out.dtype), out.device)


@lowering(aten.full.default, aten.full_like.default)
def lower_full(ctx, node, size_or_x, fill, **kwargs):
    if overflows(fill, out_meta(node).dtype):
        return NotImplemented  # eager raises ("cannot be converted ... without overflow"): so does the aten call
    return _fill(ctx, node, fill)


@lowering(aten.scalar_tensor.default)
def lower_scalar_tensor(ctx, node, fill, **kwargs):
    # eager checks an integer dtype's range here and float32's (scalar_tensor(1e39, float32) raises), not
    # float16's or bfloat16's (scalar_tensor(1e5, float16) is inf)
    dtype = out_meta(node).dtype
    if dtype not in (torch.float16, torch.bfloat16) and overflows(fill, dtype):
        return NotImplemented
    return _fill(ctx, node, fill)


@lowering(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format, aten.empty_like.default,
          aten.empty_strided.default, aten.new_zeros.default, aten.new_empty.default,
          aten._efficientzerotensor.default)
def lower_zeros(ctx, node, *args, **kwargs):
    # empty tensors are filled with zeros: a defined value costs nothing and hides no bug. A "zero tensor"
    # (autograd's stand-in for a gradient known to be zero: forward-mode AD's backward) has no storage, which
    # run as an aten call would reach a kernel as a null pointer: it is zeros in memory here
    return _fill(ctx, node, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def lower_ones(ctx, node, *args, **kwargs):
    return _fill(ctx, node, 1)


@lowering(prims.iota.default)
def lower_iota(ctx, node, length, *, start, step, dtype, device, requires_grad):
    out = out_meta(node)
    return ctx.pointwise(out.shape, out.dtype, lambda idx: IndexValue(start + step * idx[0], torch.int64), device)


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def lower_arange(ctx, node, *args, **kwargs):
    out = out_meta(node)
    nums = [a for a in args if not isinstance(a, TensorRef)]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    if out.dtype.is_floating_point or not all(isinstance(v, (int, sympy.Expr)) for v in (start, step)):
        return NotImplemented  # float ranges round like aten's kernel; leave them to aten
    return ctx.pointwise(out.shape, out.dtype,
                         lambda idx: IndexValue(sympy.sympify(start) + sympy.sympify(step) * idx[0], torch.int64))


@lowering(aten.pow.Tensor_Scalar)
def lower_pow_scalar(ctx, node, x, exponent):
    """x ** c: small constant exponents become multiplies, sqrt or rsqrt (exact, and far cheaper than a
    general pow in a kernel); other exponents use pow."""
    out = out_meta(node)
    compute = promote(node, node.args, KIND.BOOL_TO_LONG)
    e = exponent
    if not compute.is_floating_point and isinstance(e, int) and not isinstance(e, bool) and e < 0:
        return NotImplemented  # eager raises (integers to negative integer powers): so does the aten call
    forms = {2: "sq", 3: "cube", 1: "id", 0.5: "sqrt", -0.5: "rsqrt", -1: "recip", -2: "recip_sq"}
    if not isinstance(e, (int, float)) or isinstance(e, bool) or e not in forms or \
            (not compute.is_floating_point and forms[e] in ("sqrt", "rsqrt", "recip", "recip_sq")):
        return pointwise_op(ctx, node, "pow", (x, e), node.args, KIND.BOOL_TO_LONG)
    form = forms[e]

    def inner(idx):
        v = value(x, idx, out.dim(), compute)
        if form == "id":
            return v
        if form in ("sq", "recip_sq"):
            sq = Op("mul", (v, v), compute)
            return sq if form == "sq" else Op("reciprocal", (sq,), compute)
        if form == "cube":
            return Op("mul", (Op("mul", (v, v), compute), v), compute)
        return Op({"sqrt": "sqrt", "rsqrt": "rsqrt", "recip": "reciprocal"}[form], (v,), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)
