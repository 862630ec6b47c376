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
partial nodes, and the finishing reductions take the group's epilogue members that read them (as
`finish_node` in backends/triton/kernel.py does for mix-order), so a finishing reduction and its
epilogue are still one kernel; a pointwise member inside the reduction loop that something outside the
group reads is kept as a pointwise node of its own.

Reductions of a group that read no result of each other (cross-entropy's sum of losses and count of
rows) are at one *level*: their partials are one node (one kernel) and their finishing reductions
another. A reduction that reads another's finished result is a level above it, its partials computed
only after that result is finished — except two patterns whose chunks can be combined afterwards, which
stay at the level of the reduction they read (`_pair`): the squared deviations from a group's mean
(var_mean's second pass: LayerNorm, BatchNorm, GroupNorm), each chunk taken about its own mean and the
chunks combined by Chan et al.'s parallel formula, and the sum of exp(x - max) after a max (softmax,
log-softmax, cross-entropy), each chunk against its own max and rescaled to the row's. LayerNorm's
forward over few long rows is thus three kernels (chunk statistics, their combination, the
normalization) where a mean, then a variance, each split on its own, made five and read the rows three
times.

The rule (from the problem and `ctx.target`, never a benchmark shape): the un-split kernel's programs are
estimated as X for a row reduction and X / 16 for a column reduction (a coalesced column block is at
least 16 columns wide: backends/triton/configs.py `rule`). With fewer programs than `programs_per_sm`
per SM, R at least `min_reduced`, and each unsplit program loading at least `min_program_bytes` (R points
times the bytes a point streams — the buffers read that are as large as the reduction, x and dy, not a row's
mean or the weight, and a 32-byte sector for each gathered element that changes along the reduction —
times 16 columns for a column reduction; 256 KB, or `min_finish_only_bytes` for one program whose split adds no
second pass over the rows), S is about programs_per_sm * SMs / programs, but no more
than makes chunks of `min_chunk`; at S < 2 nothing is split.
The bytes bound is what a split must save to pay for the kernels it adds (a finishing kernel, and the
epilogue of a row's result, a norm's normalization, as a kernel of its own): on an H200, 64 rows of 8192
or 30000 (up to 240 KB a row: float32 x and dy) ran faster unsplit in each of LayerNorm, RMSNorm and
softmax, forward and backward, float32 and bfloat16 (16 of 16 points; RMSNorm backward 64 × 8192 bfloat16
8.0 µs split, 4.1 unsplit), while a column sum over many rows or a full sum of a large tensor on a few
programs stays split (BatchNorm's statistics: 8.15 ms unsplit, 1.42 split). Where the unsplit kernel is one
program and the split adds only its finishing kernel — one level of reductions, no row-sized member computed on its
own: a loss's mean over its rows' losses, a full sum — the bound is `min_finish_only_bytes` (80 KB; never above
`min_program_bytes`, so 0 there splits everything): on an H200 a bfloat16 cross-entropy's mean over 44739 rows
(224 KB: a float32 loss and a bool a row) took 9.5 µs on one program and 3.1 split (its partial and finishing
kernels), over 16384 rows (80 KB) 2.9 against 2.4, over 10872 (53 KB) 2.7 either way (fifty-seventh session).
Several programs (few long rows, a column sum's blocks) keep `min_program_bytes`: each has an SM to itself
already, and no such split was timed. The partial kernel's outputs are laid out (S, X) for a column reduction,
so neighbouring programs' lanes read neighbouring columns (coalesced), and (X, S) otherwise. On a CPU target
(Triton's interpreter, the reference backend) a kernel's cost is per program, so the rule splits nothing there
unless `sms` names a GPU to plan for; `splits=N` splits every eligible reduction into N chunks on any target
(tests, experiments).

A run-time R (dynamic shapes: BatchNorm's rows over a varying batch) is split too: S is a number, chosen
by the rule with R taken at the size dynamo traced the graph at (`SchedulerGraph.hints`), and the chunks
are ceil(R / S) points, all masked, so one kernel serves every size; below S * (S - 1) points the last
chunks hold none (their partials are the identity; the variance's combination skips them, as 0 / 0 would
carry a NaN into it). Left alone: MixOrderNodes, pointwise and extern nodes, argmax/argmin, a group whose
pieces could not be ordered (a kept in-loop member reading a finished result and an input the finishing node
overwrites), and a symbolic X (the count of outputs decides the programs: S would have to be chosen per call). Stats:
`num_split_reductions` (reductions split), `split_reductions_refused` (groups the rule chose but that
cannot be split).
"""
from __future__ import annotations

import math
from typing import Annotated

import sympy
import torch

from ..ir import (
    Buffer,
    Cast,
    Constant,
    FusedNode,
    IndexValue,
    Layout,
    Load,
    Op,
    Pointwise,
    Reduction,
    rebuild,
    streamed,
    substitute_index,
    walk,
)
from ..ir.index import (
    FloorDiv,
    ModularIndexing,
    VarKind,
    as_strided_form,
    contiguous_strides,
    loop_vars,
    product,
    var_kind,
)
from ..ir.loops import Role, canon_var, canonical_map, role, shape, store_access
from ..lowering.sizes import at_hint
from ..pipeline.registry import AtLeast, register_pass
from .legality import COLUMN_BLOCK

COMBINABLE = ("sum", "prod", "max", "min", "any", "all")
# the fewest bytes an unsplit program loads that the rule splits (see the module docstring)
MIN_PROGRAM_BYTES = 256 << 10
# ... where the split adds only its finishing kernel (no second pass over the rows; see the module docstring)
MIN_FINISH_ONLY_BYTES = 80 << 10
# what a gathered element costs a program: the whole 32-byte sector memory moves for it, and a latency its
# neighbours' loads do not hide (a cross-entropy's target logit, one per row of a vocabulary)
SECTOR = 32


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
    # a group with no reduction (tile_rows' row tile of pointwise members) has nothing to split
    if isinstance(node, FusedNode) and node.reduction_ranges and any(isinstance(m, Reduction) for m in node.nodes):
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


def _point_bytes(bodies: tuple, layouts: dict, points: int, hints: dict) -> int:
    """Bytes the group's reductions stream a reduced point: the element sizes of the distinct buffers they read
    directly that hold as many elements as the reduction has points (x and dy in a norm's backward; not its
    per-row mean and rstd, nor the weight, which a program reads once or finds in cache), and a SECTOR for
    each distinct gather whose element changes along the reduction (an indirect load: a cross-entropy
    mean's target logits); 4 where there is none."""
    loads = [v for body in bodies[1].values() for v in walk(body) if isinstance(v, Load)]
    gathers = {(v.buffer, v.index, v.indirect) for v in loads if v.indirect and _along_reduction(v)}
    sizes = []
    for b in {v.buffer for v in loads if not v.indirect}:
        n = at_hint(layouts[b].layout.numel, hints) if b in layouts else None
        if n is not None and n >= points:
            sizes.append(layouts[b].dtype.itemsize)
    return sum(sizes) + SECTOR * len(gathers) or 4


def _along_reduction(v: Load) -> bool:
    """Whether gather `v` reads another element at each reduced point: its index, or the index of a value
    its position is bound to, uses a reduction loop (a cross-entropy mean's target logit, one a row of the
    sum) — not one element a program that the reduction reuses (`w[idx][:, None]` in a row sum)."""
    syms = set(v.index.free_symbols)
    for b in v.indirect:
        syms |= {s for u in walk(b.value) if isinstance(u, Load) for s in u.index.free_symbols}
    return any(var_kind(s) in (VarKind.CANON_REDUCTION, VarKind.REDUCTION) for s in syms)


def _columns(bodies, outer: tuple, red: tuple, sizes: dict) -> bool:
    """Whether the reduction walks memory across rows (a column reduction): no load of the largest buffers it reads
    (`ir.streamed`, `sizes`: the graph's `numels`) steps along the innermost reduction loop contiguously, and some
    steps along an outer loop contiguously. The smaller ones do not decide: a norm's weight gradient sums
    dy * (x - mean[r]) * rstd[r] over the rows r, and its per-row statistics step along r while x and dy, the
    stream, go across the rows."""
    q = canon_var(VarKind.CANON_REDUCTION, len(red) - 1)
    os_ = [canon_var(VarKind.CANON_OUTER, k) for k in range(len(outer))]
    column = False
    for v in streamed([v for body in bodies for v in walk(body) if isinstance(v, Load)], sizes):
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
        self.outer = tuple(int(s) for s in outer)
        self.symbolic = not product(red).is_number
        self.red = tuple(sympy.sympify(s) if self.symbolic else int(s) for s in red)
        if self.symbolic:
            # a run-time R: S chunks of ceil(R / S), every chunk masked; at sizes below S * (S - 1) the
            # last chunks may hold no point at all (their partials are the identity, see _chunk_points)
            self.R = product(self.red)
            self.chunk = FloorDiv(self.R + splits - 1, splits)
            self.S = splits
            self.masked = True
        else:
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
        if not self.masked:
            stride = int(stride)  # whole chunks: a variable that only one of s and j reaches needs only that one
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
            inside = Op("lt", (IndexValue(self.flat, torch.int64), self.points(torch.int64)), torch.bool)
            out = Op("where", (inside, out, _identity(rtype, out.dtype)), out.dtype)
        return out

    def points(self, dtype: torch.dtype):
        """R as a value of `dtype` (a size expression under dynamic shapes)."""
        if self.symbolic:
            value = IndexValue(self.R, torch.int64)
            return value if dtype == torch.int64 else Cast(value, dtype)
        return Constant(float(self.R) if dtype.is_floating_point else self.R, dtype)

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


def _same(a, b) -> bool:
    """Whether two loop-body values compute the same thing (indices compared after expansion)."""
    def norm(v):
        if isinstance(v, Load):
            return Load(v.buffer, sympy.expand(v.index), v.dtype, v.indirect)
        if isinstance(v, IndexValue):
            return IndexValue(sympy.expand(v.expr), v.dtype, v.indirect)
        return v

    return rebuild(a, norm) == rebuild(b, norm)


def _is_result(v, a: Reduction, at) -> bool:
    """Whether `v` loads reduction `a`'s result at the group's point (`at`: its canonical store index)."""
    return isinstance(v, Load) and v.buffer == a.output.name and not v.indirect and sympy.expand(v.index - at) == 0


def _is_count(v, R) -> bool:
    """Whether `v` is the value R: a constant, or under dynamic shapes the size expression as a float."""
    if isinstance(v, Constant):
        return float(v.value) == R
    if isinstance(v, Cast) and isinstance(v.value, IndexValue) and not v.value.indirect:
        return sympy.expand(v.value.expr - R) == 0
    return False


def _pair(a: Reduction, b: Reduction, body_a, body_b, n_outer: int, R: int) -> str | None:
    """How `b`, whose body reads the finished result of `a` (and of no other reduction of the group), can
    still be reduced chunk by chunk, its chunks combined afterwards — or None:

    - "deviation": a = sum(e), b = sum((e - a/R)^2), the squared deviations from the mean (var_mean's
      second pass: LayerNorm, BatchNorm, GroupNorm). Per chunk k of n_k points: its sum s_k and its own
      squared deviations m_k about its own mean s_k/n_k; then b = sum_k m_k + n_k (s_k/n_k - a/R)^2
      (Chan et al.'s parallel variance: exact, and as careful as the two passes, since each chunk's
      deviations are taken about its own mean, never the squares' difference E[x^2] - E[x]^2);
    - "rescale": a = max(e), b = sum(exp(e - a)) (softmax, log-softmax, cross-entropy, logsumexp). Per
      chunk its max m_k and s_k = sum(exp(e - m_k)); then b = sum_k exp(m_k - a) s_k (online softmax's
      rescaling; a chunk of -inf only adds 0, a row of -inf gives NaN as eager's exp(-inf - -inf))."""
    if not (a.body.dtype.is_floating_point and b.body.dtype == a.body.dtype) or b.reduction_type != "sum":
        return None
    at = store_access(a, n_outer).index
    if a.reduction_type == "sum" and isinstance(body_b, Op) and body_b.name == "mul":
        d, d2 = body_b.args
        if not (_same(d, d2) and isinstance(d, Op) and d.name == "sub" and _same(d.args[0], body_a)):
            return None
        mean = d.args[1]
        if isinstance(mean, Op) and mean.name == "truediv" and _is_result(mean.args[0], a, at) and \
                _is_count(mean.args[1], R):
            return "deviation"
    if a.reduction_type == "max" and isinstance(body_b, Op) and body_b.name == "exp":
        (d,) = body_b.args
        if isinstance(d, Op) and d.name == "sub" and _same(d.args[0], body_a) and _is_result(d.args[1], a, at):
            return "rescale"
    return None


def _levels(members, reduced: dict, n_outer: int, R: int) -> tuple[dict, dict]:
    """Each reduction's level ({name: level}) and the pairs found ({b name: (a, how)}). A reduction whose
    (inlined) body reads no other reduction of the group is at level 0; one that reads finished results
    is one level above the highest of them, unless it pairs with the one it reads (`_pair`): it then
    shares that reduction's level, its chunks computed beside that one's. The reductions of one level
    share one partial kernel and one finishing kernel."""
    reductions = [m for m in members if isinstance(m, Reduction)]
    by_output = {m.output.name: m for m in reductions}
    level, pairs = {}, {}
    for m in reductions:
        reads = {v.buffer for v in walk(reduced[m.name]) if isinstance(v, Load)}
        deps = [by_output[b] for b in sorted(reads) if b in by_output and b != m.output.name]
        if len(deps) == 1 and deps[0].name not in pairs:
            how = _pair(deps[0], m, reduced[deps[0].name], reduced[m.name], n_outer, R)
            if how is not None:
                pairs[m.name] = (deps[0], how)
                level[m.name] = level[deps[0].name]
                continue
        level[m.name] = 1 + max((level[d.name] for d in deps), default=-1)
    return level, pairs


def _split_group(graph, node, members, outer, red, splits: int, column: bool, bodies) -> list | None:
    """The nodes replacing `node`: kept inner members, then per level (see `_levels`) one partial node
    holding the partial reductions of that level and one finishing node holding their finishing
    reductions and the epilogue members that read them; None where the pieces could not be ordered."""
    pointwise, reduced = bodies
    sp = _Split(outer, red, splits, column)
    n = len(outer)
    keep = graph.output_names() | graph.mutated_names()
    outside = {b for b in node.output_names() if b in keep or any(r != node.name for r in graph.readers(b))}
    # epilogue members that nothing reads any more (their readers were inlined into partials) are dropped
    needed = set(outside)
    for m in reversed(members):
        if not isinstance(m, Reduction) and role(m, outer, red) is Role.OUTER and (m.output.name in needed
                                                                                   or m.mutates):
            needed |= set(m.read_names())
    level, pairs = _levels(members, reduced, n, sp.R)
    taken: set = set()

    def fresh(name):
        new = _fresh(graph, name)
        k = 1
        while new in taken:
            new, k = _fresh(graph, f"{name}{k}"), k + 1
        taken.add(new)
        return new

    partial_of: dict = {}  # reduction name -> its partial Reduction
    top = max(level.values())
    partials, stages = [[] for _ in range(top + 1)], [[] for _ in range(top + 1)]
    inner_kept = []
    at_level: dict = {}  # member output -> the level whose finishing node computes it
    for m in members:
        if isinstance(m, Reduction):
            L = level[m.name]
            name = fresh(f"{m.name}_partial")
            pair = pairs.get(m.name)
            partial = partial_of[pair[0].name] if pair else None
            canon = reduced[m.name] if pair is None else _paired_partial(sp, pair[1], reduced[m.name], partial)
            body = sp.body(canon, m.reduction_type)
            layout = Layout.contiguous(sp.ranges, body.dtype, m.output.layout.device)
            partial_of[m.name] = Reduction(name, sp.ranges, (sp.chunk,), m.reduction_type, body,
                                           Buffer(name, layout), m.origins)
            partials[L].append(partial_of[m.name])
            fin = Reduction(m.name, m.ranges, (sp.S,), m.reduction_type,
                            Load(name, sp.finish_index(m), body.dtype), m.output, m.origins, m.permutation)
            if pair is not None:
                fin = _paired_finish(sp, pair, fin, partial, partial_of[m.name], n)
            stages[L].append(fin)
            at_level[m.output.name] = L
        elif role(m, outer, red) is Role.INNER:
            if m.output.name in outside:  # read elsewhere: computed on its own (and inlined into the partials)
                back = {c: v for v, c in canonical_map(m, n).items() if isinstance(c, sympy.Symbol)}
                inner_kept.append(Pointwise(m.name, m.ranges, substitute_index(pointwise[m.output.name], back),
                                            m.output, m.origins, m.permutation))
        elif m.output.name in needed or m.mutates:
            # an epilogue goes with the highest level it reads (a prologue over X alone with the first)
            L = max((at_level[b] for b in m.read_names() if b in at_level), default=0)
            at_level[m.output.name] = L
            stages[L].append(m)
    # a kept in-loop member reading both a finished result and a buffer the finishing node overwrites in place
    # (an input's old value) would have to run after that node and before it: such a group stays whole
    for k in inner_kept:
        reads = set(k.read_names())
        for stage in stages:
            finished = {m.output.name for m in stage}
            if reads & finished and any(reads & set(m.mutates) for m in stage):
                return None
    out = list(inner_kept)
    first = True
    for L in range(top + 1):
        group = partials[L]
        out.append(group[0] if len(group) == 1 else
                   FusedNode(fresh(f"fused_{group[0].name}"), tuple(group), tuple(sp.ranges), (sp.chunk,)))
        stage = stages[L]
        if len(stage) == 1:
            out.append(stage[0])
        else:
            name = node.name if first and isinstance(node, FusedNode) else fresh(f"fused_{stage[0].name}")
            out.append(FusedNode(name, tuple(stage), tuple(outer), (sp.S,)))
        first = False
    return out


def _chunk_points(sp: _Split, s, dtype: torch.dtype):
    """The points of chunk `s` as a value: `chunk`, and fewer for the last one where it runs past R (none
    for a chunk past R, which only a run-time R has)."""
    if sp.symbolic:
        return IndexValue(sympy.Max(sympy.Min(sp.chunk, sp.R - s * sp.chunk), 0), dtype)
    if sp.masked:
        return IndexValue(sympy.Min(sp.chunk, sp.R - s * sp.chunk), dtype)
    return Constant(float(sp.chunk), dtype)


def _paired_partial(sp: _Split, how: str, body_b, partial_a: Reduction):
    """The canonical body of paired reduction b's partial: its chunk's own statistic, computed from the
    chunk's partial of a (a member of the same partial kernel, read at the point it is written)."""
    dt = body_b.dtype
    mine = Load(partial_a.output.name, partial_a.store_index(), dt)  # where it stores: the same point
    if how == "deviation":  # sum over the chunk of (e - s_k / n_k)^2
        d, _ = body_b.args
        e = d.args[0]
        n_k = _chunk_points(sp, sp.s, dt)
        dev = Op("sub", (e, Op("truediv", (mine, n_k), dt)), dt)
        return Op("mul", (dev, dev), dt)
    # rescale: sum over the chunk of exp(e - m_k)
    (d,) = body_b.args
    return Op("exp", (Op("sub", (d.args[0], mine), dt),), dt)


def _paired_finish(sp: _Split, pair, fin: Reduction, partial_a: Reduction, partial_b: Reduction, n_outer: int):
    """Paired reduction b's finishing reduction: its chunks' statistics combined with a's finished result
    (a member of the same finishing kernel, read at the point it is written); see `_pair`."""
    a, how = pair
    dt = fin.body.dtype
    (r0,) = loop_vars(VarKind.REDUCTION, 1)
    a_k = Load(partial_a.output.name, sp.finish_index(fin), dt)
    b_k = Load(partial_b.output.name, sp.finish_index(fin), dt)
    back = {c: v for v, c in canonical_map(fin, n_outer).items()
            if isinstance(c, sympy.Symbol) and var_kind(c) is VarKind.CANON_OUTER}
    total = Load(a.output.name, store_access(a, n_outer).index.xreplace(back), dt)
    if how == "deviation":  # m2_k + n_k (s_k / n_k - a / R)^2
        n_k = _chunk_points(sp, r0, dt)
        d = Op("sub", (Op("truediv", (a_k, n_k), dt), Op("truediv", (total, sp.points(dt)), dt)), dt)
        term = Op("mul", (n_k, Op("mul", (d, d), dt)), dt)
        if sp.symbolic:  # a chunk of no point: s_k / 0 is NaN, and 0 * NaN would spoil the sum
            term = Op("where", (Op("gt", (n_k, Constant(0.0, dt)), torch.bool), term, Constant(0.0, dt)), dt)
        body = Op("add", (b_k, term), dt)
    else:  # exp(m_k - a) s_k; a chunk of -inf adds 0 (its s_k is NaN), a row of -inf is NaN
        ninf = Constant(float("-inf"), dt)
        term = Op("mul", (Op("exp", (Op("sub", (a_k, total), dt),), dt), b_k), dt)
        term = Op("where", (Op("eq", (a_k, ninf), torch.bool), Constant(0.0, dt), term), dt)
        body = Op("where", (Op("eq", (total, ninf), torch.bool), Constant(float("nan"), dt), term), dt)
    return Reduction(fin.name, fin.ranges, fin.reduction_ranges, "sum", body, fin.output, fin.origins,
                     fin.permutation)


def _fresh(graph, name: str) -> str:
    new, k = name, 1
    taken = graph.buffers()
    while new in graph or new in taken:
        new, k = f"{name}{k}", k + 1
    return new


@register_pass("split_reductions", provides={"split_reductions"})
def split_reductions(graph, ctx, *,
                     splits: Annotated[int, "chunks per reduction on any target (0: by the rule; 1: none)",
                                            AtLeast(0)] = 0,
                     sms: Annotated[int, "SMs to plan for (0: the target's; none on a CPU target)", AtLeast(0)] = 0,
                     programs_per_sm: Annotated[int, "programs per SM the rule aims for", AtLeast(1)] = 2,
                     # (min_reduced 1 acts as 2, a range of one point is never split: any positive bound is accepted)
                     min_reduced: Annotated[int, "shortest reduced range the rule splits", AtLeast(1)] = 4096,
                     min_chunk: Annotated[int, "fewest reduced points per chunk under the rule", AtLeast(1)] = 1024,
                     min_program_bytes: Annotated[int, "fewest bytes an unsplit program loads that the rule "
                                                  "splits", AtLeast(0)] = MIN_PROGRAM_BYTES,
                     min_finish_only_bytes: Annotated[int, "the same for one program whose split adds only a "
                                                      "finishing kernel (never above min_program_bytes)",
                                                      AtLeast(0)] = MIN_FINISH_ONLY_BYTES):
    """Split reductions with few outputs over a long range into partial and finishing reductions."""
    if splits == 1:
        return graph  # one chunk per reduction: nothing to split
    gpu_sms = sms or (ctx.target.sms if not ctx.target.interpreted else 0)
    if not splits and not gpu_sms:
        return graph  # a CPU target: more programs only cost (see the module docstring)
    layouts = graph.buffers()
    for node in list(graph.nodes()):
        found = _group(node)
        if found is None:
            continue
        members, outer, red = found
        X, R = product(outer), product(red)
        if not X.is_number:
            continue  # symbolic outputs: left alone (documented)
        # a run-time reduced range is split too, into chunks counted from its size at the hint
        symbolic = not R.is_number
        R = at_hint(R, graph.hints) if symbolic else int(R)
        if R is None or R < 2:
            continue
        X = int(X)
        if not splits and (-(-X // COLUMN_BLOCK) >= programs_per_sm * gpu_sms or R < min_reduced):
            continue  # busy enough even as a column reduction, or too short: no need to look closer
        reductions = [m for m in members if isinstance(m, Reduction)]
        try:
            bodies = _inline(members, len(outer))
        except _Refused:
            ctx.count("split_reductions_refused")
            continue
        column = _columns(bodies[1].values(), outer, red, graph.numels())
        if splits:
            S = splits if symbolic else min(splits, R)
        else:
            programs = -(-X // COLUMN_BLOCK) if column else X
            aim = programs_per_sm * gpu_sms
            if programs >= aim or R < min_reduced:
                continue
            loads = R * (min(COLUMN_BLOCK, X) if column else 1) * _point_bytes(bodies, layouts, X * R, graph.hints)
            # one program alone (a loss's mean, a full sum) may pay from the lower bound (see the docstring)
            if loads < (min(min_program_bytes, min_finish_only_bytes) if programs == 1 else min_program_bytes):
                continue  # each program's work is shorter than the kernels a split adds (see the docstring)
            most = R // min_chunk
            S = min(-(-aim // programs), most)
            if S < 2:
                continue
            S = S if symbolic else _near_divisor(R, S, most)
        bad = [m.reduction_type for m in reductions if m.reduction_type not in COMBINABLE]
        if bad:
            ctx.count("split_reductions_refused")  # argmax/argmin: see the module docstring
            continue
        new = _split_group(graph, node, members, outer, red, S, column, bodies)
        if new is None:
            ctx.count("split_reductions_refused")
            continue
        if not splits and loads < min_program_bytes and len(new) > 2:
            continue  # it would add a pass over the rows besides its finishing kernel, for too little work
        if not ctx.decide("split", node):
            continue
        graph.replace_nodes(node.name, new)
        ctx.count("num_split_reductions", len(reductions))
    return graph
