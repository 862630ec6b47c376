"""Bisection to the single pass run, then the single decision inside it, that breaks a result.

    report = passline.bisect(fn, example_inputs, pipeline="dce, fuse, reorder_loops")
    print(report)                 # culprit pass, decision, minimal pipeline, reproducer path
    passline.replay(report.reproducer)   # re-runs the failing graph with one call

Each probe compiles `fn` with a pass limit (run only the first N pass executions of each graph's
pipeline) and a decision limit (inside run N, decisions after the D-th answer False), and compares
with eager PyTorch. The smallest failing N, then the smallest failing D, name the culprit.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import attrs
import torch

from .backends.dynamo import Backend
from .testing import _clone, _flat, tolerance


@attrs.define
class BisectReport:
    matches: bool  # True when the full pipeline already matches eager: nothing to find
    pipeline: str
    pass_index: int | None = None  # 1-based execution number of the culprit pass run
    pass_name: str | None = None
    pass_call: str | None = None
    decision: object = None  # passline.pipeline.manager.Decision, or None if the pass breaks with no decision
    graph: str | None = None  # which compiled graph (forward0, backward1, ...) breaks
    minimal_pipeline: str | None = None
    reproducer: str | None = None
    probes: int = 0
    message: str = ""

    def __str__(self):
        if self.matches:
            return f"bisect: pipeline {self.pipeline!r} matches eager; nothing to bisect"
        if self.pass_index is None:
            return f"bisect: {self.message}"
        lines = [f"bisect: first bad pass run #{self.pass_index}: {self.pass_call} (in {self.graph})"]
        if self.decision is not None:
            lines.append(f"  first bad decision: {self.decision}")
        else:
            lines.append("  the pass breaks the result without any counted decision")
        if self.message:
            lines.append(f"  the compile failed: {self.message.splitlines()[0]}")
        lines.append(f"  minimal pipeline: {self.minimal_pipeline}")
        if self.reproducer:
            lines.append(f"  reproducer: {self.reproducer}  (passline.replay(path) re-runs it)")
        lines.append(f"  {self.probes} compiles")
        return "\n".join(lines)


def _matches(outputs, expected) -> bool:
    if len(outputs) != len(expected):
        return False
    for a, b in zip(outputs, expected):
        try:
            torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)
        except AssertionError:
            return False
    return True


class _Prober:
    def __init__(self, fn, inputs, pipeline, codegen, backward):
        self.fn, self.inputs, self.pipeline, self.codegen = fn, inputs, pipeline, codegen
        self.backward = backward
        self.expected = self._run(fn)
        self.count = 0

    def _run(self, compiled):
        ins = _clone(self.inputs)
        outs = _flat(compiled(*ins))
        results = [o.detach() for o in outs]
        if self.backward:
            gen = torch.Generator().manual_seed(0)
            grads = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs if o.requires_grad]
            torch.autograd.backward([o for o in outs if o.requires_grad], grads)
            results += [x.grad for x in ins if isinstance(x, torch.Tensor) and x.requires_grad]
        return results

    def probe(self, pass_limit=None, decision_limits=None, capture=False):
        """(matches eager, backend) for one compile with these limits; a crash does not match and
        leaves its exception on `backend.error`."""
        self.count += 1
        torch._dynamo.reset()
        be = Backend(self.pipeline, self.codegen, pass_limit=pass_limit, decision_limits=decision_limits,
                     capture=capture, fallback="raise")
        be.error = None
        try:
            got = self._run(torch.compile(self.fn, backend=be))
        except Exception as e:  # a crash is as bad as a wrong result
            be.error = e
            return False, be
        return _matches(got, self.expected), be


def _first_bad(lo: int, hi: int, bad: Callable[[int], bool]) -> int:
    """Smallest k in [lo, hi] with bad(k), given bad(hi) and not bad(lo - 1)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def bisect(fn: Callable, example_inputs: Sequence, pipeline=None, codegen: str = "reference",
           backward: bool | None = None, save_dir: str | os.PathLike | None = None) -> BisectReport:
    """Find the first pass run, then the first decision in it, at which compiling `fn` with `pipeline`
    stops matching eager PyTorch. Saves a reproducer of the failing graph in `save_dir`."""
    if backward is None:
        backward = any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    prober = _Prober(fn, example_inputs, pipeline, codegen, backward)
    ok, full = prober.probe()
    text = str(full.pipeline)
    if ok:
        return BisectReport(True, text, probes=prober.count)
    ok0, _ = prober.probe(pass_limit=0)
    if not ok0:
        return BisectReport(False, text, probes=prober.count,
                            message="the result is wrong with no pass at all: the bug is in lowering or the "
                                    "backend, not in a pass")
    k = _first_bad(1, full.pipeline.max_runs(), lambda n: not prober.probe(pass_limit=n)[0])
    _, at_k = prober.probe(pass_limit=k)
    decisions = max((len(recs[k - 1].decisions) for _, recs in _runs(at_k) if len(recs) >= k), default=0)
    d = _first_bad(0, decisions, lambda m: not prober.probe(pass_limit=k, decision_limits={k: m})[0]) \
        if decisions else 0
    limits = {k: d} if decisions else {}
    _, be = prober.probe(pass_limit=k, decision_limits=limits, capture=True)
    bad = None if be.error is not None else _failing_graph(be, limits, k)
    if bad is not None:
        name, records = bad.name, bad.passes
    else:  # the compile crashed (e.g. the verifier caught the pass): the manager's latest run is the culprit
        name, records = be.manager.graph_name, be.manager.records
    record = records[k - 1]
    report = BisectReport(False, text, pass_index=k, pass_name=record.name, pass_call=record.call,
                          decision=record.decisions[d - 1] if d >= 1 and len(record.decisions) >= d else None,
                          graph=name, minimal_pipeline=", ".join(r.call for r in records[:k]),
                          probes=prober.count, message=f"{type(be.error).__name__}: {be.error}" if be.error else "")
    if bad is not None and bad.inputs is not None:
        report.reproducer = str(save_reproducer(bad, report.minimal_pipeline, k, limits, codegen, save_dir))
    return report


def _runs(be: Backend):
    """(graph name, pass records) of every graph a probe compiled, including one that crashed."""
    runs = [(r.name, r.passes) for r in be.reports]
    if be.error is not None and getattr(be.manager, "records", None) is not None:
        runs.append((be.manager.graph_name, be.manager.records))
    return runs


def _failing_graph(be: Backend, limits: dict, k: int):
    """The first compiled graph whose own result differs from running its aten graph eagerly."""
    for r in be.reports:
        if r.inputs is None or len(r.passes) < k:
            continue
        res = replay_graph(r.gm, r.inputs, str(be.pipeline), k, limits, be.codegen)
        if not res.matches:
            return r
    return None


@attrs.define
class ReplayResult:
    matches: bool
    outputs: list
    expected: list

    def __str__(self):
        return "replay: matches eager" if self.matches else "replay: MISMATCH against eager"


def replay_graph(gm, inputs, pipeline, pass_limit=None, decision_limits=None, codegen="reference") -> ReplayResult:
    be = Backend(pipeline, codegen, pass_limit=pass_limit, decision_limits=decision_limits, fallback="raise")
    if any("val" not in n.meta for n in gm.graph.nodes if n.op != "output"):
        _propagate_meta(gm, inputs)  # a reloaded GraphModule has lost its FakeTensor metadata
    runner = be.compile_aten(gm, list(inputs), "replay")
    got = _flat(list(runner(*_clone(inputs))))
    expected = _flat(list(gm(*_clone(inputs))))
    return ReplayResult(_matches(got, expected), got, expected)


def _propagate_meta(gm, inputs) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                         for x in inputs])


def save_reproducer(report, pipeline: str, pass_limit: int, decision_limits: dict, codegen: str,
                    save_dir=None) -> Path:
    out = Path(save_dir) if save_dir else Path(tempfile.mkdtemp(prefix="passline-bisect-"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"repro-{report.name}.pt"
    torch.save({"code": report.gm.code, "graph_module": report.gm, "inputs": report.inputs, "pipeline": pipeline,
                "pass_limit": pass_limit, "decision_limits": decision_limits, "codegen": codegen}, path)
    return path


def replay(path: str | os.PathLike) -> ReplayResult:
    """Re-run a saved reproducer: compile its graph with its pipeline and limits, compare with eager."""
    data = torch.load(path, weights_only=False)
    return replay_graph(data["graph_module"], data["inputs"], data["pipeline"], data["pass_limit"],
                        data["decision_limits"], data["codegen"])
