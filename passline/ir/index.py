"""Index math: sympy symbols for loop variables and sizes, and the two integer functions that
views and reshapes need (floor division and modular indexing).

Index expressions are always sympy; never strings. They address a buffer's storage in elements,
relative to the buffer's first element.
"""
from __future__ import annotations

import enum
import functools
import math
import sys
from typing import NamedTuple, Sequence

import sympy

Expr = sympy.Expr

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    class StrEnum(str, enum.Enum):
        """enum.StrEnum of Python 3.11: members are their string values (compare, hash, format)."""

        __str__ = str.__str__
        __format__ = str.__format__
        __hash__ = str.__hash__


class VarKind(StrEnum):
    """What a symbol in an index expression stands for. The value is the prefix its name is printed with
    (`i0`, `r1`, `o0`); the kind is recorded when the symbol is made (`var`, `loop_var`) and asked with
    `var_kind(symbol)`: nothing reads it back from the name's letters."""

    OUTER = "i"  # a node's outer (pointwise) loop
    REDUCTION = "r"  # a node's reduction loop
    VIEW = "v"  # a view's index variable while lowering (lowering.tensor)
    CANON_OUTER = "o"  # a group's canonical outer loop (ir.loops)
    CANON_REDUCTION = "q"  # a group's canonical reduction loop (ir.loops)
    TEMP = "_t"  # a temporary of a simultaneous renaming
    SIZE = "size"  # a symbolic size (dynamic shapes), named by whoever made it


class IndirectSymbol(sympy.Symbol):
    """An index symbol standing for a value loaded at run time (see `ir.body.Indirect`): a position in
    [0, bound), so a non-negative integer. Its own class, so no pass can mistake it for a loop variable
    or a size."""


@functools.lru_cache(maxsize=None)
def indirect_var(k: int) -> IndirectSymbol:
    """The k-th index symbol of a Load or IndexValue (`t0, t1, ...`; each one is bound by its holder,
    so the names repeat across holders)."""
    return IndirectSymbol(f"t{k}", integer=True, nonnegative=True)


def is_indirect(expr) -> bool:
    """Whether an index expression uses an index symbol (reads at positions known only at run time)."""
    return any(isinstance(s, IndirectSymbol) for s in getattr(expr, "free_symbols", ()))


LOOP_KINDS = frozenset({VarKind.OUTER, VarKind.REDUCTION, VarKind.VIEW})  # a node's or a view's own loops
CANONICAL_KINDS = frozenset({VarKind.CANON_OUTER, VarKind.CANON_REDUCTION})


class VarInfo(NamedTuple):
    kind: VarKind
    index: int | None  # position among the variables of its kind (None for a size)


# symbol -> what it is, filled by the constructors below. Symbols are values (equal name and assumptions
# make equal symbols), so one entry per distinct variable: a few dozen, whatever the graph's size.
_VARS: dict = {}


@functools.lru_cache(maxsize=1024)
def var(kind: VarKind, k: int) -> sympy.Symbol:
    """The `k`-th variable of `kind` (a non-negative integer symbol; sizes come from `size_var`)."""
    kind = VarKind(kind)
    if kind is VarKind.SIZE:
        raise ValueError("a symbolic size is made by size_var(name)")
    s = sympy.Symbol(f"{kind.value}{k}", integer=True, nonnegative=True)
    _VARS[s] = VarInfo(kind, k)
    return s


def var_info(sym) -> VarInfo | None:
    """(kind, index) of a variable made by `var`/`size_var`; None for any other symbol (e.g. one of
    dynamo's sizes that passline did not make)."""
    return _VARS.get(sym)


def known_vars() -> list:
    """(symbol, VarInfo) of every variable this process made (`var`, `size_var`, derived sizes)."""
    return list(_VARS.items())


def adopt_vars(items) -> None:
    """Register variables another process made (a stored graph's: backends/graph_cache.py), so that `var_info`
    and `var_kind` answer for them here too."""
    for sym, info in items:
        _VARS.setdefault(sym, info)


def var_kind(sym) -> VarKind | None:
    info = _VARS.get(sym)
    return info.kind if info is not None else None


def loop_var(prefix: VarKind | str, i: int) -> sympy.Symbol:
    """Loop variable `i` of a kind: `VarKind.OUTER` (`i*`) for the outer (pointwise) loops,
    `VarKind.REDUCTION` (`r*`) for reduction loops. (A kind's value, "i" or "r", is accepted too.)"""
    return var(prefix, i)


def loop_vars(prefix: VarKind | str, n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(var(prefix, i) for i in range(n))


@functools.lru_cache(maxsize=1024)
def size_var(name: str) -> sympy.Symbol:
    """A symbolic size (dynamic shapes): a positive integer."""
    s = sympy.Symbol(name, integer=True, positive=True)
    _VARS[s] = VarInfo(VarKind.SIZE, None)
    return s


def substitute(expr, mapping: dict):
    """`expr.xreplace(mapping)`. Where `mapping` renames symbols to other symbols of the same assumptions,
    one-to-one and onto none the expression already holds (loop variables permuted, or renamed from one
    nest to another), Min and Max are rebuilt without sympy's evaluation: it only compares their
    arguments pairwise (~4 ms a clamp such as a pool's `Min(10, Max(0, i3 - 1))`, most of a small
    ResNet's pass time), and a renaming keeps every relation between them, so the result is the one
    evaluation gives."""
    if not mapping or not isinstance(expr, sympy.Basic) or not expr.has(sympy.Min, sympy.Max):
        return expr.xreplace(mapping) if mapping and isinstance(expr, sympy.Basic) else expr
    free = expr.free_symbols
    targets = set(mapping.values())
    if len(targets) != len(mapping) or targets & (free - mapping.keys()) or not all(
            isinstance(k, sympy.Symbol) and isinstance(v, sympy.Symbol) and k.assumptions0 == v.assumptions0
            for k, v in mapping.items()):
        return expr.xreplace(mapping)
    return _renamed(expr, mapping)


def _renamed(e, mapping: dict):
    if e in mapping:
        return mapping[e]
    if not e.args:
        return e
    args = tuple(_renamed(a, mapping) for a in e.args)
    if args == e.args:
        return e
    if isinstance(e, (sympy.Min, sympy.Max)):
        return e.func(*args, evaluate=False)
    return e.func(*args)


# Sizes computed through float arithmetic (`int(n * 0.5)`, `math.ceil(n / 4)`, `int(n ** 0.5)`): torch's
# expression rounds a float to an int (TruncToInt, FloorToInt, CeilToInt, RoundToInt). No index printer
# evaluates float arithmetic, and it must round exactly as eager's Python did (`int(100 * 0.29)` is 28,
# not the rational 29), so each such size is a symbol of its own, which passes treat as any size and the
# runners bind per call from its definition, evaluated in Python floats (`derived_value`).
_DERIVED: dict = {}  # symbol -> torch's expression (over the graph's size symbols)


def _float_parts(e) -> bool:
    from torch.utils._sympy import functions as F

    return bool(e.atoms(F.ToFloat, F.FloatTrueDiv, F.IntTrueDiv, F.FloatPow, F.TruncToFloat)) or any(
        not a.is_Integer for a in e.atoms(sympy.Number))


def derive(expr):
    """`expr` (torch's size expression) with each integer computed through float arithmetic replaced by
    its derived size symbol (one per distinct expression, named by a digest of it, so the same size
    is the same symbol in every graph and process)."""
    from torch.utils._sympy import functions as F

    to_int = (F.TruncToInt, F.FloorToInt, F.CeilToInt, F.RoundToInt)
    if not isinstance(expr, sympy.Basic) or not expr.has(*to_int):
        return expr

    def go(e):
        if isinstance(e, to_int) and _float_parts(e):
            return derived_symbol(e)
        if not e.args:
            return e
        args = tuple(go(a) for a in e.args)
        return e if args == e.args else e.func(*args)

    return go(expr)


def derived_symbol(definition) -> sympy.Symbol:
    import hashlib

    name = "zf" + hashlib.sha1(sympy.srepr(definition).encode()).hexdigest()[:8]
    s = sympy.Symbol(name, integer=True)
    _VARS[s] = VarInfo(VarKind.SIZE, None)
    _DERIVED[s] = definition
    return s


def derived_definition(sym):
    """torch's expression of a derived size symbol, or None for any other symbol."""
    return _DERIVED.get(sym)


def derived_source(sym, names: dict) -> str:
    """Python source computing derived size `sym` from the variables `names` ({size symbol: its name}),
    with eager's float arithmetic (torch's own printer: `math.trunc(0.5*torch.sym_float(s_s27))`)."""
    from torch.utils._sympy.printers import PythonPrinter

    definition = _DERIVED[sym]
    return PythonPrinter().doprint(definition.xreplace({k: sympy.Symbol(v) for k, v in names.items()
                                                        if k in definition.free_symbols}))


def derived_value(sym, values: dict) -> int:
    """The value of derived size `sym` where the size symbols have `values` ({symbol: int})."""
    import torch

    names = {k: f"_v{i}" for i, k in enumerate(_DERIVED[sym].free_symbols)}
    scope = {"math": math, "torch": torch, **{n: values[k] for k, n in names.items()}}
    return int(eval(derived_source(sym, names), scope))


def sympify(x) -> Expr:
    """Python ints, SymInts and sympy expressions to a sympy expression."""
    if isinstance(x, sympy.Basic):
        return derive(x)
    node = getattr(x, "node", None)  # torch.SymInt
    if node is not None and hasattr(node, "expr"):
        return derive(node.expr)
    return sympy.Integer(int(x))


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index values: base // divisor."""

    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.S.Zero
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        # (a*d) // d -> a, and (a*d + b) // d -> a + b // d when d divides the a-part exactly
        if divisor.is_Integer and base.is_Add:
            whole = [t for t in base.args if _divisible(t, divisor)]
            if whole:
                rest = sympy.Add(*[t for t in base.args if not _divisible(t, divisor)])
                if rest.is_nonnegative and _bounded_below(rest, divisor):
                    return sympy.Add(*[t / divisor for t in whole])
        if _divisible(base, divisor):
            return base / divisor
        return None


class ModularIndexing(sympy.Function):
    """(base // divisor) % modulus, for non-negative base: how reshapes split one index into several."""

    is_integer = True
    is_nonnegative = True
    nargs = (3,)

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0:
            return sympy.S.Zero
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        return None


def _divisible(term: Expr, divisor: Expr) -> bool:
    q = sympy.cancel(term / divisor)
    return q.is_integer is True and not q.has(FloorDiv, ModularIndexing) and sympy.denom(q) == 1


def _bounded_below(rest: Expr, divisor: Expr) -> bool:
    """True when 0 <= rest < divisor is provable from the loop-variable ranges we cannot see here.

    We only know variables are non-negative, not their upper bounds, so this is conservative:
    only constant remainders qualify."""
    return rest.is_Integer and 0 <= int(rest) < int(divisor)


def least(expr: Expr, bounds: dict | None = None) -> int | None:
    """A lower bound of `expr` over every value of its size symbols, each at least its bound in `bounds`
    (dynamo's ranges: a backed size is at least 2, as 0 and 1 are specialized; otherwise 1 for a positive
    symbol, 0 for a non-negative one), or None where none is known. Interval arithmetic on the lower end,
    so loose but never wrong: `(s0//2) - 1` with s0 >= 2 is at least 0, which sympy's assumptions cannot
    tell (`is_nonnegative` is None)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        if bounds and expr in bounds:
            return bounds[expr]
        return 1 if expr.is_positive else 0 if expr.is_nonnegative else None
    kind = type(expr).__name__  # passline's FloorDiv and torch's size functions alike (FloorDiv, Max, ...)
    if expr.is_Add:
        parts = [least(a, bounds) for a in expr.args]
        return None if None in parts else sum(parts)
    if expr.is_Mul:
        parts = [least(a, bounds) for a in expr.args]
        if None in parts or min(parts) < 0:
            return None
        return math.prod(parts)
    if kind == "FloorDiv" and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        low = least(expr.args[0], bounds)
        return None if low is None else low // int(expr.args[1])
    if kind == "Max":
        parts = [p for p in (least(a, bounds) for a in expr.args) if p is not None]
        return max(parts) if parts else None
    if kind == "Min":
        parts = [least(a, bounds) for a in expr.args]
        return None if None in parts else min(parts)
    if kind in ("ModularIndexing", "PythonMod", "Mod"):
        return 0
    return None


def provably_nonnegative(expr: Expr, bounds: dict | None = None) -> bool:
    """Whether `expr` >= 0 for every value of the size symbols (each at least its bound in `bounds`)."""
    if expr.is_nonnegative:
        return True
    low = least(sympy.expand(expr), bounds)
    return low is not None and low >= 0


def contiguous_strides(size: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    acc: Expr = sympy.S.One
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def flat_walk(expr: Expr, variables: Sequence, strides: Sequence) -> tuple[Expr, Expr] | None:
    """(a, rest) where `expr` == a * sum(v * stride) + rest over `variables` at `strides`, with neither a nor
    rest depending on the variables — an access walking those loops in their own order, point after
    point — else None."""
    expr = sympy.expand(expr)
    a = expr.coeff(variables[-1])
    vs = set(variables)
    if a == 0 or a.free_symbols & vs or any(sympy.expand(expr.coeff(v) - a * st) != 0
                                             for v, st in zip(variables, strides)):
        return None
    rest = sympy.expand(expr - sum(a * st * v for v, st in zip(variables, strides)))
    return None if rest.free_symbols & vs else (a, rest)


def product(xs) -> Expr:
    out: Expr = sympy.S.One
    for x in xs:
        out = out * x
    return out


def strided_index(idx: Sequence[Expr], stride: Sequence[Expr], offset: Expr = sympy.S.Zero) -> Expr:
    return _strided_index(tuple(idx), tuple(stride), offset)


@functools.lru_cache(maxsize=4096)
def _strided_index(idx: tuple, stride: tuple, offset: Expr) -> Expr:
    # cached: thousands of nodes share a few layouts and loop variables, and sympy arithmetic is slow
    return sympy.Add(offset, *[i * s for i, s in zip(idx, stride)])


def as_strided_form(expr: Expr, vars: Sequence[sympy.Symbol]):
    """If `expr` is offset + sum(var*stride) with var-free strides, return (strides, offset); else None."""
    return _strided_form(expr, tuple(vars))


@functools.lru_cache(maxsize=1 << 14)
def _strided_form(expr: Expr, vars: tuple):
    # memoized: verify() asks it of the same few loads after every pass (GPT-2: 3147 calls, 104 distinct,
    # a millisecond of sympy each); a pure function of hashable sympy values
    expr = sympy.expand(expr)
    if expr.has(FloorDiv, ModularIndexing):
        return None
    strides = []
    for v in vars:
        c = expr.coeff(v)
        if c.free_symbols & set(vars):
            return None
        strides.append(c)
    offset = expr.xreplace({v: 0 for v in vars})
    if sympy.expand(offset + sum(v * s for v, s in zip(vars, strides)) - expr) != 0:
        return None
    return tuple(strides), offset
