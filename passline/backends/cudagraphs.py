"""`passline.backend(cudagraphs=True)`: a compiled graph captured once into a CUDA graph and replayed.

Where the CPU bounds a step (small tensors, many kernels), replaying a captured graph issues all of a
graph's kernels with one launch. A graph is eligible when its tensors are on a GPU and its shapes are
static (a dynamic-shape graph would need one capture per size); otherwise the option is accepted and the
report's `cudagraphs` says why it is off.

Calls: the first runs the graph as it is (kernels compile and choose their configurations there); the
second captures it and replays it. The graphs of one backend are captured into one memory pool (a
backward's buffers reuse the forward's intermediates' memory); see `Pool` for what that asks of a replay.

Inputs: parameters, outputs of the backend's other captured graphs (a forward's saved activations, which
it replays into the same buffers every step) and inputs found at the same address on the two calls
before a capture (buffers) are read in place by the captured kernels; any other input is copied into a
static buffer before each replay (and copied back after it where the graph writes it in place). An input
read in place that arrives at another address makes the graph captured again (copying it from then on,
unless it moved into another captured graph's outputs). After `MAX_CAPTURES` captures the graph runs
uncaptured.

Outputs are the graph's own buffers, not copies: a replay returns fresh tensors over the same memory.
That memory is overwritten by the next replay, so a replay happens only when nothing holds the previous
replay's outputs any more (their storages' reference counts); while something does (the caller kept an
activation, or a `.grad` that took a replay's gradient is kept, zeroed in place rather than set to None),
the call runs uncaptured, into fresh memory, and the report counts it. Small outputs (a loss, up to
`SMALL_BYTES`) are returned as copies, so that a loss kept in a variable across steps blocks no replay.
"""
from __future__ import annotations

from collections import Counter

import torch

from .triton import compat

MAX_CAPTURES = 3
SMALL_BYTES = 1024


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


class Pool:
    """What the graphs one backend captures share: a CUDA graph memory pool, the storages of their outputs
    (read in place by the others) and their order of capture. A capture takes only memory the pool has
    free at that moment, so a later capture may put its outputs where an earlier graph keeps its
    intermediates; an earlier graph therefore replays only while the later ones' outputs are free too."""

    def __init__(self):
        self.handle = None
        self.owned: set = set()  # storage addresses of the captured graphs' outputs
        self.order: list = []  # the captured graphs, the latest capture last

    def captured(self, graph) -> None:
        if graph in self.order:
            self.order.remove(graph)
        self.order.append(graph)

    def later(self, graph) -> list:
        return self.order[self.order.index(graph) + 1:] if graph in self.order else []


def _ptrs(args) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


class CudaGraphed:
    """`runner`, captured at its second call and replayed from then on."""

    def __init__(self, runner, graph, report, pool: Pool):
        self.runner, self.report, self.pool = runner, report, pool
        self.unstable = set()  # inputs that moved after a capture read them in place
        self.bases = []  # (tensor over an output storage, further bases over that storage): see _classify
        self.mutated = {k for k, inp in enumerate(graph.inputs) if inp.name in graph.mutated_names()}
        self.captures = 0
        self.replays = 0
        self.uncaptured = 0  # calls run uncaptured because the previous replay's outputs were still held
        self.last_ptrs = None  # the previous call's input addresses
        self.cuda_graph = None

    def __call__(self, *args):
        ptrs = _ptrs(args)
        last, self.last_ptrs = self.last_ptrs, ptrs
        if last is None or self.captures > MAX_CAPTURES:
            return self.runner(*args)
        if self.cuda_graph is None or self._moved(ptrs):
            if not self._capture(args, ptrs, last):
                return self.runner(*args)
        elif not self._free():
            self.uncaptured += 1
            self._say()
            return self.runner(*args)
        for k in self.copied:
            self.inputs[k].copy_(args[k])
        self.cuda_graph.replay()
        self.replays += 1
        for k in self.copied:
            if k in self.mutated:
                args[k].copy_(self.inputs[k])
        return [self._output(how, args) for how in self.outputs]

    # -- inputs ---------------------------------------------------------------------------------------
    def _moved(self, ptrs) -> bool:
        """A static input arrived at another address (the captured kernels would read the old one): those
        that did not move into another captured graph's outputs are copied from the next capture on."""
        moved = [k for k, p in zip(self.static, self.static_ptrs) if ptrs[k] != p]
        self.unstable.update(k for k in moved if ptrs[k] not in self.pool.owned)
        return bool(moved)

    def _reads_in_place(self, k, a, ptr, last) -> bool:
        """Whether input `k` is read where it is rather than copied: parameters (they keep their memory;
        an optimizer updates them in place), outputs of a graph captured by the same backend (a forward's
        saved activations, replayed into the same buffers every step), and any other input found at the
        same address on two calls in a row (buffers), unless it moved once already. Only speed depends on
        this: every call checks that static inputs are where the capture read them."""
        if isinstance(a, torch.nn.Parameter) or a.untyped_storage().data_ptr() in self.pool.owned:
            return True
        return ptr == last and k not in self.unstable

    # -- outputs --------------------------------------------------------------------------------------
    def _free(self) -> bool:
        """A replay overwrites nothing anyone holds: this graph's outputs of its previous replay, and those
        of graphs captured after it into the same pool (which may lie where this graph keeps its
        intermediates), are held by nothing but their bases here."""
        return all(g._outputs_free() for g in [self, *self.pool.later(self)])

    def _outputs_free(self) -> bool:
        """Each output storage's count is that of a storage one tensor holds (compat.ALONE), plus one for
        each further base over it here."""
        return all(torch._C._storage_Use_Count(base.untyped_storage()._cdata) == compat.ALONE + extra
                   for base, extra in self.bases)

    def _output(self, how, args):
        kind, what = how
        if kind == "base":  # the graph's own buffer: a fresh tensor over it, no copy
            k, size, stride, offset = what
            return compat.alias(self.bases[k][0], size, stride, offset)
        if kind == "input":  # an input, or a view of one: over the caller's own tensor
            k, view = what
            return args[k] if view is None else compat.alias(args[k], *view)
        if kind == "copy":
            return what.clone()
        return what  # not a tensor

    def _classify(self, outputs) -> list:
        """How each output is returned at a replay: ("base", (k, size, stride, offset)) over `bases[k]`,
        one tensor of the output's dtype over a whole storage the graph wrote (held here, never returned);
        ("input", (k, view)) for an input returned as it is (view None) or a view of one, rebuilt over the
        call's own input; ("copy", t) for a small output of the graph (a loss: a copy per call, so that a
        caller keeping it blocks no replay); ("value", v) for what is not a tensor."""
        inputs = {}  # storage address -> (input position, the input)
        for k, t in enumerate(self.inputs):
            if isinstance(t, torch.Tensor):
                inputs.setdefault(t.untyped_storage().data_ptr(), (k, t))
        keys, over, how = {}, [], []
        for o in outputs:
            if not isinstance(o, torch.Tensor):
                how.append(("value", o))
                continue
            st = o.untyped_storage()
            view = (tuple(o.shape), tuple(o.stride()))
            if st.data_ptr() in inputs:
                k, t = inputs[st.data_ptr()]
                same = o is t or (view == (tuple(t.shape), tuple(t.stride()))
                                  and o.storage_offset() == t.storage_offset() and o.dtype == t.dtype)
                if same:
                    how.append(("input", (k, None)))
                elif o.dtype == t.dtype:
                    how.append(("input", (k, (*view, o.storage_offset() - t.storage_offset()))))
                else:
                    how.append(("copy", o))
            elif st.nbytes() <= SMALL_BYTES:
                how.append(("copy", o))
            else:
                key = (st.data_ptr(), o.dtype)
                if key not in keys:
                    keys[key] = len(keys)
                    over.append(torch.empty(0, dtype=o.dtype, device=o.device).set_(
                        st, 0, (st.nbytes() // o.element_size(),), (1,)))
                how.append(("base", (keys[key], *view, o.storage_offset())))
        per_storage = Counter(p for p, _ in keys)  # bases over one storage each hold it once
        self.bases = [(base, per_storage[p] - 1) for base, (p, _) in zip(over, keys)]
        return how

    # -- capturing ------------------------------------------------------------------------------------
    def _capture(self, args, ptrs, last) -> bool:
        """Capture the graph on `args`: inputs `_reads_in_place` are read where they are, the others copied
        into static buffers. False where the capture failed (the graph then runs uncaptured from now on)."""
        self.captures += 1
        self.cuda_graph = None
        self.static = [k for k, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and self._reads_in_place(k, a, ptrs[k], last[k])]
        self.copied = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and k not in self.static]
        self.static_ptrs = [ptrs[k] for k in self.static]
        self.inputs = list(args)
        for k in self.copied:
            self.inputs[k] = torch.empty_strided(args[k].shape, args[k].stride(), dtype=args[k].dtype,
                                                 device=args[k].device).copy_(args[k])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        if self.pool.handle is None:
            self.pool.handle = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool.handle):
                outputs = self.runner(*self.inputs)
        except Exception as e:  # e.g. an extern that synchronizes with the host
            self.report.cudagraphs = f"off: capture failed ({type(e).__name__}: {str(e)[:120]})"
            self.captures = MAX_CAPTURES + 1
            return False
        for base, _ in self.bases:  # the previous capture's outputs are no longer this backend's
            self.pool.owned.discard(base.untyped_storage().data_ptr())
        self.outputs = self._classify(outputs)
        del outputs
        # only the copies' buffers stay: holding an input read in place (a forward's saved activation) would
        # keep the forward's previous outputs alive, and the forward from replaying
        self.inputs = [t if k in self.copied else None for k, t in enumerate(self.inputs)]
        self.pool.owned.update(base.untyped_storage().data_ptr() for base, _ in self.bases)
        self.pool.captured(self)
        self.cuda_graph = graph
        self._say()
        return True

    def _say(self) -> None:
        copies = sum(1 for kind, _ in self.outputs if kind == "copy")
        self.report.cudagraphs = (
            f"on: captured {self.captures} time(s); {len(self.copied)} inputs and {copies} small outputs copied "
            f"per call; {self.uncaptured} calls uncaptured (an earlier replay's outputs still held)")


def cudagraphed(runner, graph, report, pool: Pool):
    """`runner` replayed from a CUDA graph where `graph` allows it; the report says which. `pool`: what
    the backend's captured graphs share."""
    reason = why_not(graph)
    if reason is not None:
        report.cudagraphs = reason
        return runner
    report.cudagraphs = "on: captured at the second call"
    return CudaGraphed(runner, graph, report, pool)
