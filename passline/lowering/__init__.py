"""aten FX graph → Program (passline IR nodes in program order).

Table-driven: `registry.LOWERINGS` maps each aten op to its lowering; anything else, and anything a
lowering declines, runs as an Extern aten call. Importing this package fills the table.
"""
from __future__ import annotations

import operator

import sympy
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

from ..ir import Buffer, Layout, TensorArg
from ..ir.index import derived_definition, sympify
from . import cat, choices, indexing, mutation, pad, pointwise, pooling, reductions, views  # noqa: F401  (fill the lowering table)
from .context import ASSERTIONS, GraphInput, LoweringContext, Program, dense_order, hint, strides_in_order
from .decompositions import decomposition_table
from .extern import is_rng_state_op, lower_extern, lower_rng_state_op, touches_complex
from .registry import LOWERINGS, lowering
from .retrace import ensure_traced
from .sizes import derived_hints, derived_sizes, is_size_node, size_facts, size_value
from .tensor import TensorRef

__all__ = ["lower_graph", "Program", "GraphInput", "LOWERINGS", "lowering", "decomposition_table",
           "TensorRef", "LoweringError"]


class LoweringError(RuntimeError):
    """Lowering failed on one FX node; the message names it."""


def lower_graph(gm: torch.fx.GraphModule, example_inputs=None, chooser=None) -> Program:
    """`gm` as a Program. `chooser` decides how nodes whose op has registered choices are implemented
    (lowering/choices.py: `Rule`, or the dynamo backend's timing chooser); None: by the op itself, with no
    record."""
    ensure_traced(gm)  # a graph aot_autograd's cache gave back has no traced values (lowering/retrace.py)
    ctx = LoweringContext()
    ctx.chooser = chooser
    env: dict[torch.fx.Node, object] = {}
    inputs: list[GraphInput] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, n in enumerate(placeholders):
        val = n.meta.get("val", example_inputs[k] if example_inputs is not None else None)
        inputs.append(_input(n.name, val))
        if inputs[-1].buffer is not None:
            ctx.inputs[n.name] = inputs[-1].buffer
        env[n] = TensorRef.of(inputs[-1].buffer) if inputs[-1].buffer is not None else (
            inputs[-1].symbol if inputs[-1].symbol is not None else val)
        # the symbols the runners bind from this input (backends.reference.size_sources: a size, a stride
        # or an int input that is a symbol itself)
        given = (*inputs[-1].buffer.layout.size, *inputs[-1].buffer.layout.stride) \
            if inputs[-1].buffer is not None else (inputs[-1].symbol,)
        ctx.bound_symbols |= {e for e in given if isinstance(e, sympy.Symbol)}
    _lower_nodes(ctx, gm, env)
    ctx.fx_node = None
    outs = _output_node(gm).args[0]
    storages = _input_storages(placeholders)
    outputs = tuple(_output(ctx, env[o], o.meta.get("val"), storages) if isinstance(o, torch.fx.Node) else o
                    for o in (outs if isinstance(outs, (tuple, list)) else (outs,)))
    derived = derived_sizes(gm)
    for s in derived:  # the runners compute each from the sizes they bind from the inputs
        unbound = derived_definition(s).free_symbols - ctx.bound_symbols
        if unbound:
            raise NotImplementedError(f"size {derived_definition(s)} of values passline does not bind at run time "
                                      f"({', '.join(sorted(map(str, unbound)))})")
    bounds, hints = size_facts(gm)
    return Program(tuple(inputs), tuple(ctx.nodes), outputs, tuple(ctx.choices), bounds,
                   {**hints, **derived_hints(derived, hints)}, derived)


def _output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def _lower_nodes(ctx: LoweringContext, gm: torch.fx.GraphModule, env: dict) -> None:
    """Lower every computing node of `gm` into `ctx`, in order; `env` holds the placeholders' values."""
    for n in gm.graph.nodes:
        if n.op == "call_function":
            ctx.fx_node = n
            try:
                env[n] = _lower_call(ctx, n, env)
            except NotImplementedError:
                raise
            except Exception as e:
                raise LoweringError(f"lowering {n.format_node()} failed: {e}") from e
        elif n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor):
            # a tensor constant aot_autograd lifted out of the program (an index list, a mask): an extern
            # that hands out a copy of it, so no node's result ever aliases the module's attribute
            ctx.fx_node = n
            value = getattr(gm, n.target)
            env[n] = ctx.extern(TensorConstant(n.target, value), (), {}, value)
        elif n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule):
            # the body of a higher-order operator (torch.cond's branches, flex_attention's score_mod)
            raise LoweringError(f"higher-order operators with subgraphs (torch.cond, torch.while_loop, "
                                f"flex_attention) are not supported: {n.format_node()}")
        elif n.op not in ("placeholder", "output"):
            raise LoweringError(f"unsupported FX node kind {n.op!r}: {n.format_node()}")


def _inline(ctx: LoweringContext, node: torch.fx.Node, gm: torch.fx.GraphModule, args, kwargs):
    """Lower the aten graph `gm` of a chosen candidate (choices.trace) in place of `node`: its placeholders
    take the lowered tensors among the node's arguments, its nodes join this graph (named after `node` in
    their origins, so provenance and explain point at the op they implement), and its result is the node's.
    Ops inside are lowered by themselves: a candidate's own matmul is not offered choices again."""
    leaves = tree_flatten((args, kwargs))[0]
    metas = tree_flatten(choices.meta_args(node))[0]
    tensors = [v for v, m in zip(leaves, metas) if isinstance(m, torch.Tensor)]
    inner = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), tensors))
    saved = ctx.chooser, ctx.origin
    ctx.chooser, ctx.origin = None, node.name
    try:
        _lower_nodes(ctx, gm, inner)
    finally:
        ctx.chooser, ctx.origin = saved
    return inner[_output_node(gm).args[0]]


class TensorConstant:
    """The op of an Extern producing a graph's tensor constant: called with no arguments, it returns a copy.
    Compared by identity (a tensor's == is elementwise) and printed by name."""

    def __init__(self, name: str, value: torch.Tensor):
        self.name, self.value = name, value  # no tensor op here: lowering runs under FakeTensorMode

    def __call__(self) -> torch.Tensor:
        return self.value.clone()

    def __repr__(self) -> str:
        return f"constant {self.name}{list(self.value.shape)}"

    __name__ = property(lambda self: f"constant {self.name}")


def _input(name: str, val) -> GraphInput:
    if isinstance(val, torch.Tensor):
        layout = Layout(val.shape, val.stride(), val.dtype, val.device)
        return GraphInput(name, buffer=Buffer(name, layout))
    if isinstance(val, torch.SymInt):
        return GraphInput(name, symbol=sympify(val))
    return GraphInput(name)


def _lower_call(ctx: LoweringContext, n: torch.fx.Node, env):
    if n.target is operator.getitem:
        seq, idx = n.args
        return env[seq][idx]
    if is_size_node(n):  # size arithmetic (dynamic shapes): the traced value's sympy expression
        # ... but not an `.item()`'s (`_local_scalar_dense` under capture_scalar_outputs), nor arithmetic on one, that
        # no input binds, where it reaches more than assertions: the first size or scalar made of it failed at run
        # time (the sixty-first session's campaign); an assertion on it is dropped, unchecked (LoweringContext.extern)
        if not _asserted_only(n):
            ctx.refuse_unbacked(n.target, (n.meta.get("val"),))
        return size_value(n)
    args = torch.fx.node.map_arg(n.args, lambda a: env[a])
    kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
    picked = choices.choose(ctx.chooser, n)
    if picked is not None:
        record, candidate = picked
        ctx.choices.append(record)
        if candidate is not choices.OP:
            return _inline(ctx, n, choices.trace(candidate, n), args, kwargs)
    fn = LOWERINGS.get(n.target)
    if fn is not None and not touches_complex(n):
        result = fn(ctx, n, *args, **kwargs)
        if result is not NotImplemented:
            return result
    if is_rng_state_op(n.target):
        return lower_rng_state_op(ctx, n, args, kwargs)
    if not isinstance(n.target, torch._ops.OpOverload):
        raise NotImplementedError(f"passline cannot run {n.target!r} (not an aten op): {n.format_node()}")
    return lower_extern(ctx, n, args, kwargs)


def _asserted_only(n: torch.fx.Node) -> bool:
    """Whether size node `n`'s value reaches nothing but assertions (`torch._check(n >= 2)`), through size
    arithmetic."""
    todo, seen = [n], set()
    while todo:
        for user in todo.pop().users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_function" and user.target in ASSERTIONS:
                continue
            if user.op != "call_function" or not is_size_node(user):
                return False
            todo.append(user)
    return True


def _input_storages(placeholders) -> dict:
    """The traced storage of each tensor input → (input's name, its traced value)."""
    found = {}
    for n in placeholders:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            found.setdefault(StorageWeakRef(val.untyped_storage()), (n.name, val))
    return found


def _output(ctx: LoweringContext, value, val, storages: dict):
    if isinstance(value, TensorRef):
        return _eager_strided(ctx, value, val, storages)
    if isinstance(value, sympy.Basic):
        # a value only the run knows (an `.item()` dynamo captured with capture_scalar_outputs, or what is
        # computed from it: `x.max().item() > 0.5`) is refused, as an op returning one is: no runner binds it,
        # and the call failed evaluating it ("float() argument must be ... not 'StrictGreaterThan'")
        ctx.refuse_unbacked("a graph output", (val,))
    if isinstance(value, (sympy.Basic, int, float, bool)) or value is None:
        return value  # a size (dynamic shapes): the runner returns its value as eager does
    raise LoweringError(f"unsupported graph output {value!r}")


def _eager_strided(ctx: LoweringContext, ref: TensorRef, val, storages: dict) -> TensorArg:
    """A graph output as a strided view with the strides eager gives it (FX meta `val`).

    Strides are a contract: AOTAutograd compiled the backward against the forward outputs' meta strides
    (saved activations), regenerates aliases of outputs with them, and users read results with them.
    A view that already has them is returned as it is; otherwise the value is copied into a buffer laid
    out as eager's: dense in eager's stride order, with eager's exact strides where those have gaps, and
    stride 0 kept as a broadcast of a smaller buffer. An output that eager returns as a view of an input
    (and that passline would have copied) is that view of the input: aot_autograd rebuilds such an output
    on the input from the strides and storage offset we return, so a copy's offset 0 would be read as
    the input's start."""
    arg = ref.as_arg()
    if not isinstance(val, torch.Tensor) or len(val.shape) != ref.ndim:
        return arg if arg is not None else ctx.as_arg(ref)
    want = tuple(sympify(s) for s in val.stride())
    sizes = [hint(s) for s in val.shape]
    if arg is not None and _same_strides(arg.stride, want, sizes):
        return arg
    view = _input_view(ctx, val, storages)
    if view is not None:
        return view
    if 0 in sizes:  # no element to place: any layout is eager's layout
        return arg if arg is not None else ctx.as_arg(ref)
    if 0 in (hint(st) for st, n in zip(val.stride(), sizes) if n is not None and n > 1):
        # expanded: store the distinct values once and hand out the broadcast view eager has
        keep = tuple(sympy.S.One if st == 0 else s for s, st in zip(ref.size, want))
        base = ctx.copy(ref, keep, tuple(st if st != 0 else sympy.S.One for st in want)).as_arg()
        return TensorArg(base.buffer, ref.size, want, base.offset)
    order = dense_order(val)
    stride = strides_in_order(ref.size, order) if order is not None else want
    return ctx.copy(ref, stride=stride).as_arg()


def _input_view(ctx: LoweringContext, val, storages: dict) -> TensorArg | None:
    """`val` (an output's traced value) as a view of the input whose traced storage it shares; None if it
    shares none, or if its offset from the input's start is negative or uses a size no runner binds."""
    found = storages.get(StorageWeakRef(val.untyped_storage()))
    if found is None:
        return None
    name, base = found
    offset = sympy.expand(sympify(val.storage_offset()) - sympify(base.storage_offset()))
    ahead = (hint(val.storage_offset()) or 0) - (hint(base.storage_offset()) or 0)
    if offset.free_symbols - ctx.bound_symbols or ahead < 0:
        return None
    return TensorArg(name, tuple(sympify(s) for s in val.shape), tuple(sympify(s) for s in val.stride()), offset)


def _same_strides(have, want, sizes) -> bool:
    """Equal on every dimension that has more than one element (other strides are never read)."""
    return all(n is not None and n <= 1 or sympy.expand(a - b) == 0 for a, b, n in zip(have, want, sizes))
