"""`passline.backend(cudagraphs=True)`: a compiled graph captured once into a CUDA graph and replayed.

Where the CPU bounds a step (small tensors, many kernels), replaying a captured graph issues all of a
graph's kernels with one launch. A graph is eligible when its tensors are on a GPU and its shapes are
static (a dynamic-shape graph would need one capture per size); otherwise the option is accepted and the
report's `cudagraphs` says why it is off.

Calls: the first runs the graph as it is (kernels compile and choose their configurations there); the
second captures it and replays it. An input whose storage was the same on the first two calls (a
parameter, a buffer) is read in place by the captured kernels; any other input is copied into a static
buffer before each replay (and copied back after it where the graph writes it in place). If a "static"
input later arrives with another storage, the graph is captured again (at most `MAX_CAPTURES` times,
then the graph runs uncaptured). Outputs are copies of the graph's static outputs, so they stay valid
across steps whatever the caller keeps (a training loop keeps activations for the backward).
"""
from __future__ import annotations

import torch

MAX_CAPTURES = 3


def why_not(graph) -> str | None:
    """Why `graph` cannot be captured, or None."""
    devices = {b.layout.device.type for b in graph.buffers().values()}
    if "cuda" not in devices:
        return "off: the graph's tensors are on the CPU"
    if any(getattr(inp, "symbol", None) is not None for inp in graph.inputs) or any(
            not all(isinstance(s, int) or getattr(s, "is_number", False) for s in b.layout.size)
            for b in graph.buffers().values()):
        return "off: dynamic shapes (one capture per size is not kept)"
    return None


class CudaGraphed:
    """`runner`, captured at its second call and replayed from then on."""

    def __init__(self, runner, graph, report, pool=None):
        self.runner, self.report, self.pool = runner, report, pool
        self.mutated = {k for k, inp in enumerate(graph.inputs) if inp.name in graph.mutated_names()}
        self.calls = 0
        self.captures = 0
        self.first_ptrs = None
        self.cuda_graph = None

    def _ptrs(self, args) -> list:
        return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]

    def __call__(self, *args):
        self.calls += 1
        if self.calls == 1 or self.captures > MAX_CAPTURES:
            if self.calls == 1:
                self.first_ptrs = self._ptrs(args)
            return self.runner(*args)
        if self.cuda_graph is None or self._ptrs([args[k] for k in self.static]) != self.static_ptrs:
            if self.cuda_graph is not None or self.calls > 2:  # a static input moved: capture again
                self.first_ptrs = self._ptrs(args)
            self._capture(args)
            if self.cuda_graph is None:  # capture failed: run uncaptured from now on
                return self.runner(*args)
        for k in self.copied:
            self.inputs[k].copy_(args[k])
        self.cuda_graph.replay()
        for k in self.copied:
            if k in self.mutated:
                args[k].copy_(self.inputs[k])
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]

    def _capture(self, args) -> None:
        self.captures += 1
        ptrs = self._ptrs(args)
        self.static = [k for k, (p, q) in enumerate(zip(ptrs, self.first_ptrs)) if p is not None and p == q]
        self.copied = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and k not in self.static]
        self.static_ptrs = [ptrs[k] for k in self.static]
        self.inputs = list(args)
        for k in self.copied:
            self.inputs[k] = torch.empty_strided(args[k].shape, args[k].stride(), dtype=args[k].dtype,
                                                 device=args[k].device).copy_(args[k])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs = self.runner(*self.inputs)
        except Exception as e:  # e.g. an extern that synchronizes with the host
            self.report.cudagraphs = f"off: capture failed ({type(e).__name__}: {str(e)[:120]})"
            self.captures = MAX_CAPTURES + 1
            self.cuda_graph = None
            return
        self.cuda_graph = graph
        self.report.cudagraphs = f"on: captured {self.captures} time(s); {len(self.copied)} inputs copied per call"


def cudagraphed(runner, graph, report, pool=None):
    """`runner` replayed from a CUDA graph where `graph` allows it; the report says which."""
    reason = why_not(graph)
    if reason is not None:
        report.cudagraphs = reason
        return runner
    report.cudagraphs = "on: captured at the second call"
    return CudaGraphed(runner, graph, report, pool)
