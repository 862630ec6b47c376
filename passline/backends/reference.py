"""The reference backend: runs a SchedulerGraph with torch ops, the oracle for every other backend.

Loop bodies are evaluated vectorized: each loop variable is an `arange` shaped to broadcast along its
own axis, so a body is evaluated once over the whole index grid with no Python loop per element.
Loads gather from the buffer's storage with the sympy index evaluated on that grid.
"""
from __future__ import annotations

import math
from typing import Callable

import sympy
import torch

from ..ir import (
    Cast,
    Constant,
    Extern,
    FusedNode,
    IndexValue,
    Load,
    MixOrderNode,
    Op,
    Pointwise,
    Reduction,
    Scatter,
    TensorArg,
    walk,
)
from ..ir.index import FloorDiv, ModularIndexing, derived_value
from ..lowering.sizes import runtime_value, translate
from ..pipeline.graph import SchedulerGraph

_TORCH_OPS: dict[str, Callable] = {
    "truediv": torch.true_divide, "floordiv": torch.floor_divide, "where": torch.where,
}


def _torch_op(name: str) -> Callable:
    return _TORCH_OPS.get(name) or getattr(torch, name)


def size_sources(graph: SchedulerGraph) -> list[tuple[sympy.Symbol, int, str, int]]:
    """Where each size symbol's value comes from at run time (dynamic shapes), for both backends:
    (symbol, input position, "int" | "size" | "stride", dim), the first source of each symbol only —
    SymInt inputs, then tensor sizes, then strides, the stride of a size-1 dim last: it addresses
    nothing and may be anything (a saved unsqueeze arrives with stride 0 where its layout says `s1`;
    bound from it, every size made of s1 was 0, and an extern read out of bounds). Then the graph's
    derived sizes no input gives, `(symbol, -1, "derived", 0)`: computed from the ones before."""
    found: dict = {}
    for k, inp in enumerate(graph.inputs):
        if inp.symbol is not None and isinstance(inp.symbol, sympy.Symbol):
            found.setdefault(inp.symbol, (inp.symbol, k, "int", 0))
    for kind, size_one in (("size", None), ("stride", False), ("stride", True)):
        for k, inp in enumerate(graph.inputs):
            if inp.buffer is None or (inp.symbol is not None and isinstance(inp.symbol, sympy.Symbol)):
                continue
            lay = inp.buffer.layout
            for d, (n, st) in enumerate(zip(lay.size, lay.stride)):
                e = n if kind == "size" else st
                if isinstance(e, sympy.Symbol) and (size_one is None or size_one == (n == 1)):
                    found.setdefault(e, (e, k, kind, d))
    for s in graph.derived:  # computed from those above (ir.index.derive), last
        found.setdefault(s, (s, -1, "derived", 0))
    return list(found.values())


class _Bindings:
    """Values of size symbols for one call (dynamic shapes); evaluates sympy to Python ints."""

    def __init__(self, values: dict):
        self._memo: dict = {}
        self.plans: dict = {}  # what a runner derives from these sizes (allocations), kept with them
        self.values: dict[sympy.Symbol, int] = values

    @classmethod
    def read(cls, sources: list, args) -> _Bindings:
        """The sizes of a call's `args`; `sources`: `size_sources(graph)`, computed once per runner (it
        walks every input's layout)."""
        values: dict = {}
        for sym, k, kind, d in sources:
            values[sym] = int(args[k]) if kind == "int" else args[k].shape[d] if kind == "size" else \
                args[k].stride(d) if kind == "stride" else derived_value(sym, values)
        return cls(values)

    @classmethod
    def of(cls, sources: list, values: tuple) -> _Bindings:
        """The binding of `values`, one for each of `sources` (already read from the arguments)."""
        return cls({sym: int(v) for (sym, *_), v in zip(sources, values, strict=True)})

    def int(self, e) -> int:
        if isinstance(e, (int, bool)):
            return int(e)
        v = self._memo.get(e)
        if v is None:  # each expression once per binding: runners reuse a binding across static calls
            v = self._memo[e] = int(e.xreplace(self.values)) if self.values else int(e)
        return v

    def ints(self, es) -> list[int]:
        return [self.int(e) for e in es]


def eval_index(expr: sympy.Expr, env: dict):
    """Evaluate an index expression with symbols bound to int64 tensors or ints."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr]
    if not (expr.is_Add or expr.is_Mul or expr.is_Pow or isinstance(expr, _EVALUATED)):
        plain = translate(expr)  # torch's own size functions (a layout taken from a traced value's shape)
        if plain != expr:
            return eval_index(plain, env)
        raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")
    args = [eval_index(a, env) for a in expr.args]
    if expr.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        return args[0] ** int(expr.exp)
    if isinstance(expr, sympy.Max):
        return _fold(torch.maximum, max, args)
    if isinstance(expr, sympy.Min):
        return _fold(torch.minimum, min, args)
    raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")


_EVALUATED = (FloorDiv, ModularIndexing, sympy.Max, sympy.Min)  # what eval_index computes itself


def _fold(tfn, pyfn, args):
    out = args[0]
    for a in args[1:]:
        if isinstance(out, torch.Tensor) or isinstance(a, torch.Tensor):
            out = tfn(torch.as_tensor(out), torch.as_tensor(a))
        else:
            out = pyfn(out, a)
    return out


class IndexOutOfBounds(IndexError):
    """An index tensor holds a value outside the dimension it indexes (eager raises IndexError or
    RuntimeError for the same; the message says which index, its value and the bound)."""


def bind_indirect(holder, vals: dict, grid: dict, bind: "_Bindings") -> dict:
    """`grid` with each index symbol of `holder` (a Load or IndexValue) bound to its evaluated value:
    negative values wrapped where the binding allows it, then checked against the bound unless proven,
    so that no gather below ever addresses memory outside its buffer."""
    grid = dict(grid)
    for b in holder.indirect:
        v = vals[id(b.value)]
        v = v.to(torch.int64) if isinstance(v, torch.Tensor) else torch.tensor(int(v))
        bound = bind.int(b.bound)
        raw = v
        if b.wrap:
            v = torch.where(v < 0, v + bound, v)
        if not b.proven:
            bad = (v < 0) | (v >= bound)
            if bool(bad.any()):
                first = int(raw.broadcast_to(bad.shape)[bad].flatten()[0])
                raise IndexOutOfBounds(f"index {first} is out of bounds for {b.what} with size {bound}")
        grid[b.symbol] = v
    return grid


def flat_storage(t: torch.Tensor, span: int) -> torch.Tensor:
    """A 1-D view of the `span` elements starting at t's first element."""
    return t.as_strided((span,), (1,))


class ReferenceRunner:
    """Callable that runs the graph: `runner(*inputs) -> list of outputs`."""

    def __init__(self, graph: SchedulerGraph):
        self.graph = graph
        self.nodes = graph.nodes()
        self.buffers = graph.buffers()
        self.sources = size_sources(graph)  # where each call's size symbols are read (dynamic shapes)
        keep = graph.output_names() | set(graph.input_buffers())
        last_use: dict[str, int] = {}
        for k, node in enumerate(self.nodes):
            for b in node.read_names():
                last_use[b] = k
        # buffers that can be dropped after node k runs
        self.free_after: dict[int, list[str]] = {}
        for b, k in last_use.items():
            if b not in keep:
                self.free_after.setdefault(k, []).append(b)

    def __call__(self, *args):
        bind = _Bindings.read(self.sources, args)
        env: dict[str, torch.Tensor] = {}
        for inp, arg in zip(self.graph.inputs, args):
            if inp.buffer is not None:
                env[inp.name] = arg
        for k, node in enumerate(self.nodes):
            if isinstance(node, Extern):
                self._extern(node, env, bind)
            elif isinstance(node, (FusedNode, MixOrderNode)):
                # a group computes exactly what its members compute, in order: the oracle runs them so
                for m in node.members():
                    env[m.output.name] = self._loop(m, env, bind)
            else:
                env[node.output.name] = self._loop(node, env, bind)
            for b in self.free_after.get(k, ()):
                env.pop(b, None)
        return [self._output(o, env, bind) for o in self.graph.outputs]

    # -- pieces -----------------------------------------------------------------------------------
    def _output(self, o, env, bind: _Bindings):
        if isinstance(o, TensorArg):
            t = env[o.buffer]
            size, stride, offset = bind.ints(o.size), bind.ints(o.stride), bind.int(o.offset)
            if offset == 0 and list(t.shape) == size and list(t.stride()) == stride:
                # the buffer itself, not a view of it (as the Triton wrapper): autograd forbids writing in
                # place into a view made inside a custom Function, and a user may write into an output
                return t
            return t.as_strided(size, stride, t.storage_offset() + offset)
        if isinstance(o, sympy.Basic):
            return runtime_value(o, bind.values)
        return o

    def _arg(self, x, env, bind: _Bindings):
        if isinstance(x, TensorArg):
            t = env[x.buffer]
            return t.as_strided(bind.ints(x.size), bind.ints(x.stride), t.storage_offset() + bind.int(x.offset))
        if isinstance(x, sympy.Expr):
            return bind.int(x) if x.is_integer else float(x.xreplace(bind.values))
        if isinstance(x, sympy.Basic):  # a comparison of sizes (a run-time assert's condition)
            return runtime_value(x, bind.values)
        if isinstance(x, list):
            return [self._arg(y, env, bind) for y in x]
        if isinstance(x, tuple):
            return tuple(self._arg(y, env, bind) for y in x)
        return x

    def _extern(self, node: Extern, env, bind: _Bindings) -> None:
        args = self._arg(node.args, env, bind)
        kwargs = {k: self._arg(v, env, bind) for k, v in node.kwargs}
        result = node.op(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for buf, r in zip(node.outputs, results):
            if buf is None:
                continue
            env[buf.name] = conform_result(node, r, bind.ints(buf.layout.size), bind.ints(buf.layout.stride),
                                           buf.layout.dtype)

    def _loop(self, node: Pointwise | Reduction | Scatter, env, bind: _Bindings) -> torch.Tensor:
        if isinstance(node, Scatter):
            return self._scatter(node, env, bind)
        lay = node.output.layout
        if getattr(node, "in_place", False):
            out = env[node.output.name]  # the graph input it overwrites (after the body read the old values)
        else:
            out = torch.empty_strided(bind.ints(lay.size), bind.ints(lay.stride), dtype=lay.dtype, device=lay.device)
        ranges = bind.ints(node.ranges)
        rranges = bind.ints(getattr(node, "reduction_ranges", ()))
        shape = ranges + rranges
        if math.prod(ranges) == 0:
            return out
        grid = {}
        for k, (var, _) in enumerate(node.var_ranges):
            view = [1] * len(shape)
            view[k] = shape[k]
            grid[var] = torch.arange(shape[k], device=lay.device).view(view)
        for sym, val in bind.values.items():
            grid[sym] = val
        value = self._eval(node.body, env, grid, bind, lay.device)
        value = value.broadcast_to(shape)
        if isinstance(node, Reduction):
            value = _reduce(node.reduction_type, value.reshape(ranges + [-1]))
        out.copy_(value.permute(node.permutation) if node.permutation else value)
        return out

    def _scatter(self, node: Scatter, env, bind: _Bindings) -> torch.Tensor:
        """Write (or add) the body's values into the target buffer in place, at the positions the index
        gives: index_put_ on the flat storage, accumulating for "add" so duplicates are summed."""
        target = env[node.output.name]
        lay = node.output.layout
        shape = bind.ints(node.ranges)
        if math.prod(shape) == 0:
            return target
        grid = {var: torch.arange(n, device=lay.device).view([n if j == k else 1 for j in range(len(shape))])
                for k, ((var, _), n) in enumerate(zip(node.var_ranges, shape))}
        grid.update(bind.values)
        # the positions: an IndexValue holding the node's index and bindings (checked like any indirect index)
        where = self._eval(IndexValue(node.index, torch.int64, node.indirect), env, grid, bind, lay.device)
        value = self._eval(node.body, env, grid, bind, lay.device)
        pos = torch.as_tensor(where, device=lay.device).broadcast_to(shape).reshape(-1)
        value = value.broadcast_to(shape).reshape(-1).to(lay.dtype)
        flat = flat_storage(target, bind.int(lay.storage_span))
        flat.index_put_((pos,), value, accumulate=node.mode == "add")
        return target

    def _eval(self, root, env, grid, bind: _Bindings, device):
        vals: dict[int, torch.Tensor] = {}
        for v in walk(root):
            if isinstance(v, Load):
                t = env[v.buffer]
                span = bind.int(self.buffers[v.buffer].layout.storage_span)
                idx = eval_index(v.index, bind_indirect(v, vals, grid, bind) if v.indirect else grid)
                vals[id(v)] = flat_storage(t, span)[idx]
            elif isinstance(v, Constant):
                vals[id(v)] = torch.tensor(v.in_range(), dtype=v.dtype, device=device)
            elif isinstance(v, IndexValue):
                at = bind_indirect(v, vals, grid, bind) if v.indirect else grid
                vals[id(v)] = torch.as_tensor(eval_index(v.expr, at), device=device).to(v.dtype)
            elif isinstance(v, Cast):
                vals[id(v)] = vals[id(v.value)].to(v.dtype)
            elif isinstance(v, Op):
                r = _torch_op(v.name)(*[vals[id(a)] for a in v.args])
                vals[id(v)] = r if r.dtype == v.dtype else r.to(v.dtype)
        return vals[id(root)]


def conform_result(node: Extern, r: torch.Tensor, size, stride, dtype) -> torch.Tensor:
    """An extern's result with the shape, strides and dtype the IR recorded for it (both backends). The IR
    indexes the buffer with the recorded strides and reads it with the recorded dtype (a generated kernel's
    loads take the tensor's dtype): the storage must match both. The dtypes differ where an op's CPU kernel
    disagrees with its meta function (bfloat16 _batch_norm_with_update returns bfloat16 statistics; its
    meta says float32)."""
    if r.dtype == dtype and r.shape == size and r.stride() == stride:  # the usual case, compared in C
        return r
    if list(r.shape) != list(size):
        raise RuntimeError(f"{node.name}: {node.op} returned shape {list(r.shape)}, expected {list(size)}")
    if r.dtype != dtype or (r.numel() > 1 and any(st != want for s, st, want in zip(size, r.stride(), stride)
                                                  if s > 1)):
        if node.comm == "collective":  # a copy now would read what the collective is still writing
            raise RuntimeError(f"{node.name}: {node.op} returned {r.dtype} strides {r.stride()}, not the "
                               f"{dtype} {tuple(stride)} it was lowered with; it cannot be copied before "
                               f"its wait")
        r = torch.empty_strided(size, stride, dtype=dtype, device=r.device).copy_(r)
    return r


def _reduce(rtype: str, x: torch.Tensor) -> torch.Tensor:
    if rtype == "sum":
        return x.sum(-1, dtype=x.dtype)
    if rtype == "prod":
        return x.prod(-1, dtype=x.dtype)
    if rtype == "max":
        return x.amax(-1)
    if rtype == "min":
        return x.amin(-1)
    if rtype in ("argmax", "argmin") and x.dtype == torch.bool:
        x = x.to(torch.uint8)  # torch's argmax refuses bool (cumprod's backward finds its first zero so)
    if rtype == "argmax":
        return x.argmax(-1)
    if rtype == "argmin":
        return x.argmin(-1)
    if rtype == "any":
        return x.any(-1)
    if rtype == "all":
        return x.all(-1)
    raise NotImplementedError(rtype)
