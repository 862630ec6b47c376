"""Per-compile figures, in the spirit of Inductor's metrics.py, kept on each compile's report.

Counters (`metrics.counters`): generated_kernel_count, num_bytes_accessed, ir_nodes_pre_fusion,
ir_nodes_post_fusion, num_loop_reordering, codegen_mix_order_reduction, fusions, ... — whatever passes
count through `ctx.count(...)`. `metrics.fusion_failures` counts refusals by reason.

Opt-in CSV tables, one row per event: set `PASSLINE_METRIC_TABLES=graph_stats,fusion_failures,
kernel_metadata,pass_stats` (or `passline.settings(metric_tables=...)`, or pass `metric_tables=` to
`passline.backend`); files go to `PASSLINE_METRIC_DIR` (default `passline_metrics/`), one `<table>.csv`
each, appended.
"""
from __future__ import annotations

import collections
import csv
import os
from pathlib import Path

import attrs
import sympy

from ..config import current_settings, parse_metric_tables


def enabled_tables(explicit=None) -> frozenset:
    """The tables to write: `explicit` (names, or comma-separated text), else the settings' tables."""
    return current_settings().metric_tables if explicit is None else parse_metric_tables(explicit)


@attrs.define
class Metrics:
    counters: collections.Counter = attrs.Factory(collections.Counter)
    fusion_failures: collections.Counter = attrs.Factory(collections.Counter)
    refusals: list = attrs.Factory(list)  # manager.Refusal records, for passline.explain
    tables: dict = attrs.Factory(dict)  # table name -> list of row dicts
    enabled: frozenset = frozenset()

    def row(self, table: str, **row) -> None:
        if table in self.enabled:
            self.tables.setdefault(table, []).append(row)

    def write_csv(self, directory: str | os.PathLike | None = None) -> list[Path]:
        """Append each table's rows to `<directory>/<table>.csv`; return the files written."""
        out = Path(directory or current_settings().metric_dir)
        written = []
        for table, rows in self.tables.items():
            if not rows:
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{table}.csv"
            fields = list(dict.fromkeys(k for r in rows for k in r))
            new = not path.exists()
            with path.open("a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                if new:
                    w.writeheader()
                w.writerows(rows)
            written.append(path)
        return written


def _int(e):
    e = sympy.sympify(e)
    return int(e) if e.is_number else e


def kernel_count(node) -> int:
    """Kernels the backend launches for one scheduler node: none for an extern call, two for a
    mix-order reduction (the main kernel and the small sum over its partials), else one."""
    from ..ir import Extern, MixOrderNode

    return 0 if isinstance(node, Extern) else 2 if isinstance(node, MixOrderNode) else 1


def node_bytes(graph, node) -> tuple:
    """(bytes read, bytes written) by one kernel node. Each buffer counts the distinct elements its
    index can reach (capped at the buffer's size), once per node; a fused node writes only what is
    read outside it or returned; a mix-order node adds its workspace, written and read back. Remembered
    by the graph until its next edit: the runner and the report both ask for every kernel's."""
    return graph.cached(("node_bytes", node), lambda: _node_bytes(graph, node))


def known_node_bytes(graph, node, rw: tuple) -> None:
    """Tell `graph` `node`'s (bytes read, bytes written) as a compile of this very graph counted them before (a
    graph-cache hit's kept sources), so that `node_bytes` does not count them again."""
    graph.cached(("node_bytes", node), lambda: rw)


def _node_bytes(graph, node) -> tuple:
    from ..ir import FusedNode, MixOrderNode

    buffers = graph.buffers()
    keep = graph.output_names() | graph.mutated_names()

    def elements(dep):
        ranges = dict(dep.var_ranges)
        used = [ranges[v] for v in dep.index.free_symbols if v in ranges]
        return sympy.Mul(*used) if used else sympy.S.One

    def total(deps):
        per_buffer: dict = {}
        for d in deps:
            n = elements(d)
            per_buffer[d.buffer] = n if d.buffer not in per_buffer else sympy.Max(per_buffer[d.buffer], n)
        out = sympy.S.Zero
        for name, n in per_buffer.items():
            buf = buffers[name]
            out += sympy.Min(n, buf.layout.storage_span) * buf.dtype.itemsize
        return out

    grouped = isinstance(node, (FusedNode, MixOrderNode))
    writes = [d for d in node.writes() if not grouped or d.buffer in keep or graph.readers(d.buffer)]
    read, written = total(node.reads()), total(writes)
    if isinstance(node, MixOrderNode):
        read, written = read + node.workspace_bytes(), written + node.workspace_bytes()
    return _int(read), _int(written)


def bytes_accessed(graph) -> int:
    """Bytes the generated kernels read and write (externs excluded), computed from the IR."""
    from ..ir import Extern

    total = 0
    for node in graph.nodes():
        if not isinstance(node, Extern):
            r, w = node_bytes(graph, node)
            total += r + w
    return _int(total)
