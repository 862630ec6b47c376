"""Loop bodies: a small DAG of values computed at one point of a node's iteration space.

Each value is a frozen attrs object; sharing a subtree makes the DAG. A node's body is the root value:
for a Pointwise node it is what gets stored, for a Reduction node it is what gets reduced. Every value
carries its dtype, so backends need no type inference of their own.
"""
from __future__ import annotations

import functools
from typing import Any, Iterator

import attrs
import sympy
import torch

from .index import substitute

UNARY_OPS = frozenset(
    """neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan tanh sinh cosh asin acos atan
    asinh acosh atanh sigmoid erf erfc erfinv relu reciprocal sign floor ceil round trunc logical_not
    bitwise_not isnan isinf signbit lgamma digamma""".split()
)
BINARY_OPS = frozenset(
    """add sub mul truediv floordiv remainder fmod pow maximum minimum atan2 copysign hypot
    eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor
    bitwise_left_shift bitwise_right_shift""".split()
)
COMPARISONS = frozenset("eq ne lt le gt ge".split())
LOGICAL_OPS = frozenset("logical_and logical_or logical_xor logical_not isnan isinf signbit".split())
TERNARY_OPS = frozenset(["where"])


@attrs.frozen(cache_hash=True)
class Indirect:
    """An index symbol bound to a value computed at run time (indirect indexing: gather, embedding...).

    In the index of the Load or IndexValue that holds it, `symbol` (an `ir.index.IndirectSymbol`) stands
    for `value` — an integer loop-body value, usually the load of an index tensor — used as a position
    along a dimension of `bound` elements. The rest of the index stays sympy over loop variables, so the
    direct part is analysed as before and the indirect part is visibly opaque. `wrap`: a negative value
    counts from the end (value + bound), where eager allows it (advanced indexing, index_put). `proven`:
    the value is in [0, bound) by construction (an argmax over that dimension, an arange), so no check is
    generated; otherwise every backend checks it and an index out of range is an error naming `what` (which
    index of which op) and the bound, never a read or write out of bounds."""

    symbol: sympy.Symbol
    value: Any
    bound: sympy.Expr = attrs.field(converter=sympy.sympify)
    wrap: bool = False
    proven: bool = False
    what: str = "an indexed dimension"

    def __repr__(self):
        flags = "".join([", wraps" if self.wrap else "", ", proven" if self.proven else ""])
        return f"{self.symbol} = {self.value!r} in [0, {self.bound}){flags}"


def _text(expr) -> str:
    """str(expr), remembered: printing sympy indices is most of printing a body (the kernel cache's keys
    print every kernel's), and a few indices recur across many loads."""
    return _printed(type(expr), expr)


@functools.lru_cache(maxsize=1 << 14)
def _printed(kind: type, expr) -> str:
    # keyed by the type too (2 == 2.0 == True in Python); sympy's == is structural (Integer(2) != Float(2.0),
    # assumptions count), so equal expressions of one type are one tree and print alike
    return f"{expr}"


def _bindings(indirect) -> str:
    return f"; {'; '.join(map(repr, indirect))}" if indirect else ""


@attrs.frozen(cache_hash=True)
class Load:
    """The element of `buffer` at storage offset `index` (in elements). `indirect` binds the index
    symbols `index` uses, if any (see Indirect)."""

    buffer: str
    index: sympy.Expr
    dtype: torch.dtype
    indirect: tuple = ()

    def __repr__(self):
        return f"load({self.buffer}[{_text(self.index)}]{_bindings(self.indirect)})"


def _a_number(instance, attribute, value):
    """A Constant's value is a number; a size symbol as a value is an IndexValue (`lowering.sizes.scalar_body`),
    which both backends evaluate at run time. A symbolic constant would fail only when a backend printed it."""
    if isinstance(value, sympy.Basic) and value.free_symbols:
        raise TypeError(f"Constant of the symbolic {value}: use an IndexValue (lowering.sizes.scalar_body)")


@attrs.frozen(cache_hash=True)
class Constant:
    value: object = attrs.field(validator=_a_number)  # int, float or bool
    dtype: torch.dtype

    def __repr__(self):
        return repr(self.value)

    def in_range(self):
        """The value as the dtype holds it: an integer wrapped into the dtype's range, as torch converts a
        scalar (int32 + 2**31 adds -2**31, uint8 + (-1) adds 255); other values as they are. Both backends
        build the constant from it (torch.tensor and tl.full refuse a value outside the range)."""
        if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
            return self.value
        info = torch.iinfo(self.dtype)
        return (int(self.value) - info.min) % (info.max - info.min + 1) + info.min


@attrs.frozen(cache_hash=True)
class IndexValue:
    """An index expression used as a value (iota, masks built from positions); `indirect` binds the
    index symbols it uses (a one-hot: `i1 == t0`, t0 the target of row i0)."""

    expr: sympy.Expr
    dtype: torch.dtype
    indirect: tuple = ()

    def __repr__(self):
        return f"index({_text(self.expr)}{_bindings(self.indirect)})"


@attrs.frozen(cache_hash=True)
class Op:
    """Math on values: `name` is one of UNARY_OPS, BINARY_OPS or TERNARY_OPS."""

    name: str
    args: tuple
    dtype: torch.dtype

    def __attrs_post_init__(self):
        arity = {1: UNARY_OPS, 2: BINARY_OPS, 3: TERNARY_OPS}.get(len(self.args), frozenset())
        if self.name not in arity:
            raise ValueError(f"unknown {len(self.args)}-ary op {self.name!r}")

    def __repr__(self):
        return show(self)


@attrs.frozen(cache_hash=True)
class Cast:
    value: object
    dtype: torch.dtype

    def __repr__(self):
        return show(self)


Value = Load | Constant | IndexValue | Op | Cast


def _same(a, b) -> bool:
    """Structural equality of two bodies, each pair of values compared once. attrs' generated __eq__ walks
    a DAG as a tree: where each value is read twice (a max-pool's scan reads the best so far in its compare
    and its select), the work doubles with every level, and the verifier's comparison of a rebuilt node
    with its equal predecessor did not finish for a 25-tap window. Hashes are cached, so unequal bodies
    usually differ at the first pair."""
    seen = set()
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y or (id(x), id(y)) in seen:
            continue
        if x.__class__ is not y.__class__ or hash(x) != hash(y):
            return False
        seen.add((id(x), id(y)))
        if isinstance(x, Op):
            if x.name != y.name or x.dtype != y.dtype or len(x.args) != len(y.args):
                return False
            stack.extend(zip(x.args, y.args))
        elif isinstance(x, Cast):
            if x.dtype != y.dtype:
                return False
            stack.append((x.value, y.value))
        elif x != y:  # a leaf (its indirect bindings' values compare through here again)
            return False
    return True


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _same(self, other)


Op.__eq__ = Cast.__eq__ = _eq  # attrs' hash (cached, structural) stays


def children(v: Value) -> tuple:
    if isinstance(v, Op):
        return v.args
    if isinstance(v, Cast):
        return (v.value,)
    if isinstance(v, (Load, IndexValue)) and v.indirect:
        # the index values come first: loads() then lists the index tensors' loads too, so a node that
        # indexes indirectly depends on (and its reads name) the index buffer as well as the indexed one
        return tuple(b.value for b in v.indirect)
    return ()


def walk(root: Value) -> Iterator[Value]:
    """Each distinct value of the DAG once, operands before users."""
    seen: set[int] = set()
    stack = [(root, False)]
    while stack:
        v, expanded = stack.pop()
        if id(v) in seen:
            continue
        if expanded:
            seen.add(id(v))
            yield v
            continue
        stack.append((v, True))
        for c in reversed(children(v)):
            if id(c) not in seen:
                stack.append((c, False))


def loads(root: Value) -> list[Load]:
    return [v for v in walk(root) if isinstance(v, Load)]


def streamed(found: list, sizes: dict) -> list:
    """Of the loads `found`, those of the largest buffers they read (`sizes`: elements of a buffer, None or absent
    where not known): what a reduction streams, as against a norm's per-row statistics (`mean[r]`, which a
    recomputed weight gradient reads beside x and dy) or a small weight broadcast against the stream. All of them
    where a size is not known, or where none is larger than another."""
    known = [sizes.get(v.buffer) for v in found]
    if any(n is None for n in known):
        return list(found)
    top = max(known, default=0)
    return [v for v, n in zip(found, known) if n == top]


def show(root: Value) -> str:
    """The printed form of a body, as dumps, reports and kernel-cache keys show it. An operation used
    more than once is printed once, as `%k = ...; ` ahead of the expression (a tree of the same DAG doubles
    with each level of sharing: a max-pool's chain over 25 taps, each reading the best so far twice, would
    print 2**25 times); a body without shared operations prints as a plain nested expression."""
    uses: dict[int, int] = {}
    for v in walk(root):
        for c in children(v):
            uses[id(c)] = uses.get(id(c), 0) + 1
    text: dict[int, str] = {}
    lets: list[str] = []
    for v in walk(root):
        if isinstance(v, Op):
            s = f"{v.name}({', '.join(text[id(a)] for a in v.args)})"
        elif isinstance(v, Cast):
            s = f"to_{str(v.dtype).replace('torch.', '')}({text[id(v.value)]})"
        else:
            s = repr(v)
        if uses.get(id(v), 0) > 1 and isinstance(v, (Op, Cast)) and v is not root:
            name = f"%{len(lets)}"
            lets.append(f"{name} = {s}; ")
            s = name
        text[id(v)] = s
    return "".join(lets) + text[id(root)]


def rebuild(root: Value, leaf) -> Value:
    """Rebuild the DAG with each leaf (Load, Constant, IndexValue) replaced by leaf(v); shared
    subtrees stay shared. An indirect Load or IndexValue is a leaf whose index values are rebuilt first."""
    memo: dict[int, Value] = {}
    for v in walk(root):
        if isinstance(v, Op):
            memo[id(v)] = attrs.evolve(v, args=tuple(memo[id(a)] for a in v.args))
        elif isinstance(v, Cast):
            memo[id(v)] = attrs.evolve(v, value=memo[id(v.value)])
        elif isinstance(v, (Load, IndexValue)) and v.indirect:
            bound = tuple(attrs.evolve(b, value=memo[id(b.value)]) for b in v.indirect)
            memo[id(v)] = leaf(attrs.evolve(v, indirect=bound))
        else:
            memo[id(v)] = leaf(v)
    return memo[id(root)]


def substitute_index(root: Value, mapping: dict) -> Value:
    """Apply a sympy substitution of loop variables to every index in the body."""

    def leaf(v):
        if isinstance(v, Load):
            return attrs.evolve(v, index=substitute(v.index, mapping))
        if isinstance(v, IndexValue):
            return attrs.evolve(v, expr=substitute(v.expr, mapping))
        return v

    return rebuild(root, leaf)
