"""mix_order_reduction — a row reduction and transposed column reductions over the same rows become
one node (MixOrderNode), so the shared input is read once.

The pattern is LayerNorm/RMSNorm backward: dx needs per-row sums over the columns, dw/db need
per-column sums over the rows, of the same x and dy. The row side (ranges = rows | reduction = columns)
runs over a block of `split_rows` rows at a time, finishing each row and its epilogue (dx); the column
side (ranges = columns | reduction = rows) adds the block's partial sums into a workspace
[n_splits, columns], and a small reduction over the splits finishes them. Casts and divisions after the
column reduction ride along as its epilogue.

The row side may also be pointwise work whose loops are the column reduction's rows then its columns (a
bias gradient: db is the sum over the rows of the dh that the pointwise side computes): it becomes a
group over (rows | columns) with every member inside the column loop, and dh is summed as it is written
instead of being read back by a reduction with one program per few columns.

Gates (options): columns ≤ max_columns, and a row of the widest [rows, columns] buffer either side reads takes
at most max_row_bytes in registers (`legality.row_bytes`: 4 bytes an element at least, values being float32
there; 32 KB: 8192 columns of float32 or bfloat16). A program holds a block of every column, padded to a power
of two, so what fits is a count of elements, not the input's bytes: on an H200 bfloat16 backwards 8192 wide ran
mixed at 0.8× Inductor's time, 12345 wide (blocks of 16384) at 1.5–1.8×; float32 rows of 4097–8192, unmixed
while the gate counted the input's bytes, read x and dy twice (1.27–1.65× Inductor's time on an H100, where
bfloat16 at the same width ran mixed at 86–88% of copy: docs/passes.md). Wider rows get their column sums from
recompute_columns, or, where the row side is pointwise, the tiled form below; rows ≥ min_rows; column reductions
only of `reduction_types` (comma-separated; partial results must combine by the same reduction); at most
`max_reads` distinct buffers read. Refuses: sides that do not share a buffer; a column side whose per-point work
needs a finished column result or any column epilogue (the finishing kernel computes those, after all rows); a
column side the row side depends on; another path between them (a cycle). Members with permuted loops (memory_order,
reorder_loops) are mixed like any other.

Tiled (`tile_columns`, on by default): the width gates bound what a program holds of a whole row, which only a row
side that reduces its rows (a norm's row sums) needs. A pointwise row side past them (a bias gradient at 9000,
30000, 65536 columns: dh written, db its sum over the rows) is mixed anyway as a node marked `tiled`, whose kernel
takes the columns in blocks as well as the rows (the Triton backend's `mix_order_tiled`: a program per block of rows
and block of columns, each writing its columns' partial sums into the same [n_splits, columns] workspace),
TILED_SPLIT rows a block in the IR. Unmixed, such a pair was a pointwise kernel writing dh and a column sum reading
it back: 4 passes over memory (x, dy read; dh written, read) instead of 3. On an H200 the tiled kernel took
0.79-0.95x the unmixed pair's time in float32 (1024 and 2048 x 65536, 2237 x 30000, 7457 x 9000) and 0.88-0.97x in
bfloat16 (one point 1.07x: 2237 x 30000). Only rows on 16-byte boundaries are tiled (`_unaligned`): at an odd width
every load of a block of columns is one element (12345 wide: 2.2-2.5x the unmixed pair's time); nor a pair reading a
buffer across its memory order (`_across_rows`: a transposed input), nor one whose kernel would leave SMs idle
(`_too_few_programs`), nor a row side that reads a value of each of its rows (`_reads_row_values`: a norm's dx
beside its split row sums; the column form instead). A pair that fits the gates is mixed as before (whole rows, not
tiled) — on a GPU target, where its blocks of at least MIN_SPLIT rows make a program for every SM (2097 rows on 132
SMs; `split_rows=N` or `fill_sms=false` mixes anyway): a mixed program walks its rows one block after another, and
with fewer rows the unmixed kernels, spread over every SM, are faster (bfloat16 at 64 x 8192 on an H200: 4 programs,
3.6-13.7x Inductor's time mixed).

Column form (`column_form`, on by default): a pointwise row side refused for too few programs (whole or tiled), or
refused the tiled form for reading its rows' values, is fused into its column sums in their loop order instead — columns
outer, rows inner — one kernel whose programs take blocks of columns down every row, storing dh as they sum it
(Inductor's form of a bias gradient), where the unmixed pair wrote dh with one kernel and read it back with another;
a pointwise side beside the sums (both reading x, neither the other's result) takes it too. Only where the columns
give every SM a program of 16 and the rows are at most COLUMN_FORM_ROWS (`_column_form_pays`, at the traced sizes
under dynamic shapes); a row side with row sums (a norm's backward) has no such form. Stat: `column_form`.

The default pipeline runs this pass again after split_reductions: a norm's backward over few long rows, refused
here (too wide, too few rows), is split there into partial row sums, their finish and dx — now a pointwise node
of its own beside the column sums, which this pass then gives the column form where its rows are at most
COLUMN_FORM_ROWS (never the tiled one: `_reads_row_values`): x and dy read twice instead of three times. On an H200
(fifty-second session, LayerNorm and RMSNorm backward at 128-256 x 40000-65536, both dtypes, 16 points) the GPU time
of the kernels went to 0.70-0.81x the unmixed kernels' (0.70-1.05x Inductor's, from 0.96-1.38x)."""
from __future__ import annotations

import math
from typing import Annotated

import sympy

from ..ir import Extern, FusedNode, MixOrderNode, Pointwise, Reduction
from ..ir.index import VarKind, loop_vars, product, substitute
from ..ir.loops import Role, canonical_map, members, permute_pointwise, role, shape, transposed
from ..lowering.sizes import at_hint
from ..pipeline.registry import AtLeast, EachOf, register_pass
from .legality import (
    COLUMN_BLOCK,
    MIX_ROW_BYTES,
    can_fuse,
    fixed_layouts,
    fuse_nodes,
    other_path,
    row_bytes,
    split_group,
)

# column reductions whose partial results (one per block of rows) combine by the same reduction
COMBINABLE = ("sum", "prod", "max", "min", "any", "all")


def _reductions(group) -> list:
    return [m for m in members(group) if isinstance(m, Reduction)]


def _sized(layouts: dict, buffer: str, n) -> bool:
    """Whether `buffer` has `n` elements: the pair's points (one of its [rows, columns] buffers), or its rows (a
    value a row)."""
    return buffer in layouts and sympy.expand(layouts[buffer].layout.numel - n) == 0


def _loops(kind: VarKind, ranges) -> list:
    """A member's loop variables of `kind` over `ranges`, size-1 loops left out."""
    return [v for v, n in zip(loop_vars(kind, len(ranges)), ranges) if n != 1]


def _row_side(side):
    """The row side's group: a MixOrderNode's own, or the side itself."""
    return side.row if isinstance(side, MixOrderNode) else side


def _widest(row, col, layouts: dict, points) -> int:
    """Bytes an element of the widest [rows, columns] buffer the mixed kernel would load from memory (what
    the row side computes reaches the column side in registers); 4 where there is none."""
    own = set(row.output_names())
    sizes = [layouts[b].dtype.itemsize for n in (row, col) for b in n.read_names()
             if b not in own and _sized(layouts, b, points)]
    return max(sizes, default=4)


VECTOR_BYTES = 16  # the widest load a GPU thread issues (one 128-bit access)


def _vector(itemsize: int) -> int:
    """Bytes of the widest load a thread of a tiled kernel makes of one buffer: a 128-bit access, or the 8 adjacent
    elements it holds of a 1-byte buffer (a bool mask) where those are fewer bytes."""
    return min(VECTOR_BYTES, 8 * itemsize)


def _unaligned(row, col, layouts: dict, points, ncol, hints: dict) -> str | None:
    """Why a tiled kernel of the pair would load its rows element by element, or None. A block of columns is
    loaded in vectors only where every row it touches starts on a vector's boundary and its mask (the width) is
    whole vectors: the width and each stride of every [rows, columns] buffer, but its smallest (along which a
    row's elements run) and a broadcast dim's 0, must be multiples of `_vector(itemsize)` bytes (16; 8 for a
    1-byte mask, of which a thread holds 8 adjacent elements of a 1024-column block on 4 warps). The unmixed
    pair's pointwise kernel runs over the flat buffer, vectorized whatever the width. On an H200 the tiled bias
    gradient at 5436 x 12345 (odd
    width: scalar loads, sm_90 PTX `ld.global.b32`) took 2.2x (float32) and 2.5x (bfloat16) the unmixed pair's
    time; at 7457 x 9000 (aligned) 0.79x and 0.90x. A run-time size is taken at its traced value (`hints`)."""
    own = set(row.output_names())
    names = [b for n in (row, col) for b in (*n.read_names(), *n.output_names()) if b in layouts]
    for b in dict.fromkeys(names):
        if not _sized(layouts, b, points):
            continue
        lay = layouts[b].layout
        size = layouts[b].dtype.itemsize
        # a broadcast dim (stride 0: an expanded input) starts every row at the same address, aligned or not as
        # the others say; a stride with no traced value sorts last, so that it is checked (and refuses), not
        # taken for the smallest
        traced = {st: at_hint(st, hints) for st in lay.stride}
        strides = [st for n, st in zip(lay.size, lay.stride) if n != 1 and traced[st] != 0]
        strides = sorted(strides, key=lambda st: math.inf if traced[st] is None else traced[st])[1:]
        for what, elements in (("width", ncol), *(("row stride", s) for s in strides)):
            value = at_hint(elements, hints)
            if value is None or value * size % _vector(size):
                side = "written" if b in own else "read"
                symbolic = not sympy.sympify(elements).is_number
                shown = (f"{elements} (traced {value})" if value is not None else f"{elements} (no traced value)") \
                    if symbolic else elements
                return (f"{b} ({side}) has a {what} of {shown} x {size} bytes, not a multiple of {_vector(size)}: "
                        f"its rows in blocks of columns would load element by element (tile_columns)")
    return None


def _across_rows(side, col, layouts: dict, points, hints: dict) -> str | None:
    """Why a tiled kernel of the pair would read a [rows, columns] buffer across its memory order, or None: a
    buffer whose elements along a row are farther apart than along some other loop (a transposed input) is read
    by a block of columns one element a row each, where the unmixed pair's pointwise kernel can take it in its
    own order (memory_order). Checked on every access of the row side's members (loops: rows, then columns)
    and of the column side's (columns outer, rows reduced): the innermost column loop's stride must be the
    smallest (a broadcast 0 aside). A `[:, ::2]` view (stride 2 along a row, thousands along the rows) passes:
    the unmixed kernels read it no better."""
    accesses = []
    for m in members(_row_side(side)):
        accesses += [(m, _loops(VarKind.OUTER, m.ranges), d) for d in m.reads()]
    for m in members(col):
        loops = _loops(VarKind.OUTER, m.ranges)
        if isinstance(m, Reduction):  # columns outer, rows reduced: the columns' innermost loop last
            loops = _loops(VarKind.REDUCTION, m.reduction_ranges) + loops
        accesses += [(m, loops, d) for d in m.reads()]
    for m, loops, d in accesses:
        if not loops or not _sized(layouts, d.buffer, points):
            continue
        index = sympy.expand(d.index)
        coef = {v: at_hint(index.coeff(v), hints) for v in loops}
        inner = coef[loops[-1]]
        if inner is None or any(c is None for c in coef.values()):
            continue  # not affine in the loops (a view's floor or modulo): left to the alignment check
        if inner and any(0 < abs(c) < abs(inner) for v, c in coef.items() if v is not loops[-1]):
            return (f"{m.name} reads {d.buffer} with a stride of {inner} elements along a row, more than along "
                    f"another loop (a transposed layout): a block of columns would load one element a row "
                    f"(tile_columns)")
    return None


MIN_SPLIT = 16  # fewest rows a program of a mixed node sums (the workspace stays small against the data)
TILED_MIN_SPLIT = 64  # ... of a tiled node
TILED_COLUMNS = 1024  # columns a program of a tiled node takes (the Triton rule's block)


def _too_few_programs(nrow, ncol, sms: int, hints: dict, tiled: bool) -> str | None:
    """Why the pair's mixed kernel would leave a GPU's SMs idle, or None (no GPU target: None). Its programs
    are at most one a block of MIN_SPLIT rows (whole rows), or, tiled, one a block of TILED_MIN_SPLIT rows and
    block of TILED_COLUMNS columns; fewer than the SMs, each walks its rows one step after another while the
    unmixed pair's kernels (the rows', and a column sum that split_reductions spreads) use every SM. On an
    H200 the tiled bias gradient at 64 x 30000 (30 programs) took 72-82 µs against Inductor's 7-8; mixed
    whole, 64 rows of 8192 (4 programs) took 3.6-5x Inductor's time in a norm's backward, 11.5-13.7x in a bias
    gradient's."""
    rows = at_hint(nrow, hints)
    if not sms or rows is None:
        return None
    if tiled:
        cols = at_hint(ncol, hints)
        if cols is None:
            return None
        programs = -(-rows // TILED_MIN_SPLIT) * -(-cols // TILED_COLUMNS)
        if programs < sms:
            return (f"{rows} rows x {cols} columns make {programs} tiled programs (blocks of {TILED_MIN_SPLIT} "
                    f"rows x {TILED_COLUMNS} columns) for {sms} SMs (tile_columns)")
    else:
        programs = -(-rows // MIN_SPLIT)
        if programs < sms:
            return f"{rows} rows make {programs} programs (blocks of {MIN_SPLIT} rows) for {sms} SMs"
    return None


COLUMNS = "columns"  # _gate's form for the column form (see `_column_form`)
COLUMN_FORM_ROWS = 256  # most rows the column form walks down a column


def _column_form_pays(nrow, ncol, sms: int, hints: dict) -> bool:
    """Whether the column form (`_column_form`) beats the unmixed pair: its programs, one a block of
    COLUMN_BLOCK columns, are at least the SMs, and each walks at most COLUMN_FORM_ROWS rows (a block of
    whole columns, as the Triton rule runs short column sums). On an H200 the unmixed pair over 64 rows took
    1.05-1.25x Inductor's one kernel of this form (8192-65536 columns); over 1000 rows of 4096 it beat it
    (0.79-0.90x), the pointwise kernel spread over every SM, so the form stops short of such rows."""
    cols, rows = at_hint(ncol, hints), at_hint(nrow, hints)
    return bool(sms) and cols is not None and rows is not None and rows <= COLUMN_FORM_ROWS \
        and -(-cols // COLUMN_BLOCK) >= sms


def _column_form(graph, row, group, col):
    """The pointwise row side (`group`: its members over the column reduction's rows, then its columns)
    with its loops run in the column reduction's order — columns, then rows — fused into `col` as its
    prologue: one kernel whose programs take blocks of columns down every row, storing what the row side
    stores as they sum it (Inductor's form of a bias gradient). For rows too few to mix whole: the unmixed
    pair wrote dh with one kernel and read it back with another. Returns the fused node, put in the graph
    in place of the two, or None (the graph unchanged) when the two cannot fuse so."""
    c_cols, c_rows = shape(col)
    nr, nc = len(c_rows), len(c_cols)
    order = list(range(nr, nr + nc)) + list(range(nr))
    permuted = []
    for m in members(group):
        if len(m.ranges) != nr + nc:
            return None
        permuted.append(permute_pointwise(m, order))
    side = FusedNode(row.name, tuple(permuted), tuple(c_cols) + tuple(c_rows))
    graph.replace_node(row.name, side)
    verdict = can_fuse(graph, side, col)
    if not verdict.ok or verdict.producer is col:  # (the gate refuses a row side reading a column result)
        graph.replace_node(row.name, row)
        return None
    fused = fuse_nodes(col.name if isinstance(col, FusedNode) else f"fused_{col.name}", side, col, *verdict.shape)
    graph.merge([row.name, col.name], fused)
    return fused


def _cycle(graph, row, col) -> str | None:
    if other_path(graph, row.name, col.name) or other_path(graph, col.name, row.name):
        return "another path connects them (cycle)"
    return None


def _row_sums(side) -> bool:
    """Whether the row side reduces its rows (a norm's backward), so that a program must hold whole rows."""
    return any(isinstance(m, Reduction) for m in members(_row_side(side)))


def _reads_row_values(row, layouts: dict, nrow, ncol) -> bool:
    """Whether a pointwise row side reads a value of each of its rows (a [rows] buffer: a norm's statistics and
    row sums, which split_reductions leaves its dx to read once the second mix-order run sees it). Tiled, such a
    pair lost to the unmixed kernels in float32 on an H200 (fifty-second session, LayerNorm and RMSNorm backward at
    129-256 x 40000-65536, GPU time of the kernels: 1.42x Inductor's against 1.26x unmixed; bfloat16 1.17x against
    1.21x), where a bias gradient's tiled dh, which reads no row value, gained (the table above)."""
    if ncol == 1:
        return False
    return any(_sized(layouts, b, nrow) for b in _row_side(row).read_names())


def _gate(row, col, max_columns, min_rows, types, max_reads, rows, cols, max_row_bytes=None,
          layouts=None, hints=None, tile_columns=False, sms=0, fixed_split=False, columns=False):
    """What keeps the two sides from mixing, from the nodes alone (the graph's paths: `_cycle`), and how their
    kernel takes the columns: (problem or None, tiled), tiled being False (whole rows), True (blocks of
    columns) or COLUMNS (the column form, `_column_form`). The width gates (max_columns, max_row_bytes)
    bound what a program holds of a whole row; a row side that does not reduce its rows (a bias gradient's
    pointwise dh) needs no whole row, so with `tile_columns` a wide one is mixed tiled, and with `columns`
    one with too few rows to mix whole gets the column form where its columns give every SM a program. A
    pair mixed whole with a split the pipeline fixed (`fixed_split`: split_rows=N, or fill_sms=false) is
    mixed however few its programs: asked for."""
    if isinstance(col, (Extern, MixOrderNode)) or isinstance(row, Extern):
        return "extern or mix-order", False
    if row.mutates or col.mutates:  # its finishing kernel would reorder the write against the readers
        return "writes a graph input in place", False
    if not rows == () and not cols:
        return "no reduction", False
    tileable = tile_columns and not _row_sums(row)
    wide = False  # a width gate passed over, the columns to be tiled
    ncol, nrow = product(cols), product(rows)
    # a run-time row length is gated at the traced one (`hints`), as the kernel's blocks will be sized near it;
    # a run-time row count leaves the width gates as they are (they gated nothing until the twenty-first
    # session: a bfloat16 LayerNorm 12345 wide with a dynamic batch was mixed, 16384-wide blocks)
    width_cols = int(ncol) if ncol.is_number else at_hint(ncol, hints or {})
    if width_cols is not None and width_cols > max_columns:
        if not tileable:
            return f"{ncol} columns > max_columns={max_columns}", False
        wide = True
    if nrow.is_number and int(nrow) < min_rows:
        return f"{nrow} rows < min_rows={min_rows}", False
    if max_row_bytes is not None and width_cols is not None:
        width = _widest(row, col, layouts, ncol * nrow)
        if row_bytes(width_cols, width) > max_row_bytes:
            if not tileable:
                return (f"rows of {ncol} x {width}-byte elements take {row_bytes(width_cols, width)} bytes "
                        f"> max_row_bytes={max_row_bytes}"), False
            wide = True
    few = None  # why the mixed kernel's programs would be too few for the SMs
    if wide:
        problem = (_unaligned(row, col, layouts or {}, ncol * nrow, ncol, hints or {})
                   or _across_rows(row, col, layouts or {}, ncol * nrow, hints or {}))
        if problem:
            return problem, False
        few = _too_few_programs(nrow, ncol, sms, hints or {}, tiled=True)
        if not few and sms and _reads_row_values(row, layouts or {}, nrow, ncol):
            few = ("the row side reads values of its rows (a norm's dx beside its split row sums): not tiled "
                   "(tile_columns)")
    elif not fixed_split:
        few = _too_few_programs(nrow, ncol, sms, hints or {}, tiled=False)
    if few:
        if columns and not _row_sums(row) and not isinstance(row, MixOrderNode) \
                and _column_form_pays(nrow, ncol, sms, hints or {}):
            return _problem(row, col, types, max_reads, rows, cols), COLUMNS
        return few, False
    return _problem(row, col, types, max_reads, rows, cols), wide


def _problem(row, col, types, max_reads, rows, cols) -> str | None:
    """`_gate`'s checks after the sizes': the reductions, the reads, where the column side meets the row side."""
    if not _reductions(col):
        # pointwise work over one row looks like columns of one row each (a softmax over [1, n] with
        # min_rows=1): nothing to sum over the rows, no partial sums for a finishing kernel to add
        return "the column side reduces nothing"
    bad = [m.reduction_type for m in _reductions(col) if m.reduction_type not in types]
    if bad:
        return f"column reduction {bad[0]} is not one of {sorted(types)}"
    row_outs = set(row.output_names())
    col_outs = set(col.output_names())
    if any(b in col_outs for b in row.read_names()):
        return "the row side reads a column result"
    shared = (set(row.read_names()) & set(col.read_names())) | (row_outs & set(col.read_names()))
    if not shared:
        return "they share no buffer"
    reads = set(row.read_names()) | (set(col.read_names()) - row_outs)
    if len(reads) > max_reads:
        return f"{len(reads)} buffers read > max_reads={max_reads}"
    # column side: the row loop computes only the in-loop members (and partial sums of the reductions);
    # a column result and every epilogue member run in the finishing kernel, after all rows. An in-loop
    # member may read neither, directly or not (a normalization's dx over a transposed view reads
    # rsqrt(mean)/n through two epilogue members: read in the loop, it would be a buffer not yet written)
    outer, red = cols, rows
    finished = {m.output.name for m in members(col) if role(m, outer, red) is not Role.INNER}
    for m in members(col):
        late = finished & set(m.read_names()) if role(m, outer, red) in (Role.INNER, Role.REDUCTION) else ()
        if late:
            return f"{m.name} needs a finished column result inside the row loop ({sorted(late)[0]})"
    # reads of row-side values must meet them at the same (row, column) point
    writers = {m.output.name: m for m in members(row)}
    row_outer = len(shape(row)[0])
    for m in members(col):
        if role(m, outer, red) not in (Role.INNER, Role.REDUCTION):
            continue
        cmap = canonical_map(m, len(outer))
        swap = {s: transposed(s) for s in set(cmap.values()) if isinstance(s, sympy.Symbol)}
        for d in m.reads():
            p = writers.get(d.buffer)
            if p is None:
                continue
            read = sympy.expand(substitute(d.index, cmap).xreplace(swap))
            store = sympy.expand(substitute(p.store_index(), canonical_map(p, row_outer)))
            if sympy.expand(read - store) != 0:
                return f"{m.name} reads {d.buffer} at other points than {p.name} writes it"
    return None


def _row_group(base, rows, cols, col, fixed: set, splits: dict):
    """The row side `base` as the transpose of column reduction `col`, or None. A reduction (or fused
    group) over (rows | columns) is itself; pointwise work over rows + columns is viewed as a group over
    (rows | columns) with every member inside the column loop, where `col` splits its loops so (a bias
    gradient: the sum over rows of the gradient the pointwise side computes)."""
    c_cols, c_rows = shape(col)
    if cols:
        return base if (c_cols, c_rows) == (cols, rows) else None
    if not c_rows or all(r == 1 for r in c_rows):
        # a pointwise side and a "column sum" over one row (a sum over a size-1 dim): nothing to mix, and its
        # nest (1 | columns) is not one a pointwise member fits (its size-1 loop dropped, fuzzing found)
        return None
    target = tuple(c_rows) + tuple(c_cols)
    if tuple(rows) != target:  # flat pointwise work (merge_loops): split to the nest
        if sympy.expand(product(rows) - product(target)) != 0:
            return None  # not the same points: no split can line them up
        key = (base, target)
        if key not in splits:  # the same pair is looked at again after every merge of the pass
            splits[key] = split_group(base, target, fixed)
        base = splits[key]
        if base is None:
            return None
    return FusedNode(base.name, members(base), c_rows, c_cols)


def _auto_split(rows, hints: dict) -> int:
    """Rows per block: 128 (as Inductor's mix-order kernels), fewer when that would leave under 256
    blocks for a GPU's 132 multiprocessors, never under 16 so the workspace stays small against the data.
    Measured on an H200 (bfloat16 LayerNorm backward): (576000, 384) runs the same at 128 and 282 rows per
    block; (32768, 4096) ran 0.276 ms at 128 against 0.315 ms at 16, whose 2048-row workspace is 8% of
    the bytes the kernel moves and takes its finishing kernel 30 µs to sum. A run-time row count is taken
    at the size the graph was traced at (`hints`), so a dynamic graph blocks as the static one of that
    size does (a fixed 64 rows left a GPT block's 4000 rows on 63 programs: 0.051 ms against 0.012)."""
    n = product(rows)
    n = int(n) if n.is_number else at_hint(n, hints)
    return 64 if n is None else min(128, max(MIN_SPLIT, -(-n // 256)))


TILED_SPLIT = 128  # rows per program of a tiled node (see the module's docstring)


@register_pass("mix_order_reduction", provides={"mix_order"})
def mix_order_reduction(graph, ctx, *,
                        max_columns: Annotated[int, "most columns (row length) to mix", AtLeast(0)] = 16384,
                        max_row_bytes: Annotated[int, "most bytes a row of the widest [rows, columns] input "
                                                 "may take in registers (4 an element at least) to mix", AtLeast(0)]
                        = MIX_ROW_BYTES,
                        min_rows: Annotated[int, "fewest rows worth mixing", AtLeast(0)] = 8,
                        reduction_types: Annotated[str, "column reductions allowed, comma-separated",
                                                   EachOf(COMBINABLE)] = "sum",
                        max_reads: Annotated[int, "most distinct buffers the mixed kernel reads", AtLeast(0)] = 10,
                        split_rows: Annotated[int, "rows per block (0: automatic, and tuned on a GPU)", AtLeast(0)] = 0,
                        tile_columns: Annotated[bool, "mix a pointwise row side wider than the width gates "
                                                "allow, its columns taken in blocks"] = True,
                        sms: Annotated[int, "SMs a mixed kernel's programs should fill (0: the target's; none on "
                                       "a CPU target)", AtLeast(0)] = 0,
                        fill_sms: Annotated[bool, "mix whole rows only where blocks of 16 make a program an SM "
                                            "(a GPU target)"] = True,
                        column_form: Annotated[bool, "where a pointwise row side has too few rows to mix whole, "
                                               "fuse it into the column sums in their order (a GPU target)"]
                        = True):
    """Merge a row reduction, or pointwise work over rows x columns, with transposed column reductions of
    the same data into one kernel."""
    gpu_sms = sms or (ctx.target.sms if not ctx.target.interpreted else 0)
    types = {t.strip() for t in reduction_types.split(",") if t.strip()}
    layouts = graph.buffers()  # dtypes and sizes: the same buffers whatever the pass merges
    fixed = fixed_layouts(graph)
    splits: dict = {}
    # the pass scans every pair again after each merge; a pair's row group and gate follow from the two
    # nodes alone (the options, `fixed` and `layouts` stay as they are), so each is worked out once per pair
    # of node objects (held here, so that their ids stay theirs); only the cycle check reads the graph
    groups: dict = {}
    gates: dict = {}
    changed = True
    while changed:
        changed = False
        nodes = [n for n in graph.nodes() if not isinstance(n, Extern)]
        for row in nodes:
            base = row.row if isinstance(row, MixOrderNode) else row
            rows, cols = shape(base)
            if not isinstance(base, (FusedNode, Reduction, Pointwise)) or (not cols and isinstance(row, MixOrderNode)):
                continue
            for col in nodes:
                if col is row or col.name not in graph or row.name not in graph:
                    continue
                key = (id(base), id(col))
                if key not in groups:
                    groups[key] = (base, col, _row_group(base, rows, cols, col, fixed, splits))
                group = groups[key][2]
                if group is None:
                    continue
                side = group if not isinstance(row, MixOrderNode) else row
                key = (id(side), id(col))
                if key not in gates:
                    g_rows, g_cols = shape(group)
                    gates[key] = (side, col, *_gate(side, col, max_columns, min_rows, types, max_reads, g_rows,
                                                    g_cols, max_row_bytes, layouts, graph.hints, tile_columns,
                                                    gpu_sms, fixed_split=bool(split_rows) or not fill_sms,
                                                    columns=column_form))
                problem = gates[key][2] or _cycle(graph, side, col)
                tiled = gates[key][3]
                if problem:
                    ctx.refuse("mix-order gate", row, col, problem) if _known(ctx, row, col) else None
                    continue
                if not ctx.decide("mix", row, col):
                    continue
                if tiled == COLUMNS:
                    if _column_form(graph, row, group, col) is None:
                        # kept, so the pair is not decided and tried again at every rescan
                        gates[key] = (side, col, "too few rows to mix, and the column form does not fuse", False)
                        if _known(ctx, row, col):
                            ctx.refuse("mix-order gate", row, col, gates[key][2])
                        continue
                    ctx.count("column_form")
                    changed = True
                    break
                if isinstance(row, MixOrderNode):
                    new = MixOrderNode(row.name, row.row, row.column_groups + (col,), row.split_rows, row.tune_split,
                                       row.tiled or tiled)
                else:
                    split = split_rows or (TILED_SPLIT if tiled else _auto_split(shape(group)[0], graph.hints))
                    new = MixOrderNode(f"mix_{row.name}", group, (col,), split, tune_split=not split_rows,
                                       tiled=tiled)
                graph.merge([row.name, col.name], new)  # their edges move to it (none recomputed by position)
                ctx.count("codegen_mix_order_reduction")
                changed = True
                break
            if changed:
                break
    return graph


def _known(ctx, a, b) -> bool:
    """Record each refused pair once per pass run."""
    seen = ctx.state.setdefault("refused", set())
    key = (a.name, b.name)
    if key in seen:
        return False
    seen.add(key)
    return True
