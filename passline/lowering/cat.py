"""`aten.cat` as a Pointwise gather, so that it fuses with the math around it (RoPE's rotate-half,
`x * cos + cat((-x2, x1), -1) * sin`, is one kernel) instead of running as an extern copy per input.

The value at each output point is the element of the input that owns that point along `dim`: with
inputs of sizes n_0..n_k along `dim` at offsets o_0 = 0, o_j = n_0 + ... + n_(j-1),

    out[.., i, ..] = where(i < o_1, x_0[.., p_0, ..], where(i < o_2, x_1[.., p_1, ..], ... x_k[.., p_k, ..]))
    p_j = Min(Max(i - o_j, 0), n_j - 1)

Every input is loaded at every point, so each load's position is clamped into its own input's range and
`where` keeps the owner's value: no load ever leaves its buffer. Clamped indices rather than masked loads
in the IR: `slice_scatter` already selects this way, both backends print `Max`/`Min`, and the index
analyses already treat them conservatively (`as_strided_form` gives None for an index with a clamp in a
loop variable, so fusion compares such reads as "different", merge_loops never merges the cat dim, and the
verifier's bounds check skips them), whereas masked loads would be a new IR form for the verifier, both
backends, inlining and the dumps. `inline_pointwise` knows a clamp's range, so a cheap producer of an
input (RoPE's `-x2`) is recomputed inside the cat.

Falls back to the extern (returns NotImplemented) when the gather is not the better or not a provably safe
form: more than MAX_INPUTS inputs, inputs whose other dims are not provably the output's, or a symbolic
size along `dim` not provably at least 1 (a clamp into an empty input would read outside it).
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Constant, IndexValue, Op
from ..ir.index import sympify
from .context import cast
from .registry import lowering
from .sizes import lower_bounds
from .tensor import TensorRef, index_value, provably_lt

aten = torch.ops.aten

# Every output point loads from every input (the clamped loads of the inputs it does not own are wasted
# work, though they hit the one edge element per input and so cost no memory traffic), so a k-input cat
# costs k loads and k-1 selects per point where the extern copies each element once. Up to 8 inputs the
# fused kernel wins by the round trip through memory it saves its producers and consumers (Inductor's
# bound too, `max_pointwise_cat_inputs`); past that the per-point work grows with the number of inputs
# while the saving does not. Sizes need no rule: the wasted loads cost no traffic at any size.
MAX_INPUTS = 8


def _is_legacy_empty(val) -> bool:
    """aten's cat skips 1-D empty tensors whatever the other inputs' rank (`torch.cat([x, torch.tensor([])])`)."""
    return val.dim() == 1 and val.shape[0] == 0


@lowering(aten.cat.default)
def lower_cat(ctx, node, tensors, dim=0):
    out = node.meta["val"]
    nd = out.dim()
    if nd == 0 or not all(isinstance(t, TensorRef) for t in tensors):
        return NotImplemented
    dim = dim + nd if dim < 0 else dim
    size = tuple(sympify(s) for s in out.shape)
    bounds = lower_bounds(node)
    kept = []  # (input, its size along dim)
    for t, fx in zip(tensors, node.args[0]):
        if _is_legacy_empty(fx.meta["val"]) and nd != 1:
            continue
        n = t.size[dim]
        if n == 0:
            continue  # contributes nothing; aten skips it too
        if t.ndim != nd or any(sympy.expand(t.size[d] - size[d]) != 0 for d in range(nd) if d != dim):
            return NotImplemented
        if not (n.is_Integer or provably_lt(0, n, bounds)):
            return NotImplemented  # may be empty at run time: its clamped load would leave the buffer
        kept.append((t, n))
    if len(kept) > MAX_INPUTS:
        return NotImplemented
    dtype = out.dtype
    if not kept or any(s == 0 for s in size):  # nothing to load: an empty result
        return ctx.pointwise(out.shape, dtype, lambda idx: Constant(0, dtype))

    def inner(idx):
        i = idx[dim]
        offset = sympy.S.Zero
        values, starts = [], []
        for t, n in kept:
            # one input owns every point: a copy, no clamp (which would keep merge_loops off this dim)
            pos = i if len(kept) == 1 else sympy.Min(sympy.Max(i - offset, 0), n - 1)
            values.append(cast(t.load([*idx[:dim], pos, *idx[dim + 1:]]), dtype))
            starts.append(offset)
            offset = offset + n
        result = values[-1]
        for value, end in zip(reversed(values[:-1]), reversed(starts[1:])):
            below = Op("lt", (IndexValue(i, torch.int64), index_value(end)), torch.bool)
            result = Op("where", (below, value, result), dtype)
        return result

    return ctx.pointwise(out.shape, dtype, inner)

