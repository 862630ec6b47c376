"""Indirect indexing: reads at positions held in an index tensor (gather, advanced indexing, index_select,
embedding; take_along_dim arrives as a gather).

Each becomes a Pointwise node over the result whose body loads the indexed tensor at an index that is
sympy over the loop variables plus index symbols `t0, t1, ...`, each bound (`ir.Indirect`) to the load of
an index tensor, the size of the dimension it indexes, whether negative values wrap (as eager's advanced
indexing allows; gather, index_select and embedding raise instead) and whether the value is proven in
range. An unproven index is checked by every backend: out of range is an error, never a read elsewhere.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Cast, IndexValue, Indirect, Load, Pointwise, Reduction, indirect_var
from .pointwise import broadcast_load
from .registry import lowering
from .tensor import TensorRef

aten = torch.ops.aten

INDEX_DTYPES = (torch.int32, torch.int64)


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _producer(ctx, buffer: str):
    for n in reversed(ctx.nodes):
        if getattr(n, "output", None) is not None and n.output.name == buffer:
            return n
    return None


def proven_in_range(ctx, index: TensorRef, bound) -> bool:
    """Whether every value of `index` lies in [0, bound) by construction, so no check is needed: an
    argmax/argmin over a dimension of `bound` elements, or an arange inside [0, bound). (A view of such a
    tensor holds a subset of its values.)"""
    node = _producer(ctx, index.buffer.name)
    if isinstance(node, Reduction) and node.reduction_type in ("argmax", "argmin"):
        return sympy.expand(node.reduction_numel - bound) == 0
    if isinstance(node, Pointwise):
        body = node.body.value if isinstance(node.body, Cast) else node.body
        if isinstance(body, IndexValue) and not body.indirect and body.expr.free_symbols <= set(node.vars):
            # an affine arange start + step * i: its extremes are at the ends of its range
            ends = [body.expr.xreplace({v: (0 if hi else s - 1) for v, s in zip(node.vars, node.ranges)})
                    for hi in (False, True)]
            if all(e.is_number for e in ends) and all(r.is_number for r in node.ranges):
                return bool(0 <= min(ends) and max(ends) < bound) if bound.is_number else False
    return False


def binding(ctx, k: int, index: TensorRef, value, bound, what: str, wrap: bool = False) -> Indirect:
    return Indirect(indirect_var(k), value, bound, wrap=wrap, proven=proven_in_range(ctx, index, bound), what=what)


def _usable(*refs) -> bool:
    return all(isinstance(r, TensorRef) for r in refs)


def _index_ok(*refs) -> bool:
    return all(r.dtype in INDEX_DTYPES for r in refs)


@lowering(aten.gather.default)
def lower_gather(ctx, node, x, dim, index, *, sparse_grad=False):
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim` (no negative indices, as eager)."""
    if not _usable(x, index) or not _index_ok(index) or x.ndim == 0 or index.ndim != x.ndim:
        return NotImplemented
    out = node.meta["val"]
    dim = _dim(dim, x.ndim)

    def inner(idx):
        b = binding(ctx, 0, index, index.load(idx), x.size[dim], f"dimension {dim} (gather)")
        point = list(idx)
        point[dim] = b.symbol
        return Load(x.buffer.name, x.index_at(point), x.dtype, (b,))

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def lower_index(ctx, node, x, indices):
    """Advanced indexing x[i0, :, i2, ...]: the index tensors broadcast together to a shape B; B's dims
    replace the indexed dims where those are adjacent, else they come first (numpy's rule). Negative
    indices count from the end."""
    refs = [r for r in indices if r is not None]
    if not _usable(x, *refs) or not refs or not _index_ok(*refs) or x.ndim == 0 or len(indices) > x.ndim:
        return NotImplemented  # bool/byte masks have data-dependent shapes: aten's job
    out = node.meta["val"]
    metas = [a.meta["val"] for a in node.args[1] if a is not None]
    bshape = torch.broadcast_shapes(*[m.shape for m in metas])
    nb = len(bshape)
    positions = [d for d, r in enumerate(indices) if r is not None]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    first = positions[0] if adjacent else 0
    if out.dim() != x.ndim - len(positions) + nb:
        return NotImplemented
    op = "index" if node.target is aten.index.Tensor else "_unsafe_index"

    def inner(idx):
        bidx = idx[first:first + nb]
        rest = iter(list(idx[:first]) + list(idx[first + nb:]))
        point, binds = [], []
        for d in range(x.ndim):
            r = indices[d] if d < len(indices) else None
            if r is None:
                point.append(next(rest))
                continue
            b = binding(ctx, len(binds), r, broadcast_load(r, bidx, nb), x.size[d], f"dimension {d} ({op})", wrap=True)
            binds.append(b)
            point.append(b.symbol)
        return Load(x.buffer.name, x.index_at(point), x.dtype, tuple(binds))

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.index_select.default)
def lower_index_select(ctx, node, x, dim, index):
    """out[..., j, ...] = x[..., index[j], ...] (index 1-D or 0-d; no negative indices, as eager)."""
    if not _usable(x, index) or not _index_ok(index) or x.ndim == 0 or index.ndim > 1:
        return NotImplemented
    out = node.meta["val"]
    dim = _dim(dim, x.ndim)

    def inner(idx):
        value = index.load([idx[dim]] if index.ndim == 1 else [])
        b = binding(ctx, 0, index, value, x.size[dim], f"dimension {dim} (index_select)")
        point = list(idx)
        point[dim] = b.symbol
        return Load(x.buffer.name, x.index_at(point), x.dtype, (b,))

    return ctx.pointwise(out.shape, out.dtype, inner)


@lowering(aten.embedding.default)
def lower_embedding(ctx, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """out[..., :] = weight[indices[...], :] (padding_idx only matters to the backward)."""
    if not _usable(weight, indices) or not _index_ok(indices) or weight.ndim != 2:
        return NotImplemented
    out = node.meta["val"]

    def inner(idx):
        b = binding(ctx, 0, indices, indices.load(idx[:-1]), weight.size[0], "dimension 0 (embedding)")
        return Load(weight.buffer.name, weight.index_at([b.symbol, idx[-1]]), weight.dtype, (b,))

    return ctx.pointwise(out.shape, out.dtype, inner)
