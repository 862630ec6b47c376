"""split_reductions — a reduction with few outputs and a long reduced range becomes two: a partial
reduction over chunks of the range (many programs) and a small finishing reduction over the chunks.

A kernel gets its parallelism from its outputs: a row reduction runs about one program per output, a
column reduction one per block of columns. BatchNorm statistics of a channels_last activation (64
channels summed over 401,408 rows) or the full sum of a big tensor then run on a handful of programs and
leave almost every SM of the GPU idle: on an H200, 4.85 ms for a kernel whose data takes ~0.1 ms to copy.
This pass rewrites a reduction of outputs X over the reduced range R (flattened, f in [0, R)) as

    partial[X, s] = reduce over j in [0, chunk) of body(f = s*chunk + j)      s in [0, S)
    out[X]        = reduce over s in [0, S) of partial[X, s]

(Inductor's "split reductions"). sum, prod, max, min, any and all combine partial results by the same
reduction. argmax/argmin are refused: their partial results would have to carry the index of each
chunk's winner next to its value (a pair per chunk, and a finishing step that picks the first of equal
values across chunks), which one Reduction node with one output buffer cannot express.

The index math is sympy: each original reduction variable is recovered from f with `FloorDiv` and
`ModularIndexing` (or, for an access that walks the reduced loops as one flat range — a column of a
contiguous or channels_last tensor, a contiguous row — as `base + stride*f`, with no division at all).
S is chosen to divide R where a divisor near the wanted count exists; otherwise the last chunk runs past
R, its extra points take the reduction's identity through a `where` on `f < R`, and f is clamped
(`Min(f, R - 1)`) in every index, so no backend loads outside a buffer (the Triton kernel masks a load
only by its loop bounds, kernel.py `mask_for`). The partial results keep the reduction's accumulation
dtype (lowering already reduces bfloat16/float16 in float32), and the finishing node stores the
original output, so every reader sees the same buffer.

Where it runs: after `mix_order_reduction`, on what is left. LayerNorm/RMSNorm backward's column sums
are already split by mix-order (their partial sums share the read of the rows with the row sums), so
MixOrderNodes are left alone; run earlier, this pass would take those column sums first and mix-order
would lose its pattern. Running after `fuse` means splitting fused groups: every non-reduction member
of a group is inlined (recomputed) into the partial reductions that read it, the reductions become
partial nodes, and each finishing reduction takes the group's epilogue members after it (as
`finish_node` in backends/triton/kernel.py does for mix-order), so a finishing reduction and its
epilogue are still one kernel; a pointwise member inside the reduction loop that something outside the
group reads is kept as a pointwise node of its own. A group with several reductions in sequence
(BatchNorm's mean, then the sum of squares around it) gives one partial and one finishing node per
reduction.

The rule (from the problem and `ctx.target`, never a benchmark shape): the un-split kernel's programs are
estimated as X for a row reduction and X / 16 for a column reduction (a coalesced column block is at
least 16 columns wide: backends/triton/configs.py `rule`). With fewer programs than `programs_per_sm`
per SM, and R at least `min_reduced`, S is about programs_per_sm * SMs / programs, but no more than
makes chunks of `min_chunk`; at S < 2 nothing is split. The partial kernel's outputs are laid out
(S, X) for a column reduction, so neighbouring programs' lanes read neighbouring columns (coalesced),
and (X, S) otherwise. On a CPU target (Triton's interpreter, the reference backend) a kernel's cost is
per program, so the rule splits nothing there unless `sms` names a GPU to plan for; `splits=N` splits
every eligible reduction into N chunks on any target (tests, experiments).

Left alone: MixOrderNodes, pointwise and extern nodes, argmax/argmin, and symbolic X or R (dynamic
shapes: the split count would have to be chosen per size). Stats: `num_split_reductions` (reductions
split), `split_reductions_refused` (groups the rule chose but that cannot be split).
"""
from __future__ import annotations

import math
from typing import Annotated

import sympy
import torch

from ..ir import (
    Buffer,
    Constant,
    FusedNode,
    IndexValue,
    Layout,
    Load,
    Op,
    Pointwise,
    Reduction,
    rebuild,
    substitute_index,
    walk,
)
from ..ir.index import FloorDiv, ModularIndexing, VarKind, as_strided_form, contiguous_strides, loop_vars, product
from ..ir.loops import Role, canon_var, canonical_map, role, shape, store_access
from ..pipeline.registry import PipelineError, register_pass

COMBINABLE = ("sum", "prod", "max", "min", "any", "all")
# the narrowest column block a coalesced column reduction runs (16 columns: a whole 32-byte sector even
# in 16-bit types); backends/triton/configs.py `rule` never goes below it
COLUMN_BLOCK = 16


def _identity(rtype: str, dtype: torch.dtype) -> Constant:
    """The value that leaves a reduction's result unchanged (for the points past the reduced range)."""
    if rtype in ("any", "all"):
        return Constant(rtype == "all", dtype)
    if rtype in ("sum", "prod"):
        one = rtype == "prod"
        return Constant(float(one) if dtype.is_floating_point else int(one), dtype)
    high = rtype == "min"  # the identity of a min is the largest value
    if dtype.is_floating_point:
        return Constant(float("inf") if high else float("-inf"), dtype)
    if dtype == torch.bool:
        return Constant(high, dtype)
    info = torch.iinfo(dtype)
    return Constant(info.max if high else info.min, dtype)


def _group(node):
    """(members, outer sizes, reduction sizes) of a node this pass may split, or None."""
    if isinstance(node, Reduction):
        outer, red = shape(node)
        return (node,), outer, red
    if isinstance(node, FusedNode) and node.reduction_ranges:
        # an in-place write (a running statistic's update) is fine as an epilogue, which the finishing
        # node runs after the partials; inside the reduction loop it would be inlined into the partials
        if all(isinstance(m, (Pointwise, Reduction)) for m in node.nodes) and \
                all(role(m, node.ranges, node.reduction_ranges) is Role.OUTER for m in node.nodes if m.mutates):
            return node.nodes, node.ranges, node.reduction_ranges
    return None


class _Refused(Exception):
    """This group cannot be split (the message says why)."""


def _inline(members, n_outer: int) -> tuple[dict, dict]:
    """The members' bodies in the group's canonical variables, with every read of a non-reduction member
    replaced by that member's own body, so that only reads of outside buffers and of reduction results are
    left: (non-reduction member output -> body, reduction member name -> body). A group reads its members
    only at the points they write (verify() checks it, and this checks it again), so the replacement
    computes the same values."""
    stores = {m.output.name: m for m in members}
    pointwise: dict = {}
    reduced: dict = {}
    for m in members:
        def leaf(v, m=m):
            if isinstance(v, Load) and v.buffer in pointwise:
                want = store_access(stores[v.buffer], n_outer).index
                if sympy.expand(v.index - want) != 0:
                    raise _Refused(f"{m.name} reads {v.buffer} at {v.index}, not where it is written ({want})")
                return pointwise[v.buffer]
            return v

        body = rebuild(substitute_index(m.body, canonical_map(m, n_outer)), leaf)
        if isinstance(m, Reduction):
            reduced[m.name] = body
        else:
            pointwise[m.output.name] = body
    return pointwise, reduced


def _columns(bodies, outer: tuple, red: tuple) -> bool:
    """Whether the reduction walks memory across rows (a column reduction): no load steps along the
    innermost reduction loop contiguously, and some load steps along an outer loop contiguously."""
    q = canon_var(VarKind.CANON_REDUCTION, len(red) - 1)
    os_ = [canon_var(VarKind.CANON_OUTER, k) for k in range(len(outer))]
    column = False
    for body in bodies:
        for v in walk(body):
            if not isinstance(v, Load):
                continue
            e = sympy.expand(v.index)
            if q in e.free_symbols and e.coeff(q) == 1:
                return False
            column |= any(e.coeff(o) == 1 for o in os_ if o in e.free_symbols)
    return column


def _near_divisor(n: int, want: int, most: int) -> int:
    """A divisor of n near `want` (within a factor of two, at most `most`), so that every chunk is full
    and no point needs a mask; `want` itself when none is."""
    best = None
    for d in range(max(2, (want + 1) // 2), min(most, 2 * want) + 1):
        if n % d == 0 and (best is None or abs(math.log(d / want)) < abs(math.log(best / want))):
            best = d
    return best if best is not None else want


class _Split:
    """The index math of one split: R points as S chunks of `chunk`, over the group's canonical loops."""

    def __init__(self, outer: tuple, red: tuple, splits: int, column: bool):
        self.outer, self.red = tuple(int(s) for s in outer), tuple(int(s) for s in red)
        self.R = math.prod(self.red)
        self.chunk = -(-self.R // splits)
        self.S = -(-self.R // self.chunk)  # no chunk past the end
        self.masked = self.S * self.chunk != self.R
        self.column = column
        n = len(self.outer)
        # the partial node's loops: (S, X...) for columns (lanes walk the columns), else (X..., S)
        self.ranges = (self.S, *self.outer) if column else (*self.outer, self.S)
        i = loop_vars(VarKind.OUTER, n + 1)
        self.s = i[0] if column else i[n]
        self.xs = i[1:] if column else i[:n]
        (self.j,) = loop_vars(VarKind.REDUCTION, 1)
        self.o = [canon_var(VarKind.CANON_OUTER, k) for k in range(n)]
        self.q = [canon_var(VarKind.CANON_REDUCTION, k) for k in range(len(self.red))]
        self.flat = self.s * self.chunk + self.j
        self.at = sympy.Min(self.flat, self.R - 1) if self.masked else self.flat
        self.unflat = {q: self._unflatten(k) for k, q in enumerate(self.q)}

    def _unflatten(self, k: int):
        """Reduction variable k from the flat reduced index."""
        size, stride = self.red[k], contiguous_strides(self.red)[k]
        stride = int(stride)
        if not self.masked:  # whole chunks: a variable that only one of s and j reaches needs only that one
            if self.chunk % (stride * size) == 0:
                return ModularIndexing(self.j, stride, size)
            if stride % self.chunk == 0:
                m = stride // self.chunk
                return FloorDiv(self.s, m) if k == 0 else ModularIndexing(self.s, m, size)
        return FloorDiv(self.at, stride) if k == 0 else ModularIndexing(self.at, stride, size)

    def index(self, expr):
        """A canonical index expression in the partial node's variables."""
        omap = dict(zip(self.o, self.xs))
        form = as_strided_form(expr, self.q) if self.q else None
        if form is not None:
            coefs, offset = form
            flat = contiguous_strides(self.red)
            if all(sympy.expand(c - coefs[-1] * f) == 0 for c, f in zip(coefs, flat)):
                # the access walks the reduced loops as one flat range: base + stride * f
                return (offset + coefs[-1] * self.at).xreplace(omap)
        return expr.xreplace({**omap, **self.unflat})

    def body(self, body, rtype: str):
        """The partial reduction's body: `body` at f = s*chunk + j, the identity past the range."""
        def leaf(v):
            if isinstance(v, Load):
                return Load(v.buffer, self.index(v.index), v.dtype, v.indirect)
            if isinstance(v, IndexValue):
                return IndexValue(self.index(v.expr), v.dtype, v.indirect)
            return v

        out = rebuild(body, leaf)
        if self.masked:
            inside = Op("lt", (IndexValue(self.flat, torch.int64), Constant(self.R, torch.int64)), torch.bool)
            out = Op("where", (inside, out, _identity(rtype, out.dtype)), out.dtype)
        return out

    def finish_index(self, m: Reduction):
        """Where the finishing reduction `m` (its own loops, with r0 over the chunks) reads the partials."""
        strides = contiguous_strides(self.ranges)
        mine = [v for v, s in zip(loop_vars(VarKind.OUTER, len(m.ranges)), m.ranges) if s != 1]
        (r0,) = loop_vars(VarKind.REDUCTION, 1)
        pos = {v: k for k, v in enumerate((self.s, *self.xs) if self.column else (*self.xs, self.s))}
        index = r0 * strides[pos[self.s]]
        for v, x in zip(mine, self.xs):
            index += v * strides[pos[x]]
        return index


def _split_group(graph, node, members, outer, red, splits: int, column: bool, bodies) -> list:
    """The nodes replacing `node`: kept inner members, then per reduction its partial node and its
    finishing node (with the epilogue members that follow it)."""
    pointwise, reduced = bodies
    sp = _Split(outer, red, splits, column)
    keep = graph.output_names() | graph.mutated_names()
    outside = {b for b in node.output_names() if b in keep or any(r != node.name for r in graph.readers(b))}
    # epilogue members that nothing reads any more (their readers were inlined into partials) are dropped
    needed = set(outside)
    for m in reversed(members):
        if not isinstance(m, Reduction) and role(m, outer, red) is Role.OUTER and (m.output.name in needed
                                                                                   or m.mutates):
            needed |= set(m.read_names())
    reductions = [m for m in members if isinstance(m, Reduction)]
    inner_kept, partials, stages = [], [], [[] for _ in reductions]
    k = 0
    for m in members:
        if isinstance(m, Reduction):
            k = reductions.index(m)
            partial_name = _fresh(graph, f"{m.name}_partial")
            body = sp.body(reduced[m.name], m.reduction_type)
            layout = Layout.contiguous(sp.ranges, body.dtype, m.output.layout.device)
            partials.append(Reduction(partial_name, sp.ranges, (sp.chunk,), m.reduction_type, body,
                                      Buffer(partial_name, layout), m.origins))
            stages[k].append(Reduction(m.name, m.ranges, (sp.S,), m.reduction_type,
                                       Load(partial_name, sp.finish_index(m), body.dtype), m.output, m.origins,
                                       m.permutation))
        elif role(m, outer, red) is Role.INNER:
            if m.output.name in outside:  # read elsewhere: computed on its own (and inlined into the partials)
                back = {c: v for v, c in canonical_map(m, len(outer)).items() if isinstance(c, sympy.Symbol)}
                inner_kept.append(Pointwise(m.name, m.ranges, substitute_index(pointwise[m.output.name], back),
                                            m.output, m.origins, m.permutation))
        elif m.output.name in needed or m.mutates:
            stages[k].append(m)  # an epilogue (a prologue over X alone goes with the first finishing node)
    out = list(inner_kept)
    for k, (partial, stage) in enumerate(zip(partials, stages)):
        out.append(partial)
        if len(stage) == 1:
            out.append(stage[0])
            continue
        name = node.name if k == 0 and isinstance(node, FusedNode) else _fresh(graph, f"fused_{reductions[k].name}")
        out.append(FusedNode(name, tuple(stage), tuple(outer), (sp.S,)))
    return out


def _fresh(graph, name: str) -> str:
    new, k = name, 1
    taken = graph.buffers()
    while new in graph or new in taken:
        new, k = f"{name}{k}", k + 1
    return new


@register_pass("split_reductions", provides={"split_reductions"})
def split_reductions(graph, ctx, *,
                     splits: Annotated[int, "chunks per reduction on any target (0: by the rule; 1: none)"] = 0,
                     sms: Annotated[int, "SMs to plan for (0: the target's; none on a CPU target)"] = 0,
                     programs_per_sm: Annotated[int, "programs per SM the rule aims for"] = 2,
                     min_reduced: Annotated[int, "shortest reduced range the rule splits"] = 4096,
                     min_chunk: Annotated[int, "fewest reduced points per chunk under the rule"] = 1024):
    """Split reductions with few outputs over a long range into partial and finishing reductions."""
    for name, value, low in (("splits", splits, 0), ("sms", sms, 0), ("programs_per_sm", programs_per_sm, 1),
                             ("min_reduced", min_reduced, 2), ("min_chunk", min_chunk, 1)):
        if value < low:
            raise PipelineError(f"option {name!r} of pass 'split_reductions' must be >= {low}, got {value}")
    if splits == 1:
        return graph  # one chunk per reduction: nothing to split
    gpu_sms = sms or (ctx.target.sms if not ctx.target.interpreted else 0)
    if not splits and not gpu_sms:
        return graph  # a CPU target: more programs only cost (see the module docstring)
    for node in list(graph.nodes()):
        found = _group(node)
        if found is None:
            continue
        members, outer, red = found
        X, R = product(outer), product(red)
        if not (X.is_number and R.is_number) or int(R) < 2:
            continue  # symbolic sizes: left alone (documented)
        X, R = int(X), int(R)
        if not splits and (-(-X // COLUMN_BLOCK) >= programs_per_sm * gpu_sms or R < min_reduced):
            continue  # busy enough even as a column reduction, or too short: no need to look closer
        reductions = [m for m in members if isinstance(m, Reduction)]
        try:
            bodies = _inline(members, len(outer))
        except _Refused:
            ctx.count("split_reductions_refused")
            continue
        column = _columns(bodies[1].values(), outer, red)
        if splits:
            S = min(splits, R)
        else:
            programs = -(-X // COLUMN_BLOCK) if column else X
            aim = programs_per_sm * gpu_sms
            if programs >= aim or R < min_reduced:
                continue
            most = R // min_chunk
            S = min(-(-aim // programs), most)
            if S < 2:
                continue
            S = _near_divisor(R, S, most)
        bad = [m.reduction_type for m in reductions if m.reduction_type not in COMBINABLE]
        if bad:
            ctx.count("split_reductions_refused")  # argmax/argmin: see the module docstring
            continue
        if not ctx.decide("split", node):
            continue
        new = _split_group(graph, node, members, outer, red, S, column, bodies)
        position = graph.order(node.name)
        graph.remove_node(node.name)
        for k, n in enumerate(new):
            graph.add_node(n, order=position + k / (len(new) + 1))
        ctx.count("num_split_reductions", len(reductions))
    return graph
