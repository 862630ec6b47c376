"""Printing sympy index expressions and loop-body values as Triton source.

Math that `triton.language` lacks, or that the CPU interpreter cannot run (libdevice), goes through
small helpers in the kernel's prelude (`PRELUDE_GPU` / `PRELUDE_INTERPRETER`), so one kernel body
serves both. A kernel's module holds only the helpers its body names (`prelude`).
"""
from __future__ import annotations

import ast
import functools
import math
import re

import sympy
import torch

from ...ir import Constant, Op
from ...ir.index import FloorDiv, ModularIndexing
from ...lowering.sizes import translate

try:  # the floor division dynamo writes in symbolic sizes (a pool's output: (s0 - 1)//2 + 1)
    from torch.utils._sympy.functions import FloorDiv as SizeFloorDiv
except ImportError:  # pragma: no cover
    SizeFloorDiv = ()

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


class Unsupported(NotImplementedError):
    """The Triton backend cannot generate this; the node runs on the reference backend instead."""


def index(expr: sympy.Expr) -> str:
    """A sympy index expression as Triton source (all operands non-negative integers)."""
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add:
        return "(" + " + ".join(index(a) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(index(a) for a in expr.args) + ")"
    if isinstance(expr, FloorDiv):
        return f"({index(expr.args[0])} // {index(expr.args[1])})"
    if isinstance(expr, SizeFloorDiv):
        # Python's floor, which the operands' signs need not be known for (Triton's // truncates)
        return f"_floordiv_i({index(expr.args[0])}, {index(expr.args[1])})"
    if isinstance(expr, ModularIndexing):
        base, div, mod = map(index, expr.args)
        return f"(({base} // {div}) % {mod})" if div != "1" else f"({base} % {mod})"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([index(expr.base)] * int(expr.exp)) + ")"
    if isinstance(expr, sympy.Max):
        out = index(expr.args[0])
        for a in expr.args[1:]:
            out = f"tl.maximum({out}, {index(a)})"
        return out
    if isinstance(expr, sympy.Min):
        out = index(expr.args[0])
        for a in expr.args[1:]:
            out = f"tl.minimum({out}, {index(a)})"
        return out
    try:  # torch's own size functions (Max, CeilDiv... in a layout taken from a traced value): plain sympy
        plain = translate(expr)
    except NotImplementedError:
        plain = expr
    if plain != expr:
        return index(plain)
    raise Unsupported(f"index expression {expr}")


def tl_dtype(dtype: torch.dtype) -> str:
    if dtype not in TL_DTYPE:
        raise Unsupported(f"dtype {dtype}")
    return TL_DTYPE[dtype]


def constant(value, dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        v = float(value)
        if dtype in (torch.float16, torch.bfloat16):
            # the literal is the dtype's value, rounded as torch converts a scalar: the interpreter's tl.full
            # truncates to bfloat16 (where(x > 1, x, 0.1) gave 0.0996, eager 0.1001)
            v = float(torch.tensor(v, dtype=dtype))
        if v != v:
            lit = 'float("nan")'
        elif v in (float("inf"), float("-inf")):
            lit = f'float("{"-" if v < 0 else ""}inf")'
        else:
            lit = repr(v)
        # a bfloat16 literal is made in float32 and converted (exact: v is a bfloat16 value already): Triton
        # 3.6's interpreter has no bfloat16 constants (InterpreterBuilder.get_bf16)
        made = "tl.float32" if dtype == torch.bfloat16 else tl_dtype(dtype)
        if v == 0 and math.copysign(1.0, v) < 0:
            # Triton 3.6 on a GPU made tl.full(.., -0.0, ..) +0.0 and -(+0.0) too (0 - x): 1 / it was inf.
            # -1.0 * 0.0 is -0.0 under IEEE rules, however it is folded
            full = f"(tl.full([1], -1.0, {made}) * 0.0)"
        else:
            full = f"tl.full([1], {lit}, {made})"
        return full if made == tl_dtype(dtype) else f"{full}.to({tl_dtype(dtype)})"
    if dtype == torch.bool:
        return f"tl.full([1], {1 if value else 0}, tl.int1)"
    # wrapped into the dtype's range (Constant.in_range): tl.full refuses a value outside it (the interpreter:
    # OverflowError)
    return f"tl.full([1], {Constant(int(value), dtype).in_range()}, {tl_dtype(dtype)})"


_UNARY = {
    "neg": "-({0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "log2": "tl.log2({0})", "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "sigmoid": "_sigmoid({0})", "erf": "tl.erf({0})", "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})", "reciprocal": "(1.0 / {0})", "relu": "_relu({0})", "tanh": "_tanh({0})",
    "expm1": "_expm1({0})", "log1p": "_log1p({0})", "log10": "(tl.log({0}) * 0.4342944819032518)",
    "trunc": "_trunc({0})", "round": "_round({0})", "sign": "_sign({0})", "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float('inf'))", "logical_not": "({0} == 0)", "bitwise_not": "(~{0})",
    "sinh": "_sinh({0})", "cosh": "_cosh({0})", "erfc": "_erfc({0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "maximum": "_maximum({0}, {1})", "minimum": "_minimum({0}, {1})", "eq": "({0} == {1})",
    "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))", "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) ^ ({1} != 0))", "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})", "bitwise_left_shift": "({0} << {1})", "bitwise_right_shift": "({0} >> {1})",
    "pow": "_pow({0}, {1})",
}


def op(v: Op, args: list[str]) -> str:
    name = v.name
    dtype = v.args[0].dtype
    if name == "where":
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    if name == "floordiv":
        return f"_floordiv_f({args[0]}, {args[1]})" if dtype.is_floating_point else f"_floordiv_i({args[0]}, {args[1]})"
    if name == "remainder":
        kind = "f" if dtype.is_floating_point else "i"
        return f"_remainder_{kind}({args[0]}, {args[1]})"
    if name == "fmod":  # C's fmod: an integer % is LLVM's srem; floats call the exact _fmod
        return f"_fmod({args[0]}, {args[1]})" if dtype.is_floating_point else f"({args[0]} % {args[1]})"
    if name == "pow" and not dtype.is_floating_point:
        raise Unsupported("integer pow")
    if name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not") and dtype.is_floating_point:
        raise Unsupported(name)
    if name in ("sign",) and not dtype.is_floating_point:
        return f"tl.where({args[0]} > 0, 1, tl.where({args[0]} < 0, -1, 0)).to({tl_dtype(v.dtype)})"
    if name in ("abs", "neg", "maximum", "minimum") and dtype == torch.bool:
        raise Unsupported(f"{name} on bool")
    if name == "neg" and dtype.is_floating_point:
        # -x is 0 - x in Triton 3.6's GPU code: neg(+0.0) came out +0.0 (eager's is -0.0); x * -1.0 is exact
        return f"({args[0]} * -1.0)"
    if name == "add" and dtype == torch.bool:
        # torch's bool + bool is logical or; Triton's int1 add wraps (True + True == False)
        return f"({args[0]} | {args[1]})"
    table = _UNARY if len(args) == 1 else _BINARY
    if name not in table:
        raise Unsupported(f"op {name}")
    return table[name].format(*args)


def cast(value: str, src: torch.dtype, dst: torch.dtype) -> str:
    if dst == torch.bool and src == torch.bfloat16:
        # compared as a float: the interpreter holds bfloat16 as raw 16-bit words, so -0.0 (0x8000) != 0
        return f"(_from_bf16({value}) != 0)"
    if dst == torch.bool:
        return f"({value} != 0)"
    if dst == torch.bfloat16 and src != torch.bfloat16:
        # round to nearest even, as torch does (the interpreter would truncate)
        return f"_to_bf16({value}.to(tl.float32))" if src != torch.float32 else f"_to_bf16({value})"
    if src == torch.bfloat16 and dst != torch.bfloat16:
        widened = f"_from_bf16({value})"
        return widened if dst == torch.float32 else f"{widened}.to({tl_dtype(dst)})"
    return f"{value}.to({tl_dtype(dst)})"


# Helpers shared by every kernel; NaN propagates as in eager (maximum/minimum/relu keep NaN).
# Kernels call only Triton builtins and these helpers, never triton.language's own @jit functions
# (tl.zeros, tl.sum, tl.sigmoid): those are compiled for the GPU if triton.language was imported
# before the interpreter was switched on, and then cannot run inside an interpreted kernel.
_COMMON = '''
@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))

# On a tie the first operand wins, as eager's clamp (std::max(x, lo)) and relu keep x: relu(-0.0) and
# clamp(-0.0, min=0) are -0.0, and 1 / them -inf
@triton.jit
def _maximum(a, b):
    return tl.where((a < b) | (b != b), b, a)


@triton.jit
def _minimum(a, b):
    return tl.where((b < a) | (b != b), b, a)


@triton.jit
def _relu(x):
    return tl.where(x < 0, 0, x)


@triton.jit
def _sign(x):
    # sign(NaN) is 0, as eager's (0 < x) - (x < 0)
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)


@triton.jit
def _floordiv_i(a, b):
    q = a // b
    return q - (((a % b) != 0) & ((a < 0) != (b < 0))).to(q.dtype)


@triton.jit
def _remainder_i(a, b):
    r = a % b
    return r + tl.where((r != 0) & ((r < 0) != (b < 0)), b, 0)


@triton.jit
def _floordiv_f(a, b):
    # eager's div_floor_floating (c10/util/generic_math.h): from the exact fmod, not floor(a / b), which
    # rounds first (1.0 // 0.1 is 9, floor(1.0 / 0.1) is 10; inf // 2 is NaN)
    mod = _fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    q = a / b
    negative = (q < 0) | ((q == 0) & ((1.0 / q) < 0))  # copysign(0, a / b), a / b may be -0.0
    fl = tl.where(div == 0, tl.where(negative, -0.0, 0.0), fl)
    return tl.where(b == 0, q, fl)


@triton.jit
def _remainder_f(a, b):
    # eager's: fmod, moved to b's sign (exact, where a - b * floor(a / b) is not: 1.0 % 0.1 is 0.09999..)
    mod = _fmod(a, b)
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@triton.jit
def _sum_combine(a, b):
    return a + b


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _argmax_combine(va, ia, vb, ib):
    # the larger value wins, NaN counts as largest, ties go to the smaller index (as torch.argmax)
    a_nan = va != va
    b_nan = vb != vb
    take_a = (va > vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)


@triton.jit
def _argmin_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    take_a = (va < vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)


@triton.jit
def _trunc(x):
    return tl.where(x >= 0, tl.floor(x), tl.ceil(x))


@triton.jit
def _round(x):
    # round half to even, as torch.round (rint), from floor(x) and x - floor(x), which are exact: floor(x + 0.5)
    # rounded the sum first (round(8388609.0) was 8388610). A zero keeps x's sign, as rint's (round(-0.4) is -0.0)
    r = tl.floor(x)
    d = x - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
    return tl.where(r == 0, x * 0.0, r)
'''

PRELUDE_GPU = '''import triton
import triton.language as tl
from triton.language.extra import libdevice
''' + _COMMON + '''

@triton.jit
def _to_bf16(x):
    return x.to(tl.bfloat16)


@triton.jit
def _from_bf16(x):
    return x.to(tl.float32)


@triton.jit
def _tanh(x):
    return libdevice.tanh(x)


@triton.jit
def _expm1(x):
    return libdevice.expm1(x)


@triton.jit
def _log1p(x):
    return libdevice.log1p(x)


@triton.jit
def _sinh(x):
    return libdevice.sinh(x)


@triton.jit
def _cosh(x):
    return libdevice.cosh(x)


@triton.jit
def _pow(a, b):
    return libdevice.pow(a, b)


@triton.jit
def _fmod(a, b):
    # exact, as C's fmod (Triton's float %, LLVM's frem, is a - b * trunc(a / b) on NVPTX: 1.0 % 0.1 < 0)
    return libdevice.fmod(a, b)


@triton.jit
def _erfc(x):
    return libdevice.erfc(x)


# A reduction's max and min as one instruction (max.NaN.f32 on sm_80 and later: NaN wins, as in eager)
# where the where-form took four an element (two compares, two selects), a third of an online softmax
# step's; integers and bools compare as before
@triton.jit
def _max_combine(a, b):
    if a.dtype.is_floating():
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.where(a > b, a, b)


@triton.jit
def _min_combine(a, b):
    if a.dtype.is_floating():
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.where(a < b, a, b)


# exp(x) for a term of a sum of exponentials whose largest term is 1 (a softmax's row sum, x <= 0):
# ex2.approx.ftz, one instruction, where tl.exp's ex2.approx keeps subnormal results with three more
# (compare, scale, unscale). A term it flushes, below 2**-126, is lost in the sum's rounding anyway.
@triton.jit
def _exp_term(x):
    return libdevice.exp2(x * 1.4426950408889634)
'''

# The CPU interpreter has no libdevice: the same functions from tl.math, written for accuracy.
# It also ignores tl.device_assert (its options never enable debug), so indirect indices are checked by
# `_check_index`: plain Python, which the interpreter calls as it is, raising before the load it guards.
PRELUDE_INTERPRETER = '''import triton
import triton.language as tl


def _check_index(value, ok, mask, what, bound):
    # not @triton.jit: interpreter only (a GPU kernel checks with tl.device_assert)
    import numpy as np

    ok = ok.handle.data
    if mask is not None:
        ok = ok | ~mask.handle.data
    if not ok.all():
        bad = np.broadcast_to(value.handle.data, ok.shape)[~ok].flat[0]
        # a run-time size (dynamic shapes) reaches the interpreter as a one-element array
        size = np.asarray(getattr(getattr(bound, "handle", None), "data", bound)).reshape(-1)[0]
        raise IndexError(f"index {int(bad)} is out of bounds for {what} with size {int(size)}")


def _check_divisor(value, mask):
    # not @triton.jit: an integer division by zero raises on the CPU, as eager's (numpy gave 0); a GPU
    # kernel does not check it, as eager's CUDA kernels do not
    ok = value.handle.data != 0
    if mask is not None:
        ok = ok | ~mask.handle.data
    if not ok.all():
        raise RuntimeError("ZeroDivisionError")
''' + _COMMON + '''

@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _exp_term(x):
    return tl.exp(x)


# Triton's interpreter sums with numpy when the combine function is its own, and otherwise calls ours once
# per element and step (most of the CPU test suite's time in reductions)
_sum_combine = tl.standard._sum_combine


# A reduction's max and min with numpy too (kernel.KernelWriter._reduce): tl.max and tl.min, which the interpreter
# takes with np.nanmax and np.nanmin (NaN ignored), and where a NaN is in the row the row's sum, a NaN, as eager's
# max and min have it; both in x's own dtype (tl.max and tl.sum widen bfloat16 and small integers)
@triton.jit
def _max_of(x, axis: tl.constexpr):
    nan = tl.sum((x != x).to(tl.int32), axis) > 0
    return tl.where(nan, tl.sum(x, axis), tl.max(x, axis)).to(x.dtype)


@triton.jit
def _min_of(x, axis: tl.constexpr):
    nan = tl.sum((x != x).to(tl.int32), axis) > 0
    return tl.where(nan, tl.sum(x, axis), tl.min(x, axis)).to(x.dtype)


# ... and an argmax or argmin: the row's max (min) as above, then the smallest index among the lanes holding it (a
# NaN's, where the row has one): ties to the first index and NaN the largest, as eager and _argmax_combine have them
@triton.jit
def _argmax_of(v, ix, axis: tl.constexpr):
    best = tl.expand_dims(_max_of(v, axis), axis)
    return tl.min(tl.where((v == best) | ((v != v) & (best != best)), ix, 2**62), axis)


@triton.jit
def _argmin_of(v, ix, axis: tl.constexpr):
    best = tl.expand_dims(_min_of(v, axis), axis)
    return tl.min(tl.where((v == best) | ((v != v) & (best != best)), ix, 2**62), axis)


@triton.jit
def _to_bf16(x):
    # float32 -> bfloat16 rounding to nearest even on the bits: the interpreter's own cast truncates
    bits = x.to(tl.int32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    out = tl.where(x != x, bits, rounded) & -65536
    # the upper half, as the bfloat16's bits: the interpreter's float32 -> bfloat16 cast read subnormals wrong
    return (out >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _from_bf16(x):
    # bfloat16 -> float32 on the bits (a bfloat16 is a float32's upper half): the interpreter's own cast read
    # subnormals wrong (1e-40 as 0, 1e-38 as 8.3e-39). A value the IR calls bfloat16 may be held wider (a
    # reduction's float32 accumulator): that one is only converted
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


# tanh, expm1 and sinh cancel near 0 (1 - exp(-2|x|) keeps none of float32's digits at |x| = 1e-8, and at
# 1e-6 only two: tanh(1e-6) was 1.5% off): the interpreter computes them in float64 (numpy's), with the
# series below 1e-5, where float64's own cancellation would start to show, then rounds once.
@triton.jit
def _tanh(x):
    d = x.to(tl.float64)
    a = tl.abs(d)
    e = tl.exp(-2.0 * a)
    t = tl.where(a < 1e-5, a - a * a * a / 3.0, (1.0 - e) / (1.0 + e))
    # tanh(-0.0) is -0.0 (d == 0 keeps the zero's sign)
    return tl.where((d != d) | (d == 0), d, tl.where(d < 0, -t, t)).to(x.dtype)


@triton.jit
def _expm1(x):
    d = x.to(tl.float64)
    # expm1(-0.0) is -0.0: the series' sum came out +0.0
    s = tl.where(d == 0, d, d + 0.5 * d * d + d * d * d / 6.0)
    return tl.where(tl.abs(d) < 1e-5, s, tl.exp(d) - 1.0).to(x.dtype)


@triton.jit
def _log1p(x):
    d = x.to(tl.float64)
    u = 1.0 + d
    # log(u) * (d / (u - 1)) corrects the rounding of 1 + d (Goldberg); at u = inf it would be inf / inf.
    # The ratio first: log(u) * d overflowed for float32 d near its largest (log1p(3e38) was inf, eager 88.6)
    return tl.where((u == 1.0) | (u == float("inf")), d, tl.log(u) * (d / (u - 1.0))).to(x.dtype)


@triton.jit
def _fmod(a, b):
    # exact, as C's fmod: the interpreter's float % is numpy's fmod
    return a % b


@triton.jit
def _erfc(x):
    # not 1 - erf(x), which is 0 from x = 4 on (erfc(4) = 1.5e-8): the Chebyshev fit of Numerical Recipes'
    # erfcc (relative error below 1.2e-7 everywhere), in float64
    d = x.to(tl.float64)
    z = tl.abs(d)
    t = 1.0 / (1.0 + 0.5 * z)
    p = -0.82215223 + t * 0.17087277
    p = 1.48851587 + t * p
    p = -1.13520398 + t * p
    p = 0.27886807 + t * p
    p = -0.18628806 + t * p
    p = 0.09678418 + t * p
    p = 0.37409196 + t * p
    p = 1.00002368 + t * p
    r = t * tl.exp(-z * z - 1.26551223 + t * p)
    return tl.where(d != d, d, tl.where(d >= 0, r, 2.0 - r)).to(x.dtype)


@triton.jit
def _sinh(x):
    d = x.to(tl.float64)
    return tl.where(tl.abs(d) < 1e-5, d + d * d * d / 6.0, 0.5 * (tl.exp(d) - tl.exp(-d))).to(x.dtype)


@triton.jit
def _cosh(x):
    return 0.5 * (tl.exp(x) + tl.exp(-x))


@triton.jit
def _pow(a, b):
    # a ** b for real a: exp(b log|a|) in float64 (in float32 it was some 30 ulp off: pow(2, 54.006)), with the
    # sign for integral b and pow(x, 0) == 1; exponents 1, 2 and -1 exactly (a float64 pow(70000, 1) came out
    # 69999.99999999994, and its floor division by 70000 0)
    d, e = a.to(tl.float64), b.to(tl.float64)
    mag = tl.exp(e * tl.log(tl.abs(d)))
    mag = tl.where(e == 1.0, tl.abs(d), tl.where(e == 2.0, d * d, tl.where(e == -1.0, 1.0 / tl.abs(d), mag)))
    mag = mag.to(a.dtype)
    b_int = b == tl.floor(b)
    b_inf = tl.abs(b) == float("inf")
    odd = b_int & ~b_inf & ((b - 2.0 * tl.floor(b * 0.5)) != 0)
    negative = (a < 0) | ((a == 0) & (1.0 / a < 0))  # -0.0 too: pow(-0.0, -1) is -inf
    res = tl.where(negative & odd, -mag, mag)
    # a finite negative base to a fractional power is NaN; C's pow(-inf, b) is inf (b > 0) or 0 (b < 0),
    # pow(1, b) and pow(-1, +-inf) are 1 (exp(b log|a|) is exp(NaN) there)
    res = tl.where((a < 0) & (a != float("-inf")) & ~b_int, float("nan"), res)
    one = (b == 0) | (a == 1.0) | ((a == -1.0) & b_inf)
    return tl.where(one, 1.0, res)
'''


@functools.lru_cache(maxsize=4)
def _helpers(text: str) -> tuple:
    """A prelude split into its imports and its helpers: (header, {name: the helper's lines, with the
    comment right above it}, {name: the other helpers it names}), in the prelude's order."""
    tree = ast.parse(text)
    lines = text.splitlines()
    # a helper is a function or a private name bound at the top (`_sum_combine = tl.standard._sum_combine`,
    # the interpreter's); of two with one name the later wins, in its own place, as when the module runs
    bound = [(name, n) for n in tree.body if (name := _bound(n))]
    defs: dict = {}
    for name, n in bound:
        defs.pop(name, None)
        defs[name] = n
    # the header ends before the first, even one a later binding replaced
    first = min([_start(n, lines) for _, n in bound], default=len(lines))
    blocks, needs = {}, {}
    for name, n in defs.items():
        blocks[name] = "\n".join(lines[_start(n, lines):n.end_lineno])
        needs[name] = {x.id for x in ast.walk(n) if isinstance(x, ast.Name) and x.id in defs} - {name}
    return "\n".join(lines[:first]).rstrip(), blocks, needs


def _bound(node: ast.stmt) -> str | None:
    """The name a top-level function binds, or a single assignment to a private (`_`) name."""
    if isinstance(node, ast.FunctionDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
            and node.targets[0].id.startswith("_"):
        return node.targets[0].id
    return None


def _start(node: ast.stmt, lines: list) -> int:
    """The line (0-based) a top-level statement starts on: its decorators, and the comment right above."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return start


def prelude(interpret: bool, body: str) -> str:
    """The imports and the helpers `body` names, and those they name in turn. Every helper in every module
    cost a Triton JITFunction (its source read and tokenized) each time a kernel's module was loaded: a
    model's 143 kernels built 4000 of them in a process that found every binary in its cache."""
    header, blocks, needs = _helpers(PRELUDE_INTERPRETER if interpret else PRELUDE_GPU)
    todo = [w for w in dict.fromkeys(re.findall(r"\b_\w+", body)) if w in blocks]
    used = set()
    while todo:
        name = todo.pop()
        if name not in used:
            used.add(name)
            todo.extend(needs[name])
    return "\n\n\n".join([header, *(text for name, text in blocks.items() if name in used)])
