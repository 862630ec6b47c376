"""Traced values for a graph that lost them: an aten GraphModule unpickled from aot_autograd's cache.

Lowering reads every node's traced value (`meta["val"]`: shape, strides, dtype, device). A pickled GraphModule
keeps its code, not its nodes' meta, so a graph aot_autograd's cache gave back (backends/aot_cache.py) carries
instead its inputs' values as data (`INPUT_VALUES`); `ensure_traced` propagates fake tensors from them through the
graph the first time something lowers it again (`passline draw` lowers a report's graph; a backward whose
scheduled graph left the graph cache is lowered afresh). Not at the load itself: the runner is built from the
graph cache and needs no traced value, and the propagation took 0.1-0.17 s a graph of GPT-2-style on this CPU.
"""
from __future__ import annotations

import torch

INPUT_VALUES = "passline_input_values"


def input_values(gm: torch.fx.GraphModule) -> list | None:
    """Each placeholder's traced value as data (a tensor's size, strides, offset, dtype, device; a number), or
    None where one is missing or symbolic."""
    out = []
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            facts = (tuple(v.shape), tuple(v.stride()), v.storage_offset())
            if not all(type(x) is int for x in (*facts[0], *facts[1], facts[2])):
                return None
            out.append(("tensor", *facts, v.dtype, str(v.device)))
        elif type(v) in (int, float, bool):
            out.append(("value", v))
        else:
            return None
    return out


def fake_inputs(values: list, mode=None) -> list:
    """Fake tensors (and numbers) as `input_values` described them, in `mode` (a new FakeTensorMode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
    out = []
    with mode:
        for kind, *facts in values:
            if kind == "value":
                out.append(facts[0])
                continue
            shape, stride, offset, dtype, device = facts
            extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
            base = torch.empty(offset + extent, dtype=dtype, device=device)
            out.append(base.as_strided(shape, stride, offset))
    return out


def ensure_traced(gm: torch.fx.GraphModule) -> None:
    """Fill every node's traced value of `gm` from `gm.meta[INPUT_VALUES]` where its placeholders have none.
    Best effort: a graph fake propagation cannot run stays as it is (lowering then names the node it lacks)."""
    values = gm.meta.get(INPUT_VALUES)
    placeholders = gm.graph.find_nodes(op="placeholder")
    if values is None or all("val" in n.meta for n in placeholders):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fake_inputs(values, mode))
    except Exception:  # noqa: BLE001 - left without values: lowering's own error says which node
        for n in gm.graph.nodes:
            n.meta.pop("val", None)
