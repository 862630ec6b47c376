"""Input strides and alignment checked at run time: a compiled graph reads each input with the strides
it was lowered for, so a tensor that arrives with others is re-laid out first, never read scrambled.

dynamo guards the strides of user inputs and AOTAutograd coerces tangents to their traced layout, so
this is a last line of defence (a saved activation or a caller that bypasses both): one tuple compare
per tensor input per call when the layouts agree.
"""
from __future__ import annotations

import sympy
import torch

from ..pipeline.graph import SchedulerGraph


class _Expect:
    """What one tensor input must look like: its position, sizes and strides (ints when static)."""

    __slots__ = ("pos", "stride", "layout", "mutated", "seen")

    def __init__(self, pos: int, layout, mutated: bool):
        self.pos = pos
        self.layout = layout
        self.mutated = mutated  # the graph writes this input in place: copy the result back
        static = all(isinstance(e, sympy.Integer) for e in (*layout.size, *layout.stride))
        self.stride = tuple(int(s) for s in layout.stride) if static else None
        self.seen: dict = {}  # (sizes, strides) -> strides to give such a tensor, or None

    def wanted(self, t: torch.Tensor) -> tuple | None:
        """The strides to give `t`, or None when its own are fine (equal on dims of size > 1). Decided
        once per strides seen (per sizes and strides under dynamic shapes): a size-1 dim's stride often
        differs from the traced one, and a training step passes the same layouts every call."""
        have = t.stride()
        if have == self.stride:
            return None
        key = have if self.stride is not None else (t.shape, have)
        found = self.seen.get(key, self)
        if found is not self:
            return found
        if len(self.seen) >= 64:
            self.seen.clear()
        # symbolic strides are evaluated here, not per call (sympy is slow)
        want = self.stride if self.stride is not None else _evaluate(self.layout, t)
        self.seen[key] = self._differs(t, have, want)
        return self.seen[key]

    @staticmethod
    def _differs(t: torch.Tensor, have: tuple, stride: tuple | None) -> tuple | None:
        if stride is None or t.numel() <= 1 or all(a == b for a, b, n in zip(have, stride, t.shape) if n > 1):
            return None
        return stride


def _own_symbols(layout) -> dict:
    """{symbol: ("size" | "stride", dim)}: the symbols of `layout` that an input's own sizes give (a size
    that is a symbol), then its own strides (a stride that is a symbol of its own is whatever it is,
    except on a size-1 dim: anything there)."""
    found: dict = {}
    for d, n in enumerate(layout.size):
        if isinstance(n, sympy.Symbol):
            found.setdefault(n, ("size", d))
    for d, (n, st) in enumerate(zip(layout.size, layout.stride)):
        if isinstance(st, sympy.Symbol) and n != 1:
            found.setdefault(st, ("stride", d))
    return found


def _evaluate(layout, t: torch.Tensor) -> tuple | None:
    """Symbolic strides evaluated with the sizes `t` has (dynamic shapes); None if they don't bind."""
    values = {s: int(t.shape[d] if kind == "size" else t.stride(d)) for s, (kind, d) in _own_symbols(layout).items()}
    try:
        return tuple(int(sympy.sympify(s).xreplace(values)) for s in layout.stride)
    except TypeError:
        return None


ALIGN = 16  # bytes: generated kernels are compiled for inputs aligned to this (Triton's specialization)


def _usual_check(expects: list):
    """(`check(args)`, the rest): whether every input of `expects` has exactly its traced strides and a
    16-byte aligned start — the usual case, decided in one generated expression (~0.3 µs an input,
    against ~1 µs through `_Expect.wanted`: a training step's backward has dozens of inputs). Symbolic
    strides (dynamic shapes) are written in the input's own sizes (`(args[2].shape[1], 1)`); the rest
    are those whose strides are not (a symbol of another input's): the check leaves them to
    `_Expect.wanted`. False sends the call through the full per-input check, which also accepts other
    strides on size-1 dims."""
    written = {e.pos: w for e in expects if (w := _written(e)) is not None}
    rest = [e for e in expects if e.pos not in written]
    if not written:
        return (lambda args: True), rest
    strides = " and ".join(f"args[{pos}].stride() == {w}" for pos, w in written.items())
    starts = " | ".join(f"args[{pos}].data_ptr()" for pos in written)
    ns: dict = {}
    exec(f"def check(args):\n    return {strides} and not ({starts}) % {ALIGN}\n", ns)
    return ns["check"], rest


def _written(e: _Expect) -> str | None:
    """Python source for input `e`'s expected strides, in its own sizes and strides, or None. A size-1 dim's
    stride is the input's own, whatever it is (no element is addressed with it, and PyTorch is free with
    it: a LLaMA-style step's inputs failed the exact comparison at every call and took the per-input check)."""
    if e.stride is not None:
        return "(" + "".join((f"args[{e.pos}].stride({d})" if n == 1 else str(st)) + ", "
                             for d, (n, st) in enumerate(zip(e.layout.size, e.stride))) + ")"
    names = {s: sympy.Symbol(f"args[{e.pos}].shape[{d}]" if kind == "size" else f"args[{e.pos}].stride({d})")
             for s, (kind, d) in _own_symbols(e.layout).items()}
    out = []
    for st in e.layout.stride:
        st = sympy.sympify(st)
        if not st.free_symbols <= set(names) or not _polynomial(st):
            return None
        out.append(str(st.xreplace(names)))
    return "(" + "".join(w + ", " for w in out) + ")"


def _polynomial(e) -> bool:
    """Whether `e` is integers and symbols under + and * (what `str` writes as Python that means the same)."""
    if e.is_Integer or e.is_Symbol:
        return True
    if e.is_Pow:
        return e.exp.is_Integer and int(e.exp) >= 0 and _polynomial(e.base)
    return (e.is_Add or e.is_Mul) and all(_polynomial(a) for a in e.args)


def conform_inputs(graph: SchedulerGraph, runner):
    """`runner`, wrapped so that every tensor input has the layout the graph was lowered with and starts
    on a 16-byte boundary (a view that starts mid-row is copied: kernels are compiled once, for aligned
    pointers, and never re-specialized per call)."""
    mutated = graph.mutated_names()
    expects = [_Expect(k, inp.buffer.layout, inp.name in mutated)
               for k, inp in enumerate(graph.inputs) if inp.buffer is not None]
    if not expects:
        return runner

    usual, unwritten = _usual_check(expects)

    def conformed(args) -> dict | None:
        """{position: a re-laid-out copy} for the inputs that need one, or None."""
        try:
            fine = usual(args)
        except AttributeError:  # not a tensor where one was traced: the full check says what to do
            fine = False
        fixed = None
        for e in (unwritten if fine else expects):
            t = args[e.pos]
            if not isinstance(t, torch.Tensor):
                continue
            stride = e.wanted(t)
            if stride is not None or t.data_ptr() % ALIGN:
                fixed = fixed or {}
                fixed[e.pos] = _copy(t, t.stride() if stride is None else stride)
        return fixed

    def finish(out, originals, fixed: dict):
        """After the call: the copies of inputs written in place copied back, outputs viewing a copy rebased."""
        for e in expects:
            if e.mutated and e.pos in fixed:
                originals[e.pos].copy_(fixed[e.pos])
        return _rebased(out, {k: (originals[k], c) for k, c in fixed.items()})

    def run(*args):
        fixed = conformed(args)
        if fixed is None:
            return runner(*args)
        return finish(runner(*[fixed.get(k, a) for k, a in enumerate(args)]), args, fixed)

    def boxed(args: list):
        """`run` in the boxed convention: the copies replace their inputs in `args`, which the runner
        empties; the originals are kept here (a copy written in place goes back to its original)."""
        fixed = conformed(args)
        if fixed is None:
            return runner.boxed(args)
        originals = {k: args[k] for k in fixed}
        for k, t in fixed.items():
            args[k] = t
        return finish(runner.boxed(args), originals, fixed)

    run.runner = runner  # the wrapped runner stays reachable (reports, tests)
    if hasattr(runner, "boxed"):
        run.boxed = boxed
    return run


def _copy(t: torch.Tensor, stride) -> torch.Tensor:
    """`t`'s values in a new tensor with `stride` whose data starts on a 16-byte boundary. Kept with `t`'s
    own strides, it keeps `t`'s storage offset too: its storage starts where that offset lands on a
    boundary (a slice of an aligned allocation), so every size, stride and offset the graph computes from
    it is the one `t` gives. (An output whose base took the copy's offset 0 came back at the wrong place:
    aot_autograd rebuilds an output aliasing an input from the output's base's offset; found by fuzzing, a
    misaligned input mutated through a narrow that was returned.) A 0 stride (an expanded input) keeps one
    element along its dim: the copy is expanded the same way (copying into overlapping memory is refused).
    An offset larger than the copy itself (a view deep into a larger tensor) is not kept: offset 0, as before."""
    one = tuple(1 if st == 0 else n for n, st in zip(t.shape, stride))
    span = 0 if 0 in one else 1 + sum((n - 1) * st for n, st in zip(one, stride))
    offset = t.storage_offset() if tuple(stride) == tuple(t.stride()) else 0
    if offset > max(span, 4096):  # the offset's elements are allocated too: at most the copy's own size again
        offset = 0
    size = t.element_size()
    shift = (-offset * size) % ALIGN
    raw = torch.empty(shift + (offset + span) * size, dtype=torch.uint8, device=t.device)
    try:
        storage = raw.untyped_storage()[shift:] if shift else raw.untyped_storage()
        base = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, offset, one, stride)
    except (RuntimeError, NotImplementedError, TypeError):  # a storage that cannot be sliced: offset 0
        base = torch.empty_strided(one, stride, dtype=t.dtype, device=t.device)
    base.copy_(t[tuple(slice(0, 1) if st == 0 else slice(None) for st in stride)])
    return base.as_strided(t.shape, stride)


def _rebased(out, copies: dict):
    """`out` with every output that is a view of a copy made above turned into the same view of the input
    it copies. An output aliasing an input is rebuilt by aot_autograd from that input and the output's
    size, strides and storage offset (`gen_alias_from_base`, `as_strided`, when it cannot replay the view:
    a narrow at a symbolic start); a view of the copy would put those numbers on the wrong storage. Found by
    fuzzing: a narrow of a view starting 4 bytes into its storage came back 1 element early."""
    if not copies:
        return out
    by_storage = {c.untyped_storage().data_ptr(): (original, c) for original, c in copies.values()}

    def one(t):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return t
        found = by_storage.get(t.untyped_storage().data_ptr())
        return t if found is None else view_of(found[0], found[1], t)

    if isinstance(out, (list, tuple)):
        return type(out)(one(t) for t in out)
    return one(out)


def view_of(original: torch.Tensor, copy: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The view of `original` that `view` is of `copy` (`copy`: `original`'s values in a dense layout of its
    own, the strides the graph was lowered for): each storage step of the view written in the copy's
    dimensions (mixed radix, the copy's strides from the largest), then in the original's strides."""
    moving = [d for d in range(copy.dim()) if copy.shape[d] > 1 and copy.stride(d)]  # not expanded, not size 1
    dims = sorted(moving, key=lambda d: -copy.stride(d))

    def digits(position: int) -> list:
        at = [0] * copy.dim()
        for d in dims:
            at[d], position = divmod(position, copy.stride(d))
        if position:
            raise RuntimeError("passline: an output is a view of an input's re-laid-out copy that the input's "
                               "own layout cannot express; please report this graph")
        return at

    def in_original(position: int) -> int:
        return sum(k * original.stride(d) for d, k in enumerate(digits(position)))

    def stride(d: int) -> int:
        try:
            return in_original(view.stride(d))
        except RuntimeError:
            if view.shape[d] > 1:
                raise
            return view.stride(d)  # a size-1 dim's stride moves nothing

    start = view.storage_offset() - copy.storage_offset()
    return original.as_strided(view.shape, [stride(d) for d in range(view.dim())],
                               original.storage_offset() + in_original(start))
