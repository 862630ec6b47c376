"""The record of one compiled graph: its final scheduler graph, passes run, and figures.

Figures live on the report of each compile, never in module globals; `last_report()` only points at
the most recent report for convenience.
"""
from __future__ import annotations

import attrs

from ..ir import Extern
from .graph import SchedulerGraph


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

    @property
    def kernels(self) -> int:
        """Nodes the backend runs as generated code (everything but extern calls)."""
        return sum(1 for n in self.graph.nodes() if not isinstance(n, Extern))

    @property
    def externs(self) -> int:
        return sum(1 for n in self.graph.nodes() if isinstance(n, Extern))

    def summary(self) -> str:
        return (f"{self.name}: {len(self.graph)} nodes ({self.kernels} kernels, {self.externs} extern calls) "
                f"on {self.codegen}{' — ' + self.codegen_reason if self.codegen_reason else ''}")


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
