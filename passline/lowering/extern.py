"""The extern fallback: any op without a (applicable) lowering becomes an Extern node calling aten.

Complex tensors always go this way: the loop-level IR is real-valued.
"""
from __future__ import annotations

import torch

from ..ir import Extern, comm_kind
from .context import LoweringContext
from .tensor import TensorRef


def _to_arg(ctx: LoweringContext, x):
    if isinstance(x, TensorRef):
        return ctx.as_arg(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_arg(ctx, y) for y in x)
    return x


def mutated_args(op) -> list[int]:
    """Positions of arguments the op writes in place, from its schema."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return []
    return [k for k, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


# Ops whose CPU kernels return other shapes than their meta functions (which the IR's layouts come from):
# `_embedding_bag` returns an empty offset2bag / bag_size where the meta says one per index or bag. The
# buffers the IR allocates and indexes would not fit what the op returns (nor, in the backward graph, what
# its backward ops are given), so the graph is refused when it is compiled (the backend's fallback runs
# it eagerly) rather than found out while running.
META_DISAGREES = {"_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward",
                  "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward"}


def lower_extern(ctx: LoweringContext, node: torch.fx.Node, args, kwargs):
    name = getattr(getattr(node.target, "_schema", None), "name", "").removeprefix("aten::")
    if name in META_DISAGREES:
        raise NotImplementedError(f"aten.{name}: its CPU kernel's output shapes differ from its meta function's")
    kind = comm_kind(node.target)
    after = _wait_after(ctx, args) if kind == "wait" else ()  # before any copy of the argument is made
    targs = _to_arg(ctx, tuple(args))
    tkwargs = {k: _to_arg(ctx, v) for k, v in kwargs.items()}
    mutates = [targs[k].buffer for k in mutated_args(node.target)
               if k < len(targs) and hasattr(targs[k], "buffer")]
    if kind == "collective" and ctx.last_collective is not None:
        after = ctx.last_collective.output_names()[:1]
    result = ctx.extern(node.target, targs, tkwargs, node.meta.get("val"), mutates, after)
    if kind == "collective":
        ctx.last_collective = ctx.nodes[-1]
    return result


# Functional collectives (torch.distributed._functional_collectives) are externs with two extra facts,
# kept as `Extern.after` buffers so that the graph's edges carry them through every pass:
# - a collective runs after the previous one: every rank must issue the same collectives in the same
#   order, or they pair up wrongly and hang;
# - `wait_tensor` runs after its collective's inputs: the collective may read them until it is waited for,
#   so their memory must not be freed, reused or written before (Inductor's "out-of-place collective
#   safety"). Everything that reads the result reads the wait's output, so it comes after the wait.
# A collective's result is read by nothing but its wait: a copy or a view made before the wait would
# read memory still being written.
def _wait_after(ctx: LoweringContext, args) -> tuple:
    ref = args[0] if args else None
    arg = ref.as_arg() if isinstance(ref, TensorRef) else None
    coll = None
    if arg is not None:
        coll = next((n for n in reversed(ctx.nodes) if arg.buffer in n.output_names()), None)
    if not isinstance(coll, Extern) or coll.comm != "collective":
        raise NotImplementedError(f"wait_tensor of {ref!r}, which is not a collective's result")
    return tuple(dict.fromkeys(t.buffer for t in coll.tensor_args()))


def touches_complex(node: torch.fx.Node) -> bool:
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = []
    for v in vals:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in flat)
