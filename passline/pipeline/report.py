"""The record of one compiled graph: its final scheduler graph, passes run, and figures.

Figures live on the report of each compile, never in module globals; `last_report()` only points at
the most recent report for convenience.
"""
from __future__ import annotations

import attrs

from ..ir import Extern
from ..lowering.retrace import ensure_traced
from .graph import SchedulerGraph
from .metrics import Metrics, _int, bytes_accessed, kernel_count, node_bytes


@attrs.define
class CompileReport:
    name: str  # "forward", "backward" or "inference", with a per-backend counter
    graph: SchedulerGraph  # the final graph the backend runs
    codegen: str  # the backend that runs it
    codegen_reason: str = ""  # why that backend (e.g. no GPU found)
    pipeline: str = ""
    passes: list = attrs.Factory(list)
    nodes_before: int = 0  # scheduler nodes straight out of lowering
    seconds: dict = attrs.Factory(dict)  # phase -> wall seconds (lower, passes, codegen)
    metrics: Metrics = attrs.Factory(Metrics)
    _gm: object = None  # (the `gm` property; given as `gm=`)
    inputs: list | None = None  # its first real inputs, when the backend captures them
    runner: object = None  # what runs the graph (TritonRunner has .kernels: source, variant, bytes)
    check: object = None  # with backend(check=True): the accuracy guard's CheckReport, after the first call
    cudagraphs: str = ""  # with backend(cudagraphs=True): "on: ..." or "off: <why>"
    graph_key: str | None = None  # the graph cache's key of the scheduled graph (None: not stored there)

    @property
    def gm(self):
        """The aten FX graph this report compiled (for reproducers, `passline draw`). One that aot_autograd's cache
        gave back was unpickled without its nodes' traced values (`meta["val"]`): they are made again here, at
        the first look, not at the load (lowering/retrace.py)."""
        if self._gm is not None:
            ensure_traced(self._gm)
        return self._gm

    @property
    def choices(self) -> list:
        """A ChoiceRecord per node whose op had other candidates than itself (lowering/choices.py): node,
        candidates, chosen, timings (ms per candidate; empty when nothing was timed), how."""
        return list(self.graph.choices)

    @property
    def kernel_info(self) -> list:
        """Generated kernels (Triton backend): name, node, kind, chosen variant and blocks, source, bytes."""
        return list(getattr(self.runner, "kernels", []))

    def finish(self) -> None:
        """Fill the end-of-compile counters and metric-table rows."""
        c = self.metrics.counters
        c["ir_nodes_pre_fusion"] = self.nodes_before
        c["ir_nodes_post_fusion"] = len(self.graph)
        c["generated_kernel_count"] = self.kernels
        # each kernel's bytes once (sympy over its loads and stores; was done three times, ~2 s of GPT-2's compile)
        per_node = {n: node_bytes(self.graph, n) for n in self.graph.nodes() if not isinstance(n, Extern)}
        total = _int(sum(r + w for r, w in per_node.values()))
        c["num_bytes_accessed"] = total
        self.metrics.row("graph_stats", graph=self.name, pipeline=self.pipeline, nodes_before=self.nodes_before,
                         nodes_after=len(self.graph), kernels=self.kernels, externs=self.externs,
                         bytes_accessed=total, **{f"seconds_{k}": v for k, v in self.seconds.items()})
        for node, (r, w) in per_node.items():
            self.metrics.row("kernel_metadata", graph=self.name, kernel=node.name, kind=node.kind,
                             numel=str(node.numel), rnumel=str(getattr(node, "reduction_numel", 1)),
                             bytes_read=r, bytes_written=w)

    @property
    def bytes_accessed(self) -> int:
        """Bytes the generated kernels read and write, computed from the IR (externs excluded)."""
        return bytes_accessed(self.graph)

    @property
    def nodes_after(self) -> int:
        return len(self.graph)

    @property
    def kernels(self) -> int:
        """Generated kernels: one per non-extern node, two for a mix-order reduction (main + finish)."""
        return sum(kernel_count(n) for n in self.graph.nodes())

    @property
    def externs(self) -> int:
        return sum(1 for n in self.graph.nodes() if isinstance(n, Extern))

    def summary(self) -> str:
        return (f"{self.name}: {len(self.graph)} nodes ({self.kernels} kernels, {self.externs} extern calls) "
                f"on {self.codegen}{self._compiled()}{' — ' + self.codegen_reason if self.codegen_reason else ''}")

    def _compiled(self) -> str:
        """Where a GPU graph's binaries were compiled: before the first call (`kernels_precompiled`; of them,
        `binaries_loaded_by_record` built straight from the Triton cache entries an earlier process recorded) or
        at a launch that found none (`kernels_compiled_at_launch`: 0 for a static graph's first call)."""
        if self.runner is None or getattr(self.runner, "interpret", True) or not hasattr(self.runner, "counters"):
            return ""
        c = self.metrics.counters
        recorded = c["binaries_loaded_by_record"]
        return (f", {c['kernels_precompiled']} binaries compiled ahead"
                + (f" ({recorded} loaded by record)" if recorded else "")
                + f", {c['kernels_compiled_at_launch']} at launch")


class _Latest:
    report: CompileReport | None = None


_latest = _Latest()


def set_last_report(report: CompileReport) -> None:
    _latest.report = report


def last_report() -> CompileReport:
    """The report of the most recently compiled graph (any passline backend)."""
    if _latest.report is None:
        raise RuntimeError("no graph has been compiled by passline yet")
    return _latest.report
