"""Scheduled graphs on disk across processes: an aten graph's lowering and pass pipeline run once.

A second process that compiles the same model (a restarted training script) gets from dynamo and aot_autograd
the same aten graphs; lowering them and running the pipeline again would give the same SchedulerGraph. The dynamo
backend (`Backend._compile_aten`) asks `GraphCache.load` first and, on a miss, stores what the pipeline made
(`store`): the graph, the scheduler passes' records, the node count before them and their metrics. What comes
after — the Triton runner's kernels, their binaries and tuning choices — has caches of its own
(`triton/cache.py`, Triton's).

The key is everything the result depends on, so that a hit is the graph the pipeline would make now:

- the aten graph: its code, and every node's traced value (shape, strides, dtype, device: lowering reads them),
  the size symbols' lower bounds and traced values (`lowering.sizes.size_facts`), the bytes of every tensor
  constant;
- the pipeline's `cache_key` (its text, every option, the source of each pass's module), the source of every
  file of the passline package (lowering, IR, verifier), the code of lowerings and choices registered from
  outside passline, the backend's choice overrides, codegen, autotuning and CUDA-graph modes (a choice is timed
  by calls or by GPU time), `verify`, torch's deterministic-algorithms flag (lowering reads it), the device (its
  name and SM count) and the torch and Python versions.

Not cached (each compile runs the pipeline): graphs whose constants exceed `MAX_CONSTANT_BYTES`; a pipeline with a
pass from outside passline, or a graph calling an op with a lowering or choice from outside passline (what such code
computes may lie in modules and values the key does not name; until the thirty-seventh session it was cached under its
module's source, and a helper edited beside a user's pass went unseen); a process whose passline files changed after
it imported them (package_hash would name code it does not run); and backends that observe or limit the pipeline
(instruments, dumps, metric tables, pass or decision limits: bisection, the accuracy guard, capture). A graph that
cannot be pickled (an extern call of a Python function) is not stored. An entry that fails to load is a miss.

On by default since the twenty-ninth session; `passline.backend(graph_cache=False)` or `PASSLINE_GRAPH_CACHE=0`
turns it off. A key can only be as complete as what it names: a review of this module found five ways (all
closed, all tested) in which a hit could have been a graph the pipeline would no longer make — a flag lowering
reads from torch, a closure, a file edited after import — so it stayed a user's choice until a conformance
campaign had run with it on: the whole test suite twice with one cache directory (1337 tests; the second run
loaded every one of the first's 2616 graphs and passed). Entries live beside the kernel cache
(`$PASSLINE_CACHE_DIR/graphs`, private to the user: entries are unpickled).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import os
import pickle
import platform
import re
import tempfile
import uuid
from pathlib import Path

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

MAX_CONSTANT_BYTES = 64 << 20  # tensor constants hashed into a key at most (a frozen model's weights: not cached)
MAX_ENTRIES = 4096  # graphs kept; past it the least recently used quarter goes (an edit of passline changes every key)
_FORMAT = "passline graph cache 1"


def _package_files() -> list:
    root = Path(__file__).resolve().parents[1]
    return [(p, str(p.relative_to(root))) for p in sorted(root.rglob("*.py"))]


def _stamps() -> tuple:
    out = []
    for p, rel in _package_files():
        try:
            st = p.stat()
            out.append((rel, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((rel, None, None))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def package_hash() -> str:
    """A hash of every Python file of the passline package (read once a process): an edit anywhere in lowering,
    the IR or the passes changes every key."""
    h = hashlib.sha256()
    for path, rel in _package_files():
        h.update(rel.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# Taken when passline is imported (backends.dynamo imports this module): the files the running code came from.
# A file edited later (a pull, an editor, while a notebook or a training job runs) makes package_hash describe
# code this process does not run: such a process neither stores nor loads (`_edited_since_import`).
_IMPORT_STAMPS = _stamps()
package_hash()


def _edited_since_import() -> bool:
    return _stamps() != _IMPORT_STAMPS


def _consts(code) -> str:
    """A code object's constants, nested code by its own bytecode and constants (repr holds an address)."""
    return "(" + ", ".join(f"<{c.co_name} {c.co_code.hex()} {_consts(c)}>" if hasattr(c, "co_code") else repr(c)
                           for c in code.co_consts) + ")"


def _code(fn) -> str:
    """What identifies a function defined outside passline: its module, name, bytecode and constants."""
    if fn is None:
        return ""
    code = getattr(fn, "__code__", None)
    consts = _consts(code) if code is not None else ""
    return (f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))} "
            f"{code.co_code.hex() if code is not None else ''} {consts}")


def _outside_passline(fn) -> bool:
    return not (getattr(fn, "__module__", None) or "").startswith("passline.")


def _registrations() -> list:
    """Lowerings and choices registered from outside the passline package (passline's own are in
    `package_hash`), by their code."""
    from ..lowering.choices import registered
    from ..lowering.registry import LOWERINGS

    out = [(str(op), _code(fn)) for op, fn in LOWERINGS.items() if _outside_passline(fn)]
    for op, choices in sorted(registered().items()):
        out += [(op, name, c.fingerprint(), _code(c.fn), _code(c.applies), _code(c.variants))
                for name, c in sorted(choices.items()) if _outside_passline(c.fn)]
    return sorted(out, key=repr)


def _opaque(fn) -> bool:
    """Whether what `fn` computes may not be all in the code the key names: a pass, lowering or choice from outside
    passline. Its module's source is in the key (registry.PassInfo.source_hash), but not the helpers it imports
    from other modules nor the module-level values it reads, which a user edits between runs: a fixed helper
    beside a user's pass still loaded the buggy pass's schedule (an API campaign's find, thirty-seventh session).
    Such registrations are not cached; passline's own are, under package_hash."""
    return fn is not None and _outside_passline(fn)


def _uncacheable(backend, gm: torch.fx.GraphModule | None = None) -> bool:
    """Whether code from outside passline (`_opaque`) would compile `gm` under `backend`: a pass of its pipeline,
    or a lowering or choice of an op the graph calls (every registered one where `gm` is None)."""
    from ..lowering.choices import registered
    from ..lowering.registry import LOWERINGS

    ops = None if gm is None else {n.target for n in gm.graph.nodes if n.op == "call_function"}
    names = None if ops is None else {getattr(t, "_opname", None) for t in ops}  # choices are by op name ("mm")
    fns = [call.info.source_of for call in backend.pipeline.calls()]
    fns += [getattr(call.info, "run", None) for call in backend.pipeline.calls()]
    fns += [f for op, f in LOWERINGS.items() if ops is None or op in ops]
    fns += [f for op, cs in registered().items() if names is None or op in names
            for c in cs.values() for f in (c.fn, c.applies, c.variants)]
    return any(_opaque(getattr(f, "__func__", f)) for f in fns if callable(f) and not inspect.isclass(f))


def _value(v) -> str:
    """A traced value as lowering sees it: a tensor's shape, strides, offset, dtype and device; else its text."""
    if isinstance(v, torch.Tensor):
        return (f"T{tuple(str(s) for s in v.shape)}{tuple(str(s) for s in v.stride())}+{v.storage_offset()} "
                f"{v.dtype} {v.device} {v.requires_grad}")
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    return f"{type(v).__name__}:{v}"


def _target(target) -> str:
    """A node's target by name: a Python function's default text holds its address, which differs per process."""
    if callable(target) and not isinstance(target, torch._ops.OpOverload):
        return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"
    return str(target)


def _graph_text(gm: torch.fx.GraphModule) -> str | None:
    """The aten graph's code and every node's traced value; None where its tensor constants are too large to
    hash (the key would cost more than the pipeline)."""
    parts = [gm.code]
    constants = 0
    for n in gm.graph.nodes:
        parts.append(f"{n.op} {n.name} {_target(n.target)} {_value(n.meta.get('val'))}")
        if n.op == "get_attr":
            value = getattr(gm, str(n.target), None)
            if isinstance(value, torch.Tensor):
                constants += value.numel() * value.element_size()
                if constants > MAX_CONSTANT_BYTES:
                    return None
                with unset_fake_temporarily():  # compiles run under FakeTensorMode; a constant is a real tensor
                    data = value.detach().cpu().contiguous().reshape(-1)  # a 0-dim tensor has no byte view
                    parts.append(hashlib.sha256(data.view(torch.uint8).numpy().tobytes()
                                                if data.numel() else b"").hexdigest())
            else:
                parts.append(repr(value))
    return "\n".join(parts)


def _device(devices) -> str:
    """The GPU of `devices` (a graph's tensors'), by name, and the target the passes plan for
    (`Target.of_devices`: its SM count), or "cpu"."""
    from ..pipeline.target import Target

    devices = set(devices)
    target = Target.of_devices(devices)
    # the device the target is of (the first CUDA one by index), not whichever a set yields first
    gpu = min((d for d in devices if d.type == "cuda"), key=lambda d: d.index or 0, default=None)
    return f"{torch.cuda.get_device_properties(gpu).name if gpu is not None else 'cpu'} {target}"


def graph_key(gm: torch.fx.GraphModule, backend) -> str | None:
    """The key of `gm`'s scheduled graph under `backend` (see the module doc), or None: not to be cached."""
    from ..lowering.sizes import size_facts

    if _uncacheable(backend, gm):
        return None
    devices = {v.device for n in gm.graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)}
    settings = _settings_key(backend, devices)
    text = _graph_text(gm) if settings is not None else None
    if text is None:
        return None
    bounds, hints = size_facts(gm)
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))  # the ShapeEnv's symbols this graph uses
    bounds = {k: v for k, v in bounds.items() if str(k) in named}
    hints = {k: v for k, v in hints.items() if str(k) in named}
    return _hash((settings, repr(sorted((str(k), str(v)) for k, v in bounds.items())),
                  repr(sorted((str(k), str(v)) for k, v in hints.items())), text))


def backend_key(backend, devices) -> str | None:
    """What, besides a captured graph and torch's own state, decides the graphs `backend` makes of it on
    `devices`: passline's part of aot_autograd's cache key (aot_cache.py), or None (not to be cached). Any
    lowering or choice from outside passline refuses, the graph's ops being unknown before aot_autograd."""
    if not enabled(backend) or _uncacheable(backend):
        return None
    settings = _settings_key(backend, set(devices))
    return None if settings is None else _hash(("aot_autograd", settings, _ambient_state()))


# torch.backends.cuda's switches of scaled_dot_product_attention, read where aot_autograd decomposes it: which
# implementation the graph calls, and whether the math path keeps bfloat16/float16 reductions or upcasts them
_SDPA_SWITCHES = ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
                  "fp16_bf16_reduction_math_sdp_allowed")


def _ambient_state() -> tuple:
    """What aot_autograd traces under that neither dynamo's graph shows nor dynamo guards: the autocast dtype of
    each device where autocast is on (a `torch.autocast` around the compiled call), the default dtype (a factory
    call without one), SDPA's backend switches and opt_einsum's (the contraction order einsum is decomposed in).
    torch 2.11's key holds only whether any autocast is on: an entry traced under bfloat16's autocast was loaded
    for float16's (on the H200, a float16 training step after a bfloat16 one, the same cache, came out as far from
    float64 as bfloat16's). torch 2.13 keys autocast and the default dtype itself, neither torch the switches (a
    bfloat16 attention traced with reduced-precision math reductions allowed was loaded where they were not:
    three times eager's error). passline's part of the key holds them all, on every torch."""
    devices = getattr(torch._C, "_autocast_supported_devices", lambda: ["cpu", "cuda"])()
    state = [str(torch.get_default_dtype())]
    for device in devices:
        with contextlib.suppress(Exception):  # a device type this torch cannot ask about
            if torch.is_autocast_enabled(device):
                state.append((device, str(torch.get_autocast_dtype(device))))
    for name in _SDPA_SWITCHES:
        with contextlib.suppress(Exception):  # a switch this torch does not have
            state.append((name, bool(getattr(torch.backends.cuda, name)())))
    with contextlib.suppress(Exception):
        einsum = torch.backends.opt_einsum
        state.append(("opt_einsum", bool(einsum.enabled), str(einsum.strategy) if einsum.enabled else None))
    return tuple(state)


def _settings_key(backend, devices: set) -> str | None:
    """The part of a key that is not the graph: passline's code, the pipeline, the backend's settings, the
    device, torch's flags lowering reads; None where passline's files changed since import."""
    if _edited_since_import():
        return None
    return _hash((_FORMAT, torch.__version__, platform.python_version(), package_hash(), backend.pipeline.cache_key(),
                  repr(_registrations()), repr(sorted(backend.choice_overrides.items())), backend.codegen,
                  backend.autotune, backend.cudagraphs, backend.verify, _device(devices),
                  # lowering asks torch (indexing.scatter_into: no float atomic adds under deterministic algorithms)
                  torch.are_deterministic_algorithms_enabled(),
                  torch.get_float32_matmul_precision()))  # the chooser's agreement tolerance (choosing.agree)


def _hash(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _op(namespace: str, name: str, overload: str):
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _unevaluated(cls, args: tuple):
    return cls(*args, evaluate=False)


class _Pickler(pickle.Pickler):
    """Pickles aten ops by name (an OpOverload is not picklable itself), and sympy's Max and Min as they are:
    sympy rebuilds an expression through its constructor, which for Max and Min compares every pair of
    arguments under assumptions again (21 of them took 0.12 s of a warm ResNet-style process's two graph
    loads on this CPU). Their arguments are a Max's own, already ordered and reduced: built unevaluated, the
    same expression (equal, the same hash)."""

    def reducer_override(self, obj):
        if isinstance(obj, torch._ops.OpOverload):
            return _op, (obj.namespace, obj._opname, obj._overloadname)
        if isinstance(obj, (sympy.Max, sympy.Min)):
            return _unevaluated, (type(obj), obj.args)
        return NotImplemented


class GraphCache:
    """Scheduled graphs under `directory/graphs`, one file a key, written atomically."""

    def __init__(self, directory):
        self.dir = Path(directory) / "graphs"

    def load(self, key: str) -> dict | None:
        path = self.dir / f"{key}.pkl"
        try:
            with path.open("rb") as f, unset_fake_temporarily():  # a constant's tensor is real
                entry = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a truncated or stale entry is a miss, rebuilt and stored again
            return None
        if not (isinstance(entry, dict) and entry.get("format") == _FORMAT):
            return None
        from ..ir.index import adopt_vars, derived_symbol

        # a derived size's definition lives in a registry of the process that lowered it (ir.index._DERIVED),
        # which the runners read to bind it: made again here, as lowering would have
        if any(derived_symbol(d).name != name for name, d in entry.get("derived", ())):
            return None
        # so are the kinds of passline's symbols (loop variables, sizes: ir.index._VARS), which the runners ask
        # (`var_kind`) of symbols this process may never have made: registered as the storing process had them
        adopt_vars(entry.get("vars", ()))
        with contextlib.suppress(OSError):  # recently used: kept longest
            os.utime(path)
        return entry

    def load_made(self, key: str, entry_id: str, made_key: str) -> dict | None:
        """What the Triton runner built the kernels of the graph stored under `key` as entry `entry_id` (the id
        `store` gave it) from, for `made_key` (`runner.made_key`: target, generator), as an earlier process kept
        it (`store_made`); None where there is none or it fails to load. Named by the entry, not the key alone:
        two processes that missed at once may each store their own graph under one key (a choice timed on each
        GPU before either stored its pick), and one's graph must never meet the other's kernels."""
        try:
            with (self.dir / f"{key}.{entry_id}.{made_key}.made").open("rb") as f, unset_fake_temporarily():
                made = pickle.load(f)
        except Exception:  # noqa: BLE001 - none, truncated or stale: generated again (and stored again)
            return None
        return made if isinstance(made, dict) else None

    def store_made(self, key: str, entry_id: str, made_key: str, made: dict) -> bool:
        """Keep `made` (node name -> runner.StepMade) beside entry `entry_id` of graph `key`: a later compile
        builds the graph's kernels from it instead of generating their sources again (0.07-0.43 s a graph on
        the H200 host). Removed with the entry (`_evict`)."""
        return self._write(f"{key}.{entry_id}.{made_key}.made", made)

    def has(self, key: str) -> bool:
        """Whether an entry is stored under `key` (it may still fail to load)."""
        return (self.dir / f"{key}.pkl").is_file()

    def store(self, key: str, **entry) -> str | None:
        """Store `entry` (graph, records, nodes_before, metrics) under `key`, with an id of its own (which `load`
        gives back as `entry["id"]`); the id, or None where it cannot be pickled or written."""
        from ..ir.index import derived_definition, known_vars

        entry["derived"] = [(sym.name, derived_definition(sym)) for sym in getattr(entry.get("graph"), "derived", ())]
        entry["vars"] = known_vars()
        entry_id = uuid.uuid4().hex
        if not self._write(f"{key}.pkl", {"format": _FORMAT, **entry, "id": entry_id}):
            return None
        with contextlib.suppress(OSError):
            self._evict()
        return entry_id

    def _write(self, name: str, obj) -> bool:
        buf = io.BytesIO()
        try:
            with unset_fake_temporarily():
                _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception:  # noqa: BLE001 - an extern of a Python function, a lambda: compiled each time
            return False
        try:
            # private, as the kernel cache: an entry is unpickled, so nobody else may write there
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(buf.getvalue())
            os.replace(tmp, self.dir / name)
        except OSError:  # a read-only or full cache directory: compiled each time, as without the cache
            return False
        return True

    def _evict(self) -> None:
        """Past MAX_ENTRIES, remove the least recently used quarter (by modification time: `load` touches), with
        what runners built from them (`store_made`) and what was built from entries gone before."""
        files = list(self.dir.iterdir())
        entries = [p for p in files if p.suffix == ".pkl"]
        if len(entries) <= MAX_ENTRIES:
            return
        made: dict = {}  # graph key -> its .made files (one directory listing: a glob per entry took ~10 s)
        for p in files:
            if p.suffix == ".made":
                made.setdefault(p.name.split(".", 1)[0], []).append(p)
        def mtime(p):
            try:
                return p.stat().st_mtime
            except OSError:  # removed by another process meanwhile
                return 0.0
        gone = sorted(entries, key=mtime)[:len(entries) - MAX_ENTRIES * 3 // 4]
        kept = {p.stem for p in entries} - {p.stem for p in gone}
        for p in [*gone, *(q for k, qs in made.items() if k not in kept for q in qs)]:
            with contextlib.suppress(OSError):
                p.unlink()


def enabled(backend) -> bool:
    """Whether `backend` uses the cache: unless turned off (`graph_cache=False`, `PASSLINE_GRAPH_CACHE=0`), and
    not where something observes or limits the pipeline."""
    if not backend.graph_cache:
        return False
    m = backend.manager
    return not (m.instruments or m.dump_dir or m.pass_limit is not None or m.decision_limits
                or backend.metric_tables or backend.check or backend.capture)


