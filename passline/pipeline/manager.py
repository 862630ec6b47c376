"""The PassManager: runs a Pipeline on a SchedulerGraph, checked, timed and explained.

Around each pass its instruments (pipeline/instruments.py) measure wall time, count nodes and edges,
check whether the graph really changed (by comparing its nodes and edges, not by trusting the pass),
verify the graph (switchable), add metric rows and write dumps; users add their own instruments.
Passes make choices through `ctx.decide(kind, *nodes)`; a decision limit makes later decisions answer
False, which is how `passline.bisect` finds the one decision that breaks a result.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import time
from typing import Iterable

import attrs

from ..ir import members
from .graph import SchedulerGraph
from .instruments import PassInstrument, PipelineRun, as_instrument, builtin_instruments
from .metrics import Metrics
from .registry import current_registry
from .target import Target
from .text import PassCall, Pipeline, Repeat


@attrs.define
class PassResult:
    """What a pass may return instead of the bare graph."""

    graph: SchedulerGraph
    changed: bool | None = None
    stats: dict = attrs.Factory(dict)


@attrs.frozen
class Decision:
    index: int  # 1-based, within one pass run
    kind: str
    nodes: tuple  # node names
    allowed: bool

    def __str__(self):
        return f"#{self.index} {self.kind}({', '.join(self.nodes)}){'' if self.allowed else ' [refused by limit]'}"


@attrs.define
class PassRecord:
    index: int  # 1-based execution number within this pipeline run
    name: str
    call: str  # the pass as pipeline text, with its options
    iteration: int | None  # iteration of the enclosing repeat(...), if any
    seconds: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    edges_before: int = 0
    edges_after: int = 0
    changed: bool = False
    claimed_changed: bool | None = None
    stats: dict = attrs.Factory(dict)
    decisions: list = attrs.Factory(list)
    stage: str = "scheduler"  # "fx": run on dynamo's FX graph (nodes and edges are FX nodes and uses)

    def __str__(self):
        it = f" (iteration {self.iteration})" if self.iteration is not None else ""
        it += " [fx]" if self.stage == "fx" else ""
        return (f"{self.index:3d}. {self.call}{it}: {self.seconds * 1e3:.2f} ms, nodes {self.nodes_before}"
                f"→{self.nodes_after}, edges {self.edges_before}→{self.edges_after}"
                f"{', changed' if self.changed else ''}"
                + (f", {dict(self.stats)}" if self.stats else "")
                + (f", {len(self.decisions)} decisions" if self.decisions else ""))


class PassContext:
    """Handed to each pass: counted decisions, stats, the compile's metrics and the `target` the graph
    will run on (pipeline/target.py; the CPU when the caller names none)."""

    def __init__(self, record: PassRecord, metrics: Metrics, graph_name: str = "",
                 decision_limit: int | None = None, target: Target | None = None):
        self.record = record
        self.target = target if target is not None else Target.cpu()
        self.metrics = metrics
        self.graph_name = graph_name
        self.decision_limit = decision_limit
        self.stats: collections.Counter = collections.Counter()
        self.state: dict = {}  # the pass's own scratch space for this run (fresh for every pass run)

    @property
    def pass_name(self) -> str:
        return self.record.name

    def decide(self, kind: str, *nodes) -> bool:
        """Ask to make one transformation; False means skip it (a bisect limit was reached)."""
        index = len(self.record.decisions) + 1
        allowed = self.decision_limit is None or index <= self.decision_limit
        names = tuple(n if isinstance(n, str) else n.name for n in nodes)
        self.record.decisions.append(Decision(index, kind, names, allowed))
        return allowed

    def count(self, stat: str, n: int = 1) -> None:
        """Add to a pass statistic (in the pass record) and the compile's counter of that name."""
        self.stats[stat] += n
        self.metrics.counters[stat] += n

    def refuse(self, reason: str, a, b, detail: str = "") -> None:
        """Record why nodes `a` and `b` were not combined (fusion failures by reason, for explain)."""
        self.metrics.fusion_failures[reason] += 1
        self.metrics.row("fusion_failures", graph=self.graph_name, pass_name=self.pass_name,
                         reason=reason, node1=a.name, node2=b.name, detail=detail)
        self.metrics.refusals.append(Refusal(self.pass_name, reason, detail, a.name, b.name,
                                             _member_names(a), _member_names(b)))


@attrs.frozen
class Refusal:
    pass_name: str
    reason: str
    detail: str
    a: str
    b: str
    a_members: tuple  # the original node names inside a and b
    b_members: tuple


def _member_names(node) -> tuple:
    return tuple(m.name for m in members(node))


@contextlib.contextmanager
def collector_paused():
    """Pause CPython's cyclic garbage collector while passes run (and, backends/dynamo.py, while a graph is
    lowered and compiled; threads compiling at once may end each other's pause early: speed, never a leak).
    Passes allocate many small objects that outlive a young collection (groups, edges, decisions), and every so
    often that triggers a full collection that rescans the whole heap — torch, sympy's caches, the graph: on a
    10,000-node graph those scans took up to a third of fusion time, and a GPT-2-style training step's first call
    on the CPU spent ~1 s in 8 of them. Reference counting still frees everything acyclic at once; the collector
    resumes when the outermost pause ends (mypy does the same for its parse phase)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class PassManager:
    """Runs `pipeline` on graphs, under the pass registry in effect when it was made. Around every pass run:
    the built-in instruments (timing, change detection, verification with `verify`, metrics, dumps with
    `dump_dir`), and outside them `instruments` (PassInstruments, the first given outermost; see
    pipeline/instruments.py).

    A pipeline has two stages (registry.STAGES): its FX-stage passes, first, rewrite dynamo's graph before
    aot_autograd (`run_fx`, once per captured graph); the rest run on each lowered graph (`run`). The
    pass numbering, `pass_limit` and `decision_limits` run through both: `run(..., before=fx_records)`
    continues after the FX stage's records."""

    def __init__(self, pipeline: Pipeline | str = "", *, verify: bool = True, instruments: Iterable = (),
                 pass_limit: int | None = None, decision_limits: dict | None = None,
                 dump_dir: str | None = None):
        self.registry = current_registry()
        self.pipeline = pipeline if isinstance(pipeline, Pipeline) else Pipeline.parse(pipeline)
        self.verify = verify
        self.instruments = [as_instrument(i) for i in instruments]
        self.pass_limit = pass_limit
        self.decision_limits = dict(decision_limits or {})
        self.dump_dir = dump_dir

    def all_instruments(self) -> list[PassInstrument]:
        """Every instrument of a run, outermost first: yours, then the built-in ones."""
        return [*self.instruments, *builtin_instruments(self.verify, self.dump_dir)]

    def run(self, graph: SchedulerGraph, metrics: Metrics | None = None, graph_name: str = "graph",
            target: Target | None = None, before: Iterable = ()):
        """Run the pipeline's scheduler stage; returns (final graph, list of PassRecord). `self.records` and
        `self.graph_name` describe the latest run even when a pass raised. `target`: the machine the
        graph will run on, for passes that decide by it (default: the CPU). `before`: the records of the FX
        stage that made this graph (`run_fx`): they open the returned list and count toward `pass_limit`."""
        self.records: list[PassRecord] = list(before)
        self.target = target if target is not None else Target.cpu()
        self._records = self.records
        self._metrics = metrics if metrics is not None else Metrics()
        self._graph_name = self.graph_name = graph_name
        self._outer_first = self.all_instruments()
        self._inner_first = self._outer_first[::-1]
        run = PipelineRun(graph_name, self._metrics, self._records)
        with self.registry.active():
            for ins in self._outer_first:
                ins.enter_pipeline(graph, run)
            with collector_paused():
                graph, _ = self._run_items(self.pipeline.scheduler_items(), graph, None)
            for ins in self._inner_first:
                ins.exit_pipeline(graph, run)
        return graph, self._records

    def _run_items(self, items, graph, iteration) -> tuple[SchedulerGraph, bool]:
        changed_any = False
        for it in items:
            if isinstance(it, Repeat):
                for k in range(1, it.max_iter + 1):
                    graph, changed = self._run_items(it.items, graph, k)
                    changed_any |= changed
                    if not changed:
                        break
            else:
                if self.pass_limit is not None and len(self._records) >= self.pass_limit:
                    return graph, changed_any
                graph, changed = self._run_pass(it, graph, iteration)
                changed_any |= changed
        return graph, changed_any

    def _run_pass(self, call: PassCall, graph: SchedulerGraph, iteration) -> tuple[SchedulerGraph, bool]:
        index = len(self._records) + 1
        record = PassRecord(index, call.name, str(call), iteration, nodes_before=len(graph),
                            edges_before=graph.num_edges())
        self._records.append(record)
        ctx = PassContext(record, self._metrics, self._graph_name, self.decision_limits.get(index), self.target)
        for ins in self._outer_first:
            ins.before_pass(call, graph)
        try:
            result = call.info.run(graph, ctx, **call.resolved())
        except Exception as e:
            e.add_note(f"in pass {call.name!r} (pipeline step {index}: {call})")
            raise
        if isinstance(result, PassResult):
            record.claimed_changed = result.changed
            ctx.stats.update(result.stats)
            graph = result.graph
        elif result is not None:
            graph = result
        if not isinstance(graph, SchedulerGraph):
            raise TypeError(f"pass {call.name!r} returned {type(graph).__name__}, not a SchedulerGraph")
        record.stats = dict(ctx.stats)
        for ins in self._inner_first:
            ins.after_pass(record, graph)
        return graph, record.changed

    def run_fx(self, gm, metrics: Metrics | None = None, graph_name: str = "graph", target: Target | None = None):
        """Run the pipeline's FX-stage passes on dynamo's `gm` (a torch.fx.GraphModule, rewritten in place);
        returns (gm, list of PassRecord). Each pass is timed, its change found by comparing the graph's text,
        the graph linted (with `verify`) and recompiled after it, and its stats and decisions recorded as for
        a scheduler pass; PassInstruments and dumps see SchedulerGraphs only and are not run here. A pass that
        raises may leave `gm.graph` half rewritten (the dynamo backend then runs the code dynamo generated,
        `gm.forward` bound before this stage)."""
        self.records = []
        self.target = target if target is not None else Target.cpu()
        self.graph_name = graph_name
        metrics = metrics if metrics is not None else Metrics()
        with self.registry.active():
            for call in self.pipeline.fx_calls():
                if self.pass_limit is not None and len(self.records) >= self.pass_limit:
                    break
                gm = self._run_fx_pass(call, gm, metrics, graph_name)
        return gm, self.records

    def _run_fx_pass(self, call: PassCall, gm, metrics: Metrics, graph_name: str):
        import torch

        index = len(self.records) + 1
        text = str(gm.graph)
        record = PassRecord(index, call.name, str(call), None, nodes_before=len(gm.graph.nodes),
                            edges_before=_fx_edges(gm.graph), stage="fx")
        self.records.append(record)
        ctx = PassContext(record, metrics, graph_name, self.decision_limits.get(index), self.target)
        t0 = time.perf_counter()
        try:
            result = call.info.run(gm, ctx, **call.resolved())
        except Exception as e:
            e.add_note(f"in pass {call.name!r} (pipeline step {index}: {call})")
            raise
        record.seconds = time.perf_counter() - t0
        if isinstance(result, PassResult):
            record.claimed_changed = result.changed
            ctx.stats.update(result.stats)
            result = result.graph
        gm = gm if result is None else result
        if not isinstance(gm, torch.fx.GraphModule):
            raise TypeError(f"FX-stage pass {call.name!r} returned {type(gm).__name__}, not a torch.fx.GraphModule")
        if self.verify:
            gm.graph.lint()
        gm.recompile()
        record.changed = str(gm.graph) != text
        record.nodes_after, record.edges_after = len(gm.graph.nodes), _fx_edges(gm.graph)
        record.stats = dict(ctx.stats)
        metrics.row("pass_stats", graph=graph_name, index=index, pass_name=call.name, seconds=record.seconds,
                    nodes_before=record.nodes_before, nodes_after=record.nodes_after, changed=record.changed,
                    decisions=len(record.decisions))
        return gm


def _fx_edges(graph) -> int:
    return sum(len(n.users) for n in graph.nodes)
