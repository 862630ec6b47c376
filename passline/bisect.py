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
from typing import Callable, Sequence

import attrs
import torch

from .backends.check import BisectReport, culprit_report, locate, matches, save_reproducer  # noqa: F401
from .backends.dynamo import Backend
from .testing import _clone, _flat

# The search (`locate`), the comparison (`matches`), the report and the reproducer format are shared
# with the accuracy guard (passline/backends/check.py), which bisects one aten graph instead of a function.


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
        # check=False: a guard would run wrong graphs eagerly and hide what bisect is looking for
        be = Backend(self.pipeline, self.codegen, pass_limit=pass_limit, decision_limits=decision_limits,
                     capture=capture, fallback="raise", check=False)
        be.error = None
        try:
            got = self._run(torch.compile(self.fn, backend=be))
        except Exception as e:  # a crash is as bad as a wrong result
            be.error = e
            return False, be
        return matches(got, self.expected), be


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
    found = locate(lambda n, limits: not prober.probe(n, limits)[0], full.pipeline.max_runs(),
                   lambda k: max((len(recs[k - 1].decisions) for _, recs in _runs(prober.probe(k)[1])
                                  if len(recs) >= k), default=0))
    if found is None:
        return BisectReport(False, text, probes=prober.count,
                            message="the result is wrong with no pass at all: the bug is in lowering or the "
                                    "backend, not in a pass")
    k, limits = found
    _, be = prober.probe(pass_limit=k, decision_limits=limits, capture=True)
    bad = None if be.error is not None else _failing_graph(be, limits, k)
    if bad is not None:
        name, records = bad.name, bad.passes
    else:  # the compile crashed (e.g. the verifier caught the pass): the manager's latest run is the culprit
        name, records = be.manager.graph_name, be.manager.records
    report = culprit_report(text, k, limits, records, name, prober.count, be.error)
    if bad is not None and bad.inputs is not None:
        report.reproducer = str(save_reproducer(bad.name, bad.gm, bad.inputs, report.minimal_pipeline, k, limits,
                                                codegen, save_dir))
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
    be = Backend(pipeline, codegen, pass_limit=pass_limit, decision_limits=decision_limits, fallback="raise",
                 check=False)
    if any("val" not in n.meta for n in gm.graph.nodes if n.op != "output"):
        _propagate_meta(gm, inputs)  # a reloaded GraphModule has lost its FakeTensor metadata
    runner = be.compile_aten(gm, list(inputs), "replay")
    got = _flat(list(runner(*_clone(inputs))))
    expected = _flat(list(gm(*_clone(inputs))))
    return ReplayResult(matches(got, expected), got, expected)


def _propagate_meta(gm, inputs) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                         for x in inputs])


def replay(path: str | os.PathLike) -> ReplayResult:
    """Re-run a saved reproducer: compile its graph with its pipeline and limits, compare with eager."""
    data = torch.load(path, weights_only=False)
    return replay_graph(data["graph_module"], data["inputs"], data["pipeline"], data["pass_limit"],
                        data["decision_limits"], data["codegen"])
