"""Splitting aot_autograd's joint graph into the forward and backward passline compiles.

torch's min-cut partitioner (`min_cut_rematerialization_partition`, as Inductor uses it) decides what
the forward saves for the backward: few activations, cheap pointwise work recomputed. One rewrite follows
it, on the two graphs it returns:

**Max-pool indices saved as window offsets.** `max_pool2d_with_indices` (and 3d) gives, for each output
element, the flat position of its window's maximum in the input plane, an int64; the backward needs it,
so the forward saves it: 8 bytes an output element, twice the float32 activation itself. The position is
a window offset (0 .. kernel elements - 1) away from the window's start, which the output position
gives: the forward saves the offset as an int8 (int16 for windows of more than 128 elements) and the
backward computes the position again, exactly, before its first use. In a ResNet-18 training step
(batch 32, 224², float32) the stem's max-pool indices were 49 MB of the peak (818 MB; Inductor, which
saves offsets too, 776). The rewrite happens after partitioning because the partitioner saves a value the
backward reads with an op it cannot recompute (the max-pool backward) as it is: the offsets must be what
is saved, not an alternative it may weigh. Where lowering/pooling.py lowers the pool, the conversions join
its kernels (the backward's positions are recomputed inside its gather by inline_pointwise). Symbolic
spatial sizes (dynamic shapes) are read from `sym_size` nodes. The conversions compute in 32 bits where the
input plane has fewer than 2**31 points; under dynamic shapes that is a dynamo guard (the one passline
adds: a larger plane recompiles with 64-bit arithmetic).
"""
from __future__ import annotations

import math
import operator

import torch
from functorch.compile import min_cut_rematerialization_partition
from torch._guards import detect_fake_mode
from torch.fx.node import map_arg

from ..lowering.pooling import BACKWARDS, FORWARDS, Window

aten = torch.ops.aten


def partition(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
    """aot_autograd's `partition_fn`: the min-cut partition, then the saved max-pool indices compacted. The
    forward module records where its outputs saved for the backward begin (`SAVED_FROM`): outputs before
    it reach the caller, the rest only the backward (cudagraphs.py keeps those in the pool)."""
    fw, bw = min_cut_rematerialization_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                                 **kwargs)
    if compact_pool_indices(fw, bw, num_fwd_outputs):
        fw.recompile()
        bw.recompile()
    fw.meta[SAVED_FROM] = num_fwd_outputs
    return fw, bw


SAVED_FROM = "passline_saved_from"


class _Emit:
    """Adds aten calls to a graph, each with its fake value (computed in the graph's fake mode), as the
    nodes aot_autograd traced carry them."""

    def __init__(self, graph: torch.fx.Graph, mode):
        self.graph, self.mode = graph, mode

    def __call__(self, op, *args, **kwargs):
        node = self.graph.call_function(op, args, kwargs)
        vals = map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.mode:
            node.meta["val"] = op(*vals[0], **vals[1])
        return node

    def scaled(self, op, a, factor):
        """a multiplied or divided by a number: a itself for 1 (a dilation of 1, the usual case)."""
        return a if factor == 1 else self(op, a, factor)

    def arith(self, op, a, b):
        """Size arithmetic: a number where both sides are, else a node (symbolic sizes)."""
        if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return op(a, b)
        return self(op, a, b)


def _window(pool: torch.fx.Node, n: int) -> Window | None:
    """The window of a max-pool call, as eager reads its arguments (lowering/pooling.py's Window)."""
    names = ("kernel_size", "stride", "padding", "dilation")
    args = list(pool.args[1:5]) + [pool.kwargs.get(k) for k in names[len(pool.args) - 1:]]
    defaults = (None, (), 0, 1)
    return Window.of(n, *(d if a is None else a for a, d in zip(args, defaults)))


def _starts(emit, n, outs, stride, padding, device, dtype):
    """Per spatial dimension d, the first input position of each output's window (may be negative: in the
    padding), shaped to broadcast against the trailing n dimensions of an output. `outs`: the output's
    spatial sizes, numbers or size nodes."""
    starts = []
    for d in range(n):
        end = emit.arith(operator.sub, emit.arith(operator.mul, outs[d], stride[d]), padding[d])
        start = emit(aten.arange.start_step, -padding[d], end, stride[d], dtype=dtype, device=device)
        starts.append(emit(aten.view.default, start, [outs[d]] + [1] * (n - 1 - d)))
    return starts


def _number(size) -> int | None:
    """`size` as an int where it is one: a plain int, or a SymInt whose expression is a constant (a guard
    can narrow a symbol to one value while tracing: an output size of 1 pins a small input's)."""
    if isinstance(size, int):
        return size
    expr = getattr(getattr(size, "node", None), "expr", None)
    return int(expr) if expr is not None and expr.is_number else None


def _sizes(emit, node: torch.fx.Node, n: int) -> list:
    """The trailing n sizes of tensor `node`: numbers where its fake value's are, else `sym_size` nodes."""
    val = node.meta["val"]
    numbers = {d: _number(val.shape[d]) for d in range(val.dim() - n, val.dim())}
    return [v if v is not None else emit(aten.sym_size.int, node, d) for d, v in numbers.items()]


def _digits(emit, value, radices) -> list:
    """The mixed-radix digits of `value` (a tensor node), most significant first: a flat position in the
    input plane into its coordinates, an offset in the window into its per-dimension steps."""
    digits = [None] * len(radices)
    for d in reversed(range(len(radices))):
        if d:
            digits[d] = emit(aten.remainder.Scalar, value, radices[d])
            value = emit(aten.floor_divide.Scalar, value, radices[d])
        else:
            digits[d] = value
    return digits


def _compose(emit, digits, radices):
    """The inverse of `_digits`: sum over d of digit d times the radices after d."""
    out = digits[0]
    for d in range(1, len(digits)):
        out = emit(aten.add.Tensor, emit(aten.mul.Tensor, out, radices[d]), digits[d])
    return out


def compact_pool_indices(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, num_fwd_outputs: int) -> bool:
    """Rewrite each saved max-pool indices tensor as window offsets (see the module's docstring); True if
    any was. Symbolic spatial sizes are read from size nodes (`sym_size`) of the pool's input and output in
    the forward, of the max-pool backward's input and the saved offsets in the backward."""
    out_node = next(n for n in fw.graph.nodes if n.op == "output")
    outputs = list(out_node.args[0])
    holders = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    order = {n: i for i, n in enumerate(bw.graph.nodes)}  # the readers of every holder are among these
    changed = False
    for i in range(num_fwd_outputs, len(outputs)):
        idx = outputs[i]
        if not (isinstance(idx, torch.fx.Node) and idx.target is operator.getitem and idx.args[1] == 1
                and getattr(idx.args[0], "target", None) in FORWARDS):
            continue
        holder = holders.get(idx.name)
        pool = idx.args[0]
        n = FORWARDS[pool.target]
        x, val = pool.args[0].meta.get("val"), idx.meta.get("val")
        if holder is None or x is None or val is None or not holder.users:
            continue
        # symbolic spatial sizes: the backward reads them from the max-pool backward's input (the pool's
        # input, which it takes for its shape); a backward without one keeps the indices
        first = min(holder.users, key=order.__getitem__)
        static = all(_number(s) is not None for s in (*x.shape[-n:], *val.shape[-n:]))
        source = first.args[1] if getattr(first, "target", None) in BACKWARDS else None
        if not static and not isinstance(source, torch.fx.Node):
            continue
        window = _window(pool, n)
        if window is None:
            continue
        kernel, stride, padding, dilation = window.kernel, window.stride, window.padding, window.dilation
        elements = math.prod(kernel)
        small = torch.int8 if elements <= 128 else torch.int16 if elements <= 32768 else None  # offsets < elements
        mode = detect_fake_mode([val])
        if small is None or mode is None:
            continue

        # The arithmetic in 32 bits where every position of the input plane fits (a GPU divides 64-bit
        # integers in software: in 64 bits the backward's kernel was bound by its divisions), else in 64.
        # Under dynamic shapes the ShapeEnv answers for the traced sizes and keeps the answer as a guard
        # (Inductor guards its index widths so too): a call with a plane past int32 recompiles, and
        # gets 64 bits. Without it the dynamic kernels did 64-bit arithmetic at every size (a ResNet stem's
        # backward gather 403 instructions on 64-bit operands against 13, 0.23 ms against 0.15)
        wide = not bool(math.prod(x.shape[-n:]) < 2**31)
        itype = torch.int64 if wide else torch.int32

        # forward: offset = sum over d of k_d * (kernel elements after d), k_d = (c_d - start_d) / dilation_d
        emit = _Emit(fw.graph, mode)
        with fw.graph.inserting_before(idx.next):  # (inserting_after would put each new node before the last)
            ins, outs = _sizes(emit, pool.args[0], n), _sizes(emit, idx, n)
            coords = _digits(emit, idx if wide else emit(aten._to_copy.default, idx, dtype=itype), ins)
            starts = _starts(emit, n, outs, stride, padding, val.device, itype)
            steps = [emit.scaled(aten.floor_divide.Scalar, emit(aten.sub.Tensor, c, s), dl)
                     for c, s, dl in zip(coords, starts, dilation)]
            saved = emit(aten._to_copy.default, _compose(emit, steps, kernel), dtype=small)
        outputs[i] = saved

        # backward: the position again, c_d = start_d + k_d * dilation_d, flattened over the input plane
        emit = _Emit(bw.graph, mode)
        uses = list(holder.users)
        holder.meta["val"] = saved.meta["val"]
        with bw.graph.inserting_before(first):
            ins = [_number(s) for s in x.shape[-n:]] if static else _sizes(emit, source, n)
            outs = _sizes(emit, holder, n)
            # the offsets' digits (steps within the window: < kernel) in 32 bits at any plane size: a GPU
            # divides 64-bit integers in software, and under dynamic shapes (`wide`) these divisions were
            # most of the backward's gather kernel
            steps = _digits(emit, emit(aten._to_copy.default, holder, dtype=torch.int32), kernel)
            if wide:
                steps = [emit(aten._to_copy.default, k, dtype=itype) for k in steps]
            starts = _starts(emit, n, outs, stride, padding, val.device, itype)
            coords = [emit(aten.add.Tensor, s, emit.scaled(aten.mul.Tensor, k, dl))
                      for s, k, dl in zip(starts, steps, dilation)]
            position = _compose(emit, coords, ins)
            if not wide:  # eager's indices are int64
                position = emit(aten._to_copy.default, position, dtype=torch.int64)
        for u in uses:
            u.replace_input_with(holder, position)
        changed = True
    if changed:
        out_node.args = (tuple(outputs),) + tuple(out_node.args[1:])
    return changed
