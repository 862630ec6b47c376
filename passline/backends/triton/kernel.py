"""Triton source for one scheduler node: a pointwise kernel, a reduction kernel (persistent or
looped), or the two kernels of a mix-order reduction (main and finish).

A kernel walks its group's canonical loop nest: outer variables `o*` come from `xindex`, reduction
variables `q*` from `rindex`. Every member of the group is computed at that point; a member's value
is reused by the members that read it, and stored only when something outside the kernel reads it.
"""
from __future__ import annotations

import re

import attrs
import sympy
import torch

from ...ir import (
    Cast,
    Constant,
    FusedNode,
    IndexValue,
    Layout,
    Load,
    MixOrderNode,
    Op,
    Pointwise,
    Reduction,
    Scatter,
    may_store_over_reads,
    members,
    read_after_store,
)
from ...ir.body import COMPARISONS, rebuild, streamed, walk
from ...ir.index import (
    StrEnum,
    VarKind,
    contiguous_strides,
    derive,
    flat_walk,
    loop_vars,
    product,
    substitute,
    var_info,
    var_kind,
)
from ...ir.loops import Role, canon_var, canonical_map, is_canonical, role, transposed
from ..variants import MIX_FORMS, KernelVariant
from . import compat, printer
from .configs import pow2
from .printer import Unsupported, tl_dtype

COMBINE = {"sum": "_sum_combine", "prod": "_prod_combine", "max": "_max_combine", "min": "_min_combine",
           "any": "_max_combine", "all": "_min_combine"}
INTEGER_DIVISIONS = ("floordiv", "remainder", "fmod")  # of integers: eager raises on a zero divisor (CPU)
# a persistent kernel's WINDOW for rows in classes (`KernelWriter._classes`); True (== 1) is a row through the window,
# False the plain form: CLASSES must differ from both (one binary key, one grid, one branch per value)
CLASSES = 2
# a mix-order kernel takes its rows in classes through groups under 8 bytes (`window_cap`: 2 bfloat16 elements beside
# a row of 2**k - 1) only where its block is at most this: on an H200 (sixty-third session, sweep kernels, µs, blocks
# of rows -> classes of pairs) bfloat16 LayerNorm backwards at 1023 and 4095 wide went 301 -> 262 and 318 -> 270,
# RMSNorm's 279 -> 250 and 288 -> 226, but LayerNorm's at 16386 x 8191 416 -> 565 (for sm_90 its copies staged in
# 98 KB of shared memory and 264 bytes a thread spilled) and RMSNorm's 409 -> 392; float32 pairs (8 bytes) gained at
# every width, 8191 included (337 -> 291)
MIX_CLASS_PAIRS_MAX_BLOCK = 4096


class ColumnRole(StrEnum):
    """The roles of a mix-order kernel's column members (whose loops are the transpose of the kernel's)."""

    COLUMN = "column"  # a column reduction: partial sums over this program's rows, into the workspace
    COLUMN_OUTER = "column_outer"  # a column epilogue: runs in the finishing kernel


def identity(rtype: str, dtype: torch.dtype) -> str:
    """The value masked-off lanes take so that they never change a reduction's result."""
    if rtype in ("sum", "any"):
        return "0"
    if rtype in ("prod", "all"):
        return "1"
    high = rtype in ("min", "argmin")  # the identity of a min is the largest value
    if dtype.is_floating_point:
        return 'float("inf")' if high else 'float("-inf")'
    if dtype == torch.bool:
        return "1" if high else "0"
    info = torch.iinfo(dtype)
    return str(info.max if high else info.min)


@attrs.frozen
class KernelSource:
    name: str
    source: str  # the kernel's module text
    fn_name: str
    args: tuple  # ("buffer", name) or ("size", sympy expr) in call order
    xnumel: sympy.Expr
    rnumel: sympy.Expr | None  # None for a pointwise kernel
    variant: KernelVariant
    constants: dict  # constexpr values: XBLOCK, RBLOCK, SPLIT
    num_warps: int = 4
    grid_per_program: str = "XBLOCK"  # grid = cdiv(xnumel, constants[grid_per_program])
    # index width: True/False where the sizes decide it when the kernel is generated; None where it is
    # chosen per launch (the kernel takes `INT64: tl.constexpr`), from the launch's element counts and
    # these buffer spans (sympy, in elements) evaluated at the call's sizes (`index_width`)
    int64: bool | None = False
    spans: tuple = ()
    # device asserts (an indirect index checked at run time): compiled with debug=True and the
    # launch's compat.CHECKED_OPTIONS
    checks: bool = False
    online: bool = False  # a looped form accumulates a softmax's sum of exponentials with its max (the rule)
    row_sums: bool = False  # a mix-order kernel that also reduces its rows (a norm's backward; the rule)
    # a mix-order kernel whose rows do not start on 16-byte boundaries: each element a load of its own in its blocks of
    # rows (the rule; where `window` is set, launches whose rows take classes through the window read vectors)
    scalar_rows: bool = False
    # a persistent kernel that can read and write its rows through an aligned window (`KernelWriter._window`): the
    # window's group, in elements (16 bytes of its narrowest row's dtype), else 0; the launch passes WINDOW
    window: int = 0
    window_writes: bool = False  # ... where it writes some row off 16-byte boundaries (else it only reads them)
    window_columns: bool = False  # ... where it reads a weight by columns (at each lane's column, element by element)
    window_by_rule: bool = False  # ... which the rule takes: it writes such rows and reduces nothing of its own
    # ... where it also takes rows in classes (WINDOW == CLASSES: a program's share of one class's rows, its weight
    # loaded once; `KernelWriter._classes`): timed, never by rule (configs.uncertain)
    window_classes: bool = False
    # ... the itemsize of the window's narrowest row dtype (its group is 16 bytes of it, or fewer: `window_cap`)
    window_itemsize: int = 0
    # a column sum whose rows do not start on 16-byte boundaries, which takes them in classes where its launch's WINDOW
    # says so (`KernelWriter._column_classes`, XBLOCK - G columns a program): G, else 0. Timed, never by rule
    column_classes: int = 0


def _natural(name: str) -> list:
    """A sort key ordering the numbers within names by value ("buf9" < "buf10")."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name))]


def _sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _as_block(value: str, dtype: torch.dtype) -> str:
    """`value` as a [XBLOCK, RBLOCK] block of the reduction's dtype (bools are reduced as int32). Broadcast,
    not added to a block of zeros: on a GPU `tl.full(.., -0.0, ..)` came out +0.0, and + 0.0 turns -0.0 into
    +0.0 (the product of [-0.0, 2.0, 3.0, -1.0] is +0.0 in eager; it came out -0.0)."""
    dt = "tl.int32" if dtype == torch.bool else tl_dtype(dtype)
    return f"tl.broadcast_to(({value}).to({dt}), [XBLOCK, RBLOCK])"


def _decompose(prefix: str, sizes, flat: str, used: set) -> list[tuple[str, str]]:
    """Canonical variables from a flat index: [(name, source)] in assignment order. Size symbols the
    sources use (dynamic shapes) are added to `used`, which makes them kernel arguments.

    With static sizes each variable is its own division of the flat index by constants (the compiler
    turns those into multiplications). A run-time size is a real division (sm_90 has no integer divide
    instruction: each is a sequence of some twenty instructions in 32 bits, a call in 64), so when sizes
    are symbolic the quotients are chained from the innermost variable out (`o2 = x % s; x1 = x // s;
    o1 = x1 % t; o0 = x1 // t`): one division per run-time size, its remainder from the same quotient,
    instead of a division per stride and one more per modulo."""
    out = []
    strides = contiguous_strides(sizes)
    used.update(sym for e in (*sizes[1:], *strides[:-1]) for sym in sympy.sympify(e).free_symbols)
    if len(sizes) > 1 and any(not sympy.sympify(s).is_number for s in sizes[1:]):
        rest = flat
        for k in range(len(sizes) - 1, 0, -1):
            size = printer.index(sympy.sympify(sizes[k]))
            out.append((f"{prefix}{k}", f"({rest} % {size})"))
            out.append((f"{prefix}_outer{k}", f"({rest} // {size})"))  # the flat index of loops 0..k-1
            rest = f"{prefix}_outer{k}"
        out.append((f"{prefix}0", rest))
        return out
    for k, (s, st) in enumerate(zip(sizes, strides)):
        name = f"{prefix}{k}"
        if len(sizes) == 1:
            out.append((name, flat))
        elif k == 0:
            out.append((name, f"({flat} // {printer.index(st)})"))
        elif st == 1:
            out.append((name, f"({flat} % {printer.index(s)})"))
        else:
            out.append((name, f"(({flat} // {printer.index(st)}) % {printer.index(s)})"))
    return out


class _Scope:
    def __init__(self, parent=None):
        self.parent = parent
        self.values: dict = {}  # id(body value) -> var
        self.loads: dict = {}  # (buffer, index source, mask) -> var: one load per distinct address
        self.members: dict = {}  # member buffer name -> var (its computed value, before the store cast)

    def member(self, buf):
        """The variable of a member's value, here or in an enclosing scope (None: not computed yet)."""
        return self._find("members", buf)

    def load(self, key):
        """The variable already holding a load, here or in an enclosing scope."""
        return self._find("loads", key)

    def _find(self, table: str, key):
        s = self
        while s is not None:
            found = getattr(s, table).get(key)
            if found is not None:
                return found
            s = s.parent
        return None


class KernelWriter:
    def __init__(self, name: str, nodes, outer, red, stored: set, buffers: dict, interpret: bool,
                 swap: set = frozenset(), runtime: frozenset = frozenset()):
        self.name = name
        self.runtime = runtime  # element counts passed at run time even where the IR's are numbers
        self.nodes = list(nodes)
        self.outer, self.red = tuple(outer), tuple(red)
        self.stored = stored
        self.buffers = buffers
        self.interpret = interpret
        self.swap = swap  # members whose canonical o/q are the transpose of the kernel's (mix-order columns)
        self.lines: list[str] = []
        self.indent = 1
        self.args: dict = {}  # arg name -> ("buffer", name) | ("size", symbol)
        self.sizes: set = set()
        self._tmp = 0
        # a member writing a graph input in place is not where its kernel's loads of that input come
        # from: they read the old value, from memory (legality and verify() keep reads after the write out)
        self.by_output = {m.output.name: m for m in self.nodes if not getattr(m, "in_place", False)}
        self.two_d = bool(self.red)
        self.locals: set = set()  # symbols naming kernel variables (indirect indices), never arguments
        self.local_bounds: dict = {}  # such a symbol -> the bound its value is checked (or proven) below
        self.varying: dict = {}  # kernel variable -> whether it may differ along a row (note_row_facts)
        self.selects: dict = {}  # kernel variable -> (condition, a, b): a select of row values per element
        # inside a looped kernel's loop: the buffers a later loop reads again (None outside loops), which
        # picks each load's L2 eviction policy (see load())
        self.reread: set | None = None
        self.debug = False  # a device_assert was emitted: the kernel is compiled with debug=True
        self.deferred: list[str] = []  # checks of indices no address is made from, after the kernel's stores
        self.online: dict | None = None  # online_pairs(), computed once
        # inside a looped kernel's loop: (line, indent, scope) where a value the same in every step goes
        # instead (before the loop: `invariant`, `place`), and the variables put there
        self.hoist: tuple | None = None
        self.hoisted: set = set()
        self._expansions: dict = {}  # _expanded()'s memo
        self.exp_terms: set = set()  # ids of exponentials printed as _exp_term (persistent(), _exp_terms())
        self.int64: bool | None = False  # the index width (None: the INT64 constexpr chooses it per launch)
        self.flat: dict = {}  # VarKind -> (variables, their contiguous strides, flat index name) in scope
        self.on_rows = False  # writing the aligned loop of `looped()`: a row's own accesses address `rflat`
        self.window = 0  # writing the window branch of `persistent()`: its group (loads and stores take its masks)
        self.windowed = 0  # the persistent form's window group, where it has the window branch (`_window`) ...
        self.window_writes = False  # ... and whether some row it writes is off 16-byte boundaries
        self.window_columns = False  # ... and whether it reads a weight by columns (element by element through it)
        self.window_classes = False  # ... and whether it has rows in classes too (WINDOW == CLASSES: `persistent`)
        self.window_itemsize = 0  # ... and the itemsize of its narrowest row's dtype (`_window`)
        # a column sum's rows in classes (`_column_classes`): its window's group, where it has the branch ...
        self.column_classes = 0
        self.column_window = 0  # ... and while that branch is written (row elements address `rflat`)
        self.top = 1  # the indent of the kernel's top level: a branch's of `persistent()` (the deferred checks')

    def pid(self) -> str:
        """The program id in the kernel's index width: every offset is computed from it (and from sizes,
        which Triton types int32 when their values fit). With the width chosen per launch the kernel has
        `INT64: tl.constexpr`, and Triton resolves the conditional when it compiles (one binary per width)."""
        if self.int64 is None:
            return "tl.program_id(0).to(tl.int64 if INT64 else tl.int32)"
        return "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"

    # -- plumbing ----------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def body(self) -> list[str]:
        """The kernel's lines, the deferred checks last (at the kernel's top level)."""
        return self.lines + ["    " + line for line in self.deferred]

    def tmp(self) -> str:
        self._tmp += 1
        return f"t{self._tmp}"

    def ptr(self, buf: str) -> str:
        name = f"p_{_sanitize(buf)}"
        self.args.setdefault(name, ("buffer", buf))
        return name

    def idx(self, expr) -> str:
        expr = derive(expr)  # a size computed through floats is an argument of its own (ir.index.derive)
        for s in expr.free_symbols:
            if not is_canonical(s) and s not in self.locals:
                self.sizes.add(s)
        return printer.index(self._flattened(expr))

    def offset(self, expr) -> str:
        """An access's offset as it follows the pointer: in a row kernel, `(row part) + (element part)`, so
        that `p + a + b` advances the pointer a row at a time and then by each element's position, rather
        than adding the two in 32-bit integers first. The sum in 32 bits may wrap as far as the compiler
        knows, so it could not fold the element positions (a block's constant lane offsets) into the load's
        address: each element took its own 64-bit address arithmetic. Hand-edited on an H200, cross-entropy's
        bfloat16 gradient over 10872 × 12345 (rows not 16-byte aligned: one 2-byte load per element), 32
        warps: `p + (q0 + 12345 * o0)` 228.8 µs, `p + 12345 * o0 + q0` 168.5 µs; softmax's and log-softmax's
        training steps at that shape took a quarter less time."""
        if not self.two_d:
            return self.idx(expr)
        if self.on_rows and self._on_row(expr) or self.column_window and self._on_column_row(expr):
            return "rflat"
        # split before idx() flattens each part (a flat index, `rindex`, is no size argument of the kernel)
        lanes = {canon_var(VarKind.CANON_REDUCTION, k) for k in range(len(self.red))}
        expr = sympy.expand(expr)
        terms = sympy.Add.make_args(expr)
        element = [t for t in terms if t.free_symbols & (lanes | self.locals)]
        row = [t for t in terms if not t.free_symbols & (lanes | self.locals)]
        if not row or not any(t in lanes for t in element):
            # only where a row's elements are consecutive along the lanes: a column sum's `o0 + 12345 * q0`
            # split so (its lanes a row apart) lost a third of its speed (LayerNorm's weight gradient)
            return self.idx(expr)
        return f"({self.idx(sympy.Add(*row))}) + ({self.idx(sympy.Add(*element))})"

    def declare(self, kind: VarKind, sizes, flat: str) -> None:
        """The canonical variables of `kind` over `sizes` come from the flat index `flat` (`_flattened`, `_on_row`)."""
        self.flat[kind] = ([canon_var(kind, k) for k in range(len(sizes))], contiguous_strides(sizes), flat)

    def decompose(self, kind: VarKind, sizes, flat: str) -> None:
        """Emit the canonical variables of `kind` over `sizes` from the flat index `flat`."""
        self.declare(kind, sizes, flat)
        for name, src in _decompose(kind.value, sizes, flat, self.sizes):
            self.emit(f"{name} = {src}")

    def _flattened(self, expr):
        """`expr` with a sum over all the canonical variables of one kind at their contiguous strides (times
        one factor) written as the flat index they came from. Triton proves an address contiguous, and
        loads it in vectors, from `xindex`, but not from `(xindex // 12345) * 12345 + xindex % 12345`: a
        bias-add over [5436, 12345] float32 rows loaded one float at a time ran at 87% of copy, 97% as xindex."""
        for vs, strides, flat in self.flat.values():
            if len(vs) < 2 or not set(vs) <= expr.free_symbols:
                continue
            expr = sympy.expand(expr)
            walk = flat_walk(expr, vs, strides)
            if walk is not None:
                expr = walk[1] + walk[0] * sympy.Symbol(flat, integer=True, nonnegative=True)
        return expr

    def canon(self, member) -> dict:
        n = len(self.outer) if member not in self.swap else len(self.red)
        cmap = canonical_map(member, n)
        if member in self.swap:  # a column member: its outer loops are the kernel's reduction loops
            flip = {}
            for v in set(cmap.values()):
                if isinstance(v, sympy.Symbol):
                    flip[v] = transposed(v)
            cmap = {k: v.xreplace(flip) for k, v in cmap.items()}
        return cmap

    def mask_for(self, expr, also=()) -> str | None:
        """The mask of an access at `expr`; `also`: loop variables an indirect index in it depends on."""
        kinds = {var_kind(s) for s in (*expr.free_symbols, *also) if is_canonical(s)}
        if not self.two_d:
            return "xmask" if VarKind.CANON_OUTER in kinds else None
        parts = (["xmask"] if VarKind.CANON_OUTER in kinds else []) + \
            (["rmask"] if VarKind.CANON_REDUCTION in kinds else [])
        return " & ".join(parts) if parts else None

    def role(self, m) -> Role | ColumnRole:
        if not self.red:
            return Role.INNER
        if m in self.swap:  # a column member: its reductions run across the kernel's rows
            r = role(m, self.red, self.outer)
            return {Role.INNER: Role.INNER, Role.REDUCTION: ColumnRole.COLUMN, Role.OUTER: ColumnRole.COLUMN_OUTER}[r]
        return role(m, self.outer, self.red)

    # -- values --------------------------------------------------------------------------------------
    def value(self, v, member, scope: _Scope, cmap) -> str:
        for node in walk(v):
            if id(node) in scope.values:
                continue
            if isinstance(node, Load):
                inside = self.by_output.get(node.buffer)
                if inside is not None:
                    var = scope.member(node.buffer)
                    if var is None:
                        raise Unsupported(f"{member.name} reads {node.buffer} before it is computed")
                    if node.indirect:  # legality keeps indirect reads of a group's own values out
                        raise Unsupported(f"{member.name} reads {node.buffer} of its own kernel indirectly")
                    scope.values[id(node)] = var
                    continue
                expr = sympy.expand(substitute(node.index, cmap))
                deps: set = set()
                if node.indirect:
                    at, deps = self.indirect(node, scope, cmap)
                    expr = expr.xreplace(at)
                scope.values[id(node)] = self.load(node.buffer, expr, scope, deps)
                self.note_row_facts(node, scope.values[id(node)], member, scope, expr)
                continue
            elif isinstance(node, Constant):
                src = printer.constant(node.value, node.dtype)
                hoist = self.invariant()
            elif isinstance(node, IndexValue):
                expr = substitute(node.expr, cmap)
                if node.indirect:
                    expr = expr.xreplace(self.indirect(node, scope, cmap)[0])
                src = f"({self.idx(expr)} + tl.full([1], 0, tl.int64)).to({tl_dtype(node.dtype)})"
                hoist = self.invariant(expr=expr)
            elif isinstance(node, Cast):
                src = printer.cast(scope.values[id(node.value)], node.value.dtype, node.dtype)
                hoist = self.invariant([scope.values[id(node.value)]])
            elif isinstance(node, Op):
                operands = [scope.values[id(a)] for a in node.args]
                src = f"_exp_term({operands[0]})" if id(node) in self.exp_terms else printer.op(node, operands)
                hoist = self.invariant(operands)
                narrow = self.narrow_compare(node, scope, cmap) if member not in self.swap else None
                spread = self.spread_select(node, operands) if narrow is None else None
                if narrow is not None:
                    src, hoist = narrow
                elif spread is not None:
                    src = spread
                if self.interpret and node.name in INTEGER_DIVISIONS and not node.args[1].dtype.is_floating_point:
                    self.check_divisor(node.args[1], scope, cmap, hoist)  # where the division goes, before it
            else:
                raise Unsupported(f"value {node!r}")
            var = self.tmp()
            self.place(f"{var} = {src}", hoist, var)
            scope.values[id(node)] = var
            self.note_row_facts(node, var, member, scope, expr if isinstance(node, IndexValue) else sympy.S.Zero)
        return scope.values[id(v)]

    def indirect(self, holder, scope: _Scope, cmap) -> tuple[dict, set]:
        """Kernel variables for the index symbols of `holder` (an indirect Load or IndexValue), and the loop
        variables their values depend on (the loads at those positions take their masks).

        Each index value (computed before, as a child of `holder`) is made int64, wrapped when negative
        values count from the end, and, unless proven in range, checked: on a GPU by `tl.device_assert`
        (the kernel is then compiled with debug=True, without which Triton drops device asserts), under
        the interpreter — which ignores device asserts whatever its options — by `_check_index`, plain
        Python in the interpreter's prelude that raises IndexError before the load. Lanes outside the
        masks are exempt (they hold the masked load's 0, or math on it). One check per distinct value and use.

        On a GPU, an index no address is made from (an IndexValue: a one-hot's compare, as cross-entropy's
        gradient has it) is checked at the kernel's end, after its stores, where its variable is in scope
        there (not inside a loop): no memory is touched through it, the assert still ends the call, and
        before the stores it held back their loads — an assert is a call the compiler may not move memory
        accesses across. On an H200, cross-entropy's bfloat16 gradient over 10872 × 12345 (persistent, 32
        warps) took 295 µs with its two checks first, 240 with them last, 237 with none. An index that
        addresses memory (a gather, a scatter's position) is checked before that access, as it must be; a
        compare of an index an access checked already takes that access's variable and check."""
        at, deps = {}, set()
        # under the interpreter every check comes before the access: one variable and check per value
        deferrable = isinstance(holder, IndexValue) and not self.interpret
        for b in holder.indirect:
            raw = scope.values[id(b.value)]
            dep = {s for v in walk(b.value) if isinstance(v, (Load, IndexValue))
                   for s in substitute(v.index if isinstance(v, Load) else v.expr, cmap).free_symbols
                   if is_canonical(s)}
            deps |= dep
            bound = self.idx(sympy.expand(b.bound))
            key = ("indirect", raw, bound, b.wrap, b.proven, deferrable)
            # a value use takes the variable an access already checked (before that access), if there is one
            var = scope.load(key) or (scope.load(key[:-1] + (False,)) if deferrable else None)
            if var is None:
                var = self.tmp()
                # a row's index (a target) is checked once, before a looped kernel's loop: in it, each step
                # checked it again, and each device_assert is followed by a barrier of the whole program
                hoist = self.invariant([raw], also=dep)
                self.place(f"{var} = {raw}.to(tl.int64)", hoist, var)
                if b.wrap:
                    self.place(f"{var} = tl.where({var} < 0, {var} + {bound}, {var})", hoist)
                if not b.proven:
                    ok = f"(({var} >= 0) & ({var} < {bound}))"
                    mask = self.mask_for(sympy.S.Zero, dep)
                    if self.interpret:
                        self.place(f"_check_index({raw}, {ok}, {mask or 'None'}, {b.what!r}, {bound})", hoist)
                    else:
                        self.debug = True
                        cond = f"{ok} | ~({mask})" if mask else ok
                        message = f"index out of bounds for {b.what} with size {b.bound}"
                        check = f"tl.device_assert({cond}, {message!r})"
                        # deferred only from the kernel's top level (`top`: indent 1, or a branch of the persistent
                        # form's), where the variable and the masks it uses stay in scope to the end (a loop's own,
                        # as the mix kernel's rows, do not)
                        if deferrable and (self.hoist[1] if hoist else self.indent) == self.top:
                            self.deferred.append(check)
                        else:
                            self.place(check, hoist)
                # put before the loop: known there for every later loop too (one check a value and use)
                (self.hoist[2] if hoist else scope).loads[key] = var
            sym = sympy.Symbol(var, integer=True, nonnegative=True)
            self.locals.add(sym)
            self.local_bounds[sym] = sympy.expand(b.bound)
            at[b.symbol] = sym
        return at, deps

    # -- two rewrites of a body's math, exact and cheaper per element ---------------------------------
    def spread_select(self, node: Op, operands: list) -> str | None:
        """`where(c, a, b) ∘ k` as `where(c, a ∘ k, b ∘ k)` in a reduction kernel where `a`, `b` and `k` are
        the same along a row and `c` is not: the row's two results are computed once (before a looped
        kernel's loop) and each element only selects. Bit for bit the same values: each lane still applies
        ∘ to the same two operands. Cross-entropy's gradient is such math (`where(i1 == target, -1, 0) *
        scale`, the one-hot another member of the kernel): a multiply an element, saved. Add, sub and mul
        of floats only: an integer division by the branch not taken could divide by zero. `operands` are
        the kernel variables of `node`'s arguments; the source of the select, or None."""
        if node.name not in ("add", "sub", "mul") or not node.dtype.is_floating_point:
            return None
        for k, var in enumerate(operands):
            other = operands[1 - k]
            if var not in self.selects or self.varying.get(other, True):
                continue
            c, a, b = self.selects[var]
            made = []
            for branch in (a, b):
                pair = [branch, other] if k == 0 else [other, branch]
                made.append(self.tmp())
                self.place(f"{made[-1]} = {printer.op(node, pair)}", self.invariant(pair), made[-1])
                self.varying[made[-1]] = False
            return f"tl.where({c}, {made[0]}, {made[1]})"
        return None

    def note_row_facts(self, node, var: str, member, scope: _Scope, index) -> None:
        """Record whether `var` (the value of `node`) may differ between the elements of a row (it reads at a
        reduction variable, or computes from a value that does), and, for a select of two row values by an
        element's condition, its parts (spread_select). `index`: a leaf's index in the kernel's variables, as
        `value` computed it. Outside reduction kernels, and in a mix-order kernel's column members (their
        loops are transposed), every value counts as varying."""
        if not self.red or member in self.swap:
            self.varying[var] = True
            return
        if isinstance(node, (Op, Cast)):
            parts = [scope.values[id(a)] for a in (node.args if isinstance(node, Op) else (node.value,))]
            self.varying[var] = any(self.varying.get(p, True) for p in parts)
            if isinstance(node, Op) and node.name == "where" and self.varying.get(parts[0], True) \
                    and not any(self.varying.get(p, True) for p in parts[1:]) \
                    and node.args[1].dtype == node.args[2].dtype == node.dtype:
                self.selects[var] = tuple(parts)
            return
        held = [scope.values[id(b.value)] for b in getattr(node, "indirect", ())]
        self.varying[var] = any(var_kind(s) == VarKind.CANON_REDUCTION for s in index.free_symbols) \
            or any(self.varying.get(h, True) for h in held)

    def narrow_compare(self, node: Op, scope: _Scope, cmap) -> tuple[str, bool] | None:
        """A comparison of index values (int64, as aten's) computed in int32 where both sides fit it over
        every lane (loop variables past the sizes too): a one-hot's `i1 == target`, a causal mask's
        `i0 >= i1`. Each element then compares one 32-bit register instead of two, after widening its
        position to 64 bits; the target is narrowed once a row. A target is in range after its check
        (or proven): out of range, the call fails on that check, whatever was compared. Only in kernels
        with int32 offsets and static sizes, and not in a mix-order kernel's column members (whose loops are the
        kernel's transposed); (src, hoist) or None."""
        if node.name not in COMPARISONS or self.int64 is not False:
            return None
        sides = []
        for a in node.args:
            if isinstance(a, IndexValue) and a.dtype in (torch.int32, torch.int64):
                expr = substitute(a.expr, cmap)
                if a.indirect:
                    expr = expr.xreplace(self.indirect(a, scope, cmap)[0])  # the checked variables, known
            elif isinstance(a, Constant) and a.dtype in (torch.int32, torch.int64):
                expr = sympy.Integer(a.in_range())
            else:
                return None
            if not self.fits_int32(expr):
                return None
            sides.append(expr)
        if not any(isinstance(a, IndexValue) for a in node.args):
            return None
        sides = [e.xreplace({s: self.narrowed(s, scope) for s in e.free_symbols if s in self.locals})
                 for e in sides]
        hoist = all(self.invariant(expr=e) for e in sides)
        return printer.op(node, [self.idx(e) for e in sides]), hoist

    def fits_int32(self, expr) -> bool:
        """Whether an affine index expression stays inside int32 over its variables' ranges: a loop
        variable's with room for the lanes a block rounds past its size, a checked index's below its bound."""
        lo = hi = 0
        for term, coeff in sympy.expand(expr).as_coefficients_dict().items():
            if not coeff.is_Integer:
                return False
            if term == 1:
                lo, hi = lo + int(coeff), hi + int(coeff)
                continue
            top = self.var_top(term)
            if top is None:
                return False
            lo, hi = lo + min(0, int(coeff) * top), hi + max(0, int(coeff) * top)
        return -(2 ** 31) < lo and hi < 2 ** 31

    def var_top(self, sym) -> int | None:
        """An upper bound of a symbol's value in any lane: a loop variable below twice its size and a block
        (lanes past the end), a checked index below its bound; None for anything else."""
        if sym in self.locals:
            bound = self.local_bounds.get(sym)
            return int(bound) if bound is not None and bound.is_Integer else None
        info = var_info(sym) if is_canonical(sym) else None
        sizes = {VarKind.CANON_OUTER: self.outer, VarKind.CANON_REDUCTION: self.red}.get(info.kind) if info else ()
        size = sympy.sympify(sizes[info.index]) if info and info.index is not None and info.index < len(sizes) else None
        return 2 * int(size) + 2 ** 16 if size is not None and size.is_Integer else None

    def narrowed(self, sym, scope: _Scope):
        """An int32 copy of the int64 kernel variable `sym` (a checked index), made once where `sym` is."""
        key = ("int32", sym.name)
        var = scope.load(key)
        if var is None:
            var = self.tmp()
            hoist = self.invariant([sym.name])
            self.place(f"{var} = {sym.name}.to(tl.int32)", hoist, var)
            (self.hoist[2] if hoist else scope).loads[key] = var
        twin = sympy.Symbol(var, integer=True, nonnegative=True)
        self.locals.add(twin)
        self.local_bounds[twin] = self.local_bounds[sym]
        return twin

    def check_divisor(self, divisor, scope: _Scope, cmap, hoist: bool = False) -> None:
        """Under the interpreter, raise as eager does on the CPU where an integer divisor is 0 in a lane
        inside the masks of the loops it depends on (a masked load's 0 is no divisor); with `hoist`, before
        the loop being written, with the division (as the GPU's kernel has it there, unchecked)."""
        deps = {s for v in walk(divisor) if isinstance(v, (Load, IndexValue))
                for s in substitute(v.index if isinstance(v, Load) else v.expr, cmap).free_symbols if is_canonical(s)}
        mask = self.mask_for(sympy.S.Zero, deps)
        self.place(f"_check_divisor({scope.values[id(divisor)]}, {mask or 'None'})", hoist)

    def load(self, buffer: str, expr, scope: _Scope, also=()) -> str:
        """The variable holding `buffer[expr]`: loaded once per distinct address in a scope and the scopes
        it is nested in. `also`: loop variables an indirect index in `expr` depends on (for the mask)."""
        key = buffer, self.idx(expr), self.mask_for(expr, also)
        var = scope.load(key)
        if var is None:
            var = self.tmp()
            index, mask = self.offset(expr), key[2]
            if not any(is_canonical(s) or s in self.locals for s in expr.free_symbols):
                # one address for every lane (a 0-dim tensor, a scalar operand): load it as a [1] block, not
                # a 0-d value. The interpreter gives a 0-d comparison the operand's dtype instead of int1,
                # and splatting it to a block then converts the bools (`x | (s != 0)` raised "ufunc
                # 'bitwise_or' not supported"); a [1] block broadcasts without conversion, on GPUs too.
                index += " + tl.full([1], 0, tl.int32)"
            if self.window and index == "rflat":  # the window's groups overlapping the row: 16-byte vectors
                mask = f"xmask & rtake{self._group_of(buffer)}"
            elif self.column_window and index == "rflat":  # a column sum's: the rows' groups the columns overlap
                mask = f"rmask & xtake{self._group_of(buffer)}"
            extra = f", {mask}, other=0" if mask else ""
            policy = self.eviction(buffer, expr)
            if policy:
                extra += f", eviction_policy={policy!r}"
            # the same address in every step of a looped kernel's loop (a row's statistic, a scalar): loaded
            # once, before it. Left in the loop, it was loaded again each step — Triton cannot move a load
            # past the loop's stores, which might alias it — (a cross-entropy backward's loop took four such
            # loads a step: the row's max, log-sum-exp, target and scale). Earlier is safe: a kernel's loads
            # read what was there before its stores (verify(); a write into an input goes last: phases())
            hoist = self.invariant(expr=expr, also=also)
            self.place(f"{var} = tl.load({self.ptr(buffer)} + {index}{extra})", hoist, var)
            (self.hoist[2] if hoist else scope).loads[key] = var  # before the loop: for what follows it too
        return var

    def invariant(self, operands=(), expr=None, also=()) -> bool:
        """Whether a value is the same in every step of the looped kernel's loop being written (False outside
        one): its operands (kernel variables) were all put before the loop, and its index (`expr`, the loop
        variables `also` of an indirect one) uses no reduction variable and no index variable of the loop."""
        if self.hoist is None or any(v not in self.hoisted for v in operands):
            return False
        syms = (set(expr.free_symbols) if expr is not None else set()) | set(also)
        return not any((is_canonical(s) and var_kind(s) == VarKind.CANON_REDUCTION)
                       or (s in self.locals and s.name not in self.hoisted) for s in syms)

    def place(self, line: str, hoist: bool, var: str | None = None) -> None:
        """Emit `line` here, or with `hoist` before the loop being written (after what was put there
        before, so operands come first); `var`, the variable it defines, is then known as put there."""
        if not hoist:
            self.emit(line)
            return
        at, indent, outer = self.hoist
        self.lines.insert(at, "    " * indent + line)
        self.hoist = (at + 1, indent, outer)
        if var is not None:
            self.hoisted.add(var)

    def eviction(self, buffer: str, expr) -> str | None:
        """The L2 policy of a load in a looped kernel's loop, as Inductor's: a looped reduction reads its
        rows in a loop per phase (a norm: the statistics, then the normalized values), and the rows a
        wave of programs has in flight may exceed L2, so the second loop's reads would go to memory again.
        What a later loop reads again, what every row reads (a weight indexed by the columns only) and
        what every iteration reads (a per-row value) is kept ("evict_last"); a last read of the streamed
        data is let go first ("evict_first"), so it does not push out what is kept. Outside loops
        (persistent kernels, pointwise ones), no hint."""
        if self.reread is None:
            return None
        kinds = {var_kind(s) for s in expr.free_symbols}
        streamed = VarKind.CANON_OUTER in kinds and VarKind.CANON_REDUCTION in kinds
        return "evict_first" if streamed and buffer not in self.reread else "evict_last"

    def prefetch(self, scope: _Scope, keep=None, gathers: bool = False) -> None:
        """Load, before any computation, what the members read from outside the kernel (where `keep(expr)`
        says so). A reduction's cross-thread sum ends in a barrier that the compiler does not move loads
        above, so a load written after a reduction would wait for it and then stall the program; issued
        first, all of a block's memory requests are in flight together (as in Inductor's kernels).

        With `gathers` (a persistent kernel), then each indirect load whose index no reduction of the kernel
        reaches — a cross-entropy's target logit, at the target its row loaded — with the index's members,
        arithmetic and bounds check before it: written where its member is, after the row's max and sum, it
        was a second round trip to memory at the end of every program (bfloat16 cross-entropy forward at
        134218 x 1000 on an H200, two rows a program: 84.3 -> 79.7 us)."""
        found = []
        for m in self.nodes:
            cmap = None
            for node in walk(m.body):
                if not isinstance(node, Load) or node.buffer in self.by_output:
                    continue
                if node.indirect:  # waits for its index, whose own loads are prefetched here
                    found.append((node, m))
                    continue
                cmap = self.canon(m) if cmap is None else cmap
                expr = sympy.expand(substitute(node.index, cmap))
                if keep is None or keep(expr):
                    self.load(node.buffer, expr, scope)  # once per address: load() looks in the scopes
        for node, m in found if gathers else ():
            needs = self._before_reductions(node)
            if needs is None:
                continue
            for early in self.nodes:  # the members the index reads, in kernel order (emit_members stores them)
                if early.name in needs and scope.member(early.output.name) is None:
                    self.compute(early, scope)
            self.value(node, m, scope, self.canon(m))

    def _before_reductions(self, v) -> set | None:
        """The names of the members value `v` reads, transitively, where none is a reduction (so `v` can be
        computed before the kernel's reductions), else None."""
        needs, todo = set(), [v]
        while todo:
            for node in walk(todo.pop()):
                inside = self.by_output.get(node.buffer) if isinstance(node, Load) else None
                if inside is None or inside.name in needs:
                    continue
                if self.role(inside) not in (Role.INNER, Role.OUTER):
                    return None
                needs.add(inside.name)
                todo.append(inside.body)
        return needs

    def compute(self, m, scope: _Scope) -> str:
        """Emit member m's body in `scope` (its reads already available) and return its value."""
        var = self.value(m.body, m, scope, self.canon(m))
        scope.members[m.output.name] = var
        return var

    def store(self, m, var: str, mask: str | None) -> None:
        if m.output.name not in self.stored:
            return
        expr = sympy.expand(m.store_index().xreplace(self.canon(m)))
        src_dtype = m.body.dtype if isinstance(m, Pointwise) else _result_dtype(m)
        val = printer.cast(var, src_dtype, m.output.dtype)
        offset = self.offset(expr)
        if self.window and offset == "rflat":  # the groups inside the row in vectors, then the row's edge lanes
            g = self._group_of(m.output.name)
            self.emit(f"tl.store({self.ptr(m.output.name)} + rflat, {val}, xmask & rwhole{g})")
            self.emit(f"tl.store({self.ptr(m.output.name)} + rflat, {val}, xmask & redge{g})")
            return
        if not _has_outer(expr):
            offset += " + 0 * xindex"  # one element per row block: the pointer must be a block too
        self.emit(f"tl.store({self.ptr(m.output.name)} + {offset}, {val}" + (f", {mask})" if mask else ")"))

    # -- kernels -------------------------------------------------------------------------------------
    def ordered_args(self) -> tuple:
        """The buffer arguments in one order for every variant of a node (sorted by name, numbers by value:
        `p_buf9` before `p_buf10`), so the wrapper passes the same arguments whichever variant runs, and
        the same kernel of two layers (`buf9, buf12` and `buf28, buf31`) takes its arguments in one order:
        the runner launches one kernel for both (`TritonRunner._kernel`)."""
        return tuple(self.args[k] for k in sorted(self.args, key=_natural))

    def header(self, constexprs, extra=()) -> list[str]:
        sig = sorted(self.args, key=_natural) + [_sanitize(s.name) for s in sorted(self.sizes, key=str)] + ["xnumel"]
        if self.two_d:
            sig.append("rnumel")
        sig += list(extra)
        sig += [f"{c}: tl.constexpr" for c in (*constexprs, *(["INT64"] if self.int64 is None else []))]
        return ["@triton.jit(debug=True)" if self.debug else "@triton.jit", f"def {self.name}({', '.join(sig)}):"]

    def numel(self, which: str) -> str:
        """How the body names the element count `which` ("xnumel", "rnumel"): the literal where the IR's
        is a number the launch passes as it is (the argument stays, so every variant and size is launched
        alike). Triton proves vector widths from what it knows of a mask's bound: a run-time count is
        assumed divisible by 16 only when it is, so a 1000-wide row masked by `rindex < rnumel` was loaded
        one element at a time (bfloat16 LayerNorm forward (134218, 1000) on an H200: 0.52 ms against
        Inductor's 0.13); against the literal 1000 it is loaded 8 at a time. (Written in, not assigned:
        `rnumel = 1000` in the body does not compile with debug=True.)"""
        size = sympy.sympify(product(self.outer) if which == "xnumel" else product(self.red))
        return str(int(size)) if size.is_Integer and which not in self.runtime else which

    def pointwise(self) -> list[str]:
        n = self.numel("xnumel")
        if not _ragged(n):
            self.emit(f"xindex = {self.pid()} * XBLOCK + tl.arange(0, XBLOCK)")
            self.emit(f"xmask = xindex < {n}")
            self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")
            self._pointwise_members()
            return self.header(["XBLOCK"]) + self.body()
        # An element count Triton cannot prove a multiple of 16 (an odd literal, or one passed at run time) makes
        # `xindex < n` a mask it cannot take in vectors, so every program loaded and stored one element at a time.
        # Whole blocks (all but the last) run the members under a mask of constant True, which it can: on an H200
        # a float32 bias + GELU over 1335 x 50257 took 200 µs one element at a time, 131 µs so (Inductor: 163).
        self.emit(f"xoffset = {self.pid()} * XBLOCK")
        self.emit("xindex = xoffset + tl.arange(0, XBLOCK)")
        self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")
        self._twice(f"xoffset <= {n} - XBLOCK", "xmask = tl.full([XBLOCK], True, tl.int1)", f"xmask = xindex < {n}",
                    self._pointwise_members)
        return self.header(["XBLOCK"]) + self.body()

    def _twice(self, whole: str, whole_mask: str, ragged_mask: str, write) -> None:
        """`if whole:` the mask `whole_mask` (constant True, which Triton takes in vectors) and the lines `write()`
        emits; `else:` `ragged_mask` and the same lines — the same names, each branch defining them alike. Lines
        `write()` hoists before the loop being written are not repeated."""
        self.emit(f"if {whole}:")
        self.indent += 1
        self.emit(whole_mask)
        hoisted = self.hoist[0] if self.hoist else 0
        mark = len(self.lines)
        write()
        lines = self.lines[mark + (self.hoist[0] if self.hoist else 0) - hoisted:]
        self.indent -= 1
        self.emit("else:")
        self.indent += 1
        self.emit(ragged_mask)
        self.lines += lines
        self.indent -= 1

    def _pointwise_members(self) -> None:
        scope = _Scope()
        for m in self.nodes:
            var = self.compute(m, scope)
            if isinstance(m, Scatter):
                self.scatter(m, var, scope)
            else:
                self.store(m, var, "xmask")

    def scatter(self, m: Scatter, var: str, scope: _Scope) -> None:
        """Write (tl.store) or add (tl.atomic_add: duplicate positions are summed) a Scatter's value at its
        indirect position, after the position's checks. The adds are relaxed atomics: no other memory
        access of the kernel depends on their order."""
        cmap = self.canon(m)
        for b in m.indirect:
            self.value(b.value, m, scope, cmap)
        at, _ = self.indirect(m, scope, cmap)
        expr = sympy.expand(substitute(m.index, cmap)).xreplace(at)
        offset = self.idx(expr)
        if not _has_outer(expr):
            offset += " + 0 * xindex"  # one position for every lane: the pointer must be a block too
        val = printer.cast(var, m.body.dtype, m.output.dtype)
        ptr = self.ptr(m.output.name)
        if m.mode == "add":
            self.emit(f"tl.atomic_add({ptr} + {offset}, {val}, xmask, sem='relaxed')")
        else:
            self.emit(f"tl.store({ptr} + {offset}, {val}, xmask)")

    def _xr(self):
        self.emit(f"xindex = {self.pid()} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.emit(f"xmask = xindex < {self.numel('xnumel')}")
        self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")

    def _rindex(self, base: str) -> None:
        self.emit(f"rindex = {base}tl.arange(0, RBLOCK)[None, :]")
        self.emit(f"rmask = rindex < {self.numel('rnumel')}")
        self.decompose(VarKind.CANON_REDUCTION, self.red, "rindex")

    def _reduce_block(self, m, val: str, acc: str | None) -> str:
        """Reduce a [XBLOCK, RBLOCK] value over axis 1, or fold it into accumulator `acc`."""
        rt, dt = m.reduction_type, m.body.dtype
        init = identity(rt, dt)
        if rt in ("argmax", "argmin"):
            v = self.tmp()
            self.emit(f"{v} = {_as_block(f'tl.where(xmask & rmask, {val}, {init})', dt)}")
            ix = self.tmp()
            self.emit(f"{ix} = rindex + tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
            if self.on_rows:  # lanes before the row have negative indices: masked, they must lose every tie
                self.emit(f"{ix} = tl.where(xmask & rmask, {ix}, 2**62)")
            if acc is None:
                return f"{self._arg_reduce(v, ix, rt)}[:, None]"
            self.emit(f"{acc}_v, {acc}_i = _{rt}_combine({acc}_v, {acc}_i, {v}, {ix})")
            return acc
        src = val if dt != torch.bool else f"{val}.to(tl.int32)"
        v = self.tmp()
        self.emit(f"{v} = {_as_block(f'tl.where(xmask & rmask, {src}, {init})', dt)}")
        if acc is None:
            out = self.tmp()
            self.emit(f"{out} = {self._reduce(v, 1, rt)}[:, None]")
            return out
        self.emit(f"{acc} = {COMBINE[rt]}({acc}, {v})")
        return acc

    def _reduce(self, v: str, axis: int, rt: str) -> str:
        """`v` reduced along `axis` by reduction type `rt`. Under the interpreter a max or min (any, all) takes
        `_max_of` / `_min_of` (printer's interpreter prelude): Triton's interpreter reduces with numpy only where the
        combine function is its own, and called `_max_combine` once an element and step otherwise — a log-softmax
        over 300 rows of 200 took 36 s a launch, 51 s for one test of three calls."""
        if self.interpret and rt in ("max", "min", "any", "all"):
            return f"{'_max_of' if rt in ('max', 'any') else '_min_of'}({v}, {axis})"
        return f"tl.reduce({v}, {axis}, {COMBINE[rt]})"

    def _arg_reduce(self, v: str, ix: str, rt: str) -> str:
        """The variable holding the index an argmax or argmin (`rt`) of values `v` at indices `ix` picks along axis 1:
        `tl.reduce` with `_argmax_combine`, or under the interpreter `_argmax_of` (numpy's reductions, as `_reduce`'s
        max; a window's argmax test took 18-23 s in CI through the combine, called once an element and step)."""
        out = self.tmp()
        if self.interpret:
            self.emit(f"{out} = _{rt}_of({v}, {ix}, 1)")
        else:
            self.emit(f"_, {out} = tl.reduce(({v}, {ix}), 1, _{rt}_combine)")
        return out

    def _acc_init(self, m, group: int | None = None) -> str:
        """A loop's accumulator of reduction member `m`: one value a lane ([XBLOCK, RBLOCK]), or with `group`
        (an online softmax pair, see `_online_step`) one a group of that many lanes."""
        rt, dt = m.reduction_type, m.body.dtype
        acc = self.tmp()
        init = identity(rt, dt)
        if rt in ("argmax", "argmin"):
            self.emit(f"{acc}_v = tl.full([XBLOCK, RBLOCK], {init}, {tl_dtype(dt)})")
            self.emit(f"{acc}_i = tl.full([XBLOCK, RBLOCK], 2**62, tl.int64)")
            return acc
        acc_dt = tl_dtype(dt) if dt != torch.bool else "tl.int32"
        width = "RBLOCK" if group is None else f"RBLOCK // {_group_expr(group)}"
        self.emit(f"{acc} = tl.full([XBLOCK, {width}], {init}, {acc_dt})")
        return acc

    def _finish_acc(self, m, acc: str) -> str:
        rt = m.reduction_type
        if rt in ("argmax", "argmin"):
            return f"{self._arg_reduce(f'{acc}_v', f'{acc}_i', rt)}[:, None]"
        out = self.tmp()
        self.emit(f"{out} = {self._reduce(acc, 1, rt)}[:, None]")
        return out

    def _reduction_result(self, m, raw: str, scope: _Scope) -> str:
        var = raw
        if m.reduction_type in ("any", "all"):
            var = self.tmp()
            self.emit(f"{var} = {raw} != 0")
        elif m.reduction_type == "sum" and m.body.dtype.is_floating_point:
            # eager's sums start from +0.0: a row of -0.0 sums to +0.0 (a block with no masked lane summed
            # to -0.0); x + 0.0 is x for every other x
            var = self.tmp()
            self.emit(f"{var} = {raw} + 0.0")
        scope.members[m.output.name] = var
        return var

    def persistent(self) -> list[str]:
        self._xr()
        self.exp_terms = self._exp_terms()
        groups, self.window_writes, self.window_columns = self._window()
        group = self.windowed = max(groups, default=0)
        # rows in classes where a weight is read by columns: loaded once a program, not once a row (`_classes`)
        self.window_classes = bool(group) and self.window_columns and _class_loops(self.interpret)
        if self.window_classes:  # WINDOW == CLASSES: a program's share of one class's rows (configs.windowed)
            self.emit(f"if WINDOW == {CLASSES}:")
            self.indent += 1
            self.top = self.indent
            self._classes(self.pid(), groups)
            per_program = _Scope()
            self.prefetch(per_program, keep=lambda e: not _has_outer(e))
            self._class_loop(group, typed=True)
            self.on_rows, self.window = True, group
            self._persistent_members(_Scope(per_program))
            self.on_rows, self.window = False, 0
            self.indent -= 2
        if group:  # WINDOW (a constexpr the launch sets, configs.windowed): the row through the window, else plain
            self.emit("elif WINDOW:" if self.window_classes else "if WINDOW:")
            self.indent += 1
            self.top = self.indent
            self._window_rows(groups)
            self.on_rows, self.window = True, group
            self._persistent_members()
            self.on_rows, self.window = False, 0
            self.indent -= 1
            self.emit("else:")
            self.indent += 1
        self._rindex("")
        self._persistent_members()
        self.indent -= bool(group)
        self.top = 1
        return self.header(["XBLOCK", "RBLOCK", *(["WINDOW"] if group else [])]) + self.body()

    def _persistent_members(self, scope: _Scope | None = None) -> None:
        """Every member over whole rows (emit_members), its loads first (prefetch), and the deferred index checks
        after its stores: here, in this branch, whose variables the other branches of `persistent()` do not have
        (`scope`: the rows' own, inside what the branch loaded before them)."""
        scope = _Scope() if scope is None else scope
        self.prefetch(scope, gathers=True)
        self.emit_members(scope)
        for line in self.deferred:
            self.emit(line)
        self.deferred = []

    def _window(self, mix: bool = False) -> tuple:
        """(groups, writes, columns): the groups of the aligned window through which the persistent form (or, with
        `mix`, a mix-order kernel's rows in classes: `generate_mix`) can read and write its rows (see `_window_rows`),
        in elements: 16 bytes of each dtype its rows have (8 for bfloat16, 4 for float32), the narrowest's the
        window's own, () where it has none; whether a row it writes is off 16-byte boundaries (else only rows it
        reads are); and whether it reads a weight by columns. A window where some row it reads or writes does not
        start on 16-byte boundaries (`_rows_off_vectors`'s rows: `p + W * row + q0`, every element a store or a load
        of its own — 128 `st.global.b16` a thread for a bfloat16 row of 12345 on 4 warps, 65 `ld.global.b16` for a
        cross-entropy forward's row on 8), and every access along the lanes is to whole rows (`_on_row`) or to the
        columns alone: a weight read by columns (a norm's) is loaded at each lane's column, element by element
        (`window_columns`: timed, never by rule; on an H200 LayerNorm's bfloat16 dx at 10872 x 12345 took 264.7 µs
        so, its plain loop 369.9; sixtieth session). An index read along the lanes (a gather's) is kept out,
        conservatively (its checks and loads take the row's own lanes, but no such kernel was measured). One
        reduction variable, a width in the source; mix-order columns only with `mix`. Near a power of two every
        group is capped at `window_cap(width)`, so the row's own block holds the head (`window_itemsize`: the
        narrowest row dtype's size, which the group no longer names); no window where that leaves one element."""
        width = sympy.sympify(product(self.red))
        if len(self.red) != 1 or not self.outer or not width.is_Integer or "rnumel" in self.runtime or \
                (self.swap and not mix):
            return (), False, False
        lane = canon_var(VarKind.CANON_REDUCTION, 0)
        sizes, off, writes, columns = [], False, False, False
        for m in self.nodes:
            if isinstance(m, Scatter):
                return (), False, False
            cmap = self.canon(m)
            for n in walk(m.body):
                if isinstance(n, (Load, IndexValue)) and any(
                        lane in substitute(v.index if isinstance(v, Load) else v.expr, cmap).free_symbols
                        for b in n.indirect for v in walk(b.value) if isinstance(v, (Load, IndexValue))):
                    return (), False, False  # an index that varies along the row
            for buffer, index, load in self._accesses(m):
                expr = sympy.expand(substitute(index, cmap))
                if (load is not None and buffer in self.by_output) or lane not in expr.free_symbols:
                    continue  # a value of the kernel's own, a row's own value, or one value for all
                if load is not None and not _has_outer(expr):
                    columns = True  # a weight by columns: loaded at each lane's column (`rindex`, masked to the row)
                    continue
                if not self._on_row(expr) or buffer not in self.buffers:
                    return (), False, False
                size = self.buffers[buffer].dtype.itemsize
                sizes.append(size)
                row_off = int(width) * size % 16 != 0
                off |= row_off
                writes |= row_off and load is None
        if not off:
            return (), False, False
        cap = window_cap(int(width))
        groups = tuple(sorted({min(16 // s, cap) for s in sizes}, reverse=True))
        if groups[0] < 2:
            return (), False, False
        self.window_itemsize = min(sizes)
        return groups, writes, columns

    def _accesses(self, m) -> list:
        """Member m's accesses as (buffer, index in its own variables, the Load or None for its store): its store
        where it is stored, then every load of its body (`_rows_off_vectors` and `_window` read them)."""
        out = [(m.output.name, m.store_index(), None)] if m.output.name in self.stored else []
        return out + [(n.buffer, n.index, n) for n in walk(m.body) if isinstance(n, Load)]

    def _window_rows(self, groups: tuple) -> None:
        """A persistent block's rows read and written through an aligned window: each row's block starts at the boundary
        of the window's group (`groups[0]` elements: 16 bytes of the narrowest dtype, fewer near a power of two:
        `window_cap`) of the flat buffer at or before the row (`rlo`), and its accesses address `rflat`, which Triton
        knows to be a multiple of the group plus the lanes. Each dtype's accesses take the masks of its own group, 16
        bytes of it (`rtake8`, `rwhole4`...; `rlo` is a multiple of every one): loads read whole groups that hold some
        of the row (`rtake`: up to group - 1 elements of the rows either side, never past the 16-byte vector that holds
        a row element — with the narrowest dtype's group for all, a float32 buffer beside a bfloat16 one was read 16
        bytes past the vector holding its last element) in vectors; stores write the groups wholly inside the row in
        vectors (`rwhole`) and the row's edge lanes element by element (`redge`), so nothing outside the row is written.
        `rindex` is the element's column (negative before the row), `rmask` the row's own lanes, which the reductions
        take. RBLOCK holds the row and up to group - 1 lanes before it (configs.windowed, which sets WINDOW).
        Hand-written, a bfloat16 cross-entropy backward on an H200 (do_bench µs, best warps; each `st.global.b16` a
        thread became 8 to a `st.global.v4`): 10872 x 12345 168.8 -> 138.2, 2671 x 50257 608.6 -> 150.4, 16384 x 8191
        167.5 -> 135.5, 44739 x 3001 169.3 -> 134.5; float32 5436 x 12345 150.3 -> 134.6. Loads read element by element
        at the edges instead (nothing read outside the row) lost most of the gain (`.scratch_gpu/s58_window2.py`)."""
        w = self.numel("rnumel")
        # the row's start in 64 bits, as its window's every offset: from an int32 `xindex * W`, `(rbase // 8) * 8`
        # and the lanes' masks compiled to 178 registers a thread for cross-entropy's backward (4 warps, 12345 wide),
        # 80 so (compiled for sm_90, a hand-edited generated kernel)
        self.emit(f"rbase = xindex.to(tl.int64) * {w}")
        self.emit(f"rlo = (rbase // {groups[0]}) * {groups[0]}")
        self.emit("rhead = rbase - rlo")
        self.emit("rlane = tl.arange(0, RBLOCK)[None, :]")
        self.emit("rflat = rlo + rlane")
        self._window_lanes(groups)

    def _window_lanes(self, groups: tuple) -> None:
        """The window's lanes, from `rlane` (0 to RBLOCK) and `rhead` (the lanes before the row): each lane's column
        (`rindex`, negative before the row), the row's own lanes (`rmask`), and each group's masks (`_window_rows`)."""
        w = self.numel("rnumel")
        self.emit("rindex = rlane - rhead")
        self.emit(f"rmask = (rindex >= 0) & (rindex < {w})")
        for g in groups:
            self.emit(f"rgroup{g} = (rlane // {g}) * {g}")
            self.emit(f"rtake{g} = (rgroup{g} < rhead + {w}) & (rgroup{g} + {g} > rhead)")
            self.emit(f"rwhole{g} = (rgroup{g} >= rhead) & (rgroup{g} + {g} <= rhead + {w})")
            self.emit(f"redge{g} = rmask & ~rwhole{g}")
        self.decompose(VarKind.CANON_REDUCTION, self.red, "rindex")

    def _classes(self, pid: str, groups: tuple) -> None:
        """A program's rows in classes (a mix-order kernel's WINDOW branch in `generate_mix`, a persistent one's WINDOW
        == CLASSES branch): rows a multiple of `groups[0]` (G: 16 bytes of the narrowest dtype, or `window_cap`'s) apart
        start at the same offset from a G-element boundary (`rhead`: row r of width W starts (r * W) % G elements past
        one), so a program that takes rows of one class (`rclass`, its id modulo G) reads and writes every one of them
        through one aligned window (`_window_rows`' masks, the same for all its rows): lane l holds column l - rhead of
        each row. What it reads by columns alone (a norm's weight) it loads once, before its rows (the persistent form's
        one-row window loaded it again, element by element, each row); a mix-order program sums its columns at the same
        lanes and stores its partial sums at their columns once, at the end. The programs of a class (the launch's,
        numbered alike: a mix-order one's a workspace row each, as in the plain form) share its rows evenly (`class_lo`
        to `class_hi`, counted within the class; `_class_loop` walks them). Written `p + W * row + q0` with an odd W,
        every element of such rows was a load of its own."""
        g0, width, rows = groups[0], self.numel("rnumel"), self.numel("xnumel")
        self.emit(f"program = {pid}")
        self.emit(f"rclass = program % {g0}")
        self.emit(f"class_rows = ({rows} - rclass + {g0 - 1}) // {g0}")
        self.emit(f"class_programs = (tl.num_programs(0) - rclass + {g0 - 1}) // {g0}")
        self.emit(f"rank = (program // {g0}).to(tl.int64)")
        self.emit("class_lo = rank * class_rows // class_programs")
        self.emit("class_hi = (rank + 1) * class_rows // class_programs")
        self.emit(f"rhead = (rclass * {width}) % {g0}")
        self.emit("rlane = tl.arange(0, RBLOCK)[None, :]")
        self._window_lanes(groups)

    def _class_loop(self, group: int, stages: str | None = None, typed: bool = False) -> None:
        """The loop over a program's rows of its class (`_classes`), XBLOCK a step (`stages`: the loop's pipeline
        depth), opened here: each row's index and mask, its loop variables, and its start less its head (`rflat`),
        a multiple of the group, so that its accesses are the group's vectors. With `typed` the row index takes the
        type of the `xindex` written before the loop (the persistent form's, in its index width): Triton refuses a
        variable whose type a loop changes, and the class's bounds are int64."""
        pipelined = f", num_stages={stages}" if stages else ""
        self.emit(f"for xoffset in tl.range(class_lo, class_hi, XBLOCK{pipelined}):")
        self.indent += 1
        self.emit("xrow = xoffset + tl.arange(0, XBLOCK)[:, None]")
        self.emit(f"xindex = (rclass + {group} * xrow).to(xindex.dtype)" if typed else
                  f"xindex = rclass + {group} * xrow")
        self.emit("xmask = xrow < class_hi")
        self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")
        self.emit(f"rflat = (xindex.to(tl.int64) * {self.numel('rnumel')} // {group}) * {group} + rlane")

    def _group_of(self, buffer: str) -> int:
        """The window's group of `buffer`'s accesses: 16 bytes of its dtype (`_window_rows`), at most the row window's
        own group (`window_cap`; a column sum's window is never capped)."""
        group = 16 // self.buffers[buffer].dtype.itemsize
        return min(group, self.window) if self.window else group

    def emit_members(self, scope: _Scope, column=None) -> None:
        """Every member in order, with whole rows in the tile: reductions reduce the tile, the others are
        computed and stored as needed; `column(m, value)` takes the mix-order column reductions.

        A row's own values (a norm's mean and rstd: one element a row) are stored after every member, not
        where they are computed: between a row's reductions such a store slowed an H200's LayerNorm training
        forward at 536871 x 250 float16 from 149.8 to 169.9 us on 4 rows a warp and from 139.2 to 144.3 on 8
        (Inductor's kernel, its statistics stored last: 144.1; a copy 134.5). Nothing in the kernel reads them
        back from memory: a fused consumer takes the value, and where a member writes a graph input in place the
        other members read that input's old value, before the write (legality; verify() refuses a later reader
        and a second writer of the input), so a later store is still after every read of it."""
        last = []  # (member, value): row values, stored at the end
        for m in self.nodes:
            r = self.role(m)
            if r in (Role.REDUCTION, ColumnRole.COLUMN):
                val = self.value(m.body, m, scope, self.canon(m))
                if r == ColumnRole.COLUMN:
                    column(m, val)
                    continue
                var = self._reduction_result(m, self._reduce_block(m, val, None), scope)
            else:
                var = self.compute(m, scope)
            if r == Role.INNER:
                self.store(m, var, "xmask & rmask")
            else:
                last.append((m, var))
        for m, var in last:
            self.store(m, var, "xmask")

    def phases(self) -> tuple[dict, dict]:
        """(phase, avail): the loop phase of each in-loop member and reduction, and the first phase each
        member's value can be used in."""
        avail: dict = {}
        phase: dict = {}
        online = self.online_pairs()
        for m in self.nodes:
            deps = [avail[b] for b in m.read_names() if b in avail]
            p = max(deps, default=0)
            r = self.role(m)
            if m.name in online:  # accumulated with its max, in the max's loop
                phase[m.name] = phase[online[m.name].name]
                avail[m.output.name] = phase[m.name] + 1
            elif r == Role.REDUCTION:
                phase[m.name] = p
                avail[m.output.name] = p + 1
            elif r == Role.INNER:
                phase[m.name] = p
                avail[m.output.name] = p
            else:
                avail[m.output.name] = p
        # A member writing a graph input in place goes last: the kernel's other members read that input's old
        # value from memory (they come before the write in program order: legality), and a read in a later
        # phase's loop — a norm's second pass over x, a reduction over rows weighted by the input's per-row
        # value — ran after the write when the writer kept its own phase (the row's values came out doubled
        # for `y = x - x.mean(-1, keepdim=True); x.mul_(2)` at 70000 wide). Whole elements: in the last loop,
        # after the members before it; a row's value: after every loop.
        last = max(phase.values(), default=0)
        for m in self.nodes:
            if getattr(m, "in_place", False):
                r = self.role(m)
                if r == Role.INNER:
                    phase[m.name] = last
                elif r == Role.OUTER:
                    avail[m.output.name] = last + 2
        return phase, avail

    def online_pairs(self) -> dict:
        """{sum member: max member} for each reduction computing sum(exp(v - max(v))) over the kernel's rows
        where the max of the same v is a member too (softmax, log-softmax, cross-entropy: the sum of the
        exponentials after the max). The looped form accumulates such a sum in the max's own loop with
        online rescaling, so the row is read once instead of twice (the persistent form reads it once
        anyway)."""
        if self.online is not None:
            return self.online
        self.online = {}
        reds = [m for m in self.nodes if isinstance(m, Reduction) and self.role(m) == Role.REDUCTION]
        maxes = [m for m in reds if m.reduction_type == "max" and m.body.dtype in (torch.float32, torch.float64)]
        for sm in reds:
            if sm.reduction_type != "sum" or sm.body.dtype not in (torch.float32, torch.float64) or not maxes:
                continue
            body = self._expanded(sm.body, sm)
            if body is None:
                continue
            if not (isinstance(body, Op) and body.name == "exp" and isinstance(body.args[0], Op)
                    and body.args[0].name == "sub"):
                continue
            v, mx_load = body.args[0].args
            for mx in maxes:
                at = sympy.expand(mx.store_index().xreplace(self.canon(mx)))
                if isinstance(mx_load, Load) and mx_load.buffer == mx.output.name and mx_load.index == at \
                        and mx.body.dtype == sm.body.dtype and v is not None and self._expanded(mx.body, mx) == v:
                    self.online[sm.name] = mx
                    break
        return self.online

    def _exp_terms(self) -> set:
        """ids of the exponentials that are terms of an online pair's sum and nothing else (its exp(v - max(v)),
        in its body or a member only the sum reads, and stores nowhere): `_exp_term` (one ex2.approx.ftz)
        prints them, as the looped form's online loop does. The largest term is exp(0) = 1, so a flushed
        subnormal term is lost in the sum's rounding anyway; a row of -inf or NaN gives NaN either way."""
        terms = set()
        for name in self.online_pairs():
            body, reader = self.by_name(name).body, name
            while isinstance(body, Load) and body.buffer in self.by_output:
                m = self.by_output[body.buffer]
                if m.output.name in self.stored or any(
                        isinstance(v, Load) and v.buffer == m.output.name
                        for o in self.nodes if o.name != reader for v in walk(o.body)):
                    break
                body, reader = m.body, m.name
            if isinstance(body, Op) and body.name == "exp" and not any(
                    v is body for o in self.nodes if o.name != reader for v in walk(o.body)):
                terms.add(id(body))
        return terms

    def _expanded(self, v, m, limit: int = 64):
        """Member m's value v in the kernel's canonical variables, with the loads of in-loop members'
        outputs replaced by their (expanded) values, so that two members' values compare as expressions;
        None past `limit` values (a softmax's are a handful; big fused groups are not worth expanding).
        Each member is expanded once (memoized), so shared members cost nothing more."""
        memo = self._expansions
        key = (m.name, id(v))
        if key in memo:
            return memo[key]
        cmap = self.canon(m)
        too_big = []

        def leaf(u):
            if isinstance(u, Load):
                p = self.by_output.get(u.buffer)
                if p is not None and not isinstance(p, Reduction) and self.role(p) == Role.INNER:
                    inner = self._expanded(p.body, p, limit)
                    if inner is None:
                        too_big.append(p)
                        return u
                    return inner if inner.dtype == u.dtype else Cast(inner, u.dtype)
                return attrs.evolve(u, index=sympy.expand(substitute(u.index, cmap)))
            if isinstance(u, IndexValue):
                return attrs.evolve(u, expr=sympy.expand(substitute(u.expr, cmap)))
            return u

        out = None
        if sum(1 for _ in walk(v)) <= limit:
            out = rebuild(v, leaf)
            if too_big or sum(1 for _ in walk(out)) > limit:
                out = None
        memo[key] = out
        return out

    def looped(self) -> list[str]:
        self._xr()
        groups = self._column_window() if _class_loops(self.interpret) else ()
        if groups:  # WINDOW (a constexpr the launch sets): the column sum's rows in classes, else the plain loop
            start = len(self.lines)
            self.emit("if WINDOW:")
            self.indent += 1
            try:
                self._column_classes(groups)
            except Unsupported:  # a form `_column_window` did not foresee: the kernel keeps the plain loop alone
                del self.lines[start:]
                self.indent, self.column_window, self.hoist, self.reread, groups = 1, 0, None, None, ()
            else:
                self.indent -= 1
                self.emit("else:")
                self.indent += 1
        self.column_classes = groups[0] if groups else 0
        aligned = self._rows_off_vectors()  # then the aligned loop too
        if aligned:  # the row's first element, and the 16-element boundary at or before it
            self.emit(f"rbase = {self.pid()} * {self.numel('rnumel')}")
            self.emit("rlo = (rbase // 16) * 16")
            self.emit("rhead = rbase - rlo")
        phase, avail = self.phases()
        online = self.online_pairs()
        outer_scope = _Scope()
        n_phases = max(phase.values(), default=-1) + 1
        done: set = set()

        def outer_ready(limit):
            for m in self.nodes:
                if self.role(m) == Role.OUTER and m.name not in done and avail[m.output.name] <= limit:
                    var = self.compute(m, outer_scope)
                    self.store(m, var, "xmask")
                    done.add(m.name)

        def needed_in(p):
            # in-loop values are computed where a reduction of this loop reads them or they are stored (an
            # online sum's exponentials are neither: such a loop may have nothing to do)
            return ({m.name for m in self.nodes if self.role(m) == Role.INNER and phase[m.name] == p
                     and m.output.name in self.stored}
                    | {m.name for m in self.nodes if self.role(m) == Role.REDUCTION and phase[m.name] == p})

        needs = [needed_in(p) for p in range(n_phases)]
        reads = [self._loop_reads(n) for n in needs]
        paired = set(online) | {mx.name for mx in online.values()}
        for p in range(n_phases):
            outer_ready(p)
            reds = [m for m in self.nodes if self.role(m) == Role.REDUCTION and phase[m.name] == p]
            needed = needs[p]
            if not needed:
                continue
            group = self._online_group(reads[p]) if paired & {m.name for m in reds} else None
            accs = {m.name: self._acc_init(m, group if m.name in paired else None) for m in reds}
            self.hoist = (len(self.lines), self.indent, outer_scope)
            self.reread = set().union(*reads[p + 1:])
            if aligned:
                self.emit("if XBLOCK == 1:")
                self.indent += 1
                self._aligned_loop(needed, outer_scope, phase, p, accs, group)
                self.indent -= 1
                self.emit("else:")
                self.indent += 1
            self.emit(f"for roffset in range(0, {self.numel('rnumel')}, RBLOCK):")
            self.indent += 1
            self._rindex("roffset + ")
            self._demand(needed, _Scope(outer_scope), phase, p, accs, group)
            self.indent -= 1 + aligned
            self.reread = self.hoist = None
            finished = {}
            for m in reds:
                if m.name in online:
                    raw = self._finish_online(accs[m.name], accs[online[m.name].name], finished[online[m.name].name])
                else:
                    raw = finished[m.name] = self._finish_acc(m, accs[m.name])
                var = self._reduction_result(m, raw, outer_scope)
                self.store(m, var, "xmask")
        outer_ready(n_phases + 1)
        self.indent -= bool(groups)
        return self.header(["XBLOCK", "RBLOCK", *(["WINDOW"] if groups else [])]) + self.body()

    def _column_window(self) -> tuple:
        """The groups (as `_window`'s: 16 bytes of each dtype of its rows, the narrowest's first) of a column sum
        whose rows do not start on 16-byte boundaries, where it can take them in classes (`_column_classes`), else
        (). A column sum walks its columns along the lanes and its rows in the loop: element (row, column) of a
        row-major [rows, W] buffer, `p + o0 + W * q0`, with an odd W (12345 bfloat16 elements: 24690 bytes) is a
        load of its own for each element, however many columns a thread takes (LayerNorm's weight and bias
        gradients at 10872 x 12345 bfloat16 ran at 39% of copy on an H200, sixtieth session). Only a kernel of
        sums (one reduction variable, the rows; one outer, the columns, W in the source) whose loads are such row
        elements, values of a row (`q0` alone: a norm's statistics), of a column (`o0` alone) or of the kernel,
        and that stores nothing row-sized, in one loop; no indirect loads, no online softmax, no count passed at run
        time."""
        if len(self.red) != 1 or len(self.outer) != 1 or self.runtime or self.online_pairs() \
                or max(self.phases()[0].values(), default=0) > 0:
            return ()  # (a second loop, over a first's results: a variance after its mean)
        width = sympy.sympify(self.outer[0])
        if not width.is_Integer:
            return ()
        row, col = canon_var(VarKind.CANON_REDUCTION, 0), canon_var(VarKind.CANON_OUTER, 0)
        columns = {m.output.name for m in self.nodes if self.role(m) == Role.OUTER}
        sizes, off = [], False
        for m in self.nodes:
            role_ = self.role(m)
            if isinstance(m, Scatter) or getattr(m, "in_place", False) \
                    or (role_ == Role.REDUCTION and m.reduction_type != "sum") \
                    or (role_ == Role.INNER and m.output.name in self.stored) \
                    or (role_ in (Role.INNER, Role.REDUCTION) and columns & set(m.read_names())):
                return ()  # (a column's own value read in the loop would be another lane's in a class)
            if any(isinstance(n, Load) and n.indirect for n in walk(m.body)):
                return ()
            cmap = self.canon(m)
            for buffer, index, load in self._accesses(m):
                expr = sympy.expand(substitute(index, cmap))
                syms = expr.free_symbols
                if any(s not in (row, col) and (is_canonical(s) or s in self.locals) for s in syms):
                    return ()
                if load is None or buffer in self.by_output or not (row in syms and col in syms):
                    continue  # a column's result, a value of the kernel's own, of one row or of one column
                if not self._on_column_row(expr) or buffer not in self.buffers:
                    return ()
                size = self.buffers[buffer].dtype.itemsize
                sizes.append(size)
                off |= int(width) * size % 16 != 0
        return tuple(sorted({16 // s for s in sizes}, reverse=True)) if off else ()

    def _on_column_row(self, expr) -> bool:
        """Whether `expr` is element (q0, o0) of a row-major [rows, W] buffer whose W columns are the kernel's outer
        loop and rows its reduction: o0 + W * q0 (a column sum's data)."""
        row, col = canon_var(VarKind.CANON_REDUCTION, 0), canon_var(VarKind.CANON_OUTER, 0)
        return len(self.outer) == 1 and sympy.expand(expr - col - product(self.outer) * row) == 0

    def _column_classes(self, groups: tuple) -> None:
        """A column sum's WINDOW branch (`_column_window`): its rows in classes, as a mix-order kernel's
        (`_classes`): rows G apart (G = `groups[0]`, 16 bytes of the narrowest dtype) start at one offset from a
        G-element boundary (`rhead`: (r * W) % G). A program owns XBLOCK - G columns from `xbase` (a multiple of G)
        and walks the classes one after another; for each, its rows RBLOCK at a time, each row read through the
        aligned window of XBLOCK lanes from its start less its head (`rflat`: whole 16-byte groups that overlap the
        row, `xtake`), so lane l holds column xbase + l - rhead of every row of the class. The lanes of the
        program's own columns are summed (`xmask`), the class's sums are reduced over its rows and moved back by
        `rhead` lanes (`tl.gather`) into the program's totals, which are then the plain form's results at lane l
        for column xbase + l: the reductions' epilogues and stores follow as there. The launch runs cdiv(W,
        XBLOCK - G) programs (runner.Kernel.grid). Timed on an H200 in the sixty-second session (the figures in
        configs.column_class_band): 223 µs against the plain block's 230 at 10872 x 12345 bfloat16, 182 against 228
        at 8192 x 9001 float32; a hand-written one, a class a program with partial sums through memory, had taken 137
        (sixtieth session), but splitting the generated sum over more programs lost (docs/benchmarks.md)."""
        g0, width, rows = groups[0], self.numel("xnumel"), self.numel("rnumel")
        phase, _ = self.phases()
        reds = [m for m in self.nodes if self.role(m) == Role.REDUCTION]
        needed = {m.name for m in reds}
        self.emit(f"xbase = {self.pid()} * (XBLOCK - {g0})")
        self.emit("xlane = tl.arange(0, XBLOCK)[:, None]")
        totals = {}
        for m in reds:
            totals[m.name] = self.tmp()
            self.emit(f"{totals[m.name]} = tl.full([XBLOCK, 1], 0, {tl_dtype(m.body.dtype)})")
        self.emit(f"for rclass in range(0, {g0}):")
        self.indent += 1
        self.emit(f"rhead = (rclass * {width}) % {g0}")
        # the lanes' columns in the type of the plain form's (Triton refuses a variable whose type a loop changes)
        self.emit("xindex = (xbase + xlane - rhead).to(xindex.dtype)")
        self.emit(f"xmask = (xindex >= xbase) & (xindex < xbase + XBLOCK - {g0}) & (xindex < {width})")
        for g in groups:
            self.emit(f"xgroup{g} = xbase + (xlane // {g}) * {g}")
            self.emit(f"xtake{g} = (xgroup{g} < rhead + {width}) & (xgroup{g} + {g} > rhead)")
        self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")
        accs = {m.name: self._acc_init(m) for m in reds}
        in_class = _Scope()  # what a class's lanes hold: its columns' values are put before its rows' loop
        self.hoist, self.reread = (len(self.lines), self.indent, in_class), set()
        self.emit(f"for roffset in range(0, ({rows} - rclass + {g0 - 1}) // {g0}, RBLOCK):")
        self.indent += 1
        self.emit(f"rindex = rclass + {g0} * (roffset + tl.arange(0, RBLOCK)[None, :])")
        self.emit(f"rmask = rindex < {rows}")
        self.decompose(VarKind.CANON_REDUCTION, self.red, "rindex")
        self.emit(f"rflat = (rindex.to(tl.int64) * {width} // {g0}) * {g0} + xbase + xlane")
        self.column_window = g0
        self._demand(needed, _Scope(in_class), phase, 0, accs, None)
        self.column_window = 0
        self.hoist = self.reread = None
        self.indent -= 1
        for m in reds:  # the class's sums, lane l + rhead moved to lane l: column xbase + l
            part = self._finish_acc(m, accs[m.name])
            self.emit(f"{totals[m.name]} = {totals[m.name]} + "
                      f"tl.gather({part}, tl.minimum(xlane + rhead, XBLOCK - 1), 0)")
        self.indent -= 1
        self.emit("xindex = (xbase + xlane).to(xindex.dtype)")
        self.emit(f"xmask = (xlane < XBLOCK - {g0}) & (xindex < {width})")
        self.decompose(VarKind.CANON_OUTER, self.outer, "xindex")
        done = _Scope()  # the program's own columns again: nothing loaded at a class's lanes is reused
        for m in reds:
            self.store(m, self._reduction_result(m, totals[m.name], done), "xmask")
        for m in self.nodes:  # the columns' epilogues (a cast, a scale)
            if self.role(m) == Role.OUTER:
                self.store(m, self.compute(m, done), "xmask")

    def _rows_off_vectors(self) -> bool:
        """Whether some access along whole rows (`_on_row`) is to a buffer whose rows do not start on 16-byte
        boundaries (at 50257 wide, 15 rows in 16 of any dtype; at 1000, none of float32 or bfloat16), with a
        width given in the source and one reduction variable: addressed `p + W * row + q0`, each of its elements
        is a load of its own. `looped()` then also writes the aligned loop (`_aligned_loop`) for programs of one
        row; where all rows start on boundaries, the plain loop loads vectors already, and was the faster
        (float32 LayerNorm forward at 1335 x 50264 on an H200, each at its best chunk: 178 µs against the
        aligned loop's 196). A mix-order kernel says so to the rule (`KernelSource.scalar_rows`)."""
        width = sympy.sympify(product(self.red))
        if len(self.red) != 1 or not self.outer or not width.is_Integer or "rnumel" in self.runtime:
            return False
        for m in self.nodes:
            cmap = self.canon(m)
            for buffer, index, load in self._accesses(m):
                if load is not None and load.indirect:
                    continue
                size = self.buffers[buffer].dtype.itemsize if buffer in self.buffers else 1
                if int(width) * size % 16 and self._on_row(sympy.expand(substitute(index, cmap))):
                    return True
        return False

    def _on_row(self, expr) -> bool:
        """Whether `expr` is element q0 of row `xindex` of a row-major [rows, width] buffer: width * row + q0."""
        lane = canon_var(VarKind.CANON_REDUCTION, 0)
        rest = sympy.expand(expr - lane)
        if lane in rest.free_symbols or VarKind.CANON_OUTER not in self.flat:
            return False
        vs, _, flat = self.flat[VarKind.CANON_OUTER]
        row = vs[0] if len(vs) == 1 else sympy.Symbol(flat, integer=True, nonnegative=True)
        return sympy.expand(self._flattened(rest) - product(self.red) * row) == 0

    def _aligned_loop(self, needed: set, outer_scope: _Scope, phase: dict, p: int, accs: dict,
                      group: int | None) -> None:
        """One phase's loop over a row of a program of one row, in chunks that start on 16-element boundaries
        of the flat buffer (`rlo`), not of the row: the row's own accesses (`_on_row`) address `rflat`, which
        Triton knows to be a multiple of 16 plus the lanes. A chunk inside the row runs the members with a mask
        of constant True, which Triton loads in 16-byte vectors; the first and last chunks mask the lanes
        outside the row. Written `p + W * o0 + q0` with an odd W, every element was a load of its own. On an
        H200 a bfloat16 LayerNorm forward over 2671 x 50257 (hand-written, both forms timed at their best chunk
        and warps) took 548 µs one element at a time, 303 so (Inductor: 452); 3355 x 20001, 235 against 144
        (Inductor: 203); float32 1335 x 50257, 360 against 243 (259). Generated, the sweep's bfloat16 LayerNorm
        forward at 2671 x 50257 went 568 -> 320 µs (docs/benchmarks.md, fifty-second session)."""
        w = self.numel("rnumel")
        # the loop's offsets count from rlo (they stay small: no sum near int32's end is formed but rflat, whose
        # reach INT32_OFFSETS leaves room for); rflat is rlo (a multiple of 16) + the offset (of RBLOCK) + lanes
        self.emit(f"for roffset in range(0, rhead + {w}, RBLOCK):")
        self.indent += 1
        self.emit("rflat = rlo + roffset + tl.arange(0, RBLOCK)[None, :]")
        self.emit("rindex = (roffset - rhead) + tl.arange(0, RBLOCK)[None, :]")
        self.decompose(VarKind.CANON_REDUCTION, self.red, "rindex")
        self.on_rows = True
        self._twice(f"(roffset >= rhead) & (roffset <= rhead + {w} - RBLOCK)",
                    "rmask = tl.full([1, RBLOCK], True, tl.int1)", f"rmask = (rindex >= 0) & (rindex < {w})",
                    lambda: self._demand(needed, _Scope(outer_scope), phase, p, accs, group))
        self.on_rows = False
        self.indent -= 1

    def _finish_online(self, acc_s: str, acc_m: str, row_max: str) -> str:
        """An online sum's result: each lane's partial sum rescaled to the row's max, summed. A row of -inf
        only gives NaN, as eager's exp(-inf - -inf) does; NaN and +inf propagate through the rescaling."""
        scaled, out = self.tmp(), self.tmp()
        self.emit(f'{scaled} = {acc_s} * tl.where({row_max} == float("-inf"), 0.0, _exp_term({acc_m} - {row_max}))')
        self.emit(f"{out} = tl.reduce({scaled}, 1, _sum_combine)[:, None]")
        self.emit(f'{out} = tl.where({row_max} == float("-inf"), float("nan"), {out})')
        return out

    def _online_step(self, mx, val: str, acc_m: str, acc_s: str, group: int) -> None:
        """One tile of max and sum(exp(v - max)) together, kept for each group of `group` lanes (`_online_group`:
        no more than a thread holds, and Triton free to pick which, so a group's max and sum stay in its
        thread): the group's running sum is rescaled to its new running max, one exponential a group,
        and the tile's terms are exp(v - max), one an element. Kept for each lane, the rescaling was one more
        exponential an element: compiled for sm_90 by Triton 3.6, log-softmax's online loop over bfloat16 rows
        (2048-element chunks on 8 warps) took 16 ex2 a thread and 212 PTX lines a step that way, 9 and 148 in
        groups of 8 (10 in the groups of 4 `_online_group` takes), 32 registers against 29 (float32 in groups
        of 4: 16 and 220 against 10 and 158; inputs not 16-byte aligned: 279 lines against 206), no shuffles
        either way. A group that has seen only -inf
        keeps a zero sum (its terms are exp(-inf - M) = 0 for any finite final max M; _finish_online makes an
        all -inf row NaN); NaN and +inf propagate as they did lane by lane. On the GPU its exponentials are
        `_exp_term`'s (one ex2.approx.ftz each) and its maxima `_max_combine`'s (one max.NaN): a step of 8
        bfloat16 elements (chunks of 2048 on 8 warps, sm_90, Triton 3.9) took 141 SASS instructions before,
        95 now, in a loop the issue rate bounded (a bfloat16 cross-entropy forward at 65-70% of an H200's
        copy bandwidth)."""
        v, vg, new = self.tmp(), self.tmp(), self.tmp()
        g = _group_expr(group)
        masked = f'tl.where(xmask & rmask, {val}, float("-inf"))'
        self.emit(f"{v} = {_as_block(masked, mx.body.dtype)}")
        # can_reorder for one row a program: any lanes of the row may form a group (the max and the sum of a
        # step use the same groups, and groups meet only in the max and sum after the loop), so Triton groups
        # each thread's own lanes whatever its loads' layout: kept in order, a load Triton could not vectorize
        # (an input not 16-byte aligned) made the reshape shuffle lanes between threads (48 shfl a step). With
        # several rows a program the lanes must stay in their rows, and a thread holding lanes of two rows may
        # group them together when reordering is allowed: on an H200 a bfloat16 cross-entropy forward at
        # 838861 x 160 in blocks of 64 rows (the timed band's looped candidate) had wrong maxima and sums.
        reorder = ", can_reorder=XBLOCK == 1" if compat.RESHAPE_REORDERS else ""
        self.emit(f"{vg} = tl.reshape({v}, [XBLOCK, RBLOCK // {g}, {g}]{reorder})")
        self.emit(f"{new} = _max_combine({acc_m}, {self._reduce(vg, 2, 'max')})")
        lost = f'{new} == float("-inf")'
        terms = f'tl.where(({lost})[:, :, None], 0.0, _exp_term({vg} - {new}[:, :, None]))'
        self.emit(f"{acc_s} = {acc_s} * tl.where({lost}, 1.0, _exp_term({acc_m} - {new})) "
                  f"+ tl.reduce({terms}, 2, _sum_combine)")
        self.emit(f"{acc_m} = {new}")

    def _online_group(self, reads: set) -> int:
        """Lanes of an online softmax loop kept as one group (`_online_step`): a 16-byte vector of the
        widest element the loop loads, whose lanes Triton gives one thread, but at most 4: a chunk holds as few
        as 4 elements a thread (4096 on 32 warps, a configuration the rule and the timed band use), and a
        group wider than a thread's share crosses threads (bfloat16 in groups of 8 there: 4 KB of shared
        memory a step). In groups of 4 rather than 8 a bfloat16 step takes 10 exponentials for 8 elements,
        not 9."""
        widest = max((self.buffers[b].layout.dtype.itemsize for b in reads if b in self.buffers), default=4)
        return max(1, min(4, 16 // widest))

    def _loop_reads(self, names: set) -> set:
        """The buffers from outside the kernel that a loop computing the members `names` loads."""
        want = self._wanted(names)
        return {b for m in self.nodes if m.name in want for b in m.read_names() if b not in self.by_output}

    def _wanted(self, names: set) -> set:
        """The in-loop members a loop computing the members `names` computes: those and the in-loop members
        they read (an online sum is computed with its max, not from its own body)."""
        online = self.online_pairs()
        want: set = set()
        stack = [self.by_name(n) for n in names]
        while stack:
            m = stack.pop()
            if m.name in want:
                continue
            want.add(m.name)
            if m.name in online:
                continue  # computed from its max's value, not from its own body
            for b in m.read_names():
                d = self.by_output.get(b)
                if d is not None and self.role(d) == Role.INNER:
                    stack.append(d)
        return want

    def _demand(self, names: set, scope: _Scope, phase: dict, p: int, accs: dict, group: int | None) -> None:
        """Compute, in this loop, the in-loop members named (and the in-loop members they read); `group`: the
        loop's online softmax group (`_online_group`), where it has an online pair."""
        online = self.online_pairs()
        partner = {mx.name: sm for sm, mx in ((self.by_name(n), m) for n, m in online.items())}
        want = self._wanted(names)
        for m in self.nodes:
            if m.name not in want:
                continue
            if m.name in online:
                continue  # accumulated with its max
            if self.role(m) == Role.REDUCTION:
                val = self.value(m.body, m, scope, self.canon(m))
                sm = partner.get(m.name)
                if sm is not None and sm.name in want:
                    self._online_step(m, val, accs[m.name], accs[sm.name], group)
                else:
                    self._reduce_block(m, val, accs[m.name])
            else:
                var = self.compute(m, scope)
                if phase.get(m.name) == p:
                    self.store(m, var, "xmask & rmask")

    def by_name(self, name):
        return next(m for m in self.nodes if m.name == name)


def _class_loops(interpret: bool) -> bool:
    """Whether a kernel may take its rows in classes where it runs: their loops' bounds are computed in the kernel,
    which Triton 3.6's interpreter cannot take (`compat.INTERPRETED_LOOP_BOUNDS`); compiled, always."""
    return not interpret or compat.INTERPRETED_LOOP_BOUNDS


def window_cap(width: int) -> int:
    """The widest group (elements, a power of two) whose head fits beside a row `width` wide in its own block,
    pow2(width): a window of G-element groups takes up to G - 1 lanes before the row (`_window_rows`), so
    G <= pow2(width) - width + 1. A row within 16 bytes of a power of two (4095 float32 or 8191 bfloat16
    elements) would need its block doubled to take 16-byte groups (half its lanes idle: the generated window
    lost so, 156 -> 169 µs for a bfloat16 cross-entropy backward at 16386 x 8191, fifty-eighth session), and
    such rows ran element by element instead; groups of 2 elements (4-byte bfloat16 and 8-byte float32 vectors)
    fit the block. Hand-written LayerNorm forwards on an H200 (`.scratch_gpu/s63_groups.py`, µs at the best
    warps, element by element against 2-element groups): bfloat16 16386 x 8191 272.7 -> 147.0, 32776 x 4095
    275.0 -> 141.8, 131200 x 1023 299.2 -> 141.3; float32 16388 x 4095 170.3 -> 135.7, 65600 x 1023 178.3 ->
    133.5 (an aligned 16384 x 4096: 133.2)."""
    room = pow2(width) - width + 1
    return 1 << (room.bit_length() - 1)  # (the largest power of two at most `room`)


def _ragged(n: str) -> bool:
    """Whether a pointwise kernel over `n` elements (a literal, or an argument's name) has a last block Triton
    cannot prove whole vectors: n not a multiple of 16, or passed at run time. Small counts (under 4096, a
    block or a few) are left as they are: a launch's worth of work."""
    return not n.isdigit() or (int(n) % 16 != 0 and int(n) >= 4096)


def _group_expr(group: int) -> str:
    """An online softmax group's lanes in the kernel's source: `group`, or the whole chunk where a chunk
    (RBLOCK, a launch constexpr) is narrower."""
    return f"({group} if RBLOCK >= {group} else RBLOCK)"


def _result_dtype(m) -> torch.dtype:
    """The dtype of a reduction's computed result (before the cast to its output buffer)."""
    if m.reduction_type in ("argmax", "argmin"):
        return torch.int64
    if m.reduction_type in ("any", "all"):
        return torch.bool
    return m.body.dtype


def _stored(node, graph) -> set:
    keep = graph.output_names() | graph.mutated_names()
    in_place = {m.output.name for m in members(node) if getattr(m, "in_place", False)}  # always written
    return {b for b in node.output_names() if b in keep or graph.readers(b)} | in_place


def overwritable(node, graph) -> dict:
    """{a buffer the kernel stores: the buffers it reads whose storage it may write it into}: the wrapper
    lets such an output take the storage of a read buffer that dies at this kernel (one allocation less
    and, for a backward reading a logits-sized activation, one logits-sized buffer less at the peak).

    Writing O over B in place is safe when each element of B is read only by the program, and in the
    loop, that writes the same element of O, and before it writes it: every load of B is direct and at
    exactly O's store index (in the kernel's canonical variables), the member storing O computes its value
    from such a load (so the load is issued, and cached for the kernel's other readers of that address,
    before the store), and in a looped reduction no loop after O's own loads B again. A pointwise kernel
    is one pass, a persistent one loads before it computes. Kernels with scatters or in-place members are left
    out (`ir.may_store_over_reads`). A mix-order kernel (`generate_mix`, every form) gives each block of rows
    to one program and each step of its loop over them the whole rows of the block, or in the tiled form one
    block of their columns: it loads that step's points, computes, and stores them there, and its pipelined
    loads (STAGES) run ahead only into later blocks. So the row side's own rule holds, for buffers the column
    side does not read (`ir.read_after_store`: its members, and the finishing kernel's epilogues, may read them
    after the store). A GELU backward with its bias's column sum then writes dh over the matmul's dy or over h,
    whichever dies there (ViT-style's MLP backward: a [tokens, 4d] buffer less at the step's peak), as
    Inductor's separate pointwise kernel writes over dy."""
    if not may_store_over_reads(node):
        return {}
    if isinstance(node, MixOrderNode):
        late = read_after_store(node)
        return {o: kept for o, bs in overwritable(node.row, graph).items()
                if (kept := [b for b in bs if b not in late])}
    nodes, outer, red = _group(node)
    w = KernelWriter("k", nodes, outer, red, _stored(node, graph), graph.buffers(), interpret=True)
    at: dict = {}  # buffer read from outside -> the indices of its loads (None: an indirect one)
    readers: dict = {}  # buffer -> members loading it
    for m in nodes:
        cmap = w.canon(m)
        for v in walk(m.body):
            if isinstance(v, Load) and v.buffer not in w.by_output:
                at.setdefault(v.buffer, set()).add(None if v.indirect else sympy.expand(substitute(v.index, cmap)))
                readers.setdefault(v.buffer, set()).add(m.name)
    inner = {m.name for m in nodes if not red or w.role(m) == Role.INNER}
    by_name = {m.name: m for m in nodes}

    def closure(names) -> set:  # members computed for these: their in-kernel inner inputs, transitively
        out, stack = set(), list(names)
        while stack:
            n = stack.pop()
            if n not in out:
                out.add(n)
                stack += [w.by_output[b].name for b in by_name[n].read_names()
                          if b in w.by_output and w.by_output[b].name in inner]
        return out

    loops: dict = {}  # looped form: loop -> the members it computes (as `looped` demands them)
    phase: dict = {}
    if red:
        phase = w.phases()[0]
        for p in set(phase.values()):
            loops[p] = closure(n for n, q in phase.items() if q == p
                               and (n not in inner or by_name[n].output.name in w.stored))
    out: dict = {}
    for m in nodes:
        if m.name not in inner or isinstance(m, Reduction) or m.output.name not in w.stored:
            continue
        store = sympy.expand(m.store_index().xreplace(w.canon(m)))
        feeds = closure([m.name])
        for b, idx in at.items():
            if idx != {store} or not readers[b] & feeds:
                continue
            if red and (any(w.role(by_name[n]) not in (Role.INNER, Role.REDUCTION) for n in readers[b])
                        or any(p > phase[m.name] for p, ms in loops.items() if ms & readers[b])):
                continue
            out.setdefault(m.output.name, []).append(b)
    return out


INT32_MAX = 2 ** 31 - 1
# The most elements a kernel addresses with int32 offsets: int32's maximum less room for a block past the last
# element, which lanes compute offsets for too — masked lanes of the last block, the aligned loop's last chunk
# (kernel.KernelWriter._aligned_loop: from up to 15 elements before a row to a chunk past it). 2**18 is more than
# any block (the interpreter's are at most 2**17).
INT32_OFFSETS = INT32_MAX - (1 << 18)


def index_width(graph, node, runtime: frozenset = frozenset()) -> tuple[bool | None, tuple]:
    """(int64, spans): whether the kernel's offsets need 64 bits — a buffer it reads or writes spans more
    than int32 can address, or its points do. True or False where the sizes are numbers; None where a
    span or count is symbolic (dynamic shapes) or an element count is set at launch (`runtime`), with the
    symbolic buffer spans: the launch then chooses the width from these spans at the call's sizes and from
    its own element counts (`runner.Kernel.constexprs`), so a dynamic kernel is compiled with int32 offsets,
    as its static twin, whenever the call's sizes allow it and never launched so on sizes that do not.
    Only the kernel's own buffers count (every buffer of the graph made this quadratic in the graph's size
    at compile time); a mix-order kernel's workspaces are not graph buffers, and span no more than its
    points."""
    buffers = graph.buffers()
    names = {n for m in members(node) for n in (*m.read_names(), *m.output_names())}
    spans = []
    for name in sorted(names):
        span = buffers[name].layout.storage_span if name in buffers else None
        if span is None:
            continue
        if not span.is_number:
            spans.append(span)
        elif int(span) > INT32_OFFSETS:
            return True, ()
    from ...ir.loops import shape

    outer, red = shape(node)
    total = product(outer) * product(red)
    if total.is_number and int(total) > INT32_OFFSETS:
        return True, ()
    if spans or not total.is_number or runtime:
        # a span never larger than the points (the launch checks the points it reaches, which are these
        # unless a count is set at launch) or than another span checks nothing more
        spans = list(dict.fromkeys(spans))
        kept = [s for i, s in enumerate(spans) if (runtime or not (total - s).is_nonnegative)
                and not any((t - s).is_nonnegative and (j < i or not (s - t).is_nonnegative)
                            for j, t in enumerate(spans) if j != i)]
        return None, tuple(kept)
    return False, ()


def _checks_indices(members) -> bool:
    """Whether a kernel of these members checks an indirect index at run time."""
    for m in members:
        roots = m.values() if isinstance(m, Scatter) else (m.body,)
        holders = [v for r in roots for v in walk(r)] + ([m] if isinstance(m, Scatter) else [])
        if any(not b.proven for v in holders for b in getattr(v, "indirect", ())):
            return True
    return False


def _source(interpret: bool, body: list[str]) -> str:
    text = "\n".join(body)
    return printer.prelude(interpret, text) + "\n\n\n" + text + "\n"


def _group(node):
    if isinstance(node, FusedNode):
        return node.nodes, node.ranges, node.reduction_ranges
    from ...ir.loops import shape

    outer, red = shape(node)
    return (node,), outer, red


def generate(node, graph, interpret: bool, variant: str, blocks: dict, stored: set | None = None,
             runtime: frozenset = frozenset()) -> KernelSource:
    """Triton source for a Pointwise, Reduction or FusedNode scheduler node. `runtime`: element counts
    ("xnumel", "rnumel") the launch may set to other values than the IR's (a mix-order finishing node's
    splits, when the split is tuned), never written into the source."""
    members, outer, red = _group(node)
    stored = _stored(node, graph) if stored is None else stored
    name = f"k_{_sanitize(node.name)}"[:60]
    writer = KernelWriter(name, members, outer, red, stored, graph.buffers(), interpret, runtime=runtime)
    # a kernel with device asserts is compiled with debug=True, which also makes Triton check every int32
    # add, sub and mul for overflow (an assert each) unless the launch turns that off
    # (compat.CHECKED_OPTIONS); where this Triton cannot, int64 index math, which is never checked
    checked_int64 = not interpret and compat.CHECKED_OPTIONS is None and _checks_indices(members)
    writer.int64, spans = (True, ()) if checked_int64 else index_width(graph, node, runtime)
    if not red:
        body = writer.pointwise()
        variant = KernelVariant.POINTWISE
    elif variant == KernelVariant.PERSISTENT:
        body = writer.persistent()
    else:
        body = writer.looped()
    sizes = tuple(("size", s) for s in sorted(writer.sizes, key=str))
    args = writer.ordered_args() + sizes
    constants = {k: v for k, v in blocks.items() if k in ("XBLOCK", "RBLOCK") and (red or k == "XBLOCK")}
    return KernelSource(name, _source(interpret, body), name, args, product(outer), product(red) if red else None,
                        variant, constants, blocks.get("num_warps", 4), int64=writer.int64, spans=spans,
                        checks=writer.debug, online=bool(red) and bool(writer.online_pairs()), window=writer.windowed,
                        window_writes=writer.window_writes, window_columns=writer.window_columns,
                        window_classes=writer.window_classes, column_classes=writer.column_classes,
                        window_itemsize=writer.window_itemsize,
                        window_by_rule=writer.window_writes and not writer.window_columns
                        and not any(writer.role(m) == Role.REDUCTION for m in members))


# -- mix-order reductions ------------------------------------------------------------------------------
def workspace_name(m) -> str:
    return f"{m.output.name}_ws"


def finish_node(mix: MixOrderNode) -> FusedNode:
    """The finishing kernel of a mix-order node: each column reduction summed over the workspace's
    splits, then the column side's epilogues."""
    from ...ir.loops import shape

    cols, rows = shape(mix.row)[1], shape(mix.row)[0]
    n_splits = mix.n_splits
    ncol = product(cols)
    nodes = []
    for g in mix.column_groups:
        for m in members(g):
            r = role(m, cols, rows)
            if r == Role.REDUCTION:
                vs = loop_vars(VarKind.OUTER, len(m.ranges))
                non_unit = [v for v, s in zip(vs, m.ranges) if s != 1]
                lin = sum((v * st for v, st in zip(non_unit, contiguous_strides(cols))), sympy.S.Zero)
                (r0,) = loop_vars(VarKind.REDUCTION, 1)
                body = Load(workspace_name(m), r0 * ncol + lin, m.body.dtype)
                nodes.append(Reduction(m.name, m.ranges, (n_splits,), "sum", body, m.output, m.origins))
            elif r == Role.OUTER:
                nodes.append(m)
    return FusedNode(f"{mix.name}_finish", tuple(nodes), cols, (n_splits,))




def generate_mix(mix: MixOrderNode, graph, interpret: bool, blocks: dict,
                 form: KernelVariant = KernelVariant.MIX_ORDER) -> tuple[KernelSource, FusedNode]:
    """The main kernel of a mix-order node (rows in blocks, columns persistent, column partial sums
    into workspaces) and the finishing node (a plain reduction over the splits). Forms:

    - "mix_order": the column partials are one row [1, RBLOCK] that each row block is summed into;
    - "mix_order_acc2d": a [XBLOCK, RBLOCK] tile of partials, summed once at the end (no cross-row sum
      per block: the form for several rows per block);
    - "mix_order_tiled": as "mix_order_acc2d" over one block of RBLOCK columns: a program per block of SPLIT
      rows and block of columns, numbered row block by row block (the program id is their flat index,
      so the launch keeps one grid axis). Only where the row side is pointwise (`MixOrderNode.tiled`): a
      row reduction needs whole rows. Each column's partial sums, and the workspace's [split, column]
      entries, belong to the one program of its column block, so the blocks never meet.

    The loop over a program's row blocks is `tl.range(..., num_stages=STAGES)`: with STAGES > 1 Triton
    pipelines its loads through shared memory (asynchronous copies issued STAGES - 1 blocks ahead), so a
    program keeps memory requests in flight while it computes, without holding them in registers. Its
    loads feed no `tl.dot`, so only this per-loop request pipelines them. On an H200, bfloat16 LayerNorm
    backward (576000, 384) took 329 µs with four stages against 409 without and 385 with the look-ahead
    loads written by hand into registers (the form this replaced); (32768, 4096) 207 against 268 and 222.
    """
    from ...ir.loops import shape

    assert form in MIX_FORMS, form
    rows, cols = shape(mix.row)
    tiled = form == KernelVariant.MIX_ORDER_TILED
    finish = finish_node(mix)
    finish_reads = set(finish.read_names())
    row_members = members(mix.row)
    col_members = [m for g in mix.column_groups for m in members(g)]
    in_loop_cols = [m for m in col_members if role(m, cols, rows) in (Role.INNER, Role.REDUCTION)]
    # column results and their epilogues exist only after the finishing kernel: a member of this kernel
    # reading one would load a buffer nobody has written yet (mix_order_reduction refuses such pairs)
    finished = {m.output.name for m in col_members if role(m, cols, rows) is not Role.INNER}
    for m in (*row_members, *in_loop_cols):
        late = finished & set(m.read_names())
        if late:
            raise Unsupported(f"mix-order member {m.name} reads {sorted(late)[0]}, computed only after the row loop")
    stored = _stored(mix, graph) | {b for b in finish_reads if b in mix.output_names()}
    stored -= {m.output.name for m in col_members if role(m, cols, rows) != Role.INNER}
    name = f"k_{_sanitize(mix.name)}"[:60]
    w = KernelWriter(name, list(row_members) + in_loop_cols, rows, cols, stored, graph.buffers(), interpret,
                     swap=set(in_loop_cols))
    w.int64, spans = index_width(graph, mix)
    if tiled and any(isinstance(m, Reduction) for m in row_members):
        raise Unsupported("mix-order columns in blocks with a row reduction (it needs whole rows)")
    pid = w.pid()
    acc2d = form in (KernelVariant.MIX_ORDER_ACC2D, KernelVariant.MIX_ORDER_TILED)

    def colsum(x: str) -> str:
        # tl.sum measured faster here on an H200 than tl.reduce with our combine (0.47 vs 0.70 ms,
        # LayerNorm backward 32768x4096); the interpreter needs the builtin-only form (see printer)
        return f"tl.reduce({x}, 0, _sum_combine)" if interpret else f"tl.sum({x}, 0)"

    accs = {}
    for m in in_loop_cols:
        if role(m, cols, rows) == Role.REDUCTION:
            accs[m.name] = w.tmp()

    def column(m, val):
        masked = f"tl.where(xmask & rmask, {val}, 0.0)"
        w.emit(f"{accs[m.name]} = {accs[m.name]} + " + (masked if acc2d else f"{colsum(masked)}[None, :]"))

    def program_body(groups: tuple) -> None:
        """The program's rows, its column partials, their store: rows in blocks of SPLIT, or (`classes`) the
        program's share of its class's rows through the aligned window (`_classes`; `groups`: its groups)."""
        classes = groups[0] if groups else 0
        split = pid  # which block of rows: the program's workspace row
        if classes:
            w._classes(pid, groups)
        elif tiled:  # the program's block of rows and its block of columns
            w.emit(f"program = {pid}")
            # not tl.cdiv: triton 3.6's interpreter refuses that @jit helper where both operands are ints
            w.emit(f"column_blocks = ({w.numel('rnumel')} + RBLOCK - 1) // RBLOCK")
            w.emit("split_id = program // column_blocks")
            w._rindex("(program % column_blocks) * RBLOCK + ")
            split = "split_id"
        else:
            w._rindex("")
        for m in in_loop_cols:
            if m.name in accs:
                shape = "[XBLOCK, RBLOCK]" if acc2d else "[1, RBLOCK]"
                w.emit(f"{accs[m.name]} = tl.full({shape}, 0, {tl_dtype(m.body.dtype)})")
        # what no row index reaches (a weight per column) is loaded once, before the loop over row blocks
        per_kernel = _Scope()
        w.prefetch(per_kernel, keep=lambda e: not _has_outer(e))
        scope = _Scope(per_kernel)
        if classes:
            w._class_loop(classes, stages="STAGES")
            w.on_rows, w.window = True, classes
        else:
            w.emit(f"row_start = {split} * SPLIT")
            w.emit("for xoffset in tl.range(0, SPLIT, XBLOCK, num_stages=STAGES):")
            w.indent += 1
            w.emit("xindex = row_start + xoffset + tl.arange(0, XBLOCK)[:, None]")
            w.emit(f"xmask = (xindex < {w.numel('xnumel')}) & (xoffset + tl.arange(0, XBLOCK)[:, None] < SPLIT)")
            w.decompose(VarKind.CANON_OUTER, rows, "xindex")
        w.prefetch(scope)
        w.emit_members(scope, column)
        w.on_rows, w.window = False, 0
        w.indent -= 1
        for m in in_loop_cols:
            if m.name in accs:
                part = f"{colsum(accs[m.name])}[None, :]" if acc2d else accs[m.name]
                w.emit(f"tl.store({w.ptr(workspace_name(m))} + {split} * {w.numel('rnumel')} + rindex, {part}, rmask)")
        for line in w.deferred:  # index checks after the stores, in this branch (whose variables they read)
            w.emit(line)
        w.deferred = []

    w.declare(VarKind.CANON_OUTER, rows, "xindex")  # (the rows' flat index, as both forms name it: `_on_row`)
    classes_ok = not tiled and _class_loops(interpret)
    groups, writes, _ = w._window(mix=True) if classes_ok else ((), False, False)
    if groups and groups[0] * w.window_itemsize < 8 and pow2(product(cols)) > MIX_CLASS_PAIRS_MAX_BLOCK:
        groups, writes = (), False  # (groups under 8 bytes in a block past MIX_CLASS_PAIRS_MAX_BLOCK: it lost there)
    if groups:  # WINDOW (a constexpr the launch sets, configs.windowed): rows in classes, else blocks of rows
        w.emit("if WINDOW:")
        w.indent += 1
        w.top = w.indent
        program_body(groups)
        w.indent -= 1
        w.emit("else:")
        w.indent += 1
        w.top = w.indent
    program_body(())
    w.indent -= bool(groups)
    w.top = 1
    # SPLIT (rows per program) is a run-time argument: the autotuner times several without recompiling.
    # Under the interpreter it is a constexpr (nothing is compiled there): Triton 3.6's interpreter turns a
    # run-time int into a one-element array, and its `tl.range` bound then fails under NumPy >= 2.5
    # ("only 0-dimensional arrays can be converted to Python scalars"; 3.9's squeezes it first)
    constexprs = ["XBLOCK", "RBLOCK", "STAGES", *(["WINDOW"] if groups else [])]
    body = w.header(constexprs, extra=["SPLIT: tl.constexpr" if interpret else "SPLIT"]) + w.body()
    sizes = tuple(("size", s) for s in sorted(w.sizes, key=str))
    constants = {k: blocks[k] for k in ("XBLOCK", "RBLOCK", "SPLIT")} | {"STAGES": blocks.get("STAGES", 1)}
    src = KernelSource(name, _source(interpret, body), name, w.ordered_args() + sizes, product(rows),
                       product(cols), form, constants, blocks.get("num_warps", 4), "SPLIT", w.int64, spans,
                       checks=w.debug, row_sums=any(isinstance(m, Reduction) for m in row_members),
                       scalar_rows=w._rows_off_vectors(), window=groups[0] if groups else 0, window_writes=writes,
                       window_itemsize=w.window_itemsize if groups else 0)
    return src, finish


def _has_outer(expr) -> bool:
    return any(var_kind(v) is VarKind.CANON_OUTER for v in expr.free_symbols)


def workspace_layouts(mix: MixOrderNode) -> dict:
    """Workspace buffer name -> Layout [n_splits, columns] in the accumulation dtype."""
    from ...ir.loops import shape

    cols = shape(mix.row)[1]
    rows = shape(mix.row)[0]
    out = {}
    for g in mix.column_groups:
        for m in members(g):
            if role(m, cols, rows) == Role.REDUCTION:
                out[workspace_name(m)] = Layout.contiguous([mix.n_splits, product(cols)], m.body.dtype,
                                                           m.output.layout.device)
    return out


def rows_contiguous(node, sizes: dict | None = None) -> bool:
    """Whether a reduction kernel's innermost reduction variable walks memory contiguously in its loads
    (a row sum) rather than with a stride (a column sum), which decides the block shape by rule: whole
    rows per program for rows, wide blocks of columns for strided reductions. Of the loads that move with
    the reduction loop, those of the largest buffers decide (`ir.streamed`; `sizes`: the graph's `numels`):
    the data, not a norm's per-row statistics — which a column sum recomputing its values reads at `mean[r]`,
    and split_reductions' partial of it at `mean[s * chunk + r]`, moving with its outer chunk loop too: before
    the sixty-second session that partial ran a column a program — nor a small weight broadcast against the
    data. Without sizes, the loads that move with both the outer and the reduction loops decide, the others only
    where none does. True when no load depends on it."""
    members, outer, red = _group(node)
    if not red:
        return True
    q = canon_var(VarKind.CANON_REDUCTION, len(red) - 1)
    full, partial = [], []  # the loads moving with q (and with an outer loop: full), at their canonical indices
    for m in members:
        cmap = canonical_map(m, len(outer))
        for v in walk(m.body):
            if isinstance(v, Load):
                e = sympy.expand(substitute(_unclamped(v.index), cmap))
                if q in e.free_symbols:
                    moves_outer = any(var_kind(s) == VarKind.CANON_OUTER for s in e.free_symbols)
                    (full if moves_outer else partial).append((v, e))
    if sizes is not None:  # (a member's own result, read by the next member, is in registers: not a buffer read)
        made = {b for m in members for b in m.output_names()}
        largest = {id(v) for v in streamed([v for v, _ in full + partial if v.buffer not in made], sizes)}
        decisive = [(v, e) for v, e in full + partial if id(v) in largest]
    else:
        decisive = full or partial
    return any(e.coeff(q) == 1 for _, e in decisive) or not decisive


def _unclamped(expr):
    """`expr` with each clamp `Min(e, c)` / `Max(e, c)` against a number replaced by `e`. split_reductions
    clamps the flat position of a last chunk that runs past the range (`Min(s*chunk + j, R - 1)`): the
    clamp changes where the last few points load, not how the loads walk memory, so a row read through it
    is still a contiguous row (ruled as a column sum, the partial of a 134218-row cross-entropy loss ran
    on 9 programs of 16 chunks instead of one program per chunk)."""
    def strip(e):
        args = [a for a in e.args if not a.is_number]
        return args[0] if len(args) == 1 else e

    return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), strip)
