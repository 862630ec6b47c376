"""dce — dead-node elimination.

Removes nodes whose results nothing needs: not a graph output, not read by a live node, not writing a
graph input in place (an in-place Pointwise, or a group holding one; a scatter is needed when its
buffer is read after it or returned), and without side effects (an extern that mutates, draws random
numbers, is a collective or its wait, or is an assertion — `torch._assert_async`, dynamo's run-time
asserts on sizes — is kept: an assertion has no result to read, and dropping it let a failed check pass).
Runs to a fixed point in one sweep, consumers before producers. Refuses nothing else.
"""
from __future__ import annotations

import torch

from ..ir import Extern, Scatter
from ..lowering.context import ASSERTIONS
from ..pipeline.registry import register_pass


def has_side_effects(node) -> bool:
    if not isinstance(node, Extern):
        return False
    # a collective and its wait act across ranks: dropping one where another rank keeps it hangs both
    if node.mutates or node.comm or node.op in ASSERTIONS:
        return True
    op = node.op
    schema = getattr(op, "_schema", None)
    if schema is not None and schema.is_mutable:
        return True
    return draws_random(node)


def draws_random(node) -> bool:
    """Whether `node` draws random numbers from a generator (or saves or replays its state)."""
    return isinstance(node, Extern) and torch.Tag.nondeterministic_seeded in getattr(node.op, "tags", ())


def _scatter_needed(graph, node: Scatter, keep) -> bool:
    """A scatter (an in-place write) is needed when its buffer is kept or read after it."""
    b = node.output.name
    return b in keep or any(r != node.name and graph.has_path(node.name, r) for r in graph.consumers(b))


@register_pass("dce", provides={"dead_nodes_removed"}, idempotent=True)
def dce(graph, ctx):
    """Remove nodes whose results nothing needs (not outputs, unread, no side effects)."""
    keep = graph.output_names()
    inputs = set(graph.input_buffers())
    for node in reversed(graph.nodes()):
        if has_side_effects(node) or any(b in keep for b in node.output_names()):
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
