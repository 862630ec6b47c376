"""`passline.explain(report, a, b)`: why two scheduler nodes were, or were not, fused.

`a` and `b` are node names as lowering made them (`buf3`), or FX node names (`mul_2`), whose nodes
are then looked up by provenance.
"""
from __future__ import annotations

from .passes.legality import REASONS


def _leaf_names(report, name: str) -> set:
    leaves = report.graph.leaf_nodes()
    if any(n.name == name for n in leaves):
        return {name}
    by_origin = {n.name for n in leaves if name in n.origins}
    refused = {m for r in report.metrics.refusals for m in (*r.a_members, *r.b_members)}
    if by_origin:
        return by_origin
    if name in refused:
        return {name}
    raise KeyError(f"no node or FX node named {name!r} in {report.name}")


def _home(report, leaf: str) -> str:
    for n in report.graph.nodes():
        names = n.member_names() if hasattr(n, "member_names") else (n.name,)
        if leaf in names:
            return n.name
    return "(removed)"


def explain(report, a: str, b: str) -> str:
    """A sentence saying whether nodes a and b ended in one kernel, and if not, the recorded reason."""
    la, lb = _leaf_names(report, a), _leaf_names(report, b)
    homes_a, homes_b = {_home(report, x) for x in la}, {_home(report, x) for x in lb}
    if homes_a & homes_b:
        return f"{a} and {b} run in one kernel: {', '.join(sorted(homes_a & homes_b))}"
    for r in reversed(report.metrics.refusals):
        if (la & set(r.a_members) and lb & set(r.b_members)) or (lb & set(r.a_members) and la & set(r.b_members)):
            why = REASONS.get(r.reason, "")
            return (f"{a} and {b} were not fused: {r.pass_name} refused {r.a} + {r.b} for {r.reason!r}"
                    f" — {why}" + (f" ({r.detail})" if r.detail else ""))
    return (f"{a} and {b} were not fused and never considered as a pair: they share no buffer, or one "
            f"of them was outside every fusing pass's candidates (extern calls are never fused)")
