"""Kernel configurations: the candidates a kernel can run with, and the rule that picks one untimed.

A kernel node has one or more *variants* (pointwise; persistent or looped reduction; the two mix-order
forms), each a source generated once. A `Config` is one way to launch a variant: its block sizes, warps,
pipeline stages and, for a mix-order kernel, rows per program. By default (`autotune=False`) `rule` picks
a configuration from the sizes, the dtype-free shape of the work and the device, with no timing, as
Inductor's heuristics do; `passline.backend(autotune=True)` times the `candidates` instead.
"""
from __future__ import annotations

import math

import attrs

from ...passes.mix_order_reduction import TILED_COLUMNS
from ..variants import MIX_FORMS
from ..variants import KernelVariant as Variant

GPU_PERSISTENT_MAX = 16384  # elements of a reduced row kept in registers
ROW_PER_THREAD = 32  # elements of a persistent block per thread (see rule)
WARP_ROW = 256  # elements a warp's 32 threads cover with 16-byte vectors: 128 float32, 256 bfloat16 (see rule)
FEW_PER_THREAD = 8  # ... per thread where every program has an SM to itself (see rule)
LOOP_PER_THREAD = 16  # elements of a looped row's chunk per thread (see rule)
MAX_WARPS = 32  # 1024 threads: the most one program may have
INTERP_PERSISTENT_MAX = 1 << 16
INTERP_BLOCK = 1 << 17  # interpreter cost grows with programs x ops: few, large programs
COLUMN_THREAD_BYTES = 64  # bytes a thread loads a step of a column sum's row loop (see rule)
COLUMN_MOST_PER_THREAD = 32  # elements a thread of a column sum a step, at most (bfloat16: 64 bytes)
MIX_STAGES = (3, 4)  # pipelined row loops timed on a GPU (1: not pipelined, the baseline)
MIX_BAND_ROWS_PER_SM = 64  # a mix-order kernel with at least this many rows an SM may be timed (uncertain)
MIX_POINTWISE_BAND_ROWS_PER_SM = 16  # ... with a pointwise row side (a bias gradient: a model's 8192 tokens)
MIX_BAND_THREAD_ELEMENTS = 32  # elements a thread of the pointwise band's roomier blocks
SHORT_COLUMN = 256  # a column sum over at most this many rows (rounded up) is timed (uncertain) ...
FINISH_WIDE_COLUMNS = 2048  # a mix-order finishing kernel with this many columns takes the column sums' rule
MEDIUM_COLUMN = 2048  # ... and up to this many, held whole in blocks of 8 to 32 columns
BAND_MIN_BYTES = 1 << 20  # a kernel moving fewer bytes is a launch's worth of work: the bands time nothing there
FEW_ROWS_PERSISTENT = 1 << 16  # fewer rows than SMs: a row up to this long is also timed held whole (uncertain)
WIDE_PERSISTENT_MAX = 1 << 15  # a row per SM or more: ... up to this long (uncertain)
READ_ROWS_BYTES = 3  # a row kernel moving under this a row element reads a 2-byte row and writes no row (uncertain)
READ_ROWS_PER_SM = 16  # ... and is timed from this many rows an SM
READ_ROW_PER_THREAD = 64  # elements a thread of such a kernel's persistent row wider than 1024 (see rule)
WINDOW_MIN_WIDTH = 8193  # a persistent row this wide or wider may run through its aligned window (windowed) ...
WINDOW_MIN_GROUPS = 4  # ... where a thread holds at least this many of the window's groups
WINDOW_GROUPS = 16  # groups a thread of a windowed row by rule: 256 bytes of its narrowest dtype (see rule) ...
WINDOW_MIN_WARPS = 4  # ... on at least this many warps
WINDOW_PERSISTENT_MAX = 1 << 16  # ... held whole through its window up to this long (a timed candidate: uncertain)
WINDOW_BAND_MIN_WIDTH = 2049  # rows this wide to 8192 read or written off 16-byte boundaries are timed (uncertain)
CLASS_MIN_ROW_BYTES = 1024  # rows in classes (a mix-order or persistent kernel's), rows this long or longer (windowed)
# a column sum's rows in classes, timed (column_class_band): (XBLOCK lanes, RBLOCK rows, warps), 16 elements a thread
COLUMN_CLASS_BLOCKS = ((64, 64, 8), (32, 64, 4))
CLASS_WARP_SLOTS = 64  # warps an SM holds at once (sm_80 and later): the programs rows in classes fill (class_band)
MIX_ONE_ROW_STAGES = 3  # the row loop's pipeline depth of the mix band's one-row form (see uncertain)
MIX_TILE_COLUMNS = TILED_COLUMNS  # columns a block of mix_order_tiled by rule (1024; see rule)
MIX_TILE_WARPS = 4  # ... its warps
MIX_TILE_STAGES = 3  # ... its row loop's pipeline depth


@attrs.frozen
class Config:
    """One launch configuration of a kernel variant."""

    variant: Variant
    xblock: int
    rblock: int | None = None  # None: a pointwise kernel
    warps: int = 4
    stages: int = 1  # mix-order only: the row loop's pipeline depth
    # mix-order: rows per program (a run-time argument); persistent through the window: rows per program, taken in
    # classes (`classes`)
    split: int | None = None
    window: bool = False  # persistent only: rows through the kernel's aligned window, where it has one (`windowed`)

    @property
    def classes(self) -> bool:
        """A persistent configuration whose programs take `split` rows each, in classes of one offset from a 16-byte
        boundary (kernel.KernelWriter._classes), through the window: launched so where `windowed` holds."""
        return self.variant == Variant.PERSISTENT and self.window and self.split is not None

    @property
    def per_program(self) -> int:
        """Rows (or elements) one program covers: the grid is cdiv(xnumel, per_program) (times `column_blocks`)."""
        return self.split if self.variant in MIX_FORMS or self.classes else self.xblock

    def column_blocks(self, rnumel: int | None) -> int:
        """Programs a block of rows takes: its blocks of columns (mix_order_tiled), else one."""
        if self.variant != Variant.MIX_ORDER_TILED or not rnumel:
            return 1
        return -(-rnumel // self.rblock)

    def programs(self, xnumel: int, rnumel: int | None) -> int:
        """The launch's grid (one axis): cdiv(xnumel, per_program) blocks of rows, times `column_blocks`."""
        return max(1, -(-xnumel // self.per_program)) * self.column_blocks(rnumel)

    def blocks(self) -> dict:
        """The kernel's block arguments by name (constexprs, and SPLIT)."""
        out = {"XBLOCK": self.xblock}
        if self.rblock is not None:
            out["RBLOCK"] = self.rblock
        if self.variant in MIX_FORMS:
            out |= {"SPLIT": self.split, "STAGES": self.stages}
        return out

    def with_split(self, split: int) -> Config:
        return attrs.evolve(self, split=split)

    def __str__(self) -> str:
        blocks = " ".join(f"{k}={v}" for k, v in self.blocks().items())
        window = " window" if self.window else ""
        classes = f", {self.split} rows a program in classes" if self.classes else ""
        return f"{self.variant} {blocks} warps={self.warps}{window}{classes}"


def pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def _warps(elements: int) -> tuple:
    """Warp counts to try for a block of `elements` reduced along rows: the usual one (about 8-16
    elements per thread) and half of it. Fewer warps per row means a cheaper cross-thread reduction: on
    an H200 a bfloat16 LayerNorm forward (576000, 384) ran at copy speed (212 µs) with 4 rows on 2 warps
    and 280 µs with the usual 4 warps."""
    w = 2 if elements <= 512 else 4 if elements <= 2048 else 8 if elements <= 8192 else 16
    return (w, w // 2) if w > 1 else (w,)


def _row_warps(elements: int) -> tuple:
    """Warp counts to time for a persistent block of `elements`: 32, 16 and 8 elements per thread (the
    rule's choices, see `rule`), within 1 to 16 warps."""
    return tuple(dict.fromkeys(_clamp(elements // (32 * e), 1, 16) for e in (ROW_PER_THREAD, 16, 8)))


# -- candidates (timed with autotune=True) -------------------------------------------------------------
def candidates(variants: dict, xnumel: int, rnumel: int | None, interpret: bool, only: str | None = None) -> list:
    """Configs to time for a kernel whose variants are `variants` (Variant -> the IR's split, or None)."""
    out: list[Config] = []
    for variant, split in variants.items():
        if only in variants and variant != only:
            continue  # a forced variant, where this kernel has it
        if variant == Variant.POINTWISE:
            if interpret:
                out.append(Config(variant, min(pow2(xnumel), INTERP_BLOCK)))
            else:
                out += [Config(variant, x, warps=w) for x, w in ((1024, 4), (2048, 8), (512, 4))]
        elif variant == Variant.PERSISTENT:
            rb = pow2(rnumel)
            if rb > (INTERP_PERSISTENT_MAX if interpret else GPU_PERSISTENT_MAX):
                continue
            if interpret:
                out.append(Config(variant, max(1, min(pow2(xnumel), INTERP_BLOCK // rb)), rb))
            else:  # row blocks from one row per program to about 16k elements
                for xb in (1, 2, 4, 8, 16, 32, 64):
                    if xb * rb <= 16384 and xb <= pow2(xnumel) and (xb == 1 or xb * rb >= 512):
                        out += [Config(variant, xb, rb, w) for w in _row_warps(xb * rb)]
        elif variant == Variant.LOOPED:
            if interpret:
                rb = min(pow2(rnumel), 4096)
                out.append(Config(variant, max(1, min(pow2(xnumel), INTERP_BLOCK // rb)), rb))
            else:
                # long rows: one row per program; reductions over a strided dim (columns): wide
                # blocks of columns so that each load is coalesced
                found = [Config(variant, xb, rb, 4 if xb * rb <= 1024 else 8)
                         for xb, rb in ((1, 2048), (4, 512), (64, 64), (128, 32))
                         if rb <= pow2(rnumel) and xb <= pow2(xnumel)]
                out += found or [Config(variant, 1, min(2048, pow2(rnumel)))]
        elif variant == Variant.MIX_ORDER_TILED:
            out += tiled_candidates(pow2(rnumel), split, interpret)
        elif variant in MIX_FORMS:
            out += mix_candidates(variant, pow2(rnumel), split, interpret)
    if interpret:  # the interpreter's cost is per program and op: prefer persistent
        out.sort(key=lambda c: c.variant != Variant.PERSISTENT)
        return out[:1]
    return out


def autotune_candidates(cands: list, base: Config | None, band: list = ()) -> list:
    """What `autotune=True` times: `candidates`, and the rule's configuration `base` and the timed band's
    (`uncertain`) where those are not among them, so that autotuning never picks what the default beats. The
    fixed list lacked both for rows wider than 2048: on an H200 autotuning an RMSNorm backward at 64 x 30000
    float32 chose a loop of 2048 on 8 warps (15.7 us in place) over the rule's 8192 on 32 (8.4), which it never
    timed."""
    out = list(cands)
    for c in (base, *band):
        if c is not None and c not in out:
            out.append(c)
    return out


def mix_candidates(form: Variant, rb: int, split: int, interpret: bool) -> list:
    """Configs of a mix-order kernel whose rows are `rb` (a power of two) wide.

    Under the interpreter: one large block, not pipelined. On a GPU, each configuration with its row loop
    pipelined three and four stages deep (see kernel.generate_mix), and one row per block unpipelined as
    the baseline that always compiles. Row blocks: one row on the usual warps, half and twice as many;
    two rows with the one-row accumulator only where each thread holds its columns of both rows (rows
    spread over warps make the per-block column sum cross warps: 2.8 ms instead of 0.36 on an H200 at
    (576000, 384)) and at most 32 elements of a block per thread; `mix_order_acc2d` tiles of two to
    eight rows (up to 8192 elements) on the usual warps and half as many. On an H200 the best bfloat16
    LayerNorm backwards were acc2d with four rows on two warps, four stages (576000, 384: 329 µs), and
    acc2d with two rows on sixteen warps, four stages (32768, 4096: 207 µs); all fast configurations
    were within 3% of those."""
    def cand(xb, w, stages):
        return Config(form, xb, rb, w, stages, split)

    xbs = [xb for xb in (1, 2, 4, 8, 16) if xb <= pow2(split)]
    if interpret:
        xb = max([x for x in xbs if x * rb <= INTERP_BLOCK] or [1])
        return [cand(xb, 4 if xb * rb <= 2048 else 8, 1)]
    configs = []  # (rows per block, warps)
    if form == Variant.MIX_ORDER:
        usual = _warps(rb)
        configs += [(1, w) for w in dict.fromkeys(usual + (min(16, 2 * usual[0]),))]
        if 2 in xbs:
            configs += [(2, w) for w in _two_row_warps(rb)]
    else:
        configs += [(xb, w) for xb in xbs if 2 <= xb <= 8 and xb * rb <= 8192 for w in _warps(xb * rb)]
    out = [cand(xb, w, st) for xb, w in configs for st in MIX_STAGES]
    if form == Variant.MIX_ORDER:
        out.append(cand(1, _warps(rb)[0], 1))
    return out


def _two_row_warps(rb: int) -> list:
    """Warps on which the one-row form (`mix_order`) holds two rows of `rb` a block with each thread holding
    its columns of both: 8 bfloat16 columns a thread a load (16 bytes), so rb / 8 threads along a row, and at most
    32 elements of the block a thread."""
    return [w for w in (1, 2, 4, 8, 16) if 2 * rb <= 32 * 32 * w and rb // 8 >= 32 * w]


def tiled_candidates(rb: int, split: int, interpret: bool) -> list:
    """Configs of mix_order_tiled whose rows are `rb` (a power of two) wide. Under the interpreter one: blocks
    of 1024 columns (a 3001-wide test still has several) and as many rows as make INTERP_BLOCK elements.
    On a GPU, blocks of 512 to 2048 columns and 1 to 4 rows (1024 to 4096 elements) on 4 and 8 warps, three
    and four stages (none timed yet on a GPU)."""
    if interpret:
        rbl = min(rb, MIX_TILE_COLUMNS)
        return [Config(Variant.MIX_ORDER_TILED, _clamp(INTERP_BLOCK // rbl, 1, pow2(split)), rbl, 8, 1, split)]
    out = []
    for rbl in (512, 1024, 2048):
        for xb in (1, 2, 4):
            if rbl <= rb and xb <= pow2(split) and 1024 <= xb * rbl <= 4096:
                out += [Config(Variant.MIX_ORDER_TILED, xb, rbl, w, st, split) for w in (4, 8) for st in MIX_STAGES]
    return out or [Config(Variant.MIX_ORDER_TILED, 1, min(rb, MIX_TILE_COLUMNS), 4, 1, split)]


# -- where no rule holds: a few configurations timed at the first call, even by default ----------------
def uncertain(variants: dict, xnumel: int, rnumel: int | None, interpret: bool, device: Device,
              rows_contiguous: bool = True, only: str | None = None, base: Config | None = None,
              row_bytes: float | None = None, row_sums: bool = False, scalar_rows: bool = False,
              window: int = 0, wide_window: bool = True) -> list:
    """The configurations to time at the first launch where the rule cannot decide, else [].

    Rows 8193 to 16384 wide (a persistent block of 16384) with at least a row per SM: the largest
    persistent rows, where one program fills an SM's registers and whether a row is best held whole on
    few or many warps, or looped over in chunks, follows from the kernel's code more than from its sizes.
    Timed: persistent on 8, 16 and 32 warps (P8, P16, P32) and looped in chunks of 2048 on 16 warps (L2048).
    On an H200, thirty-sixth session (kernel µs, autotune=True's timings of a training step's row kernels;
    40 kernels in docs/benchmarks.md; L1024, chunks of 1024 on 8 warps, was timed too and was never the best):

    | kernel | dtype | rows × width | P8 | P16 | P32 | L2048 | L1024 |
    |---|---|---|---|---|---|---|---|
    | softmax forward | bfloat16 | 10872 × 12345 | **228** | 322 | 315 | 358 | 344 |
    | LayerNorm forward | bfloat16 | 10872 × 12345 | **397** | 430 | 448 | 529 | 435 |
    | cross-entropy backward | bfloat16 | 10872 × 12345 | 192 | **172** | 216 | 195 | 213 |
    | RMSNorm, a row kernel | bfloat16 | 10872 × 12345 | 417 | 426 | **413** | 560 | 486 |
    | LayerNorm, a row kernel | bfloat16 | 8192 × 16384 | 217 | 216 | 222 | **137** | 162 |
    | LayerNorm, a row kernel | float32 | 6553 × 10240 | 173 | 171 | 178 | **135** | 157 |
    | cross-entropy backward | float32 | 6553 × 10240 | 148 | 138 | **133** | 140 | 140 |

    (The twenty-fifth session's table, before accesses were split into a row's pointer and its elements'
    offsets (`kernel.KernelWriter.offset`), had L1024 best for two backwards at 12345 wide: those rows
    loaded one element at a time, each with its own 64-bit address arithmetic, which short chunks hid.)

    A kernel that reads its row once, 2 bytes an element, and writes nothing row-sized (under READ_ROWS_BYTES
    of traffic an element: a bfloat16 cross-entropy forward) holds few values an element, and is timed on 4
    warps too (P4, 128 elements a thread): at 10872 × 12345 bfloat16 its row kernel took 89.4 µs on 4 warps
    against 95.0 on 8 (do_bench, H200).

    No quantity the rule sees (bytes an element, dtype, width, registers of the persistent binary)
    orders these alike across kernels, so the four are timed (`Kernel._choose`), compiled ahead with the
    graph's other kernels, and the choice is kept on disk like an autotuned one. Narrower rows keep the
    rule (their persistent blocks leave room for several programs an SM).

    Rows wider than 16384 (looped, a row a program), again with at least a row per SM: the rule's chunk
    (`base`: the L2 bound on warps, the online softmax's chunk) against chunks of 16384, 8192 and 4096 on
    32 warps, of 4096 on 16 (a 16-byte vector of bfloat16 a thread: at odd widths, whose inner chunks the aligned
    loop loads in vectors (kernel.KernelWriter._aligned_loop), the best of these for a bfloat16 LayerNorm forward
    at 2671 x 50257 and 2048 x 65535 on an H200, 303 and 309 µs against 353 and 358 for the next), and of 2048 on
    8 warps (several programs an SM, each a short chunk: a bfloat16 cross-entropy
    backward at 8192 × 50304 took 445 µs that way against 493 for the best of the others and Inductor's 509;
    float32 875 against 879, found by autotune=True). How long a chunk pays depends on how many values a
    chunk's loop keeps live (a norm's backward spills at 16384), which the rule does not see. On an H200
    (kernel µs; rule marked *):

    | kernel | dtype | rows × width | L16384/32 | L8192/32 | L4096/32 | Inductor |
    |---|---|---|---|---|---|---|
    | LayerNorm forward | float32 | 2237 × 30000 | 194 | 190* | **167** | 166 |
    | RMSNorm forward | float32 | 2237 × 30000 | **143** | 158* | 157 | 140 |
    | LayerNorm training forward | float32 | 1024 × 65536 | **200** | 251* | 255 | 205 |
    | LayerNorm backward, row kernel | float32 | 1024 × 65536 | 351 (spills) | **330*** | 363 | |
    | LayerNorm forward | bfloat16 | 2237 × 30000 | **88** | 96* | 102 | 123 |
    | softmax forward | float32 | 1024 × 65536 | **166** | 169 | 192* | 200 |

    Rows of 16385 to WIDE_PERSISTENT_MAX (a persistent block of 32768) are also timed held whole on 16 and 32 warps
    (read once where the loop reads a row again for its second phase: Inductor holds such rows whole): on an H200
    at 3355 × 20000 float32 (fifty-second session, kernel µs, before → after, Inductor) softmax's backward went
    213.0 → 187.1 (194.1), RMSNorm's 379.6 → 319.6 (361.8), LayerNorm's 403.0 → 335.7 (474.1); forwards within 3%.

    A kernel with an aligned window (`window`: rows it reads or writes do not start on 16-byte boundaries; see
    `windowed`) also times its windowed block (`_window_config`) and the same on half its warps (32 groups a thread:
    a bfloat16 cross-entropy forward at 10872 × 12345 took 84.4 µs by rule, 78.8 through the window on 4 warps and
    74.6 on 2; fifty-ninth session) in the 8193-16384 band, and for rows wider than 16384 the row held whole through
    its window (a block up to WINDOW_PERSISTENT_MAX) where it writes such rows and reads no weight by columns
    (`wide_window`. A row only read, a cross-entropy forward, held whole through the window lost to the looped chunks
    at each of 2671 × 50257, 8192 × 50257 and 8192 × 30522 bfloat16: 117.7 / 328.4 / 222.2 µs against 87.3 / 235.7 /
    143.4 on an H200, Triton's ptxas; at 2671 × 50257 with torch's, not among the three fastest, 86.9 to 111.9. A
    norm's, its weight loaded element by element at each lane's column, lost by 2-11×: LayerNorm's bfloat16 forward
    and dx at 2671 × 50257 3598 and 2758 µs against 321 and 382, RMSNorm's float32 at 1335 × 50257 378 and 546
    against 193 and 312; sixtieth session); rows
    WINDOW_BAND_MIN_WIDTH to 8192 wide time the rule's block against fewer warps and the window (`_window_band`,
    which has the figures). Hand-written, a bfloat16 cross-entropy
    backward at 2671 × 50257 took 150 µs so on 16 warps (89% of copy) where passline's looped kernel took 168.
    Generated, on an H200 (kernel ms, the fifty-sixth session's sweep against the window's band): cross-entropy's
    backward 10872 × 12345 bfloat16 0.175 → 0.134, 2671 × 50257 0.167 → 0.151, float32 5436 × 12345 0.142 → 0.136;
    softmax's and log-softmax's backwards at 10872 × 12345 bfloat16 0.225 → 0.206 and 0.234 → 0.202 — but where the
    window replaced the band's plain blocks (its first version), softmax's forward at 12345 lost 13-16% in both
    dtypes and its float32 backward 14%: the windowed block is a candidate of its own.

    Narrower rows (but for the window band above) and the interpreter keep the rule.

    Fewer rows than SMs (each program has an SM to itself; `_few_rows_band`), moving at least
    BAND_MIN_BYTES: the rule's block against a whole row held in one persistent block on 8, 16 and 32
    warps (rows up to GPU_PERSISTENT_MAX), or on 16 and 32 warps for rows up to FEW_ROWS_PERSISTENT, with
    chunks of 16384 and 4096 on 32 warps. A persistent row is read once where a loop reads it again for its second
    phase, but holds the row in registers, which pays only where the kernel keeps few values an element. On an
    H200 (row kernel µs, twenty-eighth session): RMSNorm's backward at 64 × 30000 float32 took 8.5 by rule
    (chunks of 8192 on 32 warps) against Inductor's whole row of 32768 on one program a row, 6.9, and 7.3 timed
    (the whole row on 16 warps); LayerNorm's backward at 64 × 30000 bfloat16 6.1 timed (the same); at 64 × 8192
    float32 3.4 by rule (32 warps), the whole row on 8 warps timed.

    Column sums (strided rows) over at most SHORT_COLUMN rows, with at least a column per SM and at least
    BAND_MIN_BYTES moved (1 MB; less is a launch's worth of work, a split reduction's finishing sum): a
    few rows' weight or bias gradient (a backward over 64 rows sums 64 values a column). The rule's chunk of rows
    against whole columns held in one persistent block of 16, 32 and 64 columns (`_column_band`). Such
    a kernel is a few microseconds, bound by how many loads an SM has in flight, which the block's shape and
    warps set in ways the rule does not see: on an H200 the float32 LayerNorm backward at 64 × 30000 took 7.9
    µs in its column kernel by rule (two loop steps of 64 × 32 on 8 warps) and 8.1 in one step of 64 × 64 on
    8, where autotuning's best was 4.8 (persistent, 16 × 64 on one warp; 32 × 64 on 4 warps within 2%); the
    whole backward 1.18× Inductor's time by rule, at Inductor's autotuned. Columns of 257 to MEDIUM_COLUMN rows:
    the rule's chunks against 8 to 32 whole columns in blocks of 4096 to 16384 elements, 32 a thread (a bias
    gradient over 2048 tokens of 12345 bfloat16 columns: 46 µs by rule, 30.6 as 8 whole columns on 16 warps,
    H200). Longer column sums keep the rule (and split_reductions spreads them over more programs).

    Tall rows 64 to 1024 wide read once, 2 bytes an element, with nothing row-sized written (under READ_ROWS_BYTES
    of traffic an element; `_tall_rows_band`), at least READ_ROWS_PER_SM rows an SM: the rule's block against 64
    rows a program looped in chunks of 64 on 8 warps, and, where the rule's program is one warp, twice its rows on
    it (a one-warp program is one of at most 32 an SM: `_tall_rows_band`). Such a kernel has little to move a row
    and a row's own work to do (a cross-entropy forward: the target's load, its bounds check and the log-sum-exp),
    which many rows a program share; the rule's persistent block also pads a row to a power of two, idle lanes that
    cost where the kernel is not waiting on memory. On an H200 (the row kernel's µs at its
    first launch, autotune=True's timings; bfloat16 cross-entropy forward):

    | rows × width | the rule | looped 64 × 64, 8 warps | Inductor (its row kernel) |
    |---|---|---|---|
    | 699051 × 192 | ~137 (8 rows of 256, 2 warps) | **87** | 151 |
    | 349525 × 384 | 117 (2 rows of 512, 1 warp) | **81** | 150 |
    | 174763 × 768 | 112 (1 row of 1024, 1 warp) | **79** | 109 |
    | 32768 × 768 | 26 | **21** | 22 |
    | 134218 × 1000 | **91** | 96 | 110 |

    float32 rows (4 bytes an element read: 174763 × 384, 71 by rule against 74) and wider rows (44739 × 3000
    bfloat16, 92 against 99) keep the rule, and so do kernels that write a row (a softmax reads and writes 4
    bytes a bfloat16 element). Tall rows of at most WARP_ROW, whatever they move, also time one-warp programs of
    2048, 1024 and 512 elements (thirty-seventh and fifty-fourth sessions; `_tall_rows_band` has the figures: a
    training forward that writes its statistics fits fewer of the rule's two-warp programs an SM; LayerNorm's at
    1342177 × 100 bfloat16 took 190.5 µs by rule, 143.4 on 8 rows and one warp).

    Mix-order kernels (`_mix_band`, the rule's two-dimensional form `base`, `row_bytes` and `row_sums` as the rule had
    them) over at least MIX_BAND_ROWS_PER_SM rows an SM (the tall, memory-bound shapes), or
    MIX_POINTWISE_BAND_ROWS_PER_SM where the row side is pointwise or reduced rows are wider than 128, moving at least
    BAND_MIN_BYTES: where the row side reduces its rows and they are at most 128 wide, the rule's block (48 bytes of the
    kernel's traffic a thread, one warp) against twice its rows on one warp and on two (48 bytes a thread again), and
    half its rows (two at least); 129 to 256 wide, half the rule's rows on its warps and a quarter on half its warps
    (thirty-seventh session: RMSNorm's backward at 671089 × 200 bfloat16 took 262.6 µs by rule, 8 rows on 2 warps, 234.1
    on 4, with its finishing kernel; Inductor's two kernels 229); where the row side is pointwise (a bias gradient) and
    its rows 257 to 4096 wide, the rule's two rows against, up to 1024 wide, one and four rows on the warps the rule's
    96 bytes a thread give them and four rows at 32 elements a thread (MIX_BAND_THREAD_ELEMENTS); wider, one, two and
    four rows (at most 8192 elements a block) at 32 elements a thread; and where the kernel has the one-row form, that
    form for rows 257 to 4096 wide from 16 rows an SM, reduced or not (`one_row` in `_mix_band`: a float32 RMSNorm
    backward at 8192 × 2304 took 77.6 µs by rule, 57.3 one row a block on 4 warps, Inductor 65.6 on an H200;
    docs/backends.md has the rest). At a model's 8192 tokens the rule's block was up to 1.35× Inductor's time (GELU
    epilogue backward, H200 kernel µs, Inductor / the rule / the band's pick: 8192 × 768 bfloat16 19.8 / 26.8 / 20.8 on
    4 rows and 4 warps; 8192 × 3072 bfloat16 70.6 / 75.5 / 57.2 and float32 97.6 / 115.1 / 89.3, both one row on 4
    warps; 4096 × 3072 bfloat16 38.5 / 40.9 / 31.3; 16384 × 1024 48.4 / 44.3 / 39.1), where the rule's 96 bytes a thread
    (16 warps for two rows of 4096) had been tuned on tall shapes (349525 × 384, 65536 × 768: the rule's block still
    wins there). Where the row side is pointwise and the kernel has the tiled form (on a GPU, always), its blocks of one
    to four whole rows give way to narrow blocks — many rows of 64 or 128 columns, whole rows or blocks of columns —
    timed from 64 columns on (`_narrow_blocks`: at 2097152 × 64 and 349525 × 384 bfloat16 264 µs against the rule's 366
    and 389). Each is timed at one whole wave of programs with the finishing kernel after it, and the leaders again at
    two to four whole waves and the IR's split (runner.MixKernel._fastest_split: on an H200 RMSNorm's backward below
    took 240 µs at one wave and 217 at four, 8 rows a block; LayerNorm's 245 and 246). On an H200 two such points stayed
    slower than Inductor by rule and were at about Inductor's time autotuned (docs/benchmarks.md):

    | kernel (backward) | dtype | rows × width | the rule | by rule | autotuned |
    |---|---|---|---|---|---|
    | RMSNorm | bfloat16 | 2097152 × 64 | 4 rows, 1 warp | 1.17× Inductor | ~1.0× (8 rows a block) |
    | GELU epilogue (bias gradient) | bfloat16 | 349525 × 384 | 2 rows, 2 warps | 1.07× | 0.99× (block not recorded) |

    LayerNorm's backward at 2097152 × 64, whose kernel the rule sees alike (the same width, bytes an
    element and row sums), was at autotuning's time by rule (243-285 µs; the rule before, 456): no quantity
    the rule sees separates the two, so both are timed. On an H100 the band took 8 rows on one warp for
    RMSNorm (timed at 313 µs with the finishing kernel against the rule's block's 354; 310 against 344 µs of
    GPU time a step: 1.05x Inductor's, was 1.17x) and kept the rule's block for LayerNorm and the GELU
    epilogue (docs/benchmarks.md, twenty-second session).

    A pointwise row side 4097 to 8192 wide (the one-row form holds it whole, the tiled form in blocks of 1024
    columns) times the rule's one-row block (`base`) against the tiled form's (`_tiled_rule`) and two rows of the
    one-row form a block (`_two_row_warps`: 16 warps); one 129 to 4096 wide whose rows do not start on 16-byte
    boundaries (`scalar_rows`: each element a load of its own) also times the tiled rule block. Neither form won
    everywhere.
    On an H200 (the GELU epilogue's backward, kernels µs, one-row / tiled, Inductor's pointwise kernel and column
    sum): 9586 × 7001 float32 388 / 240 (Inductor 267), 13419 × 5001 float32 448 / 241 (268), 19171 × 7001 bfloat16
    676 / 354 (469), 26838 × 5001 bfloat16 766 / 345 (429), 19174 × 7000 bfloat16 424 / 276 (395) — the one-row
    form's registers (170 a thread at 7001 float32 and 7000 bfloat16) leave one program an SM, and at odd widths each
    of its 32 elements a thread is a load of its own — but 32760 × 4097 bfloat16 554 / 1596 (473; two rows on 16
    warps: 397), and within 3% at 9587 × 7000 and 10923 × 6144 float32; at 22362 × 3001 float32 the band's pick
    without the tiled block 320, with it 240 (Inductor 252). (docs/benchmarks.md, fifty-third session.)"""
    if interpret or rnumel is None:
        return []
    kinds = [v for v in variants if only not in variants or v == only]
    rb = pow2(rnumel)
    if xnumel < device.sms:
        return _few_rows_band(kinds, xnumel, rb, base, row_bytes) if rows_contiguous else []
    if not rows_contiguous:
        return _column_band(kinds, xnumel, rb, base, row_bytes)
    if any(v in MIX_FORMS for v in kinds):
        per_sm = MIX_BAND_ROWS_PER_SM if row_sums and rb <= 128 else MIX_POINTWISE_BAND_ROWS_PER_SM
        if base is None or xnumel < per_sm * device.sms or _launch_sized(xnumel, rb, row_bytes):
            return []
        return _mix_band(base, rb, row_bytes, rnumel, row_sums, device, Variant.MIX_ORDER in kinds,
                         Variant.MIX_ORDER_TILED in kinds and Variant.MIX_ORDER_ACC2D in kinds, scalar_rows)
    if set(kinds) == {Variant.PERSISTENT, Variant.LOOPED} and rb <= 1024:
        return _tall_rows_band(xnumel, rnumel, rb, base, row_bytes, device)
    if (window and set(kinds) == {Variant.PERSISTENT, Variant.LOOPED} and base is not None
            and WINDOW_BAND_MIN_WIDTH <= rnumel and rb < GPU_PERSISTENT_MAX
            and not _launch_sized(xnumel, rb, row_bytes)):
        return _window_band(rnumel, rb, window, base)
    if set(kinds) == {Variant.PERSISTENT, Variant.LOOPED} and rb == GPU_PERSISTENT_MAX:
        band = [Config(Variant.PERSISTENT, 1, rb, w) for w in (8, 16, 32)] + [Config(Variant.LOOPED, 1, 2048, 16)]
        if _reads_row_only(row_bytes, rnumel):
            band.append(Config(Variant.PERSISTENT, 1, rb, 4))  # a row read once: 128 elements a thread
        through = _window_config(rnumel, window) if window else None
        for cfg in (through, attrs.evolve(through, warps=through.warps // 2)) if through is not None else ():
            if cfg.warps >= 2 and cfg not in band:  # rows off 16-byte boundaries, through the window: 16 and 32
                band.append(cfg)  # groups a thread (128 and 256 bfloat16)
        return band
    if Variant.LOOPED in kinds and not set(kinds) - {Variant.PERSISTENT, Variant.LOOPED} and rb > GPU_PERSISTENT_MAX:
        wide = [Config(Variant.LOOPED, 1, chunk, MAX_WARPS) for chunk in (16384, 8192, 4096)]
        wide.append(Config(Variant.LOOPED, 1, 2048, 8))  # short chunks, several programs an SM
        wide.append(Config(Variant.LOOPED, 1, 4096, 16))  # one 16-byte vector of bfloat16 a thread (aligned loop)
        if Variant.PERSISTENT in kinds and rb <= WIDE_PERSISTENT_MAX:  # the row read once, held on 16 or 32 warps
            wide += [Config(Variant.PERSISTENT, 1, rb, w) for w in (16, MAX_WARPS)]
        through = _window_config(rnumel, window) if window and wide_window and Variant.PERSISTENT in kinds \
            else None
        if through is not None and through.rblock <= WINDOW_PERSISTENT_MAX and through not in wide:
            wide.append(through)  # a row written off 16-byte boundaries, held whole through its window
        return ([base] if base is not None and base not in wide else []) + wide
    return []


def _window_band(rnumel: int, rb: int, window: int, base: Config) -> list:
    """Rows WINDOW_BAND_MIN_WIDTH to 8192 wide that a kernel reads or writes off 16-byte boundaries (`window`: its
    aligned window's group, kernel.KernelWriter._window), a row a program by rule (`base`): the rule's block against
    itself on half its warps, and the row through its window on the rule's warps and on half of them (where its block
    holds the window's head without doubling; half the warps only where that leaves 2 or more: one warp was not
    measured). Neither form nor warp count won everywhere: on an H200 (fifty-ninth session, kernel µs in a training
    step, 44724 × 3001 bfloat16 unless said; the rule on 4 warps: plain / plain on 2 / window on 4 / window on 2)

    | kernel | rule | plain, 2 warps | window, 4 | window, 2 |
    |---|---|---|---|---|
    | cross-entropy backward | 157.0 | **148.8** | 161.5 | 162.3 |
    | log-softmax forward | 146.7 | 145.9 | 158.5 | **134.1** |
    | log-softmax backward | 214.2 | 211.8 | 195.2 | **194.3** |
    | softmax forward | 149.0 | **146.8** | 179.2 | 163.2 |
    | softmax backward | 212.2 | 213.6 | 199.6 | **183.8** |
    | cross-entropy backward, float32 (22362 rows) | 151.3 | **136.0** | 138.7 | 146.4 |

    (cross-entropy's bfloat16 forward, 2 warps by rule: 76.7 plain, 89.7 through the window) — how many values a
    kernel keeps live an element and how much it computes between its loads and stores decide, which the rule does
    not see. [] where the rule's block is not one row a program."""
    if base.variant != Variant.PERSISTENT or base.xblock != 1:
        return []
    half = base.warps // 2 if base.warps >= 4 else 0
    band = [base] + ([attrs.evolve(base, warps=half)] if half else [])
    if rb == pow2(rnumel + window - 1):
        band += [Config(Variant.PERSISTENT, 1, rb, w, window=True) for w in (base.warps, half) if w]
    return band if len(band) > 1 else []


def _reads_row_only(row_bytes: float | None, rnumel: int | None) -> bool:
    """Whether a row kernel moves under READ_ROWS_BYTES an element (`row_bytes`: its traffic a row): it reads a
    2-byte row and writes nothing row-sized (a bfloat16 cross-entropy forward). False where the traffic is unknown."""
    return row_bytes is not None and bool(rnumel) and row_bytes < READ_ROWS_BYTES * rnumel


def windowed(cfg: Config, width: int, group: int, programs: int = 0, itemsize: int = 0) -> bool:
    """Whether a launch of `cfg` runs a kernel with an aligned window (kernel.KernelWriter._window: rows it reads or
    writes that do not start on 16-byte boundaries, read and written in vectors of `group` elements) through it (the
    launch's WINDOW): `cfg` asks for it, a persistent program of one row whose block holds the row and the up to
    group - 1 lanes before it. Which configurations ask is the rule's (`_window_config`) and the bands'. `itemsize`:
    the narrowest row dtype's (its rows' bytes), where the group is not 16 bytes of it (kernel.window_cap).

    A mix-order kernel's rows in classes (kernel.KernelWriter._classes): whatever the configuration, where its
    block holds the row and its head, its `programs` (the launch's) give each of the `group` classes one, and a row
    of the narrowest dtype is at least CLASS_MIN_ROW_BYTES long. Each program reads the 16-byte vectors that hold
    its rows' first and last elements whole, up to 15 bytes of a neighbouring row with each, and takes rows `group`
    apart: on an H200 (sixtieth session, the backward's kernels in a training step, µs, band-timed, classes against
    the plain blocks of rows) LayerNorm bfloat16 44724 × 3001 225 against 369, 26838 × 5001 272 / 506, 134218 × 1001
    240 / 306, float32 22362 × 3001 220 / 265, 86369 × 777 217 / 268, RMSNorm bfloat16 44724 × 3001 217 / 341, a
    bias gradient (GELU epilogue, bfloat16 44724 × 3001) 347 / 350 — but RMSNorm bfloat16 1342177 × 100 (200-byte
    rows) 290 / 238.

    A persistent configuration asking for rows in classes (`Config.classes`: a kernel that reads a weight by
    columns, `class_band`) likewise, its programs `split` rows each; where it does not hold, its launch takes the
    plain form, a row a program (runner.Kernel.grid)."""
    if cfg.variant in (Variant.MIX_ORDER, Variant.MIX_ORDER_ACC2D) or cfg.classes:
        return (cfg.rblock is not None and cfg.rblock >= width + group - 1 and programs >= group
                and width * (itemsize or 16 // group) >= CLASS_MIN_ROW_BYTES)
    return (cfg.window and cfg.variant == Variant.PERSISTENT and cfg.xblock == 1 and cfg.rblock is not None
            and cfg.rblock >= width + group - 1)


def column_windowed(cfg: Config, group: int) -> bool:
    """Whether a launch of `cfg` runs a column sum's rows in classes (kernel.KernelWriter._column_classes; `group`:
    its window's, 16 bytes of its narrowest dtype): a looped configuration asking for the window whose XBLOCK lanes
    hold at least one group of the program's own columns beside the head's."""
    return cfg.window and cfg.variant == Variant.LOOPED and cfg.xblock >= 2 * group


def _with_added(band: list, base: Config, added: list) -> list:
    """`band` with the configurations `added` that it lacks, after the rule's `base` where `band` is empty (the rule
    decided: nothing was timed); `band` itself where nothing is added."""
    return (band or [base]) + [c for c in added if c not in band] if added else band


def column_class_band(band: list, base: Config | None, xnumel: int, rnumel: int, group: int,
                      row_bytes: float | None) -> list:
    """`band` with a column sum's rows in classes added (`group`: its window's; kernel.KernelWriter._column_classes):
    COLUMN_CLASS_BLOCKS, each XBLOCK lanes (XBLOCK - group columns a program) by RBLOCK rows of a class a step, 16
    elements a thread (two 16-byte vectors of bfloat16: as many as the plain rule's block holds; at 32 a thread the
    compiled LayerNorm weight and bias gradients took 204-231 registers, at 16 107-110, and 75 at 32 x 64 on 4 warps,
    for sm_90: `benchmarks/kernel_probe.py --case layer_norm --shape 10872x12345 --dtype bfloat16 --direction bwd`),
    where the columns fill the lanes and the head's G lanes, which a program reads beside its own, are at most a
    quarter of them (a 1-byte dtype's G of 16 takes 64 lanes); the rule's block first where `band` is empty. Not
    where the kernel moves a launch's worth of bytes. Timed on an H200 (sixty-second session, `kernel_times.py`, a
    training step's kernels, µs, best class block against the best plain candidate): LayerNorm's bfloat16 weight and
    bias gradients at 10872 x 12345 223 (32 x 64 on 4 warps) against 230, RMSNorm's 210 against 224, float32 8192 x
    9001 182 (64 x 64 on 8) against 228; lost at float32 5436 x 12345 (199 against 168) and at the GELU epilogue's
    bias gradient 2671 x 50257 bfloat16 (119 against 113). A third block, 32 x 128 on 8 warps, was slowest of the
    three in all five and is no longer timed."""
    if base is None or _launch_sized(xnumel, rnumel, row_bytes):
        return band
    added = [Config(Variant.LOOPED, lanes, rows, warps, window=True) for lanes, rows, warps in COLUMN_CLASS_BLOCKS
             if lanes <= xnumel and lanes >= 4 * group]  # (a program reads its head's lanes too: at most a quarter)
    return _with_added(band, base, added)


def class_band(band: list, base: Config | None, xnumel: int, rnumel: int, window: int, device: Device,
               row_bytes: float | None, itemsize: int = 0) -> list:
    """`band` (configs.uncertain's, or [] where the rule decides) with rows in classes added, for a persistent kernel
    whose rows do not start on 16-byte boundaries and that reads a weight by columns (`window`: its window's group;
    kernel.KernelWriter._classes): through the window a row a program loads the weight element by element at each lane's
    column, every row (LayerNorm's bfloat16 forwards at odd widths held 40-50% of copy that way, sixtieth session); a
    program of one class loads it once and reads its rows in vectors. Its block holds the row and the window's head, 32
    elements a thread (ROW_PER_THREAD, the rule's persistent row); its programs are as many as fill the SMs' warp slots
    once (CLASS_WARP_SLOTS), timed against the rule's block, which comes first. Not where rows are under
    CLASS_MIN_ROW_BYTES (the mix-order classes lost there; `itemsize`: the narrowest row dtype's, where the group is not
    16 bytes of it), where the block would double to hold the head (a group too wide for a width near a power of two:
    the generator narrows its groups so that it never is, kernel.window_cap), where a program would have fewer than two
    rows, or where the kernel moves a launch's worth of bytes. Timed on an H200 (sixty-second session,
    `kernel_times.py`, a training step's kernels, µs, classes against the best plain candidate): it won in four of eight
    — LayerNorm's bfloat16 forward at 44724 x 3001 200 against 252, 26838 x 5001 236 against 264, 10872 x 12345 271
    against 315, float32 5436 x 12345 177 against 179 — and lost by 5-18% in the other four (all 12345 wide), where the
    timing keeps the plain block. Four times the rows a program (a quarter of the programs, each weight load shared by
    more), timed beside it in the same eight, was never the fastest (243-467 µs against 177-271) and is no longer
    timed."""
    rb = pow2(rnumel + window - 1)
    if (base is None or rb > GPU_PERSISTENT_MAX or rb != pow2(rnumel)
            or rnumel * (itemsize or 16 // window) < CLASS_MIN_ROW_BYTES
            or _launch_sized(xnumel, rb, row_bytes)):
        return band  # (a block doubled to hold the head: half its lanes idle, as the mix-order classes never take)
    warps = _clamp(rb // (32 * ROW_PER_THREAD), 1, MAX_WARPS)
    filled = device.sms * (CLASS_WARP_SLOTS // warps)
    cfg = Config(Variant.PERSISTENT, 1, rb, warps, split=xnumel // filled, window=True)
    if cfg.split < 2 or not windowed(cfg, rnumel, window, cfg.programs(xnumel, rnumel), itemsize):
        return band
    return _with_added(band, base, [cfg])


def _window_config(rnumel: int, window: int) -> Config | None:
    """The windowed block for rows `rnumel` wide (a kernel with a window of `window` elements): the row's own block,
    which must also hold the window's head, WINDOW_GROUPS groups (256 bytes of the narrowest dtype) a thread, on
    WINDOW_MIN_WARPS at least (groups, not bytes: where kernel.window_cap narrowed them to 2 elements, 32 bfloat16
    elements a thread — cross-entropy's bfloat16 backward at 8193 x 16383 took 172.1 µs on 16 warps so, 169.7 in the
    plain block before, sixty-third session's sweep); None for rows under WINDOW_MIN_WIDTH, for rows whose block would
    double to hold the head (8186-8192 bfloat16 elements in 16-byte groups: pow2(width + window - 1) > pow2(width); the
    generator narrows such a row's groups until they fit, kernel.window_cap), or where a thread would hold fewer than
    WINDOW_MIN_GROUPS groups. Generated, on an H200 (cross-entropy's backward, the kernel in a training step under
    torch.profiler, the same process, µs, plain → window): 10872 × 12345 bfloat16 175 → 134, float32 5436 × 12345 142 →
    135 (the sweep's), but 16386 × 8191 bfloat16 156 → 169 and float32 149 → 156 (the block doubled to 16384), 44724 ×
    3001 bfloat16 157 → 165 (float32 148 → 136): narrower rows keep the plain block. Hand-written the window won at 3001
    and 8191 too (below): the generated kernel compiles to more registers a thread there (3001 on 2 warps: 95-118
    against 56), not found why. On an H200 (a hand-written bfloat16 cross-entropy backward, the plain form against the
    window at the same warps, µs) the window won wherever a thread held 4 groups or more — 10872 × 12345 on 4, 8 and 16
    warps 231/191/174 against 139/147/150, 6711 × 20001 on 8 and 16 262/251 against 137/138, float32 5436 × 12345 on 8,
    16 and 32 (4 groups of 4) 182/150/153 against 135/138/136 — and lost with 2 (12345 on 32 warps: 167 against 186;
    16384 × 8191 in blocks of 16384 on 32: 168 against 240); by warps, 128 bfloat16 elements a thread were the best at
    12345 (139 µs on 4 warps, 147 on 8), 8191 (136 on 4, 169 on 8) and 20001 (137 on 8, 240 on 4), 64 float32 at 12345
    (135 on 8, 151 on 4). Narrower rows, several a program, were not faster through the window (536871 × 250, its block
    doubled to 512: 146 against 213; 1342177 × 100 156 against 157)."""
    rb = pow2(rnumel + window - 1)
    warps = _clamp(rb // (32 * WINDOW_GROUPS * window), WINDOW_MIN_WARPS, MAX_WARPS)
    if rnumel < WINDOW_MIN_WIDTH or rb != pow2(rnumel) or rb // (32 * warps) < WINDOW_MIN_GROUPS * window:
        return None
    return Config(Variant.PERSISTENT, 1, rb, warps, window=True)


def _launch_sized(xnumel: int, rb: int, row_bytes: float | None) -> bool:
    """Whether a kernel over `xnumel` rows moves less than BAND_MIN_BYTES (`row_bytes` a row, else 4 bytes an
    element of the padded row): a launch's worth of work, where timing its configurations gains nothing."""
    return xnumel * (row_bytes or 4 * rb) < BAND_MIN_BYTES


def _tall_rows_band(xnumel: int, rnumel: int, rb: int, base: Config | None, row_bytes: float | None,
                    device: Device) -> list:
    """Tall rows 64 to 1024 wide (at least READ_ROWS_PER_SM rows an SM, BAND_MIN_BYTES moved) to time (see
    `uncertain`), the rule's `base` first; [] where the rule decides.

    - A kernel that reads its row once, 2 bytes an element, and writes nothing row-sized for (under READ_ROWS_BYTES
      of traffic an element: a bfloat16 cross-entropy forward): 64 rows a program looped in chunks of 64 on 8
      warps, and where the rule's program is one warp (rows of 257 to 1024), twice its rows on it (64 elements a
      thread: a program of one warp is one of at most 32 an SM, the SM's limit on programs, so half its warp slots
      stay empty and each warp must keep twice the bytes in flight; the bfloat16 cross-entropy forward at 134218 x
      1000 took 84.3 us with two rows on one warp against the rule's 91.7, H200).
    - Rows of at most WARP_ROW (a row within one warp's 16-byte vectors in 2-byte dtypes), any kernel: one warp a
      program, 2048, 1024 and 512 elements (64, 32 and 16 a thread). The rule's 2048 elements on two warps hold the most
      rows an SM where the kernel keeps few registers; a kernel that keeps more (a training forward writing its
      statistics, a softmax's exponentials, a cross-entropy gradient) fits fewer two-warp programs an SM than
      one-warp ones, and which pays follows from its registers, which the rule does not see. On an H200 (row
      kernel us, rule / one warp): LayerNorm training forward 1342177 x 100 bfloat16 190.5 / 143.4 (8 rows),
      RMSNorm's 155.8 / 134.4, float32 cross-entropy gradient 671089 x 100 156.2 / 135.4 (4 rows), bfloat16
      671089 x 200 165.2 / 143.8 (4 rows), softmax forward 1342177 x 100 bfloat16 210.4 / 191.4; where the rule
      was best (a bfloat16 cross-entropy gradient 100 wide: 166.3 against 175.0) it is kept. 2048 elements on one
      warp: LayerNorm training forward 536871 x 250 float16 139.2 us against 149.8 on 4 rows and 192.0 by rule
      (Inductor 144.1; fifty-fourth session, with the row's statistics stored last: kernel.emit_members)."""
    if base is None or not 64 <= rb <= 1024 or xnumel < READ_ROWS_PER_SM * device.sms:
        return []
    if _launch_sized(xnumel, rb, row_bytes):
        return []
    blocks = []
    if _reads_row_only(row_bytes, rnumel):
        blocks.append(Config(Variant.LOOPED, 64, 64, 8))
        if base.variant == Variant.PERSISTENT and base.warps == 1:
            blocks.append(attrs.evolve(base, xblock=2 * base.xblock))
    if rb <= WARP_ROW:
        blocks += [Config(Variant.PERSISTENT, elements // rb, rb, 1) for elements in (2048, 1024, 512)]
    blocks = [b for b in dict.fromkeys(blocks) if b != base]
    return [base, *blocks] if blocks else []


def _few_rows_band(kinds: list, xnumel: int, rb: int, base: Config | None, row_bytes: float | None) -> list:
    """Rows along contiguous memory, fewer than SMs, moving at least BAND_MIN_BYTES, to time (see
    `uncertain`), the rule's `base` first: a whole row held in one persistent block on 8, 16 and 32 warps (on
    16 and 32 for rows longer than GPU_PERSISTENT_MAX, up to FEW_ROWS_PERSISTENT elements) and, for those longer
    rows, chunks of 16384 and 4096 on 32 warps; [] where the rule decides."""
    if set(kinds) != {Variant.PERSISTENT, Variant.LOOPED} or base is None or rb > FEW_ROWS_PERSISTENT:
        return []
    if _launch_sized(xnumel, rb, row_bytes):
        return []
    out = [base]
    warps = (8, 16, MAX_WARPS) if rb <= GPU_PERSISTENT_MAX else (16, MAX_WARPS)
    out += [Config(Variant.PERSISTENT, 1, rb, w) for w in warps if rb >= 32 * w]
    if rb > GPU_PERSISTENT_MAX:
        out += [Config(Variant.LOOPED, 1, chunk, MAX_WARPS) for chunk in (16384, 4096)]
    out = list(dict.fromkeys(out))
    return out if len(out) > 1 else []


def _column_band(kinds: list, xnumel: int, rb: int, base: Config | None, row_bytes: float | None) -> list:
    """A column sum over at most MEDIUM_COLUMN rows (after rounding up) that moves at least BAND_MIN_BYTES
    to time (see `uncertain`), the rule's `base` first: whole columns held in one block; up to SHORT_COLUMN
    rows, 16, 32 and 64 columns a program at 32, 16 and 16 elements a thread (at most 8 warps); longer, 8 to
    32 columns in blocks of 4096 to 16384 elements at 32 a thread (at most 16 warps); [] where the rule
    decides."""
    if set(kinds) != {Variant.PERSISTENT, Variant.LOOPED} or rb > MEDIUM_COLUMN or base is None:
        return []
    if _launch_sized(xnumel, rb, row_bytes):
        return []  # (a split reduction's finishing sum)
    out = [base]
    if rb <= SHORT_COLUMN:
        blocks = [(xb, per_thread, 8) for xb, per_thread in ((16, 32), (32, 16), (64, 16))]
    else:  # longer columns: 8 to 32 of them whole in a block of 4096 to 16384 elements, 32 a thread
        blocks = [(xb, 32, 16) for xb in (8, 16, 32) if 4096 <= xb * rb <= GPU_PERSISTENT_MAX]
    for xb, per_thread, most_warps in blocks:
        warps = _clamp(xb * rb // (32 * per_thread), 1, most_warps)
        c = Config(Variant.PERSISTENT, xb, rb, warps)
        if xb <= pow2(xnumel) and xb * rb <= 32 * 32 * warps and c not in out:
            out.append(c)
    return out if len(out) > 1 else []


def _mix_band(base: Config, rb: int, row_bytes: float | None, rnumel: int | None, row_sums: bool,
              device: Device, one_row: bool = False, column_blocks: bool = False, scalar_rows: bool = False) -> list:
    """A tall mix-order kernel's configurations to time (see `uncertain`), the rule's `base` first; []
    where the rule decides: rows wider than the band's, or nothing else fits the split.
    `one_row`: the kernel has the one-row form too (Variant.MIX_ORDER), timed for rows 257 to 4096 wide.
    `column_blocks`: its row side is pointwise and it has the tiled form beside the whole-row ones, whose
    narrow blocks of columns are timed (`_narrow_blocks`), and where its rows are loaded an element at a
    time (`scalar_rows`) the tiled form's rule block too; rows 4097 to 8192 wide time the one-row and the
    tiled forms' rule blocks and two rows of the one-row form a block (see `uncertain`)."""
    if column_blocks and not row_sums and base.variant == Variant.MIX_ORDER and rb <= 128:
        return _narrow_blocks(base, rb, row_bytes, rnumel, device)
    if column_blocks and not row_sums and rb > 4096:  # the rule's one row a block, blocks of columns, two rows
        cands = [_tiled_rule(rb, base.split, row_bytes, rnumel, device)]
        if one_row and pow2(base.split) >= 2:  # two rows, each thread holding its columns of both
            stages = min(MIX_ONE_ROW_STAGES, _stages(2, rb, row_bytes, rnumel, device))
            cands += [Config(Variant.MIX_ORDER, 2, rb, w, stages, base.split) for w in _two_row_warps(rb)[:1]]
        return [base] + [c for c in cands if c != base]
    if base.variant != Variant.MIX_ORDER_ACC2D:
        return []
    per_element = _per_element(row_bytes, rnumel)
    rows = []  # the one-row form: (rows, warps), at least 4 elements a thread, three stages
    if one_row and 256 < rb <= 4096:
        rows = [(1, w) for w in ((4, 8, 16) if row_sums else (4,)) if rb >= 128 * w]
        if not row_sums:  # two rows, each thread holding its columns of both (as mix_candidates)
            rows += [(2, w) for w in _two_row_warps(rb)[:1]]
    if row_sums and rb <= 128:  # narrow rows, reduced: one warp (the rule's), and two for twice the rows
        xb = base.xblock
        blocks = [(2 * xb, base.warps), (2 * xb, 2 * base.warps), (xb // 2, base.warps)]
        # and 32 rows at 16 elements a thread (MIX_NARROW_ROWS_BLOCK)
        many = MIX_NARROW_ROWS_BLOCK
        blocks.append((many, _clamp(many * rb // (32 * MIX_NARROW_PER_THREAD), 1, 16)))
        fewest = 2
    elif row_sums and rb <= WARP_ROW:  # 129-256 wide, reduced: half the rule's rows, on its warps and on half
        xb, w = base.xblock, base.warps  # (RMSNorm backward 671089 x 200 bfloat16, H200: 262.6 us by rule, 8 rows
        blocks = [(xb // 2, w), (xb // 4, max(1, w // 2))]  # on 2 warps; 234.1 on 4 rows; Inductor 229)
        fewest = 2
    elif row_sums and 256 < rb <= 4096:  # wider rows, reduced: the rule's block against the one-row form
        blocks, fewest = [], 2
    elif not row_sums and 128 < rb <= 4096 and column_blocks:  # a pointwise row side: narrow blocks (below)
        blocks, fewest = [], 1
    elif not row_sums and 256 < rb <= 4096:  # ... without the tiled form
        # up to 1024 wide: one and four rows at the rule's 96 bytes a thread, and four at 32 elements a thread;
        # wider: one, two and four rows at 32 elements a thread (within 8192 elements a block, below)
        narrow = rb <= 1024
        blocks = [(xb, _mix_warps(xb * rb, MIX_POINTWISE_SHARE, per_element)) for xb in (1, 4)] if narrow else []
        blocks += [(xb, _clamp(xb * rb // (32 * MIX_BAND_THREAD_ELEMENTS), 1, 16))
                   for xb in ((4,) if narrow else (1, 2, 4))]
        fewest = 1
    else:
        return []
    out = [base]
    for xb, warps in blocks:
        if fewest <= xb <= pow2(base.split) and xb * rb <= 8192:
            c = Config(Variant.MIX_ORDER_ACC2D, xb, rb, warps, _stages(xb, rb, row_bytes, rnumel, device), base.split)
            if c not in out:
                out.append(c)
    stages = min(MIX_ONE_ROW_STAGES, _stages(1, rb, row_bytes, rnumel, device))
    out += [Config(Variant.MIX_ORDER, xb, rb, w, stages, base.split) for xb, w in rows if xb <= pow2(base.split)]
    if column_blocks and not row_sums and 128 < rb <= 4096:
        out += [c for c in _narrow_blocks(base, rb, row_bytes, rnumel, device) if c not in out]
        tiled = _tiled_rule(rb, base.split, row_bytes, rnumel, device)
        if scalar_rows and tiled not in out:
            out.append(tiled)
    return out if len(out) > 1 else []


MIX_NARROW_BLOCKS = ((64, 32), (64, 64), (128, 32))  # (columns, rows) of the band's narrow blocks (see below)
MIX_NARROWEST_BLOCKS = ((32, 64), (32, 128))  # ... and 129-256 wide rows' 32-column blocks (see below)
MIX_NARROW_PER_THREAD = 16  # elements a thread of a narrow block (2048 on 4 warps, 4096 on 8)
# Rows a block of the band's narrow reduced rows (at most 128 wide: a norm's backward) beside the rule's few: on an
# H200, bfloat16 LayerNorm backward at 2796202 x 48 took 229 µs with its finish on 32 rows of 64 lanes (4 warps)
# against 334 for the best of the few-row blocks (4 rows, 1 warp), at 1398101 x 96 227 against 284 (32 x 128, 8
# warps; 2 rows, 1 warp), RMSNorm's 215 against 249 and 217 against 228; blocks of 16 rows on 2 and 4 warps took
# 401-759, slower than all: 16 is not timed.
MIX_NARROW_ROWS_BLOCK = 32


def _narrow_blocks(base: Config, rb: int, row_bytes: float | None, rnumel: int | None, device: Device) -> list:
    """The rule's `base` and a pointwise row side's narrow blocks: many rows of 64 or 128 columns, 16 elements a
    thread, three stages — whole rows where they are 64 or 128 wide (the two-dimensional form: a block of the
    row's width), else blocks of columns (the tiled form). A row side such as the GELU epilogue's backward (an
    erf and an exp an element) is bound by its instructions as much as by memory: a block padded past the row
    (2304 columns in 4096 lanes) computes on idle lanes, a one-row block of a narrow row spends its loop's
    bookkeeping on few elements, and a program of one warp leaves an SM few warps. On an H200 (the kernel's µs
    with its finishing kernel as the first launch timed them; bfloat16 but the last two):

    | rows × width | the rule's block | the best before | the narrow block picked |
    |---|---|---|---|
    | 2097152 × 64 | 366 (1 row, 1 warp) | 366 | 267 (32 × 64, 4 warps) |
    | 349525 × 384 | 389 (2 × 512, 2 warps) | 389 | 264 (32 × 64, 4 warps) |
    | 8192 × 2304 | 78 (2 × 4096, 16 warps) | 61 (1 row, 4 warps) | 51 (32 × 128, 8 warps) |
    | 32768 × 768 | 81 (2 × 1024, 4 warps) | 77 | 61 (32 × 64, 4 warps) |
    | 8192 × 768 | 32 | 28 | 25 (32 × 64, 4 warps) |
    | 134218 × 1000 | 293 | **272** (kept; 32 × 64: 288) | |
    | 1048576 × 64 float32 | 218 | 218 | 205 (64 × 64, 8 warps) |
    | 174763 × 384 float32 | 223 | 222 | 202 (64 × 64, 4 warps) |
    | 838860 × 160 | 451 (2 × 256, 1 warp) | 451 | 283 (64 × 32, 4 warps) |
    | 419430 × 160 float32 | 232 | 232 | 203 (64 × 32, 4 warps) |

    Rows 129-256 wide time them too (the rule's block pads them to 256 lanes on one warp), and 64 and 128 rows
    of 32 columns (MIX_NARROWEST_BLOCKS): a 160-wide row in 64-column blocks pads to 192 lanes, in 32-column
    blocks not at all; a 200-wide row kept the rule's block (347 µs; 32 × 64: 355; 32-column blocks: 511).

    Profiled against Inductor's pointwise kernel and column sum (µs a step, bfloat16): 2097152 × 64 264 against
    351, 349525 × 384 263 against 360, 8192 × 2304 46 against 54, 32768 × 768 57 against 71. Blocks of fewer
    rows (2 to 16 rows of 64 to 512 columns, 1 to 4 warps: 8 to 32 elements a thread) were 1.1-4x slower at
    every point. Which block wins moves with the row side's work, which the rule does not see (a 1000-wide
    row, not a multiple of 64 columns, kept the one-row form; so did 8192 × 3072 and 4096 × 2816 bfloat16:
    60.6 against 61.4, and 36.2 against 58, where the IR's split of 16 rows capped the blocks at 16 rows), so
    they are timed. Beside them the whole-row band of a pointwise row side keeps the rule's block and the
    one-row form: its other two-dimensional blocks (one to four rows, `_mix_band`) won at none of these ten
    points (within 3% of the best at three), so a kernel with the tiled form no longer times them (fewer
    binaries at the first call)."""
    out = [base]
    for cols, rows in MIX_NARROW_BLOCKS + (MIX_NARROWEST_BLOCKS if 128 < rb <= 256 else ()):
        if cols > rb or (cols < rb and rb <= 128):
            continue
        xb = min(rows, pow2(base.split))
        warps = _clamp(xb * cols // (32 * MIX_NARROW_PER_THREAD), 1, 16)
        stages = min(MIX_ONE_ROW_STAGES, _stages(xb, cols, row_bytes, rnumel, device))
        c = Config(Variant.MIX_ORDER_TILED if cols < rb else Variant.MIX_ORDER_ACC2D, xb, cols, warps, stages,
                   base.split)
        if xb >= 2 and c not in out:
            out.append(c)
    return out if len(out) > 1 else []


# -- the rule (the default: nothing timed) -----------------------------------------------------------
@attrs.frozen
class Device:
    """What the rules need to know of the GPU: its SMs and its L2 cache's bytes."""

    sms: int = 132
    l2_bytes: int = 50 << 20
    smem_bytes: int = 232448  # shared memory one program may use (sm_90: 227 KB)

    @staticmethod
    def current() -> Device:
        import torch

        if not torch.cuda.is_available():
            return Device()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return Device(props.multi_processor_count, getattr(props, "L2_cache_size", 0) or 50 << 20,
                      getattr(props, "shared_memory_per_block_optin", 0) or 232448)


def _stages(rows: int, rblock: int, row_bytes: float | None, rnumel: int | None, device: Device) -> int:
    """Pipeline stages of a mix-order kernel's row loop: 4, fewer where that many blocks of `rows` rows
    would not fit a program's shared memory. Each stage holds a block of the rows' loads; `row_bytes` (the
    kernel's traffic a row, writes included: an upper bound on what a stage holds) scaled to the padded
    block, or 8 bytes an element where unknown. A float32 LayerNorm backward 8192 wide asked for 295 KB
    on four stages, past sm_90's 227 KB, and failed to compile at its first call."""
    per_row = (row_bytes / max(1, rnumel or 1) if row_bytes else 8) * rblock
    return _clamp(int(device.smem_bytes // max(1.0, rows * per_row)), 1, 4)


def _per_element(row_bytes: float | None, rnumel: int | None) -> float:
    """Bytes a mix-order kernel reads and writes an element of its rows (8 where unknown)."""
    return row_bytes / rnumel if row_bytes and rnumel else 8.0


def _mix_warps(elements: int, share: float, per_element: float) -> int:
    """Warps for a block of `elements` where each thread takes `share` bytes of the kernel's traffic."""
    threads = elements / max(1.0, share / per_element)
    return _clamp(1 << max(0, round(math.log2(max(1.0, threads / 32)))), 1, 16)


MIX_POINTWISE_SHARE = 96.0  # bytes of traffic a thread, a mix-order kernel with a pointwise row side (see rule)


def _mix_block(rb: int, most_rows: int, row_bytes: float | None, rnumel: int | None, row_sums: bool) -> tuple:
    """Rows per block and warps of a mix-order kernel's two-dimensional form (see `rule`)."""
    per_element = _per_element(row_bytes, rnumel)
    if not row_sums:  # a pointwise row side: two rows a block
        return 2, _mix_warps(2 * rb, MIX_POINTWISE_SHARE, per_element)
    if rb <= 128:  # narrow rows: one warp
        rows = 32 * max(1.0, 48.0 / per_element) / rb
        return _clamp(1 << max(0, round(math.log2(max(1.0, rows)))), 2, most_rows), 1
    xb = _clamp(2048 // rb, 2, most_rows)
    elements = xb * rb
    if elements > 2048:
        return xb, 16 if elements >= 8192 else 8
    return xb, _mix_warps(elements, 192.0, per_element)


def rule(variants: dict, xnumel: int, rnumel: int | None, interpret: bool, device: Device,
         rows_contiguous: bool = True, only: str | None = None, row_bytes: float | None = None,
         online: bool = False, row_sums: bool = False, window: int = 0) -> Config:
    """The configuration to launch with when nothing is timed, derived from the sizes and the device.

    - pointwise: blocks of 1024 elements on 4 warps (fewer for small tensors), as Inductor's default;
    - a reduction along contiguous rows that fit in registers (<= 16384 elements after rounding up to a
      power of two) is persistent, with as many rows per block as make about 2048 elements, but fewer
      when that would leave under two programs per SM, on one warp per 1024 elements of the block: 32
      elements a thread. What bounds such a kernel is how many rows an SM holds at once (the bytes it
      has in flight), and registers set that: compiled for sm_90, a bfloat16 LayerNorm forward 8192 wide
      took 47 registers a thread on 16 warps (16 elements a thread: 2 programs, 2 rows an SM) and 80 on
      8 warps (32 a thread: 3 rows an SM); at 4096, 5 rows against 6; softmax, log-softmax and their
      backwards alike, none spilling (docs/backends.md has the figures). On an H200, LayerNorm forward
      (576000, 384) ran at copy speed with 4 rows on 2 warps (32 a thread) and took 280 µs instead of 212
      on 4 (16 a thread); Inductor's persistent reductions keep 32 a thread too (one warp for a row of up
      to 1024). Rows of 512 to 1024 (after rounding up) take one warp a program (1024 elements, 32 a
      thread): on more warps Triton spreads a row over them once it is wider than a warp covers (32
      threads of 16-byte vectors: 128 float32, 256 bfloat16; past 256 in either dtype), and its reduction
      crosses warps through shared memory and a barrier. On an H200 at 384 wide, float32 cross-entropy
      forward (174763 rows) took 72 µs with 2 rows on 1 warp against 95 with 4 rows on 2, bfloat16
      log-softmax forward (349525) 150 against 168; at
      100 and 64 wide (a row within one warp either way) fewer rows a program were slower (bfloat16
      softmax forward 1342177 × 100: 238 µs against 185), so narrower rows keep the 2048-element blocks
      (rows of 129–256 too); which kernels do better on one-warp programs there is timed
      (`_tall_rows_band`).
      A kernel that only reads its row, 2 bytes an element, and writes nothing row-sized (under
      READ_ROWS_BYTES of traffic an element: a bfloat16 cross-entropy forward, a row max or sum) keeps
      few values an element, and its rows wider than 1024 take twice the elements a thread
      (READ_ROW_PER_THREAD, 64): compiled for sm_90, the cross-entropy forward 3000 wide took 62
      registers a thread on 2 warps (16 rows an SM) against 40 on 4 (12 rows), and on an H200 its row
      kernel ran 4-16% faster at 2048, 3000, 6000 and 8192 wide (44739 × 3000: 79.5 → 69.8 µs; 22370 ×
      6000: 83.2 → 70.3; fifty-seventh session), where the same halving took kernels that write their
      rows (log-softmax, softmax, LayerNorm forwards) and the float32 forward nowhere faster, and a quarter
      of the warps was slower at 8192.
      A kernel that writes rows not starting on 16-byte boundaries and reduces nothing of its own (`window`:
      its persistent form's aligned window, kernel.KernelWriter._window, where the runner gives the rule one: a
      cross-entropy backward at an odd width), a row a program and wider than 8192, runs through the window
      (`_window_config`, which has the figures): hand-written on an H200, 5-20% faster than the plain form at
      its best warps; generated, cross-entropy's backward at 10872 × 12345 bfloat16 0.175 → 0.134 ms. Kernels
      that also reduce their rows (softmax, log-softmax) gained in some dtypes and lost in others (see
      `uncertain`): they time the window where a band has them, and keep the plain block by rule.
      Where even one row per program leaves fewer programs than SMs (each program has an SM to
      itself, whose other warp slots would stay empty), the row is spread over more warps: 8 elements a
      thread, up to 32 warps;
    - longer rows loop over chunks, one row per program. A looped row is read by each of its loops (a
      norm: the statistics, then the normalized values), and the second read comes from L2 only while
      the rows every SM has in flight fit there: an SM holds 64 warps, so a program of w warps leaves
      64 / w rows an SM. The rule takes the fewest warps (8, 16, 32) whose rows in flight touch at most
      half of L2 (`row_bytes`: the bytes the kernel reads and writes a row, its traffic over its rows;
      unknown: 4 bytes an element), in chunks of 16 elements a thread up to 8192. On an H200 (50 MB of
      L2), RMSNorm forward at 4474 × 30000 in bfloat16 took 207 µs on 8 warps and 2048-element chunks
      (1056 rows of 60 KB in flight), 140 µs on 32 warps and 8192 (264 rows); LayerNorm forward 286 µs
      against 179, and at 2048 × 65536, 269 µs against 174 (Inductor: 133, 241, 238). A kernel whose
      first loop is a softmax's online max-and-sum (`online`: two exponentials an element when this was
      measured; since, one and a quarter, kernel._online_step) takes chunks of 2048 on 8 warps
      (bfloat16 softmax forward 4474 × 30000: 224 µs against 261 on 32 warps and 8192; 2048 × 65536: 228,
      220 on 4096 and 16 warps), and where the kernel moves 8 bytes an element (a float32 row read and
      written) 4096 on 32 warps: on an H200 softmax forward 1024 × 65536 float32
      took 242 µs on 2048 and 8 warps, 192 on 4096 and 32 (Inductor 204), log-softmax 2237 × 30000
      float32 221 against 163. With fewer rows
      than SMs, chunks of 8192 on 32 warps (a quarter of the sequential steps, on SMs that have nothing
      else to run); a reduction over a strided dim
      (column sums) loops over chunks of up to 256 rows of a column block 16 to 128 columns wide (the
      widest that still gives two programs per SM), so loads are coalesced, on 8 warps whose threads
      each load about 64 bytes a step (`row_bytes` over the rows: bytes an element; 4 where unknown):
      16 elements where a column sum reads 4 bytes an element, 32 where it reads 2 (one bfloat16 or
      float16 input: a bias gradient), 8 where it reads two float32 inputs (a norm's dw and db
      recomputed from x and dy, recompute_columns). On an H200 the float32
      LayerNorm backward's column kernel at 1024 × 65536 took 185 µs in blocks of 128 × 32 on 8 warps
      (16 a thread), 141 in 64 × 32 on 8 (8 a thread; 64 × 16 on 4: 136), at 2237 × 30000 211 µs in
      64 × 64 and 145 in 64 × 32; a float32 sum of one input (a bias gradient) 8192 wide was fastest
      at 16 a thread (16 × 256 on 8 warps: 79 µs; 64 × 8, 2 a thread: 86); a bfloat16 one at 10872 × 12345
      took 182 µs at 16 a thread (32 bytes: half the loads in flight) and 105 at 32 (float16: 186, 122);
    - a mix-order kernel takes the two-dimensional accumulator, pipelined up to four stages deep (see
      `_stages`); rows wider than 4096 take the one-row form; its rows per program are one whole wave
      (runner.MixKernel). Where the kernel also reduces its rows (`row_sums`: a norm's backward), blocks
      of about 2048 elements (two rows at least) give each thread 192 bytes of the kernel's traffic
      (`row_bytes` over the columns: bytes read and written an element), 8 warps from 4096 elements a
      block and 16 from 8192; rows of at most 128 columns take one warp and 48 bytes a thread. Where its
      row side is pointwise (a bias gradient: dx and its column sum), two rows a block with 96 bytes a
      thread, and rows of at most 128 columns one row a block on one warp (the one-row form). These are
      the configurations autotuning picked on an H200, where the former rule (8 rows on 2 warps at 64
      columns, 4 at 384) took LayerNorm backward 2097152 × 64 bfloat16 456 µs against 244-285, 1048576 × 64
      float32 277 against 208; the bias gradient 349525 × 384 bfloat16 572 against 360 (two rows on 2
      warps; four rows on 4 warps: 727), 2097152 × 64 bfloat16 544 against 357 (the one-row form, one warp).
      LayerNorm backward at 384 and 1000 columns kept its times (200-217 µs), and 32768 × 4096 bfloat16
      207 µs on two rows and 16 warps. Where such a row side is too wide for whole rows (mix_order_tiled: a
      program per block of rows and block of 1024 columns), a program is 4 warps with 96 bytes a thread:
      one float32 row a step (12 bytes an element: dy and h read, dh written), two bfloat16 rows, 3 stages.
      Timed on an H200 against 30 candidates at 1024 and 2048 × 65536, 2237 × 30000 and 7457 × 9000
      (float32) this was within 1% of the best at each; in bfloat16 (2237 × 30000, 1024 × 65536) within 0
      and 8%. The rule it replaced (two rows a step, 8 warps in float32, 4 stages) was 1-13% slower than
      the best, 1.04-1.08x Inductor's kernel time at three of the six points.
      Where the one-row form could hold a pointwise row side's rows whole (4097 to 8192 wide) the two are
      timed against each other (`_mix_band`); the rule keeps the one-row form.
    Under the interpreter the one candidate (few, large programs) is the rule.
    """
    if interpret:
        first = candidates(variants, xnumel, rnumel, interpret, only)[0]
        through = attrs.evolve(first, window=True)  # its one row, through the window, where it holds the head too
        return through if window and windowed(through, rnumel, window) else first
    kinds = [v for v in variants if only not in variants or v == only]
    if Variant.POINTWISE in kinds:
        xb = min(1024, pow2(xnumel))
        return Config(Variant.POINTWISE, xb, warps=_clamp(xb // 256, 1, 4))
    rb = pow2(rnumel)
    if any(v in MIX_FORMS for v in kinds):
        split = variants[kinds[0]]
        if kinds == [Variant.MIX_ORDER_TILED]:  # a wide pointwise row side: blocks of columns (see above)
            return _tiled_rule(rb, split, row_bytes, rnumel, device)
        if not row_sums and rb <= 128 and Variant.MIX_ORDER in kinds:  # a narrow pointwise row side
            return Config(Variant.MIX_ORDER, 1, rb, 1, _stages(1, rb, row_bytes, rnumel, device), split)
        if Variant.MIX_ORDER_ACC2D in kinds and rb <= 4096 and pow2(split) >= 2:
            xb, warps = _mix_block(rb, min(8, pow2(split)), row_bytes, rnumel, row_sums)
            return Config(Variant.MIX_ORDER_ACC2D, xb, rb, warps, _stages(xb, rb, row_bytes, rnumel, device), split)
        form = Variant.MIX_ORDER if Variant.MIX_ORDER in kinds else kinds[0]
        return Config(form, 1, rb, _warps(rb)[0], _stages(1, rb, row_bytes, rnumel, device), split)
    persistent = Variant.PERSISTENT in kinds and rb <= GPU_PERSISTENT_MAX
    alone = xnumel < device.sms  # even one row per program leaves SMs idle: each program has one to itself
    if persistent and (rows_contiguous or Variant.LOOPED not in kinds):
        most = 1024 if WARP_ROW < rb <= 1024 else 2048  # a row that would span warps gets one of its own
        xb = _clamp(most // rb, 1, pow2(xnumel))
        while xb > 1 and -(-xnumel // xb) < 2 * device.sms:
            xb //= 2
        if window and xb == 1 and not alone and rows_contiguous:
            cfg = _window_config(rnumel, window)
            if cfg is not None and cfg.rblock <= GPU_PERSISTENT_MAX:
                return cfg  # a row written off 16-byte boundaries, through its aligned window (see above)
        per_thread = FEW_PER_THREAD if alone else ROW_PER_THREAD
        if not alone and rows_contiguous and rb > 1024 and _reads_row_only(row_bytes, rnumel):
            per_thread = READ_ROW_PER_THREAD  # a 2-byte row only read: twice the rows an SM (see above)
        return Config(Variant.PERSISTENT, xb, rb, _clamp(xb * rb // (32 * per_thread), 1, MAX_WARPS))
    if rows_contiguous:
        if alone:
            rbl = min(32 * MAX_WARPS * FEW_PER_THREAD, rb)
            return Config(Variant.LOOPED, 1, rbl, _clamp(rbl // (32 * FEW_PER_THREAD), 1, MAX_WARPS))
        if online:  # a float32 row read and written (8 bytes an element): 4096-element chunks on 32 warps
            wide = row_bytes and rnumel and row_bytes / rnumel >= 8
            return Config(Variant.LOOPED, 1, min(rb, 4096 if wide else 2048), 32 if wide else 8)
        per_row = row_bytes if row_bytes else 4 * rnumel
        warps = next((w for w in (8, 16, MAX_WARPS) if device.sms * (64 // w) * per_row <= device.l2_bytes / 2),
                     MAX_WARPS)
        return Config(Variant.LOOPED, 1, min(rb, 32 * warps * LOOP_PER_THREAD, 8192), warps)
    # a strided reduction (column sums): wide enough column blocks for whole 32-byte sectors (16
    # columns), narrower than 128 while that leaves under two programs per SM (a (8192, 3072) bias
    # gradient at 128 columns a block ran on 24 programs: 234 µs, 20x its copy time on an H200)
    xb = min(128, pow2(xnumel))
    while xb > 16 and -(-xnumel // xb) < 2 * device.sms:
        xb //= 2
    per_element = row_bytes / rnumel if row_bytes and rnumel else 4.0
    per_thread = _clamp(1 << max(0, round(math.log2(COLUMN_THREAD_BYTES / per_element))), 4, COLUMN_MOST_PER_THREAD)
    rbl = _clamp(32 * 8 * per_thread // xb, 1, min(256, rb))
    return Config(Variant.LOOPED, xb, rbl, _clamp(xb * rbl // (32 * per_thread), 1, 8))


def _tiled_rule(rb: int, split: int, row_bytes: float | None, rnumel: int | None, device: Device) -> Config:
    """The rule's block of mix_order_tiled (see `rule`): 1024 columns, as many rows as give a thread of 4 warps
    96 bytes of the kernel's traffic a step."""
    rbl = min(rb, MIX_TILE_COLUMNS)
    step = MIX_TILE_WARPS * 32 * MIX_POINTWISE_SHARE  # bytes of traffic a program's step
    rows = step / (rbl * _per_element(row_bytes, rnumel))  # (the workspace adds a little: round)
    xb = _clamp(1 << max(0, round(math.log2(max(1.0, rows)))), 1, pow2(split))
    stages = min(MIX_TILE_STAGES, _stages(xb, rbl, row_bytes, rnumel, device))
    return Config(Variant.MIX_ORDER_TILED, xb, rbl, MIX_TILE_WARPS, stages, split)


def finish_rule(variants: dict, xnumel: int, rnumel: int, interpret: bool, device: Device) -> Config:
    """The configuration of a mix-order step's finishing kernel: `xnumel` columns, each summed over `rnumel`
    rows of a float32 workspace [splits, columns] (one row a program of the main kernel: hundreds to
    thousands). It is a column sum with few columns and long ones, which `rule`'s blocks of 16 or more columns
    spread over too few programs. By the columns:

    - at least FINISH_WIDE_COLUMNS: `rule`'s column sum (its blocks leave two programs an SM);
    - from 2 x SMs: 4 columns a program (16 bytes a row) in steps of up to 1024 rows on 4 warps (8 rows of
      4 columns a thread a step): a program per 4 columns, each with 16 KB in flight;
    - fewer: a program a column, the whole column held at once (`rule`'s persistent rows: its loads strided,
      but each program has its column's bytes in flight).

    On an H200 (finishing kernel µs at the main kernel's chosen split; blocks are columns × rows a step, warps;
    rows capped at the workspace's; by rows: a program a column, what every finish took before):

    | step (backward) | dtype | rows × width | by rows | 4 × 1024, 4 | 8 × 1024, 8 | 16 × 512, 8 | 8 × 256, 4 |
    |---|---|---|---|---|---|---|---|
    | GELU epilogue (bias gradient) | bfloat16 | 349525 × 384 | 10.1 | **7.4** | 9.4 | 15.5 | 29.9 |
    | GELU epilogue | bfloat16 | 32768 × 768 | 6.2 | **3.5** | **3.5** | 4.8 | 8.2 |
    | LayerNorm | bfloat16 | 576000 × 384 | 4.3 | **3.7** | 4.0 | 5.1 | 4.7 |
    | GELU epilogue | bfloat16 | 8192 × 768 | 2.1 | 2.0 | 1.9 | 1.9 | 2.3 |
    | RMSNorm | bfloat16 | 2097152 × 64 | **10.8** | 22.4 | 21.0 | 35.8 | 28.9 |
    | LayerNorm | float32 | 8192 × 4096 | 4.3 | 4.8 | 4.2 | 3.9 (`rule`'s: 16 × 256, 8) | **3.6** |

    Where between 768 and 4096 columns the column rule starts to pay was not measured (FINISH_WIDE_COLUMNS).
    Under the interpreter, `rule`'s one candidate."""
    if interpret:
        return rule(variants, xnumel, rnumel, interpret, device)
    if xnumel >= FINISH_WIDE_COLUMNS:
        return rule(variants, xnumel, rnumel, False, device, rows_contiguous=False)
    if xnumel >= 2 * device.sms and Variant.LOOPED in variants:
        return Config(Variant.LOOPED, 4, min(1024, pow2(rnumel)), 4)
    return rule(variants, xnumel, rnumel, False, device, rows_contiguous=True)
