"""Writes into graph inputs: `aten.copy_(dst, src)` where `dst` is a placeholder.

aot_autograd (with `keep_inference_input_mutations=True`, see backends/dynamo.py) leaves the mutation of
a graph input that needs no gradient in the graph as one `copy_(input, new_value)` at its end: BatchNorm's
running mean, running variance and batch count, `x.add_(1)` of a buffer. Lowered as an in-place Pointwise
(`Pointwise.in_place`: it writes the input's own buffer and produces none), so that fusion stores the new
value from the kernel computing it rather than running a copy after the graph. copy_'s semantics: `src`
is broadcast to `dst`'s shape and cast to its dtype. Anything else (a view of an input, another device,
a buffer the graph made) stays an extern `copy_`.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Pointwise, VarKind, loop_vars
from .context import LoweringContext
from .pointwise import value
from .registry import lowering
from .tensor import TensorRef

aten = torch.ops.aten


@lowering(aten.copy_.default)
def lower_copy_(ctx: LoweringContext, node, dst, src, non_blocking=False):
    if not isinstance(dst, TensorRef) or not isinstance(src, TensorRef):
        return NotImplemented
    target = ctx.inputs.get(dst.buffer.name)
    if target is None or dst != TensorRef.of(target):
        return NotImplemented  # not a whole graph input: the extern writes wherever the view points
    if src.buffer.layout.device != target.layout.device:
        return NotImplemented  # a copy between devices is aten's job
    if src.buffer.name == target.name and src != dst:
        # a view of the input itself (`x.copy_(x.t())`): read it whole before any of it is overwritten
        src = ctx.copy(src)
    size = tuple(sympy.sympify(s) for s in dst.size)
    body = value(src, loop_vars(VarKind.OUTER, len(size)), len(size), target.dtype)
    ctx.nodes.append(Pointwise(ctx.new_name(), size, body, target, origins=ctx._origins(), in_place=True))
    return dst  # copy_ returns its destination: a later read of it reads the new values
