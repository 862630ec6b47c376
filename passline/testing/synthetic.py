"""Synthetic scheduler graphs for scaling benchmarks and tests: a long pointwise chain plus a wide
fan-out (one buffer read by many independent nodes)."""
from __future__ import annotations

import torch

from ..ir import Buffer, Constant, Layout, Load, Op, Pointwise, TensorArg, VarKind, loop_vars
from ..lowering import GraphInput, Program
from ..pipeline.graph import SchedulerGraph


def chain_and_fanout(n_nodes: int, size=(64, 64)) -> SchedulerGraph:
    """Half the nodes form a chain x -> n0 -> n1 -> ...; the other half each read the chain's head.
    Every chain node and every fan-out node is a graph output's ancestor, so nothing is dead."""
    f32 = torch.float32
    i0, i1 = loop_vars(VarKind.OUTER, 2)
    index = size[1] * i0 + i1

    def pw(name, src, op):
        body = Op(op, (Load(src, index, f32), Constant(1.0, f32)), f32)
        return Pointwise(name, size, body, Buffer(name, Layout.contiguous(size, f32)), origins=(name,))

    x = GraphInput("x", buffer=Buffer("x", Layout.contiguous(size, f32)))
    chain = n_nodes // 2
    nodes = [pw(f"c{k}", "x" if k == 0 else f"c{k - 1}", "add") for k in range(chain)]
    nodes += [pw(f"f{k}", "c0", "mul" if k % 2 else "sub") for k in range(n_nodes - chain)]
    outputs = [TensorArg(n.name, size, (size[1], 1)) for n in nodes[chain - 1:]]
    return SchedulerGraph.from_program(Program((x,), tuple(nodes), tuple(outputs)))
