"""Where a pointwise node's value is, seen from a consumer's load: the point of the node's loops that
stores at the load's index (`point`), and a consumer's body with such loads replaced by the producers'
bodies (`read_through`). Shared by the passes that recompute a node inside its consumers instead of
reading its stored output (inline_pointwise, one_hot_sums, recompute_columns)."""
from __future__ import annotations

import sympy

from ..ir import Pointwise
from ..ir.body import Cast, Load, rebuild, substitute_index, walk
from ..ir.index import as_strided_form, is_indirect, provably_nonnegative


class _TooBig(Exception):
    pass


def read_through(graph, body, var_ranges, max_values: int, mutated: set):
    """`body` (of a node looping over `var_ranges`) with each load of a Pointwise producer's output replaced
    by the producer's body at the point loaded, recursively; None once the producers' bodies read through
    add up to more than `max_values` values. A load stays where its producer writes in place, where the
    buffer or what the producer reads is written in place (the read would move past the write), where it
    is indirect or maps to no single point."""
    budget = [max_values]

    def expand(value):
        def leaf(v):
            if not isinstance(v, Load) or is_indirect(v.index):
                return v
            name = graph.producer(v.buffer)
            producer = graph.node(name) if name is not None else None
            if not isinstance(producer, Pointwise) or producer.in_place or v.buffer in mutated \
                    or mutated & set(producer.read_names()):
                return v
            mapping = point(producer, v.index, var_ranges, bounds=graph.bounds)
            if mapping is None:
                return v
            budget[0] -= sum(1 for _ in walk(producer.body))
            if budget[0] < 0:
                raise _TooBig
            value = expand(substitute_index(producer.body, mapping))
            # the stored value was rounded to the buffer's dtype: so is the recomputed one
            return value if value.dtype == v.dtype else Cast(value, v.dtype)

        return rebuild(value, leaf)

    try:
        return expand(body)
    except _TooBig:
        return None


def _clamp_top(expr, loops: set, bounds: dict):
    """The largest value of a clamp of loop variables, `Min(e, hi)` with `e` provably >= 0 (a cat's
    position in one input, `Min(Max(i - o, 0), n - 1)`, or in its first, `Min(i, n - 1)`): `hi`, free of
    loop variables and provably >= 0 for every size at least its bound in `bounds` (a pool's last
    window, `(s0//2) - 1`); None for any other expression."""
    if not isinstance(expr, sympy.Min) or not expr.free_symbols & loops:
        return None
    tops = [a for a in expr.args if not a.free_symbols & loops]
    rest = [a for a in expr.args if a.free_symbols & loops]
    if len(tops) != 1 or not provably_nonnegative(tops[0], bounds) or not all(_nonnegative(a, loops) for a in rest):
        return None
    return tops[0]


def _nonnegative(expr, loops: set) -> bool:
    if expr.is_nonnegative:
        return True
    # Max(e, c) >= c
    return isinstance(expr, sympy.Max) and any(not a.free_symbols & loops and a.is_nonnegative for a in expr.args)


def _opaque_clamps(index, var_ranges, bounds: dict):
    """`index` with each clamp of loop variables (see `_clamp_top`) replaced by a new variable ranging
    over [0, hi], those variables' (variable, range) pairs, and the substitution back; None when a Max or
    Min of loop variables is not such a clamp. A clamp then addresses a dimension of the node like a loop
    variable does: every value it takes is a point of that dimension."""
    loops = {v for v, _ in var_ranges}
    extra, back = [], {}

    def visit(e):
        if isinstance(e, (sympy.Min, sympy.Max)) and e.free_symbols & loops:
            top = _clamp_top(e, loops, bounds)
            if top is None:
                raise ValueError(e)
            if e not in back.values():
                d = sympy.Dummy(f"c{len(extra)}", integer=True, nonnegative=True)
                extra.append((d, top + 1))
                back[d] = e
            return next(d for d, c in back.items() if c == e)
        if not e.args:
            return e
        return e.func(*map(visit, e.args))

    try:
        return visit(index), tuple(extra), back
    except ValueError:
        return None


def point(node: Pointwise, index, var_ranges, flat: bool = False, bounds: dict | None = None,
          finer: bool = False) -> dict | None:
    """{node's loop variable: expression in the consumer's variables} so that the node stores at
    `index`, or None when that is not provable. A clamp of the consumer's variables may address a
    dimension too (`_opaque_clamps`). `flat`: a node of one loop may be mapped from any index
    that stays inside it (`_flat_point`); only for indirect reads, which fusion can never serve: a direct
    read of a node merge_loops flattened is what fuse splits back to the reader's nest. `bounds`: the
    graph's least value of each size symbol (SchedulerGraph.bounds), for what holds under dynamic shapes.
    `finer`: several consumer variables may address one dimension (a [4, 64, N] loop nest reading a
    [256, N] node: its rows are 64*i0 + i1) — for a reader that takes the node's whole computation
    (inline_pointwise's pad rule); the other rules recompute a node only where the reader's loops match its
    own, and leave a flattened node to `fuse`, which splits it back to the reader's nest and computes it once."""
    # a consumer variable of one value is 0 (a batch of 1: `90*i0` in the index, i0 in range(1))
    index = index.xreplace({v: sympy.S.Zero for v, size in var_ranges if size == 1})
    if index.has(sympy.Min, sympy.Max):
        opaque = _opaque_clamps(index, var_ranges, bounds or {})
        if opaque is None:
            return None
        inner, extra, back = opaque
        mapping = point(node, inner, tuple(var_ranges) + extra, flat, bounds, finer)
        if mapping is None:
            return None
        mapping = {k: v.xreplace(back) for k, v in mapping.items()}
        if sympy.expand(node.store_index().xreplace(mapping) - index) != 0:
            return None
        return mapping
    if flat and len(node.ranges) == 1:
        return _flat_point(node, index, var_ranges)
    layout = node.output.layout
    form = as_strided_form(index, [v for v, _ in var_ranges])
    if form is None or form[1] != 0:
        return None
    dims: dict = {}  # output dimension -> its position, in the consumer's variables
    tops: dict = {}  # output dimension -> the largest that position gets
    for (v, size), t in zip(var_ranges, form[0]):
        if t == 0 or size == 1:
            continue
        # the dimension whose stride is the largest dividing the variable's (`finer`; else equal to it): the
        # variable moves that dimension by the multiple; dimensions of one stride would be ambiguous
        steps = [(k, sympy.expand(t / st)) for k, (s, st) in enumerate(zip(layout.size, layout.stride))
                 if s != 1 and (finer or k not in dims)]
        steps = [(k, m) for k, m in steps if m.is_Integer and m > 0 and (finer or m == 1)]
        if not steps:
            return None
        k, m = min(steps, key=lambda km: km[1])
        if sum(1 for _, m2 in steps if m2 == m) != 1:
            return None
        dims[k] = dims.get(k, sympy.S.Zero) + m * v
        tops[k] = tops.get(k, sympy.S.Zero) + m * (size - 1)
    # each variable must stay inside its dimension, or it would reach another one's points
    if any(not sympy.expand(layout.size[k] - 1 - top).is_nonnegative for k, top in tops.items()):
        return None
    loop_of = node.store_order(node.vars)  # output dimension k is indexed by loop variable loop_of[k]
    mapping = {loop_of[k]: dims.get(k, sympy.S.Zero) for k in range(len(layout.size))}
    if sympy.expand(node.store_index().xreplace(mapping) - index) != 0:
        return None
    return mapping


def _flat_point(node: Pointwise, index, var_ranges) -> dict | None:
    """`point` for a node of one loop (merge_loops flattens contiguous pointwise nodes): its variable is
    the index over the node's stride, when that divides every term and the index stays within the loop
    for every value of the consumer's variables (each term a positive multiple of one variable, which
    reaches at most its range - 1)."""
    (var,), (size,) = node.vars, node.ranges
    stride = sympy.expand(node.store_index()).coeff(var)
    if stride == 0 or sympy.expand(node.store_index() - stride * var) != 0:
        return None
    expr = sympy.expand(index / stride)
    ranges = dict(var_ranges)
    top = sympy.S.Zero
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if not (coeff.is_Integer and coeff > 0 and rest in ranges):
            return None  # a constant offset, a product of variables, a fraction: not proved, not inlined
        top += coeff * (ranges[rest] - 1)
    if not sympy.expand(size - 1 - top).is_nonnegative:
        return None
    return {var: expr}
