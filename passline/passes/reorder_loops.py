"""reorder_loops — permute a pointwise node's loops so that it walks a shared buffer in its
partner's order, and the pair can fuse.

For each unfused producer/consumer pair with a loop order mismatch (a transpose between them), where
one side is a single Pointwise node, or a group of them (no reduction) and the other is pointwise work
too (RoPE's `cat(-x2, x1) * sin`, fused before it meets the transposed `x * cos + ...`): find the
permutation that makes the pointwise side's access to the shared buffer match the partner's point for
point, apply it (the node computes and stores exactly the same values, visiting them in another order),
and keep it only if the pair can then fuse. Counted in the report as `num_loop_reordering`.

Refuses: pairs whose accesses are not a permutation of each other (indexing mismatch), pairs where
neither side is pointwise work alone, and permutations after which the pair still cannot fuse.
"""
from __future__ import annotations

from typing import Annotated

import attrs

from ..ir import FusedNode, Pointwise
from ..ir.loops import compare, members, permute_pointwise, read_accesses, shape, store_access
from ..pipeline.registry import AtLeast, register_pass
from .legality import can_fuse


def _order(node, target_vars: list, mapping: dict, own_vars: list) -> list[int] | None:
    """Loop order for `node` so that its canonical var matched to target var k becomes its k-th loop."""
    # own canonical var name -> loop position (non-unit loops, in order)
    positions = [k for k, s in enumerate(node.ranges) if s != 1]
    own_pos = {v: positions[j] for j, v in enumerate(own_vars)}
    order = [own_pos[mapping[t]] for t in target_vars if t in mapping]
    if len(order) != len(positions):
        return None
    return order + [k for k, s in enumerate(node.ranges) if s == 1]


def _pointwise_only(node) -> bool:
    """A Pointwise node, or a group of Pointwise members with no reduction: loops that may be permuted."""
    if isinstance(node, FusedNode):
        return not node.reduction_ranges and all(type(m) is Pointwise for m in node.nodes)
    return isinstance(node, Pointwise)


def _permuted(node, order: list[int]):
    """`node` with its loops run in `order`. A group's members each take the same permutation of their
    loops of size > 1 (which are the group's loops, in order); their size-1 loops stay last."""
    if isinstance(node, Pointwise):
        return permute_pointwise(node, order)
    new = []
    for m in node.nodes:
        big = [k for k, s in enumerate(m.ranges) if s != 1]
        new.append(permute_pointwise(m, [big[o] for o in order] + [k for k, s in enumerate(m.ranges) if s == 1]))
    return attrs.evolve(node, nodes=tuple(new), ranges=tuple(node.ranges[o] for o in order))


def _try(graph, point, partner, point_is_producer: bool, max_nodes: int):
    """A permuted copy of `point` (a Pointwise node or group, see `_pointwise_only`) that fuses with
    `partner`, or None."""
    outer, red = shape(partner)
    n_partner = len(outer)
    n_own = len(shape(point)[0])
    if point_is_producer:
        read = set(partner.read_names())
        writer = next((m for m in members(point) if m.output.name in read), None)
        if writer is None:
            return None
        own = store_access(writer, n_own)
        target = [a for m in members(partner) for a in read_accesses(m, writer.output.name, n_partner)]
    else:
        writers = {m.output.name: m for m in members(partner)}
        shared = [(m, b) for m in members(point) for b in m.read_names() if b in writers]
        if not shared:
            return None
        reader, buf = shared[0]
        target = [store_access(writers[buf], n_partner)]
        own = read_accesses(reader, buf, n_own)[0]
    for t in target:
        # compare(store, read) maps read vars to store vars
        verdict = compare(own, t) if point_is_producer else compare(t, own)
        if verdict in ("same", "different"):
            continue
        _, mapping = verdict
        if point_is_producer:  # mapping: partner read var -> own store var
            order = _order(point, list(t.sizes), mapping, list(own.sizes))
        else:  # mapping: own read var -> partner store var; invert it
            inverse = {s: r for r, s in mapping.items()}
            order = _order(point, list(t.sizes), inverse, list(own.sizes))
        if order is None or order == list(range(len(order))):
            continue
        candidate = _permuted(point, order)
        graph.replace_node(point.name, candidate)
        if can_fuse(graph, candidate, partner, max_nodes).ok:
            return candidate
        graph.replace_node(point.name, point)
    return None


@register_pass("reorder_loops", provides={"loops_reordered"})
def reorder_loops(graph, ctx, *, max_nodes: Annotated[int, "the fuse pass's max_nodes, for the fusability check",
                                                           AtLeast(1)] = 64):
    """Permute pointwise loops so a transposed producer/consumer pair walks its buffer in one order."""
    done: set = set()
    for u, v in graph.edges():
        if u not in graph or v not in graph or u in done or v in done:
            continue
        a, b = graph.node(u), graph.node(v)
        verdict = can_fuse(graph, a, b, max_nodes)
        if verdict.ok or verdict.reason != "loop order mismatch":
            continue
        # prefer permuting the consumer: the producer's stores keep their order
        for point, partner, is_producer in ((b, a, False), (a, b, True)):
            if not (isinstance(point, Pointwise) or _pointwise_only(point) and _pointwise_only(partner)):
                # a group joins pointwise work only: permuted into a column reduction's prologue it
                # would take the place mix_order_reduction gives it, on the row side in its memory order
                continue
            if not ctx.decide("reorder", point, partner):
                continue
            new = _try(graph, point, partner, is_producer, max_nodes)
            if new is not None:
                ctx.count("num_loop_reordering")
                done.update((u, v))
                break
    return graph
