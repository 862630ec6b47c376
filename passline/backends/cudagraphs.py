"""`passline.backend(cudagraphs=True)`: a compiled graph captured once into a CUDA graph and replayed.

Where the CPU bounds a step (small tensors, many kernels), replaying a captured graph issues all of a
graph's kernels with one launch. A graph is eligible when its tensors are on a GPU and its shapes are
static (a dynamic-shape graph would need one capture per size); otherwise the option is accepted and the
report's `cudagraphs` says why it is off.

Calls: the first runs the graph as it is (kernels compile and choose their configurations there); the
second captures it (a capture runs nothing) and replays it at once; later calls replay.

Memory. The graphs of one backend are captured into one memory pool (an `Arena`), one after the other, and
a capture uses the pool as an uncaptured call uses memory: each buffer is freed at its last use, inputs the
call alone holds included (a backward's saved activations: the call empties aot_autograd's list of them),
and a result may be written over such an input. So a backward's capture puts its buffers where the
forward's saved activations were, and the pool holds about what one uncaptured step holds at its peak.

Outputs. A capture's outputs are returned as they are; a replay returns tensors over the same memory
(`Slot`) that own none of it: the allocator counts a slot free once the capture's own tensors over it have
died, which is what lets the next capture reuse it. An output is an input (returned as the call's input,
or a view of it) only where it lies in that input's own storage: a capture may put an output where an
input it freed had been. Small outputs that reach the caller (a loss, up to `SMALL_BYTES`) are returned as
copies, so that a loss kept in a variable across steps blocks no replay; small ones saved for the backward
(a BatchNorm's per-channel statistics) are slots like any other. Storages of no bytes all lie at address
0: never slots, inputs or groups.

When a replay may write (`CudaGraphed._blocked`); holders are counted on tensors and on storage objects
(`t.untyped_storage()` kept without `t`):
  1. nothing holds this graph's outputs of its previous call;
  2. nothing holds outputs of graphs captured after it into the same pool (they may lie in its buffers);
  3. outputs of graphs captured before it that were free when it was captured (its buffers may lie in
     them) are free now, or held by nothing but this call's list of inputs; and each group of inputs over
     one storage that the call's list alone held at the capture (which may have freed it at its last use
     or written a result over it) is again held by the list alone.
Otherwise the call runs uncaptured, into fresh memory, and the report counts it — except where the only
outputs of a later capture it meets are this call's own inputs (the graph giving them was captured again
since): then this graph is captured again too.

Pools. A capture goes into the backend's pool only while no replay output in it is held (the allocator
cannot see those); otherwise into a new one. A pool no graph captures into any more is dropped once nothing
is over its slots; its memory lives as long as one of its CUDA graphs, and a backend dropped while a tensor
over one of its slots is still held (a `.grad`) leaves its graphs in `_KEPT` until nothing is.

Inputs. Parameters, outputs of the backend's captured graphs and inputs found at the same address on the
two calls before a capture (buffers) are read in place by the captured kernels; any other input is copied
into a static buffer before each replay (and copied back after it where the graph writes it in place; an
expanded input, whose elements overlap, by the memory it spans). A static input that arrives at another
address makes the graph captured again (copying it from then on, unless it moved into another captured
graph's outputs); one that was another captured graph's output and now comes from elsewhere (that graph
ran uncaptured) makes the call run uncaptured too. After `MAX_CAPTURES` captures the graph runs uncaptured.
A capture that fails runs the call uncaptured, its freed inputs rebuilt over the slots they lay in (a
capture writes nothing), and the graph uncaptured from then on.
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from collections import Counter

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .triton import compat

MAX_CAPTURES = 3
SMALL_BYTES = 1024
_STALE = "stale"  # `_blocked`'s answer where the graph is to be captured again
_KEPT: list = []  # arenas of dropped backends with a replay output still held: their memory must stay


def why_not(graph) -> str | None:
    """Why `graph` cannot be captured, or None."""
    devices = {b.layout.device.type for b in graph.buffers().values()}
    if "cuda" not in devices:
        return "off: the graph's tensors are on the CPU"
    if any(getattr(inp, "symbol", None) is not None for inp in graph.inputs) or any(
            not all(isinstance(s, int) or getattr(s, "is_number", False) for s in b.layout.size)
            for b in graph.buffers().values()):
        return "off: dynamic shapes (one capture per size is not kept)"
    return None


_USE_COUNT = torch._C._storage_Use_Count


def _count(storage) -> int:
    """References to a storage (tensors over it, storage objects)."""
    return _USE_COUNT(storage._cdata)


def _list_refs(items: list, j: int) -> int:
    return sys.getrefcount(items[j])


_LIST_ALONE = _list_refs([object()], 0)  # what `_list_refs` reads for an object one list alone holds


def _fresh_storage_refs() -> int:
    """Python's count of a tensor's storage object that nothing but a local name holds (as `_alone` reads it):
    someone holding `t.untyped_storage()` without the tensor shows only there (torch hands out the same
    object while one exists)."""
    t = torch.empty(1)
    st = t.untyped_storage()
    return sys.getrefcount(st)


_STORAGE_ALONE = _fresh_storage_refs()


class Slot:
    """One storage of a capture's outputs: memory of its pool that the graph's replays write. `storage` is
    ours, over the same memory and owning none of it; replays return tensors over it. `fresh` follows the
    capture's own storage until it dies. `own`: the count of `storage` while only we hold it."""

    __slots__ = ("seq", "ptr", "storage", "cdata", "bases", "own", "py", "fresh", "retired")

    def __init__(self, seq: int, storage):
        self.seq, self.ptr, self.retired = seq, storage.data_ptr(), False
        self.fresh = StorageWeakRef(storage)
        self.storage = torch._C._construct_storage_from_data_pointer(self.ptr, storage.device, storage.nbytes())
        self.cdata = self.storage._cdata
        self.bases = {}  # dtype -> a tensor of ours over the whole storage
        self._measure()

    def _measure(self) -> None:
        """The counts `held` compares with, while only we hold the storage: of the storage (`own`) and of our
        storage object (`py`: a tensor over it may hold that object too)."""
        self.own = _count(self.storage)
        self.py = sys.getrefcount(self.storage)

    def base(self, dtype):
        b = self.bases.get(dtype)
        if b is None:
            n = self.storage.nbytes() // dtype.itemsize
            b = self.bases[dtype] = torch.empty(0, dtype=dtype, device=self.storage.device).set_(
                self.storage, 0, (n,), (1,))
            self._measure()
        return b

    def held(self) -> bool:
        """A replay's tensor over the slot, or the storage object of one, is alive."""
        return _USE_COUNT(self.cdata) != self.own or sys.getrefcount(self.storage) != self.py

    def fresh_live(self) -> bool:
        """The capture's own tensor over the slot is alive (the allocator still counts it in use)."""
        if self.fresh is not None and self.fresh.expired():
            self.fresh = None
        return self.fresh is not None

    def live(self) -> bool:
        return self.fresh_live() or self.held()


class Arena:
    """A CUDA graph memory pool and the slots of the captures made into it, numbered in capture order."""

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.slots: list[Slot] = []
        self.graphs: list = []  # every CUDA graph captured here: the pool's memory lives while one does
        self.next = 0
        self.members = 0  # graphs whose current capture is here

    def clean(self) -> bool:
        """No replay output in the pool is held: a capture may take whatever the allocator has free here."""
        return not any(s.held() for s in self.slots)

    def add(self, graph, slots: list) -> None:
        self.graphs.append(graph)
        self.slots = [s for s in self.slots if not s.retired or s.live()] + slots


class Pool:
    """What the graphs one backend captures share: the arena captures go into (a new one where the current
    one has replay outputs held), the current slot at each address (inputs there are read in place) and
    each slot by its storage (the one replay outputs are over)."""

    def __init__(self):
        self.arena = None
        self.arenas: list[Arena] = []
        self.owned: dict = {}  # storage address -> the Slots of current captures there (a list: a capture may put
        # its output where another graph's slot, free then, begins)
        self.by_storage: dict = {}  # Slot.cdata -> Slot, for every slot of a current capture

    def for_capture(self) -> Arena:
        _keep()
        # an arena no graph captures into any more goes once nothing is over its slots (its memory with it)
        self.arenas = [a for a in self.arenas if a is self.arena or a.members or any(s.live() for s in a.slots)]
        if self.arena is None or not self.arena.clean():
            self.arena = Arena()
            self.arenas.append(self.arena)
        return self.arena

    def __del__(self):
        try:
            _keep(self.arenas)
        except Exception:  # pragma: no cover - at interpreter exit
            pass


def _keep(arenas=()) -> None:
    """`_KEPT`: the arenas of dropped backends (and of `arenas`) that still have a replay output held."""
    _KEPT[:] = [a for a in [*_KEPT, *arenas] if not a.clean()]


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool=None):
    """`torch.cuda.graph(graph, pool=pool)`, with cuBLAS's workspaces cleared around it (`_clear_cublas`) and
    the caller's stream current again however it ends: torch's `__exit__` ends the capture before it leaves
    the capture stream, so a capture that fails to end (an op that synchronized with the host) left that
    stream current for everything after it, unordered with the work queued on the caller's."""
    stream = torch.cuda.current_stream()
    _clear_cublas()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    except BaseException:
        torch.cuda.set_stream(stream)
        _release_generators()
        raise
    finally:
        torch.cuda.set_stream(stream)
        _clear_cublas()


def _release_generators() -> None:
    """After a capture that failed to end: torch's `capture_end` raises before it takes the device's CUDA
    generator out of capture mode, and every random number drawn after that, captured or not, fails ("Offset
    increment outside graph capture encountered unexpectedly"). An empty capture begins and ends the
    generator's capture again, which leaves it out of capture mode."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    except Exception:  # noqa: BLE001 - nothing more to do: the capture's own error is what is raised
        pass


def _clear_cublas() -> None:
    """Free cuBLAS's workspaces, one per stream it ran a matmul on. Around a capture: the capture stream's
    workspace is then allocated inside the pool and freed there after it, a buffer of the graph like any
    other (the replay rules cover it), not 64 MB held outside the pool for good (Inductor's CUDA graph
    trees do the same). An uncaptured matmul allocates a new one where it needs it."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _ptrs(args) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


def _storage_ptr(t) -> int:
    return t.untyped_storage().data_ptr()


def _builder(outputs: list):
    """`build(args)`: a replay's outputs, as `CudaGraphed._classify` says each is rebuilt (`args` may be any
    mapping from input positions to tensors), written out once as Python: a graph returns a hundred outputs
    or more, and the replay's host time is the step's where the CPU bounds it."""
    env, items, copied = {"alias": compat.alias, "over": _over, "copies": compat.copies}, [], []
    for i, (kind, what) in enumerate(outputs):
        if kind == "base":
            env[f"b{i}"] = what[0]
            items.append(f"alias(b{i}, {what[1]!r}, {what[2]!r}, {what[3]!r})")
        elif kind == "input":
            k, view = what
            items.append(f"args[{k}]" if view is None else f"alias(args[{k}], {view[0]!r}, {view[1]!r}, {view[2]!r})")
        elif kind == "input_as":
            k, dtype, size, stride, offset = what
            env[f"d{i}"] = dtype
            items.append(f"over(args[{k}], d{i}, {size!r}, {stride!r}, {offset!r})")
        elif kind == "copy":  # all copied together (compat.copies: one launch)
            items.append(f"fresh[{len(copied)}]")
            copied.append(what)
        else:
            env[f"v{i}"] = what
            items.append(f"v{i}")
    env["copied"] = tuple(copied)
    head = "    fresh = copies(copied)\n" if copied else ""
    source = "def build(args):\n" + head + "    return [" + ", ".join(items) + "]\n"
    exec(compile(source, "<passline cudagraph outputs>", "exec"), env)
    return env["build"]


def _views(call: list) -> dict:
    """storage address -> (position, size, stride, offset, dtype, the storage's weak reference) of the first
    tensor of `call` over it (storages of no bytes left out: they all lie at address 0)."""
    views = {}
    for k, t in enumerate(call):
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            if st.nbytes() and st.data_ptr() not in views:
                views[st.data_ptr()] = (k, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype,
                                        StorageWeakRef(st))
    return views


def _over(t, dtype, size, stride, rel: int):
    """A tensor of `dtype` over `t`'s storage, `rel` bytes past `t`'s start (an output that views an input
    as another dtype)."""
    offset = (t.storage_offset() * t.element_size() + rel) // dtype.itemsize
    return torch.empty(0, dtype=dtype, device=t.device).set_(t.untyped_storage(), offset, size, stride)


class _Static:
    """The static buffer an input is copied into before each replay. An input whose elements overlap (an
    expanded tensor: zero strides) cannot be the target of `copy_`: the memory it spans is copied
    instead, and the buffer views it with the input's strides."""

    def __init__(self, a):
        self.overlap = torch._debug_has_internal_overlap(a) != 0
        if self.overlap:
            self.span = 1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride()) if n > 0) if a.numel() else 0
            self.base = torch.empty(self.span, dtype=a.dtype, device=a.device)
            self.tensor = self.base.as_strided(a.shape, a.stride(), 0)
        else:
            self.tensor = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
        self.fill(a)

    def fill(self, a) -> None:
        if self.overlap:
            self.base.copy_(a.as_strided((self.span,), (1,), a.storage_offset()))
        else:
            self.tensor.copy_(a)


class CudaGraphed:
    """`runner`, captured at its second call and replayed from then on."""

    after: tuple = (None, 0, ())  # (the arena's slot list, its length, its slots captured after this graph)

    def __init__(self, runner, graph, report, pool: Pool, saved_from: int | None = None):
        self.runner, self.report, self.pool = runner, report, pool
        self.saved_from = saved_from  # outputs from here on reach only the backward
        boxed = getattr(runner, "boxed", None)
        self._run = boxed if boxed is not None else (lambda args: runner(*args))
        self.unstable = set()  # inputs that moved after a capture read them in place
        self.mutated = {k for k, inp in enumerate(graph.inputs) if inp.name in graph.mutated_names()}
        self.captures = self.replays = 0
        self.uncaptured, self.why = 0, ""  # calls run uncaptured, and the last one's reason
        self.last_ptrs = None  # the previous call's input addresses
        self.cuda_graph = None
        self.arena, self.seq, self.slots = None, -1, []
        self.reused: list[Slot] = []  # earlier slots of the arena that were free when this graph was captured
        self.groups: list[tuple] = []  # inputs over one storage that the call's list alone held at the capture
        self.outputs: list = []

    def __call__(self, *args):
        return self.boxed(list(args))

    def boxed(self, args: list):
        """aot_autograd's boxed convention: `args` is emptied (inputs the caller held only there die)."""
        if self.cuda_graph is not None and self.captures <= MAX_CAPTURES:
            try:  # the steady state: only the inputs read in place are looked at
                moved = [k for k, p in zip(self.static, self.static_ptrs) if args[k].data_ptr() != p]
            except AttributeError:  # not a tensor where the capture had one
                moved = list(self.static)
            if not moved:
                why = self._blocked(args)
                if why is None:
                    return self._replay(args)
                if why is not _STALE:
                    return self._uncaptured(args, why)
            ptrs = _ptrs(args)
            where = {k: _storage_ptr(args[k]) if isinstance(args[k], torch.Tensor) else None for k in moved}
            if moved and all(k in self.pooled and where[k] not in self.pool.owned for k in moved):
                return self._uncaptured(args, "an input came from an uncaptured call of the graph giving it")
            if self.captures >= MAX_CAPTURES:  # inputs keep moving: uncaptured from now on
                self.captures = MAX_CAPTURES + 1
                self.report.cudagraphs = f"off: captured {MAX_CAPTURES} times, and inputs it reads in place moved again"
                self._retire()
                return self._run(args)
            self.unstable.update(k for k in moved if where[k] not in self.pool.owned)
            last = [None] * len(args)  # what the replays saw: the inputs read in place
            for k, p in zip(self.static, self.static_ptrs):
                last[k] = p
            self.last_ptrs = ptrs
            return self._capture(args, ptrs, last)
        ptrs = _ptrs(args)
        last, self.last_ptrs = self.last_ptrs, ptrs
        if last is None or self.captures > MAX_CAPTURES:
            return self._run(args)
        return self._capture(args, ptrs, last)

    def _uncaptured(self, args, why: str):
        self.uncaptured += 1
        self.why = why
        self._say()
        return self._run(args)

    def _replay(self, args):
        for k, buf in self.statics.items():
            buf.fill(args[k])
        self.cuda_graph.replay()
        self.replays += 1
        for k in self.copied_back:
            args[k].copy_(self.statics[k].tensor)
        out = self.build(args)
        args.clear()
        return out

    # -- when a replay may write -----------------------------------------------------------------------
    def _blocked(self, args) -> str | None:
        """Why replaying now could overwrite memory someone holds (the module doc's rules), or None. Every
        replay asks, over a hundred slots or more (ResNet's forward and backward): `Slot.live` is written
        out in the loops, and the slots captured after this graph are listed once per arena change."""
        use, refs = _USE_COUNT, sys.getrefcount
        for s in self.slots:  # s.live()
            if s.fresh is not None and s.fresh_live() or use(s.cdata) != s.own or refs(s.storage) != s.py:
                return "its previous outputs are held"
        alone = set()  # ids of the slots whose holders are all in `args`
        for group in self.groups:
            slot = self._alone(args, group)
            if slot is False:
                return "an input its capture freed or overwrote is held elsewhere"
            alone.add(id(slot))
        slots = self.arena.slots
        if self.after[0] is not slots or self.after[1] != len(slots):  # a capture since (Arena.add)
            self.after = slots, len(slots), [s for s in slots if s.seq > self.seq]
        later = [s for s in self.after[2]
                 if s.fresh is not None and s.fresh_live() or use(s.cdata) != s.own or refs(s.storage) != s.py]
        if later:
            # a graph captured since (its inputs moved) gives this call its inputs: this graph may lie in
            # that capture's buffers, so it is captured again rather than run uncaptured from now on
            if all(id(s) in alone and not s.fresh_live() for s in later):
                return _STALE
            return "outputs of a graph captured after it are held"
        for s in self.reused:
            if s.fresh_live() or (id(s) not in alone and s.held()):
                return "memory its capture reused is held"
        return None

    def _alone(self, args: list, group: tuple):
        """Whether the inputs at the positions `group` (those over one storage) and that storage are held by
        the list `args` alone: False if not; else the Slot whose storage it is, or None. (Nothing here may
        hold an input while counting: no local names one.)"""
        if len(group) == 1:  # the usual case, without the bookkeeping of repeats
            j = group[0]
            if _list_refs(args, j) != _LIST_ALONE or args[j]._use_count() != 1:
                return False
            n = 1
        else:
            times = Counter(id(args[j]) for j in group)
            for j in group:
                if _list_refs(args, j) != _LIST_ALONE + times[id(args[j])] - 1 or args[j]._use_count() != 1:
                    return False
            n = len(times)
        st = args[group[0]].untyped_storage()
        slot = self.pool.by_storage.get(st._cdata)
        # `st` is a new storage object unless one exists (ours, counted in `own`): ALONE counts one
        if _USE_COUNT(st._cdata) != (slot.own if slot is not None else compat.ALONE - 1) + n:
            return False
        if sys.getrefcount(st) != (slot.py + 1 if slot is not None else _STORAGE_ALONE):
            return False  # someone holds the storage object itself
        return slot

    def _reads_in_place(self, k, a, ptr, last) -> bool:
        """Whether input `k` is read where it is rather than copied: parameters (they keep their memory;
        an optimizer updates them in place), outputs of a graph captured by the same backend (a forward's
        saved activations, replayed into the same buffers every step), and any other input found at the
        same address on two calls in a row (buffers), unless it moved once already. Only speed depends on
        this: every call checks that static inputs are where the capture read them."""
        if isinstance(a, torch.nn.Parameter) or _storage_ptr(a) in self.pool.owned:
            return True
        return ptr == last and k not in self.unstable

    # -- outputs --------------------------------------------------------------------------------------
    def _classify(self, outputs, inputs: dict) -> tuple[list, list]:
        """(how each output is returned at a replay, the new slots; `_builder` writes it out).
        ("base", (tensor, size, stride, offset)) over a slot's base of the output's dtype; ("input", (k,
        view)) for an input returned as it is (view None) or a view of one, rebuilt over the call's own
        input; ("input_as", (k, dtype, size, stride, bytes past the input)) for a view of an input as
        another dtype, likewise; ("copy", t) for a small output of the
        graph that reaches the caller (held here: a copy per call, so that a loss kept in a variable blocks no
        replay; small outputs saved for the backward are slots, which the backward reads in place);
        ("value", v) for what is not a tensor. `inputs`: storage address -> (position, size, stride,
        offset, dtype) of the first input over it."""
        slots, how = {}, []
        saved_from = self.saved_from if self.saved_from is not None and self.saved_from <= len(outputs) \
            else len(outputs)
        to_caller = {o.untyped_storage().data_ptr() for o in outputs[:saved_from] if isinstance(o, torch.Tensor)}
        for o in outputs:
            if not isinstance(o, torch.Tensor):
                how.append(("value", o))
                continue
            st = o.untyped_storage()
            view = (tuple(o.shape), tuple(o.stride()))
            given = inputs.get(st.data_ptr())
            # an input's storage itself, not one the capture allocated where an input it freed had been
            if given is not None and not given[5].expired() and given[5].cdata == st._cdata:
                k, size, stride, offset, dtype, _ = given
                if view == (size, stride) and o.storage_offset() == offset and o.dtype == dtype:
                    how.append(("input", (k, None)))
                elif o.dtype == dtype:
                    how.append(("input", (k, (*view, o.storage_offset() - offset))))
                else:
                    rel = o.storage_offset() * o.element_size() - offset * dtype.itemsize  # bytes past the input
                    how.append(("input_as", (k, o.dtype, *view, rel)))
            elif st.nbytes() == 0 or (st.nbytes() <= SMALL_BYTES and st.data_ptr() in to_caller):
                how.append(("copy", o))
            else:
                slot = slots.get(st.data_ptr())
                if slot is None:
                    slot = slots[st.data_ptr()] = Slot(self.seq, st)
                how.append(("base", (slot.base(o.dtype), *view, o.storage_offset())))
        return how, list(slots.values())

    # -- capturing ------------------------------------------------------------------------------------
    def _groups(self, args: list, static: list) -> list[tuple]:
        """The static inputs by storage, where the list `args` alone holds a storage's inputs and it."""
        if compat.ALONE is None:  # this torch cannot count holders: nothing is freed or taken over for good
            return []
        by_storage = {}
        for k in static:
            st = args[k].untyped_storage()
            if st.nbytes():  # storages of no bytes all lie at address 0
                by_storage.setdefault(st.data_ptr(), []).append(k)
            del st
        return [tuple(g) for g in by_storage.values() if self._alone(args, tuple(g)) is not False]

    def _capture(self, args: list, ptrs: list, last: list):
        """Capture the graph on `args` and replay it once (this call's results): inputs `_reads_in_place` are
        read where they are, the others copied into static buffers. Where the capture fails the graph runs
        uncaptured from now on."""
        self.captures += 1
        static = [k for k, a in enumerate(args)
                  if isinstance(a, torch.Tensor) and self._reads_in_place(k, a, ptrs[k], last[k])]
        groups = self._groups(args, static)  # before anything here holds an input
        in_groups = {k for g in groups for k in g}
        statics = {k: _Static(a) for k, a in enumerate(args) if isinstance(a, torch.Tensor) and k not in static}
        copies = {k: b.tensor for k, b in statics.items()}
        call = [copies.get(k, a) for k, a in enumerate(args)]
        inputs = _views(call)
        pooled = {k for k in static if _storage_ptr(args[k]) in self.pool.owned}
        # what a failed capture needs to run the call uncaptured: inputs the list alone held, weakly, and where
        # they lie in a slot, how to rebuild them over it (a capture writes nothing, the pool keeps the memory)
        spare = self._spare(args, in_groups)
        again = [weakref.ref(a) if k in in_groups else a for k, a in enumerate(args)]
        originals = {k: args[k] for k in copies}  # the caller's tensors of the copied inputs
        args.clear()
        arena = self.pool.for_capture()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with compat.checked_capture(), capturing(graph, arena.handle):
                outputs = self._run(call)
        except Exception as e:  # e.g. an extern that synchronizes with the host
            self.report.cudagraphs = f"off: capture failed ({type(e).__name__}: {str(e)[:120]})"
            self.captures = MAX_CAPTURES + 1
            self._retire()
            del call
            again = [a() if k in in_groups else a for k, a in enumerate(again)]
            for k, (slot, dtype, size, stride, offset) in spare.items():
                if again[k] is None:
                    again[k] = compat.alias(slot.base(dtype), size, stride, offset)
            if any(a is None for k, a in enumerate(again) if k in in_groups):
                raise RuntimeError(f"passline: the CUDA graph capture of {self.report.name} failed after it "
                                   "freed inputs it had read last, so the call cannot run again uncaptured; "
                                   "compile with passline.backend(cudagraphs=False)") from e
            return self._run(again)
        del call
        graph.replay()  # the capture ran nothing: this call's results
        self.static, self.static_ptrs, self.pooled = static, [ptrs[k] for k in static], pooled
        self.groups, self.statics = groups, statics
        self.copied_back = [k for k in copies if k in self.mutated]
        for k in self.copied_back:
            originals[k].copy_(copies[k])
        self._adopt(graph, arena, outputs, inputs)  # `again` still holds what it held during the capture
        del again
        self._say()
        return [self._first(o, how, originals) for o, how in zip(outputs, self.outputs)]

    def _spare(self, args: list, positions) -> dict:
        """{position: (slot, dtype, size, stride, offset)} for the inputs at `positions` that lie in a current
        slot's storage from its start: how to rebuild them over it."""
        spare = {}
        for k in positions:
            st = args[k].untyped_storage()
            there = self.pool.owned.get(st.data_ptr())
            slot = there[-1] if there else None
            if slot is not None and st.nbytes() <= slot.storage.nbytes():
                t = args[k]
                spare[k] = (slot, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
                del t
            del st
        return spare

    def _first(self, o, how, originals: dict):
        """The capturing call's output `o`: as it is (the allocator counts its memory in use while it lives),
        but a copy where replays return copies, and over the caller's tensor where it lies in an input's
        static copy."""
        kind, what = how
        if kind == "copy" or (kind in ("input", "input_as") and what[0] in originals):
            return _builder([how])(originals)[0]
        return o

    def _adopt(self, graph, arena: Arena, outputs: list, inputs: dict) -> None:
        """Take the capture: its outputs' slots replace this graph's earlier ones, and the slots of earlier
        captures in the arena that are free now (the capture may have put its buffers there) are noted."""
        self._forget_slots()
        self.seq, arena.next = arena.next, arena.next + 1
        self.outputs, self.slots = self._classify(outputs, inputs)
        self.build = _builder(self.outputs)
        self.reused = [s for s in arena.slots if not s.live()]
        arena.add(graph, self.slots)
        for s in self.slots:
            self.pool.owned.setdefault(s.ptr, []).append(s)
            self.pool.by_storage[s.cdata] = s
        self._leave_arena()
        arena.members += 1
        self.cuda_graph, self.arena = graph, arena

    def _forget_slots(self) -> None:
        """This graph's slots are no longer a current capture's (they stay in their arena while held)."""
        for s in self.slots:
            s.retired = True
            there = self.pool.owned.get(s.ptr, [])
            if s in there:
                there.remove(s)
                if not there:
                    del self.pool.owned[s.ptr]
            self.pool.by_storage.pop(s.cdata, None)
        self.slots = []

    def _retire(self) -> None:
        """The graph replays no more (its inputs kept moving, a capture failed, it was dropped): its slots are
        no longer current and its arena loses a member, so the arena goes once nothing holds its slots."""
        self._forget_slots()
        self._leave_arena()
        self.cuda_graph, self.statics = None, {}

    def _leave_arena(self) -> None:
        if self.arena is not None:
            self.arena.members -= 1
            self.arena = None

    def __del__(self):
        try:
            self._retire()
        except Exception:  # pragma: no cover - at interpreter exit, or never captured
            pass

    def _say(self) -> None:
        copies = sum(1 for kind, _ in self.outputs if kind == "copy")
        self.report.cudagraphs = (
            f"on: captured {self.captures} time(s); {len(self.statics)} inputs and {copies} small outputs copied "
            f"per call; {self.uncaptured} calls uncaptured" + (f" (the last: {self.why})" if self.why else ""))


def cudagraphed(runner, graph, report, pool: Pool, saved_from: int | None = None):
    """`runner` replayed from a CUDA graph where `graph` allows it; the report says which. `pool`: what
    the backend's captured graphs share. `saved_from`: for a forward graph, the position of its first
    output saved for the backward (the ones before reach the caller)."""
    reason = why_not(graph)
    if reason is not None:
        report.cudagraphs = reason
        return runner
    report.cudagraphs = "on: captured at the second call"
    return CudaGraphed(runner, graph, report, pool, saved_from)
