"""The lowering of one aten FX graph into a Program: inputs, nodes in program order, outputs."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import attrs
import sympy
import torch

from ..ir import Buffer, Cast, Extern, Layout, Pointwise, Reduction, TensorArg, VarKind, loop_vars
from ..ir.index import sympify
from .tensor import TensorRef


@attrs.frozen
class GraphInput:
    """A placeholder: a tensor (`buffer`), a SymInt (`symbol`), or another value passed through."""

    name: str
    buffer: Buffer | None = None
    symbol: sympy.Expr | None = None


@attrs.frozen
class Program:
    """What lowering produces; the pipeline turns it into a SchedulerGraph."""

    inputs: tuple
    nodes: tuple
    outputs: tuple  # TensorArg (a view of a buffer), sympy.Expr, or a Python value per FX output
    choices: tuple = ()  # a ChoiceRecord per node whose op had other candidates (lowering/choices.py)
    bounds: dict = attrs.Factory(dict)  # size symbol -> its least value (sizes.size_facts)
    hints: dict = attrs.Factory(dict)  # size symbol -> the value it was traced at (sizes.size_facts)
    derived: tuple = ()  # size symbols computed from the others through floats (sizes.derived_sizes)


aten = torch.ops.aten
# checks a program makes of itself: each raises where its condition fails and returns nothing to read, so
# passes must keep them though nothing reads them (passes/dce.py)
ASSERTIONS = {aten._assert_async.default, aten._assert_async.msg, aten._assert_scalar.default,
              aten._assert_tensor_metadata.default, aten.sym_constrain_range.default,
              aten.sym_constrain_range_for_size.default,
              aten._linalg_check_errors.default}  # torch.linalg's LinAlgError (a singular matrix, ...)


def _free_symbols(x) -> set:
    """The sympy symbols anywhere in a lowered argument (nested tuples, lists and dicts)."""
    if isinstance(x, sympy.Basic):
        return set(x.free_symbols)
    if isinstance(x, dict):
        x = tuple(x.values())
    if isinstance(x, (list, tuple)):
        return set().union(*map(_free_symbols, x)) if x else set()
    return set()


def upcast(dtype: torch.dtype) -> torch.dtype:
    """The dtype math is done in: low-precision floats compute in float32, like eager's opmath."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def cast(value, dtype: torch.dtype):
    return value if value.dtype == dtype else Cast(value, dtype)


class LoweringContext:
    def __init__(self):
        self.nodes: list = []
        self._ids = itertools.count()
        self.fx_node: torch.fx.Node | None = None  # the FX node being lowered (provenance)
        self.last_collective: Extern | None = None  # the next collective is ordered after it (extern.py)
        self.inputs: dict[str, Buffer] = {}  # the graph's tensor inputs by name (what copy_ may overwrite)
        self.chooser = None  # decides among a node's candidates (lowering/choices.py); None: the op itself
        self.choices: list = []  # ChoiceRecords, in program order
        self.origin: str | None = None  # while a chosen candidate is lowered: the FX node it implements
        self.bound_symbols: set = set()  # size symbols the graph's inputs give values to at run time

    def _origins(self) -> tuple:
        if self.origin is not None:
            return (self.origin,)
        return (self.fx_node.name,) if self.fx_node is not None else ()

    def new_name(self) -> str:
        return f"buf{next(self._ids)}"

    def pointwise(self, size, dtype: torch.dtype, inner: Callable, device=None, stride=None) -> TensorRef:
        """A Pointwise node over `size` computing inner(index vars), stored as `dtype` with `stride`
        (default: the layout eager gives the FX node being lowered, see `eager_layout`)."""
        size = tuple(sympify(s) for s in size)
        name = self.new_name()
        body = cast(inner(loop_vars(VarKind.OUTER, len(size))), dtype)
        device = device or self.device
        layout = Layout(size, stride, dtype, device) if stride is not None else self.eager_layout(size, dtype, device)
        buf = Buffer(name, layout)
        self.nodes.append(Pointwise(name, size, body, buf, origins=self._origins()))
        return TensorRef.of(buf)

    def reduction(self, size, reduction_size, reduction_type: str, dtype: torch.dtype,
                  inner: Callable, device=None) -> TensorRef:
        """A Reduction node: for each point of `size`, reduce inner(i vars, r vars) over `reduction_size`."""
        size = tuple(sympify(s) for s in size)
        rsize = tuple(sympify(s) for s in reduction_size)
        name = self.new_name()
        body = inner(loop_vars(VarKind.OUTER, len(size)), loop_vars(VarKind.REDUCTION, len(rsize)))
        buf = Buffer(name, self.eager_layout(size, dtype, device or self.device))
        self.nodes.append(Reduction(name, size, rsize, reduction_type, body, buf, origins=self._origins()))
        return TensorRef.of(buf)

    def extern(self, op, args: tuple, kwargs: dict, out_val: Any, mutates=(), after=()) -> Any:
        """An Extern node calling `op` (after the buffers `after`, see Extern); returns TensorRefs shaped
        like the op's result `out_val`. An assertion on a value no input binds at run time (`torch._check`
        of an `.item()`, as `refuse_unbacked` finds such values) cannot be evaluated: it is left out,
        unchecked, and None returned (its result: assertions return nothing)."""
        if op in ASSERTIONS and not _free_symbols((args, kwargs)) <= self.bound_symbols:
            return None
        name = self.new_name()
        vals = out_val if isinstance(out_val, (tuple, list)) else (out_val,)
        multi = isinstance(out_val, (tuple, list))
        self.refuse_unbacked(op, vals)
        outputs = []
        for k, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                layout = Layout(v.shape, v.stride(), v.dtype, v.device)
                outputs.append(Buffer(f"{name}_{k}" if multi else name, layout))
            else:
                outputs.append(None)
        self.nodes.append(Extern(name, op, tuple(args), tuple(sorted(kwargs.items())), tuple(outputs),
                                 origins=self._origins(), mutates=tuple(mutates), after=tuple(after)))
        refs = tuple(TensorRef.of(b) if b is not None else None for b in outputs)
        return refs if multi else refs[0]

    def refuse_unbacked(self, op, vals) -> None:
        """An op whose result's size (or value: `.item()`) is known only once it has run (`nonzero`,
        `masked_select`, `_local_scalar_dense`: an unbacked symbol u0 of dynamo's) is refused when the graph
        is compiled, and the backend's fallback runs the graph eagerly. Both runners give size symbols their
        values from the graph's inputs, before any node runs: such a symbol had none, and the first size made
        of it failed at run time. A symbol some input carries (a backward given the forward's u0-sized
        tensors) is bound as any other."""
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        unbound = set().union(*(free_unbacked_symbols(v) for v in vals)) - self.bound_symbols
        if unbound:
            raise NotImplementedError(
                f"{op}: its result's size or value ({', '.join(sorted(map(str, unbound)))}) is known only at "
                "run time, and passline binds sizes from the graph's inputs")

    def eager_layout(self, size: tuple, dtype: torch.dtype, device) -> Layout:
        """The layout of a new buffer of `size`: the dense stride order eager gives the FX node being
        lowered (its meta value), so channels_last stays channels_last and the transpose of a transposed
        input stays transposed; row-major where eager's value has another size or is not dense.

        Why it matters: AOTAutograd compiles the backward, and the caller reads outputs, with the
        strides of the FX meta values. Matching them here makes most graph outputs right as written;
        `lower_graph` checks every output and copies the few that still differ."""
        val = self._meta_tensor(size)
        order = dense_order(val) if val is not None else None
        if order is None:
            return Layout.contiguous(size, dtype, device)
        return Layout(size, strides_in_order(size, order), dtype, device)

    def _meta_tensor(self, size: tuple):
        val = self.fx_node.meta.get("val") if self.fx_node is not None else None
        for v in (val if isinstance(val, (tuple, list)) else (val,)):
            if isinstance(v, torch.Tensor) and len(v.shape) == len(size) \
                    and all(sympify(a) == b for a, b in zip(v.shape, size)):
                return v
        return None

    def copy(self, ref: TensorRef, size=None, stride=None) -> TensorRef:
        """`ref`'s values (its first `size` points along each dim) in a new buffer laid out with `stride`
        (default: eager's layout of the FX node being lowered)."""
        return self.pointwise(ref.size if size is None else size, ref.dtype, ref.load, ref.buffer.layout.device,
                              stride=stride)

    def as_arg(self, ref: TensorRef) -> TensorArg:
        """A strided view of `ref` for an extern call; a copy when the view is not strided."""
        arg = ref.as_arg()
        return arg if arg is not None else self.copy(ref).as_arg()

    @property
    def device(self):
        val = self.fx_node.meta.get("val") if self.fx_node is not None else None
        if isinstance(val, (tuple, list)):
            val = next((v for v in val if isinstance(v, torch.Tensor)), None)
        return val.device if isinstance(val, torch.Tensor) else torch.device("cpu")


def hint(x) -> int | None:
    """The example value of a size or stride (a SymInt's hint under dynamic shapes); None if unknown."""
    if isinstance(x, torch.SymInt):
        h = getattr(x.node, "hint", None)
        return int(h) if h is not None else None
    return int(x)


def dense_order(val: torch.Tensor) -> tuple | None:
    """`val`'s dimensions from the innermost (stride 1) outwards when its strides are dense and
    non-overlapping, as eager's fresh tensors are (row-major, channels_last, a transpose's layout...);
    None for other strides (gaps, overlaps, zero elements) or unknown hints. Size-1 dimensions may have
    any stride and go where their stride sorts them."""
    sizes = [hint(s) for s in val.shape]
    strides = [hint(s) for s in val.stride()]
    if None in sizes or None in strides or 0 in sizes:
        return None
    order = sorted(range(len(sizes)), key=lambda d: (strides[d], sizes[d], -d))
    expect = 1
    for d in order:
        if sizes[d] != 1 and strides[d] != expect:
            return None
        expect *= sizes[d]
    return tuple(order)


def strides_in_order(size: tuple, order: tuple) -> tuple:
    """Dense strides for `size` with the dimensions laid out innermost-first as `order`."""
    stride = [sympy.S.One] * len(size)
    acc = sympy.S.One
    for d in order:
        stride[d] = acc
        acc = acc * size[d]
    return tuple(stride)
