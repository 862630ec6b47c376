"""aot_autograd's results on disk for passline's graphs: a second process skips its tracing and partitioning.

A training script's first step, in a process after one that compiled the same model, spent most of passline's
time in aot_autograd (GPT-2-style on an H200: 2.4 of 4.2 s; Inductor's whole warm first step was 2.0 s): it
traces the joint forward and backward again, functionalizes, partitions, and only then hands passline the graphs
whose scheduled forms the graph cache (graph_cache.py) already holds. torch keeps aot_autograd's results across
processes (its AOTAutogradCache) where the compiler hands back an `OutputCode`, an object that can be pickled and
loaded again; Inductor's warm compiles start there. passline hands it a `PasslineOutput`: the aten graph and the
key of its scheduled form in the graph cache. On a hit torch unpickles the runtime metadata aot_autograd
computed (inputs' mutations, aliases, what the backward saves) and calls `post_compile`, which builds the
runner from the graph cache, as a compile whose graph-cache lookup hit does — a backward's at its first call, as
a compile builds it; if an entry is gone the load is a miss and the graphs are traced and compiled (and stored)
again. On by default (`passline.backend(aot_cache=False)`, `PASSLINE_AOT_CACHE=0`): on an H200 the warm first
step of GPT-2-style went from 4.8-4.9 to 3.9-4.0 s (docs/backends.md, *aot_autograd's cache*).

torch's key names the captured graph, its inputs' metadata, torch's version and configuration. What else the
result depends on is passline's (`graph_cache.backend_key`: the package's source, with its decomposition table and
partition function, the pipeline, settings, device), which enters torch's key as the `uuid` of a custom graph
pass set in Inductor's configuration for the call: torch hashes that configuration into the key, and a custom
pass's uuid is the one slot of it meant for a caller's code, in torch 2.11 and 2.13 alike. The entry is written
where aot_autograd has both graphs: for a training graph at the first backward, which compiles the backward
(lazily, as before: a forward run without a backward compiles none), outside that call; aot_autograd writes it
bundled (passline's OutputCode inside, not Inductor's keys) only while its `bundled_autograd_cache` setting is
on, so the backward's compile turns it on and the backward's first call, which follows the write, restores it
(`_bundled_until_called`).

Not cached: whatever the graph cache does not keep (graph_cache.enabled: off, or something observes the
pipeline; passes, lowerings or choices from outside passline; passline files edited since import), a captured
graph holding a tensor of its own (a `get_attr`: torch's key names it by shape and dtype, not values; a review's
worry, which torch 2.13 itself bypasses where it was tried, kept out here regardless), graphs with
sizes decided at run time (dynamic shapes: the graph cache keys them by their traced sizes, which a hit would
not check), graphs that order effects with a token (`with_effects`: torch.linalg's checks; a loaded entry called
the graph without the token's slot), graphs whose tensor inputs share memory (torch's key does not say which
do), graphs calling an op from outside torch and passline (torch's key names it, not its code: its autograd
formula is traced into the backward), graphs taking a Python number as a tensor (its value may be baked into the
traced graphs; torch's key does not name it), and any graph passline ran eagerly (a fallback): its OutputCode refuses to
be saved, so the whole entry is not written. torch's `torch.compiler.config.force_disable_caches` and
TORCHINDUCTOR_AUTOGRAD_CACHE=0 turn it off too.

This module is the only one that touches these interfaces of torch, which are not public (`OutputCode`,
`SerializableAOTDispatchCompiler`, the cache's exceptions and configuration, the tracing context's metadata:
`donate_nothing`): where they are missing or differ, `available()` is False and every graph is traced as before.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading

import torch

from ..lowering import retrace
from . import graph_cache

try:
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, FXGraphCacheMiss
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.output_code import OutputCode

    _IMPORTED = True
except ImportError:  # another torch: graphs are traced at every compile
    _IMPORTED = False
    OutputCode = CustomGraphPass = object


def available() -> bool:
    import torch._functorch.config as functorch_config

    return _IMPORTED and all(hasattr(functorch_config, name) for name in _FUNCTORCH_PATCH)


# aot_autograd's settings for a call whose results may be cached: entries bundle passline's OutputCode (not
# Inductor's FX graph cache keys)
_FUNCTORCH_PATCH = {"bundled_autograd_cache": True}


class _Loading:
    """What a load inside one aot_autograd call needs: the backend and the FX stage of the captured graph, and
    the reports of graphs loaded so far (withdrawn if a later graph of the same entry misses)."""

    def __init__(self, backend, fx):
        self.backend, self.fx, self.reports = backend, fx, []


_LOADING: contextvars.ContextVar[_Loading | None] = contextvars.ContextVar("passline_aot_loading", default=None)


class _PasslineKey(CustomGraphPass):
    """Carries passline's part of the key into torch's (never run: Inductor is not called)."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, graph) -> None:
        return None

    def uuid(self) -> str:
        return f"passline {self.key}"


@contextlib.contextmanager
def caching(backend, fx, key: str):
    """aot_autograd's cache for the call inside, under passline's `key` (graph_cache.backend_key)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    token = _LOADING.set(_Loading(backend, fx))
    try:
        with functorch_config.patch(_FUNCTORCH_PATCH), \
                inductor_config.patch(post_grad_custom_post_pass=_PasslineKey(key)), _inductor_backends_unregistered():
            yield
    finally:
        _LOADING.reset(token)


# torch's key (Inductor's FxGraphHashDetails, which aot_autograd's cache details extend) registers Inductor's
# code generators for every device before it reads their custom passes (`init_backend_registration`): an import
# of all of Inductor's codegen, 0.4 s of a warm ResNet-style first call on this CPU (2.2 against 2.6 s), that a
# passline process needs for nothing else. What the registration adds to the key is a None per device (Inductor's
# own backends carry no custom pass) and passline's key holds everything passline's results depend on
# (`_PasslineKey`), so while passline's call computes the key the registration is skipped, and the key reads the
# devices' custom passes without those Nones: the same key whether or not Inductor registered its backends in this
# process (a process that had run an Inductor graph first otherwise keyed passline's graphs apart, and missed).
# A pass another library registered for a device stays in the key; Inductor registers its backends itself
# wherever it compiles, and a key Inductor computes meanwhile in another thread is at worst a miss of its cache.
_UNREGISTERED = threading.Lock()
_unregistered: dict = {"calls": 0}  # the calls inside, and what they replaced in codecache's namespace


def _registered_nothing() -> None:
    return None


@contextlib.contextmanager
def _inductor_backends_unregistered():
    try:
        from torch._inductor import codecache
    except ImportError:  # pragma: no cover - another torch
        yield
        return
    passes = getattr(codecache, "custom_backend_passes", None)
    if not callable(getattr(codecache, "init_backend_registration", None)) or not isinstance(passes, dict):
        yield  # a torch whose key does not register them here
        return
    with _UNREGISTERED:
        if _unregistered["calls"] == 0:
            _unregistered["saved"] = codecache.init_backend_registration, passes
            codecache.init_backend_registration = _registered_nothing
            codecache.custom_backend_passes = {d: p for d, p in passes.items() if p is not None}
        _unregistered["calls"] += 1
    try:
        yield
    finally:
        with _UNREGISTERED:
            _unregistered["calls"] -= 1
            if _unregistered["calls"] == 0:
                codecache.init_backend_registration, codecache.custom_backend_passes = _unregistered.pop("saved")


def donate_nothing() -> None:
    """Tell aot_autograd that the forward being compiled gives its backward no donated buffers.

    aot_autograd marks the saved tensors a backward may reuse in place ("donated": Inductor's backward writes
    into them), and then refuses a `backward(retain_graph=True)` once the backward was compiled by an ordinary
    one — a step, then a step that retains its graph, raised. passline never reuses a saved tensor that way
    (a kernel writes over an input only where no one else holds it, `sole()` at the call: a retained graph holds
    its saved tensors), so its graphs donate nothing. Through the tracing context, where aot_autograd keeps the
    forward's metadata while its compiler runs (a graph with tensor subclasses keeps another, left as it is)."""
    with contextlib.suppress(Exception):
        from torch._guards import TracingContext

        meta = getattr(TracingContext.try_get(), "fw_metadata", None)
        if getattr(meta, "bw_donated_idxs", None):
            meta.bw_donated_idxs = []


def share_triton_key(example_inputs, cache_dir) -> None:
    """Hand torch's cache key the Triton key passline remembers (triton/precompile.py): torch's key names
    Triton's, which hashing libtriton gives in 0.4-0.5 s of a warm first call. For graphs of GPU tensors."""
    if not any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs):
        return
    from pathlib import Path

    from .triton.precompile import remembered_triton_key

    key = remembered_triton_key(Path(cache_dir))
    if key is None:
        return
    with contextlib.suppress(Exception):  # torch 2.13's memo takes a value; 2.11's reads Triton's (adopted)
        from torch._inductor import codecache

        codecache.triton_key.set(key)


# ops whose definitions torch's key covers (torch's own: its version is in the key) or passline's does (its source)
_KEYED_NAMESPACES = frozenset({"aten", "prims", "higher_order", "_c10d_functional", "c10d_functional", "_dtensor",
                               "profiler", "passline"})


def _namespace(op) -> str:
    name = op._qualified_op_name if isinstance(op, torch._ops.OpOverloadPacket) else op.name()
    return name.split("::")[0]


def cacheable(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether the captured graph may be cached: no tensor held by the graph itself (torch's key names such a
    constant by its metadata, not its values), inputs of static sizes (no SymInt, symbolic size or stride), no two
    tensor inputs sharing memory, and no op from outside torch and passline. torch's key holds each input's metadata
    but not which inputs alias (an entry traced for distinct inputs, one written in place, was loaded for a view of
    the other: the write unseen), and names a library's op but not its code (its autograd formula or decomposition,
    which aot_autograd traces into the graphs: an edited formula's gradients came from the old one). Found by the
    forty-sixth session's campaign, with Inductor's entries as wrong; such graphs are traced at every compile.

    Nor a Python number dynamo passes as a 0-d tensor (a float that changed between calls: `GraphArg`'s
    `pass_arg_as_tensor`): aot_autograd may bake its value into the graphs it traces (a clamp's bounds, guarded and
    recompiled at the next value) while torch's key names that input by its metadata alone, so an entry traced at
    one value was loaded at another — a clamp's bound and ELU's alpha wrong, in one process and across two (the
    sixty-first session's campaign)."""
    if any(isinstance(getattr(gm, str(n.target), None), torch.Tensor) for n in gm.graph.find_nodes(op="get_attr")):
        return False
    if any(getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False) for n in gm.graph.find_nodes(op="placeholder")):
        return False
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) \
                and _namespace(n.target) not in _KEYED_NAMESPACES:
            return False
    storages = set()
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return False
        if isinstance(x, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(), x.storage_offset())):
                return False
            try:
                storage = x.untyped_storage()._cdata
            except Exception:  # noqa: BLE001 - a tensor without storage of its own (a subclass): not cached
                return False
            if storage in storages:
                return False
            storages.add(storage)
    return True


def _bundled_until_called(output: PasslineOutput) -> None:
    """aot_autograd's `bundled_autograd_cache` on from a lazily compiled backward's return until its first call:
    aot_autograd writes the entry in between, outside passline's `caching` (where the setting is on anyway)."""
    import torch._functorch.config as functorch_config

    if functorch_config.bundled_autograd_cache:
        return
    functorch_config.bundled_autograd_cache = True
    fn = output.fn

    def first(inputs):
        functorch_config.bundled_autograd_cache = False
        output.fn = fn
        return fn(inputs)

    output.fn = first


def output(fn, gm: torch.fx.GraphModule, kind: str, graph_key: str | None) -> PasslineOutput:
    """`fn`, a compiled `kind` graph, as aot_autograd's cache keeps it."""
    out = PasslineOutput(fn, gm, kind, graph_key)
    if kind == "backward" and graph_key is not None:
        _bundled_until_called(out)
    return out


def serializable(compiler):
    """`compiler` as aot_autograd's cache wants it: one that returns an OutputCode."""
    return SerializableAOTDispatchCompiler(PasslineOutput, compiler)


class PasslineOutput(OutputCode):
    """A compiled aten graph as aot_autograd's cache keeps it: `fn` (the boxed callable) in this process; the
    graph, its kind, its inputs' metadata and its graph-cache key on disk (`graph_key` None: not to be saved)."""

    def __init__(self, fn, gm: torch.fx.GraphModule, kind: str, graph_key: str | None):
        self.fn, self.gm, self.kind, self.graph_key = fn, gm, kind, graph_key
        # aot_autograd calls it with the argument list, which the runner takes over; an attribute of the
        # instance, which the wrappers torch puts around a backward copy (functools.wraps), not of the class
        self._boxed_call = True
        self.meta = dict(gm.meta)  # (a pickled GraphModule keeps its code, not its meta: partition.SAVED_FROM)
        # nor its nodes' traced values: lowering makes them again from its inputs' (lowering/retrace.py)
        self.inputs = retrace.input_values(gm)

    def __call__(self, inputs):
        return self.fn(inputs)

    def prepare_for_serialization(self) -> None:
        if self.graph_key is None:
            raise BypassAOTAutogradCache(f"passline did not store its {self.kind} graph's scheduled form")
        if self.gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.with_effects):
            # effect tokens (torch.linalg's checks): a loaded entry called the graph without the token's slot
            # in its arguments (every input one place off: "size of tensor a (6) must match ... (4)")
            raise BypassAOTAutogradCache(f"passline's {self.kind} graph orders effects with a token")
        self.fn = None  # (on a copy: torch pickles it, the process keeps running the original)

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        loading = _LOADING.get()
        if loading is None:  # unpickled outside passline's compile: nothing to build it with
            raise BypassAOTAutogradCache("a passline graph loaded outside a passline backend")
        self.gm.meta.update(self.meta)
        self.gm.meta[retrace.INPUT_VALUES] = self.inputs
        backend, fx = loading.backend, loading.fx
        if self.kind == "backward":
            # built at its first call, as a compile builds it (the reports' order and names are a fresh
            # compile's: a model with graph breaks runs its backwards last-first), once its scheduled graph
            # is known to be there
            if not graph_cache.GraphCache(backend.cache_dir).has(self.graph_key):
                self._withdraw(loading)
                raise FXGraphCacheMiss(f"passline's graph cache has no backward graph {self.graph_key}")
            self.fn = self._built_at_first_call(backend, fx)
            return
        loaded = backend.load_aten(self.gm, self.kind, fx, self.graph_key)
        if loaded is None:  # the scheduled graph is no longer in the graph cache: compiled and stored again
            self._withdraw(loading)
            raise FXGraphCacheMiss(f"passline's graph cache has no {self.kind} graph {self.graph_key}")
        self.fn, report = loaded
        loading.reports.append(report)

    @staticmethod
    def _withdraw(loading: _Loading) -> None:
        """The reports of graphs this entry loaded before one missed: the compile that follows makes them again."""
        for report in loading.reports:
            loading.backend.reports.remove(report)
        loading.reports.clear()

    def _built_at_first_call(self, backend, fx):
        def first(inputs):
            gm = self.gm
            loaded = backend.load_aten(gm, self.kind, fx, self.graph_key)
            if loaded is not None:
                self.fn = loaded[0]
            elif self.inputs is not None:  # gone from the graph cache since the load: lowered and scheduled
                runner = backend.compile_aten(gm, retrace.fake_inputs(self.inputs), self.kind, fx)
                self.fn = backend._callable(runner, gm, self.kind)
            else:
                raise RuntimeError(f"passline's scheduled backward graph {self.graph_key} went from the graph "
                                   "cache after aot_autograd's cache loaded it, and its inputs' sizes are unknown")
            return self.fn(inputs)

        return first

    def set_triton_bundle(self, triton_bundle) -> None:
        return None
