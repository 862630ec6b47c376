"""The launch plan: one generated Python function `call(args)` per graph.

What can be decided at compile time is: sizes, strides and element counts are literals for static
shapes, and Python expressions over the input sizes (evaluated once per call, at the top) for dynamic
ones; each buffer is allocated (`torch.empty_strided`, PyTorch's caching allocator) right before the
step that first writes it and `del`eted after its last reader, so no pool is kept between calls; an
extern is a direct call of its aten op on views built in place; a kernel is `K3(stream, (args...),
xnumel, rnumel)`, which launches its chosen configuration through the compiled binary. The source is kept
on the runner (`runner.source`) and is what a reader debugging a graph reads first.
"""
from __future__ import annotations

import math
import re

import attrs
import sympy
import torch

from ...ir import TensorArg
from ...ir.index import FloorDiv, ModularIndexing, derived_source, product
from ...lowering.sizes import runtime_value, translate
from ..reference import conform_result
from . import compat
from .kernel import overwritable


class _Unprintable(Exception):
    pass


def _ident(name: str, prefix: str) -> str:
    return prefix + re.sub(r"\W", "_", name)


class CallWriter:
    def __init__(self, runner):
        self.runner = runner
        self.graph = runner.graph
        self.buffers = runner.buffers
        self.lines: list[str] = []
        self.ns: dict = {"torch": torch, "math": math, "runner": runner, "conform": conform_result,
                         "as_strided": _as_strided, "runtime_value": runtime_value, "first": _first}
        self.names: dict = {}  # buffer name -> identifier
        self.syms: dict = {}  # size symbol -> identifier
        self.owned: set = set()  # buffers this call allocates (aligned: never re-checked at launch)
        self.dynamic = False
        self.needs_bind = False
        self.maybe_misaligned: set = set()  # buffers returned by an extern that may return a view
        self.allocators: dict = {}  # device -> name of its allocation function in the call
        self.prologue: list = []  # lines the call runs first (after binding sizes)
        self.gpu = None  # the GPU device of a graph launched there (not the interpreter)
        self.moved: set = set()  # CPU buffers a kernel of this GPU graph writes, kept on `gpu` (alloc)

    # -- names and constants ------------------------------------------------------------------------------
    def name(self, buf: str) -> str:
        if buf not in self.names:
            ident = _ident(buf, "b_")
            while ident in self.names.values():
                ident += "_"
            self.names[buf] = ident
        return self.names[buf]

    def const(self, value, hint: str = "c") -> str:
        """A name in the call's namespace bound to `value` (aten ops, devices, anything not a literal)."""
        simple = isinstance(value, (torch.device, torch.dtype))
        for k, v in self.ns.items():
            if k.startswith(hint) and (v is value or (simple and type(v) is type(value) and v == value)):
                return k
        key = f"{hint}{len(self.ns)}"
        self.ns[key] = value
        return key

    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)

    # -- sizes --------------------------------------------------------------------------------------------
    def py(self, e) -> str:
        """Python source for an integer size expression."""
        if isinstance(e, (int, bool)):
            return str(int(e))
        e = sympy.sympify(e)
        if not e.free_symbols:
            return str(int(e))
        try:
            return self._print(e)
        except _Unprintable:  # evaluated from the bound values (rare: the printer knows size arithmetic)
            self.needs_bind = True
            return f"bind.int({self.const(e, 'e')})"

    def _print(self, e) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            if e not in self.syms:
                raise _Unprintable(e)
            return self.syms[e]
        args = [self._print(a) for a in e.args] if not (e.is_Mul or e.is_Add) else None
        if isinstance(e, FloorDiv):
            return f"({args[0]} // {args[1]})"
        if isinstance(e, ModularIndexing):
            return f"(({args[0]} // {args[1]}) % {args[2]})"
        if e.is_Add:
            return "(" + " + ".join(self._print(a) for a in e.args) + ")"
        if e.is_Mul:
            if any(a.is_Number and not a.is_Integer for a in e.args):
                raise _Unprintable(e)
            return "(" + " * ".join(self._print(a) for a in e.args) + ")"
        if e.is_Pow and e.exp.is_Integer and int(e.exp) >= 0:
            return f"({args[0]} ** {args[1]})"
        if isinstance(e, sympy.Max):
            return f"max({', '.join(args)})"
        if isinstance(e, sympy.Min):
            return f"min({', '.join(args)})"
        try:  # torch's own size functions (a conv's output size is torch's FloorDiv): as passline's
            plain = translate(e)
        except NotImplementedError:
            raise _Unprintable(e) from None
        if plain == e:
            raise _Unprintable(e)
        return self._print(plain)

    def ints(self, es) -> str:
        return "(" + "".join(self.py(e) + ", " for e in es) + ")"

    def binding(self) -> str:
        """An expression for this call's `_Bindings` (what the reference backend and sympy fallbacks
        evaluate with), from the size values bound above: one dict lookup at sizes seen before."""
        values = "".join(f"{self.syms[sym]}, " for sym, *_ in self.runner.reference.sources)
        return f"runner.bound(({values}))"

    def bind_sizes(self) -> None:
        """Size symbols from the inputs: a SymInt argument, or a tensor's size or stride."""
        for sym, k, kind, d in self.runner.reference.sources:
            value = f"int(args[{k}])" if kind == "int" else f"args[{k}].shape[{d}]" if kind == "size" else \
                f"args[{k}].stride({d})" if kind == "stride" else f"int({derived_source(sym, self.syms)})"
            self.syms[sym] = _ident(sym.name, "s_")
            self.emit(f"{self.syms[sym]} = {value}")
        self.dynamic = bool(self.syms)

    # -- values -------------------------------------------------------------------------------------------
    def view(self, t: TensorArg) -> str:
        """A tensor argument: the buffer itself, or a view of it built in place."""
        lay = self.buffers[t.buffer].layout
        b = self.name(t.buffer)
        if list(t.size) == list(lay.size) and list(t.stride) == list(lay.stride) and t.offset == 0:
            return b
        return f"as_strided({b}, {self.ints(t.size)}, {self.ints(t.stride)}, {self.py(t.offset)})"

    def value(self, x) -> str:
        if isinstance(x, TensorArg):
            return self.view(x)
        if isinstance(x, sympy.Basic):
            if isinstance(x, sympy.Expr) and x.is_integer:
                return self.py(x)
            if not x.free_symbols:
                return repr(float(x)) if isinstance(x, sympy.Expr) else repr(bool(x))
            self.needs_bind = True
            return f"runtime_value({self.const(x, 'e')}, bind.values)"
        if isinstance(x, list):
            return "[" + ", ".join(self.value(y) for y in x) + "]"
        if isinstance(x, tuple):
            return "(" + "".join(self.value(y) + ", " for y in x) + ")"
        if x is None or isinstance(x, (bool, int, str)):
            return repr(x)
        if isinstance(x, float) and math.isfinite(x):
            return repr(x)
        return self.const(x)

    def alloc(self, buf: str, indent: int = 1, donors=()) -> None:
        """Bind `buf` to storage before the step writing it: a dead buffer's of the same layout (lent by
        the step before), a `donors` buffer's (read by this step, dying at it, and safe to overwrite in
        place: kernel.overwritable), else a new allocation."""
        if buf in self.defined:
            return
        lay = self.buffers[buf].layout
        if self.gpu is not None and lay.device.type == "cpu":
            # a CPU buffer written by a kernel of a GPU graph: in practice a one-element value computed from
            # a float argument dynamo passes as a 0-d CPU tensor (move_scalars; a kernel reading bigger CPU
            # tensors cannot launch on the GPU at all): computed and kept on the GPU
            lay = attrs.evolve(lay, device=self.gpu)
            self.moved.add(buf)
            donors = ()
        key = _key(lay)
        dead = self.reusable.get(key)
        new = f"{self.empty(lay.device)}({self.ints(lay.size)}, {self.ints(lay.stride)}, {self.const(lay.dtype, 'dt')})"
        donors = [d for d in donors if d in self.defined and d not in self.donated
                  and _fits(self.buffers[d].layout, lay)]

        def same(donor) -> str:  # the kernel writes buf at the offsets it reads donor at: the same storage
            return self.name(donor) if _key(self.buffers[donor].layout) == key else \
                f"as_strided({self.name(donor)}, {self.ints(lay.size)}, {self.ints(lay.stride)}, 0)"

        # a buffer of this call's own that no extern's result may view is taken outright; inputs and externs'
        # results are offered in a chain, and stay offered to a later output's (whose sole() sees the holder)
        sure = next((d for d in donors if d in self.owned and d not in self.extern_read), None)
        if dead:  # the storage of a buffer that died at the step before, same layout: no allocation
            old = dead.pop()
            self.emit(f"{self.name(buf)} = {self.name(old)}; del {self.name(old)}", indent)
        elif sure is not None:
            self.emit(f"{self.name(buf)} = {same(sure)}  # in place", indent)
            self.donated.add(sure)
        elif donors:
            # inputs or externs' results: overwritten only where nothing else can see them (not the caller,
            # nor autograd keeping a saved activation for another backward, nor a view); the first of them
            # that no one else holds at this call (a GELU backward's dy or h, whichever died)
            chain = " else ".join(f"{same(d)} if sole({self.name(d)})" for d in donors)
            self.emit(f"{self.name(buf)} = {chain} else {new}", indent)
            from .compat import sole

            self.ns["sole"] = sole
            self.defined.add(buf)
            if any(d in self.maybe_misaligned for d in donors):  # an extern's result (else an input: aligned)
                self.maybe_misaligned.add(buf)
            else:
                self.owned.add(buf)  # either way, storage no one else holds
            return
        else:
            self.emit(f"{self.name(buf)} = {new}", indent)
        self.defined.add(buf)
        self.owned.add(buf)

    def empty(self, device) -> str:
        """The allocation function of `device`'s buffers, bound once per call (see compat.allocator)."""
        name = self.allocators.get(device)
        if name is None:
            from .compat import allocator

            fast, slow = allocator(device)
            name = self.allocators[device] = f"empty{len(self.allocators)}"
            self.ns[f"{name}_fast"], self.ns[f"{name}_slow"] = fast, slow
            if device.type == "cuda":  # the fast one allocates on the current device
                self.prologue.append(f"{name} = {name}_fast if torch.cuda.current_device() == {device.index or 0} "
                                     f"else {name}_slow")
            else:
                self.prologue.append(f"{name} = {name}_fast")
        return name

    # -- steps --------------------------------------------------------------------------------------------
    def kernel_args(self, k, src, slots=()) -> tuple[str, tuple]:
        """The source of a kernel's argument tuple (workspace `slots` as None) and the positions whose
        specialization may change between calls: sizes of dynamic shapes, and results of externs that
        may be views (inputs are aligned by layouts.conform_inputs, allocations by the allocator)."""
        parts, check = [], []
        for i, (kind, value) in enumerate(src.args):
            if kind == "buffer":
                if value in slots:
                    parts.append("None")
                    continue
                parts.append(self.name(value))
                if value in self.maybe_misaligned:
                    check.append(i)
            else:
                parts.append(self.py(value))
                if sympy.sympify(value).free_symbols:
                    check.append(i)
        n = len(src.args)
        for j, e in enumerate((src.xnumel, src.rnumel)):
            if e is not None and sympy.sympify(e).free_symbols:
                check.append(n + j)
        return "(" + "".join(p + ", " for p in parts) + ")", tuple(check)

    def wide(self, src) -> str | None:
        """Where a kernel's index width is chosen per launch (`src.int64` is None): a condition, over this
        call's sizes, that one of its buffers spans more than int32 addresses (the launch adds its own
        element counts, `Kernel.constexprs`); None where there is nothing to add, or the width is written
        in the kernel."""
        if src.int64 is not None or not src.spans:
            return None
        from .kernel import INT32_OFFSETS

        return " or ".join(f"{self.py(s)} > {INT32_OFFSETS}" for s in src.spans)

    def zero(self, e) -> str | None:
        """A condition that the count `e` is zero: None where it never is, "True" where it always is."""
        if e is None:
            return None
        e = sympy.sympify(e)
        if not e.free_symbols:
            return "True" if int(e) == 0 else None
        return f"{self.py(e)} == 0"

    def visible(self, node) -> list:
        """The outputs of a node that other steps or the caller see (a fused member's value that nothing
        else reads stays inside the kernel); inputs written in place keep their names."""
        from .kernel import _stored

        return [b for b in node.output_names() if b in _stored(node, self.graph)
                and b not in self.graph.input_buffers()]

    def on_reference(self, node, outputs, indent: int) -> None:
        """Run `node` on the reference backend (a node the generator refused, or one with no points)."""
        touched = dict.fromkeys((*node.read_names(), *node.mutates))  # and the inputs it overwrites
        reads = ", ".join(f"{b!r}: {self.name(b)}" for b in touched if b in self.defined)
        # the binding is looked up here, not per call: such a step is mostly the branch for empty tensors
        env = f"runner.run_reference({self.const(node, 'node')}, {{{reads}}}, {self.binding()})"
        self.emit(f"env = {env}", indent)
        for b in outputs:
            self.emit(f"{self.name(b)} = env[{b!r}]", indent)
            self.defined.add(b)
        self.emit("del env", indent)  # (each output then lives as long as its name, as an extern's)

    def step_extern(self, node) -> None:
        args = ", ".join(self.value(a) for a in node.args)
        kwargs = ", ".join(f"{k}={self.value(v)}" for k, v in node.kwargs)
        # an OpOverload's __call__ is one Python frame around its C++ handle: the call uses the handle (the
        # same dispatch, ~0.7 µs a call less on the CPU; ResNet's backward makes dozens of extern calls)
        fn = node.op._op if type(node.op) is torch._ops.OpOverload else node.op
        call = f"{self.const(fn, 'op')}({args}{', ' if args and kwargs else ''}{kwargs})"
        outs = [(i, b) for i, b in enumerate(node.outputs) if b is not None]
        if not outs:
            self.emit(call)
            return
        self.emit(f"r = {call}")
        single = len(node.outputs) == 1
        if _may_alias(node.op):
            self.maybe_misaligned.update(b.name for _, b in outs)
        for i, b in outs:
            lay = b.layout
            result = ("r" if _one_tensor(node.op) else "first(r)") if single else f"r[{i}]"
            if result != "r":
                self.emit(f"r{i} = {result}")
                result = f"r{i}"
            size, stride, dt = self.ints(lay.size), self.ints(lay.stride), self.const(lay.dtype, 'dt')
            # the usual case (the recorded layout) tested here, without a call: an extern a launch
            self.emit(f"{self.name(b.name)} = {result} if {result}.dtype is {dt} and {result}.shape == {size} "
                      f"and {result}.stride() == {stride} else "
                      f"conform({self.const(node, 'node')}, {result}, {size}, {stride}, {dt})")
            self.defined.add(b.name)
        # the result and its parts are references too: dropped here, each output lives only as long as its
        # buffer's name, which is deleted at its last use (a max-pool's int64 indices, read once right after
        # the call, stayed alive to the next extern call: 49 MB of a ResNet-18 step's forward peak)
        self.emit("del " + ", ".join(["r", *(f"r{i}" for i, _ in outs if not (single and _one_tensor(node.op)))]))

    def donors(self, node) -> dict:
        """{an output of `node`: the buffers dying at it whose storage it may take} (kernel.overwritable)."""
        dying = self.dying
        return {o: [b for b in bs if b in dying] for o, bs in overwritable(node, self.graph).items()} if dying else {}

    def step_kernel(self, node, k, variants) -> None:
        src = next(iter(variants.values()))  # this step's own (the kernel may be another layer's, shared)
        into = self.donors(node)
        for kind, value in src.args:
            if kind == "buffer":
                self.alloc(value, donors=into.get(value, ()))
        empty = [c for c in (self.zero(src.xnumel), self.zero(src.rnumel)) if c is not None]
        args, check = self.kernel_args(k, src)
        k.check = _union(k.check, check)  # (a kernel two steps share checks what either needs)
        wide = k.wide_when = self.wide(src)  # the condition the precompile plan evaluates too
        launch = f"{self.const(k, 'K')}(stream, {args}, {self.py(src.xnumel)}" + \
                 (f", {self.py(src.rnumel)}" if src.rnumel is not None else "") + \
                 (f", wide={wide})" if wide is not None else ")")
        self.guarded(node, empty, launch, self.visible(node))

    def guarded(self, node, empty: list, launch: str, outputs) -> None:
        """`launch`, or the reference backend where the node has no points to compute (a zero-size
        output, or rows over nothing: no kernel is launched — a grid of zero programs is an error on a
        GPU — and the outputs still get their layouts and a reduction's identity)."""
        if "True" in empty:
            self.on_reference(node, outputs, 1)
        elif empty:
            self.emit(f"if {' or '.join(empty)}:")
            self.on_reference(node, outputs, 2)
            self.emit("else:")
            self.emit(launch, 2)
        else:
            self.emit(launch)

    def step_mix(self, node, data) -> None:
        from .runner import MixStep

        k_main, main, k_fin, fin_src, workspaces = data
        into = self.donors(node)  # (the row side may write over a buffer dying here: kernel.overwritable)
        for src in (main, fin_src):
            for kind, value in src.args:
                if kind == "buffer" and value not in workspaces:
                    self.alloc(value, donors=into.get(value, ()))
        def slots(src) -> dict:  # workspace name -> its position among the kernel's arguments
            return {v: i for i, (kind, v) in enumerate(src.args) if kind == "buffer" and v in workspaces}

        step = MixStep(k_main, k_fin, workspaces, slots(main), slots(fin_src))
        margs, mcheck = self.kernel_args(k_main, main, workspaces)
        fargs, fcheck = self.kernel_args(k_fin, fin_src, workspaces)
        k_main.check = _union(k_main.check, mcheck)
        # the finish's count of programs changes with the split chosen at run time: always checked
        k_fin.check = _union(k_fin.check, fcheck, (len(fin_src.args) + 1,))
        empty = [c for c in (self.zero(main.xnumel), self.zero(main.rnumel)) if c is not None]
        k_main.wide_when, k_fin.wide_when = (self.wide(src) for src in (main, fin_src))  # for the plan too
        wides = [w or "False" for w in (k_main.wide_when, k_fin.wide_when)]
        device = next(iter(workspaces.values())).device
        launch = f"{self.const(step, 'M')}({self.empty(device)}, stream, {margs}, {fargs}, " \
                 f"{self.py(main.xnumel)}, {self.py(main.rnumel)}" + \
                 ("".join(f", {w}" for w in wides) if wides != ["False", "False"] else "") + ")"
        self.guarded(node, empty, launch, self.visible(node))

    def output(self, o) -> str:
        if isinstance(o, TensorArg):
            b = self.name(o.buffer)
            if o.buffer in self.moved:  # a value the caller expects on the CPU (move_scalars)
                b = f"{b}.cpu()"
            lay = self.buffers[o.buffer].layout
            if list(o.size) == list(lay.size) and list(o.stride) == list(lay.stride) and o.offset == 0:
                return b
            return f"as_strided({b}, {self.ints(o.size)}, {self.ints(o.stride)}, {self.py(o.offset)})"
        return self.value(o)

    def move_scalars(self, device) -> None:
        """One-element CPU tensors among the inputs that kernels read, copied to the GPU `device` first:
        dynamo passes a float argument under dynamic shapes as a 0-d CPU tensor, which a GPU kernel cannot
        load (an aten extern on the GPU takes it as it is). A copy of 4-8 bytes per call; what kernels
        compute from it stays on the GPU too (`alloc`)."""
        read = {value for kind, _, data in self.runner.steps if kind in ("kernel", "mix")
                for src in _sources(kind, data) for k, value in src.args if k == "buffer"}
        for inp in self.graph.inputs:
            lay = inp.buffer.layout if inp.buffer is not None else None
            if lay is not None and lay.device.type == "cpu" and inp.name in read \
                    and sympy.sympify(product(lay.size)) == 1:
                name = self.name(inp.name)
                self.emit(f"{name} = {name}.to({self.const(device, 'dev')}, non_blocking=True)")

    # -- the function ---------------------------------------------------------------------------------------
    def write(self) -> str:
        runner, graph = self.runner, self.graph
        self.defined: set = set()
        body_start = len(self.lines)
        self.bind_sizes()
        sizes_end = len(self.lines)
        for k, inp in enumerate(graph.inputs):
            if inp.buffer is not None:
                self.emit(f"{self.name(inp.name)} = args[{k}]")
                self.defined.add(inp.name)
        # the caller's list (aot_autograd's boxed convention): emptied, so that an input held by nothing
        # else — a saved activation in a backward — is freed at its last use below, not when the call returns
        self.emit("args.clear()")
        devices = {b.layout.device for b in self.buffers.values() if b.layout.device.type == "cuda"}
        if devices and not runner.interpret:
            self.emit(f"stream = current_stream({next(iter(devices)).index or 0})")
            from .compat import current_stream

            self.ns["current_stream"] = current_stream
            self.gpu = next(iter(devices))
            self.move_scalars(self.gpu)
        else:
            self.emit("stream = None")
        # last reader of each buffer: deleted after it (outputs are the caller's; so are inputs written in
        # place, which a step may write after their last reader and which the caller holds anyway)
        keep = graph.output_names() | graph.mutated_names()
        last: dict = {}
        for i, (_, node, _) in enumerate(runner.steps):
            for b in (*node.read_names(), *node.output_names()):
                last[b] = i
        free: dict = {}
        for b, i in last.items():
            if b not in keep:
                free.setdefault(i, []).append(b)
        # a buffer this call allocated, dead after step i, lends its storage to step i + 1's allocations
        # of the same layout (what is not taken then is deleted): one allocation instead of two, and no
        # storage held longer than one step. Not one read by an extern whose result may be a view of it.
        extern_read = self.extern_read = {b for kind, node, _ in runner.steps
                                          if kind == "extern" and _may_alias(node.op) for b in node.read_names()}
        self.reusable: dict = {}
        self.donated: set = set()  # buffers whose storage a later-defined buffer took (kernel.overwritable)
        for i, (kind, node, data) in enumerate(runner.steps):
            self.emit(f"# {node.name}")
            self.dying = set(free.get(i, ()))
            lent = self.reusable  # alloc() takes from it
            start = len(self.lines)
            if kind == "extern":
                self.step_extern(node)
            elif kind == "reference":
                self.on_reference(node, self.visible(node), 1)
            elif kind == "kernel":
                self.step_kernel(node, *data)
            else:
                self.step_mix(node, data)
            # what the step did not take of the storage lent to it goes before the step, not after: a
            # dead buffer is not held through the next step's run (its allocations may be the peak)
            unused = [b for names in lent.values() for b in names]
            if unused:
                self.lines.insert(start, "    del " + ", ".join(self.name(b) for b in unused))
            dead = [b for b in free.get(i, ()) if b in self.defined]
            lends = [b for b in dead if b in self.owned and b not in extern_read and b not in self.donated]
            gone = [b for b in dead if b not in lends]
            if gone:
                self.emit(f"del {', '.join(self.name(b) for b in gone)}")
            self.reusable = {}
            for b in lends:
                self.reusable.setdefault(_key(self.buffers[b].layout), []).append(b)
            self.defined -= set(dead)
        leftover = [b for names in self.reusable.values() for b in names]
        if leftover:
            self.emit(f"del {', '.join(self.name(b) for b in leftover)}")
        self.emit("return [" + "".join(self.output(o) + ", " for o in graph.outputs) + "]")
        if self.needs_bind:  # a sympy fallback on every call's path
            self.lines.insert(sizes_end, f"    bind = {self.binding()}")
        head = ["def call(args):"] + ["    " + line for line in self.prologue]
        self.lines[body_start:body_start] = head
        return "\n".join(self.lines) + "\n"


def _key(lay) -> tuple:
    """Buffers with equal keys can share one storage."""
    return tuple(lay.size), tuple(lay.stride), lay.dtype, lay.device


def _fits(donor, lay) -> bool:
    """Whether a buffer of layout `lay` can live in the storage of one of layout `donor`: same dtype and
    device and the same storage span, `lay` dense (its elements fill the span)."""
    return (donor.dtype == lay.dtype and donor.device == lay.device
            and sympy.simplify(donor.storage_span - lay.storage_span) == 0
            and sympy.simplify(lay.storage_span - product(lay.size)) == 0)


def _as_strided(t: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A tensor over `t`'s memory (`offset` elements past its own): compat.alias, not an autograd view —
    the generated call runs without autograd, and aot_autograd rebuilds the views it returns from their
    sizes and strides; a tracked view cost ~3 µs more a call, dozens of times a training step."""
    return compat.alias(t, size, stride, offset)


def _may_alias(op) -> bool:
    """Whether an op's results may share storage with its arguments (a view op's schema says so)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


def _sources(kind: str, data) -> list:
    """The KernelSources a kernel or mix-order step launches (one variant each: they share arguments)."""
    if kind == "kernel":
        return [next(iter(data[1].values()))]
    return [data[1], data[3]]


def _union(*checks) -> tuple:
    """Argument positions checked per launch, of every step that launches one kernel, in order."""
    return tuple(sorted(set().union(*checks)))


def _one_tensor(op) -> bool:
    """Whether an op returns one Tensor, not in a tuple (its schema says so)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"


def _first(r):
    """An op with one tensor output may still return it in a tuple."""
    return r[0] if isinstance(r, (tuple, list)) else r


def write_call(runner):
    """(source, call): the graph's generated `call(args)` and the function itself."""
    writer = CallWriter(runner)
    source = writer.write()
    code = compile(source, f"<passline call {runner.graph.name if hasattr(runner.graph, 'name') else ''}>", "exec")
    exec(code, writer.ns)
    return source, writer.ns["call"]
