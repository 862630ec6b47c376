"""peak_memory — run the nodes in an order that keeps fewer bytes alive at once.

The edges leave many orders open and the program order (the aten graph's) is only one of them. A backward
graph is where the choice shows: at its start every saved activation is alive, and a node that allocates a
large result as soon as it can keeps the peak above what the same node would add once the activations behind
it were freed. GPT-2-style's backward computed its tied LM head's weight gradient (vocabulary × width) right
after the logits' gradient, on top of every activation, and peaked 6 MB above Inductor's, which runs that
matmul last.

The pass estimates an order's peak: a node's stored outputs are allocated as it starts (a mix-order node's
partial sums too, for its run only), and a buffer is freed after the last node that reads or writes it. An
output the size and dtype of a buffer dying at its node allocates nothing (codegen writes such a result over
the dying input where the kernel reads it at the same offsets: the logits' gradient over the logits, a GELU
backward's dh over dy; an extern call and a kernel with a scatter or an in-place member always allocate, and a
mix-order node's column side's reads are never taken: `ir.may_store_over_reads`, `ir.read_after_store`). Graph
outputs live on. Graph inputs live on unless the caller gives them up (`SchedulerGraph.released`: for a
backward, the saved activations and incoming gradients that aot_autograd hands over, which the call frees at
their last use). It then builds an order greedily — least peak memory
first, as Inductor's `reorder_for_peak_memory`: among the nodes whose inputs are ready, one that fits under
the peak so far and leaves the fewest bytes alive, else the one that adds the fewest — and keeps it where
its estimated peak is lower than the program order's. Sizes with symbols are taken at the traced sizes.

The estimate is not the allocator's (extern calls' own workspaces, views, block rounding), so it can be
wrong; a wrong estimate costs memory, never correctness: the new order keeps every edge and the places
below, and any such order computes the same values. Random draws keep their order among themselves (two
draws swapped would each get the other's numbers); another node with side effects, or writing a buffer in
place, keeps its place among all the others (an assertion, a running statistic's update: everything before
it in program order stays before it). Graphs with collectives keep their order (`sink_waits` placed their
waits for overlap). Stat: `peak_bytes_saved` (estimated); the reorder is one decision `passline.bisect` can
stop at.
"""
from __future__ import annotations

import heapq

from ..ir import may_store_over_reads, read_after_store
from ..lowering.sizes import at_hint
from ..pipeline.registry import register_pass
from .dce import draws_random, has_side_effects

SCAN = 32  # ready nodes passed over, least-leaving first, for one that fits under the peak so far


class _Memory:
    """The bytes an order keeps alive: what each node allocates and frees, given what has run."""

    def __init__(self, graph):
        self.graph = graph
        buffers = graph.buffers()
        self.nbytes = {b: _bytes(buf.nbytes, graph.hints) for b, buf in buffers.items()}
        self.dtype = {b: buf.dtype for b, buf in buffers.items()}
        inputs = set(graph.input_buffers())
        kept = graph.output_names() | (inputs - set(graph.released))
        users: dict[str, set] = {}  # buffer -> nodes reading or writing it in place
        self.outputs: dict[str, list] = {}  # node -> the buffers it allocates
        self.uses: dict[str, list] = {}  # node -> the buffers whose lifetime it extends
        self.workspace: dict[str, int] = {}
        self.overwrites: dict[str, bool] = {}
        self.late: dict[str, frozenset] = {}
        for name, node in graph.items():
            used = [*node.read_names(), *getattr(node, "mutates", ())]
            self.uses[name] = list(dict.fromkeys(b for b in used if b in self.nbytes))
            for b in self.uses[name]:
                users.setdefault(b, set()).add(name)
            # whether codegen may write an output over a dying input (the structural half of its rule,
            # `kernel.overwritable`, which also checks each load's index: an estimate, not a promise)
            self.overwrites[name] = may_store_over_reads(node)
            self.late[name] = read_after_store(node)  # never a donor (a mix-order node's column side reads it)
            ws = getattr(node, "workspace_bytes", None)
            self.workspace[name] = _bytes(ws(), graph.hints) if ws is not None else 0
        for name, node in graph.items():
            # stored: read by another node or returned (a fused member's value read only inside its kernel
            # never reaches memory)
            self.outputs[name] = [b for b in node.output_names() if b not in inputs
                                  and (b in kept or users.get(b, set()) - {name})]
        self.holders = users  # buffer -> the nodes using it
        self.users = {b: len(u) for b, u in users.items()}
        allocated = {b for outs in self.outputs.values() for b in outs}
        self.freeable = (allocated | set(graph.released)) - kept
        self.start = sum(self.nbytes[b] for b in inputs)

    def step(self, name: str, left: dict) -> tuple[int, int]:
        """(bytes `name` allocates, bytes freed after it), with `left` the number of nodes still to use each
        buffer before `name` runs."""
        dying = [b for b in self.uses[name] if left.get(b) == 1 and b in self.freeable]
        freed = sum(self.nbytes[b] for b in dying)
        alloc = 0
        donors = [b for b in dying if b not in self.late[name]] if self.overwrites[name] else []
        for b in self.outputs[name]:
            donor = next((d for d in donors if self.nbytes[d] == self.nbytes[b]
                          and self.dtype[d] == self.dtype[b]), None)
            if donor is not None:  # written over the dying input: no new storage, and none freed for it
                donors.remove(donor)
                freed -= self.nbytes[donor]
            else:
                alloc += self.nbytes[b]
        return alloc, freed

    def peak(self, order: list) -> int:
        left, live = dict(self.users), self.start
        top = live
        for name in order:
            alloc, freed = self.step(name, left)
            top = max(top, live + alloc + self.workspace[name])
            live += alloc - freed
            for b in self.uses[name]:
                left[b] -= 1
        return top

    def _waits(self, order: list) -> tuple[dict, dict]:
        """(node -> how many nodes it waits for, node -> the nodes waiting for it beyond the edges). Random
        draws keep their order among themselves (no edge says so: two draws swapped would each get the other's
        numbers); another node with side effects (an assertion) or writing a buffer in place keeps its place
        among all the others: everything before it in program order runs before it, everything after it after
        it (a view an extern returned is not a reader of its base's name, so no edge keeps its readers before a
        write of the base)."""
        graph = self.graph
        waiting = {n: len(graph.predecessors(n)) for n in order}
        unblocks: dict[str, list] = {n: [] for n in order}
        barrier, since, draw = None, [], None
        for n in order:
            if barrier is not None:
                unblocks[barrier].append(n)
                waiting[n] += 1
            node = graph.node(n)
            if draws_random(node):
                if draw is not None:
                    unblocks[draw].append(n)
                    waiting[n] += 1
                draw = n
                since.append(n)
            elif has_side_effects(node) or getattr(node, "mutates", ()):
                for m in since:
                    unblocks[m].append(n)
                waiting[n] += len(since)
                barrier, since = n, []
            else:
                since.append(n)
        return waiting, unblocks

    def least_peak_first(self, order: list) -> list:
        """A greedy order (LPMF): among the ready nodes, one that fits under the peak so far and leaves the
        fewest bytes alive, else the one that adds the fewest; ties keep program order. Each ready node's
        figures are kept in two heaps and recomputed only when a buffer it uses comes down to its last user,
        and at most SCAN nodes that do not fit are passed over for one that does (a graph thousands of nodes
        wide stays linear, picking the least-adding node there)."""
        graph, position = self.graph, {n: k for k, n in enumerate(order)}
        waiting, unblocks = self._waits(order)
        left, live, done = dict(self.users), self.start, set()
        top, out = live, []
        figures: dict[str, tuple] = {}  # ready node -> (bytes it adds and leaves, bytes it needs while it runs)
        by_net: list = []
        by_need: list = []

        def push(n):
            alloc, freed = self.step(n, left)
            figures[n] = fig = (alloc - freed, alloc + self.workspace[n])
            heapq.heappush(by_net, (fig[0], position[n], fig[1], n))
            heapq.heappush(by_need, (fig[1], position[n], fig[0], n))

        def current(heap, swapped: bool = False) -> tuple | None:  # its least entry still a ready node's
            while heap:
                a, _, b, n = heap[0]
                if n not in done and figures.get(n) == ((b, a) if swapped else (a, b)):
                    return heap[0]
                heapq.heappop(heap)
            return None

        for n in order:
            if waiting[n] == 0:
                push(n)
        while figures:
            room, passed, pick = top - live, [], None
            while len(passed) < SCAN and (entry := current(by_net)) is not None:
                if entry[2] <= room:
                    pick = entry[3]
                    break
                passed.append(heapq.heappop(by_net))
            for entry in passed:
                heapq.heappush(by_net, entry)
            if pick is None:
                pick = current(by_need, swapped=True)[3]
            net, need = figures.pop(pick)
            done.add(pick)
            out.append(pick)
            top = max(top, live + need)
            live += net
            for b in self.uses[pick]:
                left[b] -= 1
                if left[b] == 1:  # its last user (if ready) now frees it: its figures change
                    last = next((h for h in self.holders[b] if h not in done), None)
                    if last in figures:
                        push(last)
            for s in [*graph.successors(pick), *unblocks[pick]]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    push(s)
        return out


def _bytes(expr, hints: dict) -> int:
    n = expr if isinstance(expr, int) else at_hint(expr, hints)
    return int(n) if n is not None else 0  # (a size with no hint: not counted)


@register_pass("peak_memory", provides={"peak_memory_ordered"})
def peak_memory(graph, ctx):
    """Order the nodes so that the estimated peak of live bytes is least (greedy, least peak first)."""
    if graph.comms or len(graph) < 3:
        return graph
    memory = _Memory(graph)
    order = graph.names()
    before = memory.peak(order)
    greedy = memory.least_peak_first(order)
    after = memory.peak(greedy)
    if after < before and greedy != order and ctx.decide("peak_memory", *greedy[:1]):
        graph.set_order(greedy)
        ctx.count("peak_bytes_saved", before - after)
    return graph
