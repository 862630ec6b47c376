"""memory_order — run each pointwise node's loops in the order its output lies in memory.

A pointwise node's loops come out of lowering in the output's logical order (N, C, H, W). When the
output is stored with other strides — channels_last (N, H, W, C), a transposed result — consecutive
programs of the kernel then store (and usually load) elements a whole stride apart, and every access
is uncoalesced: on an H200 a channels_last ResNet's pointwise kernels ran at 8% of copy bandwidth.
This pass permutes the node's loops so that the loop with the largest store stride is outermost and the
stride-1 loop innermost (the node computes and stores exactly the same values, visiting them in
another order), as Inductor picks a kernel's loop order from its strides. Producer/consumer pairs that
share a layout then walk their shared buffer in the same order and fuse as before.

Strides with size symbols are ordered at a size hint (every symbol taken as 64): a wrong guess costs
speed, never correctness. Refuses: nodes already in memory order, nodes whose store index is not a
sum of loop variables times strides (a view through floor/mod). Stat: `num_memory_order`.
"""
from __future__ import annotations

import sympy

from ..ir import Pointwise
from ..ir.index import as_strided_form
from ..ir.loops import permute_pointwise
from ..pipeline.registry import register_pass

HINT = 64  # value a size symbol takes when strides are compared


def _order(node: Pointwise) -> list[int] | None:
    """The loop order that walks `node`'s output in memory order, or None to leave it as it is."""
    form = as_strided_form(node.store_index(), node.vars)
    if form is None:
        return None

    def weight(k: int) -> float:
        stride = sympy.sympify(form[0][k])
        return float(stride.xreplace({s: HINT for s in stride.free_symbols}))

    loops = [k for k, s in enumerate(node.ranges) if s != 1]
    ordered = sorted(loops, key=lambda k: -weight(k))  # stable: equal strides keep their order
    if ordered == loops:
        return None
    # size-1 loops where they were: only the non-unit loops move among their own positions
    order = list(range(len(node.ranges)))
    for pos, k in zip(loops, ordered):
        order[pos] = k
    return order


@register_pass("memory_order", provides={"memory_ordered"})
def memory_order(graph, ctx):
    """Permute pointwise loops so each kernel walks its output in memory order."""
    for node in list(graph.nodes()):
        if not isinstance(node, Pointwise):
            continue
        order = _order(node)
        if order is None or not ctx.decide("memory_order", node):
            continue
        graph.replace_node(node.name, permute_pointwise(node, order))
        ctx.count("num_memory_order")
    return graph
