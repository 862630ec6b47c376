"""Size arithmetic: the SymInt / SymFloat / SymBool values of an aten graph as sympy expressions.

Under dynamic shapes an aten graph computes with sizes: `operator.mul(s0, s1)`, `sym_size`, `sym_numel`,
`operator.truediv(numel, 4)` (BatchNorm's mean), comparisons, `sym_max`... Each such FX node carries its
value, as dynamo traced it, in `meta["val"]`: a symbolic value whose expression is over the same size
symbols as the graph's input layouts. Lowering takes that expression instead of re-deriving it from the
arguments, so every operator torch can trace is covered by one rule, and translates torch's own sympy
functions into the plain sympy and passline index functions the backends evaluate (`FloorDiv`,
`ModularIndexing`, `Max`, `Min`, rational arithmetic). An expression with a function passline does not
know is refused here, at compile time (the backend's eager fallback then names it).
"""
from __future__ import annotations

import math
import operator

import sympy
import torch
from torch.utils._sympy import functions as F

from ..ir import Constant, IndexValue, Op
from ..ir.index import FloorDiv, ModularIndexing, derive, derived_definition, derived_value
from .context import cast

SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
# Python-level size arithmetic that dynamo records with plain values when a result is known exactly.
SIZE_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
            operator.neg, operator.pow, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
            operator.ne, operator.not_, operator.and_, operator.or_, operator.abs, math.ceil, math.floor,
            math.sqrt, torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not,
            torch.sym_ite, torch.sym_sum}


# size queries of a tensor: their value is a plain number where the size is (or was narrowed to) one
SIZE_QUERIES = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                torch.ops.aten.sym_storage_offset.default}


def is_size_node(n: torch.fx.Node) -> bool:
    """Whether FX node `n` computes a size value (a Sym* value, or size arithmetic or a size query giving
    a plain number)."""
    val = n.meta.get("val")
    if isinstance(val, SYMBOLIC):
        return True
    return (n.target in SIZE_OPS or n.target in SIZE_QUERIES) and isinstance(val, (int, float, bool))


def size_value(n: torch.fx.Node):
    """The value of size node `n`: a sympy expression (integer, rational or boolean), or a plain number."""
    val = n.meta["val"]
    if not isinstance(val, SYMBOLIC):
        return val
    expr = val.node.expr
    try:
        return translate(expr)  # (an int computed through floats becomes a size symbol of its own)
    except NotImplementedError as e:
        raise NotImplementedError(f"size expression {expr} of {n.format_node()}: {e}") from None


_TRANSLATE = {
    F.FloorDiv: lambda a, b: FloorDiv(a, b),
    F.CleanDiv: lambda a, b: FloorDiv(a, b),
    F.CeilDiv: lambda a, b: FloorDiv(a + b - 1, b),
    F.ModularIndexing: lambda a, b, c: ModularIndexing(a, b, c),
    # sizes are non-negative, so Python's and C's remainders agree with the index function
    F.PythonMod: lambda a, b: ModularIndexing(a, sympy.S.One, b),
    F.Mod: lambda a, b: ModularIndexing(a, sympy.S.One, b),
    F.Max: lambda *a: sympy.Max(*a),
    F.Min: lambda *a: sympy.Min(*a),
    F.IntTrueDiv: lambda a, b: a / b,
    F.FloatTrueDiv: lambda a, b: a / b,
    F.ToFloat: lambda a: a,
    F.Identity: lambda a: a,
    F.PowByNatural: lambda a, b: a ** b,
    F.FloatPow: lambda a, b: a ** b,
    F.TruncToFloat: lambda a: sympy.floor(a),  # non-negative sizes: truncation is the floor
    F.TruncToInt: lambda a: sympy.floor(a),
    F.FloorToInt: lambda a: sympy.floor(a),
    F.CeilToInt: lambda a: sympy.ceiling(a),
}


def translate(expr):
    """torch's size expression → plain sympy with passline's index functions; an int computed through
    float arithmetic → its derived size symbol (`ir.index.derive`), which the runners bind per call."""
    return _translate(derive(expr))


def _translate(expr):
    if isinstance(expr, (sympy.Symbol, sympy.Number)) or expr in (sympy.true, sympy.false):
        return expr
    args = [_translate(a) for a in expr.args]
    fn = _TRANSLATE.get(type(expr))
    if fn is not None:
        return fn(*args)
    if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Max, sympy.Min, sympy.Rel, sympy.And, sympy.Or,
                         sympy.Not, sympy.floor, sympy.ceiling, sympy.Piecewise, sympy.Abs)):
        return expr.func(*args)
    raise NotImplementedError(f"{type(expr).__name__} is not a size function passline evaluates")


def at_hint(expr, hints: dict) -> int | None:
    """A size expression's value at the sizes a graph was traced at (`SchedulerGraph.hints`), or None where
    some symbol has no hint. For choices right at every size and best near the traced one, never facts."""
    expr = sympy.sympify(expr)
    if not expr.free_symbols <= hints.keys():
        return None
    v = expr.xreplace({s: sympy.Integer(hints[s]) for s in expr.free_symbols})
    v = v if v.is_number else translate(v)
    return int(v) if v.is_number else None


def runtime_value(expr, values: dict):
    """A size expression's value for one call: int, float or bool, as eager returns it."""
    v = sympy.sympify(expr.xreplace(values) if values else expr)  # a bare symbol xreplaces to an int
    if v.is_Boolean:
        return bool(v)
    return int(v) if v.is_integer else float(v)


def _integral(e):
    """An integer-valued size expression written without fractions, which no index printer evaluates:
    `numel / 6` of a conv output with a static batch of 3 is `(h + 1)*(18*h + 18)/6` — expanded, `3*h**2 +
    6*h + 3`; where expanding leaves fractions (`h*(h + 1)/2`), the exact quotient `FloorDiv(h**2 + h, 2)`."""
    if not any(not r.is_Integer for r in e.atoms(sympy.Rational)):
        return e
    expanded = sympy.expand(e)
    if not any(not r.is_Integer for r in expanded.atoms(sympy.Rational)):
        return expanded
    num, den = sympy.fraction(sympy.together(expanded))
    return FloorDiv(sympy.expand(num), den)


def scalar_body(expr, dtype: torch.dtype):
    """A loop-body value computing size expression `expr` (an integer or rational size) as `dtype`.

    Integer sizes are index values (the printers handle index functions); a rational or float size
    (`numel / 4`) is built from integer index values with `truediv` and `mul` in `dtype`, so no
    division ever reaches an index printer and the value rounds as eager's scalar would."""
    def build(e):
        if e.is_integer:
            return cast(IndexValue(_integral(e), torch.int64), dtype)
        if e.is_Number:
            return Constant(float(e), dtype)
        if e.is_Add or e.is_Mul:
            out = build(e.args[0])
            for a in e.args[1:]:
                out = Op("add" if e.is_Add else "mul", (out, build(a)), dtype)
            return out
        if e.is_Pow and e.exp.is_Integer:
            base, n = build(e.base), int(e.exp)
            out = base
            for _ in range(abs(n) - 1):
                out = Op("mul", (out, base), dtype)
            return Op("truediv", (Constant(1.0, dtype), out), dtype) if n < 0 else out
        raise NotImplementedError(f"size value {e} in a loop body")

    return build(sympy.sympify(expr))


def lower_bounds(node: torch.fx.Node) -> dict:
    """The lower bound of each size symbol dynamo's ShapeEnv knows (from the node's traced value): a
    backed size is at least 2, as dynamo specializes 0 and 1. Empty for static shapes."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)  # a multi-output op: any of its tensors
    env = next((s.node.shape_env for v in vals for s in getattr(v, "shape", ()) if isinstance(s, torch.SymInt)),
               None)
    return _env_bounds(env)


def size_facts(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    """(`lower_bounds` for a whole graph, the example value of each size symbol: dynamo's hint, the size
    it traced the graph at), from the ShapeEnv of its inputs' symbols. Bounds are facts for every size;
    hints only guide choices that are right at any size and best near the hint (how many chunks a
    reduction is split into)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            break
        val = n.meta.get("val")
        syms = [s for s in getattr(val, "shape", ()) if isinstance(s, torch.SymInt)]
        if isinstance(val, torch.SymInt):
            syms.append(val)
        if syms:
            env = syms[0].node.shape_env
            # torch 2.13 names it backed_var_to_val (var_to_val still answers, with a FutureWarning)
            values = getattr(env, "backed_var_to_val", None)
            values = values if values is not None else getattr(env, "var_to_val", {})
            hints = {sym: int(v) for sym, v in values.items() if isinstance(v, sympy.Integer)}
            return _env_bounds(env), hints
    return {}, {}


def derived_sizes(gm: torch.fx.GraphModule) -> tuple:
    """The derived size symbols (`ir.index.derive`: ints computed through float arithmetic) in `gm`'s
    traced values, in order of appearance: every size lowering can meet is one of those values."""
    found: dict = {}
    for n in gm.graph.nodes:
        for v in torch.utils._pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, torch.Tensor):
                exprs = (*v.shape, *v.stride(), v.storage_offset()) if v.layout == torch.strided else v.shape
            elif isinstance(v, SYMBOLIC):
                exprs = (v,)
            else:
                continue
            for e in exprs:
                if isinstance(e, SYMBOLIC):
                    found.update(dict.fromkeys(s for s in derive(e.node.expr).free_symbols
                                               if derived_definition(s) is not None))
    return tuple(found)


def derived_hints(derived: tuple, hints: dict) -> dict:
    """Each derived size's value at the traced sizes, where they are known."""
    out = {}
    for s in derived:
        if derived_definition(s).free_symbols <= hints.keys():
            out[s] = derived_value(s, hints)
    return out


def _env_bounds(env) -> dict:
    if env is None:
        return {}
    out = {}
    for sym, r in getattr(env, "var_to_range", {}).items():
        # Only finite integer bounds. The ShapeEnv also ranges the graph's int and float scalars (a
        # Python int argument under dynamic=True is a symbol in [-int_oo, int_oo]; a float one, `zf..`,
        # in a float range): int() of torch's -int_oo raises AttributeError in sympy (and -int_oo calls
        # itself is_integer and is_finite, so only the class tells), and a float bound truncated by
        # int() could lie above the true bound.
        if isinstance(r.lower, sympy.Integer):
            out[sym] = int(r.lower)
    return out
