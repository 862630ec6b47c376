"""fuse — vertical and horizontal fusion of scheduler nodes into FusedNodes (one kernel each).

Vertical: a producer into its consumer — pointwise into pointwise, a pointwise prologue into a
reduction (computed inside the reduction loop), a pointwise epilogue after a reduction over the same
rows, a reduction into a reduction over the same rows (LayerNorm's mean, then variance).
Horizontal: independent nodes with the same iteration space that read a common buffer.
Small: independent nodes of at most `small` points each (outer times reduced) with the same iteration space,
whatever they read. They save no memory traffic, only launches: a kernel that small is one program whose
time is its launch, and a training step made of such kernels is bound by the host issuing them (every
BatchNorm's `num_batches_tracked += 1`, one point each: 20 launches of a ResNet-18's forward, now one). Such a
pair fuses only while both its groups are still that small when its turn comes (not into a large sum's kernel
as an epilogue, which would save nothing).

Candidates are pairs that share a buffer (horizontal ones within `window` consumers of each other in
program order), and small nodes within `window` small nodes of each other in program order. They are
tried best first — most bytes of memory traffic saved (none, for small ones: last), then closest in
program order — and each fusion is a counted decision. Groups keep growing within a round (a chain fuses in
one round); rounds repeat until nothing fuses, at most `max_rounds`. A pair refused only because a path
between them runs through other nodes is tried again after each later fusion of the round (those nodes
may have joined the producer's group), ahead of the pairs ranked below it: cross-entropy's gather of the
target logit joins the row statistics it subtracts, whatever dtype the logits were cast to.

Refusals, each recorded with its reason for `passline.explain`: extern calls; different devices;
different numel or loop structure; transposed reductions (left to mix_order_reduction); loop order
mismatch (left to reorder_loops); indexing mismatch; a per-row node reading an in-loop value; a cycle
(another path between the two); more than `max_nodes` members.
"""
from __future__ import annotations

import functools
from typing import Annotated

import sympy

from ..ir import Extern, FusedNode
from ..ir.index import VarKind, contiguous_strides, flat_walk, product, substitute
from ..ir.loops import canon_var, canonical_map, members, shape
from ..pipeline.registry import AtLeast, register_pass
from .legality import accesses_agree, can_fuse, fixed_layouts, fuse_nodes, merge_group, refuse, saved_bytes, split_group


def _name(graph, a, b) -> str:
    """A group keeps the name of the fused side with more edges (so the graph need not move them);
    a new group is named after its first node."""
    groups = [n for n in (a, b) if isinstance(n, FusedNode)]
    if len(groups) == 1:
        return groups[0].name
    if groups:
        return max(groups, key=lambda n: graph.degree(n.name)).name
    first = a if graph.order(a.name) <= graph.order(b.name) else b
    return f"fused_{first.name}"


def _find(alias: dict, n: str) -> str:
    """The group node `n` now belongs to: follow `alias` (fused name -> group name) to its end."""
    root = n
    while root in alias:
        root = alias[root]
    while n != root:  # path compression: later finds are one step
        alias[n], n = root, alias[n]
    return root


def _points(node) -> int | None:
    """A node's points (outer times reduced sizes), or None where a size is not a number."""
    outer, red = shape(node)
    n = sympy.sympify(product(tuple(outer) + tuple(red)))
    return int(n) if n.is_Integer else None


def _candidates(graph, vertical: bool, horizontal: bool, window: int, dirty, small: int = 0):
    """Pairs sharing a buffer, and pairs of small nodes (at most `small` points); after the first round only
    pairs with a node made in the last round (`dirty`): the verdict on two unchanged nodes cannot have
    changed. Also returns the pairs that are candidates only for being small."""
    order = graph.orders()
    pairs = set()
    tiny_pairs = set()
    if small:
        tiny = sorted((n for n, node in graph.items() if not isinstance(node, Extern)
                       and (p := _points(node)) is not None and p <= small), key=order.__getitem__)
        for i, a in enumerate(tiny):
            for b in tiny[i + 1:i + 1 + window]:
                if dirty is None or a in dirty or b in dirty:
                    tiny_pairs.add((a, b))
    if vertical:
        for u, v in graph.edges(dirty):
            pairs.add((u, v) if order[u] <= order[v] else (v, u))
    if horizontal:
        readers: dict[str, list[str]] = {}
        for n, node in graph.items():
            if isinstance(node, Extern):
                continue
            for b in node.read_names():
                readers.setdefault(b, []).append(n)
        for users in readers.values():
            users.sort(key=order.__getitem__)
            for i, a in enumerate(users):
                for b in users[i + 1:i + 1 + window]:
                    if dirty is None or a in dirty or b in dirty:
                        pairs.add((a, b))
    return pairs | tiny_pairs, tiny_pairs - pairs, order


def _quotient(big, small):
    """big / small where it is an integer for every value of the sizes' symbols (a polynomial with integer
    coefficients: (s0 * s1 * 4) / (s0 * 2) is 2 * s1), else None. A size function of the symbols (a
    pool's output height `s0//2`) is an integer of its own here, as a symbol is: (s1 * (s0//2)) / (s0//2)
    is s1."""
    big, small = sympy.sympify(big), sympy.sympify(small)
    opaque = {f: sympy.Dummy(integer=True, positive=True)
              for f in (big.atoms(sympy.Function) | small.atoms(sympy.Function))}
    back = {d: f for f, d in opaque.items()}
    q = sympy.cancel(big.xreplace(opaque) / small.xreplace(opaque))
    if q.is_Integer:
        return q
    if q.is_number or not q.is_polynomial(*q.free_symbols):
        return None
    poly = sympy.Poly(q, *sorted(q.free_symbols, key=str))
    if not all(c.is_Integer for c in poly.coeffs()):
        return None
    # factored, as products of sizes are written (torch's `s0*(h + 1)`, not `s0*h + s0`): the loops a split
    # gives then compare equal to the same sizes elsewhere (a column sum's rows, fused_shape's checks)
    return sympy.factor(q).xreplace(back)


@functools.lru_cache(maxsize=4096)  # asked again for each refused pair of the same nests (ms with symbols)
def common_loops(a: tuple, b: tuple) -> tuple | None:
    """The loops two flat nests of the same points both split into: sizes whose running products reach
    every boundary of either nest ((2, 5, 20) and (10, 5, 4): (2, 5, 5, 4); (s0, 5, 20) and (5*s0, 5, 4):
    (s0, 5, 5, 4)); None when the boundaries do not nest, for some value of the sizes' symbols."""
    def cuts(sizes):
        out, run = [], sympy.Integer(1)
        for size in sizes:
            run = sympy.expand(run * size)
            out.append(run)
        return out
    ca, cb = cuts(a), cuts(b)
    if not ca or not cb or sympy.expand(ca[-1] - cb[-1]) != 0:
        return None
    points = list(dict.fromkeys(ca + cb))  # each boundary once (expanded expressions compare exactly)
    # in a nest, every boundary divides the next: order them by how many others divide them
    divisors = {c: sum(_quotient(c, d) is not None for d in points) for c in points}
    loops, prev = [], sympy.Integer(1)
    for c in sorted(points, key=lambda c: divisors[c]):
        q = _quotient(c, prev)
        if q is None:
            return None
        loops.append(int(q) if q.is_Integer else q)
        prev = c
    return tuple(loops)


def _flat(node, other) -> bool:
    """Whether `node` walks every buffer it shares with `other` in its own loop order, point after point
    (each access `a * (the flat position in node's loops) + b`): the condition for two nests that merge one
    walk differently to meet at the same points once split to common loops. A transpose between them (the
    usual `loop order mismatch`) fails it, cheaply, before any split is built."""
    outer = shape(node)[0]
    names = [canon_var(VarKind.CANON_OUTER, k) for k in range(len(outer))]
    strides = contiguous_strides(outer)
    shared = (set(node.read_names()) | set(node.output_names())) & (set(other.read_names()) | set(other.output_names()))
    for m in members(node):
        exprs = [e for b in m.read_names() if b in shared for e in m.load_indices(b)]
        if m.output.name in shared:
            exprs.append(m.store_index())
        cmap = canonical_map(m, len(outer)) if exprs else None
        if any(flat_walk(substitute(e, cmap), names, strides) is None for e in exprs):
            return False
    return True


def _feeds_column_sum(graph, x, other) -> bool:
    """Whether pointwise `x` is read by a reduction (outside `other`) over x's own points with rows and
    columns swapped: a column sum, which mix_order_reduction runs with x as its column side. Split to
    `other`'s loops, x would no longer line up with it: ResNet's stem backward, a BatchNorm backward after
    the max-pool's gather, stored `grad * (x - mean)` for its column sum instead."""
    outer, red = shape(x)
    if red:
        return False
    inside = set(members(other)) if other is not None else set()
    for buf in x.output_names():
        for name in graph.consumers(buf):
            reader = graph.node(name)
            if reader is other or isinstance(reader, Extern) or inside & set(members(reader)):
                continue
            o, r = shape(reader)
            if r and tuple(r) + tuple(o) == tuple(outer):
                return True
    return False


def _lined_up(graph, na, nb, fixed: set):
    """(the nodes relooped, the verdict on the pair with them, the stat counting them) for the first side
    whose loops split to the other's nest; else for a pointwise side whose loops merge to a reduction's nest
    (`merge_group`: a [B, T, C] select backward, its index value of T and its broadcast over T kept from
    merge_loops, into the [B*T | C] LayerNorm backward reading it; indices that do not walk a merged run as
    one read its loops back by division, as Inductor's kernels do); else for both split to the loops they
    share (two pointwise groups that merge_loops left as different merges of one walk over memory: one
    reads a per-row value, the other a per-column one); None when none applies. A refusal then gives the
    deeper reason (an indexing mismatch)."""
    def judged(a, b, n_outer, detail, every=True):
        verdict = can_fuse(graph, a, b)
        if verdict.ok and not accesses_agree(a, b, n_outer, every):
            # exact, but the two would walk what they share at other points: nothing gained
            verdict = refuse("indexing mismatch", f"relooped to {detail}: shared buffers meet at other points")
        return verdict

    first = None
    # x's loops split to y's nest (exact, no division) first; merged only into a reduction's nest (which
    # cannot split; a pointwise y splits to x's nest instead), never to the nest x already has
    for reloop, stat in ((split_group, "split_loops"), (merge_group, "merged_to_reduction")):
        splits = reloop is split_group
        for x, y in ((na, nb), (nb, na)):
            outer, red = shape(y)
            # Not x read by a column sum over its own points: relooped, x would no longer line up with that
            # column side, which mix_order_reduction pairs with the row work (channels_last BatchNorm backward)
            if shape(x)[1] or outer + red == shape(x)[0] or not (splits or red) or _feeds_column_sum(graph, x, y):
                continue
            for target in ((outer + red, outer) if red else (outer,)):  # the nest itself, or its rows alone
                finer, coarser = (target, shape(x)[0]) if splits else (shape(x)[0], target)
                if common_loops(tuple(coarser), tuple(finer)) != tuple(finer) \
                        or (not splits and tuple(target) == tuple(shape(x)[0])):
                    continue  # no split (or merge) of one nest into the other (checked cheaply, memoized)
                new = reloop(x, target, fixed)
                if new is None:
                    continue
                verdict = judged(*((new, y) if x is na else (y, new)), len(outer), list(target), splits)
                if verdict.ok:
                    return [new], verdict, stat
                first = first or ([new], verdict, stat)
    (oa, ra), (ob, rb) = shape(na), shape(nb)
    target = None if ra or rb else common_loops(tuple(oa), tuple(ob))
    if target is None or target in (tuple(oa), tuple(ob)) or not (_flat(na, nb) and _flat(nb, na)) \
            or _feeds_column_sum(graph, na, nb) or _feeds_column_sum(graph, nb, na):
        return first
    new_a, new_b = split_group(na, target, fixed), split_group(nb, target, fixed)
    if new_a is None or new_b is None:
        return first
    both = [new_a, new_b], judged(new_a, new_b, len(target), list(target)), "split_loops"
    return both if both[1].ok or first is None else first


def _round(graph, ctx, ranked, fixed, refused: set, max_nodes: int, small: int) -> set:
    """Fuse `ranked` pairs, best first; the groups made (`refused` collects the pairs whose refusal is
    recorded). A pair that is a candidate only for being small fuses only while both its groups still are
    (at most `small` points): by its turn one side may have joined a large reduction's group, which a
    one-point write would then ride as an epilogue for no saving — and a kernel holding an in-place write
    is neither timed nor mixed."""
    alias: dict[str, str] = {}
    made: set = set()
    # pairs refused only for a path between them through other nodes, in rank order: once those nodes
    # join one side's group the path is gone, so each is tried again after a fusion that touches it, before
    # any pair ranked below it (cross-entropy's gather of the target logit ranks above the row statistics
    # it subtracts being one group, and would otherwise fuse for less, wherever the cast order put it)
    blocked: list = []

    def attempt(a, b, first_try: bool, only_small: bool = False) -> str | None:
        """The group made of a's and b's, or None (refused: recorded on the first try)."""
        a, b = _find(alias, a), _find(alias, b)
        if a == b:
            return None
        na, nb = graph.node(a), graph.node(b)
        if len(members(na)) + len(members(nb)) > max_nodes:
            return None  # the cap: not worth a refusal record per pair
        if only_small and not all((p := _points(n)) is not None and p <= small for n in (na, nb)):
            return None  # a side grew past small this round: no longer a candidate
        verdict = can_fuse(graph, na, nb, max_nodes)
        # other loops: a split (or a merge into a reduction's nest) may line them up. Sizes that are a
        # permutation of each other look like a transpose ((2, 3, 6) against (6, 2, 3)) yet may be two merges
        # of one walk: tried too, and where no split fuses them the transpose verdict stands (reorder_loops' cue)
        if not verdict.ok and verdict.reason in ("loop structure", "loop order mismatch"):
            lined = _lined_up(graph, na, nb, fixed)
            if lined is not None and not lined[1].ok and verdict.reason == "loop order mismatch":
                lined = None
            if lined is not None and lined[1].ok:
                split, verdict, stat = lined
                for new in split:
                    graph.replace_node(new.name, new)
                    na, nb = (new, nb) if new.name == na.name else (na, new)
                    ctx.count(stat)
            elif lined is not None:
                verdict = lined[1]
        if not verdict.ok:
            if first_try and verdict.reason == "cycle" and verdict.producer is not None:
                blocked.append((a, b))
            if first_try and (a, b) not in refused:
                refused.add((a, b))
                ctx.refuse(verdict.reason, na, nb, verdict.detail)
            return None
        if not ctx.decide("fuse", na, nb):
            return None
        if verdict.producer is not None:
            first, second = (na, nb) if verdict.producer is na else (nb, na)
        else:
            first, second = (na, nb) if graph.order(a) <= graph.order(b) else (nb, na)
        group = fuse_nodes(_name(graph, na, nb), first, second, *verdict.shape)
        graph.merge([a, b], group)
        alias[a] = alias[b] = group.name
        alias.pop(group.name, None)
        made.discard(a)
        made.discard(b)
        made.add(group.name)
        ctx.count("fusions")
        return group.name

    for _, _, _, a, b, only_small in ranked:
        group = attempt(a, b, True, only_small)
        while group and blocked:
            # the path of a blocked pair closes only when its nodes join one side's group: retry those
            # pairs that have a side in the new group, best first
            retry = [k for k, (p, c) in enumerate(blocked) if group in (_find(alias, p), _find(alias, c))]
            group = None
            for k in retry:
                group = attempt(*blocked[k], False)
                if group:
                    del blocked[k]
                    break
    return made


@register_pass("fuse", provides={"fused"})
def fuse(graph, ctx, *,
         max_nodes: Annotated[int, "most nodes in one fused kernel", AtLeast(1)] = 64,
         vertical: Annotated[bool, "fuse producers into consumers"] = True,
         horizontal: Annotated[bool, "fuse independent nodes that share an input"] = True,
         window: Annotated[int, "horizontal candidates: how many later readers of a buffer (or small nodes) to "
                                "pair with", AtLeast(0)] = 4,
         small: Annotated[int, "fuse independent nodes of at most this many points (launches saved; 0: none)",
                               AtLeast(0)] = 1,
         max_rounds: Annotated[int, "rounds of candidate collection", AtLeast(0)] = 10):
    """Fuse producer/consumer and sibling nodes into single kernels, best memory savings first."""
    refused: set = set()
    dirty = None
    fixed = fixed_layouts(graph)
    for _ in range(max_rounds):
        pairs, tiny_only, order = _candidates(graph, vertical, horizontal, window, dirty, small)
        outputs = graph.output_names()
        nbytes = {name: buf.nbytes for name, buf in graph.buffers().items()}
        io = {n: (set(node.read_names()), node.output_names()) for n, node in graph.items()
              if not isinstance(node, Extern)}
        ranked = [(-saved_bytes(graph, a, b, io, nbytes, outputs), abs(order[a] - order[b]), order[a], a, b,
                   (a, b) in tiny_only) for a, b in pairs if a in io and b in io]
        ranked.sort()
        made = _round(graph, ctx, ranked, fixed, refused, max_nodes, small)
        if not made:
            break
        dirty = made
    return graph
