"""tile_rows — pointwise work that reads per-row values runs as tiles of whole rows.

A pointwise kernel walks its points flat: each lane works out its row (i // C) and loads every per-row
operand itself. Cross-entropy's gradient, `exp(x - max - lse) * g - onehot(target) * g'`, reads four
per-row values and the target for each element: at 384 classes in bfloat16 its flat kernel issued 40
scalar loads for the 8 elements a thread stores with one vector store, and took 277 µs on an H200
against 170 µs for Inductor's kernel, which loads them once a row. (one_hot_sums leaves this gradient
pure pointwise: the row sum it used to be fused with is gone.)

As a group over (rows | columns) with every member inside the column loop, the same work is generated
as a row kernel: a program takes whole rows (or loops over a wide row's columns), and a per-row operand
is a [rows, 1] load, once a row. The Triton backend chooses the persistent or looped form and the rows
per program by the same rule as for a row reduction.

Applies to a Pointwise node, or a FusedNode of Pointwise members only, over two or more loops whose last
loop walks its output contiguously (stride 1) and whose members all run over those loops, when a member
loads a buffer at an index that moves with the outer loops but not with the last (a per-row value) or
binds a run-time index there — and when there are rows enough to keep the GPU busy: a row kernel gives
no row to two programs, so at least `min_rows_per_sm` rows per SM of the target (`sms`, default the
target's; a symbolic row count stays flat: the tiled form is not yet measured on a GPU under dynamic
shapes). A few long rows stay flat, where every SM gets a
share of each row. On a CPU target (Triton's interpreter, the reference backend) nothing is tiled unless
`sms` is given: there per-row loads cost nothing more than other loads, and more programs cost time.
Run it last: the group it makes is a final layout, not something fuse should grow. Stat: `row_tiles`.
"""
from __future__ import annotations

from typing import Annotated

import sympy

from ..ir import FusedNode, Pointwise
from ..ir.body import IndexValue, Load, walk
from ..ir.index import as_strided_form, product, substitute
from ..ir.loops import canonical_map, members, shape
from ..pipeline.registry import AtLeast, register_pass


def _per_row(member, cmap: dict, outer_vars: set, last) -> bool:
    """Whether `member` loads something, or binds a run-time index, once a row: at an index that moves
    with an outer loop and not with the last one (canonical loop variables, through `cmap`)."""
    for v in walk(member.body):
        if isinstance(v, Load) or (isinstance(v, IndexValue) and v.indirect):
            free = substitute(v.index if isinstance(v, Load) else v.expr, cmap).free_symbols
            if free & outer_vars and last not in free:
                return True
    return False


def _rows(node):
    """(outer sizes, last size) for a node this pass tiles, or None."""
    if isinstance(node, FusedNode) and node.reduction_ranges:
        return None
    group = members(node)
    if not all(isinstance(m, Pointwise) and not m.in_place for m in group):
        return None
    outer, red = shape(node)
    if red or len(outer) < 2:
        return None
    if any(shape(m) != (outer, ()) for m in group):
        return None
    n = len(outer)
    per_row = False
    for m in group:
        cmap = canonical_map(m, n)
        names = [c for c in cmap.values() if isinstance(c, sympy.Symbol)]  # o0 .. o(n-1), in loop order
        form = as_strided_form(sympy.expand(substitute(m.store_index(), cmap)), names)
        if form is None or form[0][-1] != 1:
            return None  # the last loop does not walk this member's output contiguously
        per_row = per_row or _per_row(m, cmap, set(names[:-1]), names[-1])
    return (tuple(outer[:-1]), outer[-1]) if per_row else None


@register_pass("tile_rows", provides={"row_tiles"})
def tile_rows(graph, ctx, *,
              sms: Annotated[int, "SMs to plan for (0: the target's; none on a CPU target)", AtLeast(0)] = 0,
              min_rows_per_sm: Annotated[int, "fewest rows per SM worth tiling", AtLeast(0)] = 2):
    """Pointwise work reading per-row values (cross-entropy's gradient) runs as a row kernel."""
    gpu_sms = sms or (ctx.target.sms if not ctx.target.interpreted else 0)
    if not gpu_sms:
        return graph  # a CPU target (see the module docstring)
    for name in graph.names():
        node = graph.node(name)
        rows = _rows(node)
        if rows is None:
            continue
        outer, last = rows
        n = product(outer)
        if not n.is_number or int(n) < min_rows_per_sm * gpu_sms or not ctx.decide("tile", node):
            continue  # symbolic rows stay flat: the tiled form is not yet measured under dynamic shapes
        graph.replace_node(name, FusedNode(name, members(node), outer, (last,)))
        ctx.count("row_tiles")
    return graph
