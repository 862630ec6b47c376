"""The extern fallback: any op without a (applicable) lowering becomes an Extern node calling aten.

Complex tensors always go this way: the loop-level IR is real-valued.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from ..ir import Extern, comm_kind
from .context import ASSERTIONS, LoweringContext
from .registry import lowering
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
# it eagerly) rather than found out while running. On a GPU the meta function gives the CUDA kernel's shapes
# (its own branch for devices other than the CPU): there the ops are extern calls like any other (the
# decomposition of F.embedding_bag leaves bags given by offsets to them where they are faster).
META_DISAGREES = {"_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward",
                  "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward"}


@lowering(torch.ops.higher_order.with_effects)
def lower_with_effects(ctx: LoweringContext, node: torch.fx.Node, token, op, *args, **kwargs):
    """An op aot_autograd orders by a token threaded through the graph (`with_effects(token, op, *args)` ->
    `(token, *op's results)`): torch.linalg's `_linalg_check_errors`, which raises LinAlgError for a singular
    matrix, is one. An assertion (`ASSERTIONS`: it raises or returns nothing, so it checks the same wherever it
    runs) is an Extern the passes keep; the token out is None (aot_autograd passes None for the token in and
    drops the one out). Any other effect (printing, an opaque object's method) is refused: its order is not
    kept, and the fallback runs the graph eagerly."""
    if op not in ASSERTIONS:
        raise NotImplementedError(f"passline cannot order the effects of {op} (under with_effects)")
    ctx.extern(op, _to_arg(ctx, args), {k: _to_arg(ctx, v) for k, v in kwargs.items()}, None)
    return (None,)


def _on_cpu(node: torch.fx.Node) -> bool:
    """Whether any tensor the node takes or returns is on the CPU (or none says where it is)."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + list(tree_leaves(node.meta.get("val")))
    devices = {v.device.type for v in vals if isinstance(v, torch.Tensor)}
    return not devices or "cpu" in devices


def lower_extern(ctx: LoweringContext, node: torch.fx.Node, args, kwargs):
    name = getattr(getattr(node.target, "_schema", None), "name", "").removeprefix("aten::")
    if name in META_DISAGREES and _on_cpu(node):
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


# Activation checkpointing (torch.utils.checkpoint inside a compiled model) wraps each random op of the
# checkpointed region in two higher-order operators, so that the backward's recomputation draws the same
# numbers as the forward: `run_and_save_rng_state(op, *args)` returns (the generator's state, op(*args))
# in the forward, and `run_with_rng_state(state, op, *args)` runs op(*args) from that state in the
# backward. Neither is an aten op (no schema, no meta value on the FX node), so each becomes an Extern
# calling the operator through RngStateOp, which returns its results as one flat tuple.
RNG_STATE_OPS = ("run_and_save_rng_state", "run_with_rng_state")


def is_rng_state_op(target) -> bool:
    return getattr(target, "__name__", "") in RNG_STATE_OPS


class RngStateOp:
    """The op of such an Extern: the higher-order operator `hop` around the aten op `op`. Tagged
    nondeterministic_seeded: it draws (or replays) random numbers, so dce keeps it and the accuracy guard
    replays its draws. Compared by identity, printed by name."""

    tags = (torch.Tag.nondeterministic_seeded,)

    def __init__(self, hop, op):
        self.hop, self.op = hop, op
        self.__name__ = f"{hop.__name__}({op})"

    def __call__(self, *args, **kwargs):
        if self.hop.__name__ == "run_and_save_rng_state":
            state, out = self.hop(self.op, *args, **kwargs)
            return (state, *_flat_results(out))
        return tuple(_flat_results(self.hop(args[0], self.op, *args[1:], **kwargs)))

    def __repr__(self) -> str:
        return self.__name__


def _flat_results(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _rng_state_size(device: torch.device) -> int:
    """The length of the default generator's state on `device` (a fixed size per generator kind; the FX
    graph only knows it as an unbacked size)."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device).numel()
    return torch.get_rng_state().numel()


def lower_rng_state_op(ctx: LoweringContext, node: torch.fx.Node, args, kwargs):
    """An Extern for run_and_save_rng_state / run_with_rng_state; returns what the FX node's getitems index:
    (state, op's result) for the first, op's result for the second (a tuple where op returns one)."""
    saving = node.target.__name__ == "run_and_save_rng_state"
    op, op_args = (args[0], args[1:]) if saving else (args[1], (args[0], *args[2:]))
    op_node_args = node.args[1:] if saving else node.args[2:]
    fake_args = torch.fx.node.map_arg(op_node_args, lambda a: a.meta["val"])
    fake_kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: a.meta["val"])
    out_val = op(*fake_args, **fake_kwargs)  # the op's result on the meta values: its shapes and strides
    outs = _flat_results(out_val)
    if saving:  # the state is a CPU byte tensor whatever the op's device (torch.cuda.get_rng_state's too)
        device = next(v.device for v in tree_leaves((fake_args, fake_kwargs)) if isinstance(v, torch.Tensor))
        outs = [torch.empty(_rng_state_size(device), dtype=torch.uint8), *outs]
    targs = _to_arg(ctx, tuple(op_args))
    tkwargs = {k: _to_arg(ctx, v) for k, v in kwargs.items()}
    refs = ctx.extern(RngStateOp(node.target, op), targs, tkwargs, tuple(outs))
    result = refs[1:] if saving else refs
    result = result if isinstance(out_val, (tuple, list)) else result[0]
    return (refs[0], result) if saving else result
