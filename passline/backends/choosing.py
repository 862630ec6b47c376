"""The dynamo backend's chooser: on a GPU, a node's candidates are timed when its graph is compiled (the
graph's first call), and the pick is cached on disk with the kernels' tuning choices.

Lowering asks it about every node whose op has candidates that apply (lowering/choices.py). Overrides
(`choice_overrides`) narrow the candidates first; one left is taken as it is. Several left, on a CUDA
device with generated code, are timed:

- inputs: random tensors with the node's shapes, strides and dtypes on its device (the compile's example
  inputs are fake), from a generator of their own (the user's random state is left alone);
- the op itself runs as the extern call it would be; every other candidate is compiled by passline as a
  graph of its own (traced, lowered, the backend's pipeline, the Triton backend), because that is the code
  that would run: the same kernels, the epilogue fused as it would be. Eager execution of the candidate's
  torch ops would time other kernels (an unfused sum and cast);
- each is checked against the op's result first (`choices.agree`): a candidate that disagrees, or fails to
  compile or run, is dropped with a warning, never chosen;
- the op itself is compiled the same way (a graph of one extern call), so that every candidate pays the same
  compiled call's host work;
- each is timed as its graph will run: replayed in a CUDA graph (`cudagraphs=True` and static shapes), by
  its GPU time alone (`gpu_ms`: do_bench's median of replays of a CUDA graph of several calls; if some
  candidate cannot be captured, the graph would run uncaptured, and all are timed as calls); otherwise by
  calls issued back to back (`calls_ms`: host included, which at these sizes is most of a call; the
  candidates' rounds interleaved, so that a drift in the host's speed falls on all alike). The fastest is
  chosen, unless the op itself is within `NOISE` of it by GPU time, `CALL_NOISE` by calls (then the op: the
  same speed with one call and no partial results).

The pick is stored under a key of the op, the candidates (their code's fingerprint and versions), the
arguments' shapes, strides and dtypes, the other arguments, the GPU's name and torch's version
(`KernelCache.put_choice`); a later compile of the same node reads it back ("cached") without timing.
Elsewhere (CPU tensors, the reference backend, symbolic sizes) the rule decides: the op itself, or the
override.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..lowering import lower_graph
from ..lowering.choices import ATEN, OP, Candidate, Rule, agree, is_static, trace
from ..pipeline.graph import SchedulerGraph
from ..pipeline.manager import PassManager
from ..pipeline.target import Target
from .triton.cache import KernelCache, digest

# do_bench medians of the same microsecond-scale kernel move by a few percent from run to run: a candidate
# must beat the op by more than this fraction of its GPU time to be chosen over it.
NOISE = 0.02
# ... and of its time by calls, whose host share moves far more: on the lent H200's host, timed one candidate
# after the other, decompose-K was chosen by calls at 4 of 144 shapes (benchmarks/choices.py, 2026-11-28),
# though its bmm, sum and second launch cost the host ~50 µs more a call than the op (docs/benchmarks.md).
CALL_NOISE = 0.10


class TimedChooser(Rule):
    """`Rule` with timing on a GPU (see the module doc). `backend`: the Backend whose pipeline, codegen,
    kernel variant and cache the candidates are compiled with."""

    def __init__(self, overrides, backend):
        super().__init__(overrides)
        self.backend = backend

    def can_time(self, tensors: list) -> bool:
        return (self.backend.codegen != "reference" and bool(tensors) and torch.cuda.is_available()
                and all(t.device.type == "cuda" for t in tensors))

    def time(self, node, op, cands, args, kwargs):
        from .. import __version__

        leaves = tree_flatten((args, kwargs))[0]
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        if not self.can_time(tensors):
            return None
        by_name = {c.name: c for c in cands}
        key = digest("choice", __version__, torch.__version__, op,
                     [(c.name, c.choice.fingerprint() if c.choice is not None else None) for c in cands],
                     [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) for t in tensors],
                     [v for v in leaves if not isinstance(v, torch.Tensor)], _device_name(tensors[0].device),
                     "gpu time" if self.replayed(node) else "calls",  # what was timed (see bench)
                     NOISE, CALL_NOISE,  # and the margins a win needed (a pick under other ones is re-timed)
                     torch.get_float32_matmul_precision())  # sets the tolerance a candidate must agree within
        cache = KernelCache(self.backend.cache_dir)
        saved = cache.get_choice(key)
        if saved is not None and saved.get("chosen") in by_name:
            return by_name[saved["chosen"]], dict(saved.get("timings", {})), "cached"
        device = tensors[0].device  # the tensors' GPU: its streams are the ones launched on and timed
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            timings, by_gpu = self.measure(node, cands, args, kwargs)
        if not timings:
            return None
        best = min(timings, key=timings.get)
        if ATEN in timings and timings[ATEN] <= (1 + (NOISE if by_gpu else CALL_NOISE)) * timings[best]:
            best = ATEN  # a win within the timing's own spread is none: keep the op (one call, no partials)
        cache.put_choice(key, {"chosen": best, "timings": timings})
        return by_name[best], timings, "timed"

    def measure(self, node, cands: list[Candidate], args, kwargs) -> tuple[dict[str, float], bool]:
        """Milliseconds per candidate that agrees with the op, and whether they are GPU times (else calls')
        (see the module doc)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        timings: dict[str, float] = {}
        with unset_fake_temporarily(), torch.no_grad():
            try:
                real_args, real_kwargs = random_like(args, kwargs)
            except torch.cuda.OutOfMemoryError:
                warnings.warn(f"passline: no memory to time the candidates of {node.name}: the op runs as it is",
                              stacklevel=2)
                return {}, False
            tensors = [v for v in tree_flatten((real_args, real_kwargs))[0] if isinstance(v, torch.Tensor)]
            want = node.target(*real_args, **real_kwargs)
            # the op too, as a graph of its own: every candidate pays the same compiled call's host work; the op
            # comes first, and its failure leaves nothing to compare with (nothing else is compiled then)
            runners = {}
            for c in cands:
                runners[c] = self.compile(c, node)
                if c is OP and isinstance(runners[c], Exception):
                    break
            _build_side_by_side([r for r in runners.values() if not isinstance(r, Exception)])
            runs = {}
            for c, runner in runners.items():
                try:
                    if isinstance(runner, Exception):
                        raise runner
                    run = _first_output(runner, tensors)
                    ok = c is OP or agree(run(), want, _matmul_precision(want.dtype))
                except Exception as e:  # noqa: BLE001 - a candidate that fails is no candidate
                    if c is OP:  # nothing to compare with: the op runs as it is
                        warnings.warn(f"passline: {node.name} ({node.target}) could not be timed "
                                      f"({type(e).__name__}: {e}); the op runs as it is", stacklevel=2)
                        return {}, False
                    warnings.warn(f"passline: choice {c.name} of {node.name} failed ({type(e).__name__}: "
                                  f"{e}); it is not a candidate", stacklevel=2)
                    continue
                if not ok:
                    warnings.warn(f"passline: choice {c.name} of {node.name} disagrees with "
                                  f"{node.target} on random inputs; it is not a candidate", stacklevel=2)
                    continue
                runs[c.name] = run
            replayed = self.replayed(node)
            timings = self.bench(runs, replayed)
            if replayed and any(t is None for t in timings.values()):
                # a candidate a CUDA graph cannot capture: the graph would run uncaptured with it, so all are
                # timed as calls (one unit for all)
                return self.bench(runs, False), False
        return timings, replayed

    def replayed(self, node) -> bool:
        """Whether the node's graph will be replayed in a CUDA graph: `cudagraphs=True` and static shapes
        (cudagraphs.why_not: a graph with symbolic sizes is not captured; CPU graphs are never timed)."""
        inputs = [n.meta.get("val") for n in node.graph.nodes if n.op == "placeholder"]
        return self.backend.cudagraphs and is_static(inputs, {})

    def compile(self, candidate: Candidate, node):
        """The candidate on its own, compiled as the backend compiles a graph: traced, lowered (its ops by
        themselves, no choices), the pipeline, the Triton backend, its kernels by rule (`bands=False`: no
        configuration band timed at a candidate's first run). Returns the runner, its binaries not yet
        built (`_build_side_by_side`), or the exception that stopped it (the candidate is then dropped)."""
        from .triton.runner import TritonRunner

        be = self.backend
        try:
            graph = SchedulerGraph.from_program(lower_graph(trace(candidate, node)))
            target = Target.of(graph)
            graph, _ = PassManager(be.pipeline, verify=be.verify).run(graph, None, f"{node.name}:{candidate.name}",
                                                                        target)
            return TritonRunner(graph, interpret=target.device != "cuda", variant=be.kernel_variant,
                                cache=KernelCache(be.cache_dir), autotune=be.autotune, precompile=False, bands=False)
        except Exception as e:  # noqa: BLE001 - measure() warns and drops the candidate
            return e

    def bench(self, runs: dict, replayed: bool) -> dict[str, float | None]:
        """Milliseconds of one call of each of `runs` (by name) as its graph will run: replayed in a CUDA
        graph, its GPU time alone (`gpu_ms`; None where it cannot be captured); else back-to-back calls, host
        included (`calls_ms`, the candidates' rounds interleaved)."""
        return {name: gpu_ms(run) for name, run in runs.items()} if replayed else calls_ms(runs)


def _build_side_by_side(runners: list) -> None:
    """Each runner's binaries built before its first call (`TritonRunner.precompile`), the runners' at once: each
    waits on its compiles (in the pool's worker processes, outside this GIL), so a node's candidates compile side
    by side instead of one after the other: on an H200's host ConvNeXt-style's backward, which times decompose-K
    at four weight-gradient shapes, spent 3.41 s of its first call lowering with them compiled one after the other,
    2.68 s built side by side (fifty-sixth session, docs/benchmarks.md). Each thread runs in a copy of this context
    (the compile's settings). A runner whose build raises is left to build at its first call, where `measure`
    drops it if it fails again. (Two candidates with an equal kernel build it twice: rare, and only time.)"""
    def build(context, runner):
        with contextlib.suppress(Exception):
            context.run(runner.precompile)

    with ThreadPoolExecutor(max_workers=max(1, len(runners))) as side:
        list(side.map(build, [contextvars.copy_context() for _ in runners], runners))


def call_ms(run, rounds: int = 5, round_s: float = 0.01) -> float:
    """`calls_ms` of one `run`."""
    return calls_ms({"run": run}, rounds, round_s)["run"]


def calls_ms(runs: dict, rounds: int = 5, round_s: float = 0.01) -> dict[str, float]:
    """Milliseconds a call of each of `runs` (by name) takes issued back to back, as a graph without CUDA graphs
    runs: the wall time of about `round_s` of calls and a synchronization, over the calls; the median of `rounds`
    rounds, round r of every run before round r + 1 of any (a host that speeds up or slows down during the
    timing — clocks, other processes — then moves every run's rounds alike, not only the last run's).
    Where the host's work for a call (a wrapper, an extern's dispatch, a launch: 20-60 µs a call on the lent
    H100's host) exceeds the GPU's, this is the host's time: a candidate that saves GPU µs with more host work
    (decompose-K's bmm and sum: +48 µs of host for -2.5 µs of GPU at 32 x 28672 x 32) loses here, and wins
    only under CUDA graphs, where the host's work is gone (docs/benchmarks.md, *Choices*)."""
    import statistics
    import time

    calls, times = {}, {name: [] for name in runs}
    for name, run in runs.items():
        run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        calls[name] = max(10, min(1000, int(round_s / max(1e-7, time.perf_counter() - t0))))
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                run()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / calls[name])
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


REPLAYED_CALLS = 10  # calls of a candidate captured in the CUDA graph whose replays are timed


def gpu_ms(run, calls: int = REPLAYED_CALLS) -> float | None:
    """Milliseconds of GPU time one call of `run` takes: do_bench's median of replays of a CUDA graph of `calls`
    calls, over `calls` (L2 is flushed before each replay, not between its calls). A candidate's host work — a
    compiled graph's wrapper, an extern's Python, Triton's launch — is not in the time: at these sizes a call
    costs the host 10-100 µs, more than the GPU's few µs, and do_bench of the call itself measured that instead
    (docs/benchmarks.md, *Choices*). None where `run` cannot be captured (an op that synchronizes with the
    host): the caller's stream is current again (`cudagraphs.capturing`)."""
    from triton.testing import do_bench

    from .cudagraphs import capturing

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm, as capture wants: first-call work done off the graph
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with capturing(graph):
            for _ in range(calls):
                run()
    except Exception:  # noqa: BLE001 - not capturable
        torch.cuda.synchronize()
        return None
    ms = float(do_bench(graph.replay, return_mode="median")) / calls
    del graph
    return ms


def random_like(args, kwargs):
    """(args, kwargs) with each tensor replaced by a random one of its shape, strides, dtype and device:
    standard normal floats (zeros of other dtypes), from a generator seeded for the purpose."""
    leaves, spec = tree_flatten((args, kwargs))
    made = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            # the storage the strides reach, filled, then viewed: strides with gaps or overlaps included
            extent = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if n > 0)
            if v.is_floating_point():
                gen = torch.Generator(device=v.device).manual_seed(0)
                base = torch.randn(extent, generator=gen, dtype=v.dtype, device=v.device)
            else:
                base = torch.zeros(extent, dtype=v.dtype, device=v.device)
            v = base.as_strided(v.shape, v.stride())
        made.append(v)
    return tree_unflatten(made, spec)


def _matmul_precision(dtype: torch.dtype) -> torch.dtype:
    """The dtype whose tolerance a float32 product is checked with: float32 matmuls may run on TF32 (inputs
    rounded to float16's 10 mantissa bits, `torch.set_float32_matmul_precision("high")`) or on bfloat16
    ("medium"), in the op and in a candidate alike, each rounding its own way."""
    if dtype != torch.float32:
        return dtype
    return {"high": torch.float16, "medium": torch.bfloat16}.get(torch.get_float32_matmul_precision(), dtype)


def _first_output(runner, tensors):
    return lambda: runner(*tensors)[0]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
