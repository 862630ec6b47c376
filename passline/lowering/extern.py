"""The extern fallback: any op without a (applicable) lowering becomes an Extern node calling aten.

Complex tensors always go this way: the loop-level IR is real-valued.
"""
from __future__ import annotations

import torch

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
    targs = _to_arg(ctx, tuple(args))
    tkwargs = {k: _to_arg(ctx, v) for k, v in kwargs.items()}
    mutates = [targs[k].buffer for k in mutated_args(node.target)
               if k < len(targs) and hasattr(targs[k], "buffer")]
    return ctx.extern(node.target, targs, tkwargs, node.meta.get("val"), mutates)


def touches_complex(node: torch.fx.Node) -> bool:
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = []
    for v in vals:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in flat)
