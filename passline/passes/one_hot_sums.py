"""one_hot_sums — a sum over a dimension of a one-hot is the one element the one-hot selects.

The pattern is cross-entropy's backward: nll_loss's gradient is a one-hot along the classes,
`where(col == target[row], -g, 0)`, and log_softmax's backward sums it over each row. That sum reads
no memory but compares every class of every row (at 2048 rows × 65536 classes, 66 µs of integer work on
an H200, and on few rows a split reduction whose finishing kernel keeps the gradient's kernel from
fusing with it), while its value is known: the selected element.

For a sum over one reduction variable r of n values whose body, read through its pointwise producers,
is a product of factors of which one is `where(r == t, a, z)` (possibly under a cast) with z zero, and
neither t, a nor any other factor depends on r:

    sum_r body(r) = where(0 <= t < n, on, off) + off * (n - 1)

where `on` is the body with the one-hot's condition true and `off` with it false. `off` is zero unless a
factor is infinite or NaN, where eager's sum is NaN and so is this: the rewrite is exact, not only for
finite values. Sums and differences of such products and of terms free of r (label smoothing adds a
constant per row to the one-hot gradient) are summed term by term, a term free of r as itself times n
(rounded once, where eager adds n copies: within a reduction's usual rounding).

The Reduction becomes a Pointwise over its kept loops, writing the same buffer. Only
whole nodes are looked at (run it before fuse); producers stay for their other readers (dce removes
those left unread). An index read at run time (the target) keeps its binding, so its bounds check stays.

Looks through at most `max_values` values of producers' bodies (a producer is read through where the
load maps to one point of its loops, as inline_pointwise recomputes one, and nothing writes in place
what it reads). Stat: `one_hot_sums`.
"""
from __future__ import annotations

from typing import Annotated

import attrs
import sympy
import torch

from ..ir import Pointwise, Reduction
from ..ir.body import Cast, Constant, IndexValue, Load, Op, walk
from ..pipeline.registry import AtLeast, register_pass
from .points import read_through


def _depends(value, r) -> bool:
    for v in walk(value):
        if isinstance(v, Load) and r in v.index.free_symbols:
            return True
        if isinstance(v, IndexValue) and r in v.expr.free_symbols:
            return True
    return False


def _factors(value) -> list:
    if isinstance(value, Op) and value.name == "mul":
        return _factors(value.args[0]) + _factors(value.args[1])
    return [value]


def _is_zero(v) -> bool:
    return isinstance(v, Constant) and v.value == 0


def _one_hot(factor, r):
    """(the `where` op, the position t it selects) when `factor` is `where(r == t, a, 0)`, or a cast of
    it, with t and a free of r; else None."""
    where = factor.value if isinstance(factor, Cast) else factor
    if not (isinstance(where, Op) and where.name == "where" and _is_zero(where.args[2])):
        return None
    cond, on = where.args[0], where.args[1]
    if not (isinstance(cond, Op) and cond.name == "eq") or _depends(on, r):
        return None
    for x, t in (cond.args, cond.args[::-1]):
        if isinstance(x, IndexValue) and not x.indirect and x.expr == r and not _depends(t, r):
            return where, t
    return None


def _summed(body, r, n):
    """The sum over r in [0, n) of `body`, or None where it is not a sum of terms each a product with one
    one-hot factor or free of r (label smoothing adds one: a constant per row), at least one of them a
    one-hot."""
    terms = _terms(body, r, n)
    return terms[0] if terms is not None and terms[1] else None


def _terms(value, r, n):
    """(the sum over r of `value`, whether a one-hot was summed), or None."""
    if isinstance(value, Op) and value.name in ("add", "sub"):
        parts = [_terms(a, r, n) for a in value.args]
        if None in parts:
            return None
        return Op(value.name, (parts[0][0], parts[1][0]), value.dtype), parts[0][1] or parts[1][1]
    if not _depends(value, r):
        return Op("mul", (value, _count(n, value.dtype)), value.dtype), False
    factors = _factors(value)
    hits = [(f, hit) for f in factors if (hit := _one_hot(f, r)) is not None]
    if len(hits) != 1 or any(_depends(f, r) for f in factors if f is not hits[0][0]):
        return None
    where, t = hits[0][1]
    inside = Op("logical_and", (Op("ge", (t, Constant(0, t.dtype)), torch.bool),
                                Op("lt", (t, IndexValue(n, t.dtype)), torch.bool)), torch.bool)
    on, off = _replaced(value, where, where.args[1]), _replaced(value, where, where.args[2])
    picked = Op("where", (inside, on, off), value.dtype)
    return Op("add", (picked, Op("mul", (off, _count(n - 1, value.dtype)), value.dtype)), value.dtype), True


def _count(n, dtype):
    return Cast(IndexValue(n, torch.int64), dtype)


def _replaced(body, target, replacement):
    """`body` with the value `target` (compared by identity) replaced by `replacement`."""
    memo: dict = {}

    def visit(v):
        if v is target:
            return replacement
        if id(v) in memo:
            return memo[id(v)]
        if isinstance(v, Op):
            out = attrs.evolve(v, args=tuple(visit(a) for a in v.args))
        elif isinstance(v, Cast):
            out = attrs.evolve(v, value=visit(v.value))
        else:
            out = v
        memo[id(v)] = out
        return out

    return visit(body)


@register_pass("one_hot_sums", provides={"one_hot_sums"})
def one_hot_sums(graph, ctx, *,
                 max_values: Annotated[int, "most producer values read through to find the one-hot", AtLeast(0)] = 64):
    """Replace a sum over a one-hot (cross-entropy's backward) by the element it selects."""
    mutated = graph.mutated_names()
    for name in graph.names():
        node = graph.node(name)
        if not (isinstance(node, Reduction) and node.reduction_type == "sum" and len(node.reduction_ranges) == 1):
            continue
        body = read_through(graph, node.body, node.var_ranges, max_values, mutated)
        if body is None:
            continue
        (r,), n = node.reduction_vars, sympy.sympify(node.reduction_ranges[0])
        summed = _summed(body, r, n)
        if summed is None or not ctx.decide("sum_one_hot", node):
            continue
        out = node.output.dtype
        new = Pointwise(node.name, node.ranges, summed if summed.dtype == out else Cast(summed, out), node.output,
                        node.origins, node.permutation)
        graph.replace_node(name, new)
        ctx.count("one_hot_sums")
    return graph
