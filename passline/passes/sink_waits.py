"""sink_waits — start communication early, wait for it late.

A functional collective (`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, ...) is an
extern that starts the communication and returns; its `wait_tensor` blocks until the result is there.
dynamo's graphs wait right after each collective, so nothing overlaps the transfer. This pass moves each
wait to just before the first node that reads its result (to the end of the graph when only the caller
reads it), so the nodes in between run while the data moves.

Only waits move, and only later: the collectives keep their places and their order (the same on every
rank), every read of a result stays after its wait (it reads the wait's output), and a collective's
inputs stay allocated and unwritten until its wait (the wait runs after them, `Extern.after`): the
verifier checks all three. The price is memory: those inputs live longer. Moves nothing when nothing
but other waits would run in between. Stat: `waits_sunk`; each move is a decision `passline.bisect` can
stop at.
"""
from __future__ import annotations

from ..pipeline.registry import register_pass


@register_pass("sink_waits", provides={"waits_sunk"}, idempotent=True)
def sink_waits(graph, ctx):
    """Move each collective's wait down to the first node that reads its result (overlap)."""
    waits = [n for n in graph.comms if graph.node(n).comm == "wait"]
    if not waits:
        return graph
    names = graph.names()
    position = {n: k for k, n in enumerate(names)}  # as it runs now; each wait moves on its own
    for name in waits:
        readers = [r for b in graph.node(name).output_names() for r in graph.consumers(b)]
        first = min(readers, key=position.__getitem__) if readers else None
        between = names[position[name] + 1:position[first] if first is not None else len(names)]
        if all(getattr(graph.node(n), "comm", None) == "wait" for n in between):
            continue  # nothing but waits would run in between: no overlap to gain
        if ctx.decide("sink", name, *([first] if first else [])):
            graph.move(name, before=first)
            ctx.count("waits_sunk")
    return graph
