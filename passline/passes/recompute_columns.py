"""recompute_columns — a column reduction recomputes the pointwise values it sums from their inputs,
where reading them stored would cost more memory traffic.

The pattern is a norm's backward: dw = sum over rows of dy * xhat and db = sum over rows of dy, summed
from float32 pointwise values that the row kernel computing dx also needs. A column reduction cannot
fuse with the row kernel (it walks the rows in the other order), so without this pass the row kernel
stores dy * xhat and dy as float32 [rows, columns] buffers for the column kernels to read back: 16 bytes
of traffic an element for two bfloat16 inputs (x, dy) that hold the same information in 4. Wide rows are
where it costs (mix_order_reduction takes the column sums into the row kernel for rows of up to its
max_row_bytes): LayerNorm's backward at 2048 × 65536 in bfloat16 spent 0.65 ms in a row kernel writing
those buffers, against Inductor's 0.35. Recomputed, the two column sums read x and dy (and the per-row
statistics), and, now reading the same buffers, fuse into one kernel.

For each Reduction C that cannot fuse with a Pointwise producer it reads for a reason of loop order
(`loop order mismatch`, `loop structure`): C's body is read through its pointwise producers (passes/points.py
`read_through`, at most `max_values` values) when the full-size buffers the new body reads — indexed by
both C's outer and reduction loops — cost at most the bytes an element of the buffers it read before
(a buffer a pointwise node produces costs its write too, unless it is a graph output, stored anyway).
Per-row and per-column buffers (statistics, weights) are not counted: they are read once a row or a
column and stay in cache. Producers left unread go (their producers stay: dce removes what is left
dead). Stat: `recomputed_columns`.

Only where a row of the widest full-size buffer the recomputed body reads takes more than `min_row_bytes`
in registers (`legality.row_bytes`: columns × bytes an element, at least 4; known numbers): narrower rows are
mix_order_reduction's (its max_row_bytes, 32 KB: 8192 columns), which computes the column sums in the row
kernel from the row side's own values, reading the inputs once; a column sum that recomputes reads them a
second time, and may fuse elsewhere first (LayerNorm over a transposed view: its column sums then walk memory
contiguously and took the row side's pointwise work with them, and nothing was mixed).
"""
from __future__ import annotations

from typing import Annotated

import attrs

from ..ir import Pointwise, Reduction
from ..ir.body import Load, walk
from ..ir.index import product
from ..lowering.sizes import at_hint
from ..pipeline.registry import AtLeast, register_pass
from .legality import MIX_ROW_BYTES, can_fuse, row_bytes
from .points import read_through

ORDER_REASONS = ("loop order mismatch", "loop structure")


def _full_size(body, outer: set, red: set) -> set:
    """Buffers `body` loads at indices that move with both the outer and the reduction loops."""
    out = set()
    for v in walk(body):
        if isinstance(v, Load):
            free = v.index.free_symbols
            if free & outer and free & red:
                out.add(v.buffer)
    return out


def _cost(graph, buffers: set, outputs: set, layouts: dict) -> int:
    """Bytes an element of reading `buffers`, each pointwise-produced one also written (unless returned)."""
    total = 0
    for b in buffers:
        size = layouts[b].dtype.itemsize
        producer = graph.producer(b)
        written = producer is not None and isinstance(graph.node(producer), Pointwise) and b not in outputs
        total += size * (2 if written else 1)
    return total


@register_pass("recompute_columns", provides={"columns_recomputed"})
def recompute_columns(graph, ctx, *,
                      min_row_bytes: Annotated[int, "only column reductions whose rows take more bytes in registers "
                                               "than this (mix_order_reduction's max_row_bytes)",
                                               AtLeast(0)] = MIX_ROW_BYTES,
                      max_values: Annotated[int, "most producer values recomputed in one column reduction",
                                                 AtLeast(0)] = 64):
    """Column reductions (a norm's dw, db) recompute what they sum from the inputs instead of reading it stored."""
    mutated, outputs, layouts = graph.mutated_names(), graph.output_names(), graph.buffers()
    for name in graph.names():
        node = graph.node(name)
        if not isinstance(node, Reduction) or node.mutates:
            continue
        columns = product(node.ranges)
        columns = int(columns) if columns.is_number else at_hint(columns, graph.hints)  # run-time: the traced
        if columns is None:  # length, as mix_order_reduction gates it
            continue
        producers = {graph.producer(b) for b in node.read_names()} - {None}
        columnar = [graph.node(p) for p in producers if isinstance(graph.node(p), Pointwise)
                    and can_fuse(graph, graph.node(p), node).reason in ORDER_REASONS]
        if not columnar:
            continue
        body = read_through(graph, node.body, node.var_ranges, max_values, mutated)
        if body is None or body == node.body:
            continue
        red = set(node.reduction_vars)
        outer = {v for v, _ in node.var_ranges} - red
        before, after = _full_size(node.body, outer, red), _full_size(body, outer, red)
        if row_bytes(columns, max((layouts[b].dtype.itemsize for b in after), default=4)) <= min_row_bytes:
            continue  # rows mix_order_reduction takes (see the module docstring)
        if _cost(graph, after, outputs, layouts) > _cost(graph, before, outputs, layouts):
            continue
        if not ctx.decide("recompute", node):
            continue
        graph.replace_node(name, attrs.evolve(node, body=body))
        ctx.count("recomputed_columns")
        for p in columnar:  # read by nothing now: its row kernel need not compute it
            if p.name in graph and not graph.consumers(p.output.name) and p.output.name not in outputs:
                graph.remove_node(p.name)
    return graph
