"""`passline.backend(...)`: a torch.compile backend.

dynamo hands us an FX graph; aot_autograd (with passline's decomposition table) splits it into aten
forward and backward graphs; each is lowered, scheduled by the pipeline and run by the chosen backend.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import itertools
import os
import time
import warnings
from pathlib import Path

import attrs
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from ..config import as_bool, current_settings, use_settings
from ..lowering import lower_graph
from ..lowering.decompositions import DeferredTable, replace_wrong_decompositions
from ..pipeline.graph import SchedulerGraph
from ..pipeline.manager import PassManager, collector_paused
from ..pipeline.metrics import Metrics
from ..pipeline.report import CompileReport, set_last_report
from ..pipeline.target import Target
from ..pipeline.text import Pipeline
from . import aot_cache, graph_cache
from .check import checked
from .choosing import TimedChooser
from .layouts import conform_inputs
from .partition import SAVED_FROM, partition
from .reference import ReferenceRunner
from .variants import AUTO, FORCEABLE, KernelVariant

CODEGENS = ("auto", "triton", "reference")
# The pipeline `passline.backend()` runs when none is given, in one place. mix_order_reduction runs again after
# split_reductions: a row group split into partial row sums leaves its epilogue (a norm's dx) a pointwise row side
# of its own, which mixes with the column sums as any pointwise row side does (docs/passes.md).
DEFAULT_PIPELINE = ("pad_linear, dce, one_hot_sums, recompute_columns, dce, inline_pointwise, memory_order, "
                    "merge_loops, inline_pointwise, repeat(fuse, reorder_loops; max_iter=4), mix_order_reduction, "
                    "split_reductions, mix_order_reduction, tile_rows, peak_memory")


class Backend:
    """A configured passline backend: `torch.compile(model, backend=passline.backend(...))`.

    pipeline: text or a Pipeline (default DEFAULT_PIPELINE); its FX-stage passes, first (pipelines.md "Stages"),
    run on each graph dynamo captures, before aot_autograd; the rest on each aten graph it makes;
    codegen: "triton" (generated kernels; on CPU tensors through Triton's interpreter), "reference" (the
    torch oracle) or "auto": triton for CUDA graphs, triton's interpreter for CPU graphs when
    TRITON_INTERPRET=1, else reference — the report's `codegen_reason` says which and why;
    verify: run SchedulerGraph.verify() after lowering and after every pass;
    instruments: PassInstruments (before_pass/after_pass hooks) run around every pass, after the built-in ones;
    pass_limit, decision_limits: stop after N pass runs / cap decisions (used by passline.bisect);
    kernel_variant: "auto" (multi-kernel choice), or force "persistent" / "looped" reductions or a mix-order
    form ("mix_order", "mix_order_acc2d") wherever a kernel has it;
    choice_overrides: op name -> candidate name ({"mm": "decompose_k"}, or one version,
    "decompose_k(chunks=32)", or "aten"): how nodes of that op are implemented wherever the candidate applies
    (lowering/choices.py); other nodes with candidates are timed on a GPU, and run as the op on the CPU.

    Settings (passline.config; None takes the one in effect when the backend is created: the environment's
    PASSLINE_* variable, or an enclosing `with passline.settings(...)`): dump_dir: write graph dumps for each
    pass that changed the graph ("" for none); metric_tables, metric_dir: CSV metric tables to write, and
    where; cache_dir: kernel cache; autotune: time each kernel's candidate configurations at its first call
    (off: configurations by rule, nothing timed); graph_cache: reuse a graph's lowering and passes from an
    earlier compile of the same graph, in this process or another (backends/graph_cache.py; on by default);
    aot_cache: with the graph cache, reuse aot_autograd's tracing and partitioning too (backends/aot_cache.py;
    on by default);
    fallback: when passline fails on a graph, "eager" (the default for users) warns and runs that graph's
    aten code as it is, "raise" (what passline.testing uses) raises the error;
    check: the accuracy guard (off by default): the first call of each graph is also run
    on the reference backend before any pass and compared output by output; a mismatch warns (or raises
    AccuracyError under fallback="raise"), runs that graph eagerly from then on, saves a reproducer and
    bisects to the culprit pass and decision (report.check; docs/debugging.md).
    The result is `backend.settings`; every graph is compiled under it.
    """

    def __init__(self, pipeline=None, codegen: str = "auto", verify: bool = True, dump_dir=None,
                 metric_tables=None, metric_dir=None, instruments=(), pass_limit=None, decision_limits=None,
                 capture: bool = False, kernel_variant: str = "auto", cache_dir=None, fallback=None,
                 check: bool | None = None, autotune: bool | None = None, cudagraphs: bool = False,
                 choice_overrides=None, graph_cache: bool | None = None, aot_cache: bool | None = None):
        if codegen not in CODEGENS:
            raise ValueError(f"unknown codegen {codegen!r}; choose one of {', '.join(CODEGENS)}")
        if isinstance(pipeline, (list, tuple)) and all(isinstance(p, str) for p in pipeline):
            pipeline = ", ".join(pipeline)  # ["dce", "fuse(max_nodes=8)"]: the passes in order
        if pipeline is not None and not isinstance(pipeline, (str, Pipeline)):
            raise TypeError(f"pipeline must be text (\"dce, fuse\"), a list of pass texts or a Pipeline, "
                            f"not {type(pipeline).__name__}")
        self.pipeline = Pipeline.parse(DEFAULT_PIPELINE if pipeline is None else pipeline) \
            if not isinstance(pipeline, Pipeline) else pipeline
        self.codegen = codegen
        verify, cudagraphs, capture = (as_bool(verify, "verify"), as_bool(cudagraphs, "cudagraphs"),
                                       as_bool(capture, "capture"))
        self.verify = verify
        self.settings = current_settings().evolve(
            dump_dir=dump_dir, metric_tables=metric_tables, metric_dir=metric_dir, cache_dir=cache_dir,
            fallback=fallback, check=check, autotune=autotune, graph_cache=graph_cache, aot_cache=aot_cache)
        self.dump_dir = self.settings.dump_dir
        if self.dump_dir and os.path.exists(self.dump_dir) and not os.path.isdir(self.dump_dir):
            raise ValueError(f"dump_dir {self.dump_dir!r} is a file, not a directory")
        self.metric_tables = self.settings.metric_tables
        self.metric_dir = self.settings.metric_dir
        self.cache_dir = self.settings.cache_dir  # kernel disk cache
        self.fallback = self.settings.fallback
        self.check = self.settings.check
        self.manager = PassManager(self.pipeline, verify=verify, instruments=instruments, pass_limit=pass_limit,
                                   decision_limits=decision_limits, dump_dir=self.dump_dir)
        self.capture = capture  # keep each graph's first real inputs on its report (bisect, reproducers)
        if kernel_variant not in FORCEABLE:
            raise ValueError(f"kernel_variant must be one of {', '.join(FORCEABLE)}, not {kernel_variant!r}")
        # force one reduction variant (tests, experiments)
        self.kernel_variant = AUTO if kernel_variant == AUTO else KernelVariant(kernel_variant)
        self.autotune = self.settings.autotune
        self.graph_cache = self.settings.graph_cache  # scheduled graphs reused across processes (graph_cache.py)
        self.aot_cache = self.settings.aot_cache  # and aot_autograd's results (aot_cache.py)
        self.chooser = TimedChooser(choice_overrides, self)  # checks the overrides' names
        self.choice_overrides = self.chooser.overrides
        self.cudagraphs = cudagraphs  # capture static-shape GPU graphs and replay them (backends/cudagraphs.py)
        self._cudagraph_pool = None  # what those graphs share (cudagraphs.Pool): memory, their outputs
        self.reports: list[CompileReport] = []
        self.failures: list = []  # (graph kind, exception) for graphs run eagerly by the fallback
        self._ids = itertools.count()
        self._fx_ids = itertools.count()  # dynamo graphs the FX stage ran on (`fx0`, ...): a count of their own,
        # so the aten graphs' names (forward0, backward1) do not depend on the pipeline having FX passes

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        _start_compile_workers(self, example_inputs, workers=False)  # the zygote; the workers at a cache miss
        replace_wrong_decompositions(gm)
        # the FX stage rewrites gm in place: keep a copy to run as captured, should a pass fail half-way
        as_captured = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)) if self.pipeline.fx_calls() else gm
        try:
            fx = self._run_fx_stage(gm, example_inputs)
        except Exception as e:
            # a pass failed on dynamo's graph, which may be half rewritten: run the code dynamo captured
            if self.fallback == "raise":
                raise
            warnings.warn(f"passline's FX-stage passes failed on a graph, which runs eagerly: "
                          f"{_described(e)}", stacklevel=2)
            self.failures.append(("fx", e))
            return as_captured.forward
        # aot_autograd's results kept on disk, where passline's scheduled graphs are (aot_cache.py)
        key = graph_cache.backend_key(self, {x.device for x in example_inputs if isinstance(x, torch.Tensor)}) \
            if self.aot_cache and aot_cache.available() and aot_cache.cacheable(gm, example_inputs) else None
        if key is not None:
            aot_cache.share_triton_key(example_inputs, self.cache_dir)
        compilers = {kind: self._compiler(kind, fx, cached=key is not None)
                     for kind in ("forward", "backward", "inference")}
        compiler = aot_autograd(
            fw_compiler=compilers["forward"],
            bw_compiler=compilers["backward"],
            inference_compiler=compilers["inference"],
            decompositions=DeferredTable(),  # built only if aot_autograd traces (not at a hit of its cache)
            # save few activations; recompute cheap pointwise work in the backward (as Inductor does);
            # max-pool indices saved as window offsets (backends/partition.py)
            partition_fn=partition,
            # a mutated graph input (BatchNorm's running statistics) stays in the graph as `copy_`, which
            # lowering turns into the store of the kernel computing the new value (lowering/mutation.py);
            # without it aot_autograd applies each mutation after the graph with an eager copy_ (a launch)
            keep_inference_input_mutations=True,
        )
        try:
            with aot_cache.caching(self, fx, key) if key is not None else contextlib.nullcontext():
                return compiler(gm, example_inputs)
        except Exception as e:
            # aot_autograd traces the forward and backward (with passline's decompositions) before any
            # graph reaches passline's compiler: a failure there is a compile-time refusal too. Except
            # what dynamo answers itself, with a graph break or a restart (a data-dependent output shape:
            # the rest of the function still compiles) or as the user's error (IndexError)
            if self.fallback == "raise" or _dynamo_handles(e):
                raise
            warnings.warn(f"passline could not trace a graph with aot_autograd and runs it eagerly: "
                          f"{_described(e)}", stacklevel=2)
            self.failures.append(("aot_autograd", e))
            return as_captured.forward  # (not gm: the FX stage may have rewritten it into what failed)

    def _run_fx_stage(self, gm: torch.fx.GraphModule, example_inputs) -> FxStage:
        """The pipeline's FX-stage passes on dynamo's graph, rewritten in place before aot_autograd traces it."""
        if not self.pipeline.fx_calls():
            return FxStage()
        devices = [x.device for x in example_inputs if isinstance(x, torch.Tensor)]
        metrics = Metrics(enabled=self.metric_tables)
        with use_settings(self.settings):
            _, records = self.manager.run_fx(gm, metrics, f"fx{next(self._fx_ids)}", Target.of_devices(devices))
        return FxStage(tuple(records), metrics)

    def _compiler(self, kind: str, fx: FxStage, cached: bool = False):
        """aot_autograd's compiler for `kind` graphs; `cached`: its results go to aot_autograd's cache."""
        def compile_graph(gm: torch.fx.GraphModule, example_inputs):
            key = None
            if kind == "forward":
                aot_cache.donate_nothing()  # a backward(retain_graph=True) after an ordinary one ran
            try:
                compiled = self._callable(self.compile_aten(gm, example_inputs, kind, fx), gm, kind)
                key = self.reports[-1].graph_key
            except Exception as e:
                if self.fallback == "raise":
                    raise
                # passline failed on this graph: run its aten code as it is (never a wrong result)
                warnings.warn(f"passline could not compile a {kind} graph and runs it eagerly: "
                              f"{_described(e)}", stacklevel=2)
                self.failures.append((kind, e))
                compiled = make_boxed_func(gm.forward)
            return aot_cache.output(compiled, gm, kind, key) if cached else compiled

        return aot_cache.serializable(compile_graph) if cached else compile_graph

    def _callable(self, runner, gm: torch.fx.GraphModule, kind: str):
        """A compiled graph's runner as aot_autograd calls it (boxed), guarded at its first call."""
        compiled = _boxed(runner)
        if self.fallback == "raise":
            return compiled
        return self._first_call_guarded(compiled, gm, kind, self.reports[-1].graph)

    def load_aten(self, gm: torch.fx.GraphModule, kind: str, fx: FxStage, key: str):
        """A graph aot_autograd's cache gave back (aot_cache.py), built from its scheduled form in the graph
        cache under `key`: (the boxed callable, its report), or None where the graph cache no longer has it."""
        with use_settings(self.settings), collector_paused():
            t0 = time.perf_counter()
            entry = graph_cache.GraphCache(self.cache_dir).load(key)
            if entry is None:
                return None
            graph, nodes_before, metrics, records = self._from_graph_cache(entry, fx)
            metrics.counters["aot_cache_hits"] += 1
            t1 = time.perf_counter()
            runner = self._run_side(f"{kind}{next(self._ids)}", gm, None, graph, nodes_before, metrics, records, fx,
                                    key, (t0, t1, t1), entry.get("id"))
            return self._callable(runner, gm, kind), self.reports[-1]

    def _first_call_guarded(self, compiled, gm: torch.fx.GraphModule, kind: str, graph):
        """`compiled`, whose first call falls back to `gm`'s aten code where passline refuses at run time
        what it accepted at compile time (a NotImplementedError: an index form the runner cannot evaluate),
        as the fallback does for a compile-time refusal. Only for a graph that writes none of its inputs:
        a call that failed half-way may have written some, and running it again would read them changed.
        Later calls go straight to `compiled` (one frame more, ~0.1 µs)."""
        if graph.mutated_names():
            return compiled
        impl = None

        def first(args):
            nonlocal impl
            saved = list(args)  # the generated call empties the list it is given
            try:
                out = compiled(args)
            except NotImplementedError as e:
                warnings.warn(f"passline could not run a {kind} graph and runs it eagerly from now on: "
                              f"{type(e).__name__}: {e}", stacklevel=2)
                self.failures.append((kind, e))
                impl = make_boxed_func(gm.forward)
                return impl(saved)
            impl = compiled
            return out

        impl = first

        def call(args):
            return impl(args)

        call._boxed_call = True
        return call

    def compile_aten(self, gm: torch.fx.GraphModule, example_inputs, kind: str = "graph", fx: FxStage | None = None):
        """Lower an aten FX graph, run the pipeline's scheduler stage, and return a callable taking the graph
        inputs. `fx`: the FX stage that shaped the graph this one comes from (its records open the report's)."""
        with use_settings(self.settings), collector_paused():  # (a backward's compile starts here)
            return self._compile_aten(gm, example_inputs, kind, fx or FxStage())

    def _compile_aten(self, gm: torch.fx.GraphModule, example_inputs, kind: str, fx: FxStage):
        name = f"{kind}{next(self._ids)}"
        t0 = time.perf_counter()
        cache = graph_cache.GraphCache(self.cache_dir) if graph_cache.enabled(self) else None
        key = graph_cache.graph_key(gm, self) if cache is not None else None
        entry = cache.load(key) if key is not None else None
        stored = None  # the id of the entry this compile stores
        if entry is not None:  # lowered and scheduled by an earlier compile of the same graph
            graph, nodes_before, metrics, records = self._from_graph_cache(entry, fx)
            t1 = t2 = time.perf_counter()
        else:
            _start_compile_workers(self, example_inputs)  # forked as the graph is lowered and scheduled
            # what lowering and the passes warn (a user's choice that raised) is kept for a later hit to repeat
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                program = lower_graph(gm, example_inputs, self.chooser)
                graph = SchedulerGraph.from_program(program)
                graph.released = released_inputs(graph)
                if self.verify:
                    graph.verify()
                t1 = time.perf_counter()
                metrics = Metrics(enabled=self.metric_tables)
                nodes_before = len(graph)
                # the passes may decide by the device the graph runs on (split_reductions: its SM count)
                graph, records = self.manager.run(graph, metrics, name, Target.of(graph), before=fx.records)
                t2 = time.perf_counter()
            for w in warned:  # shown as they would have been (the filters in effect decide)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            if key is not None:  # the scheduler stage's own figures and records (the FX stage's are this call's)
                stored = cache.store(key, graph=graph, nodes_before=nodes_before, metrics=metrics,
                                     records=records[len(fx.records):],
                                     warnings=[(str(w.message), w.category) for w in warned])
                metrics.counters["graph_cache_stores" if stored else "graph_cache_not_stored"] += 1
        return self._run_side(name, gm, example_inputs, graph, nodes_before, metrics, records, fx,
                              key if entry is not None or stored else None, (t0, t1, t2),
                              entry.get("id") if entry is not None else stored)

    def _from_graph_cache(self, entry: dict, fx: FxStage):
        """(graph, nodes_before, metrics, records) of a graph-cache entry, as a compile that made it would have."""
        graph, nodes_before, metrics = entry["graph"], entry["nodes_before"], entry["metrics"]
        records = [*fx.records, *entry["records"]]
        metrics.counters["graph_cache_hits"] += 1
        for message, category in entry.get("warnings", ()):  # what lowering and the passes warned, again
            warnings.warn(message, category, stacklevel=3)
        # a choice timed by the compile that stored the graph was read back now, not timed
        graph.choices = tuple(attrs.evolve(c, how="cached") if c.how == "timed" else c for c in graph.choices)
        return graph, nodes_before, metrics, records

    def _run_side(self, name: str, gm, example_inputs, graph: SchedulerGraph, nodes_before: int, metrics: Metrics,
                  records: list, fx: FxStage, key: str | None, times: tuple, entry_id: str | None = None):
        """The runner of a scheduled graph and its report (appended to `reports`). `key`: the graph cache's key it
        is stored under (None: not stored); `times`: when lowering, the passes and codegen began; `entry_id`: the
        id of the graph-cache entry `graph` is (loaded, or stored by this compile), which the runner's sources
        kept beside it are named by."""
        t0, t1, t2 = times
        fx.count_into(metrics)
        codegen, reason = choose_codegen(self.codegen, graph)
        if codegen == "triton":
            from .triton.cache import KernelCache
            from .triton.runner import TritonRunner, made_key

            interpret = _on_cpu(graph)
            # a graph-cache entry (this very graph, by its id): its kernels built from what an earlier compile
            # generated for it, or what is generated now kept for a later one
            kept = graph_cache.GraphCache(self.cache_dir) if key is not None and entry_id else None
            mkey = made_key(interpret, self.kernel_variant) if kept is not None else None
            made = kept.load_made(key, entry_id, mkey) if kept is not None else None
            runner = TritonRunner(graph, interpret=interpret, variant=self.kernel_variant,
                                  cache=KernelCache(self.cache_dir), autotune=self.autotune, counters=metrics.counters,
                                  made=made)
            if kept is not None:
                metrics.counters["sources_loaded" if runner.made_loaded else "sources_generated"] += 1
                if not runner.made_loaded:
                    kept.store_made(key, entry_id, mkey, runner.made)
            if runner.fallbacks:
                reason += "; on the reference backend: " + "; ".join(
                    f"{n} ({why})" for n, why in runner.fallbacks.items())
        else:
            runner = ReferenceRunner(graph)
        report = CompileReport(name, graph, codegen, codegen_reason=reason, pipeline=str(self.pipeline), passes=records,
                               nodes_before=nodes_before, metrics=metrics, gm=gm, runner=runner, graph_key=key,
                               seconds={"lower": t1 - t0, "passes": t2 - t1, "codegen": time.perf_counter() - t2})
        report.finish()
        if self.metric_tables:
            metrics.write_csv(self.metric_dir)
        self.reports.append(report)
        set_last_report(report)
        runner = conform_inputs(graph, runner)  # read every input with the strides it was lowered for
        if self.cudagraphs:  # captured at the second call and replayed (backends/cudagraphs.py)
            from .cudagraphs import Pool, cudagraphed

            self._cudagraph_pool = self._cudagraph_pool or Pool()
            runner = cudagraphed(runner, graph, report, self._cudagraph_pool, gm.meta.get(SAVED_FROM))
        if self.check:  # the accuracy guard checks the first call against the oracle (backends/check.py)
            runner = checked(runner, report, self, gm, example_inputs)
        if self.capture:
            return _capturing(runner, report)
        return runner


def _described(e: Exception) -> str:
    """`e` for a warning, with its notes (the pass it was raised in: PassManager adds it)."""
    notes = "; ".join(getattr(e, "__notes__", ()))
    return f"{type(e).__name__}: {e}" + (f" ({notes})" if notes else "")


def _boxed(fn):
    """`fn` in aot_autograd's boxed calling convention. Where the runner takes the caller's list itself
    (the generated launch plan empties it), a backward's saved activations are freed at their last use;
    otherwise (the reference backend, the accuracy guard) `make_boxed_func`'s unpacking."""
    boxed = getattr(fn, "boxed", None)
    if boxed is None:
        return make_boxed_func(fn)

    def call(args):
        return boxed(args)

    call._boxed_call = True
    return call


@attrs.define
class FxStage:
    """What the FX-stage passes did to one captured graph: their records (which open the pass list of every
    aten graph aot_autograd makes from it) and figures (counted once, in the first of those graphs'
    metrics: its forward or inference graph, so that a sum over reports counts each rewrite once)."""

    records: tuple = ()
    metrics: Metrics | None = None

    def count_into(self, metrics: Metrics) -> None:
        if self.metrics is None:
            return
        metrics.counters.update(self.metrics.counters)
        for table, rows in self.metrics.tables.items():
            metrics.tables.setdefault(table, []).extend(rows)
        self.metrics = None


def _dynamo_handles(e: Exception) -> bool:
    from torch._dynamo import exc

    handled = getattr(exc, "exceptions_allowed_to_be_fallback", ())
    return isinstance(e, (*handled, IndexError)) or type(e).__module__.startswith("torch._dynamo")


_OPTIONS = tuple(inspect.signature(Backend.__init__).parameters)[1:]
# torch.compile hands a backend other than Inductor its mode by name (MODES below); a user may also pass Inductor's
# options for a mode (torch._inductor.list_mode_options) as options=: passline takes the two it has a meaning for
# and leaves Inductor's own tuning; any other Inductor option is refused as an unknown keyword
_MODE_OPTIONS = {"triton.cudagraphs": "cudagraphs", "max_autotune": "autotune"}
_INDUCTOR_ONLY = ("coordinate_descent_tuning", "triton.cudagraph_skip_dynamic_graphs", "max_autotune_gemm",
                  "max_autotune_pointwise")


def _checked_options(options: dict) -> dict:
    """`options` as Backend's keywords; an unknown one is an error naming the closest option."""
    unknown = [k for k in options if k not in _OPTIONS]
    if unknown:
        near = difflib.get_close_matches(unknown[0], _OPTIONS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; options: {', '.join(_OPTIONS)}"
        raise TypeError(f"passline.backend() has no option {unknown[0]!r}{hint}")
    return options


def backend(pipeline=None, codegen: str = "auto", **options) -> Backend:
    """A torch.compile backend running `pipeline` and generating code with `codegen`."""
    return Backend(pipeline=pipeline, codegen=codegen, **_checked_options(options))


def _start_compile_workers(backend: Backend, example_inputs, workers: bool = True) -> None:
    """With compile_in="processes", start the compile pool for a graph of GPU tensors: its zygote as dynamo
    hands the graph over (`workers=False`: it boots while aot_autograd traces the graph), its workers once
    the graph cache has missed (forked from the booted zygote while the graph is lowered and scheduled, so
    its first compile finds them waiting). Not the workers before: a graph loaded from aot_autograd's cache
    or the graph cache, with binaries loaded by record, compiles nothing, and a worker a core warming up beside
    its first call and the steps after it are only in their way. Not at all where nothing is compiled ahead
    (the reference codegen; autotune=True, which compiles each candidate where it times it). A pool that
    cannot start is the first compile's to find (it then compiles in the parent), never the user's call's."""
    if backend.codegen == "reference" or backend.autotune or backend.settings.compile_in != "processes":
        return
    gpu = next((t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
    if gpu is not None:
        from .triton.precompile import pool, target_of

        with contextlib.suppress(Exception):
            pool().start_soon(target_of(gpu), Path(backend.cache_dir), workers=workers)


def released_inputs(graph: SchedulerGraph) -> frozenset:
    """The inputs a graph's caller gives up at the call (their storage is freed at their last use): a
    backward's saved activations and incoming gradients — aot_autograd hands its list over and drops its own
    references — but not the forward's inputs it saved (named `primals_*`: parameters and the user's tensors,
    which their owners keep). A backward is known by its inputs (aot_autograd names the incoming gradients
    `tangents_*`), not by how it is compiled, so that the accuracy guard's probes, `passline.bisect` and
    `passline.replay`, which compile the same graph under other names, and the graph cache, order it as the
    training step did. Nothing for other graphs. peak_memory reads it; a wrong guess costs memory."""
    names = [i.name for i in graph.inputs if i.buffer is not None]
    if not any(n.startswith("tangents_") for n in names):
        return frozenset()
    return frozenset(n for n in names if not n.startswith("primals_"))


def _on_cpu(graph) -> bool:
    devices = {b.layout.device.type for b in graph.buffers().values()}
    return "cuda" not in devices


def choose_codegen(requested: str, graph) -> tuple[str, str]:
    """(backend, why) for one graph."""
    on_cpu = _on_cpu(graph)
    if requested == "reference":
        return "reference", "requested"
    if requested == "triton":
        return "triton", "requested; CPU tensors: Triton's interpreter" if on_cpu else "requested; GPU"
    if not on_cpu:
        return "triton", "auto: CUDA tensors"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton", "auto: CPU tensors and TRITON_INTERPRET=1: Triton's interpreter"
    return "reference", "auto: CPU tensors without TRITON_INTERPRET=1: the reference backend"


def _capturing(runner, report: CompileReport):
    def run(*args):
        if report.inputs is None:
            report.inputs = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        return runner(*args)

    return run


MODES = {"default": {}, "reduce-overhead": {"cudagraphs": True}, "max-autotune": {"autotune": True, "cudagraphs": True},
         "max-autotune-no-cudagraphs": {"autotune": True}}


def default_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The backend `torch.compile(..., backend="passline")` finds through the entry point. torch.compile's `options=`
    are passline.backend's keywords; its `mode=` ("reduce-overhead": CUDA graphs; "max-autotune": autotuning and
    CUDA graphs; "max-autotune-no-cudagraphs": autotuning), given by name or as Inductor's options for it."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; passline takes {', '.join(MODES)}")
    given = dict(MODES.get(mode or "default"))
    for key, value in (options or {}).items():
        if key in _MODE_OPTIONS:
            given[_MODE_OPTIONS[key]] = value
        elif key not in _INDUCTOR_ONLY:
            given[key] = value
    return Backend(**_checked_options(given))(gm, example_inputs)
