"""The lowering table: one registration per aten op.

A lowering is `fn(ctx, fx_node, *args, **kwargs)` where FX-node arguments arrive as TensorRef
(tensors) or sympy expressions (SymInts). It returns a TensorRef (or a tuple of them), or
`NotImplemented` to hand this call to the extern fallback — so an unusual argument never lowers wrongly.
"""
from __future__ import annotations

from typing import Callable

LOWERINGS: dict[object, Callable] = {}


def lowering(*ops):
    """Register `fn` as the lowering of each op (OpOverload or OpOverloadPacket: all overloads)."""

    def register(fn):
        for op in ops:
            targets = [getattr(op, o) for o in op.overloads()] if hasattr(op, "overloads") else [op]
            for t in targets:
                if t in LOWERINGS:
                    raise ValueError(f"{t} already has a lowering ({LOWERINGS[t].__name__})")
                LOWERINGS[t] = fn
        return fn

    return register
