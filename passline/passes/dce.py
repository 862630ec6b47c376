"""dce — dead-node elimination.

Removes nodes whose results nothing needs: not a graph output, not read by a live node, not writing a
graph input in place (an in-place Pointwise, or a group holding one; a scatter is needed when its
buffer is read after it or returned), and without side effects (an extern that mutates, draws random
numbers, is a collective or its wait, or is an assertion — `torch._assert_async`, dynamo's run-time
asserts on sizes — is kept: an assertion has no result to read, and dropping it let a failed check pass).
Runs to a fixed point in one sweep, consumers before producers. Refuses nothing else.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Extern, Scatter
from ..pipeline.registry import register_pass

aten = torch.ops.aten
# checks a program makes of itself: each raises where its condition fails, and returns nothing to read
ASSERTIONS = {aten._assert_async.default, aten._assert_async.msg, aten._assert_scalar.default,
              aten._assert_tensor_metadata.default, aten.sym_constrain_range.default,
              aten.sym_constrain_range_for_size.default}


def _bound_symbols(graph) -> set:
    """The size symbols a call binds from its inputs (their sizes and strides, and int inputs)."""
    out = set()
    for inp in graph.inputs:
        lay = inp.buffer.layout if inp.buffer is not None else None
        for e in ((*lay.size, *lay.stride) if lay is not None else (inp.symbol,)):
            if isinstance(e, sympy.Symbol):
                out.add(e)
    return out


def _symbols(x) -> set:
    if isinstance(x, sympy.Basic):
        return set(x.free_symbols)
    if isinstance(x, (list, tuple)):
        return set().union(*map(_symbols, x)) if x else set()
    return set()


def has_side_effects(node, bound: set | None = None) -> bool:
    """Whether an extern must run though nothing reads it. `bound`: the symbols a call binds from its
    inputs — an assertion on a symbol outside them (a value read from a tensor by `.item()`, which passline
    does not bind at run time) cannot be evaluated: it is removed, unchecked, as every assertion was before
    they were kept (issue: such values are not bound; the graph cannot compute with them either)."""
    if not isinstance(node, Extern):
        return False
    if node.op in ASSERTIONS:
        return bound is None or _symbols((node.args, [v for _, v in node.kwargs])) <= bound
    # a collective and its wait act across ranks: dropping one where another rank keeps it hangs both
    if node.mutates or node.comm:
        return True
    op = node.op
    schema = getattr(op, "_schema", None)
    if schema is not None and schema.is_mutable:
        return True
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def _scatter_needed(graph, node: Scatter, keep) -> bool:
    """A scatter (an in-place write) is needed when its buffer is kept or read after it."""
    b = node.output.name
    return b in keep or any(r != node.name and graph.has_path(node.name, r) for r in graph.consumers(b))


@register_pass("dce", provides={"dead_nodes_removed"}, idempotent=True)
def dce(graph, ctx):
    """Remove nodes whose results nothing needs (not outputs, unread, no side effects)."""
    keep = graph.output_names()
    inputs = set(graph.input_buffers())
    bound = _bound_symbols(graph)
    for node in reversed(graph.nodes()):
        if has_side_effects(node, bound) or any(b in keep for b in node.output_names()):
            continue
        if not isinstance(node, Scatter) and set(node.mutates) & inputs:
            continue  # overwrites a graph input in place (a running statistic): the caller sees it
        if any(graph.consumers(b) for b in node.output_names()):
            continue
        if isinstance(node, Scatter) and _scatter_needed(graph, node, keep | inputs):
            continue
        if ctx.decide("remove", node):
            graph.remove_node(node.name)
            ctx.count("dce_removed")
    return graph
