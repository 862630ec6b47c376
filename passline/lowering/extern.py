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


def lower_extern(ctx: LoweringContext, node: torch.fx.Node, args, kwargs):
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
