"""Views as index rewrites: no node is created, the TensorRef's index function changes.

Output sizes are taken from the FX node's recorded value, so -1 sizes, negative dims and slice
bounds are already resolved the way aten resolves them.
"""
from __future__ import annotations

import sympy
import torch

from ..ir.index import sympify
from .registry import lowering
from .sizes import lower_bounds
from .tensor import TensorRef, index_value

aten = torch.ops.aten
prims = torch.ops.prims


def _size(node) -> tuple:
    return tuple(sympify(s) for s in node.meta["val"].shape)


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _is_tensor(x) -> bool:
    return isinstance(x, TensorRef)


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, prims.reshape.default)
def lower_view(ctx, node, x, size):
    return x.reshape(_size(node), lower_bounds(node))


@lowering(aten.alias.default, aten.detach.default)
def lower_alias(ctx, node, x):
    return x


@lowering(aten.permute.default)
def lower_permute(ctx, node, x, dims):
    return x.permute([_dim(d, x.ndim) for d in dims])


@lowering(aten.t.default)
def lower_t(ctx, node, x):
    return x.permute([1, 0]) if x.ndim == 2 else x


@lowering(aten.transpose.int)
def lower_transpose(ctx, node, x, a, b):
    dims = list(range(x.ndim))
    a, b = _dim(a, x.ndim), _dim(b, x.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return x.permute(dims)


@lowering(aten.expand.default, prims.broadcast_in_dim.default)
def lower_expand(ctx, node, x, size, *rest):
    if node.target is prims.broadcast_in_dim.default:
        (dims,) = rest
        kept = set(dims)
        for d in range(len(size)):
            if d not in kept:
                x = x.unsqueeze(d)
    return x.expand(_size(node))


@lowering(aten.unsqueeze.default)
def lower_unsqueeze(ctx, node, x, dim):
    return x.unsqueeze(_dim(dim, x.ndim + 1))


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, prims.squeeze.default)
def lower_squeeze(ctx, node, x, dims=None):
    if dims is None:
        dims = range(x.ndim)
    elif isinstance(dims, int):
        dims = [dims]
    if not x.ndim:
        return x
    dims = [_dim(d, x.ndim) for d in dims]
    return x.squeeze(dims, ones=_traced_ones(node, dims))


def _traced_ones(node, dims) -> set:
    """The dims of `dims` whose size tracing found to be 1 though it is a size expression (under dynamic
    shapes `ceil(s0 / 3)` for `x[:, ::3]` of 2 columns): torch dropped them, with a guard that keeps the
    graph to sizes where they are 1. Found by fuzzing: such a squeeze kept the dim, a (5, 1) result for
    eager's (5,). Read from the traced input (its symbolic sizes), as torch decided."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    out = node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() == src.dim():
        return set()
    return {d for d in dims if isinstance(src.shape[d], torch.SymInt) and guard_or_false(src.shape[d] == 1)}


@lowering(aten.slice.Tensor)
def lower_slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, x.ndim)
    length = _size(node)[dim]
    size = x.size[dim]
    start = sympify(0 if start is None else start)
    # aten clamps start into [0, size]; only integer starts need the clamp done here
    if start.is_Integer and size.is_Integer:
        s = int(start)
        start = sympy.Integer(min(max(s + int(size) if s < 0 else s, 0), int(size)))
    elif not known_nonnegative(start):
        return NotImplemented
    return x.slice(dim, start, sympify(step), length)


def known_nonnegative(e) -> bool:
    return e.is_nonnegative is True


@lowering(aten.split.Tensor, aten.split_with_sizes.default, aten.unsafe_split.Tensor,
          aten.unsafe_split_with_sizes.default)
def lower_split(ctx, node, x, sizes, dim=0):
    """Consecutive slices along `dim` (views: `chunk` in RoPE and SwiGLU would otherwise be an extern call
    per use). Each piece's length is the traced value's, so split's last short piece and chunk's rounding
    are aten's."""
    dim = _dim(dim, x.ndim)
    lengths = [sympify(val.shape[dim]) for val in node.meta["val"]]
    if any(e.atoms(sympy.Function) for e in lengths):
        return NotImplemented  # chunk of a symbolic size (floor division): the index math has no such form
    pieces, start = [], sympy.S.Zero
    for length in lengths:
        pieces.append(x.slice(dim, start, sympy.S.One, length))
        start = start + length
    return pieces


@lowering(aten.unbind.int)
def lower_unbind(ctx, node, x, dim=0):
    dim = _dim(dim, x.ndim)
    if not x.size[dim].is_Integer:
        return NotImplemented  # as many outputs as a symbolic size: not a fixed list
    return [x.select(dim, sympy.Integer(k)) for k in range(int(x.size[dim]))]


@lowering(aten.select.int)
def lower_select(ctx, node, x, dim, index):
    dim = _dim(dim, x.ndim)
    index = sympify(index)
    if index.is_Integer and int(index) < 0:
        index = index + x.size[dim]
    elif not known_nonnegative(index):
        return NotImplemented
    return x.select(dim, index)


@lowering(aten.expand_as.default, aten.view_as.default)
def lower_view_as(ctx, node, x, other):
    return lower_view(ctx, node, x, None) if node.target is aten.view_as.default else x.expand(_size(node))


# -- scatters (the backward of slice and select) --------------------------------------------------
# The result is the input, with `src` written over a slice. It is a Pointwise node: a `where` on the
# position chooses between the two. The source index is clamped into range so that a load never leaves
# its buffer, even at positions where its value is not chosen.


def _scatter(ctx, node, x, src, dim, hit, src_index):
    from ..ir import Op
    from .context import cast
    from .pointwise import broadcast_load

    out = node.meta["val"]
    compute = out.dtype
    if any(s == 0 for s in src.size):  # nothing is written (a slice of an empty tensor's backward): no
        # position of src exists to clamp a load into
        return ctx.pointwise(out.shape, out.dtype, lambda idx: cast(broadcast_load(x, idx, out.dim()), compute))

    def inner(idx):
        chosen = src.load(src_index(idx))
        return Op("where", (hit(idx), cast(chosen, compute), broadcast_load(x, idx, out.dim())), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.slice_scatter.default)
def lower_slice_scatter(ctx, node, x, src, dim=0, start=None, end=None, step=1):
    from ..ir import Constant, IndexValue, Op
    from ..ir.index import FloorDiv, ModularIndexing

    if not (isinstance(x, TensorRef) and isinstance(src, TensorRef)):
        return NotImplemented
    dim = _dim(dim, x.ndim)
    size = x.size[dim]
    start = sympify(0 if start is None else start)
    if not (start.is_Integer and size.is_Integer):
        return NotImplemented
    start = min(max(int(start) + int(size) if int(start) < 0 else int(start), 0), int(size))
    length = src.size[dim]
    step = sympify(step)
    if not step.is_Integer:
        return NotImplemented  # a step dynamo made a size symbol (an int it saw vary): the extern's
    step = int(step)
    end = start + step * (length - 1) + 1 if length != 0 else start

    # `start` and `x`'s size are integers, but the slice's length may be a size symbol (`pos[:seq]` of a
    # fixed table under dynamic shapes): `end` is then an index expression, a value only as an IndexValue
    end_value = index_value(end)

    def hit(idx):
        i = idx[dim]
        off = sympy.Max(i - start, 0)
        conds = [Op("ge", (IndexValue(i, torch.int64), Constant(start, torch.int64)), torch.bool),
                 Op("lt", (IndexValue(i, torch.int64), end_value), torch.bool)]
        if step != 1:
            conds.append(Op("eq", (IndexValue(ModularIndexing(off, 1, step), torch.int64),
                                   Constant(0, torch.int64)), torch.bool))
        c = conds[0]
        for other in conds[1:]:
            c = Op("logical_and", (c, other), torch.bool)
        return c

    def src_index(idx):
        j = sympy.Min(FloorDiv(sympy.Max(idx[dim] - start, 0), step), sympy.Max(length - 1, 0))
        return [*idx[:dim], j, *idx[dim + 1:]]

    return _scatter(ctx, node, x, src, dim, hit, src_index)


@lowering(aten.select_scatter.default)
def lower_select_scatter(ctx, node, x, src, dim, index):
    from ..ir import Constant, IndexValue, Op

    if not (isinstance(x, TensorRef) and isinstance(src, TensorRef)):
        return NotImplemented
    dim = _dim(dim, x.ndim)
    index = sympify(index)
    if not (index.is_Integer and x.size[dim].is_Integer):
        return NotImplemented
    index = int(index) % int(x.size[dim])

    def hit(idx):
        return Op("eq", (IndexValue(idx[dim], torch.int64), Constant(index, torch.int64)), torch.bool)

    return _scatter(ctx, node, x, src, dim, hit, lambda idx: [*idx[:dim], *idx[dim + 1:]])
