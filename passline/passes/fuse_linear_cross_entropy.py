"""fuse_linear_cross_entropy — an LM head's loss without its logits (stage fx; not in the default pipeline).

`F.cross_entropy(F.linear(x, W, b), target)` makes a `[tokens, vocabulary]` logits tensor (2 GiB in
bfloat16 for 8k tokens and a 128k vocabulary, and again in float32 when the model upcasts), and autograd
keeps it, or its log-softmax, from the forward to the backward. This pass replaces the pattern with
one op (passline/ops/linear_cross_entropy.py) that runs the rows in chunks — per chunk one matmul, the
loss and the logits' gradient, consumed at once by the matmuls that give the gradients of x, W and b — so
that no more than a chunk of logits ever exists. For a mean or sum loss that autograd will differentiate
(dynamo's example value of the loss requires grad), `passline::linear_cross_entropy_with_grads` computes the
gradients with the loss and the backward only scales them (3 matmuls); otherwise (`reduction="none"`, no
gradient, or `grads_in_forward=false`), `passline::linear_cross_entropy`, whose backward computes each
chunk's logits again from the saved x, W, b and target (4 matmuls).

It must see the graph before aot_autograd, which would otherwise save the logits for the backward: it is
an FX-stage pass (registry.STAGES), run by the dynamo backend on each captured graph, first in the
pipeline: `passline.backend(pipeline="fuse_linear_cross_entropy, " + passline.DEFAULT_PIPELINE)`.

Recognized, on dynamo's torch-level graph (shapes and dtypes read from each node's example value):
- the linear: `F.linear(x, W[, b])` (nn.Linear), or `x @ M` / `torch.matmul` / `torch.mm` with a 2-D `M`
  (`W.T`, `W.t()`, `W.transpose(0, 1)`: W is used as it is; any other M: `M.t()`);
- between it and the loss, each read by nothing else: reshapes that keep the last dimension (the
  vocabulary): `view(-1, V)`, `reshape`, `flatten(0, 1)`; `contiguous()`; a cast up to float32
  (`.float()`, `.to(torch.float32)`), which makes the loss float32 as eager's would be;
- `F.cross_entropy(logits, target, ignore_index=..., reduction=..., label_smoothing=...)` with 2-D logits
  `[N, V]`, an int64 target `[N]`, constant options, no class weights.
x, W and b share one floating dtype (an autocast region, where they do not, is left alone). A tied
embedding needs nothing: W's uses are separate inputs to autograd, whose gradients add up.

Left alone, with the reason as a stat `linear_cross_entropy_refused_<reason>`: logits (or a value
between them and the loss) read by anything else — returned, or a second loss — since they would exist
anyway (`logits_read_elsewhere`); no linear before the loss (`no_linear`); class weights, legacy
size_average/reduce or options that are not constants (`options`); shapes or dtypes outside the above
(`shapes`, `dtypes`); a graph that runs a torch.func transform (`transform`: the fused op has no rules for
them). Stat `linear_cross_entropy_fused` counts rewrites, each a decision
`passline.bisect` can stop at.
"""
from __future__ import annotations

import inspect
import operator
from typing import Annotated

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..ops.linear_cross_entropy import REDUCTIONS
from ..pipeline.registry import AtLeast, register_pass

_CROSS_ENTROPY = inspect.signature(F.cross_entropy)
_LINEAR = {F.linear, torch._C._nn.linear}
_MATMUL_FUNCTIONS = {operator.matmul, torch.matmul, torch.mm}
_MATMUL_METHODS = {"matmul", "mm", "__matmul__"}
# between the linear and the loss: ops that keep every logit's value and position (checked on the example
# values: the same elements, the vocabulary last, the dtype kept or raised to float32)
_KEEP_METHODS = {"view", "reshape", "flatten", "contiguous", "float", "to"}
_KEEP_FUNCTIONS = {torch.reshape, torch.flatten}


class _Refused(Exception):
    def __init__(self, reason: str):
        self.reason = reason


@register_pass("fuse_linear_cross_entropy", stage="fx", provides={"linear_cross_entropy_fused"})
def fuse_linear_cross_entropy(gm: torch.fx.GraphModule, ctx, *,
                              chunk_rows: Annotated[int, "rows per chunk (0: the rule of "
                                                         "ops.linear_cross_entropy.default_chunk_rows)",
                                                         AtLeast(0)] = 0,
                              grads_in_forward: Annotated[bool, "a mean or sum loss that autograd will "
                                                                "differentiate: gradients with the loss, 3 "
                                                                "matmuls (false: recomputed, 4)"] = True):
    """Compute cross_entropy(linear(x, W), target) in chunks of rows, never the whole logits (FX stage)."""
    graph = gm.graph
    transformed = _in_transform(graph)
    for ce in list(graph.nodes):
        if not (ce.op == "call_function" and ce.target is F.cross_entropy):
            continue
        try:
            if ce in transformed:
                raise _Refused("transform")
            match = _match(ce)
        except _Refused as r:
            ctx.count(f"linear_cross_entropy_refused_{r.reason}")
            continue
        if ctx.decide("fuse", ce.name):
            _rewrite(graph, ce, match, chunk_rows, grads_in_forward)
            ctx.count("linear_cross_entropy_fused")
    return gm


def _in_transform(graph: torch.fx.Graph) -> set:
    """The nodes a torch.func transform (grad, vjp, jacrev, vmap, jvp) runs: dynamo inlines each transform
    between calls that enter and leave a nesting level (`torch._C._functorch._grad_increment_nesting` ...
    `_grad_decrement_nesting`). The fused op has no rules for the transforms (a gradient penalty through the
    loss raised in aot_autograd), so a cross-entropy among them is left alone."""
    inside, depth = set(), 0
    for n in graph.nodes:
        name = getattr(n.target, "__name__", "") if n.op == "call_function" else ""
        if name.endswith("_decrement_nesting"):
            depth -= 1
        elif depth > 0:
            inside.add(n)
        if name.endswith("_increment_nesting"):
            depth += 1
    return inside


def _val(node):
    """The example value dynamo recorded for `node` (`val` in graphs traced by make_fx)."""
    if not isinstance(node, torch.fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _same(a, b) -> bool:
    """a == b for every value of the sizes' symbols (no guard is added: this runs after dynamo)."""
    return statically_known_true(a == b)


def _arg(node: torch.fx.Node, index: int, name: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _match(ce: torch.fx.Node) -> dict:
    try:
        bound = _CROSS_ENTROPY.bind(*ce.args, **ce.kwargs)
    except TypeError:
        raise _Refused("options") from None
    bound.apply_defaults()
    a = bound.arguments
    options = (a["ignore_index"], a["reduction"], a["label_smoothing"])
    if a["weight"] is not None or a["size_average"] is not None or a["reduce"] is not None \
            or any(isinstance(o, torch.fx.Node) for o in options) or a["reduction"] not in REDUCTIONS \
            or not isinstance(a["ignore_index"], int) or not 0.0 <= float(a["label_smoothing"]) <= 1.0:
        raise _Refused("options")
    logits, target = a["input"], a["target"]
    if not isinstance(logits, torch.fx.Node) or not isinstance(target, torch.fx.Node):
        raise _Refused("no_linear")
    # walk up from the loss's input to the linear, through ops that keep the logits' values
    chain, z = [], logits
    while _keeps_values(z):
        chain.append(z)
        z = z.args[0]
    linear = _linear(z)
    if linear is None:
        raise _Refused("no_linear")
    if any(len(n.users) != 1 for n in [z, *chain]):
        raise _Refused("logits_read_elsewhere")
    x, weight, bias, transposed = linear
    matrix = z.args[1] if z.target not in _LINEAR else None
    vals = [_val(n) for n in (logits, target, z, x, weight)]
    if any(v is None for v in vals) or (bias is not None and _val(bias) is None) or _val(ce) is None:
        raise _Refused("shapes")
    v_logits, v_target, v_z, v_x, v_w = vals
    if transposed:
        v_w = v_w.t()  # the weight as [vocab, hidden]
    _check(chain, v_logits, v_target, v_z, v_x, v_w, _val(bias) if bias is not None else None)
    return dict(x=x, weight=weight, bias=bias, transposed=transposed, matrix=matrix, target=target, chain=chain,
                linear=z,
                ignore_index=a["ignore_index"], reduction=a["reduction"],
                label_smoothing=float(a["label_smoothing"]), upcast=v_logits.dtype == torch.float32)


def _keeps_values(n) -> bool:
    if not isinstance(n, torch.fx.Node) or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return False
    if n.op == "call_method" and n.target in _KEEP_METHODS:
        # view(dtype) reinterprets the bits
        return not (n.target == "view" and any(isinstance(v, torch.dtype) for v in (*n.args, *n.kwargs.values())))
    return n.op == "call_function" and n.target in _KEEP_FUNCTIONS


def _linear(z):
    """(x, weight, bias, transposed) when `z` computes x @ weight.T (+ bias); `transposed`: `weight` is the
    [hidden, vocab] matrix itself (its transpose is passed to the op)."""
    if not isinstance(z, torch.fx.Node):
        return None
    if z.op == "call_function" and z.target in _LINEAR:
        x, weight, bias = _arg(z, 0, "input"), _arg(z, 1, "weight"), _arg(z, 2, "bias")
        if isinstance(x, torch.fx.Node) and isinstance(weight, torch.fx.Node) \
                and (bias is None or isinstance(bias, torch.fx.Node)):
            return x, weight, bias, False
        return None
    if (z.op == "call_function" and z.target in _MATMUL_FUNCTIONS) or \
            (z.op == "call_method" and z.target in _MATMUL_METHODS):
        if z.kwargs or len(z.args) != 2 or not all(isinstance(v, torch.fx.Node) for v in z.args):
            return None
        x, m = z.args
        w = _transpose_of(m)
        return (x, w, None, False) if w is not None else (x, m, None, True)
    return None


def _transpose_of(m: torch.fx.Node):
    """The 2-D matrix W when `m` is W.T, W.t(), W.mT, W.transpose(0, 1) or W.permute(1, 0); else None."""
    src = m.args[0] if m.args else None
    v = _val(src)
    if not isinstance(src, torch.fx.Node) or v is None or v.dim() != 2:
        return None
    rest = tuple(m.args[1:])
    if (m.op == "call_method" and m.target == "t" and not rest) or (m.op == "call_function" and m.target is torch.t):
        return src
    if m.op == "call_function" and m.target is getattr and rest in (("T",), ("mT",)):
        return src
    if m.op == "call_method" and m.target == "transpose" or m.op == "call_function" and m.target is torch.transpose:
        if len(rest) == 2 and all(isinstance(d, int) for d in rest) and {d % 2 for d in rest} == {0, 1}:
            return src
    if m.op == "call_method" and m.target == "permute" and rest in ((1, 0), ((1, 0),), (-1, -2), ((-1, -2),)):
        return src
    return None


def _check(chain, v_logits, v_target, v_z, v_x, v_w, v_b) -> None:
    vocab = v_w.shape[0]
    if not (v_x.dim() >= 2 and v_w.dim() == 2 and v_logits.dim() == 2 and v_target.dim() == 1):
        raise _Refused("shapes")
    rows = v_logits.shape[0]
    if not (_same(v_x.shape[-1], v_w.shape[1]) and _same(v_z.shape[-1], vocab) and _same(v_logits.shape[1], vocab)
            and _same(v_z.numel(), v_logits.numel()) and _same(v_target.shape[0], rows)
            and (v_b is None or (v_b.dim() == 1 and _same(v_b.shape[0], vocab)))):
        raise _Refused("shapes")
    dtype = v_x.dtype
    if not (dtype.is_floating_point and v_w.dtype == dtype and v_z.dtype == dtype
            and (v_b is None or v_b.dtype == dtype) and v_target.dtype == torch.int64):
        raise _Refused("dtypes")  # mixed dtypes (autocast) or a target of class probabilities
    devices = {v.device for v in (v_x, v_w, v_z, v_logits, v_target)}
    if len(devices) != 1:
        raise _Refused("shapes")
    for n in chain:  # each step keeps every element, the vocabulary last, the dtype or float32
        v, v_in = _val(n), _val(n.args[0])
        if v is None or v_in is None or v.dim() < 1 or not (_same(v.numel(), v_in.numel())
                                                             and _same(v.shape[-1], vocab)):
            raise _Refused("shapes")
        if v.dtype not in (v_in.dtype, torch.float32):
            raise _Refused("dtypes")


def _rewrite(graph: torch.fx.Graph, ce: torch.fx.Node, m: dict, chunk_rows: int, grads_in_forward: bool) -> None:
    with graph.inserting_before(ce):
        x = m["x"]
        if _val(x).dim() != 2:
            x = graph.call_function(torch.flatten, (x, 0, -2))  # [tokens, hidden]
        weight = graph.call_function(torch.t, (m["weight"],)) if m["transposed"] else m["weight"]
        args = (x, weight, m["bias"], m["target"], m["ignore_index"], m["label_smoothing"], m["reduction"],
                m["upcast"], chunk_rows)
        # dynamo's example values say whether autograd will differentiate the loss, and through which
        # inputs (it guards on requires_grad and the grad mode, so they hold whenever this graph runs)
        needs = tuple(v is not None and v.requires_grad for v in map(_val, (m["x"], m["weight"], m["bias"])))
        if grads_in_forward and m["reduction"] != "none" and _val(ce).requires_grad:
            fused = graph.call_function(torch.ops.passline.linear_cross_entropy_with_grads.default, (*args, *needs))
            loss = graph.call_function(operator.getitem, (fused, 0))
        else:
            loss = graph.call_function(torch.ops.passline.linear_cross_entropy.default, args)
    loss.meta.update(ce.meta)
    ce.replace_all_uses_with(loss)
    graph.erase_node(ce)
    for n in [*m["chain"], m["linear"]]:  # from the loss up: each was read only by the one before
        graph.erase_node(n)
    matrix = m["matrix"]
    if matrix is not None and not matrix.users and matrix is not m["weight"] and matrix.op != "placeholder":
        graph.erase_node(matrix)  # the W.T the matmul read
