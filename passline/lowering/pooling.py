"""Max pooling as generated kernels: `max_pool2d_with_indices` / `max_pool3d_with_indices` and their
backwards, lowered to Pointwise nodes instead of extern aten calls, so that the pool fuses with the
BatchNorm/ReLU before it and the residual add after it (ResNet's stem), and its indices never go to
memory as int64 (the partition saves window offsets, backends/partition.py).

**Forward.** Each output point scans its window's taps in eager's order (the first spatial dimension
outermost) and keeps a tap when `value > best or isnan(value)`, eager's rule: the first maximum wins, a NaN
wins and stays (the last NaN's position), and a window of -inf keeps its first in-bounds tap. Taps in the
padding are skipped by a position check, loading a clamped (in-bounds) address as `cat` does; a check
that holds for every output (an interior tap, sizes known) is left out. The index is the flat position in
the input plane, as eager's; the value and the index are two nodes over the same loops, which fuse into
one kernel and share the loads.

**Backward.** A gather over the input gradient, not eager's scatter: an input point sums the output
gradients of the windows that may hold it as a tap (at most `(k-1)*dilation // stride + 1` per
dimension, from the first window reaching it), where the saved index names it. The sum runs in eager's
order (outputs in increasing order), in float32 for half-precision gradients. A window's saved index is a
tap of that window, so comparing it with the point's position is exact: no output is counted twice or
missed.

Windows of more than MAX_TAPS taps (forward and backward alike: the gather is exact only for indices
that are taps, which aten's forward does not guarantee for a window of -inf; and backwards with more than
MAX_TAPS candidate windows), integer dtypes and non-constant window parameters stay extern calls.
"""
from __future__ import annotations

import itertools
import math

import attrs
import sympy
import torch

from ..ir import Constant, IndexValue, Op
from ..ir.index import FloorDiv, sympify
from .context import cast, upcast
from .registry import lowering
from .sizes import lower_bounds
from .tensor import TensorRef, provably_lt

aten = torch.ops.aten

# Each tap is a load, a compare and two selects per output point (each candidate window of the backward
# two loads, a compare and an add per input point), all unrolled in the kernel. 25 taps is Inductor's bound
# for the same unrolled form (a 5 x 5 window); past it the kernel's code grows with no memory traffic
# saved, and the extern's loop is as good.
MAX_TAPS = 25

# the max-pool ops passline lowers (and backends/partition.py compacts), with their spatial dimensions
FORWARDS = {aten.max_pool2d_with_indices.default: 2, aten.max_pool3d_with_indices.default: 3}
BACKWARDS = {aten.max_pool2d_with_indices_backward.default: 2, aten.max_pool3d_with_indices_backward.default: 3}
POOLS = FORWARDS | BACKWARDS


@attrs.frozen
class Window:
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple

    @classmethod
    def of(cls, n: int, kernel, stride, padding, dilation) -> "Window | None":
        """The window's parameters, n entries each, as eager reads them (an empty stride is the kernel's;
        one entry stands for every dimension); None where one is not a constant int."""

        def full(v):
            v = [v] if isinstance(v, (int, sympy.Integer)) else list(v)
            if len(v) == 1:
                v = v * n
            if len(v) != n or not all(isinstance(a, (int, sympy.Integer)) and not isinstance(a, bool) for a in v):
                return None
            return tuple(int(a) for a in v)

        k, p, d = full(kernel), full(padding), full(dilation)
        s = full(stride) if stride is not None and len(stride) else k
        if None in (k, s, p, d) or min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
            return None
        return cls(k, s, p, d)


def _flat(coords, sizes):
    """The flat position of `coords` in a plane of `sizes` (row-major, as eager's indices count)."""
    out = sympy.S.Zero
    for c, s in zip(coords, sizes):
        out = out * s + c
    return sympy.expand(out)


def _lt(a, bound):
    """The bool value a < bound (an index expression against a size)."""
    b = Constant(int(bound), torch.int64) if bound.is_Integer else IndexValue(bound, torch.int64)
    return Op("lt", (IndexValue(a, torch.int64), b), torch.bool)


def _all(checks, value):
    for c in checks:
        value = Op("logical_and", (c, value), torch.bool)
    return value


@lowering(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def lower_max_pool(ctx, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = POOLS[node.target]
    w = Window.of(n, kernel_size, stride, padding, dilation)
    values, indices = node.meta["val"]
    if (w is None or not isinstance(x, TensorRef) or not values.dtype.is_floating_point
            or math.prod(w.kernel) > MAX_TAPS):
        return NotImplemented
    ins = x.size[-n:]
    outs = tuple(sympify(s) for s in values.shape[-n:])
    bounds = lower_bounds(node)
    ct = upcast(values.dtype)

    def scan(idx):
        lead, o = idx[:-n], idx[-n:]
        starts = [o[d] * w.stride[d] - w.padding[d] for d in range(n)]
        # where eager starts a window of -inf (or of taps all in the padding): its first in-bounds tap
        first = []
        for d in range(n):
            if w.padding[d] == 0:
                first.append(starts[d])
            elif w.dilation[d] == 1:
                first.append(sympy.Max(starts[d], 0))
            else:
                dl = w.dilation[d]
                first.append(starts[d] + dl * FloorDiv(sympy.Max(-starts[d], 0) + dl - 1, dl))
        best = Constant(float("-inf"), ct)
        at = IndexValue(_flat(first, ins), torch.int64)
        for tap in itertools.product(*(range(k) for k in w.kernel)):
            pos, where, checks = [], [], []
            for d in range(n):
                p = starts[d] + tap[d] * w.dilation[d]
                pos.append(p)
                low = tap[d] * w.dilation[d] >= w.padding[d]  # in bounds below for every output
                high = provably_lt((outs[d] - 1) * w.stride[d] - w.padding[d] + tap[d] * w.dilation[d], ins[d],
                                   bounds)
                if not low:
                    checks.append(Op("ge", (IndexValue(p, torch.int64), Constant(0, torch.int64)), torch.bool))
                if not high:
                    checks.append(_lt(p, ins[d]))
                where.append(p if low and high else sympy.Min(sympy.Max(p, 0), ins[d] - 1))
            v = cast(x.load([*lead, *where]), ct)
            take = Op("logical_or", (Op("gt", (v, best), torch.bool), Op("isnan", (v,), torch.bool)), torch.bool)
            take = _all(checks, take)
            best = Op("where", (take, v, best), ct)
            at = Op("where", (take, IndexValue(_flat(pos, ins), torch.int64), at), torch.int64)
        return best, at

    # one scan for both nodes: their bodies share its values (compared by identity, not walked twice)
    scanned = {}

    def once(idx):
        if idx not in scanned:
            scanned[idx] = scan(idx)
        return scanned[idx]

    out = ctx.pointwise(values.shape, values.dtype, lambda idx: once(idx)[0])
    where = ctx.pointwise(indices.shape, indices.dtype, lambda idx: once(idx)[1])
    return out, where


@lowering(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def lower_max_pool_backward(ctx, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    n = POOLS[node.target]
    w = Window.of(n, kernel_size, stride, padding, dilation)
    val = node.meta["val"]
    if w is None or not all(isinstance(t, TensorRef) for t in (grad, x, indices)) \
            or not val.dtype.is_floating_point:
        return NotImplemented
    if math.prod(w.kernel) > MAX_TAPS:
        # the forward of this window is aten's, whose index for a window of -inf is not always one of its
        # taps (0, on the CPU's channels_last_3d kernel and CUDA's channels_last one): the gather would drop
        # that gradient, where aten's backward puts it at the index, as eager does
        return NotImplemented
    ins, outs = x.size[-n:], grad.size[-n:]
    # windows that may hold a point as a tap, per dimension (at most the outputs there)
    counts = [(k - 1) * dl // s + 1 for k, s, dl in zip(w.kernel, w.stride, w.dilation)]
    counts = [min(c, int(o)) if o.is_Integer else c for c, o in zip(counts, outs)]
    if math.prod(counts) > MAX_TAPS:
        return NotImplemented
    bounds = lower_bounds(node)
    ct = upcast(val.dtype)

    def firsts(i):
        """Per dimension, the first window reaching point i: max(0, ceil((i + p - (k-1)d) / s)), written
        with a floor division of a non-negative value (shifted by m strides)."""
        out = []
        for d in range(n):
            k, s, p, dl = w.kernel[d], w.stride[d], w.padding[d], w.dilation[d]
            m = -(-((k - 1) * dl) // s)
            out.append(sympy.Max(0, FloorDiv(i[d] + p - (k - 1) * dl + s - 1 + m * s, s) - m))
        return out

    def gather(idx):
        lead, i = idx[:-n], idx[-n:]
        here = IndexValue(_flat(i, ins), torch.int64)
        start = firsts(i)
        last = firsts([sz - 1 for sz in ins])  # the largest first window, at the last point
        total = Constant(0, ct)
        for cand in itertools.product(*(range(c) for c in counts)):
            at, checks = [], []
            for d in range(n):
                o = start[d] + cand[d]
                if not provably_lt(last[d] + cand[d], outs[d], bounds):
                    checks.append(_lt(o, outs[d]))
                # clamped even where it is provably in range: a clamp is what lets inline_pointwise map
                # the load to one point of its producer (passes/points.py), so the saved offsets' conversion
                # and the output gradient's producer are recomputed here, not stored and read back
                at.append(sympy.Min(o, outs[d] - 1))
            hit = Op("eq", (cast(indices.load([*lead, *at]), torch.int64), here), torch.bool)
            g = cast(grad.load([*lead, *at]), ct)
            total = Op("add", (total, Op("where", (_all(checks, hit), g, Constant(0, ct)), ct)), ct)
        return total

    return ctx.pointwise(val.shape, val.dtype, gather)
