"""SchedulerGraph: the scheduler nodes of one compiled graph in a networkx.DiGraph.

Nodes are keyed by name and carry the IR node (`data["node"]`) and a program-order number
(`data["order"]`, for stable printing and topological order). An edge u → v means v reads a buffer u
writes (or must run after u for a mutation); its `buffers` attribute names those buffers.
Passes use this API only: add/replace/remove/merge nodes and the queries below (`order`, `edges`,
`degree`, `has_other_path`, ...); edges follow from reads. `graph.nx` is the graph's own: no pass reads it.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

import networkx as nx
import sympy
import torch

from ..ir import (
    Buffer,
    Extern,
    FusedNode,
    IndexValue,
    IndirectSymbol,
    Load,
    MixOrderNode,
    Pointwise,
    Reduction,
    Scatter,
    TensorArg,
    loads,
    members,
    walk,
)
from ..ir.index import LOOP_KINDS, as_strided_form, var_kind
from ..ir.loops import group_problem, shape
from ..lowering import GraphInput, Program
from ..lowering.sizes import at_hint


class VerificationError(AssertionError):
    """The graph breaks an invariant. `node` names the offending node (or None for the graph)."""

    def __init__(self, message: str, node: str | None = None, pass_name: str | None = None):
        self.node = node
        self.pass_name = pass_name
        self.message = message  # without the node and pass (the manager re-raises it with the pass)
        where = f" (node {node})" if node else ""
        after = f"after pass {pass_name!r}: " if pass_name else ""
        super().__init__(f"{after}{message}{where}")


_EMPTY: frozenset = frozenset()


class SchedulerGraph:
    def __init__(self, inputs: Iterable[GraphInput] = (), outputs: Iterable = ()):
        self.nx = nx.DiGraph()
        self.inputs: tuple[GraphInput, ...] = tuple(inputs)
        self.outputs: tuple = tuple(outputs)
        self._input_names = frozenset(self.input_buffers())  # fixed with the inputs: read by every _connect
        self._order = itertools.count()
        self._producer: dict[str, str] = {}  # buffer name -> node name
        self._readers: dict[str, set[str]] = {}  # buffer name -> names of nodes reading it
        self._mutators: dict[str, set[str]] = {}  # buffer name -> names of nodes writing it in place
        # the collectives and waits as lowered, in program order: no pass may drop, add or reorder them
        self.comms: tuple[str, ...] = ()
        # the inputs the program writes in place as lowered (a mutated argument's copy-back, an in-place
        # op on a user's tensor): a pass may change how each is written, never drop the write
        self.written_inputs: frozenset = frozenset()
        # the inputs whose storage the caller gives up at the call, so that they are freed at their last use
        # (a backward's saved activations): what peak_memory counts as freed; none unless the backend says
        self.released: frozenset = frozenset()
        # how lowering implemented each node whose op had other candidates (lowering/choices.py)
        self.choices: tuple = ()
        # size symbol -> the least value dynamo allows it (a backed size is at least 2): what passes prove
        # index facts from under dynamic shapes (ir.index.least); empty for static shapes
        self.bounds: dict = {}
        # size symbol -> the size the graph was traced at (dynamo's hint): for choices that are right at
        # every size and best near it, never for facts
        self.hints: dict = {}
        # sizes computed from the others through float arithmetic (`int(n * 0.5)`: ir.index.derive), which
        # the runners bind per call after those they read from the inputs
        self.derived: tuple = ()
        # facts computed from the nodes as they are now (buffers(), mutated_names(), cached()): emptied by
        # every edit that adds, removes or replaces a node; codegen asks for them once per kernel. They may
        # also read `inputs` and `outputs` (node_bytes: what is returned), which are set here, once
        self._facts: dict = {}

    @classmethod
    def from_program(cls, program: Program) -> "SchedulerGraph":
        g = cls(program.inputs, program.outputs)
        for node in program.nodes:
            g.add_node(node)
        g.comms = tuple(n.name for n in program.nodes if isinstance(n, Extern) and n.comm)
        g.written_inputs = g._inputs_written()
        g.choices = program.choices
        g.bounds, g.hints = dict(program.bounds), dict(program.hints)
        g.derived = program.derived
        return g

    # -- queries ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    def __contains__(self, name: str) -> bool:
        return name in self.nx

    def node(self, name: str):
        return self.nx.nodes[name]["node"]

    def nodes(self) -> list:
        """The IR nodes in a topological order that keeps program order where it can."""
        order = nx.get_node_attributes(self.nx, "order")
        return [self.node(n) for n in nx.lexicographical_topological_sort(self.nx, key=order.__getitem__)]

    def leaf_nodes(self) -> list:
        """Every Pointwise, Reduction and Extern node, inside fused groups too, in order."""
        return [m for n in self.nodes() for m in members(n)]

    def names(self) -> list[str]:
        return [n.name for n in self.nodes()]

    def items(self) -> Iterator[tuple[str, object]]:
        """(name, IR node) pairs, in no particular order (cheaper than nodes(): no sort)."""
        return iter(self.nx.nodes(data="node"))

    def order(self, name: str) -> int:
        """The node's program-order number (smaller runs earlier when no dependency says otherwise)."""
        return self.nx.nodes[name]["order"]

    def orders(self) -> dict[str, int]:
        """Every node's program-order number, by name."""
        return dict(self.nx.nodes(data="order"))

    def edges(self, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
        """Dependency edges (u, v): v reads what u writes. With `names`: the edges into and out of each
        of those nodes, in that order (an edge between two of them appears twice)."""
        if names is None:
            return list(self.nx.edges)
        return [e for n in names for e in (*self.nx.in_edges(n), *self.nx.out_edges(n))]

    def num_edges(self) -> int:
        return self.nx.number_of_edges()

    def degree(self, name: str) -> int:
        """How many edges a node has (in and out)."""
        return len(self.nx.pred[name]) + len(self.nx.succ[name])

    def input_buffers(self) -> dict[str, Buffer]:
        return {i.name: i.buffer for i in self.inputs if i.buffer is not None}

    def buffers(self) -> dict[str, Buffer]:
        """Every buffer by name: the inputs' and what the nodes write (a fresh dict, the caller's own)."""
        return dict(self.cached("buffers", self._buffers))

    def numels(self) -> dict[str, int | None]:
        """Elements of every buffer at the traced sizes (`hints`; None where a size has none): which buffers are
        large, for choices that weigh them (`ir.streamed`)."""
        return dict(self.cached("numels", lambda: {n: at_hint(b.layout.numel, self.hints)
                                                   for n, b in self.buffers().items()}))

    def _buffers(self) -> dict[str, Buffer]:
        out = dict(self.input_buffers())
        for name in self.nx:
            for b in self.node(name).output_buffers():
                out[b.name] = b
        return out

    def cached(self, key, compute):
        """`compute()`, remembered under `key` until the next edit of the nodes: for facts that follow from
        the nodes alone (their buffers, what they write in place, a kernel's bytes), asked for again and again
        by codegen and the report while the graph stays as it is."""
        facts = self._facts
        if key not in facts:
            facts[key] = compute()
        return facts[key]

    def producer(self, buffer: str) -> str | None:
        """The node that writes `buffer`, or None for a graph input."""
        return self._producer.get(buffer)

    def readers(self, buffer: str):
        """Names of the nodes that read `buffer`: the graph's own set, unordered — read it, never
        change it (use consumers() for a list in program order)."""
        return self._readers.get(buffer, _EMPTY)

    def consumers(self, buffer: str) -> list[str]:
        """Nodes that read `buffer`, in program order."""
        order = self.nx.nodes
        return sorted(self._readers.get(buffer, ()), key=lambda n: order[n]["order"])

    def output_names(self) -> set[str]:
        """Buffers the compiled graph returns (they must stay in memory)."""
        return {o.buffer for o in self.outputs if isinstance(o, TensorArg)}

    def mutated_names(self) -> set[str]:
        return set(self.cached("mutated_names",
                               lambda: frozenset(b for n in self.nx for b in getattr(self.node(n), "mutates", ()))))

    def predecessors(self, name: str) -> list[str]:
        return list(self.nx.predecessors(name))

    def successors(self, name: str) -> list[str]:
        return list(self.nx.successors(name))

    def has_path(self, a: str, b: str) -> bool:
        return nx.has_path(self.nx, a, b)

    def has_other_path(self, src: str, dst: str, direct_ok: bool = True) -> bool:
        """Is there a path src → ... → dst through at least one other node (any path when not
        `direct_ok`)? Searches from whichever end has fewer neighbours (forward from src's successors, or
        backward from dst's predecessors)."""
        succ, pred = self.nx.succ, self.nx.pred
        forward = len(succ[src]) <= len(pred[dst])
        start, goal = (src, dst) if forward else (dst, src)
        step = self.nx.successors if forward else self.nx.predecessors
        stack = [n for n in step(start) if n != goal or not direct_ok]
        seen = set(stack)
        while stack:
            n = stack.pop()
            if n == goal:
                return True
            for s in step(n):
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    # -- edits ------------------------------------------------------------------------------------
    def add_node(self, node, order: int | None = None, before=_EMPTY, after=_EMPTY) -> None:
        """Add `node`; edges follow from its reads and writes. Around an in-place write, program order
        says which side of it a reader of the buffer runs on, unless `before` / `after` name nodes known
        to run before / after this one (replace_node passes those the old node was ordered with)."""
        if node.name in self.nx:
            raise ValueError(f"node {node.name} already in the graph")
        self._facts.clear()
        self.nx.add_node(node.name, node=node, order=next(self._order) if order is None else order)
        for b in node.output_names():
            self._producer[b] = node.name
        for b in node.read_names():
            self._readers.setdefault(b, set()).add(node.name)
        for b in getattr(node, "mutates", ()):
            self._mutators.setdefault(b, set()).add(node.name)
        self._connect(node, before, after)

    def remove_node(self, name: str) -> None:
        node = self.node(name)
        self._facts.clear()
        for b in node.output_names():
            if self._producer.get(b) == name:
                del self._producer[b]
        for b in node.read_names():
            if b in self._readers:
                self._readers[b].discard(name)
        for b in getattr(node, "mutates", ()):
            self._mutators.get(b, set()).discard(name)
        self.nx.remove_node(name)

    def replace_node(self, name: str, new) -> None:
        """Put `new` where `name` was (same program position); edges are recomputed from reads. The nodes ordered
        with it around an in-place write keep their side of it (program order cannot tell: a fused group's order is
        its first member's, which says nothing of where its later members read a buffer a scatter writes in place)."""
        self.replace_nodes(name, [new])

    def replace_nodes(self, name: str, new: list) -> None:
        """Put the nodes `new`, in this order, where `name` was (`replace_node` for a node that becomes several:
        a split reduction's pieces). Each keeps the old node's side of every node an in-place write ordered it
        with: a piece holding the group's write into an input still runs after a reader of the input's old
        value that came before the group, whatever their program positions (the group's is its first
        member's, which may be earlier than that reader's)."""
        order = self.nx.nodes[name]["order"]
        partners = self._in_place_partners(self.node(name))
        for n in new:
            partners |= self._in_place_partners(n)
        before, after = set(), set()
        for v in partners:
            if v != name and v in self.nx:
                if nx.has_path(self.nx, v, name):
                    before.add(v)
                elif nx.has_path(self.nx, name, v):
                    after.add(v)
        self.remove_node(name)
        for k, n in enumerate(new):
            self.add_node(n, order=order + k / (len(new) + 1), before=before, after=after)

    def _in_place_partners(self, node) -> set:
        """The nodes an in-place write orders `node` with: the writers of what it reads, and the readers
        and other writers of what it writes in place."""
        out = {m for b in node.read_names() for m in self._mutators.get(b, ())}
        for b in getattr(node, "mutates", ()):
            out |= self._readers.get(b, _EMPTY) | self._mutators.get(b, _EMPTY)
        return out

    def move(self, name: str, before: str | None = None) -> None:
        """Give node `name` the program position just before node `before` (None: after every node).
        Edges stay as they are, so the topological order still puts each node after what it depends on;
        the position only decides where, among the orders the edges allow, the node runs."""
        data = self.nx.nodes
        if before is None:
            data[name]["order"] = max(d for _, d in self.nx.nodes(data="order")) + 1
        else:
            data[name]["order"] = data[before]["order"] - 0.5

    def set_order(self, names: list[str]) -> None:
        """Give every node its position in `names` (all the graph's nodes, in an order the edges allow): the
        order they then run in."""
        if sorted(names) != sorted(self.nx):
            raise ValueError("set_order needs every node of the graph once")
        data = self.nx.nodes
        for k, name in enumerate(names):
            data[name]["order"] = k
        self._order = itertools.count(len(names))

    def merge(self, names, new) -> None:
        """Replace the nodes `names` by `new`, which does all their work: edges among them vanish, the
        others move to `new`. If `new.name` is one of `names`, that node stays in place with its edges
        (cheap when it has thousands), and only the others' edges move."""
        names = list(names)
        data = self.nx.nodes
        olds = [data[n]["node"] for n in names]
        self._facts.clear()
        order = min(data[n]["order"] for n in names)
        keep = new.name if new.name in names else None
        if keep is None:
            if new.name in self.nx:
                raise ValueError(f"node {new.name} already in the graph")
            self.nx.add_node(new.name, node=new, order=order)
        else:
            data[keep]["node"] = new
            data[keep]["order"] = order
        merged = set(names)
        pred, succ = self.nx.pred, self.nx.succ
        for n in names:
            if n == keep:
                continue
            for u, d in list(pred[n].items()):
                if u not in merged:
                    self._edge(u, new.name, d["buffers"])
            for v, d in list(succ[n].items()):
                if v not in merged:
                    self._edge(new.name, v, d["buffers"])
            self.nx.remove_node(n)  # and with it every edge to or from the kept node
        # bookkeeping, touching only what the absorbed nodes bring (a kept group may be large)
        absorbed = [(n, old) for n, old in zip(names, olds) if n != keep]
        producer, readers = self._producer, self._readers
        for n, old in absorbed:
            for b in old.output_names():
                producer[b] = new.name
            for b in getattr(old, "mutates", ()):  # an in-place write fused into the group
                self._mutators[b].discard(n)
                self._mutators[b].add(new.name)
            for b in old.read_names():
                if b in readers:
                    readers[b].discard(n)
        if keep is None:
            for b in new.read_names():
                readers.setdefault(b, set()).add(new.name)
            return
        inside = {b for _, old in absorbed for b in old.output_names()}
        for b in olds[names.index(keep)].read_names():
            if b in inside and b in readers:  # what the kept node read from an absorbed one is now internal
                readers[b].discard(keep)
        for _, old in absorbed:
            for b in old.read_names():
                if producer.get(b) != new.name:
                    readers.setdefault(b, set()).add(new.name)

    def _edge(self, u: str, v: str, buffers) -> None:
        """Add an edge u -> v for `buffers` (a collection of names), or add them to the existing one."""
        d = self.nx.get_edge_data(u, v)  # half the cost of succ[u].get (Mapping.get raises KeyError on a miss)
        if d is None:
            self.nx.add_edge(u, v, buffers=set(buffers))
        else:
            d["buffers"].update(buffers)

    def _connect(self, node, before=_EMPTY, after=_EMPTY) -> None:
        """Edges from the producers of what `node` reads, and to the nodes reading what it writes; around
        in-place writes, from the nodes in `before` and to those in `after`, else by program order."""
        me = node.name
        for b in node.read_names():
            p = self._producer.get(b)
            if p is not None and p != me:
                self._edge(p, me, (b,))
        for b in node.output_names():
            for v in self._readers.get(b, ()):
                if v != me:
                    self._edge(me, v, (b,))
        # a mutation must come after every earlier reader of the buffer it writes, and before every later
        # one (a scatter into a buffer, then a read of the result: the read depends on the scatter)
        data = self.nx.nodes
        mine = data[me]["order"]
        mutators = self._mutators

        def runs_before(v, b: str, v_writes: bool, me_writes: bool) -> bool | None:
            """Does v run before this node, around the in-place write of b one of them does?"""
            if v in before or v in after:
                return v in before
            if b not in self._input_names and v_writes != me_writes:
                # a buffer the graph makes and then writes in place (a scatter into its initial value) is
                # read for its final value: every reader after every writer. Program order cannot tell
                # for a group, whose order is its first member's
                return v_writes
            return None if data[v]["order"] == mine else data[v]["order"] < mine

        for b in getattr(node, "mutates", ()):
            for v in (*self._readers.get(b, ()), *mutators.get(b, ())):  # two writers keep their order
                first = None if v == me else runs_before(v, b, v in mutators.get(b, ()), True)
                if first is not None:
                    self._edge(*((v, me) if first else (me, v)), (b,))
        # and a reader (re)added around a mutation: after an earlier one, before a later one (a reader of
        # an input's old value that a pass replaces must still run before the write into the input)
        for b in node.read_names():
            for m in mutators.get(b, ()):
                first = None if m == me else runs_before(m, b, True, b in getattr(node, "mutates", ()))
                if first is not None:
                    self._edge(*((m, me) if first else (me, m)), (b,))

    def copy(self) -> "SchedulerGraph":
        g = SchedulerGraph(self.inputs, self.outputs)
        g.nx = self.nx.copy()
        for _, _, d in g.nx.edges(data=True):  # edge sets must not be shared with the original
            d["buffers"] = set(d["buffers"])
        g._producer = dict(self._producer)
        g._readers = {b: set(r) for b, r in self._readers.items()}
        g._mutators = {b: set(r) for b, r in self._mutators.items()}
        g.comms = self.comms
        g.written_inputs = self.written_inputs
        g.released = self.released
        g.choices = self.choices
        g.bounds, g.hints, g.derived = self.bounds, self.hints, self.derived
        g._order = itertools.count(max((d for _, d in self.nx.nodes(data="order")), default=-1) + 1)
        return g

    # -- checking ---------------------------------------------------------------------------------
    def verify(self) -> None:
        """Raise VerificationError naming the first broken node."""
        if not nx.is_directed_acyclic_graph(self.nx):
            cycle = nx.find_cycle(self.nx)
            raise VerificationError(f"cycle {' -> '.join(u for u, _ in cycle)}", cycle[0][0])
        if self.comms:  # first: a dropped collective also leaves the next one's `after` dangling
            self._check_comms()
        buffers = self._buffers()  # from the nodes themselves, never the cache: verify checks what is there
        for name in self.nx:
            node = self.node(name)
            if node.name != name:
                raise VerificationError(f"node stored under {name!r} is named {node.name!r}", name)
            for b in node.output_names():
                if self._producer.get(b) != name:
                    raise VerificationError(f"buffer {b} has two producers", name)
            for b in node.read_names():
                if b not in buffers:
                    raise VerificationError(f"reads {b}, which no node produces and is not an input", name)
                p = self._producer.get(b)
                if p is not None and p != name and not self.nx.has_edge(p, name):
                    raise VerificationError(f"reads {b} from {p} without a dependency edge", name)
            _check_node(node, buffers)
        self._check_index()
        lost = self.written_inputs - self._inputs_written()
        if lost:
            raise VerificationError(f"input {min(lost)} is no longer written in place: the program as lowered "
                                    f"writes it (the caller's tensor would keep its old values)")
        self._check_mutations()
        self._check_in_place()
        for o in self.outputs:
            if isinstance(o, TensorArg):
                if o.buffer not in buffers:
                    raise VerificationError(f"graph output {o.buffer} is not produced")
                key = (o, buffers[o.buffer])  # a pure function of both (sympy sums: most of verify's own time)
                if key not in _VERIFIED:
                    _check_bounds(o.size, o.stride, o.offset, buffers[o.buffer], "graph output", None)
                    _remember(key)

    def _inputs_written(self) -> frozenset:
        return frozenset(b for n in self.nx for b in self.node(n).mutates) & self._input_names

    def _check_mutations(self) -> None:
        """Every node that writes a buffer in place is ordered, by a path, with every other node touching
        that buffer (its producer, its readers, its other writers): no pass may move a read of a
        scattered-into buffer before the scatter, or two writes past each other."""
        reach: dict = {}  # writer -> the nodes ordered with it (a fused kernel writes several buffers in place)
        for b, writers in self._mutators.items():
            for w in sorted(writers):
                if w not in self.nx:
                    raise VerificationError(f"the mutation index names {w}, which is not in the graph")
                if not {b} & set(getattr(self.node(w), "mutates", ())):
                    raise VerificationError(f"the mutation index says {w} writes {b} in place", w)
                if w not in reach:
                    reach[w] = nx.ancestors(self.nx, w) | nx.descendants(self.nx, w) | {w}
                ordered = reach[w]
                touching = set(self._readers.get(b, ())) | set(writers)
                if self._producer.get(b) is not None:
                    touching.add(self._producer[b])
                loose = sorted(touching - ordered)
                if loose:
                    raise VerificationError(f"writes {b} in place but is not ordered with {loose[0]}, which "
                                            f"also touches it", w)

    def _check_in_place(self) -> None:
        """A Pointwise writing in place overwrites a graph input, with the input's own layout (its kernel
        stores into the caller's tensor), and no other member of its kernel reads the input after it
        (a kernel's loads may be issued before its stores: such a read would see the old value)."""
        inputs = self.input_buffers()
        for name in self.nx:
            group = members(self.node(name))
            for k, m in enumerate(group):
                if not getattr(m, "in_place", False):
                    continue
                b = m.output.name
                if inputs.get(b) != m.output:
                    raise VerificationError(f"writes {m.output!r} in place, which is not a graph input "
                                            f"{inputs.get(b)!r}", name)
                at = m.store_index()
                if any(sympy.expand(ix - at) != 0 for ix in m.load_indices(b)):
                    raise VerificationError(f"reads {b} at other points than it overwrites", name)
                late = [o.name for o in group[k + 1:] if b in o.read_names() or b in o.mutates]
                if late:
                    raise VerificationError(f"member {late[0]} reads {b} after {m.name} overwrites it in "
                                            f"the same kernel", name)

    def _check_index(self) -> None:
        """The producer and reader indexes (kept incrementally by every edit) match the nodes."""
        readers: dict = {}
        for name in self.nx:
            node = self.node(name)
            for b in node.read_names():
                readers.setdefault(b, set()).add(name)
            for b in node.output_names():
                if self._producer.get(b) != name:
                    raise VerificationError(f"the producer index says {self._producer.get(b)} writes {b}", name)
        actual = {b: r for b, r in self._readers.items() if r}
        if actual != readers:
            bad = next(b for b in set(actual) | set(readers) if actual.get(b) != readers.get(b))
            raise VerificationError(f"the reader index of {bad} is {sorted(actual.get(bad, ()))}, "
                                    f"but {sorted(readers.get(bad, ()))} read it")

    def _check_comms(self) -> None:
        """Collectives and waits (see lowering/extern.py): none dropped or added, the collectives chained
        in their lowered order (the same on every rank), each wait after its collective's inputs, and the
        collective's result read only through its wait."""
        present = {n for n in self.nx if isinstance(self.node(n), Extern) and self.node(n).comm}
        for name in self.comms:
            if name not in present:
                raise VerificationError("a collective or wait was removed; every rank must run each one", name)
        added = present - set(self.comms)
        if added:
            raise VerificationError("a collective or wait that lowering did not make was added", min(added))
        collectives = [n for n in self.comms if self.node(n).comm == "collective"]
        for prev, name in zip(collectives, collectives[1:]):
            if not self.nx.has_edge(prev, name):
                raise VerificationError(f"collective is no longer ordered after collective {prev}: every rank "
                                        f"must issue the collectives in the same order", name)
        for name in self.comms:
            wait = self.node(name)
            if wait.comm != "wait":
                continue
            result = wait.tensor_args()[0].buffer
            coll = self.node(self._producer[result]) if result in self._producer else None
            if not isinstance(coll, Extern) or coll.comm != "collective":
                raise VerificationError(f"waits for {result}, which no collective produces", name)
            missing = {t.buffer for t in coll.tensor_args()} - set(wait.after)
            if missing:
                raise VerificationError(f"does not keep {', '.join(sorted(missing))}, the inputs of collective "
                                        f"{coll.name}, until the wait", name)
            for r in self.consumers(result):
                node = self.node(r)
                through_after = isinstance(node, Extern) and node.comm and result not in \
                    {t.buffer for t in node.tensor_args()}
                if r != name and not through_after and not nx.has_path(self.nx, name, r):
                    raise VerificationError(f"reads {result}, the result of collective {coll.name}, without "
                                            f"waiting for it ({name})", r)

    # -- printing ---------------------------------------------------------------------------------
    def format(self) -> str:
        lines = [f"inputs: {', '.join(repr(i.buffer) if i.buffer else i.name for i in self.inputs)}"]
        for node in self.nodes():
            lines.append(_describe(node))
        outs = ", ".join(repr(o) for o in self.outputs)
        lines.append(f"outputs: {outs}")
        lines.extend(f"choice {c}" for c in self.choices)
        return "\n".join(lines)

    def __repr__(self):
        return f"<SchedulerGraph {len(self)} nodes, {self.nx.number_of_edges()} edges>"

    def __iter__(self) -> Iterator:
        return iter(self.nodes())


def _describe(node) -> str:
    if isinstance(node, FusedNode):
        red = f" | {', '.join(map(str, node.reduction_ranges))}" if node.reduction_ranges else ""
        head = f"{node.name}: fused [{', '.join(map(str, node.ranges))}{red}], {len(node.nodes)} nodes"
        return head + "".join("\n  " + _describe(m).replace("\n", "\n  ") for m in node.nodes)
    if isinstance(node, MixOrderNode):
        head = (f"{node.name}: mix_order rows={node.rows} cols={node.columns} split_rows={node.split_rows}"
                f"{' columns tiled' if node.tiled else ''} (row side {node.row.name}; "
                f"column reductions {', '.join(c.name for c in node.column_groups)})")
        return head + "".join("\n  " + _describe(g).replace("\n", "\n  ") for g in (node.row, *node.column_groups))
    if isinstance(node, Scatter):
        binds = "".join(f"; {b!r}" for b in node.indirect)
        reads = ", ".join(map(repr, node.reads()))
        return (f"{node.name}: scatter ({node.mode}) [{', '.join(map(str, node.ranges))}]\n    reads  {reads or '-'}"
                f"\n    writes {node.output.name}[{node.index}{binds}] in place\n    body   {node.body!r}")
    if isinstance(node, (Pointwise, Reduction)):
        head = f"{node.name}: {node.kind}"
        ranges = f"[{', '.join(map(str, node.ranges))}]"
        if isinstance(node, Reduction):
            ranges += f" {node.reduction_type} over [{', '.join(map(str, node.reduction_ranges))}]"
        reads = ", ".join(map(repr, node.reads()))
        writes = ", ".join(map(repr, node.writes())) + (" in place" if node.mutates else "")
        return f"{head} {ranges}\n    reads  {reads or '-'}\n    writes {writes}\n    body   {node.body!r}"
    if isinstance(node, Extern):
        after = f"\n    after  {', '.join(node.after)}" if node.after else ""
        return (f"{node.name}: extern {node.op}\n    reads  {', '.join(map(repr, node.tensor_args())) or '-'}"
                f"{after}\n    writes {', '.join(map(repr, node.output_buffers()))}")
    return repr(node)


# Nodes already found well-formed, with the buffers they touched: verify() runs after every pass, and a
# pass changes few nodes, so re-checking the others (sympy bounds and strided forms of every load) was
# most of the pipeline's time (GPT-2-style training graphs: about 90% of it). The checks are a pure
# function of the node and those buffers (both immutable), so an equal pair passes again; only passes are
# remembered, a failure is raised every time. Cleared when it grows past _VERIFIED_MAX entries.
# The same holds one level down: a load (with its buffer and the loop ranges of the node holding it) and a
# graph output (with its buffer) that passed once pass again; a pass that rebuilds a node (inlining,
# merging loops, reordering) keeps most of its loads as they were, and the graph outputs never change.
_VERIFIED: dict = {}
_VERIFIED_MAX = 1 << 16


def _remember(key) -> None:
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    _VERIFIED[key] = True


def _check_node(node, buffers: dict) -> None:
    names = {b for m in members(node) for b in (*m.read_names(), *m.output_names())}
    key = (node, tuple(sorted((b, buffers.get(b)) for b in names)))
    try:
        if key in _VERIFIED:
            return
    except TypeError:  # a node built by hand with a list among its arguments: checked, not remembered
        _check_node_once(node, buffers)
        return
    _check_node_once(node, buffers)
    _remember(key)


def _check_node_once(node, buffers: dict) -> None:
    if isinstance(node, FusedNode):
        problem = group_problem(node)
        if problem:
            raise VerificationError(f"fused node is malformed: {problem}", node.name)
        for m in node.nodes:
            _check_node(m, buffers)
    elif isinstance(node, MixOrderNode):
        outer, red = shape(node.row)
        if not red:
            raise VerificationError("mix-order row side is not a reduction", node.name)
        for g in node.column_groups:
            if shape(g) != (red, outer):
                raise VerificationError(f"column side {g.name} {shape(g)} is not the transpose of "
                                        f"{(outer, red)}", node.name)
        for g in (node.row, *node.column_groups):
            _check_node(g, buffers)
    elif isinstance(node, Scatter):
        var_ranges = dict(node.var_ranges)
        if node.body.dtype != node.output.dtype:
            raise VerificationError(f"writes {node.body.dtype} values into {node.output!r}", node.name)
        for v in node.values():
            for ld in loads(v):
                _check_load(ld, buffers, var_ranges, node.name)
        unknown = node.index.free_symbols - set(var_ranges)
        if any(var_kind(s) in LOOP_KINDS for s in unknown):
            raise VerificationError(f"index {node.index} uses variables outside the loop nest", node.name)
        _check_indirect(node, node.index, var_ranges, node.name)
        ranges = {**var_ranges, **{b.symbol: b.bound for b in node.indirect}}
        vars_ = [v for v in ranges if v in node.index.free_symbols]
        form = as_strided_form(node.index, vars_)
        if form is not None and not _no_iteration(var_ranges):
            _check_bounds([ranges[v] for v in vars_], form[0], form[1], node.output, "scatter", node.name)
    elif isinstance(node, (Pointwise, Reduction)):
        out = node.output.layout
        if sympy.simplify(out.numel - sympy.Mul(*node.ranges)) != 0:
            raise VerificationError(
                f"ranges {list(node.ranges)} do not cover output {node.output!r}", node.name)
        if sorted(node.permutation) != list(range(len(node.ranges))):
            raise VerificationError(f"permutation {node.permutation} is not a permutation", node.name)
        if isinstance(node, Pointwise) and node.body.dtype != out.dtype:
            raise VerificationError(f"body is {node.body.dtype}, output buffer is {out.dtype}", node.name)
        if isinstance(node, Reduction) and node.reduction_type in ("argmax", "argmin") and out.dtype != torch.int64:
            raise VerificationError(f"{node.reduction_type} writes {out.dtype}, not int64", node.name)
        var_ranges = dict(node.var_ranges)
        for ld in loads(node.body):
            key = (ld, buffers.get(ld.buffer), node.var_ranges)
            try:
                if key in _VERIFIED:
                    continue
            except TypeError:  # an index built by hand that does not hash: checked, not remembered
                key = None
            _check_load(ld, buffers, var_ranges, node.name)
            if key is not None:
                _remember(key)
        for v in walk(node.body):
            if isinstance(v, IndexValue):
                _check_indirect(v, v.expr, var_ranges, node.name)
    elif isinstance(node, Extern):
        for t in node.tensor_args():
            if t.buffer not in buffers:
                continue  # reported by the caller
            _check_bounds(t.size, t.stride, t.offset, buffers[t.buffer], "extern argument", node.name)


def _check_load(ld: Load, buffers: dict, var_ranges: dict, node: str) -> None:
    buf = buffers.get(ld.buffer)
    if buf is None:
        return
    if ld.dtype != buf.dtype:
        raise VerificationError(f"loads {ld.buffer} as {ld.dtype}, buffer is {buf.dtype}", node)
    free = ld.index.free_symbols  # sympy walks the expression for it every time: asked once
    unknown = free - set(var_ranges)
    if any(var_kind(s) in LOOP_KINDS for s in unknown):
        raise VerificationError(f"index {ld.index} of {ld.buffer} uses variables outside the loop nest", node)
    _check_indirect(ld, ld.index, var_ranges, node)
    if _no_iteration(var_ranges):
        return
    # an index symbol ranges over [0, bound): with the loop variables, the whole of what the load may reach
    ranges = {**var_ranges, **{b.symbol: b.bound for b in ld.indirect}}
    vars_ = [v for v in ranges if v in free]
    form = as_strided_form(ld.index, vars_)
    if form is not None:
        _check_bounds([ranges[v] for v in vars_], form[0], form[1], buf, f"load of {ld.buffer}", node)


def _no_iteration(var_ranges: dict) -> bool:
    """A loop of no iterations: the node loads and stores nothing, so no index it holds is ever addressed, even
    one that uses no variable of that loop (an empty index_copy's backward scatters a zero-size expanded value,
    which it loads at [0] in a loop over [0, 2])."""
    return any(r == 0 for r in var_ranges.values())


def _check_indirect(holder, expr, var_ranges: dict, node: str) -> None:
    """Each index symbol `expr` uses is bound by `holder` (a Load, IndexValue or Scatter) once, to an
    integer value over the node's loops."""
    syms = [b.symbol for b in holder.indirect]
    if len(set(syms)) != len(syms):
        raise VerificationError(f"{holder!r} binds an index symbol twice", node)
    free = {s for s in expr.free_symbols if isinstance(s, IndirectSymbol)}
    if free - set(syms):
        raise VerificationError(f"index {expr} uses {sorted(map(str, free - set(syms)))}, which "
                                f"{holder!r} does not bind", node)
    for b in holder.indirect:
        if b.value.dtype.is_floating_point or b.value.dtype.is_complex or b.value.dtype == torch.bool:
            raise VerificationError(f"index symbol {b.symbol} is bound to a {b.value.dtype} value", node)
        if b.bound.free_symbols & set(var_ranges) or b.bound.has(IndirectSymbol):
            raise VerificationError(f"the bound {b.bound} of {b.symbol} depends on the loop", node)


def _check_bounds(size, stride, offset, buf: Buffer, what: str, node) -> None:
    """For concrete sizes: every addressed element lies inside the buffer."""
    span = buf.layout.storage_span
    if any(s == 0 for s in size):
        return
    if all(isinstance(x, (int, sympy.Integer)) for x in (*size, *stride, offset, span)):
        # static shapes: the same sums in Python integers (sympy's arithmetic was most of this check)
        lo = int(offset) + sum((int(s) - 1) * int(st) for s, st in zip(size, stride) if st < 0)
        hi = int(offset) + sum((int(s) - 1) * int(st) for s, st in zip(size, stride) if st >= 0)
        if lo < 0 or hi >= int(span):
            raise VerificationError(f"{what} addresses [{lo}, {hi}] outside {buf.name} (size {span})", node)
        return
    lo = offset + sum(((s - 1) * st for s, st in zip(size, stride) if st.is_negative), sympy.S.Zero)
    hi = offset + sum(((s - 1) * st for s, st in zip(size, stride) if not st.is_negative), sympy.S.Zero)
    if all(x.is_number for x in (lo, hi, span)) and (lo < 0 or hi >= span):
        raise VerificationError(f"{what} addresses [{lo}, {hi}] outside {buf.name} (size {span})", node)
