"""Pass instruments: code that runs around every pass of a pipeline (TVM's PassInstrument, MLIR's
PassInstrumentation).

An instrument subclasses `PassInstrument` and overrides the hooks it needs; the others do nothing.

    class Printer(passline.PassInstrument):
        def after_pass(self, record, graph):
            print(record)

    passline.backend(instruments=[Printer()])      # or PassManager(..., instruments=[...])

Instruments nest like `with` blocks around the pass: `before_pass` hooks run from the outermost
instrument in, `after_pass` hooks from the innermost out. The PassManager's own work is done by
built-in instruments, innermost first: `Timing` (record.seconds: the pass alone), `ChangeDetection`
(record.changed and the node and edge counts after it; `repeat(...)` stops on it), `Verification`
(`graph.verify()`, with `verify=True`), `PassMetrics` (the `pass_stats` metric table) and `Dumps` (with
`dump_dir`). Yours are outside them, in the order given: your `after_pass` sees a verified graph and a
complete record, and your hooks' time is not the pass's.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import attrs

from .graph import SchedulerGraph, VerificationError
from .metrics import Metrics

if TYPE_CHECKING:
    from .manager import PassRecord
    from .text import PassCall


@attrs.define
class PipelineRun:
    """One run of a pipeline on one graph, as instruments see it at `enter_pipeline`."""

    graph_name: str
    metrics: Metrics
    records: list  # PassRecord of each pass run so far


class PassInstrument:
    """Hooks around a pipeline run and each of its passes. Every hook is a no-op here: override the ones
    you need. A hook that raises stops the pipeline, like the pass would."""

    def enter_pipeline(self, graph: SchedulerGraph, run: PipelineRun) -> None:
        """Before the first pass, with the graph as it came in."""

    def before_pass(self, call: PassCall, graph: SchedulerGraph) -> None:
        """Before each pass run (`call`: the pass and its options)."""

    def after_pass(self, record: PassRecord, graph: SchedulerGraph) -> None:
        """After each pass run that returned, with its record and the graph it returned."""

    def exit_pipeline(self, graph: SchedulerGraph, run: PipelineRun) -> None:
        """After the last pass, with the final graph (not called when a pass or hook raised)."""


HOOKS = ("enter_pipeline", "before_pass", "after_pass", "exit_pipeline")


class _Adapter(PassInstrument):
    """An object with some of the hook methods but not a PassInstrument: its hooks, no-ops for the rest."""

    def __init__(self, obj):
        self.obj = obj
        for hook in HOOKS:
            method = getattr(obj, hook, None)
            if method is not None:
                setattr(self, hook, method)

    def __repr__(self):
        return f"<instrument {self.obj!r}>"


def as_instrument(obj) -> PassInstrument:
    """`obj` if it is a PassInstrument; an object defining some of the hooks, adapted (no-ops for the
    others); anything else is a TypeError."""
    if isinstance(obj, PassInstrument):
        return obj
    if any(callable(getattr(obj, hook, None)) for hook in HOOKS):
        return _Adapter(obj)
    raise TypeError(f"{obj!r} is not a pass instrument: subclass passline.PassInstrument and override "
                    f"some of {', '.join(HOOKS)}")


class Timing(PassInstrument):
    """record.seconds: wall time of the pass itself (innermost: no other hook's time is counted)."""

    def before_pass(self, call, graph):
        self._t0 = time.perf_counter()

    def after_pass(self, record, graph):
        record.seconds = time.perf_counter() - self._t0


class ChangeDetection(PassInstrument):
    """record.changed (did the graph really change? compared, not claimed), nodes_after, edges_after."""

    def before_pass(self, call, graph):
        self._before = _snapshot(graph)

    def after_pass(self, record, graph):
        record.nodes_after, record.edges_after = len(graph), graph.num_edges()
        record.changed = _changed(self._before, graph)
        self._before = None


class Verification(PassInstrument):
    """graph.verify() after each pass; a VerificationError names the pass."""

    def after_pass(self, record, graph):
        try:
            graph.verify()
        except VerificationError as e:
            raise VerificationError(e.message, e.node, pass_name=record.name) from e


class PassMetrics(PassInstrument):
    """A `pass_stats` metric-table row per pass run (written when that table is enabled)."""

    def enter_pipeline(self, graph, run):
        self._run = run

    def after_pass(self, record, graph):
        self._run.metrics.row("pass_stats", graph=self._run.graph_name, index=record.index, pass_name=record.name,
                              seconds=record.seconds, nodes_before=record.nodes_before,
                              nodes_after=record.nodes_after, changed=record.changed,
                              decisions=len(record.decisions))


class Dumps(PassInstrument):
    """`<dump_dir>/<graph>/`: the graph as it came in, and text, DOT and a diff after each pass that changed
    it (pipeline/dump.py)."""

    def __init__(self, dump_dir: str):
        self.dump_dir = dump_dir

    def enter_pipeline(self, graph, run):
        from .dump import dump_graph

        self._run = run
        dump_graph(self.dump_dir, run.graph_name, 0, "input", graph)

    def before_pass(self, call, graph):
        self._before = graph.copy()

    def after_pass(self, record, graph):
        before, self._before = self._before, None
        if record.changed:
            from .dump import dump_change

            dump_change(self.dump_dir, self._run.graph_name, record, before, graph)


def builtin_instruments(verify: bool = True, dump_dir: str | None = None) -> list[PassInstrument]:
    """The PassManager's own instruments, outermost first."""
    out: list[PassInstrument] = [Dumps(dump_dir)] if dump_dir else []
    out += [PassMetrics()]
    out += [Verification()] if verify else []
    return out + [ChangeDetection(), Timing()]


def _snapshot(graph: SchedulerGraph):
    return dict(graph.items()), frozenset(graph.edges()), graph.outputs, graph.orders()


def _changed(before, graph: SchedulerGraph) -> bool:
    """Did the graph change? Nodes are compared by name, then by identity, and by value only where the
    object differs (a pass may rebuild an equal node: that is no change); a node moved to another
    program position (`graph.move`) is a change too."""
    nodes, edges, outputs, orders = before
    now = dict(graph.items())
    if nodes.keys() != now.keys() or outputs != graph.outputs or edges != frozenset(graph.edges()):
        return True
    if graph.orders() != orders:
        return True
    return any(old is not now[n] and old != now[n] for n, old in nodes.items())
