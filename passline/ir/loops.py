"""Loop-nest facts the scheduling passes share: canonical loop variables, a node's role in a group,
and whether two accesses to a buffer meet at the same point.

Canonical variables drop size-1 loops and name the rest by position: `o0, o1, ...` for a group's outer
loops and `q0, q1, ...` for its reduction loops. Two nodes line up when their accesses to a shared
buffer are the same expression in canonical variables.
"""
from __future__ import annotations

import attrs
import sympy

from .body import IndexValue, Load, rebuild, substitute_index
from .index import (
    CANONICAL_KINDS,
    FloorDiv,
    ModularIndexing,
    StrEnum,
    VarKind,
    as_strided_form,
    is_indirect,
    loop_vars,
    substitute,
    var,
    var_info,
)
from .nodes import MixOrderNode, Pointwise, Reduction, _group_shape, members

__all__ = ["Role", "role", "canon_var", "is_canonical", "transposed", "members", "shape", "canonical_map",
           "canonical_sizes", "Access", "store_access", "read_accesses", "compare", "permute_pointwise",
           "access_problem", "group_problem", "split_pointwise", "merge_pointwise"]


def canon_var(prefix: VarKind | str, k: int) -> sympy.Symbol:
    """Canonical variable `k` of a group: `VarKind.CANON_OUTER` (`o*`) or `VarKind.CANON_REDUCTION` (`q*`)."""
    return var(prefix, k)


def is_canonical(sym) -> bool:
    """Is `sym` one of a group's canonical loop variables (o* or q*)?"""
    info = var_info(sym)
    return info is not None and info.kind in CANONICAL_KINDS


def transposed(sym) -> sympy.Symbol:
    """The canonical variable at the same position on the other side of the nest: o_k <-> q_k (a column
    member's outer loops are its kernel's reduction loops). Any other variable maps to o_k."""
    kind, k = var_info(sym)
    return var(VarKind.CANON_OUTER if kind is not VarKind.CANON_OUTER else VarKind.CANON_REDUCTION, k)


class Role(StrEnum):
    """How a member runs in a group over (outer | red); see `role`."""

    INNER = "inner"  # each point of outer+red, inside the reduction loop
    OUTER = "outer"  # each point of outer, after the reductions
    REDUCTION = "reduction"  # a reduction over red, for each point of outer


def shape(node) -> tuple:
    """(outer sizes, reduction sizes) of a node or group, size-1 loops dropped; () reduction sizes for
    pointwise work."""
    if isinstance(node, MixOrderNode):
        return _group_shape(node.row)
    return _group_shape(node)


def role(member, outer: tuple, red: tuple) -> Role | None:
    """How `member` runs in a group over (outer | red): Role.INNER (each point of outer+red, inside the
    reduction loop), Role.OUTER (each point of outer, after the reductions), Role.REDUCTION, or None."""
    o, r = _group_shape(member)
    if isinstance(member, Reduction):
        return Role.REDUCTION if (o, r) == (tuple(outer), tuple(red)) else None
    if o == tuple(outer) + tuple(red):
        return Role.INNER
    if red and o == tuple(outer):
        return Role.OUTER
    return None


def canonical_map(member, n_outer: int) -> dict:
    """Substitution from the member's loop variables to canonical ones; size-1 loops become 0.
    For a Pointwise member the first `n_outer` non-unit loops are outer (o*), the rest reduction (q*)."""
    mapping = {}
    k = 0
    for v, s in zip(loop_vars(VarKind.OUTER, len(member.ranges)), member.ranges):
        if s == 1:
            mapping[v] = sympy.S.Zero
        else:
            mapping[v] = (var(VarKind.CANON_OUTER, k) if k < n_outer or isinstance(member, Reduction)
                          else var(VarKind.CANON_REDUCTION, k - n_outer))
            k += 1
    if isinstance(member, Reduction):
        j = 0
        for v, s in zip(loop_vars(VarKind.REDUCTION, len(member.reduction_ranges)), member.reduction_ranges):
            mapping[v] = sympy.S.Zero if s == 1 else var(VarKind.CANON_REDUCTION, j)
            j += 1 if s != 1 else 0
    return mapping


def canonical_sizes(member, n_outer: int) -> dict:
    """Canonical variable -> loop size."""
    m = canonical_map(member, n_outer)
    sizes = dict(zip(loop_vars(VarKind.OUTER, len(member.ranges)), member.ranges))
    if isinstance(member, Reduction):
        sizes.update(zip(loop_vars(VarKind.REDUCTION, len(member.reduction_ranges)), member.reduction_ranges))
    return {c: sizes[v] for v, c in m.items() if isinstance(c, sympy.Symbol)}


@attrs.frozen(eq=False)
class Access:
    """One access to a buffer in canonical variables."""

    index: sympy.Expr
    sizes: dict  # canonical var -> size


def store_access(member, n_outer: int) -> Access:
    memo = member.memo()
    key = ("store", n_outer)
    if key not in memo:
        memo[key] = Access(sympy.expand(substitute(_store_index(member), canonical_map(member, n_outer))),
                           canonical_sizes(member, n_outer))
    return memo[key]


def read_accesses(member, buffer: str, n_outer: int) -> tuple:
    memo = member.memo()
    key = ("read", buffer, n_outer)
    if key not in memo:
        m = canonical_map(member, n_outer)
        sizes = canonical_sizes(member, n_outer)
        memo[key] = tuple(Access(sympy.expand(ix.xreplace(m)), sizes) for ix in member.load_indices(buffer))
    return memo[key]


def compare(store: Access, read: Access):
    """"same" when the read meets the store point for point; ("permuted", {read var: store var}) when it
    does with the loops in another order; "different" otherwise."""
    if is_indirect(read.index) or is_indirect(store.index):
        return "different"  # a position known only at run time meets no loop point
    if store.index == read.index or sympy.expand(store.index - read.index) == 0:
        return "same"
    s_form = as_strided_form(store.index, list(store.sizes))
    r_form = as_strided_form(read.index, list(read.sizes))
    if s_form is None or r_form is None or sympy.expand(s_form[1] - r_form[1]) != 0:
        return "different"
    by_coef = {}
    for v, c in zip(store.sizes, s_form[0]):
        if c != 0:
            by_coef.setdefault(c, []).append(v)
    mapping = {}
    for v, c in zip(read.sizes, r_form[0]):
        if c == 0:
            continue
        candidates = [s for s in by_coef.get(c, []) if s not in mapping.values() and store.sizes[s] == read.sizes[v]]
        if not candidates:
            return "different"
        mapping[v] = candidates[0]
    if len(mapping) != sum(1 for c in s_form[0] if c != 0):
        return "different"
    return "permuted", mapping


def permute_pointwise(node: Pointwise, order: list[int]) -> Pointwise:
    """The same node with its loops run in `order` (new loop j is old loop order[j]); what it computes
    and where it stores are unchanged."""
    old = loop_vars(VarKind.OUTER, len(node.ranges))
    new = loop_vars(VarKind.OUTER, len(node.ranges))
    tmp = loop_vars(VarKind.TEMP, len(old))
    # old var order[j] becomes new var j (through temporaries so the renaming is simultaneous)
    body = substitute_index(node.body, {old[order[j]]: tmp[j] for j in range(len(old))})
    body = substitute_index(body, {tmp[j]: new[j] for j in range(len(old))})
    where = {o: j for j, o in enumerate(order)}
    permutation = tuple(where[p] for p in node.permutation)
    return attrs.evolve(node, ranges=tuple(node.ranges[o] for o in order), body=body, permutation=permutation)


def access_problem(writers, readers, outer, red, written=None):
    """(reason, detail) when a member of `readers` reads a buffer a member of `writers` writes at other
    points than it is written in the loop nest (outer | red), or reads an in-loop value after the
    reductions; None when every such read meets its write point for point. `written` ({buffer: writer
    member}) may be passed by a caller that already has it. A member writing a graph input in place
    counts as writing it: a reader of the input's old value in its kernel must read it at the point the
    write overwrites (each program loads it before storing there)."""
    n = len(outer)
    if written is None:
        written = {m.output.name: m for m in writers}
    for c in readers:
        crossing = [b for b in c.read_names() if b in written]
        if not crossing:
            continue
        rc = role(c, outer, red)
        for buf in crossing:
            p = written[buf]
            if p is c:
                continue
            if role(p, outer, red) is Role.INNER and rc is Role.OUTER:
                return "inner read after reduction", f"{c.name} reads {buf} from {p.name}"
            if _same_nest(p, c) and all(ix == _store_index(p) for ix in c.load_indices(buf)):
                continue  # identical loop nests and identical indices: the same point, no algebra needed
            store = store_access(p, n)
            for read in read_accesses(c, buf, n):
                verdict = compare(store, read)
                if verdict == "same":
                    continue
                reason = "indexing mismatch" if verdict == "different" else "loop order mismatch"
                return reason, f"{c.name} reads {buf}[{read.index}], {p.name} writes {buf}[{store.index}]"
    return None


def _same_nest(a, b) -> bool:
    return (type(a) is type(b) and a.ranges == b.ranges
            and getattr(a, "reduction_ranges", ()) == getattr(b, "reduction_ranges", ()))


def _store_index(node) -> sympy.Expr:
    memo = node.memo()
    if "store_index" not in memo:
        memo["store_index"] = node.store_index()
    return memo["store_index"]


def group_problem(group) -> str | None:
    """What is wrong with a FusedNode's structure, or None: every member must fit the loop nest, come
    after the members it reads, and read them only at the points they write."""
    outer, red = group.ranges, group.reduction_ranges
    seen: set = set()
    outputs = {b for m in group.nodes for b in m.output_names()}
    for m in group.nodes:
        if role(m, outer, red) is None:
            return f"member {m.name} {_group_shape(m)} does not fit the loop nest {outer}|{red}"
        early = [b for b in m.read_names() if b in outputs and b not in seen]
        if early:
            return f"member {m.name} reads {early[0]} before the member writing it"
        seen.update(m.output_names())
    problem = access_problem(group.nodes, group.nodes, outer, red)
    return f"{problem[0]}: {problem[1]}" if problem else None


def split_pointwise(node: Pointwise, target: tuple) -> Pointwise | None:
    """The same node with its loops split into `target`'s: each of its loops of size > 1 becomes a run
    of consecutive target loops whose sizes multiply to its size (i = j_1 * (t_2 ... t_m) + ... + j_m, no
    division), size-1 loops go; its output buffer is described with the split dims (same storage, same
    addresses). None when `target` (sizes > 1) does not refine the node's loops this way, or the loops
    were reordered. Used by fuse to line a flat pointwise node up with the loop nest it fuses into."""
    if not _plain(node):
        return None
    target = tuple(sympy.sympify(t) for t in target)
    new_vars = loop_vars(VarKind.OUTER, len(target))
    lay = node.output.layout
    loops = [(k, v, n) for k, (v, n) in enumerate(zip(node.vars, node.ranges)) if n != 1]
    runs = _runs([n for _, _, n in loops], target)
    if runs is None:
        return None
    mapping = {v: sympy.S.Zero for v, n in zip(node.vars, node.ranges) if n == 1}
    size, stride = [], []
    for (k, v, _), run in zip(loops, runs):
        expr, inner, strides = sympy.S.Zero, sympy.S.One, []
        for t in reversed(run):  # innermost first: j_m, then j_(m-1) * t_m, ...
            expr += new_vars[t] * inner
            strides.append(lay.stride[k] * inner)
            inner *= target[t]
        mapping[v] = expr
        size += [target[t] for t in run]
        stride += reversed(strides)
    out = attrs.evolve(node.output, layout=attrs.evolve(lay, size=tuple(size), stride=tuple(stride)))
    return attrs.evolve(node, ranges=target, body=substitute_index(node.body, mapping), output=out,
                        permutation=tuple(range(len(target))))


def merge_pointwise(node: Pointwise, target: tuple) -> Pointwise | None:
    """The same node with runs of its loops merged into `target`'s (the reverse of `split_pointwise`): each
    target loop takes a run of consecutive loops whose sizes multiply to its size, size-1 loops go. An index
    that walks a run as one (strides c_k == c_(k+1) * n_(k+1): a contiguous load, the store) takes the merged
    variable J in the innermost's place, no division; any other (a broadcast over part of the run, an index
    value of one of its loops) reads the run's loops back from J: v_1 = J // (n_2 ... n_m), v_k = (J //
    (n_(k+1) ... n_m)) % n_k — what Inductor's kernels compute for a [B, T, C] node fused into a [B*T | C]
    reduction (a class token's select backward into a LayerNorm backward). None when `target` is no merge
    of the node's loops, the loops were reordered, or the store does not walk a run as one (the output is
    re-described with the merged dims: same storage, same addresses)."""
    if not _plain(node):
        return None
    lay = node.output.layout
    target = tuple(sympy.sympify(t) for t in target)
    new_vars = loop_vars(VarKind.OUTER, len(target))
    loops = [(k, v, n) for k, (v, n) in enumerate(zip(node.vars, node.ranges)) if n != 1]
    positions = _runs(target, [n for _, _, n in loops])
    if positions is None:
        return None
    runs = [[loops[p] for p in run] for run in positions]
    unit = {v: sympy.S.Zero for v, n in zip(node.vars, node.ranges) if n == 1}
    every = set(node.vars)
    affine, divided = dict(unit), dict(unit)
    for J, run in zip(new_vars, runs):
        inner = sympy.S.One
        for pos in range(len(run) - 1, -1, -1):  # innermost first
            _, v, n = run[pos]
            affine[v] = J if pos == len(run) - 1 else sympy.S.Zero
            divided[v] = FloorDiv(J, inner) if pos == 0 else ModularIndexing(J, inner, n)
            inner *= n

    def walks_as_one(expr, run) -> bool:
        form = as_strided_form(expr, [v for _, v, _ in run])
        if form is None or any(c.free_symbols & every for c in form[0]):
            return False
        return all(sympy.expand(form[0][p] - form[0][p + 1] * run[p + 1][2]) == 0 for p in range(len(run) - 1))

    def merged(expr):
        mapping = dict(unit)
        for run in runs:
            side = affine if walks_as_one(expr, run) else divided
            mapping.update({v: side[v] for _, v, _ in run})
        return substitute(expr, mapping)

    if not all(walks_as_one(node.store_index(), run) for run in runs):
        return None

    def leaf(value):
        if isinstance(value, Load):
            return attrs.evolve(value, index=merged(value.index))
        if isinstance(value, IndexValue):
            return attrs.evolve(value, expr=merged(value.expr))
        return value

    size = tuple(target)
    stride = tuple(lay.stride[run[-1][0]] for run in runs)
    out = attrs.evolve(node.output, layout=attrs.evolve(lay, size=size, stride=stride))
    return attrs.evolve(node, ranges=target, body=rebuild(node.body, leaf), output=out,
                        permutation=tuple(range(len(target))))


def _plain(node: Pointwise) -> bool:
    """Whether a node's loops are in its store order with one output dim each: what splitting or merging them
    re-describes the output by."""
    in_order = tuple(node.permutation) == tuple(range(len(node.ranges)))
    return in_order and len(node.output.layout.size) == len(node.ranges)


def _runs(coarse, fine) -> list | None:
    """For each size of `coarse` in turn, the positions of the consecutive sizes of `fine` that multiply to it
    (sizes > 1, symbolic ones compared expanded); None when `fine` is no such refinement of `coarse`."""
    runs, j = [], 0
    for c in coarse:
        run, prod = [], sympy.S.One
        while j < len(fine) and sympy.expand(prod - c) != 0:
            run.append(j)
            prod *= fine[j]
            j += 1
        if not run or sympy.expand(prod - c) != 0:
            return None
        runs.append(run)
    return runs if j == len(fine) else None
