"""Dumps of the graph around each pass that changed it: text, DOT (changed nodes highlighted) and a
structural diff with FX provenance. Enabled by `PASSLINE_DUMP_DIR=dir` or `backend(dump_dir=...)`.

Layout: `<dir>/<graph>/<NNN>-<pass>.txt|.dot|.diff`, plus `000-input.txt|.dot` for the graph as lowered.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..ir import Extern, MixOrderNode, Reduction, loads, members


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _label(node) -> str:
    if isinstance(node, Extern):
        return f"{node.name}\\nextern {node.op}"
    if isinstance(node, MixOrderNode):  # no ranges of its own: rows x columns
        return f"{node.name}\\nmix_order [{node.rows} | {node.columns}]"
    ranges = ", ".join(map(str, node.ranges))
    extra = ""
    if isinstance(node, Reduction):
        extra = f"\\n{node.reduction_type} over [{', '.join(map(str, node.reduction_ranges))}]"
    kind = getattr(node, "kind", type(node).__name__.lower())
    return f"{node.name}\\n{kind} [{ranges}]{extra}"


def _indirect_reads(node) -> set:
    """Buffers `node` (or a member of it) reads at indirect positions."""
    out = set()
    for m in members(node):
        for ld in loads(m.body) if hasattr(m, "body") else ():
            if ld.indirect:
                out.add(ld.buffer)
    return out


def to_dot(graph, highlight=(), colors: dict | None = None, title: str = "") -> str:
    """DOT text of the graph; `highlight` nodes are filled orange, `colors` maps node -> fill colour."""
    lines = ["digraph passline {", "  rankdir=TB;", '  node [shape=box, fontname="monospace", fontsize=10];']
    if title:
        lines.append(f'  label="{title}"; labelloc=t;')
    for i in graph.inputs:
        if i.buffer is not None:
            lines.append(f'  "{i.name}" [shape=ellipse, label="{i.name}"];')
    for node in graph.nodes():
        style = ""
        if node.name in highlight:
            style = ', style=filled, fillcolor="orange"'
        elif colors and node.name in colors:
            style = f', style=filled, fillcolor="{colors[node.name]}"'
        lines.append(f'  "{node.name}" [label="{_label(node)}"{style}];')
        indirect = _indirect_reads(node)
        for b in node.read_names():
            src = graph.producer(b) or b
            # a read at positions an index tensor holds (gather, embedding): dashed, labelled
            how = f'label="{b} [indirect]", style=dashed' if b in indirect else f'label="{b}"'
            lines.append(f'  "{src}" -> "{node.name}" [{how}, fontsize=8];')
    for k, o in enumerate(graph.outputs):
        buf = getattr(o, "buffer", None)
        if buf is not None:
            lines.append(f'  "out{k}" [shape=ellipse, label="output {k}"];')
            lines.append(f'  "{graph.producer(buf) or buf}" -> "out{k}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def diff(before, after) -> str:
    """What a pass did: nodes removed, added (with the removed nodes they absorbed, by FX origin), and
    changed in place (e.g. reordered loops)."""
    old = {n.name: n for n in before.nodes()}
    new = {n.name: n for n in after.nodes()}
    lines = []
    removed = [n for n in old if n not in new]
    added = [n for n in new if n not in old]
    for name in added:
        origins = set(new[name].origins)
        absorbed = [r for r in removed if set(old[r].origins) & origins]
        what = f"fused from {', '.join(absorbed)}" if absorbed else "new"
        lines.append(f"+ {name}: {what} (FX: {', '.join(sorted(origins)) or '-'})")
    absorbed_all = {r for name in added for r in removed if set(old[r].origins) & set(new[name].origins)}
    for name in removed:
        if name not in absorbed_all:
            lines.append(f"- {name}: removed (FX: {', '.join(old[name].origins) or '-'})")
    for name in new:
        if name in old and new[name] != old[name]:
            o, n = old[name], new[name]
            if getattr(o, "permutation", None) != getattr(n, "permutation", None):
                lines.append(f"~ {name}: loops reordered {o.permutation} -> {n.permutation}")
            else:
                lines.append(f"~ {name}: changed")
    return "\n".join(lines) + "\n" if lines else "(no structural change)\n"


def dump_graph(directory, graph_name: str, index: int, label: str, graph, highlight=()) -> Path:
    out = Path(directory) / _safe(graph_name)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{index:03d}-{_safe(label)}"
    stem.with_suffix(".txt").write_text(graph.format() + "\n")
    stem.with_suffix(".dot").write_text(to_dot(graph, highlight, title=f"{graph_name} after {label}"))
    return stem


def dump_change(directory, graph_name: str, record, before, after) -> Path:
    old = {n.name: n for n in before.nodes()}
    changed = [n.name for n in after.nodes() if old.get(n.name) != n]
    stem = dump_graph(directory, graph_name, record.index, record.name, after, changed)
    stem.with_suffix(".diff").write_text(f"# {record.call}\n" + diff(before, after))
    return stem
