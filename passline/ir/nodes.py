"""Buffers, layouts, memory dependencies and the three node kinds the scheduler works on.

- `Pointwise(ranges)`: for every point of `ranges`, compute `body` and store it to `output`.
- `Reduction(ranges, reduction_ranges, reduction_type)`: for every point of `ranges`, reduce `body`
  over `reduction_ranges` and store the result.
- `Extern(op, args)`: call an aten op (matmuls, convolutions, anything without a lowering).

Loop variables are `i0..` for `ranges` and `r0..` for `reduction_ranges` (see `ir.index.loop_vars`).
"""
from __future__ import annotations

import functools
from typing import Any

import attrs
import sympy
import torch

from .body import Value, loads
from .index import Expr, VarKind, contiguous_strides, loop_vars, product, strided_index, sympify

REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


def _exprs(xs) -> tuple:
    return tuple(x if isinstance(x, sympy.Basic) else sympify(x) for x in xs)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@attrs.frozen(cache_hash=True)
class Layout:
    """Sizes and strides (in elements) of a buffer; sympy expressions so sizes may be symbolic."""

    size: tuple = attrs.field(converter=_exprs)
    stride: tuple = attrs.field(converter=_exprs)
    dtype: torch.dtype
    device: torch.device = attrs.field(default=torch.device("cpu"), converter=torch.device)

    @classmethod
    def contiguous(cls, size, dtype, device="cpu") -> "Layout":
        size = _exprs(size)
        return cls(size, contiguous_strides(size), dtype, device)

    @property
    def numel(self) -> Expr:
        return product(self.size)

    @property
    def storage_span(self) -> Expr:
        """Elements between the first and one past the last addressable element."""
        if any(s == 0 for s in self.size):
            return sympy.S.Zero
        return sympy.S.One + sympy.Add(*[(s - 1) * st for s, st in zip(self.size, self.stride)])

    def index(self, idx) -> Expr:
        return strided_index(idx, self.stride)

    def is_contiguous(self) -> bool:
        return all(
            sympy.simplify(a - b) == 0 or s == 1
            for a, b, s in zip(self.stride, contiguous_strides(self.size), self.size)
        )

    def __repr__(self):
        size = ", ".join(map(str, self.size))
        if self.is_contiguous():
            return f"{_short(self.dtype)}[{size}]"
        return f"{_short(self.dtype)}[{size}; stride {', '.join(map(str, self.stride))}]"


@attrs.frozen(cache_hash=True)
class Buffer:
    name: str
    layout: Layout

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def nbytes(self) -> Expr:
        return _nbytes(self.layout)

    def __repr__(self):
        return f"{self.name}: {self.layout!r}"


@functools.lru_cache(maxsize=1 << 16)
def _nbytes(layout: Layout) -> Expr:
    n = layout.storage_span * layout.dtype.itemsize
    return int(n) if n.is_number else n


def _body_loads(*bodies) -> dict:
    """Buffer name -> the indices the body loads it at, buffers in first-use order (kept on each node:
    scheduling asks often)."""
    out: dict = {}
    for ld in (ld for body in bodies for ld in loads(body)):
        out.setdefault(ld.buffer, []).append(ld.index)
    return {b: tuple(ix) for b, ix in out.items()}


@attrs.frozen(cache_hash=True)
class MemoryDep:
    """One access to a buffer: which buffer, at which index, over which loop variables."""

    buffer: str
    index: Expr
    var_ranges: tuple  # ((symbol, size), ...) of the node's loops

    def __repr__(self):
        return f"{self.buffer}[{self.index}]"


@attrs.frozen(cache_hash=True)
class TensorArg:
    """A strided view of a buffer, passed to an extern call."""

    buffer: str
    size: tuple = attrs.field(converter=_exprs)
    stride: tuple = attrs.field(converter=_exprs)
    offset: Expr = attrs.field(default=sympy.S.Zero, converter=lambda x: _exprs([x])[0])

    def __repr__(self):
        return f"{self.buffer}<{', '.join(map(str, self.size))}>"


class _Node:
    """Behaviour shared by the node kinds (attrs classes below supply the fields)."""

    name: str
    origins: tuple

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()

    def output_buffers(self) -> tuple[Buffer, ...]:
        return (self.output,)

    def output_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.output_buffers())


def _var_ranges(node) -> tuple:
    outer = loop_vars(VarKind.OUTER, len(node.ranges))
    red = loop_vars(VarKind.REDUCTION, len(getattr(node, "reduction_ranges", ())))
    return tuple(zip(outer, node.ranges)) + tuple(zip(red, getattr(node, "reduction_ranges", ())))


class _LoopNode(_Node):
    """A node with a loop nest and a body: Pointwise or Reduction."""

    ranges: tuple
    body: Value
    output: Buffer

    @property
    def vars(self) -> tuple:
        return loop_vars(VarKind.OUTER, len(self.ranges))

    @property
    def var_ranges(self) -> tuple:
        return _var_ranges(self)

    @property
    def numel(self) -> Expr:
        return product(self.ranges)

    def store_index(self) -> Expr:
        """Where each point of `ranges` lands in the output buffer."""
        return self.output.layout.index(self.store_order(self.vars))

    def store_order(self, vars):
        """The loop variables in the output's logical dimension order (identity unless reordered)."""
        return tuple(vars[p] for p in self.permutation)

    def reads(self) -> tuple[MemoryDep, ...]:
        vr = self.var_ranges
        return tuple(dict.fromkeys(MemoryDep(ld.buffer, ld.index, vr) for ld in loads(self.body)))

    def writes(self) -> tuple[MemoryDep, ...]:
        outer = self.var_ranges[: len(self.ranges)]
        return (MemoryDep(self.output.name, self.store_index(), outer),)

    def output_names(self) -> tuple[str, ...]:
        return (self.output.name,)

    @property
    def mutates(self) -> tuple:
        """Buffers this node writes in place without producing them (see Pointwise.in_place, Scatter)."""
        return ()

    def read_names(self) -> tuple[str, ...]:
        return tuple(self._loads)

    def load_indices(self, buffer: str) -> tuple:
        """The indices at which the body loads `buffer`."""
        return self._loads.get(buffer, ())

    def memo(self) -> dict:
        """A per-node cache for facts derived from this (immutable) node."""
        return self._memo


def _identity_perm(self):
    return tuple(range(len(self.ranges)))


@attrs.frozen(cache_hash=True, repr=False)
class Pointwise(_LoopNode):
    """For each point of `ranges`, store `body` into `output`.

    `in_place`: `output` is a graph input and this node overwrites it (`dst.copy_(src)` of a mutated input,
    such as BatchNorm's running statistics, which aot_autograd leaves in the graph): like a Scatter it
    does not produce the buffer (`output_names()` is empty, `mutates` names it), so the graph orders it
    after every earlier reader of the input's old value and before every later reader. Unlike a Scatter it
    writes at its loop points, so it fuses into the kernel computing the value it stores; a reader of the
    old value in the same kernel must read it at the point written (loaded before the store)."""

    name: str
    ranges: tuple = attrs.field(converter=_exprs)
    body: Any
    output: Buffer
    origins: tuple = ()
    # permutation[k] = which loop variable indexes the output's k-th dimension (loop reordering)
    permutation: tuple = attrs.field(default=attrs.Factory(_identity_perm, takes_self=True))
    in_place: bool = attrs.field(default=False, kw_only=True)
    _loads: dict = attrs.field(init=False, eq=False, hash=False, repr=False,
                               default=attrs.Factory(lambda self: _body_loads(self.body), takes_self=True))
    _memo: dict = attrs.field(init=False, eq=False, hash=False, repr=False, factory=dict)

    @property
    def mutates(self) -> tuple:
        return (self.output.name,) if self.in_place else ()

    def output_buffers(self) -> tuple:
        return () if self.in_place else (self.output,)

    def output_names(self) -> tuple:
        return () if self.in_place else (self.output.name,)

    def __repr__(self):
        where = " (in place)" if self.in_place else ""
        return (f"{self.name} = Pointwise(ranges=[{', '.join(map(str, self.ranges))}]) "
                f"-> {self.output!r}{where}: {self.body!r}")


@attrs.frozen(cache_hash=True, repr=False)
class Reduction(_LoopNode):
    name: str
    ranges: tuple = attrs.field(converter=_exprs)
    reduction_ranges: tuple = attrs.field(converter=_exprs)
    reduction_type: str = attrs.field(validator=attrs.validators.in_(REDUCTION_TYPES))
    body: Any
    output: Buffer
    origins: tuple = ()
    permutation: tuple = attrs.field(default=attrs.Factory(_identity_perm, takes_self=True))
    _loads: dict = attrs.field(init=False, eq=False, hash=False, repr=False,
                               default=attrs.Factory(lambda self: _body_loads(self.body), takes_self=True))
    _memo: dict = attrs.field(init=False, eq=False, hash=False, repr=False, factory=dict)

    @property
    def reduction_vars(self) -> tuple:
        return loop_vars(VarKind.REDUCTION, len(self.reduction_ranges))

    @property
    def reduction_numel(self) -> Expr:
        return product(self.reduction_ranges)

    def __repr__(self):
        return (f"{self.name} = Reduction({self.reduction_type}, "
                f"ranges=[{', '.join(map(str, self.ranges))}], "
                f"reduction_ranges=[{', '.join(map(str, self.reduction_ranges))}]) "
                f"-> {self.output!r}: {self.body!r}")


SCATTER_MODES = ("store", "add")


@attrs.frozen(cache_hash=True, repr=False)
class Scatter(_LoopNode):
    """Writes into an existing buffer at positions known only at run time (scatter, index_put, the
    backward of gather and embedding): for each point of `ranges`, `output[index] = body` (mode "store")
    or `output[index] += body` ("add": atomic adds in generated code, so duplicate positions are summed).

    `index` is a storage offset in `output`, sympy over the loop variables and the index symbols that
    `indirect` binds (see `ir.Indirect`; checked against their bounds like an indirect load's). `output`
    is not produced here: an earlier node writes its initial value (zeros, or a copy of the tensor
    scattered into) and this node mutates it in place (`mutates`), so the graph orders it after that node
    and before every later reader of the buffer, and the verifier checks that order."""

    name: str
    ranges: tuple = attrs.field(converter=_exprs)
    body: Any
    output: Buffer
    index: Expr
    indirect: tuple
    mode: str = attrs.field(validator=attrs.validators.in_(SCATTER_MODES))
    origins: tuple = ()
    permutation: tuple = attrs.field(default=attrs.Factory(_identity_perm, takes_self=True))
    _loads: dict = attrs.field(init=False, eq=False, hash=False, repr=False, default=attrs.Factory(
        lambda self: _body_loads(*self.values()), takes_self=True))
    _memo: dict = attrs.field(init=False, eq=False, hash=False, repr=False, factory=dict)

    kind = "scatter"

    @property
    def mutates(self) -> tuple:
        return (self.output.name,)

    def store_index(self) -> Expr:
        return self.index

    def output_buffers(self) -> tuple:
        return ()  # the buffer is its initializer's; this node mutates it

    def output_names(self) -> tuple:
        return ()

    def read_names(self) -> tuple:
        # the target too: the write comes after its initial value (and, for "add", reads it)
        return tuple(dict.fromkeys((*self._loads, self.output.name)))

    def values(self) -> tuple:
        """What it computes at each point: the value written, then the index values."""
        return (self.body, *(b.value for b in self.indirect))

    def reads(self) -> tuple:
        vr = self.var_ranges
        return tuple(dict.fromkeys(MemoryDep(ld.buffer, ld.index, vr) for v in self.values() for ld in loads(v)))

    def __repr__(self):
        binds = "".join(f"; {b!r}" for b in self.indirect)
        op = "=" if self.mode == "store" else "+="
        return (f"{self.name} = Scatter(ranges=[{', '.join(map(str, self.ranges))}]) "
                f"{self.output.name}[{self.index}{binds}] {op} {self.body!r}")


# torch's functional collectives (torch.distributed._functional_collectives and the aten forms dynamo
# captures): every op of these namespaces starts a collective, except `wait_tensor`, which waits for one
COMM_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def comm_kind(op) -> str | None:
    """The role of a functional collective op, "collective" or "wait"; None for any other op."""
    namespace, _, name = getattr(getattr(op, "_schema", None), "name", "").partition("::")
    if namespace not in COMM_NAMESPACES:
        return None
    return "wait" if name == "wait_tensor" else "collective"


@attrs.frozen(cache_hash=True, repr=False)
class Extern(_Node):
    """A call to an aten op. `args`/`kwargs` hold TensorArg where tensors go; `outputs` lists the
    buffers for the tensor results in the op's return order (None for a non-tensor result);
    `mutates` names input buffers the op writes in place.

    `after` names buffers the call must run after without reading them, never passed to `op`: a
    collective comes after the previous collective (every rank must issue them in the same order), a
    wait after its collective's inputs (the collective may read them until the wait, so they must stay
    allocated and unwritten until then). They count as reads for the graph's edges and for lifetimes."""

    name: str
    op: Any
    args: tuple
    kwargs: tuple  # ((key, value), ...) so the node stays hashable
    outputs: tuple
    origins: tuple = ()
    mutates: tuple = ()
    after: tuple = ()

    @property
    def comm(self) -> str | None:
        """The call's role in communication: "collective", "wait" or None (see `comm_kind`)."""
        return comm_kind(self.op)

    def output_buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.outputs if b is not None)

    def tensor_args(self) -> list[TensorArg]:
        found: list[TensorArg] = []
        _collect(self.args, found)
        _collect(tuple(v for _, v in self.kwargs), found)
        return found

    def read_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(t.buffer for t in self.tensor_args()), *self.after]))

    def reads(self) -> tuple[MemoryDep, ...]:
        deps = []
        for t in self.tensor_args():
            vs = loop_vars(VarKind.OUTER, len(t.size))
            deps.append(MemoryDep(t.buffer, strided_index(vs, t.stride, t.offset), tuple(zip(vs, t.size))))
        return tuple(dict.fromkeys(deps))

    def writes(self) -> tuple[MemoryDep, ...]:
        deps = []
        for b in self.output_buffers():
            vs = loop_vars(VarKind.OUTER, len(b.layout.size))
            deps.append(MemoryDep(b.name, b.layout.index(vs), tuple(zip(vs, b.layout.size))))
        return tuple(deps)

    def __repr__(self):
        outs = ", ".join(repr(b) for b in self.output_buffers())
        args = ", ".join(map(repr, self.args))
        after = f" after {', '.join(self.after)}" if self.after else ""
        return f"{self.name} = Extern({self.op}({args})){after} -> {outs}"


def _collect(x, found: list) -> None:
    if isinstance(x, TensorArg):
        found.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _collect(y, found)




def _group_outputs(group) -> tuple:
    return tuple(b for m in group.members() for b in m.output_names())


def _group_reads(group) -> tuple:
    inside = set(_group_outputs(group))
    return tuple(dict.fromkeys(b for m in group.members() for b in m.read_names() if b not in inside))


def _derived(fn):
    """A field computed from the others when the node is built (kept out of eq, hash and repr); a
    builder that already knows it may pass it (keyword-only)."""
    return attrs.field(kw_only=True, eq=False, hash=False, repr=False, default=attrs.Factory(fn, takes_self=True))


def _members_origins(nodes) -> tuple:
    return tuple(dict.fromkeys(o for n in nodes for o in n.origins))


class _GroupNode(_Node):
    """Behaviour shared by nodes that hold other nodes (fused groups, mix-order reductions)."""

    def members(self) -> tuple:
        """The Pointwise/Reduction nodes inside, in execution order."""
        raise NotImplementedError

    def output_buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for m in self.members() for b in m.output_buffers())

    def output_names(self) -> tuple[str, ...]:
        return self._outputs

    @property
    def mutates(self) -> tuple:
        """Buffers its members write in place (graph inputs a member overwrites)."""
        return tuple(dict.fromkeys(b for m in self.members() for b in m.mutates))

    def read_names(self) -> tuple[str, ...]:
        return self._reads

    def reads(self) -> tuple[MemoryDep, ...]:
        inside = set(self.output_names())
        return tuple(dict.fromkeys(d for m in self.members() for d in m.reads() if d.buffer not in inside))

    def writes(self) -> tuple[MemoryDep, ...]:
        return tuple(d for m in self.members() for d in m.writes())

    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members())


@attrs.frozen(cache_hash=True, repr=False)
class FusedNode(_GroupNode):
    """Nodes that run as one kernel over one loop nest.

    `ranges` / `reduction_ranges` are the group's canonical loop sizes (size-1 loops dropped); every
    member's own loops line up with them: a Reduction member as (ranges | reduction_ranges), a Pointwise
    member either over ranges + reduction_ranges (inside the reduction loop) or over ranges alone (after
    the reductions). Members read each other's buffers only at the point being computed, so a buffer
    that no node outside the group reads never needs memory."""

    name: str
    nodes: tuple
    ranges: tuple = attrs.field(converter=_exprs)
    reduction_ranges: tuple = attrs.field(default=(), converter=_exprs)
    origins: tuple = attrs.field(default=attrs.Factory(lambda self: _members_origins(self.nodes), takes_self=True))
    _outputs: tuple = _derived(_group_outputs)
    _reads: tuple = _derived(_group_reads)

    kind = "fused"

    def members(self) -> tuple:
        return self.nodes

    @property
    def numel(self) -> Expr:
        return product(self.ranges)

    @property
    def reduction_numel(self) -> Expr:
        return product(self.reduction_ranges)

    def __repr__(self):
        red = f" | {', '.join(map(str, self.reduction_ranges))}" if self.reduction_ranges else ""
        return f"{self.name} = Fused[{', '.join(map(str, self.ranges))}{red}]({', '.join(self.member_names())})"


@attrs.frozen(cache_hash=True, repr=False)
class MixOrderNode(_GroupNode):
    """A row-reduction group and column-reduction groups over the same rows, in one kernel.

    `row` reduces over the columns of each row (ranges = rows | reduction = columns), or is a group of
    pointwise work over the same loops with no reduction (a bias gradient's dh); each of `column_groups` reduces
    over the rows for each column (ranges = columns | reduction = rows). The kernel walks blocks
    of `split_rows` rows: it finishes each row's reduction and epilogue, and adds the block's column
    partial sums into a workspace [n_splits, columns]; a small reduction over the splits finishes the
    column results (and their epilogues). `split_rows` is the block size the IR's byte counts and the
    CPU interpreter use; with `tune_split` a GPU backend may time other block sizes and keep the best.
    `tiled`: the row side is pointwise and its rows too wide to hold whole in registers, so the kernel takes
    the columns in blocks too (a program per block of rows and block of columns; mix_order_reduction)."""

    name: str
    row: Any
    column_groups: tuple  # the column side's groups (`columns` is how many columns there are)
    split_rows: int
    tune_split: bool = True
    tiled: bool = False
    origins: tuple = attrs.field(default=attrs.Factory(
        lambda self: _members_origins((self.row, *self.column_groups)), takes_self=True))
    _outputs: tuple = _derived(_group_outputs)
    _reads: tuple = _derived(_group_reads)

    kind = "mix_order"

    def members(self) -> tuple:
        return tuple(m for g in (self.row, *self.column_groups) for m in members(g))

    @property
    def rows(self) -> Expr:
        return product(_group_shape(self.row)[0])

    @property
    def columns(self) -> Expr:
        return product(_group_shape(self.row)[1])

    numel = rows  # the row loop, as for a row reduction
    reduction_numel = columns

    @property
    def n_splits(self) -> Expr:
        from .index import FloorDiv

        return FloorDiv(self.rows + self.split_rows - 1, self.split_rows)

    def column_reductions(self) -> list:
        return [m for g in self.column_groups for m in members(g) if isinstance(m, Reduction)]

    def workspace_bytes(self) -> Expr:
        """Bytes of the partial-sum workspaces (float32 or wider accumulators)."""
        return sum((self.n_splits * self.columns * max(4, m.output.dtype.itemsize)
                    for m in self.column_reductions()), sympy.S.Zero)

    def __repr__(self):
        cols = "; ".join(getattr(c, "name", "?") for c in self.column_groups)
        split = f"{self.split_rows}{' (tuned)' if self.tune_split else ''}{', columns tiled' if self.tiled else ''}"
        return f"{self.name} = MixOrder(rows {self.rows} x cols {self.columns}, split {split}: " \
               f"{self.row.name}; {cols})"


def members(node) -> tuple:
    """The leaf nodes (Pointwise, Reduction, Extern) a scheduler node runs: a group's members, or the node."""
    return node.members() if isinstance(node, (FusedNode, MixOrderNode)) else (node,)


def may_store_over_reads(node) -> bool:
    """Whether the kernel computing `node` may store an output in the storage of a buffer it reads that dies
    there — the structural half of codegen's rule (`backends/triton/kernel.overwritable`, which also checks
    every load's index), and all of it that `peak_memory`'s estimate knows: never an extern call (aten
    allocates its own result), a scatter (it writes other points than it reads) or a member writing a graph
    input in place."""
    return not isinstance(node, Extern) and not any(
        isinstance(m, Scatter) or getattr(m, "in_place", False) for m in members(node))


def read_after_store(node) -> frozenset:
    """Buffers a kernel of `node` may read after storing its outputs, so never storage for one: a mix-order
    node's column side (its members in the row loop, the finishing kernel's epilogues) reads its buffers in
    another order than the row side stores."""
    if isinstance(node, MixOrderNode):
        return frozenset(b for g in node.column_groups for m in members(g) for b in m.read_names())
    return frozenset()


def _group_shape(node) -> tuple:
    """(outer sizes, reduction sizes) of a node or group, size-1 loops dropped."""
    if isinstance(node, FusedNode):
        return node.ranges, node.reduction_ranges
    memo = node.memo()
    if "shape" not in memo:
        memo["shape"] = _loop_shape(node)
    return memo["shape"]


def _loop_shape(node) -> tuple:
    outer = tuple(s for s in node.ranges if s != 1)
    red = tuple(s for s in getattr(node, "reduction_ranges", ()) if s != 1)
    if isinstance(node, Reduction) and not red:
        red = (sympy.S.One,)
    return outer, red


Node = Pointwise | Reduction | Scatter | Extern | FusedNode | MixOrderNode
