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

from ..ir import Cast, Constant, IndexValue, Indirect, Load, Op, Pointwise, Reduction, Scatter, indirect_var, loop_vars
from ..ir.index import sympify
from .context import cast, upcast
from .pointwise import broadcast_load
from .registry import lowering
from .tensor import TensorRef

aten = torch.ops.aten

INDEX_DTYPES = (torch.int32, torch.int64)
ATOMIC_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)  # what a scatter may add into


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
            # (sympified: an arange's body is the bare loop variable, which xreplace turns into a plain int)
            ends = [sympy.sympify(body.expr.xreplace({v: (s - 1 if hi else 0) for v, s in zip(node.vars, node.ranges)}))
                    for hi in (False, True)]
            bound = sympy.sympify(bound)
            if all(e.is_number for e in ends) and all(sympy.sympify(r).is_number for r in node.ranges):
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


class Advanced:
    """Advanced indexing x[i0, :, i2, ...] (index, index_put): the index tensors broadcast together to a
    shape B; B's dims replace the indexed dims where those are adjacent, else they come first (numpy's
    rule). Negative indices count from the end. None when these arguments are not for this lowering."""

    @classmethod
    def of(cls, ctx, node, x, indices, op: str):
        refs = [r for r in indices if r is not None]
        if not _usable(x, *refs) or not refs or not _index_ok(*refs) or x.ndim == 0 or len(indices) > x.ndim:
            return None  # bool/byte masks have data-dependent shapes: aten's job
        return cls(ctx, node, x, indices, op)

    def __init__(self, ctx, node, x, indices, op: str):
        self.ctx, self.x, self.indices, self.op = ctx, x, list(indices), op
        metas = [a.meta["val"] for a in node.args[1] if a is not None]
        self.nb = len(torch.broadcast_shapes(*[m.shape for m in metas]))
        positions = [d for d, r in enumerate(indices) if r is not None]
        adjacent = positions == list(range(positions[0], positions[-1] + 1))
        self.first = positions[0] if adjacent else 0
        bshape = [sympify(n) for n in torch.broadcast_shapes(*[m.shape for m in metas])]
        rest = [x.size[d] for d in range(x.ndim) if d >= len(indices) or indices[d] is None]
        self.shape = tuple(rest[:self.first] + bshape + rest[self.first:])  # the indexed result's shape

    def point(self, idx) -> tuple:
        """(the position in x, the bindings) for the point `idx` of the indexed result."""
        x, nb, first = self.x, self.nb, self.first
        bidx = idx[first:first + nb]
        rest = iter(list(idx[:first]) + list(idx[first + nb:]))
        point, binds = [], []
        for d in range(x.ndim):
            r = self.indices[d] if d < len(self.indices) else None
            if r is None:
                point.append(next(rest))
                continue
            b = binding(self.ctx, len(binds), r, broadcast_load(r, bidx, nb), x.size[d], f"dimension {d} ({self.op})",
                        wrap=True)
            binds.append(b)
            point.append(b.symbol)
        return point, tuple(binds)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def lower_index(ctx, node, x, indices):
    op = "index" if node.target is aten.index.Tensor else "_unsafe_index"
    adv = Advanced.of(ctx, node, x, indices, op)
    out = node.meta["val"]
    if adv is None or len(adv.shape) != out.dim():
        return NotImplemented

    def inner(idx):
        point, binds = adv.point(idx)
        return Load(x.buffer.name, x.index_at(point), x.dtype, binds)

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


# -- writes -----------------------------------------------------------------------------------------------
# A scatter into a tensor is two nodes: a Pointwise writing the initial value (a copy of the tensor
# scattered into, in the accumulation dtype: float32 for bfloat16/float16, as eager's CUDA kernels sum),
# then a Scatter writing or adding the values in place at the indexed positions (atomic adds in generated
# code). Low-precision results are cast back by a third node. A scatter whose index has one element along
# the scattered dimension for each position of the others (the one-hot of cross-entropy's backward) is
# instead one Pointwise that pulls: out[p] = src if p[dim] == index[p with dim 0] else self[p].


def _same(a, b) -> bool:
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def scatter_into(ctx, node, x: TensorRef, ranges, value, position, mode: str):
    """`x` with value(i) written (mode "store") or added ("add") at position(i) = (point in x, bindings),
    for each point i of `ranges`."""
    out = node.meta["val"]
    acc = upcast(out.dtype) if mode == "add" else out.dtype
    if mode == "add" and (acc not in ATOMIC_DTYPES or acc.is_floating_point
                          and torch.are_deterministic_algorithms_enabled()):
        return NotImplemented  # float atomic adds sum in a varying order: aten's deterministic kernel
    target = ctx.pointwise(x.size, acc, lambda idx: cast(x.load(idx), acc), x.buffer.layout.device)
    vs = loop_vars("i", len(ranges))
    point, binds = position(vs)
    buf = target.buffer
    name = ctx.new_name()
    ctx.nodes.append(Scatter(name, tuple(sympy.sympify(r) for r in ranges), cast(value(vs), acc), buf,
                             buf.layout.index(point), binds, mode, origins=ctx._origins()))
    if acc == out.dtype:
        return TensorRef.of(buf)
    return ctx.pointwise(out.shape, out.dtype, lambda idx: cast(target.load(idx), out.dtype))


def _src_value(src, dtype):
    """The value scattered at a point of the index: src's element there, or a scalar."""
    if isinstance(src, TensorRef):
        return lambda idx: cast(src.load(idx), dtype)
    return lambda idx: Constant(float(src) if dtype.is_floating_point else src, dtype)


def _pull(ctx, node, x, dim, index, src, add: bool, op: str):
    """The one-element-per-row scatter as a pointwise pull (see above)."""
    out = node.meta["val"]
    compute = upcast(out.dtype)
    value = _src_value(src, compute)

    def inner(idx):
        row = list(idx)
        row[dim] = sympy.S.Zero
        b = binding(ctx, 0, index, index.load(row), x.size[dim], f"dimension {dim} ({op})")
        hit = Op("eq", (IndexValue(idx[dim], torch.int64), IndexValue(b.symbol, torch.int64, (b,))), torch.bool)
        base = cast(x.load(idx), compute)
        new = Op("add", (base, value(row)), compute) if add else value(row)
        return Op("where", (hit, new, base), compute)

    return ctx.pointwise(out.shape, out.dtype, inner)


def _scatter(ctx, node, x, dim, index, src, add: bool, op: str):
    if not _usable(x, index) or not _index_ok(index) or x.ndim == 0 or index.ndim != x.ndim \
            or (isinstance(src, TensorRef) and src.ndim != x.ndim):
        return NotImplemented
    dim = _dim(dim, x.ndim)
    if _same(index.size[dim], 1) and all(_same(index.size[d], x.size[d]) for d in range(x.ndim) if d != dim):
        return _pull(ctx, node, x, dim, index, src, add, op)

    acc = upcast(node.meta["val"].dtype) if add else node.meta["val"].dtype
    return scatter_into(ctx, node, x, index.size, _src_value(src, acc), _position(ctx, x, dim, index, op),
                        "add" if add else "store")


def _position(ctx, x, dim, index, op: str, at=None):
    """scatter_into's `position`: a point of the written values with its `dim` coordinate the index's value,
    read at `at(point)` (default: the point itself), checked against x's size there."""
    def position(vs):
        b = binding(ctx, 0, index, index.load(at(vs) if at else vs), x.size[dim], f"dimension {dim} ({op})")
        point = list(vs)
        point[dim] = b.symbol
        return point, (b,)

    return position


def _index_write(ctx, node, x, dim, index, source, add: bool, op: str, alpha=1):
    """out = x; out[..., index[j], ...] = (or +=) alpha * source[..., j, ...] along `dim`. Negative indices are
    out of range, as eager's (torch's decompositions into index_put wrapped them)."""
    out = node.meta["val"]
    if not _usable(x, index, source) or not _index_ok(index) or x.ndim == 0 or index.ndim > 1 \
            or source.ndim != x.ndim or out.dtype == torch.bool:
        return NotImplemented
    dim = _dim(dim, x.ndim)
    acc = upcast(out.dtype) if add else out.dtype
    loaded = value = _src_value(source, acc)
    if alpha != 1:
        scale = Constant(float(alpha) if acc.is_floating_point else int(alpha), acc)

        def value(vs):
            return Op("mul", (loaded(vs), scale), acc)

    position = _position(ctx, x, dim, index, op, lambda vs: [vs[dim]] if index.ndim == 1 else [])
    return scatter_into(ctx, node, x, source.size, value, position, "add" if add else "store")


@lowering(aten.index_add.default)
def lower_index_add(ctx, node, x, dim, index, source, *, alpha=1):
    """out = x; out[..., index[j], ...] += alpha * source[..., j, ...], duplicates summed."""
    return _index_write(ctx, node, x, dim, index, source, True, "index_add", alpha)


@lowering(aten.index_copy.default)
def lower_index_copy(ctx, node, x, dim, index, source):
    """out = x; out[..., index[j], ...] = source[..., j, ...]; duplicates: one of them wins."""
    return _index_write(ctx, node, x, dim, index, source, False, "index_copy")


@lowering(aten.scatter.src, aten.scatter.value)
def lower_scatter(ctx, node, x, dim, index, src):
    """out = x; out[..., index[i], ...] = src[i] (or a scalar) along `dim`; duplicates: one of them wins."""
    return _scatter(ctx, node, x, dim, index, src, False, "scatter")


@lowering(aten.scatter_add.default)
def lower_scatter_add(ctx, node, x, dim, index, src):
    """out = x; out[..., index[i], ...] += src[i] along `dim`, duplicates summed (gather's backward)."""
    return _scatter(ctx, node, x, dim, index, src, True, "scatter_add")


@lowering(aten.index_put.default)
def lower_index_put(ctx, node, x, indices, values, accumulate=False):
    """out = x; out[indices] = values (or += with accumulate=True: the backward of indexing, index_select
    and embedding, duplicates summed). Values broadcast to the indexed shape."""
    adv = Advanced.of(ctx, node, x, indices, "index_put")
    if adv is None or not isinstance(values, TensorRef):
        return NotImplemented
    while values.ndim > len(adv.shape) and _same(values.size[0], 1):
        # leading size-1 dims, as x[i] = v allows: aot's backward of index_select with a 0-d index
        # passes a [1, n] gradient for an [n] indexed shape (aten's own index_put rejects it)
        values = values.squeeze([0])
    if values.ndim > len(adv.shape):
        return NotImplemented
    acc = upcast(node.meta["val"].dtype) if accumulate else node.meta["val"].dtype
    nd = len(adv.shape)
    return scatter_into(ctx, node, x, adv.shape, lambda vs: cast(broadcast_load(values, vs, nd), acc),
                        adv.point, "add" if accumulate else "store")
