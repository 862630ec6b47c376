"""reorder_loops — permute a pointwise node's loops so that it walks a shared buffer in its
partner's order, and the pair can fuse.

For each unfused producer/consumer pair with a loop order mismatch (a transpose between them), where
one side is a single Pointwise node: find the permutation that makes the pointwise side's access to the
shared buffer match the partner's point for point, apply it (the node computes and stores exactly the
same values, visiting them in another order), and keep it only if the pair can then fuse. Counted in the
report as `num_loop_reordering`.

Refuses: pairs whose accesses are not a permutation of each other (indexing mismatch), pairs where
neither side is a single pointwise node, and permutations after which the pair still cannot fuse.
"""
from __future__ import annotations

from typing import Annotated

from ..ir import Pointwise
from ..ir.loops import compare, members, read_accesses, shape, store_access
from ..pipeline.registry import register_pass
from .legality import can_fuse


def _order(node: Pointwise, target_vars: list, mapping: dict, own_vars: list) -> list[int] | None:
    """Loop order for `node` so that its canonical var matched to target var k becomes its k-th loop."""
    # own canonical var name -> loop position (non-unit loops, in order)
    positions = [k for k, s in enumerate(node.ranges) if s != 1]
    own_pos = {v: positions[j] for j, v in enumerate(own_vars)}
    order = [own_pos[mapping[t]] for t in target_vars if t in mapping]
    if len(order) != len(positions):
        return None
    return order + [k for k, s in enumerate(node.ranges) if s == 1]


def _try(graph, point: Pointwise, partner, point_is_producer: bool, max_nodes: int):
    """A permuted copy of `point` that fuses with `partner`, or None."""
    outer, red = shape(partner)
    n_partner = len(outer)
    n_own = len(shape(point)[0])
    if point_is_producer:
        own = store_access(point, n_own)
        target = [a for m in members(partner) for a in read_accesses(m, point.output.name, n_partner)]
    else:
        writers = {m.output.name: m for m in members(partner)}
        shared = [b for b in point.read_names() if b in writers]
        if not shared:
            return None
        target = [store_access(writers[shared[0]], n_partner)]
        own = read_accesses(point, shared[0], n_own)[0]
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
        from ..ir.loops import permute_pointwise

        candidate = permute_pointwise(point, order)
        graph.replace_node(point.name, candidate)
        if can_fuse(graph, candidate, partner, max_nodes).ok:
            return candidate
        graph.replace_node(point.name, point)
    return None


@register_pass("reorder_loops", provides={"loops_reordered"})
def reorder_loops(graph, ctx, *, max_nodes: Annotated[int, "the fuse pass's max_nodes, for the fusability check"] = 64):
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
            if not isinstance(point, Pointwise):
                continue
            if not ctx.decide("reorder", point, partner):
                continue
            new = _try(graph, point, partner, is_producer, max_nodes)
            if new is not None:
                ctx.count("num_loop_reordering")
                done.update((u, v))
                break
    return graph
