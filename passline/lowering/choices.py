"""Choices: other implementations of one aten op, competing with the op itself at lowering.

    @passline.register_choice(torch.ops.aten.mm, "halves", applies=lambda a, b: a.shape[1] % 2 == 0)
    def halves(a, b):                      # the op's own arguments, written with torch ops
        k = a.shape[1] // 2
        return a[:, :k] @ b[:k] + a[:, k:] @ b[k:]

A *choice* is a function of an aten op's arguments written with torch ops, registered for that op under
a name, with a predicate (`applies`) saying when it may stand in for the op and, optionally, `variants`: the
keyword arguments of its versions worth trying for given arguments (decompose-K's chunk counts). A
*candidate* is one version of one choice for one node (`decompose_k(chunks=32)`), or the op itself
(`aten`, always a candidate).

Lowering asks a chooser which candidate implements a node whose op has candidates that apply
(`choose`); a chosen function is traced into aten ops (make_fx with passline's decompositions, on fake
tensors shaped as the node's arguments) and those are lowered in place of the node, into the same graph,
so its pointwise epilogue (a sum's cast, a bias add, whatever follows the op) fuses like any other
node's. The chooser here, `Rule`, picks `aten` unless `choice_overrides` names another candidate; the
dynamo backend's chooser (backends/choosing.py) times the candidates on a GPU. Each decision is a
`ChoiceRecord` on the graph (`SchedulerGraph.choices`) and on the compile report.

Choices need static sizes: a node with a symbolic size or stride keeps the op itself (no record).
"""
from __future__ import annotations

import collections
import difflib
import hashlib
import inspect
import warnings
from typing import Callable

import attrs
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

aten = torch.ops.aten

ATEN = "aten"  # the name of the op itself among a node's candidates


@attrs.frozen
class Choice:
    """A registered implementation of `op` (its name: "mm")."""

    op: str
    name: str
    fn: Callable
    applies: Callable | None = None  # (*args, **kwargs) -> bool, on the node's meta values; None: always
    variants: Callable | None = None  # (*args, **kwargs) -> [dict of keyword arguments]; None: one version

    def fingerprint(self) -> tuple:
        """What identifies this choice's code, for keys of choices cached on disk: the function's bytecode and
        its module's source (helpers it calls), so that edited code is timed again."""
        code = getattr(self.fn, "__code__", None)
        try:
            module = hashlib.sha256(inspect.getsource(inspect.getmodule(self.fn)).encode()).hexdigest()
        except (OSError, TypeError):  # defined interactively: its bytecode only
            module = ""
        return (self.op, self.name, getattr(self.fn, "__qualname__", repr(self.fn)),
                code.co_code.hex() if code is not None else "", module)


@attrs.frozen
class Candidate:
    """One implementation of one node: a version (`params`) of a registered choice, or the op (choice None)."""

    choice: Choice | None = None
    params: tuple = ()  # ((keyword, value), ...)

    @property
    def family(self) -> str:
        return self.choice.name if self.choice is not None else ATEN

    @property
    def name(self) -> str:
        if not self.params:
            return self.family
        return f"{self.family}({', '.join(f'{k}={v}' for k, v in self.params)})"

    def __call__(self, *args, **kwargs):
        return self.choice.fn(*args, **kwargs, **dict(self.params))


OP = Candidate()  # the op itself, `aten`


@attrs.frozen
class ChoiceRecord:
    """How one node was implemented: its FX node, the op, the candidates that applied (`aten` first), the
    chosen one, milliseconds per timed candidate (empty when nothing was timed), and how the choice was made:
    "rule" (no timing: the op itself), "override" (`choice_overrides`), "timed" (on a GPU, now) or "cached"
    (timed by an earlier compile; its timings are that compile's)."""

    node: str
    op: str
    candidates: tuple
    chosen: str
    timings: dict = attrs.field(factory=dict, hash=False)
    how: str = "rule"

    def __str__(self) -> str:
        timed = ", ".join(f"{k} {v:.4f} ms" for k, v in self.timings.items())
        return (f"{self.node} ({self.op}): {self.chosen} [{self.how}] among {', '.join(self.candidates)}"
                + (f"; timed {timed}" if timed else ""))


# -- the registry ---------------------------------------------------------------------------------------

_REGISTRY: dict[str, dict[str, Choice]] = {}


def op_name(op) -> str:
    """An op's name in the registry: "mm" for aten.mm, aten.mm.default or "mm" (other namespaces keep theirs)."""
    if isinstance(op, str):
        return op.removeprefix("aten::").removeprefix("aten.").split(".")[0]
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return schema.name.removeprefix("aten::")
    name = getattr(op, "_qualified_op_name", None)  # an OpOverloadPacket
    if name is not None:
        return name.removeprefix("aten::")
    raise TypeError(f"not an aten op: {op!r}")


def register_choice(op, name: str, *, applies: Callable | None = None, variants: Callable | None = None,
                    replace: bool = False):
    """Decorator: register `fn` as an implementation of `op` named `name` (see the module doc). `applies`
    and `variants` take the op's arguments as lowering sees them (fake tensors with the node's shapes,
    strides, dtype and device; Python numbers). `replace=True` replaces a choice of that name."""
    key = op_name(op)
    if name == ATEN:
        raise ValueError(f"{ATEN!r} names the op itself; give the choice another name")
    if not name.isidentifier():
        raise ValueError(f"a choice's name is an identifier, not {name!r}")

    def register(fn: Callable) -> Callable:
        if not replace and name in _REGISTRY.get(key, {}):
            raise ValueError(f"a choice {name!r} is already registered for {key}; pass replace=True")
        _REGISTRY.setdefault(key, {})[name] = Choice(key, name, fn, applies, variants)
        return fn

    return register


def unregister_choice(op, name: str) -> None:
    key = op_name(op)
    if name not in _REGISTRY.get(key, {}):
        raise KeyError(f"no choice {name!r} for {key}")
    del _REGISTRY[key][name]
    if not _REGISTRY[key]:
        del _REGISTRY[key]


def registered() -> dict[str, dict[str, Choice]]:
    """op name -> {choice name: Choice}, a copy."""
    return {op: dict(cs) for op, cs in _REGISTRY.items()}


def check_overrides(overrides) -> dict[str, str]:
    """`choice_overrides` with ops by name, or a ValueError naming what is unknown and the nearest names."""
    out = {}
    for op, name in dict(overrides or {}).items():
        key = op_name(op)
        if key not in _REGISTRY:
            raise ValueError(f"choice_overrides: no choices are registered for {key!r}"
                             + _hint(key, _REGISTRY) + f" (ops with choices: {', '.join(sorted(_REGISTRY))})")
        names = [ATEN, *_REGISTRY[key]]
        family = str(name).split("(")[0]
        if family not in names:
            raise ValueError(f"choice_overrides: {key} has no candidate {name!r}" + _hint(family, names)
                             + f" (candidates: {', '.join(names)})")
        out[key] = str(name)
    return out


def _hint(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


# -- choosing --------------------------------------------------------------------------------------------

def meta_args(node: torch.fx.Node) -> tuple[tuple, dict]:
    """The node's arguments as lowering's predicates see them: FX nodes replaced by their meta values."""
    return (torch.fx.node.map_arg(node.args, lambda a: a.meta.get("val")),
            torch.fx.node.map_arg(node.kwargs, lambda a: a.meta.get("val")))


def is_static(args, kwargs) -> bool:
    """Whether no SymInt, and no tensor of symbolic size or stride, is among `args` and `kwargs`."""
    for v in tree_flatten((args, kwargs))[0]:
        if isinstance(v, torch.SymInt):
            return False
        if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
            return False
    return True


def candidates(op: str, args, kwargs) -> list[Candidate]:
    """The node's candidates: the op itself first, then every version of every choice that applies."""
    found = [OP]
    for choice in _REGISTRY.get(op, {}).values():
        try:
            if choice.applies is not None and not choice.applies(*args, **kwargs):
                continue
            versions = choice.variants(*args, **kwargs) if choice.variants is not None else [{}]
        except Exception as e:  # noqa: BLE001 - a user's predicate that fails: that choice is no candidate
            warnings.warn(f"passline: choice {choice.name!r} of {op}: its applies or variants raised "
                          f"{type(e).__name__}: {e}; it is not a candidate here", stacklevel=2)
            continue
        found.extend(Candidate(choice, tuple(sorted(v.items()))) for v in versions)
    return found


class Rule:
    """The chooser without a GPU: the op itself, unless `overrides` (op name -> candidate name) names
    another. An override names a choice ("decompose_k": its first version) or one version
    ("decompose_k(chunks=32)"); it holds wherever that candidate applies, and the op runs elsewhere.

    A chooser is called with the FX node, its op's name, its candidates and its meta arguments, and returns
    (candidate, timings in ms, how); `pick` narrows to what may be chosen, `time` (None here) may time them."""

    def __init__(self, overrides=None):
        self.overrides = check_overrides(overrides)

    def pick(self, op: str, cands: list[Candidate]) -> tuple[list[Candidate], str]:
        """(the candidates the choice is made among, how it is made)."""
        forced = self.overrides.get(op)
        if forced is None:
            return cands, "rule"
        named = [c for c in cands if forced in (c.name, c.family)]
        return (named, "override") if named else ([OP], "override not applicable")

    def time(self, node, op, cands, args, kwargs) -> tuple[Candidate, dict, str] | None:
        return None

    def __call__(self, node: torch.fx.Node, op: str, cands: list[Candidate], args, kwargs):
        pool, how = self.pick(op, cands)
        if len(pool) > 1 and how == "rule":  # an override forces (its first version): never timed
            timed = self.time(node, op, pool, args, kwargs)
            if timed is not None:
                return timed
        return pool[0], {}, how


class Replay:
    """A chooser that repeats the decisions of `records` (ChoiceRecords of an earlier lowering of the graph).

    A record names its node, but a graph loaded from aot_autograd's cache is the same graph with other node
    names (torch re-traces a pickled GraphModule's code: `mm` comes back as `mm_default`), so the decisions are
    taken in order, op by op: lowering meets the nodes with choices in the graph's order, which the names'
    change keeps (the n-th `mm` node asked gets the n-th `mm` record)."""

    def __init__(self, records):
        self.chosen: dict = {}
        for r in records:
            self.chosen.setdefault(r.op, []).append(r.chosen)
        self.asked = collections.Counter()

    def __call__(self, node, op, cands, args, kwargs):
        mine = self.chosen.get(op, ())
        n, self.asked[op] = self.asked[op], self.asked[op] + 1
        want = mine[n] if n < len(mine) else ATEN
        return next((c for c in cands if c.name == want), OP), {}, "replayed"


def choose(chooser, node: torch.fx.Node) -> tuple[ChoiceRecord, Candidate] | None:
    """The record and candidate for `node`, or None when its op has no candidate but itself."""
    if chooser is None or not isinstance(node.target, torch._ops.OpOverload):
        return None
    op = op_name(node.target)
    if op not in _REGISTRY:
        return None
    args, kwargs = meta_args(node)
    if not is_static(args, kwargs):
        return None
    cands = candidates(op, args, kwargs)
    if len(cands) == 1:
        return None
    chosen, timings, how = chooser(node, op, cands, args, kwargs)
    return ChoiceRecord(node.name, op, tuple(c.name for c in cands), chosen.name, dict(timings), how), chosen


def trace(candidate: Candidate, node: torch.fx.Node) -> torch.fx.GraphModule:
    """`candidate` (OP: the node's op itself) applied to `node`'s arguments as an aten graph: make_fx with
    passline's decompositions, on fake tensors with the node's shapes, strides, dtypes and devices. Its
    placeholders are the tensors among the node's arguments, in order; other arguments (numbers, lists) are
    constants of the graph."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    from .decompositions import decomposition_table

    want = node.meta.get("val")
    if not isinstance(want, torch.Tensor):
        raise ValueError(f"choices stand in for ops that return one tensor; {node.target} returns {type(want)}")
    args, kwargs = meta_args(node)
    leaves, spec = tree_flatten((args, kwargs))
    where = [k for k, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def flat(*tensors):
        vals = list(leaves)
        for k, t in zip(where, tensors):
            vals[k] = t
        a, kw = tree_unflatten(vals, spec)
        return node.target(*a, **kw) if candidate.choice is None else candidate(*a, **kw)  # OP: the op itself

    # a fake mode of its own: lowering may run inside aot_autograd's, whose tensors must not leak in
    with unset_fake_temporarily():
        with FakeTensorMode():
            fakes = [torch.empty_strided(leaves[k].shape, leaves[k].stride(), dtype=leaves[k].dtype,
                                         device=leaves[k].device) for k in where]
        try:
            gm = make_fx(flat, decomposition_table=decomposition_table(), tracing_mode="fake")(*fakes)
        except Exception as e:
            raise RuntimeError(f"choice {candidate.name} of {op_name(node.target)} failed when traced: "
                               f"{type(e).__name__}: {e}") from e
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    got = getattr(out, "meta", {}).get("val")
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(out).__name__
        raise ValueError(f"choice {candidate.name} of {op_name(node.target)} returns {what}; the op returns "
                         f"{tuple(want.shape)} {want.dtype}")
    return gm


def agree(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a candidate's result `got` agrees with the op's `want`: the largest difference within
    passline.testing's tolerance for `dtype`, relative to the result's largest magnitude. A sum in another
    order rounds differently element by element, by about an ulp of the largest partial sums, while a wrong
    implementation is off by the size of the values themselves."""
    from ..testing import tolerance

    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.numel() == 0:
        return True
    tol = tolerance(dtype)
    scale = want.double().abs().max().item()
    err = (got.double() - want.double()).abs().max().item()
    return err <= tol["atol"] + tol["rtol"] * scale


# -- decompose-K ------------------------------------------------------------------------------------------
#
# An mm whose output is small (M x N) next to its reduction (K) has few output tiles: few of a GPU's SMs
# work, each through all of K. Split K into chunks, multiply the chunks as one batched matmul (a tile
# per chunk: many more SMs busy), and sum the partial products: an extra write and read of chunks x M x N
# float32 values, small when M and N are. Partial products are kept in float32 and the sum is rounded
# once to the result's dtype, as the op's own accumulator does.

# Inductor's threshold (config.triton.decompose_k_threshold): K at least 32 times M and N.
K_RATIO = 32
# A chunk is a whole number of 128-long K blocks (the longest BLOCK_K of Inductor's mm configurations):
# a shorter or ragged chunk leaves the bmm's K loop partly empty.
K_BLOCK = 128
# Each version tried costs a compile and a timing at the node's first compile; the largest chunk counts
# are the ones that can occupy a big GPU when M and N are small.
MAX_VERSIONS = 4


def chunk_counts(m: int, n: int, k: int) -> list[int]:
    """Chunk counts worth trying for an (m x k) @ (k x n) product, largest first: counts c whose chunks are
    whole K blocks (c divides k / K_BLOCK), no shorter than the output is tall or wide (c <= k / m, k / n,
    Inductor's bound), at most MAX_VERSIONS of them."""
    if k % K_BLOCK or m < 1 or n < 1:
        return []
    cap = min(k // m, k // n, k // K_BLOCK)
    return [c for c in range(cap, 1, -1) if (k // K_BLOCK) % c == 0][:MAX_VERSIONS]


def _float32_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm(a, b) with float32 (or wider) results: out_dtype on CUDA (one kernel; aten.bmm.dtype has
    no CPU kernel), else the inputs cast up (products of float16/bfloat16 values are exact in float32)."""
    acc = torch.promote_types(a.dtype, torch.float32)
    if a.dtype == acc:
        return torch.bmm(a, b)
    if a.is_cuda and hasattr(aten.bmm, "dtype"):
        return torch.bmm(a, b, out_dtype=acc)
    return torch.bmm(a.to(acc), b.to(acc))


def _chunked_mm(a, b, chunks: int) -> torch.Tensor:
    """sum over chunks of a[:, chunk] @ b[chunk, :], in float32: [M, N]."""
    (m, k), n = a.shape, b.shape[1]
    part = k // chunks
    return _float32_products(a.reshape(m, chunks, part).permute(1, 0, 2), b.reshape(chunks, part, n)).sum(0)


def _is_float(*ts) -> bool:
    return all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in ts)


def _small_output(m: int, n: int, k: int) -> bool:
    return k >= K_RATIO * max(m, n) and bool(chunk_counts(m, n, k))


@register_choice(aten.mm, "decompose_k", variants=lambda a, b: [{"chunks": c} for c in chunk_counts(
    a.shape[0], b.shape[1], a.shape[1])], applies=lambda a, b: _is_float(a, b) and _small_output(
    a.shape[0], b.shape[1], a.shape[1]))
def decompose_k_mm(a, b, *, chunks):
    return _chunked_mm(a, b, chunks).to(a.dtype)


def _addmm_applies(bias, a, b, *, beta=1, alpha=1):
    return _is_float(bias, a, b) and _small_output(a.shape[0], b.shape[1], a.shape[1])


@register_choice(aten.addmm, "decompose_k", applies=_addmm_applies,
                 variants=lambda bias, a, b, **_: [{"chunks": c} for c in chunk_counts(
                     a.shape[0], b.shape[1], a.shape[1])])
def decompose_k_addmm(bias, a, b, *, beta=1, alpha=1, chunks):
    out = _chunked_mm(a, b, chunks)
    if alpha != 1:
        out = out * alpha
    if beta != 0:  # as addmm: with beta 0 the bias is not read (its NaNs do not propagate)
        out = out + (bias if beta == 1 else bias * beta)
    return out.to(a.dtype)


def _bmm_chunks_are_views(a, b) -> bool:
    """Whether [B, M, K] @ [B, K, N] chunks along K as one batch of B x chunks matrices without a copy:
    the batch stride of each operand must be K times its stride along K (a column-major `a`, as the
    transposed activations of a batched weight gradient are), or B is 1. A copy would move all of `a` and
    `b` once more, for a product whose cost is reading them once."""
    bsz, k = a.shape[0], a.shape[2]
    return bsz == 1 or (a.stride(0) == k * a.stride(2) and b.stride(0) == k * b.stride(1))


@register_choice(aten.bmm, "decompose_k",
                 applies=lambda a, b: _is_float(a, b) and _small_output(a.shape[1], b.shape[2], a.shape[2])
                 and _bmm_chunks_are_views(a, b),
                 variants=lambda a, b: [{"chunks": c} for c in chunk_counts(a.shape[1], b.shape[2], a.shape[2])])
def decompose_k_bmm(a, b, *, chunks):
    bsz, m, k = a.shape
    n, part = b.shape[2], k // chunks
    a_parts = a.reshape(bsz, m, chunks, part).permute(0, 2, 1, 3).reshape(bsz * chunks, m, part)
    b_parts = b.reshape(bsz * chunks, part, n)
    return _float32_products(a_parts, b_parts).reshape(bsz, chunks, m, n).sum(1).to(a.dtype)

