"""The accuracy guard, `passline.backend(check=True)` (or PASSLINE_CHECK=1), and graph-level bisection.

On the first call of each compiled graph (forward, backward, inference) the guard also runs an oracle:
the reference backend on the same aten graph lowered afresh, before any pass. It compares every output
(a forward's saved activations included; a backward's are the gradients) with passline.testing's
dtype-aware tolerances: NaN exactly where the oracle has NaN, integers and bools exact. Lowering is shared
with the oracle, so the guard checks what comes after it: the pipeline's passes and the code generator;
and the chosen implementations of nodes with choices, since the oracle lowers every op by itself
(lowering/choices.py).

- A match costs nothing afterwards: later calls go straight to the compiled runner.
- A mismatch warns (naming the graph, the worst output, its error and the tolerance), returns eager
  results for that call and runs the graph eagerly from then on, saves a reproducer that
  `passline.replay(path)` re-runs, and bisects the pipeline on this one graph to the pass run and the
  decision that break it (`bisect_graph`). All of it is on `report.check`.

The pass-run/decision search (`locate`) and the comparison (`matches`) are shared with `passline.bisect`,
which compiles a whole function again per probe; here one aten graph is compiled again per probe.
"""
from __future__ import annotations

import math
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import attrs
import torch

from ..config import current_settings
from ..lowering import lower_graph
from ..lowering.extern import is_rng_state_op
from ..pipeline.graph import SchedulerGraph
from ..pipeline.report import last_report, set_last_report
from ..testing import tolerance
from .layouts import conform_inputs
from .reference import ReferenceRunner


class AccuracyError(AssertionError):
    """A compiled graph's first call differs from the oracle (raised when the backend's fallback is "raise")."""


# -- comparison ------------------------------------------------------------------------------------------

@attrs.frozen
class Mismatch:
    output: int  # position among the graph's outputs
    node: str | None  # the FX node that produced it
    error: float  # max abs error over the elements out of tolerance (inf: NaN or inf in the wrong place)
    atol: float
    rtol: float
    what: str = "values"  # or "NaN positions", a shape, dtype or type difference

    def __str__(self):
        node = f" (node {self.node!r})" if self.node else ""
        tol = f"atol {self.atol:g} + rtol {self.rtol:g}·|expected|" if self.atol or self.rtol else "exact"
        return f"output {self.output}{node}: {self.what}, max abs error {self.error:g} (tolerance {tol})"


def _difference(got, want) -> tuple[float, str] | None:
    """(max abs error, what differs) where `got` is out of tolerance of `want`; None when they agree."""
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor) or got != want:
            return math.inf, f"{type(got).__name__} {got!r:.40} where {type(want).__name__} {want!r:.40} was expected"
        return None
    if got.shape != want.shape:
        return math.inf, f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return math.inf, f"dtype {got.dtype}, expected {want.dtype}"
    if got.device != want.device:
        return math.inf, f"device {got.device}, expected {want.device}"
    if got.numel() == 0:
        return None
    if not (want.is_floating_point() or want.is_complex()):
        if torch.equal(got, want):  # integers and bools: exact
            return None
        return float((got.double() - want.double()).abs().max()), "values"
    tol = tolerance(want.dtype)
    # float64 (complex128) so that the error itself is not rounded to the compared dtype
    wide = torch.complex128 if want.is_complex() else torch.float64
    a, b = got.to(wide), want.to(wide)
    close = torch.isclose(a, b, equal_nan=True, **tol)
    if bool(close.all()):
        return None
    error = (a - b).abs()[~close].max()  # NaN where NaN or inf meets a number or the other inf
    nan_moved = bool((a.isnan() != b.isnan()).any())
    return (math.inf if error.isnan() else float(error)), ("NaN positions" if nan_moved else "values")


def worst_mismatch(got, expected, names=None) -> Mismatch | None:
    """The output furthest out of tolerance (largest max abs error), or None when all agree.
    `names[k]` names the FX node that produced output k."""
    if len(got) != len(expected):
        return Mismatch(-1, None, math.inf, 0, 0, f"{len(got)} outputs, {len(expected)} expected")
    worst = None
    for k, (a, b) in enumerate(zip(got, expected)):
        diff = _difference(a, b)
        if diff is not None and (worst is None or diff[0] > worst.error):
            tol = tolerance(b.dtype) if isinstance(b, torch.Tensor) else dict(atol=0, rtol=0)
            worst = Mismatch(k, names[k] if names and k < len(names) else None, diff[0], what=diff[1], **tol)
    return worst


def matches(got, expected) -> bool:
    return worst_mismatch(got, expected) is None


def output_names(gm: torch.fx.GraphModule) -> list:
    """The FX node name behind each graph output (None where an output is not a node)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    return [getattr(v, "name", None) for v in values]


def _clone(xs) -> list:
    """Copies of the tensors with their strides: `clone()` makes a sliced view contiguous, and the oracle,
    whose dynamic-shape layouts bind stride symbols from the inputs, then read a copy of another layout
    than the runner's inputs (a BatchNorm over `x[..., 1::2]` with check=True failed its first call). The
    copies start at offset 0, as `conform_inputs` makes the runner's. An input whose elements overlap (an
    expanded one) cannot be written so and is cloned."""
    def copy(x):
        x = x.detach()
        try:
            return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(x)
        except RuntimeError:  # internal overlap
            return x.clone()

    return [copy(x) if isinstance(x, torch.Tensor) else x for x in xs]


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def draws_random(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph draws from the random generators: an op tagged nondeterministic_seeded (dropout,
    rand_like, bernoulli...) or the rng-state operators activation checkpointing wraps around them."""
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            return True
        if is_rng_state_op(n.target):
            return True
    return False


class RngStates:
    """The default generators' states (CPU, and each CUDA device once CUDA is initialized), to draw the same
    random numbers again: the oracle must see the numbers the compiled runner drew, or every graph with a
    dropout would differ from it."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


# -- bisection -------------------------------------------------------------------------------------------

@attrs.define
class BisectReport:
    matches: bool  # True when the full pipeline already matches: nothing to find
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
    decision_limits: dict = attrs.Factory(dict)  # {pass_index: decisions allowed} that reproduce the failure

    @property
    def culprit(self) -> str:
        """One line: the pass run and decision, or why there is none."""
        if self.matches:
            return "none found: the graph matches when compiled again"
        if self.pass_index is None:
            return self.message
        where = f"pass run #{self.pass_index} {self.pass_call}"
        return where + (f", decision {self.decision}" if self.decision is not None else ", with no counted decision")

    def __str__(self):
        if self.matches:
            return f"bisect: pipeline {self.pipeline!r} matches; nothing to bisect"
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


def first_bad(lo: int, hi: int, bad: Callable[[int], bool]) -> int:
    """Smallest k in [lo, hi] with bad(k), given bad(hi) and not bad(lo - 1)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def locate(bad: Callable[[int, dict], bool], max_runs: int,
           decisions_in: Callable[[int], int]) -> tuple[int, dict] | None:
    """The first bad pass run k and the decision limits {k: d} (d: the first bad decision) that break a
    result which the whole pipeline breaks. `bad(pass_limit, decision_limits)` probes one compile;
    `decisions_in(k)` counts the decisions of run k. None when it is wrong even with no pass at all."""
    if bad(0, {}):
        return None
    k = first_bad(1, max_runs, lambda n: bad(n, {}))
    decisions = decisions_in(k)
    if not decisions:
        return k, {}
    return k, {k: first_bad(0, decisions, lambda m: bad(k, {k: m}))}


def culprit_report(pipeline: str, k: int, limits: dict, records: list, graph: str, probes: int,
                   error: Exception | None = None) -> BisectReport:
    """The BisectReport for pass run k (1-based) under `limits`, from the pass records of the graph."""
    record = records[k - 1]
    d = limits.get(k, 0)
    return BisectReport(False, pipeline, pass_index=k, pass_name=record.name, pass_call=record.call,
                        decision=record.decisions[d - 1] if d >= 1 and len(record.decisions) >= d else None,
                        graph=graph, minimal_pipeline=", ".join(r.call for r in records[:k]), probes=probes,
                        message=f"{type(error).__name__}: {error}" if error else "", decision_limits=dict(limits))


class GraphProber:
    """Compiles one aten graph with pass and decision limits (each probe lowers it afresh, as the backend
    does), runs it on copies of `inputs` and compares with `expected`. A graph drawing random numbers draws
    them from the generator states `rng` (RngStates) in each probe, as `expected` was computed."""

    def __init__(self, gm, example_inputs, inputs, expected, pipeline, codegen: str, rng=None, **options):
        self.gm, self.example_inputs, self.inputs, self.expected = gm, list(example_inputs), inputs, expected
        self.pipeline, self.codegen, self.options, self.rng = pipeline, codegen, options, rng
        self.count = 0

    def backend(self, pass_limit=None, decision_limits=None):
        from .dynamo import Backend  # dynamo imports this module to wrap runners

        # no check (no guard inside a probe, whatever PASSLINE_CHECK says), no dumps, no metric tables
        return Backend(self.pipeline, self.codegen, pass_limit=pass_limit, decision_limits=decision_limits,
                       fallback="raise", check=False, dump_dir="", metric_tables=(), **self.options)

    def probe(self, pass_limit=None, decision_limits=None):
        """(matches, pass records of the compile, the error if it crashed)."""
        self.count += 1
        be = self.backend(pass_limit, decision_limits)
        try:
            runner = be.compile_aten(self.gm, self.example_inputs, "probe")
            if self.rng is not None:
                self.rng.restore()
            ok = matches(_as_list(runner(*_clone(self.inputs))), self.expected)
            return ok, be.reports[-1].passes, None
        except Exception as e:  # a crash (the verifier caught the pass, say) is as bad as a wrong result
            return False, getattr(be.manager, "records", []), e


def bisect_graph(gm, example_inputs, inputs, expected, pipeline, codegen: str = "reference", name: str = "graph",
                 rng=None, **options) -> BisectReport:
    """Find the first pass run, then the first decision in it, at which compiling the aten graph `gm` with
    `pipeline` stops producing `expected` on `inputs` (e.g. the oracle's outputs). `example_inputs` are
    what the graph is lowered with (aot_autograd's fake tensors or real ones); `rng`: the generator states
    `expected` drew its random numbers from (RngStates), if any; `options` go to Backend."""
    prober = GraphProber(gm, example_inputs, inputs, expected, pipeline, codegen, rng, **options)
    pipe = prober.backend().pipeline
    text = str(pipe)
    ok, _, _ = prober.probe()
    if ok:
        return BisectReport(True, text, graph=name, probes=prober.count)

    def decisions_in(k):
        records = prober.probe(k)[1]
        return len(records[k - 1].decisions) if len(records) >= k else 0

    found = locate(lambda n, limits: not prober.probe(n, limits)[0], pipe.max_runs(), decisions_in)
    if found is None:
        return BisectReport(False, text, graph=name, probes=prober.count,
                            message="no pass: the code generator, or a node's chosen implementation (the graph "
                                    "is wrong with an empty pipeline; report.choices lists the choices)")
    k, limits = found
    _, records, error = prober.probe(k, limits)
    return culprit_report(text, k, limits, records, name, prober.count, error)


def save_reproducer(name: str, gm, inputs, pipeline: str, pass_limit, decision_limits: dict, codegen: str,
                    save_dir=None, prefix: str = "passline-bisect-") -> Path:
    """Write what `passline.replay(path)` needs to re-run one graph: its aten GraphModule (and code),
    real inputs, pipeline, limits and codegen. Returns the path."""
    out = Path(save_dir) if save_dir else Path(tempfile.mkdtemp(prefix=prefix))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"repro-{name}.pt"
    torch.save({"code": gm.code, "graph_module": gm, "inputs": inputs, "pipeline": pipeline,
                "pass_limit": pass_limit, "decision_limits": decision_limits, "codegen": codegen}, path)
    return path


# -- the guard -------------------------------------------------------------------------------------------

@attrs.define
class CheckReport:
    """The accuracy guard's verdict on one compiled graph (`report.check`)."""

    ok: bool | None  # None: not checked (`message` says why: the oracle failed, the graph communicates)
    graph: str  # the report name: forward0, backward1, ...
    seconds: float  # first-call cost of the check: the oracle run and the comparison
    mismatch: Mismatch | None = None  # the worst output
    message: str = ""
    bisect: BisectReport | None = None
    reproducer: str | None = None
    bisect_seconds: float = 0.0

    @property
    def output(self) -> int | None:
        return self.mismatch.output if self.mismatch else None

    @property
    def error(self) -> float:
        return self.mismatch.error if self.mismatch else 0.0

    @property
    def tolerance(self) -> dict | None:
        return dict(atol=self.mismatch.atol, rtol=self.mismatch.rtol) if self.mismatch else None

    @property
    def culprit(self) -> str | None:
        return self.bisect.culprit if self.bisect else None

    def __str__(self):
        if self.ok:
            return f"check {self.graph}: matches the reference backend ({self.seconds * 1e3:.1f} ms)"
        if self.ok is None:
            return f"check {self.graph}: not checked, {self.message}"
        return (f"check {self.graph}: differs from the reference backend at {self.mismatch}; "
                f"culprit: {self.culprit}; reproducer: {self.reproducer} (passline.replay(path) re-runs it)")


class Guard:
    """Stands in for a compiled graph's runner. Until its first call is checked it runs `first`; then
    `call` is the compiled runner itself (checked and right) or the aten graph run eagerly."""

    def __init__(self, runner, report, backend, gm, example_inputs):
        self.runner, self.report, self.backend, self.gm = runner, report, backend, gm
        self.example_inputs = list(example_inputs)
        t0 = time.perf_counter()
        # The oracle: the same aten graph lowered again and run with no pass. Lowering afresh (rather than
        # copying the graph inside compile_aten before the passes) keeps the guard out of the compile path;
        # its cost is on report.seconds["check"].
        graph = SchedulerGraph.from_program(lower_graph(gm, self.example_inputs))
        # read inputs with the strides they were lowered for, as the compiled runner does
        self.oracle = conform_inputs(graph, ReferenceRunner(graph))
        report.seconds["check"] = time.perf_counter() - t0
        # positions of inputs some extern writes in place: the oracle must see them as they were
        mutated = graph.mutated_names()
        self.mutated = [k for k, inp in enumerate(graph.inputs) if inp.name in mutated]
        self.random = draws_random(gm)
        self.call = self.first

    def __call__(self, *args):
        return self.call(*args)

    def first(self, *args):
        # Inputs are shared with the oracle unless the graph writes one in place: then the oracle runs on
        # copies taken before the runner wrote, and a fallback puts the originals back first.
        t0 = time.perf_counter()
        before = _clone(args) if self.mutated else None
        # A graph that draws random numbers: the oracle (and a fallback) draws them again from the same
        # generator states, in program order as the compiled runner does; the user's generators end where
        # the compiled runner left them.
        rng_before = RngStates() if self.random else None
        spent = time.perf_counter() - t0
        got = self.runner(*args)
        t0 = time.perf_counter()  # the check's cost leaves the runner's own first call out
        rng_after = RngStates() if self.random else None
        try:
            if rng_before is not None:
                rng_before.restore()
            expected = self.oracle(*(_clone(before) if before is not None else args))
            mismatch = worst_mismatch(_as_list(got), expected, output_names(self.gm))
        except Exception as e:  # e.g. out of memory: the oracle's gathers take more than generated kernels
            return self._unchecked(got, e)
        finally:
            self.oracle = None  # one check per graph: free what it held
            if rng_after is not None:
                rng_after.restore()
        self.report.check = CheckReport(mismatch is None, self.report.name, spent + time.perf_counter() - t0,
                                        mismatch)
        if mismatch is None:
            self.call = self.runner  # from now on no extra work at all
            self.example_inputs = None  # kept for a bisection only
            return got
        self.call = self.gm.forward  # wrong once: eager for good
        inputs = before if before is not None else _clone(args)
        if before is not None:
            with torch.no_grad():
                for k in self.mutated:
                    args[k].copy_(before[k])
        if rng_before is not None:
            rng_before.restore()
        result = self.gm.forward(*args)  # the user gets eager's values, not the wrong ones
        self._explain(inputs, expected, rng_before)
        return result

    def _unchecked(self, got, error: Exception):
        """The oracle itself failed: nothing to compare with. Say so and keep the compiled graph."""
        self.call = self.runner
        self.report.check = CheckReport(None, self.report.name, 0.0,
                                        message=f"the reference backend failed: {type(error).__name__}: {error}")
        if self.backend.fallback == "raise":
            raise error
        warnings.warn(f"passline check: graph {self.report.name} could not be checked, the reference backend "
                      f"failed ({type(error).__name__}: {error}); it runs compiled, unchecked", stacklevel=3)
        return got

    def _explain(self, inputs, expected, rng=None) -> None:
        """Bisect the pipeline on this graph, save a reproducer, and warn (or raise)."""
        check, be, name = self.report.check, self.backend, self.report.name
        t0 = time.perf_counter()
        latest = last_report()
        rng_user = RngStates() if rng is not None else None  # the probes' draws must not move the user's
        try:
            found = bisect_graph(self.gm, self.example_inputs, inputs, expected, be.pipeline, be.codegen, name,
                                 rng=rng, verify=be.verify, kernel_variant=be.kernel_variant, cache_dir=be.cache_dir,
                                 choice_overrides=be.choice_overrides)
        except Exception as e:  # the guard must not break the user's program while explaining it
            found = BisectReport(False, str(be.pipeline), graph=name, message=f"bisect failed: {type(e).__name__}: {e}")
        finally:
            set_last_report(latest)  # probes compile reports of their own: last_report() stays the user's
            if rng_user is not None:
                rng_user.restore()
        check.bisect, check.bisect_seconds = found, time.perf_counter() - t0
        located = found.pass_index is not None
        pipeline = found.minimal_pipeline if located else str(be.pipeline)
        save_dir = be.dump_dir or current_settings().dump_dir
        try:
            check.reproducer = str(save_reproducer(name, self.gm, inputs, pipeline,
                                                   found.pass_index if located else None,
                                                   found.decision_limits, be.codegen, save_dir,
                                                   prefix="passline-check-"))
        except Exception as e:  # e.g. a graph that does not pickle: say so in the warning, keep going
            check.reproducer = f"not saved ({type(e).__name__}: {e})"
        message = (f"passline check: graph {name} differs from the reference backend: {check.mismatch}. "
                   f"Culprit: {found.culprit}. Reproducer: {check.reproducer} (passline.replay(path) re-runs "
                   f"it). This graph runs eagerly from now on.")
        be.failures.append((re.sub(r"\d+$", "", name), AccuracyError(message)))
        if be.fallback == "raise":
            raise AccuracyError(message)
        warnings.warn(message, stacklevel=3)


def checked(runner, report, backend, gm, example_inputs):
    """Wrap a compiled graph's runner in the accuracy guard (see the module doc); a graph that runs
    collectives is not checked: the oracle would issue them a second time, and a mismatch would bisect on
    this rank alone while the other ranks wait for collectives it never sends."""
    if report.graph.comms:
        report.check = CheckReport(None, report.name, 0.0, message="the graph runs collectives (each rank must "
                                   "issue exactly the program's collectives)")
        return runner
    return Guard(runner, report, backend, gm, example_inputs)
