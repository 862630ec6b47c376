"""`aten.constant_pad_nd` as a Pointwise gather, so that a pad fuses with its producer and consumers
instead of running as an extern copy (`pad_linear`'s padded weight and bias, the first N rows of their
gradients, `F.pad` in convolutional models).

`pad` lists (before, after) counts from the last dimension backwards; a negative count cuts. The cut is a
view (a slice of the input), then each dimension d padded by (lo, hi) reads

    out[.., i, ..] = where(lo <= i < lo + n, x[.., Min(Max(i - lo, 0), n - 1), ..], value)

the position clamped into the input's range so that no load leaves its buffer at a padding point (as `cat`
and `slice_scatter` do: both backends print the clamps, `inline_pointwise` maps through them). A dimension
not padded needs neither the condition nor the clamp. Falls back to the extern where a count is not an
integer or a padded dimension may be empty at run time (a clamp into an empty input would leave it).
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Constant, IndexValue, Op
from ..ir.index import sympify
from .context import cast
from .registry import lowering
from .sizes import lower_bounds
from .tensor import TensorRef, index_value, provably_lt

aten = torch.ops.aten


def _and(a, b):
    return b if a is None else Op("logical_and", (a, b), torch.bool)


@lowering(aten.constant_pad_nd.default)
def lower_constant_pad_nd(ctx, node, x, pad, value=0):
    out = node.meta["val"]
    if not isinstance(x, TensorRef) or len(pad) % 2 or len(pad) // 2 > x.ndim:
        return NotImplemented
    counts = [sympify(p) for p in pad]
    if not all(c.is_Integer for c in counts) or isinstance(value, torch.fx.Node):
        return NotImplemented
    bounds = lower_bounds(node)
    padded = {}  # dim -> (lo, n): the input's size n along dim after the cut, lo zeros before it
    for k in range(len(counts) // 2):
        dim, lo, hi = x.ndim - 1 - k, int(counts[2 * k]), int(counts[2 * k + 1])
        size = x.size[dim]
        if lo < 0 or hi < 0:  # cut: a view of the kept part
            start, length = max(-lo, 0), size - max(-lo, 0) - max(-hi, 0)
            if not (length.is_Integer and length >= 0 or provably_lt(-1, length, bounds)):
                return NotImplemented
            x = x.slice(dim, sympify(start), sympy.S.One, length)
            size = length
        lo, hi = max(lo, 0), max(hi, 0)
        if lo or hi:
            if size == 0:
                continue  # every point of the dimension is padding: no load needed (see below)
            if not (size.is_Integer or provably_lt(0, size, bounds)):
                return NotImplemented  # may be empty at run time: the clamped load would leave the buffer
            padded[dim] = (lo, size)
    dtype = out.dtype
    if dtype == torch.bool:
        value = bool(value)
    elif not (dtype.is_floating_point or dtype.is_complex):
        if not float(value).is_integer():
            return NotImplemented  # aten's own conversion of a fractional fill to an integer dtype
        value = int(value)
    fill = Constant(value, dtype)
    if any(s == 0 for s in x.size):  # no input point at all: the result is all padding
        return ctx.pointwise(out.shape, dtype, lambda idx: fill)

    def inner(idx):
        pos, inside = list(idx), None
        for dim, (lo, n) in sorted(padded.items()):
            i = idx[dim]
            pos[dim] = sympy.Min(sympy.Max(i - lo, 0), n - 1)
            end = lo + n
            if lo:
                inside = _and(inside, Op("ge", (IndexValue(i, torch.int64), Constant(lo, torch.int64)), torch.bool))
            inside = _and(inside, Op("lt", (IndexValue(i, torch.int64), index_value(end)), torch.bool))
        loaded = cast(x.load(pos), dtype)
        return loaded if inside is None else Op("where", (inside, loaded, fill), dtype)

    return ctx.pointwise(out.shape, dtype, inner)
