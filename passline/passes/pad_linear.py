"""pad_linear — a linear layer whose output rows are not 16-byte aligned computes them padded (stage fx).

`F.linear(x, W, b)` with `out_features` N such that a row of the result, N elements, is not a whole number
of 16 bytes (BERT's 30522-token vocabulary in bfloat16: 61044 bytes) writes its logits with rows starting
anywhere: cuBLAS then runs its 2-byte-aligned kernels, on an H200 1.6 ms for each of the LM head's three
matmuls (forward, input gradient, weight gradient) of a BERT-style step at 16 × 512 tokens, where Inductor,
which pads such dimensions (its `pad_mm` and padded strides), ran them 2–4 times faster: the step took 1.30×
Inductor's time. Generated kernels reading or writing such rows cannot use 16-byte vectors either.

This pass rewrites the call as `F.linear(x, F.pad(W, (0, 0, 0, p)), F.pad(b, (0, p)))[..., :N]`: W gets p
zero rows (p the fewest that align a row), the matmul writes rows of N + p elements, and the rest of the
graph reads the first N of each — a view, whose rows start 16-byte aligned. Autograd takes the gradient back
through the view (the logits' gradient is written padded, its extra columns zero) and through the pad (W's
gradient is the first N rows of the padded weight's), so every value is the one the unpadded graph computes.
The padded copy of W costs one read and one write of it a step (47 MB at 30522 × 768 in bfloat16: ~25 µs on
an H200), against matmuls over the whole batch's tokens — hence `min_rows`: with fewer rows than that (1024:
a decoding step's few tokens) the matmul mostly reads W, and copying W first would cost more than the
alignment saves.

The rest is the scheduler's: `F.pad` and the view's backward are Pointwise gathers (lowering/pad.py,
`slice_scatter`), and `inline_pointwise` moves the logits' gradient (cross-entropy's, or whatever computes
it) into the padded write, reading the logits at the positions it stores (docs/passes.md, *inline_pointwise*):
one kernel writes the padded gradient, over the logits' own storage, as the unpadded graph wrote its own.
Without that, the gradient was written unpadded and copied into the padded matrix (BERT-style's peak 1491 →
2465 MB in the thirty-eighth session, when this pass was off by default).

On dynamo's torch-level graph (shapes and dtypes from each node's example value). Applies to `F.linear`
(nn.Linear) on a GPU target whose weight is 2-D with static N of at least `min_features`, whose input has at
least `min_rows` rows (all but the last dimension; under dynamic shapes, at the traced sizes), whose output
(its dtype, under autocast the compute dtype) has rows not a multiple of `align` bytes, and whose result the
graph does not return as it is (a returned view would not have eager's strides). Stat `linears_padded`; each
rewrite is a decision `passline.bisect` can stop at. On a CPU target nothing is padded unless `any_device`
(tests).
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..lowering.context import hint
from ..pipeline.registry import AtLeast, register_pass
from .fuse_linear_cross_entropy import _LINEAR, _val  # (the same reading of dynamo's graph)


@register_pass("pad_linear", stage="fx", provides={"linears_padded"})
def pad_linear(gm: torch.fx.GraphModule, ctx, *,
               min_features: Annotated[int, "fewest output features worth padding", AtLeast(1)] = 1024,
               align: Annotated[int, "bytes a row of the output should be a multiple of", AtLeast(1)] = 16,
               min_rows: Annotated[int, "fewest input rows (tokens) worth padding for", AtLeast(1)] = 1024,
               any_device: Annotated[bool, "pad on a CPU target too (its kernels gain nothing: for tests)"] = False):
    """Pad a linear layer's weight so its output rows are 16-byte aligned, and read the first N (FX stage)."""
    if ctx.target.interpreted and not any_device:
        return gm
    graph = gm.graph
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target in _LINEAR):
            continue
        padding = _padding(node, min_features, align, min_rows)
        if padding is None or not ctx.decide("pad", node.name):
            continue
        _rewrite(graph, node, *padding)
        ctx.count("linears_padded")
    return gm


def _padding(node: torch.fx.Node, min_features: int, align: int, min_rows: int) -> tuple | None:
    """(N, p) for a linear this pass pads, else None."""
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    out, w = _val(node), _val(weight)
    if out is None or w is None or w.dim() != 2 or out.dim() < 1 or not out.dtype.is_floating_point:
        return None
    n = w.shape[0]
    if not isinstance(n, int) or n < min_features:  # (a symbolic N: not padded)
        return None
    size = out.dtype.itemsize
    if (n * size) % align == 0 or align % size:
        return None
    if any(u.op == "output" for u in node.users):  # returned as it is: eager's strides are the caller's
        return None
    rows = [hint(s) for s in out.shape[:-1]]  # (under dynamic shapes, the traced sizes)
    if None in rows or math.prod(rows) < min_rows:
        return None
    step = align // size
    return n, -n % step


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, n: int, p: int) -> None:
    x = node.args[0] if node.args else node.kwargs["input"]
    weight = node.args[1] if len(node.args) > 1 else node.kwargs["weight"]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    def call(fn, *args):
        """The call, with an example value as dynamo's nodes have (later FX-stage passes read them)."""
        new = graph.call_function(fn, args)
        values = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
        fakes = [v for v in values if isinstance(v, FakeTensor)]
        if fakes and all(v is not None for v, a in zip(values, args) if isinstance(a, torch.fx.Node)):
            with fakes[0].fake_mode:
                new.meta["example_value"] = fn(*values)
        return new

    with graph.inserting_before(node):
        w = call(F.pad, weight, (0, 0, 0, p))
        b = call(F.pad, bias, (0, p)) if isinstance(bias, torch.fx.Node) else bias
        y = call(torch._C._nn.linear, x, w, b) if b is not None else call(torch._C._nn.linear, x, w)
        out = call(torch.narrow, y, -1, 0, n)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
