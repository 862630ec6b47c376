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

Values made from the graph's inputs alone and broadcast into bigger loops — cross-entropy backward's
per-row factors (the target, `target != ignore_index`, the upstream gradient over the count of targets)
read by the [rows, vocabulary] gradient — are each a kernel of a few programs launched ahead of the big
one, and the big one waits for them. Such a node P is recomputed in its consumers when every consumer
iterates at least `broadcast_ratio` times P's points (each of P's values is reused along a row: its loads
hit the cache and its operations are a few a point of a memory-bound loop) and P's body, with the cheap
pointwise nodes it reads expanded in turn down to the graph's inputs, has at most `broadcast_max_loads`
distinct loads and `broadcast_max_ops` operations. The expanded nodes go when nothing reads them. Stat:
`inlined_broadcast`.

Values of one point of one graph input (`target == ignore_index`, a cast of a weight), expanded through
the pointwise nodes between, with at most `input_max_ops` operations, are recomputed by every reader when
the node is a graph output (it is stored anyway; a saved mask) or has two readers or more: such a node ties
its readers' kernels to the kernel it joins. In cross-entropy with label smoothing the saved mask
`target == ignore_index`, fused into the loss's kernel, made the per-row smoothing term wait for it, and
the two passes over the logits could not be one kernel (fuse refused them: a cycle). Each reader loads
the input at the same point instead of the node's output, and at most `input_max_ops` operations more;
where the input's dtype is wider than the node's (an int64 target for a bool mask), only for a node with
`broadcast_ratio` times fewer points than one of the graph's loops (per-row values), whose extra bytes are
nothing beside that loop's. An output stays, computed where it fuses. Stat: `inlined_input`.

A chain of such nodes down to one point of one graph input (the max-pool backward's positions,
recomputed from the int8 window offsets the forward saved) is recomputed in consumers that cannot fuse
with it for a reason of shape, when its body expanded to the inputs has one distinct load, at most
`chain_max_ops` operations and reads no wider a dtype than the node stores: each use still loads one
element. Stat: `inlined_chain`.

Consumers that read the node at indirect positions (see `ir.Indirect`) cannot fuse with it and never
will: up to `indirect_max_loads` loads, the node's body is recomputed at those positions, consumer by
consumer, whatever its other consumers do; it is removed when none is left. Stat: `inlined_indirect`.
Nodes are visited consumers first, so a chain of such nodes (a cast, then a
scale) is inlined link by link in one sweep; each link's own body is what the limits count. Stat:
`inlined_pointwise`.

A node whose one reader is a Pointwise node it cannot fuse with for a reason of shape, iterating more of
its points but at most 9/8 of them (a pad of its rows to an aligned width: pad_linear's logits gradient,
30522 -> 30528 columns), moves into that reader with its cone: the pointwise nodes it reads, directly or
through each other, that nothing else reads (none an output, written in place or read indirectly). Each is
then computed once per point of the reader, none is stored; a cone node the reader would compute at two
points of each of its own (a stencil) refuses the move, as does a body of more than `cone_max_values`
values. Where the moved body's load sits in the chosen branch of a `where` whose condition bounds a loop
variable (the pad's `col < N`), a clamp of that variable the condition makes idle (`Min(col, N - 1)`) is
dropped from each load that stays inside its buffer for every point of the loops — the padded logits' storage
holds every column — so the kernel reads where it stores: vectorized, and over a buffer it may write its
output into. Stat: `inlined_cone`.
"""
from __future__ import annotations

from typing import Annotated

import attrs
import sympy

from ..ir import Pointwise, Reduction
from ..ir.body import Cast, Constant, IndexValue, Load, Op, children, rebuild, substitute_index, walk
from ..ir.index import as_strided_form, is_indirect, var_kind
from ..pipeline.registry import AtLeast, register_pass
from .legality import can_fuse
from .points import point

SHAPE_REASONS = ("different numel", "loop structure")


def _cheap(node: Pointwise, max_loads: int, max_ops: int) -> bool:
    """At most `max_loads` distinct loads and `max_ops` operations, not counting those of a value of the
    sizes alone (`1 / (s0 * s1)` under dynamic shapes, a constant folded by lowering at static sizes)."""
    values = list(walk(node.body))
    n_loads = len({(v.buffer, v.index) for v in values if isinstance(v, Load)})
    sizes_only: set = set()  # ids of values computed from constants and sizes alone
    for v in values:  # operands before users
        if isinstance(v, Constant) or (isinstance(v, IndexValue) and not v.indirect
                                       and not any(var_kind(s) for s in v.expr.free_symbols)):
            sizes_only.add(id(v))
        elif isinstance(v, (Op, Cast)) and all(id(c) in sizes_only for c in children(v)):
            sizes_only.add(id(v))
    n_ops = sum(isinstance(v, (Op, Cast)) and id(v) not in sizes_only for v in values)
    return n_loads <= max_loads and n_ops <= max_ops


def _inlined(consumer, node: Pointwise, bounds: dict):
    """`consumer` with each load of `node`'s output replaced by `node`'s body at that point, or None
    (`bounds`: the graph's, see points.point)."""
    name, var_ranges = node.output.name, consumer.var_ranges
    points = {}
    for ix in consumer.load_indices(name):
        if is_indirect(ix):
            return None  # read at positions known only at run time: see _inlined_indirect
        points[ix] = point(node, ix, var_ranges, bounds=bounds)
        if points[ix] is None:
            return None

    def leaf(v):
        if not (isinstance(v, Load) and v.buffer == name):
            return v
        value = substitute_index(node.body, points[v.index])
        # the stored value was rounded to the buffer's dtype: so is the recomputed one
        return value if value.dtype == v.dtype else Cast(value, v.dtype)

    return attrs.evolve(consumer, body=rebuild(consumer.body, leaf))


def _inlined_indirect(consumer, node: Pointwise, bounds: dict):
    """`consumer` with each load of `node`'s output at an indirect position (a gather of log-softmax at the
    target) replaced by `node`'s body at that position, or None when there is none. The index symbols
    stand for the node's loop variables there, and the loads of the recomputed body that use them take
    their bindings (same values, same bounds, same checks). A load whose recomputed value would not use one
    of its unproven indices stays as it is: its check goes with it."""
    name = node.output.name
    changed = []

    def leaf(v):
        if not (isinstance(v, Load) and v.buffer == name and v.indirect):
            return v
        mapping = point(node, v.index, tuple(consumer.var_ranges) + tuple((b.symbol, b.bound) for b in v.indirect),
                         flat=True, bounds=bounds)
        if mapping is None:
            return v

        carried = set()

        def bind(u):
            if isinstance(u, (Load, IndexValue)):
                expr = u.index if isinstance(u, Load) else u.expr
                used = tuple(b for b in v.indirect if b.symbol in expr.free_symbols)
                carried.update(b.symbol for b in used)
                return attrs.evolve(u, indirect=used) if used else u
            return u

        value = rebuild(substitute_index(node.body, mapping), bind)
        if any(not b.proven and b.symbol not in carried for b in v.indirect):
            # the recomputed value does not move with an index (a gather along a broadcast or size-1 dim,
            # cross-entropy over one class): inlined, nothing would load through it, and its bounds check,
            # which eager makes (an out-of-range target raises), would be lost with it
            return v
        changed.append(v)
        return value if value.dtype == v.dtype else Cast(value, v.dtype)

    body = rebuild(consumer.body, leaf)
    return attrs.evolve(consumer, body=body) if changed else None


def _shape_refused(graph, node: Pointwise, memo: dict | None = None) -> list | None:
    """`node`'s consumers where every one is a Pointwise or Reduction node (no extern, no group) that
    cannot fuse with it for a reason of shape, else None. `memo`: see _tried."""
    return _tried(memo, "shape_refused", lambda: _consumers_refused(graph, node))


def _consumers_refused(graph, node: Pointwise) -> list | None:
    consumers = [graph.node(c) for c in graph.consumers(node.output.name)]
    if not consumers or any(not isinstance(c, (Pointwise, Reduction))
                            or can_fuse(graph, node, c).reason not in SHAPE_REASONS for c in consumers):
        return None
    return consumers


def _tried(memo: dict | None, key: str, compute):
    """`compute()`, once per `memo` (None: every time): the sweep gives each node one memo, for what its tries
    (cheap, broadcast, input value, chain) ask alike — a try that fails leaves the graph as it was, and the
    first that succeeds ends the node's turn, so the answers hold for every try of that turn."""
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def _inline_cheap(graph, ctx, node: Pointwise, max_loads: int, max_ops: int, memo: dict | None = None) -> bool:
    """Recompute `node` in consumers that cannot fuse with it for a reason of shape; True when done."""
    consumers = _shape_refused(graph, node, memo) if _cheap(node, max_loads, max_ops) else None
    if consumers is None:
        return False
    return _recompute(graph, ctx, node, node, consumers, "inline", "inlined_pointwise")


def _inline_chain(graph, ctx, node: Pointwise, inputs, blocked, max_ops: int, memo: dict | None = None) -> bool:
    """Recompute `node`, expanded down to one point of one graph input, in consumers that cannot fuse
    with it for a reason of shape; True when done (the chain's nodes left unread go at the sweep's end)."""
    consumers = _shape_refused(graph, node, memo)
    if consumers is None:
        return False
    computed = _expanded(graph, node, inputs, blocked, 1, max_ops, memo)
    if computed is None or not _no_wider(graph, computed, 0):
        return False
    return _recompute(graph, ctx, node, computed, consumers, "inline_chain", "inlined_chain")


def _recompute(graph, ctx, node: Pointwise, computed: Pointwise, consumers, decision: str, stat: str,
               keep: bool = False) -> bool:
    """Replace every consumer's loads of `node` by `computed`'s body at those points (`computed`: the node
    itself, or its body expanded) and remove `node` unless `keep` (a graph output) — all or nothing, a
    decision `passline.bisect` can stop at; True when done."""
    rewritten = [_inlined(c, computed, graph.bounds) for c in consumers]
    if any(r is None for r in rewritten) or not ctx.decide(decision, node, *consumers):
        return False
    for new in rewritten:
        graph.replace_node(new.name, new)
    if not keep:
        graph.remove_node(node.name)
    ctx.count(stat)
    return True


def _from_inputs(graph, node: Pointwise, inputs, blocked, depth: int = 8):
    """`node`'s body with each load of another pointwise node replaced by that node's body at that point,
    down to loads of the graph's `inputs` alone; None where some load reads anything else (a reduction, an
    extern, a node in `blocked`: an output or a mutated buffer) or cannot be mapped to a point."""
    if depth == 0:
        return None
    failed = []

    def leaf(v):
        if not isinstance(v, Load) or v.buffer in inputs:
            return v
        name = graph.producer(v.buffer)
        producer = graph.node(name) if name is not None else None
        if not isinstance(producer, Pointwise) or v.buffer in blocked or v.indirect:
            failed.append(v)
            return v
        at = point(producer, v.index, node.var_ranges, bounds=graph.bounds)
        inner = _from_inputs(graph, producer, inputs, blocked, depth - 1) if at is not None else None
        if inner is None:
            failed.append(v)
            return v
        value = substitute_index(inner, at)
        return value if value.dtype == v.dtype else Cast(value, v.dtype)

    body = rebuild(node.body, leaf)
    return None if failed else body


def _bigger(consumer, node, ratio: int) -> bool:
    """Whether `consumer` provably iterates at least `ratio` times `node`'s points."""
    more = sympy.simplify(consumer.numel - ratio * node.numel)
    return bool(more.is_nonnegative)


def _inline_broadcast(graph, ctx, node: Pointwise, inputs, blocked, ratio: int, max_loads: int,
                      max_ops: int, memo: dict | None = None) -> bool:
    """Recompute `node` (made from the graph's inputs, expanded) in its consumers, each at least `ratio`
    times bigger; True when done (the node is then removed)."""
    consumers = [graph.node(c) for c in graph.consumers(node.output.name)]
    if not consumers or any(not isinstance(c, (Pointwise, Reduction)) or not _bigger(c, node, ratio)
                            for c in consumers):
        return False
    computed = _expanded(graph, node, inputs, blocked, max_loads, max_ops, memo)
    if computed is None:
        return False
    return _recompute(graph, ctx, node, computed, consumers, "inline_broadcast", "inlined_broadcast")


def _expanded(graph, node: Pointwise, inputs, blocked, max_loads: int, max_ops: int,
              memo: dict | None = None) -> Pointwise | None:
    """`node` with its body expanded down to the graph's inputs (`_from_inputs`), or None where it cannot
    be or is not cheap after expanding. `memo`: see _tried (every caller passes the same inputs and
    blocked buffers)."""
    body = _tried(memo, "from_inputs", lambda: _from_inputs(graph, node, inputs, blocked))
    computed = attrs.evolve(node, body=body) if body is not None else None
    return computed if computed is not None and _cheap(computed, max_loads, max_ops) else None


def _inline_input_value(graph, ctx, node: Pointwise, inputs, blocked, max_ops: int, ratio: int,
                        output: bool, memo: dict | None = None) -> bool:
    """Recompute `node`, a value of one point of one graph input (expanded), in every consumer; the node
    stays when it is a graph `output`. True when done."""
    consumers = [graph.node(c) for c in graph.consumers(node.output.name)]
    if len(consumers) < (1 if output else 2) or any(not isinstance(c, (Pointwise, Reduction)) for c in consumers):
        return False  # one reader of a node that is not an output can simply fuse with it
    computed = _expanded(graph, node, inputs, blocked, 1, max_ops, memo)
    if computed is None or not _no_wider(graph, computed, ratio):
        return False
    return _recompute(graph, ctx, node, computed, consumers, "inline_input", "inlined_input", keep=output)


def _no_wider(graph, node: Pointwise, ratio: int) -> bool:
    """Whether readers loading `node`'s one input in place of its output read no more bytes, or `node` is
    small beside the graph's loops (at least `ratio` times fewer points than one of them: a per-row value)."""
    loads = [v for v in walk(node.body) if isinstance(v, Load)]
    if not loads or loads[0].dtype.itemsize <= node.output.dtype.itemsize:  # none: a value of the indices
        return True
    return bool(ratio) and any(isinstance(n, (Pointwise, Reduction)) and _bigger(n, node, ratio)
                               for n in graph.nodes())


def _cone(graph, node: Pointwise, blocked) -> set:
    """The pointwise nodes `node` reads directly, or through each other, that only `node` and each other
    read (none an output or written in place, none read at indirect positions): computed inside `node`'s
    reader instead, none of them is stored or computed twice."""
    found, frontier, indirect = set(), [node], set()
    while frontier:
        for v in walk(frontier.pop().body):
            if not isinstance(v, Load) or v.buffer in blocked:
                continue
            name = graph.producer(v.buffer)
            producer = graph.node(name) if name is not None else None
            if v.indirect:
                indirect.add(name)
            elif isinstance(producer, Pointwise) and not producer.in_place and name not in found \
                    and not graph.mutated_names() & set(producer.read_names()):
                found.add(name)
                frontier.append(producer)
    cone = found - indirect
    while True:  # drop the nodes read from outside (the expansion stops at them: what only they read stays too)
        outside = {n for n in cone if any(c not in cone and c != node.name
                                          for c in graph.consumers(graph.node(n).output.name))}
        if not outside:
            return cone
        cone -= outside


def _moved(graph, consumer, node: Pointwise, cone: set, max_ops: int):
    """`consumer` with its one load of `node` replaced by `node`'s body expanded through `cone`, all in the
    consumer's variables; None where a load maps to no single point, a cone node would be computed at two
    points of each consumer point (recomputed), or the body grows past `max_ops` values."""
    indices = consumer.load_indices(node.output.name)
    if len(indices) != 1:  # read at two points of each consumer point: moved, it would be computed twice
        return None
    index, var_ranges = indices[0], consumer.var_ranges
    at_points: dict = {}  # cone node -> the point it is computed at

    def expand(n, at):
        if at_points.setdefault(n.name, at) != at:
            raise _Refused
        body = substitute_index(n.body, at)

        def leaf(v):
            name = graph.producer(v.buffer) if isinstance(v, Load) and not v.indirect else None
            if name not in cone:
                return v
            producer = graph.node(name)
            inner_at = point(producer, v.index, var_ranges, bounds=graph.bounds, finer=True)
            if inner_at is None:
                raise _Refused
            value = expand(producer, inner_at)
            return value if value.dtype == v.dtype else Cast(value, v.dtype)

        return rebuild(body, leaf)

    at = point(node, index, var_ranges, bounds=graph.bounds, finer=True)
    if at is None:
        return None
    try:
        value = expand(node, at)
    except _Refused:
        return None
    value = _unclamped(graph, value, _guard_facts(consumer.body, node.output.name), var_ranges)
    body = rebuild(consumer.body, lambda v: (value if value.dtype == v.dtype else Cast(value, v.dtype))
                   if isinstance(v, Load) and v.buffer == node.output.name else v)
    if sum(1 for _ in walk(body)) > max_ops:
        return None
    return attrs.evolve(consumer, body=body)


def _guard_facts(body, buffer: str) -> dict:
    """{loop variable: (least, most)} that holds wherever `body` uses its loads of `buffer`: each such use
    lies in the chosen branch of a `where` whose condition bounds the variable (a pad's
    `where(0 <= i & i < N, x[Min(i, N - 1)], 0)`), on every path from the body's root."""
    memo: dict = {}

    def bounds(cond) -> dict:  # {variable: (least, most)} from the conjuncts `index(v) >= n`, `index(v) < n`
        if isinstance(cond, Op) and cond.name == "logical_and":
            return _both(*(bounds(c) for c in cond.args))
        if isinstance(cond, Op) and cond.name in ("lt", "ge") and isinstance(cond.args[0], IndexValue) \
                and not cond.args[0].indirect and isinstance(cond.args[0].expr, sympy.Symbol) \
                and isinstance(cond.args[1], Constant) and isinstance(cond.args[1].value, int):
            n = cond.args[1].value
            return {cond.args[0].expr: (n, None) if cond.name == "ge" else (None, n - 1)}
        return {}

    def meet(a, b):  # what holds on both paths: each variable both bound, by the looser of the two bounds
        out = {v: (min(a[v][0], b[v][0]) if None not in (a[v][0], b[v][0]) else None,
                   max(a[v][1], b[v][1]) if None not in (a[v][1], b[v][1]) else None) for v in a.keys() & b.keys()}
        return {v: lh for v, lh in out.items() if lh != (None, None)}

    def facts(v):  # None: no path from v to a load of buffer
        if id(v) in memo:
            return memo[id(v)]
        if isinstance(v, Load) and v.buffer == buffer:
            found = {}
        else:
            paths = []
            kids = children(v)
            for k, c in enumerate(kids):
                f = facts(c)
                if f is None:
                    continue
                if isinstance(v, Op) and v.name == "where" and k == 1:  # the chosen branch: its condition holds
                    f = _both(f, bounds(kids[0]))
                paths.append(f)
            found = None
            for f in paths:
                found = f if found is None else meet(found, f)
        memo[id(v)] = found
        return found

    return facts(body) or {}


def _both(a: dict, b: dict) -> dict:
    """Facts {variable: (least, most)} holding where both `a` and `b` hold: each bound the tighter of the two
    (None: no bound)."""
    def tighter(x, y, pick):
        return y if x is None else x if y is None else pick(x, y)

    none = (None, None)
    return {v: (tighter(a.get(v, none)[0], b.get(v, none)[0], max), tighter(a.get(v, none)[1], b.get(v, none)[1], min))
            for v in a.keys() | b.keys()}


def _unclamped(graph, value, facts: dict, var_ranges):
    """`value` with each clamp of a loop variable its guard makes idle (`Min(i, N - 1)` where `i <= N - 1`)
    replaced by the variable, in each load that then stays inside its buffer at every point of the loops
    (the value is computed, and thrown away, where the guard fails: it must not read outside) and in the
    index values computed with them, but not in what gives a position loaded at run time. Such loads then
    sit at the stored index: contiguous, and a buffer a kernel may write its output over (the padded
    logits' gradient over the logits)."""
    if not facts or any(isinstance(v, Op) and v.name in ("floordiv", "remainder", "fmod")
                        and not v.dtype.is_floating_point for v in walk(value)):
        return value  # (an integer division by a value loaded where the guard fails could raise)

    def strip(e):
        args = [a for a in e.args if not a.is_number]
        if len(args) != 1 or len(e.args) != 2:
            return e
        inner, k = args[0], next(a for a in e.args if a.is_number)
        var = next(iter(inner.free_symbols), None) if len(inner.free_symbols) == 1 else None
        if var not in facts or sympy.expand(inner - var).free_symbols:
            return e
        shift = sympy.expand(inner - var)  # inner = var + shift
        lo, hi = facts[var]
        if isinstance(e, sympy.Min):
            return inner if hi is not None and hi + shift <= k else e
        return inner if lo is not None and lo + shift >= k else e

    def unclamp(expr):
        return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), strip)

    ranges = dict(var_ranges)
    buffers = graph.buffers()

    def inside(v) -> bool:  # a direct load's every position within its buffer's storage
        form = as_strided_form(v.index, list(ranges))
        layout = buffers[v.buffer].layout if v.buffer in buffers else None
        if form is None or layout is None or not all(c.is_nonnegative for c in form[0]) \
                or not sympy.sympify(form[1]).is_nonnegative:
            return False
        top = form[1] + sum(c * (ranges[u] - 1) for u, c in zip(ranges, form[0]))
        return bool(sympy.expand(sum((n - 1) * st for n, st in zip(layout.size, layout.stride)) - top).is_nonnegative)

    # positions loaded at run time stay as they are, and so does what computes them: a value thrown away
    # is still bounds-checked where it is an index
    kept = {id(u) for v in walk(value) if isinstance(v, (Load, IndexValue)) and v.indirect
            for b in v.indirect for u in walk(b.value)}

    def leaf(v):
        if id(v) in kept or getattr(v, "indirect", ()):
            return v
        if isinstance(v, Load):  # each load on its own: one that would leave its buffer keeps its clamp
            new = attrs.evolve(v, index=unclamp(v.index))
            return new if new == v or inside(new) else v
        if isinstance(v, IndexValue):
            return attrs.evolve(v, expr=unclamp(v.expr))
        return v

    return rebuild(value, leaf)


class _Refused(Exception):
    pass


def _inline_cone(graph, ctx, node: Pointwise, blocked, max_ops: int, memo: dict | None = None) -> bool:
    """Move `node`, with the pointwise nodes only it reads, into its one reader, a Pointwise node that
    cannot fuse with it for a reason of shape and iterates more of its points, at most 9/8 of them (a pad);
    True when done (the cone's nodes, unread, go at the sweep's end)."""
    consumers = _shape_refused(graph, node, memo)
    if consumers is None or len(consumers) != 1 or not isinstance(consumers[0], Pointwise):
        return False
    consumer, = consumers
    # a pad of the node's rows to an aligned width (pad_linear: 30522 -> 30528 columns) computes its edge
    # points a few times over; a reader of many more points would recompute the cone. Readers of as many
    # points fuse with the node once merge_loops and fuse have matched their loops: left to them.
    if not (sympy.simplify(9 * node.numel - 8 * consumer.numel).is_nonnegative
            and sympy.simplify(consumer.numel - node.numel).is_positive):
        return False
    new = _moved(graph, consumer, node, _cone(graph, node, blocked), max_ops)
    if new is None or not ctx.decide("inline_cone", node, consumer):
        return False
    graph.replace_node(consumer.name, new)
    graph.remove_node(node.name)
    ctx.count("inlined_cone")
    return True


def _drop_unread(graph, names, outputs) -> None:
    """Remove the pointwise nodes among `names` that nothing reads any more (expanded into their readers) —
    never one that writes a graph input in place (`x.fill_(3)`: read by no node, it is the caller's result;
    found by fuzzing, the fill was lost)."""
    for name in reversed([n for n in graph.names() if n in names]):
        node = graph.node(name)
        if isinstance(node, Pointwise) and not node.mutates and node.output.name not in outputs \
                and not graph.consumers(node.output.name):
            graph.remove_node(name)


@register_pass("inline_pointwise", provides={"pointwise_inlined"})
def inline_pointwise(graph, ctx, *,
                     max_loads: Annotated[int, "most distinct loads in an inlined node's body", AtLeast(0)] = 1,
                     max_ops: Annotated[int, "most operations (casts included) in an inlined node's body",
                                             AtLeast(0)] = 4,
                     indirect_max_loads: Annotated[int, "most distinct loads of a node recomputed at indirect "
                                                   "positions (0: never)", AtLeast(0)] = 2,
                     broadcast_ratio: Annotated[int, "least ratio of a consumer's points to a broadcast node's "
                                                "(0: never inline broadcast values)", AtLeast(0)] = 8,
                     broadcast_max_loads: Annotated[int, "most distinct loads of a broadcast node, expanded",
                                                         AtLeast(0)] = 8,
                     broadcast_max_ops: Annotated[int, "most operations of a broadcast node, expanded",
                                                       AtLeast(0)] = 32,
                     input_max_ops: Annotated[int, "most operations of a value of one input point recomputed by "
                                              "its readers (0: never)", AtLeast(0)] = 4,
                     chain_max_ops: Annotated[int, "most operations of a chain down to one input point recomputed "
                                              "in readers that cannot fuse with it (0: never)", AtLeast(0)] = 16,
                     cone_max_values: Annotated[int, "most values of a node and the nodes only it reads, moved "
                                                "into its one reader of about its size (0: never)", AtLeast(0)] = 256):
    """Recompute cheap pointwise nodes inside consumers they cannot fuse with (a weight cast), at the
    positions a consumer reads them indirectly (log-softmax gathered at the target), values made from
    the inputs alone inside the bigger loops they are broadcast into (cross-entropy's per-row factors), and
    values of one input point in each of their readers (a saved `target == ignore_index` mask)."""
    outputs, mutated = graph.output_names(), graph.mutated_names()
    inputs = set(graph.input_buffers()) - mutated
    present = set(graph.names())  # the nodes an expansion may leave unread
    expanded = False  # some node was recomputed from the inputs (_from_inputs) in its readers
    for name in reversed(graph.names()):  # consumers first: a chain of such nodes goes in one sweep
        node = graph.node(name) if name in graph else None  # a consumer rewritten above is a new object
        if not isinstance(node, Pointwise) or node.output.name in mutated or mutated & set(node.read_names()):
            continue
        if node.output.name in outputs:  # stored anyway; its readers may still compute it themselves
            if input_max_ops and _inline_input_value(graph, ctx, node, inputs, outputs | mutated, input_max_ops,
                                                     broadcast_ratio, output=True):
                expanded = True
            continue
        if indirect_max_loads and _cheap(node, indirect_max_loads, max_ops) \
                and not any(getattr(v, "indirect", ()) for v in walk(node.body)):
            for c in graph.consumers(node.output.name):
                consumer = graph.node(c)
                new = _inlined_indirect(consumer, node, graph.bounds) \
                    if isinstance(consumer, (Pointwise, Reduction)) else None
                if new is not None and ctx.decide("inline_indirect", node, consumer):
                    graph.replace_node(c, new)
                    ctx.count("inlined_indirect")
            if not graph.consumers(node.output.name):
                graph.remove_node(node.name)  # every read was at indirect positions: nothing needs it stored
                continue
        memo: dict = {}  # this node's turn (_tried)
        if _inline_cheap(graph, ctx, node, max_loads, max_ops, memo):
            continue
        if broadcast_ratio and _inline_broadcast(graph, ctx, node, inputs, outputs | mutated, broadcast_ratio,
                                                 broadcast_max_loads, broadcast_max_ops, memo):
            expanded = True
        elif input_max_ops and _inline_input_value(graph, ctx, node, inputs, outputs | mutated, input_max_ops,
                                                   broadcast_ratio, output=False, memo=memo):
            expanded = True
        elif chain_max_ops and _inline_chain(graph, ctx, node, inputs, outputs | mutated, chain_max_ops, memo):
            expanded = True
        elif cone_max_values and _inline_cone(graph, ctx, node, outputs | mutated, cone_max_values, memo):
            expanded = True
    if expanded:
        _drop_unread(graph, present, outputs)
    return graph
