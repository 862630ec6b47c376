"""When two scheduler nodes may run as one kernel — the rules fuse, reorder_loops and
mix_order_reduction share. Not a pass itself.

Each refusal has a reason from REASONS, so `passline.explain` can say why two nodes stayed apart.
"""
from __future__ import annotations

from typing import NamedTuple

import sympy

from ..ir import Extern, FusedNode, MixOrderNode, Pointwise, Scatter
from ..ir.body import loads
from ..ir.index import product, substitute
from ..ir.loops import (
    access_problem,
    canonical_map,
    is_canonical,
    members,
    merge_pointwise,
    shape,
    split_pointwise,
    transposed,
)

REASONS = {
    "extern": "one of them is an extern call (aten runs it, nothing to fuse)",
    "mix-order": "one of them is already a mix-order reduction",
    "scatter": "one of them writes at positions known only at run time (a scatter: its own kernel)",
    "device": "they run on different devices",
    "too large": "the fused node would exceed max_nodes",
    "different numel": "their iteration spaces have different sizes",
    "loop structure": "same number of points, but the loops have different sizes",
    "transposed reductions": "reductions with transposed (numel, rnumel): a mix-order candidate",
    "loop order mismatch": "they walk a shared buffer in different loop orders (reorder_loops can fix this)",
    "indexing mismatch": "a shared buffer is read at other points than it is written",
    "inner read after reduction": "a per-row node would read a value computed inside the reduction loop",
    "cycle": "another path connects them: fusing would create a cycle",
    "mix-order gate": "a row and a column reduction that mix_order_reduction's gates kept apart",
    "in place": "one overwrites a graph input the other reads after the write, writes too, or reads at "
                "other points than written",
}


class Verdict(NamedTuple):  # a tuple: built once per pair tried, thousands of times per pass
    ok: bool
    reason: str = ""
    detail: str = ""
    shape: tuple = ((), ())  # the fused group's (outer, reduction) sizes when ok
    producer: object = None  # which side produces what the other reads (None: horizontal)


# the narrowest column block a coalesced column reduction runs (16 columns: a whole 32-byte sector even
# in 16-bit types); backends/triton/configs.py `rule` never goes below it. split_reductions counts a column
# reduction's programs by it; mix_order_reduction's column form wants one for every SM
COLUMN_BLOCK = 16

# The widest rows mix_order_reduction mixes, in the bytes a row takes in registers (`row_bytes`): its kernel
# holds a block of every column, and recompute_columns leaves narrower rows to it. What fits follows from
# elements, not from the input's bytes: values are float32 in registers whatever the input's dtype (see row_bytes).
MIX_ROW_BYTES = 32768


def row_bytes(columns: int, itemsize: int) -> int:
    """Bytes a row of `columns` elements takes in a kernel's registers: at least 4 an element, since loads of
    narrower dtypes are computed in float32 (8 for float64). A row of 8192 float32 or bfloat16 takes 32 KB."""
    return int(columns) * max(4, itemsize)


def refuse(reason: str, detail: str = "") -> Verdict:
    assert reason in REASONS, reason
    return Verdict(False, reason, detail)


def _fmt(sizes) -> str:
    return "[" + ", ".join(map(str, sizes)) + "]"


def fused_shape(a, b):
    """The (outer, reduction) sizes a group of a and b would have, or a refusal Verdict."""
    (oa, ra), (ob, rb) = shape(a), shape(b)
    if (oa, ra) == (ob, rb) or (ra and not rb and ob in (oa + ra, oa)) or (rb and not ra and oa in (ob + rb, ob)):
        return (oa, ra) if ra else (ob, rb)  # the common cases, without building a description
    desc = f"{_fmt(oa)}|{_fmt(ra)} vs {_fmt(ob)}|{_fmt(rb)}"
    if ra and rb:
        if (oa, ra) == (ob, rb):
            return oa, ra
        if (oa, ra) == (rb, ob):
            return refuse("transposed reductions", desc)
        return refuse("different numel" if product(oa + ra) != product(ob + rb) or product(oa) != product(ob)
                      else "loop structure", desc)
    if rb and not ra:
        (oa, ra), (ob, rb) = (ob, rb), (oa, ra)
    if ra:  # a is a reduction group, b pointwise
        if ob == oa + ra or ob == oa:
            return oa, ra
        if sorted(map(str, ob)) == sorted(map(str, oa + ra)):
            return refuse("loop order mismatch", desc)
        full, outer = product(oa + ra), product(oa)
        n = product(ob)
        return refuse("loop structure" if sympy.simplify(n - full) == 0 or sympy.simplify(n - outer) == 0
                      else "different numel", desc)
    if oa == ob:
        return oa, ()
    if sorted(map(str, oa)) == sorted(map(str, ob)):
        return refuse("loop order mismatch", desc)
    return refuse("loop structure" if sympy.simplify(product(oa) - product(ob)) == 0 else "different numel", desc)


def _device(node):
    return members(node)[0].output.layout.device


def _reads_from(consumer, producer) -> bool:
    return not set(consumer.read_names()).isdisjoint(producer.output_names())


def check_accesses(producer, consumer, outer, red) -> Verdict | None:
    """Every read by `consumer`'s members of a buffer `producer`'s members write must meet the write
    point for point in the fused loop nest; None when they all do."""
    written = {b: m for m in members(producer) for b in m.output_names()}
    problem = access_problem(members(producer), members(consumer), outer, red, written)
    return refuse(*problem) if problem else None


def _overwrites(writer, reader) -> set:
    """Graph inputs `writer` overwrites in place that `reader` reads."""
    return set(writer.mutates) & set(reader.read_names()) if writer.mutates else set()


def check_in_place(graph, writer, reader, outer, red) -> Verdict | None:
    """May `reader` (which reads inputs `writer` overwrites) join `writer`'s kernel? Only as a reader of
    the old values, running before the write (a path leads from it to the writer), reading each at the
    point the write overwrites: every program then loads its elements before it stores them. A read of
    the new value could be issued before the store (loads are prefetched), anywhere else another
    program may already have overwritten it."""
    shared = _overwrites(writer, reader)
    if not shared:
        return None
    if not graph.has_path(reader.name, writer.name):
        return refuse("in place", f"{reader.name} reads {min(shared)} after {writer.name} overwrites it")
    written = {m.output.name: m for m in members(writer) if m.mutates}
    problem = access_problem(members(writer), members(reader), outer, red, written)
    return refuse("in place", problem[1]) if problem else None


def other_path(graph, src: str, dst: str, direct_ok: bool = True) -> bool:
    """Is there a path src → ... → dst through at least one other node (any path when not `direct_ok`)?"""
    return graph.has_other_path(src, dst, direct_ok)


def can_fuse(graph, a, b, max_nodes: int = 64) -> Verdict:
    """May nodes `a` and `b` (already in `graph`) become one FusedNode?"""
    for n in (a, b):
        if isinstance(n, Extern):
            return refuse("extern", n.name)
        if isinstance(n, MixOrderNode):
            return refuse("mix-order", n.name)
        if isinstance(n, Scatter):
            return refuse("scatter", n.name)
    da, db = _device(a), _device(b)
    if da != db:
        return refuse("device", f"{da} vs {db}")
    na, nb = len(members(a)), len(members(b))
    if na + nb > max_nodes:
        return refuse("too large", f"{na} + {nb} > {max_nodes}")
    fs = fused_shape(a, b)
    if isinstance(fs, Verdict):
        return fs
    outer, red = fs
    if red and len(outer) == len(red) and tuple(outer) == tuple(red):
        crossed = _crossed_reads(a, b, len(outer))
        if crossed:  # a square matrix: equal sizes, yet one reduces over the other's rows
            return refuse("transposed reductions", f"both read {crossed} with their loops swapped")
    if set(a.mutates) & set(b.mutates):
        return refuse("in place", f"both overwrite {min(set(a.mutates) & set(b.mutates))}")
    for w, r in ((a, b), (b, a)):
        if _overwrites(w, r) and _reads_from(r, w):  # r runs after w: it would read the new values
            return refuse("in place", f"{r.name} reads {min(_overwrites(w, r))} after {w.name} overwrites it")
    # a reader of an input's old value runs before the node overwriting the input: ordered as a producer
    # before its consumer (check_in_place refuses a reader of the new value)
    a_to_b, b_to_a = _reads_from(b, a) or bool(_overwrites(b, a)), _reads_from(a, b) or bool(_overwrites(a, b))
    if a_to_b and b_to_a:
        return refuse("cycle", "each reads the other")
    if a_to_b or b_to_a:
        producer, consumer = (a, b) if a_to_b else (b, a)
        bad = check_accesses(producer, consumer, outer, red) or \
            check_in_place(graph, consumer, producer, outer, red)
        if bad is not None:
            return bad
        if other_path(graph, producer.name, consumer.name):
            # producer named: the path may later join one side's group (fuse then tries the pair again)
            return refuse("cycle", f"a path leads from {producer.name} to {consumer.name} through other nodes"
                          )._replace(producer=producer)
    elif other_path(graph, a.name, b.name, False) or other_path(graph, b.name, a.name, False):
        return refuse("cycle", "one depends on the other through other nodes")
    return Verdict(True, shape=(outer, red), producer=producer if (a_to_b or b_to_a) else None)


def _crossed_reads(a, b, n_outer: int) -> str | None:
    """A buffer that a reduction member of `a` and one of `b` (or their pointwise work) read with the outer
    and reduction loops swapped — a row sum and a column sum of a square matrix, whose sizes alone look
    alike: fused, the column sum's loads would walk memory with a stride of a row. None when there is
    none."""
    def reads(node):
        out = {}
        for m in members(node):
            cmap = canonical_map(m, n_outer)
            for ld in loads(m.body):
                if not ld.indirect:
                    out.setdefault(ld.buffer, set()).add(sympy.expand(substitute(ld.index, cmap)))
        return out

    ra, rb = reads(a), reads(b)
    for buf in set(ra) & set(rb):
        for ix in ra[buf]:
            syms = {s for s in ix.free_symbols if is_canonical(s)}
            swapped = sympy.expand(ix.xreplace({s: transposed(s) for s in syms}))
            if swapped != ix and swapped in rb[buf] and ix not in rb[buf]:
                return buf
    return None


def fuse_nodes(name: str, first, second, outer, red) -> FusedNode:
    """A FusedNode running `first`'s members, then `second`'s (its buffers and origins combined from
    the two sides rather than recomputed over every member)."""
    outputs = first.output_names() + second.output_names()
    inside = set(outputs)
    reads = tuple(dict.fromkeys(b for b in first.read_names() + second.read_names() if b not in inside))
    origins = tuple(dict.fromkeys(first.origins + second.origins))
    return FusedNode(name, members(first) + members(second), outer, red, origins,
                     outputs=outputs, reads=reads)


def saved_bytes(graph, a: str, b: str, io: dict, nbytes: dict, outputs) -> int:
    """Memory traffic fusing nodes a and b would save: a buffer passed between them is not written and
    read back (or read twice); a buffer both read is read once. `io[name]` = (read names as a set,
    output names), `nbytes[buffer]` = its size in bytes, `outputs` = graph.output_names(); the caller
    computes them once per round."""
    (ra, oa), (rb, ob) = io[a], io[b]
    total = sum(map(nbytes.__getitem__, ra & rb))
    for outs, reads in ((oa, rb), (ob, ra)):
        for name in outs:
            if name in reads:
                readers = graph.readers(name)
                others = len(readers) - (a in readers) - (b in readers)
                total += 2 * nbytes[name] if not others and name not in outputs else nbytes[name]
    if isinstance(total, int):
        return total
    total = sympy.sympify(total)  # symbolic sizes: rank by the expression at size 64
    return int(total.subs({s: 64 for s in total.free_symbols}))


def fixed_layouts(graph) -> set:
    """Buffers whose layout is not the graph's to re-describe (merge_loops, split_group): its inputs, and
    buffers written in place (a scatter's, a mutated input's), whose other writers keep the old one."""
    return set(graph.input_buffers()) | graph.mutated_names()


def split_group(node, target: tuple, fixed: set):
    """`node` (a Pointwise node, or a group of Pointwise nodes over the same loops) with its loops split
    into `target`'s, or None. merge_loops leaves pointwise work as flat as its indices allow, so a flat
    node meets a loop nest it can join (a cast over [B*T*V] before a reduction over [B*T | V], in fuse; a
    mix-order row side) by splitting its loops, which is exact (no division). `fixed`: buffers whose
    layout is not the graph's to re-describe (inputs, buffers written in place)."""
    return _each_member(node, target, fixed, split_pointwise)


def merge_group(node, target: tuple, fixed: set):
    """`node` (as for `split_group`) with runs of its loops merged into `target`'s (`merge_pointwise`:
    indices that do not walk a run as one read its loops back by division), or None. The other way round
    from `split_group`, for a nest that cannot split: a reduction over [B*T | C] and the [B, T, C] pointwise
    work it reads (an index value of T, a broadcast over it keep merge_loops from merging that work)."""
    return _each_member(node, target, fixed, merge_pointwise)


def _each_member(node, target: tuple, fixed: set, reloop):
    group = members(node)
    if not all(type(m) is Pointwise and m.output.name not in fixed for m in group):
        return None
    new = [reloop(m, target) for m in group]
    if any(m is None for m in new):
        return None
    if not isinstance(node, FusedNode):
        return new[0]
    return FusedNode(node.name, tuple(new), target, (), node.origins)


def _accesses(node, n_outer: int) -> dict:
    """{buffer: indices at which `node`'s members read or write it}, in the canonical loop variables of
    a nest with `n_outer` outer loops."""
    out: dict = {}
    for m in members(node):
        cm = canonical_map(m, n_outer)
        for b in m.read_names():
            out.setdefault(b, set()).update(sympy.expand(substitute(e, cm)) for e in m.load_indices(b))
        out.setdefault(m.output.name, set()).add(sympy.expand(substitute(m.store_index(), cm)))
    return out


def accesses_agree(a, b, n_outer: int, every: bool = True) -> bool:
    """Each buffer both touch is touched by both at one point at least that is the same in the shared
    nest (a profitability filter: can_fuse decides legality). Splitting a flat node to a nest that walks a
    shared buffer in another order (a column sum's) is exact but fuses nothing worth having: no value
    passes in registers, no load is shared. `every=False`: one such buffer is enough (a pointwise producer
    merged into the reduction reading its output, which then passes in registers; an input both also read
    at other points, the class token's row recomputed from what the norm reads whole, costs what it did)."""
    pa, pb = _accesses(a, n_outer), _accesses(b, n_outer)
    shared = pa.keys() & pb.keys()
    return bool(shared) and (all if every else any)(pa[k] & pb[k] for k in shared)
