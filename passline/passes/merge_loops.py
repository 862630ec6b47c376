"""merge_loops — adjacent loops that walk memory as one loop become one loop.

Lowering gives each node the loops of its FX shape, and views make neighbours disagree about them: a
cross-entropy over `logits.flatten(0, 1)` reduces over [B*T | V] while the float32 cast it reads runs over
[B, T, V]; a LayerNorm reads a matmul's [B*T, D] output as [B, T, D]. The points and addresses are the
same, but `fuse` compares loop structures and refuses, so the cast's full-size output is written and read
back (GPT-2's float32 logits: two 1.6 GB buffers alive at the peak of a training step). Inductor merges such
loops before fusing (`simplify_loops`); this pass does the same, so neighbours meet in one canonical form.

Loops k and k+1 of a node merge when every index the node computes — each load, each index value, and
its store — is affine in them with coefficient c_k == c_{k+1} * n_{k+1} (n: the loop's range), because then
i_k * c_k + i_{k+1} * c_{k+1} == (i_k * n_{k+1} + i_{k+1}) * c_{k+1}: the merged loop j over n_k * n_{k+1}
takes i_{k+1}'s place with coefficient c_{k+1}, and no division appears. Outer loops and reduction loops
merge among themselves, never across. The node's output buffer is then described with the merged
dimensions (same storage, same addresses), which is what its store index is computed from; consumers
address it by storage offsets and the graph's outputs by their own sizes and strides, so neither changes.
Size-1 loops go first (they address nothing). Symbolic ranges merge when the condition holds as sympy
expressions.

A node whose loops were reordered (memory_order runs first, so loops are in memory order) has its output
re-described in loop order first, after which its loops merge like anyone's. Leaves alone: nodes that
write a buffer another node also writes (a scatter into it, a mutation), graph inputs written in place,
scatters, mix-order and fused nodes (this runs before fusion), indices not affine in the two loops (views
through floor/mod). Stat:
`merged_loops` (loops removed).
"""
from __future__ import annotations

import attrs
import sympy

from ..ir import Layout, Pointwise, Reduction
from ..ir.body import IndexValue, Load, substitute_index, walk
from ..ir.index import VarKind, as_strided_form, loop_vars
from ..pipeline.registry import register_pass
from .legality import fixed_layouts


def _indices(node) -> list:
    """Every index expression of the body (loads, index values)."""
    out = []
    for v in walk(node.body):
        if isinstance(v, Load):
            out.append(v.index)
        elif isinstance(v, IndexValue):
            out.append(v.expr)
    return out


def _mergeable(exprs, vars, ranges, k: int, loops: set) -> bool:
    """Loops k and k+1 (of `vars` over `ranges`) merge in every expression of `exprs`; `loops`: every loop
    variable of the node (a coefficient holding one, `i0*i2`, is not a stride)."""
    a, b = vars[k], vars[k + 1]
    for e in exprs:
        form = as_strided_form(e, (a, b))
        if form is None:
            return False
        ca, cb = form[0]
        if (ca.free_symbols | cb.free_symbols) & loops:
            return False
        if sympy.expand(ca - cb * ranges[k + 1]) != 0:
            return False
    return True


def _merge(vars, ranges, k: int, kind: VarKind) -> tuple[dict, tuple]:
    """The substitution merging loops k and k+1, and the new ranges (variables renumbered)."""
    new_ranges = ranges[:k] + (ranges[k] * ranges[k + 1],) + ranges[k + 2:]
    new = loop_vars(kind, len(new_ranges))
    mapping = {}
    for i, v in enumerate(vars):
        if i < k:
            mapping[v] = new[i]
        elif i == k:
            mapping[v] = sympy.S.Zero
        else:  # k + 1 becomes the merged loop; later loops move down one place
            mapping[v] = new[i - 1]
    return mapping, new_ranges


def _drop_unit(vars, ranges, k: int, kind: VarKind) -> tuple[dict, tuple]:
    new_ranges = ranges[:k] + ranges[k + 1:]
    new = loop_vars(kind, len(new_ranges))
    mapping = {v: (sympy.S.Zero if i == k else new[i - (i > k)]) for i, v in enumerate(vars)}
    return mapping, new_ranges


def _output_layout(lay: Layout, k: int, unit: bool) -> Layout:
    """The output layout with dims k, k+1 merged (or size-1 dim k dropped)."""
    if unit:
        size, stride = lay.size[:k] + lay.size[k + 1:], lay.stride[:k] + lay.stride[k + 1:]
    else:
        size = lay.size[:k] + (lay.size[k] * lay.size[k + 1],) + lay.size[k + 2:]
        stride = lay.stride[:k] + (lay.stride[k + 1],) + lay.stride[k + 2:]
    return attrs.evolve(lay, size=size, stride=stride)


def _in_loop_order(node):
    """A node whose loops were reordered (memory_order), with its output described in loop order: the
    same stores, and the permutation gone, so its loops can merge like anyone's."""
    perm = tuple(node.permutation)
    if perm == tuple(range(len(perm))):
        return node
    lay = node.output.layout
    # store_order(vars)[d] = vars[perm[d]]: output dim d is walked by loop perm[d]
    dim_of = {loop: d for d, loop in enumerate(perm)}
    size = tuple(lay.size[dim_of[k]] for k in range(len(perm)))
    stride = tuple(lay.stride[dim_of[k]] for k in range(len(perm)))
    out = attrs.evolve(node.output, layout=attrs.evolve(lay, size=size, stride=stride))
    return attrs.evolve(node, output=out, permutation=tuple(range(len(perm))))


def _simplify(node):
    """`node` with its loops merged as far as they go; None when nothing merges."""
    start = node
    node = _in_loop_order(node)
    changed = node is not start
    while True:
        step = _one_step(node)
        if step is None:
            return node if changed else None
        node, changed = step, True


def _one_step(node):
    outer = list(node.vars)
    exprs = _indices(node)
    store = node.store_index()
    loops = set(node.vars) | set(getattr(node, "reduction_vars", ()))
    # outer loops: the store index and the output's dims change with them
    for k in range(len(node.ranges)):
        if node.ranges[k] == 1 and len(node.ranges) > 1:
            mapping, ranges = _drop_unit(tuple(outer), node.ranges, k, VarKind.OUTER)
            return _rebuilt(node, mapping, ranges, None, _output_layout(node.output.layout, k, True))
    for k in range(len(node.ranges) - 1):
        if _mergeable([*exprs, store], outer, node.ranges, k, loops):
            mapping, ranges = _merge(tuple(outer), node.ranges, k, VarKind.OUTER)
            return _rebuilt(node, mapping, ranges, None, _output_layout(node.output.layout, k, False))
    if isinstance(node, Reduction):
        red = node.reduction_vars
        rr = node.reduction_ranges
        for k in range(len(rr)):
            if rr[k] == 1 and len(rr) > 1:
                mapping, ranges = _drop_unit(red, rr, k, VarKind.REDUCTION)
                return _rebuilt(node, mapping, None, ranges, None)
        for k in range(len(rr) - 1):
            if _mergeable(exprs, red, rr, k, loops):
                mapping, ranges = _merge(red, rr, k, VarKind.REDUCTION)
                return _rebuilt(node, mapping, None, ranges, None)
    return None


def _rebuilt(node, mapping: dict, ranges, reduction_ranges, layout):
    changes = {"body": substitute_index(node.body, mapping)}
    if ranges is not None:
        changes["ranges"] = ranges
        changes["permutation"] = tuple(range(len(ranges)))
    if reduction_ranges is not None:
        changes["reduction_ranges"] = reduction_ranges
    if layout is not None:
        changes["output"] = attrs.evolve(node.output, layout=layout)
    return attrs.evolve(node, **changes)


def _eligible(node, fixed: set) -> bool:
    if type(node) not in (Pointwise, Reduction):
        return False
    if len(node.output.layout.size) != len(node.ranges):
        return False  # the output's dims are not one per loop: nothing here to re-describe by
    out = node.output.name
    if out in fixed:
        return False
    return True


@register_pass("merge_loops", provides={"loops_merged"})
def merge_loops(graph, ctx):
    """Merge adjacent loops that address memory as one, so that views do not keep neighbours apart."""
    fixed = fixed_layouts(graph)
    for node in list(graph.nodes()):
        if not _eligible(node, fixed):
            continue
        new = _simplify(node)
        if new is None or not ctx.decide("merge_loops", node):
            continue
        before = len(node.ranges) + len(getattr(node, "reduction_ranges", ()))
        after = len(new.ranges) + len(getattr(new, "reduction_ranges", ()))
        graph.replace_node(node.name, new)
        ctx.count("merged_loops", before - after)
    return graph
