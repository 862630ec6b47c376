"""inline_pointwise — a cheap pointwise node that no consumer can fuse with is recomputed inside its
consumers, and removed.

The pattern is a LayerNorm weight cast, `w.to(float32)` over [C], read by consumers that iterate over
[rows, C]: fuse refuses the pair (different numel), so the cast would be a kernel of its own whose
output is written and read back, one launch and a dependency more for the big kernel after it. Its body
(at most `max_loads` loads and `max_ops` operations) is substituted at each of its consumers' loads of
it, the load's index mapped back to the node's loop variables; nothing reads it afterwards and it goes.
With one load the consumer still makes one load per use (of the node's input instead of its output), so
no memory traffic is added; with more loads, each use costs more loads.

Inlines node P only when: P is a Pointwise node; it is not a graph output; nothing in the graph mutates
its output or a buffer it reads (its reads move later); every consumer is a single Pointwise or Reduction node that
cannot fuse with P for a reason of shape (`different numel` or `loop structure` — fusion would compute P
once, not once per use); each consumer's load of P maps to one point of P's loops (the index is a sum
of the consumer's loop variables times P's output strides, each variable's range within the dimension
it addresses). All or nothing per node.

Consumers that read the node at indirect positions (see `ir.Indirect`) cannot fuse with it and never
will: up to `indirect_max_loads` loads, the node's body is recomputed at those positions, consumer by
consumer, whatever its other consumers do; it is removed when none is left. Stat: `inlined_indirect`.
Nodes are visited consumers first, so a chain of such nodes (a cast, then a
scale) is inlined link by link in one sweep; each link's own body is what the limits count. Stat:
`inlined_pointwise`.
"""
from __future__ import annotations

from typing import Annotated

import attrs
import sympy

from ..ir import Pointwise, Reduction
from ..ir.body import Cast, IndexValue, Load, Op, rebuild, substitute_index, walk
from ..ir.index import as_strided_form, is_indirect
from ..pipeline.registry import register_pass
from .legality import can_fuse

SHAPE_REASONS = ("different numel", "loop structure")


def _cheap(node: Pointwise, max_loads: int, max_ops: int) -> bool:
    values = list(walk(node.body))
    n_loads = len({(v.buffer, v.index) for v in values if isinstance(v, Load)})
    n_ops = sum(isinstance(v, (Op, Cast)) for v in values)
    return n_loads <= max_loads and n_ops <= max_ops


def _clamp_top(expr, loops: set):
    """The largest value of a clamp of loop variables, `Min(e, hi)` with `e` provably >= 0 (a cat's
    position in one input, `Min(Max(i - o, 0), n - 1)`, or in its first, `Min(i, n - 1)`): `hi`, free of
    loop variables; None for any other expression."""
    if not isinstance(expr, sympy.Min) or not expr.free_symbols & loops:
        return None
    tops = [a for a in expr.args if not a.free_symbols & loops]
    rest = [a for a in expr.args if a.free_symbols & loops]
    if len(tops) != 1 or not tops[0].is_nonnegative or not all(_nonnegative(a, loops) for a in rest):
        return None
    return tops[0]


def _nonnegative(expr, loops: set) -> bool:
    if expr.is_nonnegative:
        return True
    # Max(e, c) >= c
    return isinstance(expr, sympy.Max) and any(not a.free_symbols & loops and a.is_nonnegative for a in expr.args)


def _opaque_clamps(index, var_ranges):
    """`index` with each clamp of loop variables (see `_clamp_top`) replaced by a new variable ranging
    over [0, hi], those variables' (variable, range) pairs, and the substitution back; None when a Max or
    Min of loop variables is not such a clamp. A clamp then addresses a dimension of the node like a loop
    variable does: every value it takes is a point of that dimension."""
    loops = {v for v, _ in var_ranges}
    extra, back = [], {}

    def visit(e):
        if isinstance(e, (sympy.Min, sympy.Max)) and e.free_symbols & loops:
            top = _clamp_top(e, loops)
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


def _point(node: Pointwise, index, var_ranges, flat: bool = False) -> dict | None:
    """{node's loop variable: expression in the consumer's variables} so that the node stores at
    `index`, or None when that is not provable. A clamp of the consumer's variables may address a
    dimension too (`_opaque_clamps`). `flat`: a node of one loop may be mapped from any index
    that stays inside it (`_flat_point`); only for indirect reads, which fusion can never serve: a direct
    read of a node merge_loops flattened is what fuse splits back to the reader's nest."""
    if index.has(sympy.Min, sympy.Max):
        opaque = _opaque_clamps(index, var_ranges)
        if opaque is None:
            return None
        inner, extra, back = opaque
        mapping = _point(node, inner, tuple(var_ranges) + extra, flat)
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
    dims: dict = {}  # output dimension -> consumer variable
    for (v, size), t in zip(var_ranges, form[0]):
        if t == 0 or size == 1:
            continue
        hits = [k for k, (s, st) in enumerate(zip(layout.size, layout.stride))
                if s != 1 and k not in dims and sympy.expand(st - t) == 0]
        # the variable must stay inside that dimension, or it would reach another one's points
        if len(hits) != 1 or not sympy.expand(size - layout.size[hits[0]]).is_nonpositive:
            return None
        dims[hits[0]] = v
    loop_of = node.store_order(node.vars)  # output dimension k is indexed by loop variable loop_of[k]
    mapping = {loop_of[k]: dims.get(k, sympy.S.Zero) for k in range(len(layout.size))}
    if sympy.expand(node.store_index().xreplace(mapping) - index) != 0:
        return None
    return mapping


def _flat_point(node: Pointwise, index, var_ranges) -> dict | None:
    """`_point` for a node of one loop (merge_loops flattens contiguous pointwise nodes): its variable is
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


def _inlined(consumer, node: Pointwise):
    """`consumer` with each load of `node`'s output replaced by `node`'s body at that point, or None."""
    name, var_ranges = node.output.name, consumer.var_ranges
    points = {}
    for ix in consumer.load_indices(name):
        if is_indirect(ix):
            return None  # read at positions known only at run time: see _inlined_indirect
        points[ix] = _point(node, ix, var_ranges)
        if points[ix] is None:
            return None

    def leaf(v):
        if not (isinstance(v, Load) and v.buffer == name):
            return v
        value = substitute_index(node.body, points[v.index])
        # the stored value was rounded to the buffer's dtype: so is the recomputed one
        return value if value.dtype == v.dtype else Cast(value, v.dtype)

    return attrs.evolve(consumer, body=rebuild(consumer.body, leaf))


def _inlined_indirect(consumer, node: Pointwise):
    """`consumer` with each load of `node`'s output at an indirect position (a gather of log-softmax at the
    target) replaced by `node`'s body at that position, or None when there is none. The index symbols
    stand for the node's loop variables there, and the loads of the recomputed body that use them take
    their bindings (same values, same bounds, same checks)."""
    name = node.output.name
    changed = []

    def leaf(v):
        if not (isinstance(v, Load) and v.buffer == name and v.indirect):
            return v
        mapping = _point(node, v.index, tuple(consumer.var_ranges) + tuple((b.symbol, b.bound) for b in v.indirect),
                         flat=True)
        if mapping is None:
            return v

        def bind(u):
            if isinstance(u, (Load, IndexValue)):
                expr = u.index if isinstance(u, Load) else u.expr
                used = tuple(b for b in v.indirect if b.symbol in expr.free_symbols)
                return attrs.evolve(u, indirect=used) if used else u
            return u

        value = rebuild(substitute_index(node.body, mapping), bind)
        changed.append(v)
        return value if value.dtype == v.dtype else Cast(value, v.dtype)

    body = rebuild(consumer.body, leaf)
    return attrs.evolve(consumer, body=body) if changed else None


@register_pass("inline_pointwise", provides={"pointwise_inlined"})
def inline_pointwise(graph, ctx, *,
                     max_loads: Annotated[int, "most distinct loads in an inlined node's body"] = 1,
                     max_ops: Annotated[int, "most operations (casts included) in an inlined node's body"] = 4,
                     indirect_max_loads: Annotated[int, "most distinct loads of a node recomputed at indirect "
                                                   "positions (0: never)"] = 2):
    """Recompute cheap pointwise nodes inside consumers they cannot fuse with (a weight cast), and at the
    positions a consumer reads them indirectly (log-softmax gathered at the target)."""
    outputs, mutated = graph.output_names(), graph.mutated_names()
    for name in reversed(graph.names()):  # consumers first: a chain of such nodes goes in one sweep
        node = graph.node(name) if name in graph else None  # a consumer rewritten above is a new object
        if not isinstance(node, Pointwise) or node.output.name in outputs | mutated \
                or mutated & set(node.read_names()):
            continue
        if indirect_max_loads and _cheap(node, indirect_max_loads, max_ops) \
                and not any(getattr(v, "indirect", ()) for v in walk(node.body)):
            for c in graph.consumers(node.output.name):
                consumer = graph.node(c)
                new = _inlined_indirect(consumer, node) if isinstance(consumer, (Pointwise, Reduction)) else None
                if new is not None and ctx.decide("inline_indirect", node, consumer):
                    graph.replace_node(c, new)
                    ctx.count("inlined_indirect")
            if not graph.consumers(node.output.name):
                graph.remove_node(node.name)  # every read was at indirect positions: nothing needs it stored
                continue
        if not _cheap(node, max_loads, max_ops):
            continue
        consumers = [graph.node(c) for c in graph.consumers(node.output.name)]
        if not consumers or any(not isinstance(c, (Pointwise, Reduction))  # no extern, no group
                                or can_fuse(graph, node, c).reason not in SHAPE_REASONS for c in consumers):
            continue
        rewritten = [_inlined(c, node) for c in consumers]
        if any(r is None for r in rewritten) or not ctx.decide("inline", node, *consumers):
            continue
        for new in rewritten:
            graph.replace_node(new.name, new)
        graph.remove_node(node.name)
        ctx.count("inlined_pointwise")
    return graph
