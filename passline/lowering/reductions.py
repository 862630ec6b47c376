"""Lowerings of reductions to Reduction nodes (plus Pointwise epilogues for mean and variance).

mean = sum / n and var = sum((x - mean)^2) / (n - correction): two passes, as numerically careful as
eager's Welford, and each piece is a plain single-output node the passes can fuse.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Constant, Op
from ..ir.index import product
from .context import LoweringContext, cast, upcast
from .registry import lowering
from .tensor import TensorRef

aten = torch.ops.aten


def _dims(x: TensorRef, dims) -> list[int]:
    """Reduced dims, normalized; None or [] means all dims (aten's rule)."""
    if x.ndim == 0:
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % x.ndim for d in dims})


def _point(x: TensorRef, dims: list[int], idx, ridx):
    """The input index for outer vars `idx` (kept dims) and reduction vars `ridx` (reduced dims)."""
    outer, red = iter(idx), iter(ridx)
    return [next(red) if d in dims else next(outer) for d in range(x.ndim)]


def _keepdim(ref: TensorRef, dims: list[int], keepdim: bool) -> TensorRef:
    if keepdim:
        for d in dims:
            ref = ref.unsqueeze(d)
    return ref


def reduce(ctx: LoweringContext, x: TensorRef, dims: list[int], rtype: str, out_dtype: torch.dtype,
           acc_dtype: torch.dtype, prologue=None) -> TensorRef:
    """Reduce x over dims; returns the un-kept-dim result (keepdim is applied by the caller)."""
    size = [s for d, s in enumerate(x.size) if d not in dims]
    rsize = [x.size[d] for d in dims]

    def inner(idx, ridx):
        v = cast(x.load(_point(x, dims, idx, ridx)), acc_dtype)
        return prologue(v, idx, ridx) if prologue else v

    return ctx.reduction(size, rsize, rtype, out_dtype, inner)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return upcast(dtype)


@lowering(aten.sum.default, aten.sum.dim_IntList)
def lower_sum(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    out = node.meta["val"]
    dims = _dims(x, dims)
    acc = _acc(out.dtype)
    return _finish(ctx, reduce(ctx, x, dims, "sum", acc, acc), out.dtype, dims, keepdim)


@lowering(aten.prod.default, aten.prod.dim_int)
def lower_prod(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    out = node.meta["val"]
    dims = _dims(x, dim)
    acc = _acc(out.dtype)
    return _finish(ctx, reduce(ctx, x, dims, "prod", acc, acc), out.dtype, dims, keepdim)


def _mean_of(ctx, x: TensorRef, dims, acc) -> TensorRef:
    n = product([x.size[d] for d in dims])
    total = reduce(ctx, x, dims, "sum", acc, acc)
    return ctx.pointwise(total.size, acc, lambda idx: Op("truediv", (total.load(idx), _count(n, acc)), acc))


def _count(n, dtype):
    from .pointwise import value

    return value(n if isinstance(n, sympy.Expr) and not n.is_Integer else int(n), [], 0, dtype)


@lowering(aten.mean.default, aten.mean.dim)
def lower_mean(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    out = node.meta["val"]
    if not out.dtype.is_floating_point:
        return NotImplemented
    dims = _dims(x, dims)
    return _finish(ctx, _mean_of(ctx, x, dims, _acc(out.dtype)), out.dtype, dims, keepdim)


def _var(ctx, x: TensorRef, dims, correction, acc):
    """(var, mean) un-kept, both in the accumulation dtype."""
    mean = _mean_of(ctx, x, dims, acc)

    def squared_dev(v, idx, ridx):
        d = Op("sub", (v, mean.load(idx)), acc)
        return Op("mul", (d, d), acc)

    ssd = reduce(ctx, x, dims, "sum", acc, acc, prologue=squared_dev)
    n = product([x.size[d] for d in dims])
    c = 1 if correction is None else correction

    def divide(idx):
        denom = Op("maximum", (Op("sub", (_count(n, acc), Constant(float(c), acc)), acc), Constant(0.0, acc)), acc)
        return Op("truediv", (ssd.load(idx), denom), acc)

    return ctx.pointwise(ssd.size, acc, divide), mean


def _finish(ctx, ref: TensorRef, dtype, dims, keepdim):
    """Cast a reduced result to the op's dtype (when it was accumulated wider) and apply keepdim."""
    if ref.dtype != dtype:
        ref = ctx.pointwise(ref.size, dtype, lambda idx: cast(ref.load(idx), dtype))
    return _keepdim(ref, dims, keepdim)


@lowering(aten.var_mean.correction)
def lower_var_mean(ctx, node, x, dims=None, *, correction=None, keepdim=False):
    var_out, mean_out = node.meta["val"]
    if not var_out.dtype.is_floating_point:
        return NotImplemented
    dims = _dims(x, dims)
    var, mean = _var(ctx, x, dims, correction, _acc(var_out.dtype))
    return (_finish(ctx, var, var_out.dtype, dims, keepdim), _finish(ctx, mean, mean_out.dtype, dims, keepdim))


@lowering(aten.var.correction)
def lower_var(ctx, node, x, dims=None, *, correction=None, keepdim=False):
    out = node.meta["val"]
    if not out.dtype.is_floating_point:
        return NotImplemented
    dims = _dims(x, dims)
    var, _ = _var(ctx, x, dims, correction, _acc(out.dtype))
    return _finish(ctx, var, out.dtype, dims, keepdim)


def _minmax(rtype):
    def lower(ctx, node, x, dims=None, keepdim=False):
        out = node.meta["val"]
        dims = _dims(x, dims)
        return _keepdim(reduce(ctx, x, dims, rtype, out.dtype, upcast(out.dtype)), dims, keepdim)

    return lower


lowering(aten.amax.default)(_minmax("max"))
lowering(aten.amin.default)(_minmax("min"))


def _arg(rtype):
    def lower(ctx, node, x, dim=None, keepdim=False):
        out = node.meta["val"]
        if x.dtype == torch.bool:  # eager refuses a bool input (the meta kernel does not): the extern call raises
            return NotImplemented
        if dim is None:
            flat = x.reshape((product(x.size),))
            ref = reduce(ctx, flat, [0], rtype, out.dtype, upcast(x.dtype))
            # aten returns a 0-d index, or all-ones dims with keepdim
            return _keepdim(ref, list(range(x.ndim)), keepdim) if keepdim else ref
        dims = _dims(x, dim)
        return _keepdim(reduce(ctx, x, dims, rtype, out.dtype, upcast(x.dtype)), dims, keepdim)

    return lower


lowering(aten.argmax.default)(_arg("argmax"))
lowering(aten.argmin.default)(_arg("argmin"))


def _logical(rtype):
    def lower(ctx, node, x, dims=None, keepdim=False):
        out = node.meta["val"]
        dims = _dims(x, dims)
        return _keepdim(reduce(ctx, x, dims, rtype, out.dtype, torch.bool), dims, keepdim)

    return lower


lowering(aten.any.default, aten.any.dim, aten.any.dims)(_logical("any"))
lowering(aten.all.default, aten.all.dim, aten.all.dims)(_logical("all"))


@lowering(aten.max.dim, aten.min.dim)
def lower_max_min_dim(ctx, node, x, dim, keepdim=False):
    values, indices = node.meta["val"]
    dims = _dims(x, dim)
    kind = "max" if node.target is aten.max.dim else "min"
    v = reduce(ctx, x, dims, kind, values.dtype, upcast(values.dtype))
    i = reduce(ctx, x, dims, "arg" + kind, indices.dtype, upcast(values.dtype))
    return _keepdim(v, dims, keepdim), _keepdim(i, dims, keepdim)
