"""Buffers, layouts, memory dependencies and the three node kinds the scheduler works on.

- `Pointwise(ranges)`: for every point of `ranges`, compute `body` and store it to `output`.
- `Reduction(ranges, reduction_ranges, reduction_type)`: for every point of `ranges`, reduce `body`
  over `reduction_ranges` and store the result.
- `Extern(op, args)`: call an aten op (matmuls, convolutions, anything without a lowering).

Loop variables are `i0..` for `ranges` and `r0..` for `reduction_ranges` (see `ir.index.loop_vars`).
"""
from __future__ import annotations

from typing import Any

import attrs
import sympy
import torch

from .body import Value, loads
from .index import Expr, contiguous_strides, loop_vars, product, strided_index

REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


def _exprs(xs) -> tuple:
    from .index import sympify

    return tuple(sympify(x) for x in xs)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@attrs.frozen(cache_hash=True)
class Layout:
    """Sizes and strides (in elements) of a buffer; sympy expressions so sizes may be symbolic."""

    size: tuple = attrs.field(converter=_exprs)
    stride: tuple = attrs.field(converter=_exprs)
    dtype: torch.dtype
    device: torch.device = attrs.field(default=torch.device("cpu"), converter=torch.device)

    @classmethod
    def contiguous(cls, size, dtype, device="cpu") -> "Layout":
        size = _exprs(size)
        return cls(size, contiguous_strides(size), dtype, device)

    @property
    def numel(self) -> Expr:
        return product(self.size)

    @property
    def storage_span(self) -> Expr:
        """Elements between the first and one past the last addressable element."""
        if any(s == 0 for s in self.size):
            return sympy.S.Zero
        return sympy.S.One + sympy.Add(*[(s - 1) * st for s, st in zip(self.size, self.stride)])

    def index(self, idx) -> Expr:
        return strided_index(idx, self.stride)

    def is_contiguous(self) -> bool:
        return all(
            sympy.simplify(a - b) == 0 or s == 1
            for a, b, s in zip(self.stride, contiguous_strides(self.size), self.size)
        )

    def __repr__(self):
        size = ", ".join(map(str, self.size))
        if self.is_contiguous():
            return f"{_short(self.dtype)}[{size}]"
        return f"{_short(self.dtype)}[{size}; stride {', '.join(map(str, self.stride))}]"


@attrs.frozen(cache_hash=True)
class Buffer:
    name: str
    layout: Layout

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def nbytes(self) -> Expr:
        return self.layout.storage_span * self.dtype.itemsize

    def __repr__(self):
        return f"{self.name}: {self.layout!r}"


@attrs.frozen(cache_hash=True)
class MemoryDep:
    """One access to a buffer: which buffer, at which index, over which loop variables."""

    buffer: str
    index: Expr
    var_ranges: tuple  # ((symbol, size), ...) of the node's loops

    def __repr__(self):
        return f"{self.buffer}[{self.index}]"


@attrs.frozen(cache_hash=True)
class TensorArg:
    """A strided view of a buffer, passed to an extern call."""

    buffer: str
    size: tuple = attrs.field(converter=_exprs)
    stride: tuple = attrs.field(converter=_exprs)
    offset: Expr = attrs.field(default=sympy.S.Zero, converter=lambda x: _exprs([x])[0])

    def __repr__(self):
        return f"{self.buffer}<{', '.join(map(str, self.size))}>"


class _Node:
    """Behaviour shared by the node kinds (attrs classes below supply the fields)."""

    name: str
    origins: tuple

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()

    def output_buffers(self) -> tuple[Buffer, ...]:
        return (self.output,)

    def output_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.output_buffers())


def _var_ranges(node) -> tuple:
    outer = loop_vars("i", len(node.ranges))
    red = loop_vars("r", len(getattr(node, "reduction_ranges", ())))
    return tuple(zip(outer, node.ranges)) + tuple(zip(red, getattr(node, "reduction_ranges", ())))


class _LoopNode(_Node):
    """A node with a loop nest and a body: Pointwise or Reduction."""

    ranges: tuple
    body: Value
    output: Buffer

    @property
    def vars(self) -> tuple:
        return loop_vars("i", len(self.ranges))

    @property
    def var_ranges(self) -> tuple:
        return _var_ranges(self)

    @property
    def numel(self) -> Expr:
        return product(self.ranges)

    def store_index(self) -> Expr:
        """Where each point of `ranges` lands in the output buffer."""
        return self.output.layout.index(self.store_order(self.vars))

    def store_order(self, vars):
        """The loop variables in the output's logical dimension order (identity unless reordered)."""
        return tuple(vars[p] for p in self.permutation)

    def reads(self) -> tuple[MemoryDep, ...]:
        vr = self.var_ranges
        return tuple(dict.fromkeys(MemoryDep(ld.buffer, ld.index, vr) for ld in loads(self.body)))

    def writes(self) -> tuple[MemoryDep, ...]:
        outer = self.var_ranges[: len(self.ranges)]
        return (MemoryDep(self.output.name, self.store_index(), outer),)

    def read_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(ld.buffer for ld in loads(self.body)))


def _identity_perm(self):
    return tuple(range(len(self.ranges)))


@attrs.frozen(cache_hash=True, repr=False)
class Pointwise(_LoopNode):
    name: str
    ranges: tuple = attrs.field(converter=_exprs)
    body: Any
    output: Buffer
    origins: tuple = ()
    # permutation[k] = which loop variable indexes the output's k-th dimension (loop reordering)
    permutation: tuple = attrs.field(default=attrs.Factory(_identity_perm, takes_self=True))

    def __repr__(self):
        return (f"{self.name} = Pointwise(ranges=[{', '.join(map(str, self.ranges))}]) "
                f"-> {self.output!r}: {self.body!r}")


@attrs.frozen(cache_hash=True, repr=False)
class Reduction(_LoopNode):
    name: str
    ranges: tuple = attrs.field(converter=_exprs)
    reduction_ranges: tuple = attrs.field(converter=_exprs)
    reduction_type: str = attrs.field(validator=attrs.validators.in_(REDUCTION_TYPES))
    body: Any
    output: Buffer
    origins: tuple = ()
    permutation: tuple = attrs.field(default=attrs.Factory(_identity_perm, takes_self=True))

    @property
    def reduction_vars(self) -> tuple:
        return loop_vars("r", len(self.reduction_ranges))

    @property
    def reduction_numel(self) -> Expr:
        return product(self.reduction_ranges)

    def __repr__(self):
        return (f"{self.name} = Reduction({self.reduction_type}, "
                f"ranges=[{', '.join(map(str, self.ranges))}], "
                f"reduction_ranges=[{', '.join(map(str, self.reduction_ranges))}]) "
                f"-> {self.output!r}: {self.body!r}")


@attrs.frozen(cache_hash=True, repr=False)
class Extern(_Node):
    """A call to an aten op. `args`/`kwargs` hold TensorArg where tensors go; `outputs` lists the
    buffers for the tensor results in the op's return order (None for a non-tensor result);
    `mutates` names input buffers the op writes in place."""

    name: str
    op: Any
    args: tuple
    kwargs: tuple  # ((key, value), ...) so the node stays hashable
    outputs: tuple
    origins: tuple = ()
    mutates: tuple = ()

    def output_buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.outputs if b is not None)

    def tensor_args(self) -> list[TensorArg]:
        found: list[TensorArg] = []
        _collect(self.args, found)
        _collect(tuple(v for _, v in self.kwargs), found)
        return found

    def read_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.buffer for t in self.tensor_args()))

    def reads(self) -> tuple[MemoryDep, ...]:
        deps = []
        for t in self.tensor_args():
            vs = loop_vars("i", len(t.size))
            deps.append(MemoryDep(t.buffer, strided_index(vs, t.stride, t.offset), tuple(zip(vs, t.size))))
        return tuple(dict.fromkeys(deps))

    def writes(self) -> tuple[MemoryDep, ...]:
        deps = []
        for b in self.output_buffers():
            vs = loop_vars("i", len(b.layout.size))
            deps.append(MemoryDep(b.name, b.layout.index(vs), tuple(zip(vs, b.layout.size))))
        return tuple(deps)

    def __repr__(self):
        outs = ", ".join(repr(b) for b in self.output_buffers())
        args = ", ".join(map(repr, self.args))
        return f"{self.name} = Extern({self.op}({args})) -> {outs}"


def _collect(x, found: list) -> None:
    if isinstance(x, TensorArg):
        found.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _collect(y, found)


Node = Pointwise | Reduction | Extern
