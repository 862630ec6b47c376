"""The Triton backend's run side: kernels that choose a configuration and launch, and the runner.

At compile time each kernel node gets its sources (one per variant, from the disk cache or generated),
and `wrapper.write_call` emits one Python function `call(args)` for the whole graph: sizes, strides and
allocations resolved (burned in for static shapes, computed once per call from the input sizes for
dynamic ones), buffers from PyTorch's caching allocator and `del`eted after their last use, externs as
direct aten calls. At a kernel's first launch for a size bucket it picks its configuration — by rule
(configs.rule), or by timing the candidates with `autotune=True` — and compiles; later launches go through
the compiled binary's own launcher (compat.binary_launcher), not through `JITFunction.run`.
A node the generator cannot handle runs on the reference backend, and the report says so.
"""
from __future__ import annotations

import collections
import contextlib
import math
import re
import threading
from pathlib import Path

import attrs
import sympy
import torch

from ... import __version__
from ...config import current_settings
from ...ir import Extern, FusedNode, MixOrderNode, members
from ...lowering.sizes import at_hint
from ...passes.mix_order_reduction import MIN_SPLIT, TILED_MIN_SPLIT
from ...pipeline.metrics import known_node_bytes, node_bytes
from ..reference import ReferenceRunner, _Bindings
from . import compat
from . import configs as configs_module
from . import kernel as kgen
from .cache import KernelCache, digest, interpreting, load_kernel
from .configs import (
    MAX_WARPS,
    Config,
    Device,
    Variant,
    autotune_candidates,
    candidates,
    class_band,
    column_class_band,
    column_windowed,
    finish_rule,
    pow2,
    rule,
    uncertain,
    windowed,
)
from .printer import Unsupported

# do_bench's measuring time (ms) for a candidate's first timing, and for each of a leader's three interleaved
# timings again (`Kernel._best`); each sample follows an L2 flush, so a 20-100 µs kernel gets some 25-40 samples
# and the median decides. A GPT-2-style backward times 6 choices (88 timings) at its first call: 2.2-2.9 s
# with 20 / 30 ms (and 5 ms of warm-up), 0.7 with these, and in two fresh processes each every choice came
# out the same and the step in the same time (H200, thirty-fourth session; docs/backends.md)
SCREEN_MS = 5
AGAIN_MS = 8


@attrs.define
class KernelInfo:
    """One generated kernel, for the report."""

    name: str
    node: str
    kind: str  # pointwise | reduction | mix_order | mix_finish
    variants: dict  # variant -> KernelSource
    chosen: str | None = None
    blocks: dict = attrs.Factory(dict)
    bytes: int = 0
    timings: dict = attrs.Factory(dict)  # "config" -> seconds, when autotuned
    shared: list = attrs.Factory(list)  # other nodes whose steps launch this kernel (TritonRunner._kernel)

    @property
    def source(self) -> str:
        return self.variants[self.chosen or next(iter(self.variants))].source


class _Aligned:
    """A pointer argument planned ahead of the call (`TritonRunner._first_launches`): 16-byte aligned, as
    the call's own allocations and its inputs are (layouts.conform_inputs)."""

    def data_ptr(self) -> int:
        return 0


def _device_name() -> str:
    """The GPU's name, which keys stored choices (a plan made without a GPU, in tests: "none")."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


def _private(args: tuple) -> tuple:
    """`args` for timing launches. Where two arguments share a storage — an output the wrapper lets a kernel
    write over a buffer it reads, which dies there (wrapper.alloc) — that storage is copied and those
    arguments rebuilt over the copy (same offsets, sizes, strides), so that the timing launches leave the
    call's own data as it was for its real launch, which follows them: a second launch on the call's
    arguments would read what the first wrote (on an H200, `log_softmax(a @ w)` autotuned over 200 × 12345
    was wrong in every element). Other arguments stay: a kernel that reads A and writes a
    separate B writes the same B at every launch. Inductor's autotuner copies the arguments a kernel
    mutates likewise. The copy lives only while the candidates are timed, at the sizes' first launch."""
    storages = _sharers(args)
    if all(n == 1 for n in storages.values()):
        return args
    return _over_copies(args, {ptr for ptr, n in storages.items() if n > 1})


def _sharers(args) -> dict:
    """{storage's data_ptr: how many of `args` are tensors over it}, for the non-empty storages."""
    storages: dict = {}
    for a in args:
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes():
            ptr = a.untyped_storage().data_ptr()
            storages[ptr] = storages.get(ptr, 0) + 1
    return storages


def _over_copies(args: tuple, ptrs=None, fresh=()) -> tuple:
    """`args` with each tensor whose storage is among `ptrs` (None: every non-empty one) rebuilt over a copy
    of that storage, one copy a storage, so that arguments sharing memory still share it (an output written
    over a dying input stays in place), at the same offsets, sizes and strides (a kernel's index math
    assumes them). The arguments at positions `fresh` (outputs the kernel writes without reading:
    `Kernel.fresh`) are then poisoned (`_poison`) where no other argument shares their storage."""
    copies: dict = {}
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes():
            st = a.untyped_storage()
            if ptrs is None or st.data_ptr() in ptrs:
                copy = copies.get(st.data_ptr())
                if copy is None:
                    copy = copies[st.data_ptr()] = st.clone()
                a = torch.empty(0, dtype=a.dtype, device=a.device).set_(copy, a.storage_offset(), a.shape,
                                                                         a.stride())
        out.append(a)
    if fresh:
        _poison(out, fresh)
    return tuple(out)


def _poison(args, fresh) -> None:
    """Fill the arguments at positions `fresh` with a value no kernel computes by chance (NaN; an integer
    dtype's largest value; True), so that two launches compared after it (`Kernel._agreeing`) differ where one
    leaves an element unwritten: the call's own output buffers already hold what the timing launches wrote (the
    rule's configuration among them), and a copy of them would show a candidate that skips rows (a grid or a
    mask fault) as agreeing — right at this call, wrong at the next on fresh buffers. An argument sharing its
    storage with another (an output written over a dying input it reads) keeps its data."""
    owners = _sharers(args)
    for i in fresh:
        a = args[i] if i < len(args) else None
        if not isinstance(a, torch.Tensor) or owners.get(a.untyped_storage().data_ptr()) != 1 or not a.numel():
            continue
        if a.is_floating_point():
            a.fill_(float("nan"))
        elif a.dtype == torch.bool:
            a.fill_(True)
        elif not a.is_complex():
            a.fill_(torch.iinfo(a.dtype).max)


def disagreement(got: tuple, want: tuple) -> str | None:
    """How two launches' arguments after them differ, or None. Integer tensors must be equal; floating ones
    (compared in float64: no overflow) must have NaN and each infinity at the same places, and differ no more
    than a reduction order's rounding: the norm of the difference over the finite elements at most 1e-4 of
    the reference's in 4-byte dtypes and wider, 8e-3 in 2-byte ones (about two roundings), and no element off
    by more than 1e-3 (2**-6 in 2-byte dtypes) of the reference's largest magnitude — a few wrong rows of a tall
    output are a small share of its norm, not of its largest element."""
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor) or torch.equal(g, w):
            continue
        if not g.is_floating_point():
            return f"argument {i} ({g.dtype}) differs"
        gd, wd = g.double(), w.double()
        if not torch.equal(torch.isnan(gd), torch.isnan(wd)):
            return f"argument {i} has NaN elsewhere"
        inf = torch.isinf(wd)
        if not torch.equal(torch.isinf(gd), inf) or not torch.equal(gd[inf], wd[inf]):
            return f"argument {i} has infinities elsewhere"
        fin = torch.isfinite(wd)
        diff, ref = (gd[fin] - wd[fin]), wd[fin]
        narrow = g.element_size() < 4
        err = (diff.norm() / ref.norm().clamp_min(1e-300)).item()
        worst = (diff.abs().max() / ref.abs().max().clamp_min(1e-300)).item() if diff.numel() else 0.0
        if not err <= (8e-3 if narrow else 1e-4) or not worst <= (2 ** -6 if narrow else 1e-3):
            return f"argument {i} ({g.dtype}) relative error {err:.3g}, largest {worst:.3g} of the largest element"
    return _outside_views(got, want)


def _outside_views(got: tuple, want: tuple) -> str | None:
    """Where two launches' arguments (each over its own copies of the same storages: `_over_copies`) differ in
    memory no argument's view covers, or None: a launch writing past its views (into a strided input's gaps, the
    rest of a wider buffer) that comparing the views alone would not see. Those bytes must be equal, bit for
    bit: neither launch should have touched them."""
    storages: dict = {}  # storage of `got` -> (first position, storage of `want`, the views over it)
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) and g.untyped_storage().nbytes():
            entry = storages.setdefault(g.untyped_storage().data_ptr(), (i, w.untyped_storage(), []))
            entry[2].append(g)
    for i, want_storage, views in storages.values():
        got_storage = views[0].untyped_storage()
        if want_storage.nbytes() != got_storage.nbytes():
            return f"argument {i}'s storage differs in size"
        device = views[0].device
        got_bytes = torch.empty(0, dtype=torch.uint8, device=device).set_(got_storage)
        want_bytes = torch.empty(0, dtype=torch.uint8, device=device).set_(want_storage)
        if torch.equal(got_bytes, want_bytes):
            continue
        covered = torch.zeros(got_bytes.numel(), dtype=torch.bool, device=device)
        for v in views:
            e = v.element_size()
            covered.as_strided((*v.shape, e), (*(st * e for st in v.stride()), 1), v.storage_offset() * e).fill_(True)
        if bool(((got_bytes != want_bytes) & ~covered).any()):
            return f"argument {i}'s storage was written outside the arguments' views"
    return None


def _shown(cfg: Config) -> dict:
    """A configuration as the report shows it: its blocks, warps, whether its rows go through the window, and a
    persistent configuration's rows a program where it takes them in classes."""
    return dict(cfg.blocks(), num_warps=cfg.warps) | ({"window": True} if cfg.window else {}) \
        | ({"rows_a_program": cfg.split} if cfg.classes else {})


def _spec(a) -> tuple | bool:
    """What Triton specializes a launch on, for an argument whose value may change between calls: a
    pointer's 16-byte alignment; an integer's divisibility by 16, being 1, and needing 64 bits."""
    if isinstance(a, int):
        return a % 16 == 0, a == 1, a > 0x7FFFFFFF
    return a.data_ptr() % 16 == 0


class Kernel:
    """A kernel node's variants (compiled lazily) and its configuration per size bucket."""

    def __init__(self, info: KernelInfo, cache: KernelCache, interpret: bool, autotune: bool, key: str,
                 only: str | None, device: Device, rows_contiguous: bool = True):
        self.info, self.cache, self.interpret, self.autotune, self.key = info, cache, interpret, autotune, key
        self.only = only  # force one variant (persistent, looped, or a mix-order form) where it exists
        self.device, self.rows_contiguous = device, rows_contiguous
        self.fns: dict = {}
        self.files: dict = {}  # variant -> its module's file in the kernel cache (source_file)
        self.choices: dict = {}  # size bucket -> Config
        # (xnumel, rnumel) -> the Config these sizes launch, once settled: the choice made or loaded at them, or a
        # bucket's timed choice held to the rule's result at them (`_hold`), or the rule's where it was refused
        self.held: dict = {}
        self.binaries: dict = {}  # Config, or (Config, INT64, specialization) -> (launch, constexpr tail)
        self.check: tuple = ()  # positions of arguments that may change between calls (set by the wrapper)
        # positions among `check` of run-time size arguments (dynamic shapes), whose values key a replay
        # (`ready`) next to the element counts; set when the first launch settles
        self.replay_sizes: tuple = ()
        self.last = None  # (xnumel, rnumel, Config) of the latest launch: static shapes skip the lookup
        # (xnumel, rnumel, wide) -> (binary launch, grid, constexpr tail, `last`): launches whose choice and
        # binary are settled, replayed without choosing again (see __call__)
        self.ready: dict = {}
        self.mutates = False  # writes a graph input: never launched more than once per call (no timing)
        self.bands = True  # times configs.uncertain's band where it has one (set by the runner: TritonRunner)
        self.fresh: tuple = ()  # positions of the outputs it writes without reading them (_poison; set by the runner)
        self.timed: set = set()  # configurations chosen by timing (`uncertain`): kept even if they spill
        self.refused: set = set()  # rules' configurations taken where a timed choice disagreed (`_agreeing`)
        # variants whose index width is chosen per launch (kernel.index_width), and whether this call's
        # buffers span more than int32 addresses (the generated call sets it from the sizes, per call)
        self.per_launch = {v for v, src in info.variants.items() if src.int64 is None}
        # variants with device asserts: their launches pass compat.CHECKED_OPTIONS (compile options)
        self.checked = {v for v, src in info.variants.items() if src.checks} if compat.CHECKED_OPTIONS else set()
        self.online = any(src.online for src in info.variants.values())  # a softmax loop (configs.rule)
        self.row_sums = any(src.row_sums for src in info.variants.values())  # a mix-order norm (configs.rule)
        self.scalar_rows = any(src.scalar_rows for src in info.variants.values())  # (configs.uncertain)
        # variants with an aligned window (kernel.KernelWriter._window) -> (its group, the row's width, the narrowest
        # row dtype's itemsize): WINDOW
        self.windows = {v: (src.window, int(src.rnumel), src.window_itemsize)
                        for v, src in info.variants.items() if src.window}
        self.window = max((g for g, _, _ in self.windows.values()), default=0)  # (configs.uncertain)
        self.window_itemsize = min((b for _, _, b in self.windows.values()), default=0)
        # ... and the rule's, where the kernel reduces nothing of its own (KernelSource.window_by_rule)
        self.window_by_rule = self.window if any(src.window_by_rule for src in info.variants.values()) else 0
        # ... whether a row wider than 16384 is held whole through it (configs.uncertain): where the kernel writes
        # rows off 16-byte boundaries and reads no weight by columns
        self.wide_window = bool(self.window) and any(src.window_writes for src in info.variants.values()) \
            and not any(src.window_columns for src in info.variants.values())
        # ... whether it takes rows in classes too (KernelSource.window_classes: configs.class_band)
        self.window_classes = any(src.window_classes for src in info.variants.values())
        # a column sum's rows in classes (KernelSource.column_classes, its looped form's): the window's group, or 0
        self.column_group = max((src.column_classes for src in info.variants.values()), default=0)
        self.wide = False
        self.wide_when: str | None = None  # the generated call's `wide=` condition (wrapper.py), or None
        self.counters: collections.Counter = collections.Counter()  # the runner's (report.metrics.counters)
        self.hinted_element_bytes: float | None = None  # bytes an element at the traced sizes (set by the runner)

    @property
    def splits(self) -> dict:
        return {Variant(v): src.constants.get("SPLIT") for v, src in self.info.variants.items()}

    def fn(self, variant: str):
        """The jitted function of `variant`, its module imported at the first ask (Triton reads its source and
        hashes it: a warm process whose binaries all load by record never asks)."""
        if variant not in self.fns:
            self.fns[variant] = load_kernel(self.source_file(variant), self.info.variants[variant].fn_name,
                                            self.interpret)
        return self.fns[variant]

    def source_file(self, variant: str) -> Path:
        """The kernel cache's file of `variant`'s module, written there if it is not (or is corrupted): read and
        checked once (a cold compile asks for the job's path, then imports it)."""
        if variant not in self.files:
            ckey = digest(self.key, variant)
            self.files[variant] = self.cache.get_source(ckey) or self.cache.put_source(
                ckey, self.info.variants[variant].source)
        return self.files[variant]

    @staticmethod
    def bucket(xnumel: int, rnumel: int | None) -> tuple:
        """Sizes that share one configuration: the same powers of two. A persistent or mix-order kernel's
        RBLOCK holds a whole row, so under dynamic shapes a longer row must get a choice of its own
        (reusing the first call's read past RBLOCK's end: wrong values at the second sequence length)."""
        return pow2(xnumel), (pow2(rnumel) if rnumel is not None else None)

    # -- choosing ---------------------------------------------------------------------------------------
    def cached(self, xnumel: int, rnumel: int | None) -> Config | None:
        """The configuration already settled for these sizes, or None: also None where their bucket's choice
        was timed at other sizes and is not yet held to the rule's result at these (`config` does that)."""
        last = self.last
        if last is not None and last[0] == xnumel and last[1] == rnumel:
            return last[2]
        held = self.held.get((xnumel, rnumel))
        if held is not None:
            return held
        cfg = self.choices.get(self.bucket(xnumel, rnumel))
        return None if self._unheld(cfg) else cfg

    def _unheld(self, cfg: Config | None) -> bool:
        """Whether `cfg`, a bucket's choice at sizes it was not made at, must be held to the rule's result there
        first: a configuration chosen by timing (the band's or autotuning's: `timed`) — what it computes was compared
        with the rule's at the sizes it was timed at only, and a fault of a partial block shows at some sizes
        and not others."""
        return cfg is not None and cfg in self.timed and not self.mutates

    def config(self, xnumel: int, rnumel: int | None, args=None, stream=None, after=None) -> Config:
        """The configuration for these sizes, chosen at their first launch (`args`: the launch's arguments,
        for timing; `after(config)`: what to time after each candidate)."""
        last = self.last
        if last is not None and last[0] == xnumel and last[1] == rnumel:
            return last[2]
        cfg = self.cached(xnumel, rnumel)
        if cfg is None:
            key = self.bucket(xnumel, rnumel)
            cfg = self.choices.get(key)
            if cfg is None:
                cfg = self.choices[key] = self._choose(args, xnumel, rnumel, stream, after)
            elif args is None:  # timed at other sizes of the bucket, asked ahead of the launch (a plan): the
                return cfg  # launch holds it at these sizes
            else:  # timed at other sizes of the bucket (dynamic shapes)
                cfg = self._hold(cfg, xnumel, rnumel, args, stream, after)
            self._settled(xnumel, rnumel, cfg)
        self.last = xnumel, rnumel, cfg
        self.info.chosen, self.info.blocks = str(cfg.variant), _shown(cfg)
        return cfg

    def _settled(self, xnumel: int, rnumel: int | None, cfg: Config) -> None:
        if len(self.held) >= 64:  # dynamic shapes: many sizes; forget the old ones (each is held again, once)
            self.held.clear()
        self.held[xnumel, rnumel] = cfg

    def _hold(self, cfg: Config, xnumel: int, rnumel: int | None, args, stream, after=None) -> Config:
        """`cfg`, its bucket's timed choice, held to the rule's result at these sizes (`_agreeing` with
        `_held_to`), or the rule's configuration where it disagrees; `cfg` where there is no memory for the
        copies (as a timing without memory keeps what it has), or nothing to run the check with."""
        held_to = self._held_to(xnumel, rnumel, args, stream, after)
        if held_to is None:
            return cfg
        try:
            return self._agreeing(cfg, *held_to)
        except torch.OutOfMemoryError as e:
            self.info.timings[f"unchecked {cfg} at {xnumel} x {rnumel}"] = repr(e)[:80]
            self.counters["kernel_choices_unchecked"] += 1
            return cfg

    def _rule(self, xnumel, rnumel, args=None) -> Config:
        return rule(self.splits, xnumel, rnumel, self.interpret, self.device, self.rows_contiguous, self.only,
                    self._row_bytes(xnumel, rnumel, args), self.online, self.row_sums, self.window_by_rule)

    def _row_bytes(self, xnumel: int, rnumel: int | None = None, args=None) -> float | None:
        """The bytes the kernel reads and writes a row (its traffic over its rows). Under dynamic shapes
        the traffic is an expression of the size symbols, evaluated at the launch's sizes — the element
        counts where they are one symbol each, and the size arguments (`args`, in the kernel's signature
        order) — so a dynamic kernel gets its static twin's configuration. Where some size stays unknown
        (rows of `s0*s1` with neither size an argument: a GPT block's LayerNorm backward), the bytes an
        element at the sizes the graph was traced at (`hinted_element_bytes`: traffic grows with the elements,
        so an element's share barely moves) times the launch's row length. (Kept as bytes a row at the traced
        row length, a row twice as long at the launch had half its bytes an element, and the rule's tests of
        bytes an element — a row only read, `configs._reads_row_only` — judged a kernel other than its static
        twin.) None without hints (the rule then assumes 4 bytes an element)."""
        total = self.info.bytes
        if isinstance(total, sympy.Expr) and total.free_symbols:
            src = next(iter(self.info.variants.values()))
            values = {e: a for (kind, e), a in zip(src.args, args or ())
                      if kind == "size" and isinstance(e, sympy.Symbol) and isinstance(a, int)}
            for expr, n in ((src.xnumel, xnumel), (src.rnumel, rnumel)):
                if isinstance(expr, sympy.Symbol) and n is not None:
                    values[expr] = n
            total = total.subs(values)
        try:
            return float(total) / max(1, xnumel) if total else None
        except TypeError:  # symbolic
            hinted = self.hinted_element_bytes
            return hinted * (rnumel or 1) if hinted is not None else None

    def _choose(self, args, xnumel, rnumel, stream, after=None) -> Config:
        if self.interpret or self.mutates or args is None:
            return self._rule(xnumel, rnumel, args)
        if self.autotune:
            cands = self._autotune_candidates(xnumel, rnumel, args)
            if len(cands) == 1:
                return cands[0]
            try:
                # the candidates in the key: a choice timed among others (a backend forcing another variant, an
                # earlier band) is timed again, not taken
                ckey = digest(self.key, xnumel, rnumel, _device_name(), "with rule", [str(c) for c in cands])
                return self._timed(self._remembered(ckey, lambda: self._fastest(cands, args, xnumel, rnumel, stream)))
            except torch.OutOfMemoryError as e:  # no memory for the copies: the rule's, nothing stored
                self.info.timings["timing failed"] = repr(e)[:80]
                return self._rule(xnumel, rnumel, args)
        cands = self.uncertain(xnumel, rnumel, args)
        best = self._timed_choice(xnumel, rnumel, lambda: self._fastest(cands, args, xnumel, rnumel, stream)) \
            if cands else None
        return best if best is not None else self._rule(xnumel, rnumel, args)

    def _timed_choice(self, xnumel: int, rnumel: int | None, pick) -> Config | None:
        """Where no rule holds (configs.uncertain): `pick()`, the fastest of the few candidates timed even by
        default, stored on disk under `_uncertain_key` (or the choice stored there by an earlier process);
        None where the timing failed (no memory for the copy): the caller then takes the rule, as with
        autotuning off before, and nothing is stored."""
        def timed():
            self.counters["kernel_choices_timed"] += 1
            return pick()
        try:
            best = self._remembered(self._uncertain_key(xnumel, rnumel), timed)
        except Exception as e:  # noqa: BLE001 - the user's call never fails for a timing
            self.info.timings["timing failed"] = repr(e)[:80]
            return None
        return self._timed(best)

    def _timed(self, best: Config) -> Config:
        """`best`, chosen by timing, marked so (`timed`) unless it is the rule's configuration taken where the
        timed winner was refused (`refused`)."""
        if best not in self.refused:
            self.timed.add(best)
        return best

    def uncertain(self, xnumel: int, rnumel: int | None, args=None) -> list:
        """The configurations timed at these sizes' first launch although autotuning is off: those of
        `configs.uncertain`, for a kernel launched more than once a call could be (one that writes an
        input is not), only while autotuning is off (on, every candidate is timed) and where its runner
        times bands (`TritonRunner(bands=False)`: a choice's candidates, see there)."""
        if self.autotune or self.mutates or not self.bands:
            return []
        return self._band(xnumel, rnumel, args)

    def _band(self, xnumel: int, rnumel: int | None, args=None, base: Config | None = None) -> list:
        """configs.uncertain's configurations at these sizes (`base`: the rule's, when the caller has it)."""
        base = base if base is not None else self._rule(xnumel, rnumel, args)
        row_bytes = self._row_bytes(xnumel, rnumel, args)
        band = uncertain(self.splits, xnumel, rnumel, self.interpret, self.device, self.rows_contiguous, self.only,
                         base, row_bytes, self.row_sums, self.scalar_rows, self.window, self.wide_window)
        if (self.window_classes and not self.interpret and rnumel and self.rows_contiguous
                and self.only in (None, Variant.PERSISTENT) and xnumel >= self.device.sms):
            band = class_band(band, base, xnumel, rnumel, self.window, self.device, row_bytes, self.window_itemsize)
        if self.column_group and not self.interpret and rnumel and self.only in (None, Variant.LOOPED):
            band = column_class_band(band, base, xnumel, rnumel, self.column_group, row_bytes)
        return band

    def _autotune_candidates(self, xnumel: int, rnumel: int | None, args) -> list:
        """What autotune=True times at these sizes: configs.autotune_candidates (the rule's and the band's too)."""
        base = self._rule(xnumel, rnumel, args)
        return autotune_candidates(candidates(self.splits, xnumel, rnumel, self.interpret, self.only), base,
                                   self._band(xnumel, rnumel, args, base))

    def _uncertain_key(self, xnumel: int, rnumel: int | None) -> str:
        # the band's candidates too: a choice timed among fewer (an earlier passline's band) is timed again
        band = tuple(str(c) for c in self.uncertain(xnumel, rnumel))
        return digest(self.key, xnumel, rnumel, _device_name(), "uncertain", band)

    def saved_choice(self, xnumel: int, rnumel: int | None) -> Config | None:
        """The timed choice among `uncertain`'s configurations stored on disk for these sizes (an earlier
        process timed them), or None."""
        return self._saved(self._uncertain_key(xnumel, rnumel))

    def adopt_saved_choice(self, xnumel: int, rnumel: int | None) -> Config | None:
        """`saved_choice`, where there is one, taken as these sizes' choice ahead of their first launch (the
        precompile plan: the launch then times nothing) and marked timed, so that it is kept even if its
        binary spills (`_unspill`); None where nothing is stored."""
        saved = self.saved_choice(xnumel, rnumel)
        if saved is not None:
            self.choices[self.bucket(xnumel, rnumel)] = saved
            self._timed(saved)
            self._settled(xnumel, rnumel, saved)
        return saved

    def _saved(self, ckey: str) -> Config | None:
        """The choice stored under `ckey`, or None. One stored as `refused` (the rule's configuration, taken where
        the timed winner disagreed with it) is known as such again (`refused`): not a timed choice, so a spilling
        persistent binary of it is still replaced (`_unspill`), as in the process that stored it."""
        saved = self.cache.get_choice(digest(ckey, _CHOICE_STAMP))
        if saved is not None:
            try:
                cfg = Config(Variant(saved["variant"]),
                             **{k: v for k, v in saved.items() if k not in ("variant", "refused")})
            except (TypeError, ValueError, KeyError):
                return None  # written by an older passline: choose again
            if saved.get("refused"):
                self.refused.add(cfg)
            return cfg
        return None

    def _remembered(self, ckey: str, pick) -> Config:
        """The choice stored on disk under `ckey`, or `pick()`'s, stored (with whether it is a refused winner's
        rule: `_saved`)."""
        saved = self._saved(ckey)
        if saved is not None:
            return saved
        best = pick()
        record = attrs.asdict(best) | {"variant": str(best.variant), "refused": best in self.refused}
        self.cache.put_choice(digest(ckey, _CHOICE_STAMP), record)
        return best

    # -- launching --------------------------------------------------------------------------------------
    def constexprs(self, cfg: Config, xnumel: int, rnumel: int | None, wide: bool | None = None,
                   full: tuple = ()) -> dict:
        """The launch's constexprs (and SPLIT) by name, with the compile options (compat.COMPILE_OPTIONS, and a
        checked variant's compat.CHECKED_OPTIONS): `cfg`'s blocks and, where the variant's index width
        is chosen per launch, INT64: set when a buffer spans past int32 (`wide`, default this call's) or the
        points the programs reach do — the counts rounded up to whole blocks, since masked-off lanes compute
        offsets too and must not wrap into the mask — else int32 offsets, as a static kernel of these sizes
        has. A variant with an aligned window takes WINDOW: whether `cfg` runs through it (configs.windowed: a
        persistent configuration asks to and its block holds the row and the window's head; a mix-order one's block
        holds them and this launch's programs give each class one) and every pointer among the launch's
        arguments (`full`, the signature's) that may change between calls is 16-byte aligned. A misaligned one
        (an extern's view) loads element by element whatever the source says, and the window's whole groups would
        reach up to 15 bytes past a buffer's last element, past its last 16-byte vector: such a launch takes the
        plain form (its specialization is in the binary's key)."""
        blocks = {**cfg.blocks(), **compat.COMPILE_OPTIONS}
        found = self.windows.get(cfg.variant)

        def aligned() -> bool:  # (only where the variant has a window: a launch's host time)
            return all(_spec(full[i]) for i in self.check if i < len(full) and not isinstance(full[i], int))
        if found is not None:
            through = windowed(cfg, found[1], found[0], cfg.programs(xnumel, rnumel), found[2]) and aligned()
            blocks["WINDOW"] = (kgen.CLASSES if cfg.classes else True) if through else False
        elif self.column_group and cfg.variant == Variant.LOOPED:
            blocks["WINDOW"] = column_windowed(cfg, self.column_group) and aligned()
        if cfg.variant in self.checked:
            blocks.update(compat.CHECKED_OPTIONS)
        if cfg.variant in self.per_launch:
            reach_x = -(-xnumel // cfg.per_program) * cfg.per_program + cfg.xblock
            reach_r = 1 if rnumel is None else -(-rnumel // (cfg.rblock or 1)) * (cfg.rblock or 1)
            blocks["INT64"] = (self.wide if wide is None else wide) or reach_x * reach_r > kgen.INT32_OFFSETS
        return blocks

    def binary_key(self, cfg: Config, consts: dict, full: tuple):
        """The key of `binaries` a launch of `cfg` with these constexprs and arguments (`full`: the
        signature's, sizes included) looks its binary up under: everything the binary was compiled
        assuming — the configuration, the index width and the specialization of what may change between
        calls (`check`), and the aligned window's WINDOW (a mix-order kernel's follows the launch's count of programs,
        which a run-time row count changes under one configuration: configs.windowed). The launch and the precompile
        plan (TritonRunner._first_launches) both use this."""
        if self.check or "INT64" in consts or "WINDOW" in consts:
            key = cfg, consts.get("INT64"), tuple(_spec(full[i]) for i in self.check)
            return key + (consts["WINDOW"],) if "WINDOW" in consts else key
        return cfg

    def install(self, key, launch, consts: dict, nfull: int, variant, compiled=None) -> None:
        """Keep `launch` (compat.binary_launcher's) as the binary for `key`: later launches pass the rest
        of the signature after the `nfull` arguments — SPLIT and the constexprs, by name — themselves. The
        names are read off `compiled` (the binary `launch` runs) where it has them, else off the function."""
        names = compat.arg_names(compiled) or self.fn(variant).arg_names
        self.binaries[key] = launch, tuple(consts[n] for n in names[nfull:])

    def launch(self, cfg: Config, stream, args: tuple, xnumel: int, rnumel: int | None):
        """Launch `cfg` on `args` (the kernel's buffers and sizes in signature order); returns the compiled
        kernel where this launch compiled it (no binary compiled ahead, or an earlier launch, had its key)."""
        full = (*args, xnumel) if rnumel is None else (*args, xnumel, rnumel)
        consts = self.constexprs(cfg, xnumel, rnumel, full=full)
        grid0 = self.grid(cfg, consts, xnumel, rnumel)
        if self.interpret:
            with interpreting(True):
                return self.fn(cfg.variant)[(grid0,)](*full, **consts, num_warps=cfg.warps)
        spec = self.binary_key(cfg, consts, full)
        found = self.binaries.get(spec)
        if found is not None:
            launch, tail = found
            launch(grid0, stream, *full, *tail)
            return None
        self.counters["kernels_compiled_at_launch"] += 1  # through JITFunction.run: compiled here, unless
        fn = self.fn(cfg.variant)                          # Triton's caches already hold it
        try:
            compiled = fn[(grid0,)](*full, **consts, num_warps=cfg.warps)
        except compat.OutOfResources:
            if cfg.stages <= 1:
                raise
            # a mix-order pipeline deeper than this GPU's shared memory holds (configs._stages bounds it from
            # an estimate of a stage's bytes): one stage, installed under this configuration's key too
            consts = self.constexprs(attrs.evolve(cfg, stages=1), xnumel, rnumel, full=full)
            compiled = fn[(grid0,)](*full, **consts, num_warps=cfg.warps)
            self.counters["kernels_unpipelined"] += 1
        launch = compat.binary_launcher(compiled)
        if launch is not None:
            self.install(spec, launch, consts, len(full), cfg.variant, compiled)
        return compiled

    def grid(self, cfg: Config, consts: dict, xnumel: int, rnumel: int | None) -> int:
        """The launch's programs: `cfg`'s (Config.programs), but a row a program (the plain form's, XBLOCK rows)
        where a configuration asking for rows in classes does not run them (its WINDOW is not CLASSES: too few
        programs for its classes, a misaligned argument), and XBLOCK - G columns a program where a column sum
        takes its rows in classes (kernel.KernelWriter._column_classes: the lanes of a head beside its own)."""
        if cfg.classes and consts.get("WINDOW") != kgen.CLASSES:
            return max(1, -(-xnumel // cfg.xblock))
        if self.column_group and cfg.variant == Variant.LOOPED and consts.get("WINDOW"):
            return max(1, -(-xnumel // (cfg.xblock - self.column_group)))
        return cfg.programs(xnumel, rnumel)

    def __call__(self, stream, args: tuple, xnumel: int, rnumel: int | None = None, wide: bool = False) -> None:
        sized = self.replay_sizes
        ready = self.ready.get((xnumel, rnumel, wide) if not sized else
                               (xnumel, rnumel, wide, *[args[i] for i in sized]))
        if ready is not None:  # the steady state: one lookup, then the binary's launcher
            launch, grid0, tail, last = ready
            if self.last is not last:
                self._show(last)
            if rnumel is None:
                launch(grid0, stream, *args, xnumel, *tail)
            else:
                launch(grid0, stream, *args, xnumel, rnumel, *tail)
            return
        self.wide = wide
        cfg = self.config(xnumel, rnumel, args, stream)
        compiled = self.launch(cfg, stream, args, xnumel, rnumel)
        if compiled is not None and not self.interpret and self._unspill(cfg, compiled, xnumel, rnumel):
            return
        self._settle(cfg, args, xnumel, rnumel, wide)

    def _settle(self, cfg: Config, args: tuple, xnumel: int, rnumel: int | None, wide: bool) -> None:
        """Remember this launch for replay when nothing of it can change on a later call with the same sizes:
        its configuration is chosen (the rule's, or timed and stored) and its binary loaded, and no argument
        outside the replay's key is specialized per call — a replay would skip that specialization. The
        element counts are in the key, and so are the run-time sizes among the arguments (`check`, dynamic
        shapes: a softmax's row stride; without them in the key every launch of a dynamic kernel took the
        full path, ~30 µs of host more); an extern's result that may be a misaligned view is not, and
        keeps the full path. So do the launch through JITFunction.run (no binary) and Triton's interpreter."""
        nargs = len(args)
        inside = [i for i in self.check if i < nargs]
        if self.interpret or not all(isinstance(args[i], int) for i in inside):
            return
        self.replay_sizes = tuple(inside)
        full = (0,) * nargs + ((xnumel,) if rnumel is None else (xnumel, rnumel))
        full = tuple(args[i] if i in inside else a for i, a in enumerate(full))
        consts = self.constexprs(cfg, xnumel, rnumel, wide, full)
        found = self.binaries.get(self.binary_key(cfg, consts, full))
        if found is None:
            return
        if len(self.ready) >= 64:  # dynamic shapes: many sizes; forget the old ones
            self.ready.clear()
        launch, tail = found
        key = (xnumel, rnumel, wide, *[args[i] for i in inside]) if inside else (xnumel, rnumel, wide)
        self.ready[key] = launch, self.grid(cfg, consts, xnumel, rnumel), tail, self.last

    def _show(self, last) -> None:
        """The report's configuration: the latest launch's (a replay of another size's settled launch)."""
        cfg = last[2]
        self.last = last
        self.info.chosen, self.info.blocks = str(cfg.variant), _shown(cfg)

    def _unspill(self, cfg: Config, compiled, xnumel: int, rnumel: int | None) -> bool:
        """A persistent configuration chosen by rule whose compiled kernel spills registers to local memory
        (ptxas's count, known once it is compiled) is replaced, from the next launch on, by the same block
        on twice the warps: half the elements a thread. The rule gives a persistent row 32 elements a thread
        (configs.rule), which for kernels computing many values an element (int64 indices, several loads)
        can exceed what a thread's registers hold; a timed choice is left as it was timed."""
        if (cfg.variant != Variant.PERSISTENT or self.autotune or cfg in self.timed
                or not getattr(compiled, "n_spills", 0)):
            return False
        per_thread = cfg.xblock * cfg.rblock // (32 * cfg.warps)
        if cfg.warps >= MAX_WARPS or per_thread <= 1:
            return False
        roomier = attrs.evolve(cfg, warps=cfg.warps * 2)
        self.choices[self.bucket(xnumel, rnumel)] = roomier
        self._settled(xnumel, rnumel, roomier)
        self.last = xnumel, rnumel, roomier
        self.info.chosen, self.info.blocks = str(roomier.variant), _shown(roomier)
        return True

    # -- timing (autotune=True, and configs.uncertain's band by default) ---------------------------------------
    def _bench(self, c: Config, args, xnumel, rnumel, stream, after=None, rep: int = SCREEN_MS) -> float:
        from triton.testing import do_bench

        def go():
            self.launch(c, stream, args, xnumel, rnumel)
            if after is not None:
                after(c)
        return do_bench(go, warmup=1, rep=rep, return_mode="median")

    def _time(self, cands, args, xnumel, rnumel, stream, after=None, place=None) -> list:
        """[(seconds, config)], fastest first; a configuration that does not compile (too many
        registers) is no candidate. `place(config, compiled)`, where given, gives the config to time
        once its kernel is compiled (a mix-order kernel's split, from its registers)."""
        timed = []
        for c in cands:
            try:
                compiled = self.launch(c, stream, args, xnumel, rnumel)
                c = place(c, compiled) if place is not None else c
                t = self._bench(c, args, xnumel, rnumel, stream, after)
            except Exception as e:
                self.info.timings[str(c)] = repr(e)[:80]
                continue
            regs = f" regs={getattr(compiled, 'n_regs', '?')} spills={getattr(compiled, 'n_spills', '?')}"
            self.info.timings[f"{c}{regs}" + (" +finish" if after else "")] = t
            timed.append((t, c))
        if not timed:
            raise RuntimeError(f"no kernel configuration of {self.info.name} ran")
        return sorted(timed, key=lambda tc: tc[0])

    def _fastest(self, cands, args, xnumel, rnumel, stream) -> Config:
        """The fastest of `cands` on the call's arguments, timed before the call's own launch: on a private
        copy of any storage the kernel writes in place (`_private`), so that the call's data stays as it was;
        then held to the rule's result (`_agreeing`)."""
        timing = _private(args)
        best = self._best(self._leaders(self._time(cands, timing, xnumel, rnumel, stream)), timing, xnumel, rnumel,
                          stream)
        # (Kernel's: a mix-order kernel whose split the pipeline fixed is autotuned here, its main kernel alone)
        return self._agreeing(best, *Kernel._held_to(self, xnumel, rnumel, args, stream))

    def _held_to(self, xnumel, rnumel, args, stream, after=None) -> tuple | None:
        """What a timed choice at these sizes is held to (`_agreeing`): the rule's configuration, and how to run
        one on copies of the call's arguments (`_on_copies`)."""
        return self._rule(xnumel, rnumel, args), lambda cfg: self._on_copies(cfg, args, xnumel, rnumel, stream)

    def _on_copies(self, cfg: Config, args, xnumel, rnumel, stream) -> tuple:
        """`cfg` launched once on copies of the call's arguments (`_over_copies`): what it leaves in them."""
        trial = _over_copies(args, fresh=self.fresh)
        self.launch(cfg, stream, trial, xnumel, rnumel)
        return trial

    def _agreeing(self, best: Config, rule: Config, run) -> Config:
        """`best` if what it writes (`run(config)`: the arguments after a launch on copies of the call's) is
        what the rule's configuration writes, else the rule's. A timed choice is picked for speed alone: a
        candidate computing wrong values would win as readily (the forty-ninth session's looped blocks of
        several rows regrouped lanes across rows on a GPU only, where no CPU test could see it). Each is
        compared (`disagreement`); a refusal is counted (`kernel_choices_refused`) and said in the kernel's
        timings; so is a winner whose own check raises. Where the rule's configuration does not run there is
        nothing to hold the winner to: it is kept, counted as `kernel_choices_unchecked`. Where the copies do not
        fit in memory the error goes on to the caller, which takes the rule's configuration and stores nothing, as
        when timing fails."""
        if best == rule:
            return best
        try:
            want = run(rule)
        except torch.OutOfMemoryError:
            raise  # as a timing without memory: the rule's configuration, nothing stored (_timed_choice)
        except Exception as e:  # noqa: BLE001 - the rule's own configuration does not run: nothing to hold to
            self.counters["kernel_choices_unchecked"] += 1  # the winner, unchecked (as before the check)
            self.info.timings[f"unchecked {best}"] = repr(e)[:80]
            return best
        try:
            bad = disagreement(run(best), want)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - the winner's check does not run: not kept unchecked
            bad = f"its check raised {e!r}"[:80]
        if bad is None:
            return best
        self.counters["kernel_choices_refused"] += 1
        self.info.timings[f"refused {best}"] = bad
        self.refused.add(rule)  # the rule's, not a timed choice: its binary may still be unspilled (_timed_choice)
        return rule

    @staticmethod
    def _leaders(timed: list) -> list:
        return [c for t, c in timed[:3] if t <= 1.1 * timed[0][0]]

    def _best(self, leaders, args, xnumel, rnumel, stream, after=None) -> Config:
        """The first timing pass is short and near-equal configurations swap places from run to run:
        the leaders are timed again, longer and interleaved, and the best median of those runs wins."""
        if len(leaders) == 1:
            return leaders[0]
        again = {i: [] for i in range(len(leaders))}
        for _ in range(3):
            for i, c in enumerate(leaders):
                again[i].append(self._bench(c, args, xnumel, rnumel, stream, after, rep=AGAIN_MS))
        return leaders[min(again, key=lambda i: sorted(again[i])[1])]


MAX_PROGRAMS_PER_SM = 32  # resident blocks per SM on recent NVIDIA GPUs: the most a split may ask for


def _resident(regs: int, warps: int, smem: int = 0) -> int:
    """Programs of `warps` warps using `regs` registers a thread and `smem` bytes of shared memory that
    one SM holds at once."""
    # without a GPU (a plan made on the CPU, tests) the attributes' defaults: an H100/H200's
    props = torch.cuda.get_device_properties(torch.cuda.current_device()) if torch.cuda.is_available() else None
    per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    max_warps = getattr(props, "max_threads_per_multi_processor", 2048) // 32
    per_warp = -(-regs * 32 // 256) * 256  # registers are given to a warp 256 at a time
    # the shared memory an SM has (228 KiB on Hopper), 1 KiB of it reserved per program
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (smem + 1024)
    return max(1, min(MAX_PROGRAMS_PER_SM, max_warps // warps, per_sm // (per_warp * warps), by_smem))


class MixKernel(Kernel):
    """A mix-order kernel, whose rows per program (SPLIT, a run-time argument) is chosen with its
    configuration when the node allows it (`MixOrderNode.tune_split`): by rule, one whole wave — as many
    programs as all SMs hold at once, from the compiled kernel's registers, warps and shared memory;
    in configs.uncertain's mix-order band, and for every configuration with autotune=True, each is timed
    at one whole wave and the leaders again at the IR's split and two to four whole waves, each time
    followed by the finishing kernel, which sums one workspace row per program (`_fastest_split`). A
    partial last wave leaves SMs idle while the stragglers run: on an H200, bfloat16 LayerNorm backward
    (576000, 384) with the loads of the next rows held in registers took 413 µs at 128 rows per program
    (4.3 waves) and 385 µs at one wave; pipelined through shared memory the split matters less (329, 330
    and 332 µs at one, two and three waves), and fewer, longer programs still make the finishing kernel
    cheaper — but not always: see `_fastest_split`."""

    def __init__(self, *a, split: int, tune_split: bool, **kw):
        super().__init__(*a, **kw)
        self.split, self.tune_split = split, tune_split
        # (rows, configuration at the IR's split) -> its whole-wave splits (`waves`), where the precompile
        # plan (TritonRunner._first_launches) compiled it there: its launch then compiles nothing to place from
        self.placements: dict = {}

    def _floor(self, xnumel: int, variant: Variant) -> int:
        """The smallest split tried for `variant`: at most MAX_PROGRAMS_PER_SM programs per SM, never under 16
        rows (tiny blocks make huge workspaces); 64 where the columns are in blocks (mix_order_tiled), whose
        programs a block of rows are many: its float32 workspace [splits, columns] is then at most a 64th of a
        float32 input's bytes, a 32nd of a bfloat16's, written once and read once more."""
        fewest = TILED_MIN_SPLIT if variant == Variant.MIX_ORDER_TILED else MIN_SPLIT
        return max(fewest, math.ceil(xnumel / (self.device.sms * MAX_PROGRAMS_PER_SM)))

    def waves(self, cfg: Config, compiled, xnumel: int, rnumel: int) -> list[int]:
        """The splits of `cfg` that give one to four whole waves of programs (the first: one wave), from what
        its compiled binary says of its registers (64, a common figure, if this Triton does not) and its
        shared memory (the pipelined loads' buffers); those under the smallest split allowed are left out.
        A block of rows is `cfg.column_blocks` programs (mix_order_tiled): k waves hold k * wave // blocks
        blocks of rows, whole. (Dividing the rows' programs by the wave instead rounds the split down past a
        whole block's worth: a bfloat16 GELU epilogue backward at 8192 × 50304, 50 column blocks and 924
        programs a wave, took a split of 444 rows, 19 blocks of rows, 950 programs: a second wave of 26, 912 µs
        on an H200; at the whole-wave split of 456, 826 µs.)"""
        regs = getattr(compiled, "n_regs", 0) or 64
        smem = getattr(getattr(compiled, "metadata", None), "shared", 0) or 0
        wave = self.device.sms * _resident(regs, cfg.warps, smem)
        blocks = cfg.column_blocks(rnumel)  # programs a block of rows
        floor = self._floor(xnumel, cfg.variant)
        splits = (math.ceil(xnumel / max(1, wave * k // blocks)) for k in (1, 2, 3, 4))
        return [s for s in dict.fromkeys(splits) if s >= floor]

    def workspace_rows(self, xnumel: int) -> int:
        """Rows of each workspace while timing: one per program at the smallest split that may be tried."""
        floor = min(self._floor(xnumel, v) for v in self.info.variants)  # the smallest of the kernel's forms
        return max(1, math.ceil(xnumel / min(self.split, floor)))

    def _tuned(self) -> bool:
        return not self.interpret and self.tune_split

    def uncertain(self, xnumel: int, rnumel: int | None, args=None) -> list:
        """`Kernel.uncertain`'s configurations (configs.uncertain's mix-order band), where the split is this
        kernel's to choose: they are timed with their splits (`_fastest_split`). A split the pipeline fixed,
        and the interpreter, keep the rule."""
        return super().uncertain(xnumel, rnumel, args) if self._tuned() else []

    def _choose(self, args, xnumel, rnumel, stream, after=None) -> Config:
        if not self._tuned() or args is None:
            return super()._choose(args, xnumel, rnumel, stream)
        if self.autotune and not self.mutates:
            ckey = digest(self.key, xnumel, rnumel, _device_name(), "split", "with rule", "held", str(self.only))
            # timed on a private copy where an output shares a storage with an input it reads (`_private`): a
            # mix-order kernel may write over a dying input, and every timing launch would read what the one
            # before it wrote (a GELU backward's dh wrong in 99% of its elements, on a CPU simulation)
            try:
                return self._timed(self._remembered(ckey, lambda: self._pick_split(_private(args), xnumel, rnumel,
                                                                                    stream, after)))
            except torch.OutOfMemoryError as e:  # no memory for the copies: the rule's, nothing stored
                self.info.timings["timing failed"] = repr(e)[:80]
                return self._place(self._rule(xnumel, rnumel, args), None, args, xnumel, rnumel)
        cands = self.uncertain(xnumel, rnumel, args)
        if cands:  # where no rule holds (configs.uncertain): timed with their splits, the finish after each
            best = self._timed_choice(xnumel, rnumel, lambda: self._fastest_split(cands, _private(args), xnumel,
                                                                                   rnumel, stream, after))
            if best is not None:
                return best
        # by rule: one whole wave, from what the compiled kernel takes (compiled now, not launched)
        return self._place(self._rule(xnumel, rnumel, args), None, args, xnumel, rnumel)

    def _held_to(self, xnumel, rnumel, args, stream, after=None) -> tuple | None:
        """`Kernel._held_to` for a mix-order step: the whole step (`after.outputs`, MixStep's) against the rule's
        at its whole-wave split for these rows (a split the pipeline fixed stays the rule's); None without the
        step to run."""
        outputs = getattr(after, "outputs", None)
        if outputs is None:
            return None
        rule = self._rule(xnumel, rnumel, args)
        return (self._place(rule, None, args, xnumel, rnumel) if self._tuned() else rule), outputs

    def placed(self, cfg: Config, compiled, xnumel: int, rnumel: int) -> Config:
        """The configuration `cfg` (the rule's, or one of configs.uncertain's band) with its split: one whole
        wave of programs, from `cfg` compiled at the IR's split (its registers, shared memory); the IR's split
        where it could not be compiled. What the first launch chooses by rule, or times, and what
        TritonRunner._first_launches chooses ahead of it."""
        return self._at_first(cfg, self.waves(cfg, compiled, xnumel, rnumel) if compiled is not None else [])

    def _at_first(self, cfg: Config, splits: list[int]) -> Config:
        """`cfg` at the first of its whole-wave `splits`, or at the IR's split where there is none."""
        return cfg.with_split(splits[0] if splits else self.split)

    def _wave_splits(self, cfg: Config, compiled, args, xnumel: int, rnumel: int) -> list[int]:
        """`waves` of `cfg` (at the IR's split): from `compiled` where its launch compiled it, else the split
        the precompile plan placed it at (`placements`: its binary was built ahead), else from `cfg` compiled
        now; [] where it could not be compiled."""
        if compiled is None:
            found = self.placements.get((xnumel, cfg))
            if found is not None:
                return list(found)
            compiled = self._compile_only(cfg, args, xnumel, rnumel)
        return self.waves(cfg, compiled, xnumel, rnumel) if compiled is not None else []

    def _place(self, cfg: Config, compiled, args, xnumel: int, rnumel: int) -> Config:
        """`cfg` at its first whole-wave split (`_wave_splits`), or at the IR's split (as `placed`)."""
        return self._at_first(cfg, self._wave_splits(cfg, compiled, args, xnumel, rnumel))

    def _compile_only(self, cfg: Config, args, xnumel: int, rnumel: int):
        """`cfg` compiled for these arguments without a launch (the launch that follows finds it in
        Triton's cache); None where this Triton cannot."""
        try:
            compiled = self.fn(cfg.variant).warmup(*args, xnumel, rnumel, grid=(1,),
                                                   **self.constexprs(cfg, xnumel, rnumel, full=(*args, xnumel, rnumel)),
                                                   num_warps=cfg.warps)
            init = getattr(compiled, "_init_handles", None)
            if init is not None:
                init()
            return compiled
        except Exception:  # noqa: BLE001 - a Triton without warmup: the IR's split
            return None

    def _at_one_wave(self, cands, args, xnumel, rnumel, stream, after) -> tuple[list, dict]:
        """Each of `cands` (at the IR's split) timed at one whole wave of its programs, the finishing kernel
        after each (`after`): ([(seconds, placed configuration)] fastest first, {configuration with its split
        left out: its whole-wave splits}). A candidate whose binary was built ahead is placed as the
        precompile plan placed it (`placements`: its launch compiles nothing to place from)."""
        waves: dict = {}  # configuration (split left out) -> its whole-wave splits

        def one_wave(c, compiled):
            splits = waves[c.with_split(0)] = self._wave_splits(c, compiled, args, xnumel, rnumel)
            return self._at_first(c, splits)

        return self._time(cands, args, xnumel, rnumel, stream, after, one_wave), waves

    def _fastest_split(self, cands, args, xnumel, rnumel, stream, after) -> Config:
        """The fastest of `cands`: each timed at one whole wave of its programs, the leaders again at the IR's
        split and two to four whole waves, the finishing kernel timed after each; the leaders of all those
        timed again as `Kernel._fastest` does. On an H200 the one-wave split was the best for bfloat16
        LayerNorm backward (2097152 × 64: 245 µs, 246 at 4 waves) but not for RMSNorm's at the same shape
        (240 µs at one wave, 217 at 4) or the GELU epilogue's bias gradient at 349525 × 384 (391 µs, 360 at
        two): which split pays follows from how evenly the SMs finish, which no size tells. The winner is
        then held to the rule's result, the whole step compared (`after.outputs`, MixStep._choose), as
        `Kernel._fastest` holds a row kernel's."""
        first, waves = self._at_one_wave(cands, args, xnumel, rnumel, stream, after)
        leaders = self._leaders(first)
        timed = [(t, c) for t, c in first if c in leaders]  # each leader's one-wave time is kept
        for c0 in leaders:
            for c in self.retimed(c0, waves[c0.with_split(0)]):
                t = self._bench(c, args, xnumel, rnumel, stream, after)
                self.info.timings[f"{c} +finish"] = t
                timed.append((t, c))
        best = self._best(self._leaders(sorted(timed, key=lambda tc: tc[0])), args, xnumel, rnumel, stream, after)
        held_to = self._held_to(xnumel, rnumel, args, stream, after)
        return best if held_to is None else self._agreeing(best, *held_to)

    def retimed(self, c0: Config, splits) -> list[Config]:
        """A leader `c0` (at its one-wave split) at the IR's split and at its other whole-wave `splits`, each
        that holds its block: what `_fastest_split` times again, and what the precompile plan builds ahead
        for every candidate (TritonRunner._plan_timed_mix)."""
        return [c0.with_split(s) for s in dict.fromkeys([self.split, *splits]) if s != c0.split and c0.xblock <= s]

    def _pick_split(self, args, xnumel, rnumel, stream, after) -> Config:
        """autotune=True: every candidate configuration, the rule's and the band's among them, as
        `_fastest_split` times the band's."""
        return self._fastest_split(self._autotune_candidates(xnumel, rnumel, args), args, xnumel, rnumel, stream,
                                   after)

    def _uncertain_key(self, xnumel: int, rnumel: int | None) -> str:
        # "splits": the band's choice is timed over splits too (a choice stored from one wave is timed again)
        return digest(super()._uncertain_key(xnumel, rnumel), "splits", "held")  # held: checked (_agreeing)


class FinishKernel(Kernel):
    """A mix-order step's finishing kernel: its columns summed over the workspace's rows (one a program of
    the main kernel, whose split sets them at its first launch), by `configs.finish_rule`; nothing timed by
    default (autotune=True times its candidates as any kernel's)."""

    def _rule(self, xnumel, rnumel, args=None) -> Config:
        return finish_rule(self.splits, xnumel, rnumel, self.interpret, self.device)

    def uncertain(self, xnumel: int, rnumel: int | None, args=None) -> list:
        return []


class MixStep:
    """A mix-order node at run time: workspaces for the chosen split, the main kernel, the finishing
    kernel (a reduction over one workspace row per program), the workspaces freed."""

    def __init__(self, main: MixKernel, finish: Kernel, workspaces: dict, main_slots: dict, finish_slots: dict):
        self.main, self.finish = main, finish
        self.workspaces = workspaces  # name -> Layout (dtype, device; rows and columns set per call)
        self.main_slots, self.finish_slots = main_slots, finish_slots  # workspace name -> argument position
        self.programs_at: dict = {}  # (rows, cols) -> the main kernel's programs, once its split is chosen

    def _with(self, args: tuple, slots: dict, ws: dict) -> tuple:
        out = list(args)
        for name, k in slots.items():
            out[k] = ws[name]
        return tuple(out)

    @staticmethod
    def programs(rows: int, cfg: Config) -> int:
        """The main kernel's blocks of rows at `cfg`'s split (its programs, but for mix_order_tiled's blocks of
        columns, which share a workspace row): the finishing kernel's rows to sum."""
        return max(1, -(-rows // cfg.split))

    def _alloc(self, empty, rows: int, cols: int) -> dict:
        return {name: empty((rows, cols), (cols, 1), lay.dtype) for name, lay in self.workspaces.items()}

    def __call__(self, empty, stream, margs: tuple, fargs: tuple, rows: int, cols: int, wide: bool = False,
                 wide_finish: bool = False) -> None:
        """Run the step; `empty(size, stride, dtype)` allocates the workspaces (the call's allocator)."""
        n = self.programs_at.get((rows, cols))
        if n is None:
            n = self._choose(empty, stream, margs, fargs, rows, cols, wide, wide_finish)
        ws = self._alloc(empty, n, cols)
        self.main(stream, self._with(margs, self.main_slots, ws), rows, cols, wide)
        self.finish(stream, self._with(fargs, self.finish_slots, ws), cols, n, wide_finish)

    def _choose(self, empty, stream, margs, fargs, rows, cols, wide, wide_finish) -> int:
        """The main kernel's configuration and split at these sizes, chosen at their first launch (with
        workspaces to time or compile on); its count of programs is returned and kept."""
        main, finish = self.main, self.finish
        main.wide, finish.wide = wide, wide_finish
        cfg = main.cached(rows, cols)
        if cfg is None:
            # workspaces to time on (autotuning, or configs.uncertain's band): one row a program at the
            # smallest split tried; else one row, to compile on. A choice timed at other rows of the bucket
            # is held to the rule's step at these (Kernel._hold): room for its split's programs too
            timing = main._tuned() and not main.mutates and (main.autotune or bool(main.uncertain(rows, cols, margs)))
            n = main.workspace_rows(rows) if timing else 1
            other = main.choices.get(main.bucket(rows, cols))
            if other is not None:
                n = max(n, main.workspace_rows(rows), self.programs(rows, other))
            ws = self._alloc(empty, n, cols)
            m, f = self._with(margs, self.main_slots, ws), self._with(fargs, self.finish_slots, ws)
            cfg = main.config(rows, cols, m, stream, _After(self, stream, m, f, rows, cols))
        if len(self.programs_at) >= 64:  # dynamic shapes: many sizes; forget the old ones
            self.programs_at.clear()
        n = self.programs_at[rows, cols] = self.programs(rows, cfg)
        return n


class _After:
    """What a mix-order step's main kernel runs after each candidate configuration it times (MixStep._choose):
    the finishing kernel for that candidate's count of programs, on the timing workspaces; and `outputs`, the
    whole step at one configuration on copies of the call's arguments and workspaces, for the timed choice's
    check (`Kernel._agreeing`)."""

    def __init__(self, step: MixStep, stream, margs: tuple, fargs: tuple, rows: int, cols: int):
        self.step, self.stream, self.margs, self.fargs, self.rows, self.cols = step, stream, margs, fargs, rows, cols

    def _finish(self, c: Config, fargs: tuple) -> None:
        n = self.step.programs(self.rows, c)
        finish = self.step.finish
        finish.launch(finish.config(self.cols, n), self.stream, fargs, self.cols, n)

    def __call__(self, c: Config) -> None:
        self._finish(c, self.fargs)

    def outputs(self, c: Config) -> tuple:
        """`c`'s main kernel, then the finish, on copies (`_over_copies`: arguments of both kernels sharing a
        storage share its copy): the arguments of both after them, the workspaces left out (None) — their rows
        follow the split, which differs between configurations."""
        both = _over_copies(self.margs + self.fargs,
                            fresh=self.step.main.fresh + tuple(len(self.margs) + k for k in self.step.finish.fresh))
        m, f = both[:len(self.margs)], both[len(self.margs):]
        self.step.main.launch(c, self.stream, m, self.rows, self.cols)
        self._finish(c, f)
        skip = set(self.step.main_slots.values()) | {len(m) + k for k in self.step.finish_slots.values()}
        return tuple(None if i in skip else a for i, a in enumerate(both))


@attrs.define(eq=False)
class Planned:
    """One launch of the first call, planned ahead (TritonRunner._first_launches): the kernel, the key
    its binary is looked up under, the Job that compiles that binary, the launch's constexprs, the
    count of its signature's arguments before them, and the variant."""

    kernel: Kernel
    key: object
    job: object
    consts: dict
    nfull: int
    variant: Variant


class _Unplanned(Exception):
    """A launch whose arguments are not all static: left to the launch."""


_KERNEL_CLASSES = {c.__name__: c for c in (Kernel, MixKernel, FinishKernel)}


def _fresh(node, args: tuple) -> tuple:
    """Positions among a kernel's `args` (its source's: ("buffer", name) or ("size", expr)) of the buffers
    `node` writes and does not read (`Kernel.fresh`). A kernel shared by code (`TritonRunner._kernel`) takes
    every node's buffers in the same roles at the same positions."""
    written, read = set(node.output_names()), set(node.read_names())
    return tuple(i for i, (kind, name) in enumerate(args) if kind == "buffer" and name in written and name not in read)


@attrs.frozen(eq=False)
class KernelMade:
    """What a Kernel is built from, derived from the graph alone (`TritonRunner._made_kernel`): the same for
    the same scheduled graph in every process, so kept with the graph cache's entry. `cls`: the Kernel class's
    name; `rw`: bytes read and bytes written (`node_bytes`; sympy where sizes are symbolic); `hinted`: bytes an
    element at the size hints where symbolic; `same`: `_same_code`; `key`: the kernel cache's key; `extra`: the
    class's own arguments (a mix-order kernel's split)."""

    kind: str
    cls: str
    variants: dict
    rw: tuple
    hinted: float | None
    contiguous: bool
    mutates: bool
    same: str
    key: str
    extra: dict

    @property
    def traffic(self):
        """Bytes read and written."""
        return self.rw[0] + self.rw[1]


@attrs.frozen(eq=False)
class StepMade:
    """What a graph step's kernels are built from (`TritonRunner._make`): "kernel" (one kernel, its variants'
    sources) or "mix" (the main and finishing kernels, the main kernel's source, the finishing node and
    source, the workspaces' layouts)."""

    kind: str
    kernels: tuple
    variants: dict | None = None
    main: object = None
    finish: object = None
    finish_source: object = None
    workspaces: dict | None = None


def made_key(interpret: bool, variant) -> str:
    """What a graph's `made` (kept with its graph-cache entry, whose key names the graph, the settings and
    passline's sources) depends on besides: the target (interpreter or GPU), a forced variant, the generator's
    source and Triton's version."""
    import triton

    return digest(__version__, interpret, str(variant), _SOURCE_HASH, triton.__version__)


_NAME = re.compile(r"[A-Za-z_]\w*")


def _anonymous(src) -> str:
    """A kernel's module text with its name and its parameters' names replaced by their positions: two
    nodes' kernels that differ only in the buffers they are handed (a model's repeated layers) read alike."""
    params = re.search(rf"def {re.escape(src.fn_name)}\((.*?)\):", src.source, re.S).group(1).split(",")
    names = {src.fn_name: "kernel", **{p.split(":")[0].strip(): f"a{i}" for i, p in enumerate(params)}}
    return _NAME.sub(lambda m: names.get(m.group(0), m.group(0)), src.source)


def _static(xnumel, rnumel) -> tuple | None:
    """(xnumel, rnumel) as ints where both are static and non-zero (a zero count launches nothing)."""
    try:
        xn, rn = int(xnumel), (int(rnumel) if rnumel is not None else None)
    except TypeError:
        return None
    return None if xn == 0 or rn == 0 else (xn, rn)


class TritonRunner:
    """Callable that runs the graph with generated Triton kernels: `runner(*inputs) -> outputs`."""

    def __init__(self, graph, interpret: bool, cache: KernelCache | None = None, variant: str = "auto",
                 autotune: bool = False, counters: collections.Counter | None = None, made: dict | None = None,
                 precompile: bool = True, bands: bool = True):
        """`precompile=False`: the binaries are not built here but by the caller's `precompile()` (the chooser
        builds several candidates' side by side), else at their first launch. `bands=False`: every kernel
        launches with its rule's configuration, none times configs.uncertain's band — the chooser's candidates,
        each run a few times to be timed as a whole: on an H200 a decompose-K candidate's column sum timed its
        band at its first run, about 0.1 s a candidate of the chooser's 0.6 s a node, for the same picks at
        eight weight-gradient shapes (fifty-seventh session); the chosen graph's kernels time theirs as ever."""
        from .wrapper import write_call

        self.graph = graph
        # this compile's figures (the report's metrics.counters where the backend passes them):
        # kernels_precompiled, binaries compiled and loaded before the first call; kernels_compiled_at_launch,
        # launches that found no such binary and went through JITFunction.run
        self.counters = collections.Counter() if counters is None else counters
        self.interpret = interpret
        self.autotune = autotune and not interpret
        self.bands = bands
        self.variant = None if variant == "auto" else variant
        self.cache = cache or KernelCache()
        self.device = Device() if interpret else Device.current()
        self.reference = ReferenceRunner(graph)
        self.buffers = graph.buffers()
        self.kernels: list[KernelInfo] = []
        self.fallbacks: dict = {}  # node name -> why it runs on the reference backend
        self._by_code: dict = {}  # _same_code -> Kernel: steps of repeated layers launch one kernel
        # node name -> StepMade: what each step was built from, `made` handed in by the caller (an earlier
        # compile's, for this very graph: `made_key`) or derived here; one naming a node this graph lacks was made
        # for another graph, and is not used at all
        names = {n.name for n in graph.nodes()}
        self._loaded = dict(made) if made and set(made) <= names else {}
        self.made_loaded, self.made = bool(self._loaded), {}
        self.steps = []
        for node in graph.nodes():
            if isinstance(node, Extern):
                self.steps.append(("extern", node, None))
                continue
            try:
                self.steps.append(self._compile(node))
            except Unsupported as e:
                self.fallbacks[node.name] = str(e)
                self.steps.append(("reference", node, None))
        self._binds: dict = {}  # dynamic shapes: recent bindings by their sizes (a training loop repeats them)
        self.source, self.call = write_call(self)
        self.compile_seconds = 0.0
        if precompile and self._builds_ahead:
            self.precompile()

    @property
    def _builds_ahead(self) -> bool:
        """Whether binaries are built before the first call: not on the interpreter, not with autotune=True
        (each candidate is compiled where it is timed)."""
        return not self.interpret and not self.autotune

    def precompile_jobs(self) -> list:
        """What `precompile` compiles, as `precompile.Job`s (pointer arguments by dtype, aligned as the
        call's own allocations are), planned without compiling: every binary the first call of a
        static-shape graph launches (`_first_launches`), a mix-order main kernel at the IR's split (on a
        GPU its first launch takes one whole wave of programs, from the registers of that binary:
        `precompile` compiles it first and plans the rest from it). Kernels of symbolic sizes are chosen
        and compiled per call."""
        jobs: dict = {}

        def listed(p: Planned | None):
            if p is not None:
                p.kernel.source_file(p.variant)  # its module at the job's path
                jobs.setdefault(p.job, None)
            return None  # nothing compiled: a mix-order kernel keeps the IR's split
        for step in self.steps:
            self._first_launches(step, listed)
        return list(jobs)

    def _first_launches(self, step, build, each=None) -> None:
        """Plan the launches the generated call makes of `step` on its first call, in order, for a static
        shape graph, and `build(planned)` each: compile it, or list it, and return the compiled kernel
        (or None). The plan takes every choice from the code the launch itself runs — `Kernel.config`
        (the rule), `MixKernel.placed` (the split), `MixStep.programs`, `Kernel.constexprs` (SPLIT,
        INT64, blocks, STAGES), `Kernel.binary_key` (the specialization checked per launch) and the
        call's own `wide=` conditions — so the binaries it builds are the ones the launches look up.

        A mix-order main kernel's split (one whole wave) follows from the registers of its binary at the
        IR's split, which only a GPU reports (`CompiledKernel._init_handles` loads it): the plan compiles
        that binary first, as the launch would, places the split from it and records the choice in the
        kernel (`choices`), so the launch takes the planned split instead of compiling to place its own;
        where nothing was compiled (a listing, a failure) the choice is left to the launch. A persistent
        configuration whose binary spills is replaced here as `Kernel._unspill` would after its first
        launch, so the first launch already takes the roomier one. Where the rule cannot decide
        (`configs.uncertain`), every configuration the first launch times is built, or only the choice an
        earlier process stored; a mix-order kernel's are built at the IR's split, placed from those
        binaries and built placed, with the finishing kernel each placement needs (`_plan_timed_mix`).
        Steps whose sizes are symbolic, or
        that run on the reference backend, are left to their launch. `each(planned)` builds several
        binaries of one kernel (the timed candidates), side by side where the caller can; by default one
        after another."""
        if each is None:
            def each(planned):
                return [build(p) for p in planned]
        kind, _, data = step
        if kind == "kernel":
            k, variants = data
            src = next(iter(variants.values()))
            sizes = _static(src.xnumel, src.rnumel)
            if sizes is None:
                return
            cands = k.uncertain(*sizes)
            if cands:  # timed at the first launch (Kernel._choose): each candidate built, or the stored choice
                saved = k.adopt_saved_choice(*sizes)
                each([self._planned(k, src, cfg, *sizes) for cfg in ([saved] if saved is not None else cands)])
                return
            for _ in range(8):  # the roomier configurations, at most doubling warps to MAX_WARPS
                cfg = k.config(*sizes)
                compiled = build(self._planned(k, src, cfg, *sizes))
                if compiled is None or not k._unspill(cfg, compiled, *sizes):
                    return
        elif kind == "mix":
            k_main, main, k_fin, fin_src, workspaces = data
            sizes = _static(main.xnumel, main.rnumel)
            if sizes is None:
                return
            rows, cols = sizes
            cands = k_main.uncertain(rows, cols)
            if cands:  # timed at the first launch (MixKernel._choose), or the stored choice alone
                self._plan_timed_mix(k_main, main, k_fin, fin_src, workspaces, cands, rows, cols, build, each)
                return
            if k_main._tuned():  # as MixKernel._choose: the split from the binary at the IR's split
                cfg = k_main._rule(rows, cols)
                compiled = build(self._planned(k_main, main, cfg, rows, cols, workspaces))
                placed = k_main.placed(cfg, compiled, rows, cols)
                if compiled is not None:  # compiled: the launch takes this split (a listing leaves it)
                    k_main.choices[k_main.bucket(rows, cols)] = placed
                cfg = placed
            else:
                cfg = k_main.config(rows, cols)
            build(self._planned(k_main, main, cfg, rows, cols, workspaces))
            n = MixStep.programs(rows, cfg)
            build(self._planned(k_fin, fin_src, k_fin.config(cols, n), cols, n, workspaces))

    def _plan_timed_mix(self, k_main, main, k_fin, fin_src, workspaces, cands, rows, cols, build, each) -> None:
        """`_first_launches` of a mix-order step whose main kernel times `cands` at its first launch
        (configs.uncertain's band): each candidate built at the IR's split (side by side), its whole-wave
        splits found from that binary as the timing finds them (recorded in `placements`, so the timing
        compiles nothing to place from), built at each (the timing tries the leaders at all of them,
        `MixKernel._fastest_split`), and the finishing kernel built for each of those programs counts;
        or, where an earlier process stored its choice, that choice (placed already) and its finishing
        kernel alone."""
        saved = k_main.adopt_saved_choice(rows, cols)
        if saved is not None:
            placed = [saved]
            build(self._planned(k_main, main, saved, rows, cols, workspaces))
        else:
            compiled = each([self._planned(k_main, main, c, rows, cols, workspaces) for c in cands])
            placed = list(cands)
            for c, comp in zip(cands, compiled):
                if comp is not None:  # compiled: the timing places it here (a listing leaves it to the launch)
                    splits = k_main.placements[rows, c] = tuple(k_main.waves(c, comp, rows, cols))
                    one = k_main._at_first(c, splits)  # as the timing places it, then what it may time again
                    placed += [one, *k_main.retimed(one, splits)]
            placed = list(dict.fromkeys(placed))
            moved = [p for p in placed if p not in cands]  # those off the IR's split
            if moved:
                each([self._planned(k_main, main, p, rows, cols, workspaces) for p in moved])
        for n in dict.fromkeys(MixStep.programs(rows, p) for p in placed):
            build(self._planned(k_fin, fin_src, k_fin.config(cols, n), cols, n, workspaces))

    def _planned(self, k: Kernel, src, cfg: Config, xnumel: int, rnumel: int | None, workspaces=None):
        """The launch of `k` at `cfg` the call makes, as a `Planned` (its binaries key, its Job), or None
        where an argument is not static. Pointers stand for aligned buffers (`_Aligned`); the index width
        is the call's own `wide=` condition, evaluated (static shapes: literals only)."""
        from .precompile import Job

        full, args = [], []
        try:
            for kind_, v in src.args:
                if kind_ == "buffer":
                    lay = self.buffers[v].layout if v in self.buffers else workspaces[v]
                    full.append(_Aligned())
                    args.append(("ptr", str(lay.dtype).removeprefix("torch.")))
                else:
                    full.append(int(v))
                    args.append(int(v))
            wide = bool(eval(k.wide_when, {"__builtins__": {}})) if k.wide_when else False  # noqa: S307
        except (TypeError, KeyError, NameError):  # symbols: chosen per call
            return None
        full += [xnumel] if rnumel is None else [xnumel, rnumel]
        args += [xnumel] if rnumel is None else [xnumel, rnumel]
        consts = k.constexprs(cfg, xnumel, rnumel, wide, tuple(full))
        # where its module will be (written there, and imported, only if the binary is compiled: `build`)
        path = self.cache.source_path(digest(k.key, cfg.variant))
        # the launch's keyword arguments (Kernel.launch): constexprs (SPLIT, INT64 too) and warps
        kwargs = tuple(sorted({**consts, "num_warps": cfg.warps}.items()))
        job = Job(str(path), k.info.variants[cfg.variant].fn_name, tuple(args), kwargs)
        return Planned(k, k.binary_key(cfg, consts, tuple(full)), job, consts, len(full), cfg.variant)

    def precompile(self) -> None:
        """Compile and load, before the first call, every binary its launches use (`_first_launches`), for
        this GPU, from threads of this process: each binary's launcher is built there too
        (`compat.load_binary`, the C launcher a cold Triton 3.6 builds with gcc) and handed to its kernel
        under the key its launch looks up, so the first launch neither compiles nor goes through
        `JITFunction.run`. A binary an earlier process compiled or loaded here is built straight from its
        Triton cache entry, which that process recorded (`compat.binary_record`, `load_recorded`): no import
        of its module, no cache key hashed again. With `compile_in="processes"` each thread hands every
        compile to a worker process of the pool (backends/triton/precompile.py), which compiles it into
        Triton's disk cache, where the thread then finds it: the plan's later stages too (a timed mix-order
        kernel's placements, built from the registers of its first binaries), 70 of GPT-2-style's backward's
        binaries against the 20-odd `precompile_jobs` lists. A progress line on stderr once it takes more
        than a second. Anything that fails here is left to its first launch, which compiles it there and
        reports any error. Nothing to do where the runner does not build ahead (`_builds_ahead`)."""
        import sys
        import time
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime.driver import driver

        from . import precompile
        from .precompile import default_threads, default_workers, mark_compiled, not_compiled_yet, remembered_triton_key

        how = current_settings().compile_in
        steps = [s for s in self.steps if s[0] in ("kernel", "mix")] if how != "off" and self._builds_ahead else []
        if not steps:
            return
        t0 = time.perf_counter()
        tkey = remembered_triton_key(self.cache.dir)  # Triton's key from an earlier process, not hashed again
        devices = {b.layout.device.index or 0 for b in self.buffers.values() if b.layout.device.type == "cuda"}
        device = next(iter(devices), None)
        target = stamp = workers = None  # stamp: what keys the records of the binaries (compat.binary_stamp)
        with contextlib.suppress(Exception):
            # the graph's GPU's, not the calling thread's current one (a thread of the chooser starts on GPU 0)
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                target = driver.active.get_current_target()
            stamp = compat.binary_stamp(target, tkey) if tkey else None
            if how == "processes":  # every compile in a worker process, outside this process's GIL
                workers = precompile.pool()
        done, shown = [0], [0.0]
        lock = threading.Lock()
        built: dict = {}  # Job -> (compiled, launch): each compiled and loaded once, whoever asks
        building: dict = {}  # Job -> the lock of the thread compiling it

        def progress(what: str):  # called from the pool's threads
            with lock:
                done[0] += 1
                now = time.perf_counter() - t0
                if now > 1.0 and now - shown[0] > 0.25:
                    shown[0] = now
                    print(f"\rpassline: compiled {done[0]} {what}", end="", file=sys.stderr, flush=True)

        def build(p: Planned | None):
            if p is None:
                raise _Unplanned
            with lock:
                one = building.setdefault(p.job, threading.Lock())
            with one:  # two steps needing the same binary (equal kernels): compiled once
                if p.job not in built:
                    # where an earlier process recorded this very compile's binary, built from its cache entry
                    rkey = stamp and digest(stamp, p.kernel.info.variants[p.variant].source, p.job.fn_name,
                                            p.job.args, p.job.kwargs)
                    compiled = compat.load_recorded(self.cache.get_binary(rkey)) if rkey else None
                    if compiled is not None:
                        with lock:
                            self.counters["binaries_loaded_by_record"] += 1
                    else:
                        p.kernel.source_file(p.variant)  # the module at the job's path, for a worker too
                        if workers is not None:  # compiled into Triton's cache by a worker: found there below
                            elsewhere(p.job)
                        fn = p.kernel.fn(p.variant)
                        compiled = compat.compile_for_launch(fn, [getattr(torch, a[1]) if isinstance(a, tuple)
                                                                  else a for a in p.job.args], dict(p.job.kwargs))
                        record = compat.binary_record(compiled) if rkey else None
                        if record is not None:
                            self.cache.put_binary(rkey, record)
                    built[p.job] = compiled, compat.load_binary(compiled)
                    progress("kernels")
                    if built[p.job][1] is not None:
                        with lock:  # each binary once, however many steps launch it
                            self.counters["kernels_precompiled"] += 1
            compiled, launch = built[p.job]
            if launch is not None:
                p.kernel.install(p.key, launch, p.consts, p.nfull, p.variant, compiled)
            return compiled

        def elsewhere(job):  # what no process compiled into this Triton cache before, by a worker
            with contextlib.suppress(Exception):  # no worker could take it: compiled in this thread, as with threads
                if not_compiled_yet([job], target, self.cache.dir) and workers.compile(job, target):
                    mark_compiled([job], target, self.cache.dir)

        def on_device(fn, *args):  # a launcher is loaded into the graph's device's context, from its thread
            if device is None:
                return fn(*args)
            with torch.cuda.device(device):
                return fn(*args)

        def each(planned: list):  # a kernel's candidates timed at its first launch: compiled side by side
            with ThreadPoolExecutor(max_workers=len(planned)) as side:
                return list(side.map(lambda p: on_device(build, p), planned))

        def plan(step):
            try:
                on_device(self._first_launches, step, build, each)
            except Exception:  # noqa: BLE001 - compiled (and reported) at its first launch instead
                pass

        try:
            # a thread per worker (each mostly waits on its compile), else per core (compiling, GIL-bound)
            threads = default_workers() if workers is not None else default_threads()
            with ThreadPoolExecutor(max_workers=min(threads, len(steps))) as pool:
                list(pool.map(plan, steps))
        except Exception:  # noqa: BLE001 - no pool here: every kernel compiles at its first launch
            pass
        self.compile_seconds = time.perf_counter() - t0
        if shown[0]:
            print(f" ({self.compile_seconds:.1f} s)", file=sys.stderr, flush=True)

    # -- compile ------------------------------------------------------------------------------------
    def _key(self, node, stored) -> str:
        # repr(members(node)), from each member's repr printed once: a leaf node is its only member, and
        # printing its body (sympy indices) is most of the key's cost
        leaves = [repr(m) for m in members(node)]
        own = leaves[0] if not isinstance(node, (FusedNode, MixOrderNode)) else repr(node)
        return digest(__version__, self.interpret, own, _tuple_repr(leaves),
                      repr(getattr(node, "ranges", None)), repr(getattr(node, "reduction_ranges", None)),
                      sorted(stored), _SOURCE_HASH)

    def _made_kernel(self, node, kind: str, variants: dict, stored, cls=Kernel, workspaces=None,
                     **extra) -> KernelMade:
        """What a Kernel of `node` is built from, derived from the graph alone (`KernelMade`)."""
        first = next(iter(variants.values()))
        # every variant takes the same arguments (kernel.ordered_args), so the wrapper passes one list
        variants = {v: src for v, src in variants.items() if src.args == first.args}
        r, w = node_bytes(self.graph, node) if not kind.startswith("mix_finish") else (0, 0)
        hinted = None
        if isinstance(r + w, sympy.Expr) and (r + w).free_symbols:  # bytes an element at the traced sizes
            points = first.xnumel * (first.rnumel if first.rnumel is not None else 1)
            total, count = at_hint(r + w, self.graph.hints), at_hint(points, self.graph.hints)
            hinted = total / count if total and count else None
        contiguous = kgen.rows_contiguous(node, self.graph.numels()) if kind == "reduction" else True
        # writes a graph input, or writes in place (a scatter's atomic adds): launched once a call, never timed
        mutates = bool(set(node.output_names()) & set(self.graph.input_buffers())) or bool(getattr(node, "mutates", ()))
        same = self._same_code(kind, cls, variants, extra, contiguous, mutates, r + w, hinted, workspaces or {})
        # the key names the sources themselves: the IR's repr omits dtypes a kernel's code depends on (a
        # scatter's float32 and float64 forms printed alike, and the float64 graph ran the cached float32
        # kernel: gradients at float32 precision)
        key = digest(self._key(node, stored), {str(v): src.source for v, src in variants.items()})
        return KernelMade(kind, cls.__name__, variants, (r, w), hinted, contiguous, mutates, same, key, extra)

    def _kernel(self, node, made: KernelMade) -> Kernel:
        """`made`'s Kernel: a new one, or the one an equal kernel of an earlier step built (`_same_code`)."""
        k = self._by_code.get(made.same)
        if k is not None:  # another layer's kernel: its binaries, choices and timings serve this step too
            k.info.shared.append(node.name)
            self.counters["kernels_shared"] += 1
            return k
        first = next(iter(made.variants.values()))
        info = KernelInfo(first.name, node.name, made.kind, made.variants)
        info.bytes = made.traffic
        self.kernels.append(info)
        cls = _KERNEL_CLASSES[made.cls]
        k = cls(info, self.cache, self.interpret, self.autotune, made.key, self.variant, self.device, made.contiguous,
                **made.extra)
        k.hinted_element_bytes = made.hinted
        k.bands = self.bands
        k.counters = self.counters  # its launches' figures go in this compile's report
        k.mutates = made.mutates
        k.fresh = _fresh(node, first.args)
        self._by_code[made.same] = k
        return k

    def _same_code(self, kind, cls, variants, extra, contiguous, mutates, traffic, hinted, workspaces) -> str:
        """What makes two nodes' kernels one: the same code up to the names of the kernel and its arguments
        (`_anonymous`), the same dtype at each pointer argument (Triton compiles a binary per pointer type,
        which the code does not show) and the same everything else the Kernel is built from. A model's
        layers repeat their kernels: GPT-2's four layers launched 52 backward kernels, each compiled (and
        the uncertain ones timed) on its own at the first call and loaded on its own in every process."""
        def dtype(name):
            lay = self.buffers[name].layout if name in self.buffers else workspaces.get(name)
            return str(lay.dtype) if lay is not None else name  # (unknown: the name keeps it apart)
        code = [(str(v), _anonymous(src), [("buffer", dtype(a)) if kind_ == "buffer" else (kind_, str(a))
                                           for kind_, a in src.args],
                 str(src.xnumel), str(src.rnumel), sorted(src.constants.items()), src.num_warps,
                 src.grid_per_program, src.int64, [str(e) for e in src.spans], src.checks, src.online, src.row_sums,
                 src.scalar_rows, src.window, src.window_writes, src.window_columns, src.window_by_rule,
                 src.window_classes, src.column_classes, src.window_itemsize)
                for v, src in variants.items()]
        return digest(kind, cls.__name__, sorted(extra.items()), contiguous, mutates, str(traffic), hinted, code)

    def _compile(self, node):
        """`node`'s step: its kernels built from what an earlier process derived from the same graph (`made`,
        kept with the graph cache's entry), or derived now (and kept in `self.made` for the next process)."""
        made = self._loaded.get(node.name)
        if made is None:
            made = self._make(node)
        else:  # its bytes as the compile that made it counted them (`node_bytes`: sympy), for the report
            known_node_bytes(self.graph, node, made.kernels[0].rw)
        self.made[node.name] = made
        if made.kind == "mix":
            k_main = self._kernel(node, made.kernels[0])
            k_fin = self._kernel(made.finish, made.kernels[1])
            # each step keeps its own sources: their arguments are its buffers (the kernels may be shared)
            return ("mix", node, (k_main, made.main, k_fin, made.finish_source, made.workspaces))
        return ("kernel", node, (self._kernel(node, made.kernels[0]), made.variants))

    def _make(self, node) -> StepMade:
        """What `node`'s step is built from, derived from the graph (sources generated, kernels' facts)."""
        if isinstance(node, MixOrderNode):
            bad = [m.reduction_type for m in node.column_reductions() if m.reduction_type != "sum"]
            if bad:
                raise Unsupported(f"mix-order column reduction {bad[0]}")
            blocks = {"XBLOCK": 1, "RBLOCK": 1, "SPLIT": int(node.split_rows)}
            # a node whose columns are tiled has that form only (its rows are too wide for a block); others
            # the whole-row forms, the two-dimensional one a multi-kernel candidate (on the CPU: when forced),
            # and where the row side is pointwise the tiled form too, on a GPU (the mix band's narrow blocks
            # of columns, configs._narrow_blocks) or when forced
            forms = (Variant.MIX_ORDER_TILED,) if node.tiled else (Variant.MIX_ORDER, Variant.MIX_ORDER_ACC2D)
            main, finish = kgen.generate_mix(node, self.graph, self.interpret, blocks, forms[0])
            if not node.tiled and not main.row_sums and (not self.interpret or self.variant == Variant.MIX_ORDER_TILED):
                forms += (Variant.MIX_ORDER_TILED,)
            variants = {forms[0]: main}
            for form in forms[1:]:
                variants[form] = kgen.generate_mix(node, self.graph, self.interpret, blocks, form)[0]
            stored = kgen._stored(node, self.graph)
            workspaces = kgen.workspace_layouts(node)
            # a node of one split has a finishing kernel that reads the workspace's one row (the sum over a
            # split of size 1 drops its index): another split's several rows would be summed as row 0 again
            one = node.n_splits == 1
            k_main = self._made_kernel(node, "mix_order", variants, stored, MixKernel, workspaces,
                                       split=int(node.split_rows), tune_split=node.tune_split and not one)
            fin_stored = kgen._stored(finish, self.graph) & set(finish.output_names())
            # the splits it sums follow the main kernel's SPLIT, chosen at the first launch
            fin_variants = self._variants(finish, fin_stored, frozenset({"rnumel"}))
            k_fin = self._made_kernel(finish, "mix_finish", fin_variants, fin_stored, FinishKernel, workspaces)
            return StepMade("mix", (k_main, k_fin), main=main, finish=finish,
                            finish_source=next(iter(fin_variants.values())), workspaces=workspaces)
        stored = kgen._stored(node, self.graph)
        variants = self._variants(node, stored)
        kind = "pointwise" if Variant.POINTWISE in variants else "reduction"
        return StepMade("kernel", (self._made_kernel(node, kind, variants, stored),), variants=variants)

    def _variants(self, node, stored, runtime: frozenset = frozenset()) -> dict:
        # the generator's own loop nest: a reduction over no dims (a 0-dim tensor's sum) still has one
        # reduction loop of size 1, so it is a reduction kernel with RBLOCK, not a pointwise one
        red = kgen._group(node)[2]
        if not red:
            return {Variant.POINTWISE: kgen.generate(node, self.graph, self.interpret, Variant.POINTWISE, {}, stored,
                                                     runtime)}
        return {v: kgen.generate(node, self.graph, self.interpret, v, {}, stored, runtime)
                for v in (Variant.PERSISTENT, Variant.LOOPED)}

    # -- run ----------------------------------------------------------------------------------------
    def bound(self, values: tuple) -> _Bindings:
        """The binding of this call's size values (those of `reference.sources`, in order), for what the
        generated call leaves to the reference backend or to sympy (nodes it could not generate, nodes
        with no points). A binding memoizes its sympy -> int conversions, so calls with sizes seen
        before reuse theirs (a training loop repeats a few)."""
        bind = self._binds.get(values)
        if bind is None:
            if len(self._binds) >= 16:
                self._binds.clear()
            bind = self._binds[values] = _Bindings.of(self.reference.sources, values)
        return bind

    def run_reference(self, node, env: dict, bind: _Bindings) -> dict:
        """Run `node`'s members on the reference backend: `env` holds what it reads; returns its outputs.
        Also how a node with no points is run: the reference allocates each member's output with its
        layout and writes a reduction's identity where rows exist but are empty."""
        for m in members(node):
            env[m.output.name] = self.reference._loop(m, env, bind)
        return env

    def __call__(self, *args):
        return self.call(list(args))

    def boxed(self, args: list):
        """aot_autograd's boxed convention: the generated call empties `args`, so each input the caller
        holds only there (a backward's saved activations) dies at its last use."""
        return self.call(args)


def _tuple_repr(items: list) -> str:
    """repr() of a tuple whose items' reprs are `items`."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _source_hash() -> str:
    """Generated code changes with the generator: its source is part of every cache key."""
    import inspect

    from . import kernel, printer

    return digest(inspect.getsource(kernel), inspect.getsource(printer))


_SOURCE_HASH = _source_hash()


def _choice_stamp() -> str:
    """What a stored choice (`Kernel._saved`) was timed and checked against (`_agreeing`) besides its kernel's code:
    the code that turns a configuration into a launch (configs, this module, compat), Triton's version and the
    compile options. A choice is reused without its check; one checked under another Triton, or before a change to
    how a configuration launches (the sixtieth session's WINDOW), is timed and checked again."""
    import inspect
    import sys

    import triton

    return digest(_SOURCE_HASH, inspect.getsource(sys.modules[__name__]), inspect.getsource(configs_module),
                  inspect.getsource(compat), triton.__version__, repr(compat.COMPILE_OPTIONS))


_CHOICE_STAMP = _choice_stamp()
