"""TensorRef: what an FX value lowers to — a view of a buffer, given as a sympy index function.

Views (permute, expand, slice, reshape, ...) never create nodes: they rewrite the index function.
`index` is an expression over the view variables `v0..v{ndim-1}` giving the storage offset (in
elements) in `buffer`.
"""
from __future__ import annotations

from typing import Sequence

import attrs
import sympy
import torch

from ..ir import Buffer, Constant, IndexValue, Load, TensorArg
from ..ir.index import (
    Expr,
    ModularIndexing,
    VarKind,
    as_strided_form,
    contiguous_strides,
    least,
    product,
    strided_index,
    sympify,
    var,
)


def view_var(i: int) -> sympy.Symbol:
    return var(VarKind.VIEW, i)


def view_vars(n: int) -> tuple:
    return tuple(view_var(i) for i in range(n))


def index_value(expr) -> Constant | IndexValue:
    """An index expression as an int64 value in a body (a gather's bound, a slice's end): a Constant when it
    is a number, else an IndexValue, computed where the kernel runs (a size symbol's expression)."""
    expr = sympify(expr)
    return Constant(int(expr), torch.int64) if expr.is_Integer else IndexValue(expr, torch.int64)


def known(cond) -> bool:
    """A sympy relation that is provably true (False when unknown)."""
    return bool(cond) if isinstance(cond, bool) else cond == sympy.true


def provably_lt(a: Expr, b: Expr, bounds: dict | None = None) -> bool:
    """Whether a < b for every value of the size symbols, each at least its lower bound in `bounds`
    (dynamo's ranges: a backed size is at least 2, since 0 and 1 are specialized), at least 1 otherwise."""
    d = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
    if d.is_number:
        return bool(d > 0)
    shift = {}
    for sym in d.free_symbols:  # sym = lower bound + a non-negative integer
        shift[sym] = sympy.Dummy(integer=True, nonnegative=True) + (bounds or {}).get(sym, 1)
    if sympy.expand(d.xreplace(shift)).is_positive:
        return True
    low = least(d, bounds)  # through floor divisions, which sympy's assumptions do not see into
    return low is not None and low > 0


@attrs.frozen
class TensorRef:
    buffer: Buffer
    size: tuple
    index: Expr

    @classmethod
    def of(cls, buffer: Buffer) -> "TensorRef":
        vs = view_vars(len(buffer.layout.size))
        return cls(buffer, buffer.layout.size, buffer.layout.index(vs))

    @property
    def ndim(self) -> int:
        return len(self.size)

    @property
    def dtype(self):
        return self.buffer.dtype

    def index_at(self, idx: Sequence[Expr]) -> Expr:
        return self.index.xreplace(dict(zip(view_vars(self.ndim), idx)))

    def load(self, idx: Sequence[Expr]) -> Load:
        return Load(self.buffer.name, self.index_at(idx), self.dtype)

    def strided(self):
        """(stride, offset) when this view is expressible with as_strided, else None."""
        return as_strided_form(self.index, view_vars(self.ndim))

    def as_arg(self) -> TensorArg | None:
        form = self.strided()
        if form is None:
            return None
        stride, offset = form
        return TensorArg(self.buffer.name, self.size, stride, offset)

    def remap(self, size: Sequence[Expr], old_idx: Sequence[Expr]) -> "TensorRef":
        """A view of `size` whose variables feed this view's variables as `old_idx`."""
        return TensorRef(self.buffer, tuple(size), sympy.expand(self.index_at(old_idx)))

    # -- view operations ---------------------------------------------------------------------
    def permute(self, dims: Sequence[int]) -> "TensorRef":
        new = view_vars(self.ndim)
        old = [None] * self.ndim
        for k, d in enumerate(dims):
            old[d] = new[k]
        return self.remap([self.size[d] for d in dims], old)

    def expand(self, size: Sequence[Expr]) -> "TensorRef":
        new = view_vars(len(size))
        lead = len(size) - self.ndim
        size = [self.size[k - lead] if (k >= lead and s == -1) else s for k, s in enumerate(size)]
        old = [sympy.S.Zero if (self.size[d] == 1 and size[d + lead] != 1) else new[d + lead]
               for d in range(self.ndim)]
        return self.remap(size, old)

    def squeeze(self, dims: Sequence[int], ones=frozenset()) -> "TensorRef":
        """Drop the dims of `dims` of size 1, and those of `ones` (sizes known to be 1 though not written so)."""
        drop = {d for d in dims if self.size[d] == 1 or d in ones}
        keep = [d for d in range(self.ndim) if d not in drop]
        new = view_vars(len(keep))
        pos = {d: k for k, d in enumerate(keep)}
        old = [new[pos[d]] if d in pos else sympy.S.Zero for d in range(self.ndim)]
        return self.remap([self.size[d] for d in keep], old)

    def unsqueeze(self, dim: int) -> "TensorRef":
        new = view_vars(self.ndim + 1)
        old = [new[d] if d < dim else new[d + 1] for d in range(self.ndim)]
        return self.remap([*self.size[:dim], sympy.S.One, *self.size[dim:]], old)

    def slice(self, dim: int, start: Expr, step: Expr, length: Expr) -> "TensorRef":
        new = view_vars(self.ndim)
        old = list(new)
        old[dim] = start + step * new[dim]
        size = list(self.size)
        size[dim] = length
        return self.remap(size, old)

    def select(self, dim: int, index: Expr) -> "TensorRef":
        new = view_vars(self.ndim - 1)
        old = [*new[:dim], index, *new[dim:]]
        return self.remap([*self.size[:dim], *self.size[dim + 1:]], old)

    def reshape(self, size: Sequence[Expr], bounds: dict | None = None) -> "TensorRef":
        """A reshape as an index rewrite: strided when the strides allow (as torch.view), otherwise
        through the flat index with floor division and modulus. `bounds`: the size symbols' lower
        bounds, with which a symbolic reshape is proven a view (s0*s1*64 elements in rows of 64)."""
        form = self.strided()
        if form is not None:
            stride = compute_stride(self.size, form[0], size, bounds)
            if stride is not None:
                return TensorRef(self.buffer, tuple(size), strided_index(view_vars(len(size)), stride, form[1]))
        flat = strided_index(view_vars(len(size)), contiguous_strides(size))
        old = [ModularIndexing(flat, st, s) for s, st in zip(self.size, contiguous_strides(self.size))]
        return self.remap(size, old)


def compute_stride(old_size, old_stride, new_size, bounds: dict | None = None):
    """Strides for viewing (old_size, old_stride) as new_size without a copy, or None (ATen's rule,
    with its comparisons proven for every size the symbols may take)."""
    if known(sympy.Eq(product(old_size), 0)) or not old_size:
        return contiguous_strides(new_size)
    new_stride = [sympy.S.Zero] * len(new_size)
    view_d = len(new_size) - 1
    chunk_base = old_stride[-1]
    tensor_numel = sympy.S.One
    view_numel = sympy.S.One
    for d in reversed(range(len(old_size))):
        tensor_numel = tensor_numel * old_size[d]
        if d == 0 or (old_size[d - 1] != 1 and sympy.expand(old_stride[d - 1] - tensor_numel * chunk_base) != 0):
            while view_d >= 0 and (provably_lt(view_numel, tensor_numel, bounds) or new_size[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base
                view_numel = view_numel * new_size[view_d]
                view_d -= 1
            if sympy.expand(view_numel - tensor_numel) != 0:
                return None
            if d > 0:
                chunk_base = old_stride[d - 1]
                tensor_numel = sympy.S.One
                view_numel = sympy.S.One
    if view_d != -1:
        return None
    return tuple(sympy.expand(s) for s in new_stride)
