"""`passline.backend(...)`: a torch.compile backend.

dynamo hands us an FX graph; aot_autograd (with passline's decomposition table) splits it into aten
forward and backward graphs; each is lowered, scheduled by the pipeline and run by the chosen backend.
"""
from __future__ import annotations

import itertools
import time

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from ..lowering import decomposition_table, lower_graph
from ..pipeline.graph import SchedulerGraph
from ..pipeline.report import CompileReport, set_last_report
from .reference import ReferenceRunner

CODEGENS = ("reference",)


class Backend:
    """A configured passline backend: `torch.compile(model, backend=passline.backend(...))`."""

    def __init__(self, pipeline: str = "", codegen: str = "reference", verify: bool = True):
        if codegen not in CODEGENS:
            raise ValueError(f"unknown codegen {codegen!r}; choose one of {', '.join(CODEGENS)}")
        self.pipeline = pipeline
        self.codegen = codegen
        self.verify = verify
        self.reports: list[CompileReport] = []
        self._ids = itertools.count()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        compiler = aot_autograd(
            fw_compiler=self._compiler("forward"),
            bw_compiler=self._compiler("backward"),
            inference_compiler=self._compiler("inference"),
            decompositions=decomposition_table(),
        )
        return compiler(gm, example_inputs)

    def _compiler(self, kind: str):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs):
            return make_boxed_func(self.compile_aten(gm, example_inputs, kind))

        return compile_graph

    def compile_aten(self, gm: torch.fx.GraphModule, example_inputs, kind: str = "graph"):
        """Lower an aten FX graph, run the pipeline, and return a callable taking the graph inputs."""
        t0 = time.perf_counter()
        program = lower_graph(gm, example_inputs)
        graph = SchedulerGraph.from_program(program)
        if self.verify:
            graph.verify()
        t1 = time.perf_counter()
        report = CompileReport(f"{kind}{next(self._ids)}", graph, self.codegen, pipeline=self.pipeline,
                               nodes_before=len(graph))
        runner = ReferenceRunner(graph)
        report.seconds = {"lower": t1 - t0, "codegen": time.perf_counter() - t1}
        self.reports.append(report)
        set_last_report(report)
        return runner


def backend(pipeline: str = "", codegen: str = "reference", **options) -> Backend:
    """A torch.compile backend running `pipeline` and generating code with `codegen`."""
    return Backend(pipeline=pipeline, codegen=codegen, **options)


def default_backend(gm: torch.fx.GraphModule, example_inputs):
    """The backend `torch.compile(..., backend="passline")` finds through the entry point."""
    return Backend()(gm, example_inputs)
