"""The Triton backend's wrapper: runs a SchedulerGraph with one generated kernel per node.

At compile time each kernel node gets its source (from the disk cache, or generated and cached). At the
first call, when sizes are known, each kernel picks its variant and block sizes: on a GPU by timing the
candidates (and remembering the winner on disk), under the CPU interpreter by a heuristic. Buffers are
allocated when first written, freed after their last use, and freed storage of the same size is reused.
A node the generator cannot handle runs on the reference backend, and the report says so.
"""
from __future__ import annotations

import math
import os

import attrs
import sympy
import torch

from ... import __version__
from ...ir import Extern, Layout, MixOrderNode
from ...pipeline.metrics import node_bytes
from ..reference import ReferenceRunner, _Bindings
from . import kernel as kgen
from .cache import KernelCache, digest, interpreting, load_kernel
from .printer import Unsupported

GPU_PERSISTENT_MAX = 16384  # elements of a reduced row kept in registers
INTERP_PERSISTENT_MAX = 1 << 16
INTERP_BLOCK = 1 << 17  # interpreter cost grows with programs x ops: few, large programs


def _warps(elements: int) -> tuple:
    """Warp counts to try for a block of `elements` reduced along rows: the usual one (about 8-16
    elements per thread) and half of it. Fewer warps per row means a cheaper cross-thread reduction: on
    an H200 a bfloat16 LayerNorm forward (576000, 384) ran at copy speed (212 µs) with 4 rows on 2 warps
    and 280 µs with the usual 4 warps."""
    w = 2 if elements <= 512 else 4 if elements <= 2048 else 8 if elements <= 8192 else 16
    return (w, w // 2) if w > 1 else (w,)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


MIX_STAGES = (3, 4)  # pipelined row loops timed on a GPU (1: not pipelined, the baseline)


def _mix_candidates(form: str, rb: int, split: int, interpret: bool) -> list:
    """(form, blocks, warps) for a mix-order kernel whose rows are `rb` (a power of two) wide.

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
        return form, {"XBLOCK": xb, "RBLOCK": rb, "SPLIT": split, "STAGES": stages}, w

    xbs = [xb for xb in (1, 2, 4, 8, 16) if xb <= _pow2(split)]
    if interpret:
        xb = max([x for x in xbs if x * rb <= INTERP_BLOCK] or [1])
        return [cand(xb, 4 if xb * rb <= 2048 else 8, 1)]
    configs = []  # (rows per block, warps)
    if form == "mix_order":
        usual = _warps(rb)
        configs += [(1, w) for w in dict.fromkeys(usual + (min(16, 2 * usual[0]),))]
        if 2 in xbs:  # 8 bf16 columns per thread per load (16 bytes): rb / 8 threads along a row
            configs += [(2, w) for w in (1, 2, 4, 8, 16) if 2 * rb <= 32 * 32 * w and rb // 8 >= 32 * w]
    else:
        configs += [(xb, w) for xb in xbs if 2 <= xb <= 8 and xb * rb <= 8192 for w in _warps(xb * rb)]
    out = [cand(xb, w, st) for xb, w in configs for st in MIX_STAGES]
    if form == "mix_order":
        out.append(cand(1, _warps(rb)[0], 1))
    return out


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
    timings: dict = attrs.Factory(dict)  # "variant blocks" -> seconds, when benchmarked

    @property
    def source(self) -> str:
        return self.variants[self.chosen or next(iter(self.variants))].source


class _Kernel:
    """A kernel node's variants, compiled lazily, with the block choice made at the first call."""

    def __init__(self, info: KernelInfo, cache: KernelCache, interpret: bool, gpu_tune: bool, key: str,
                 only: str | None = None):
        self.info, self.cache, self.interpret, self.gpu_tune, self.key = info, cache, interpret, gpu_tune, key
        self.only = only  # force one variant (persistent, looped, or a mix-order form) where it exists
        self.fns: dict = {}
        self.choices: dict = {}  # size bucket -> (variant, blocks, num_warps)
        self.choice = None  # the configuration of the latest launch

    def fn(self, variant: str):
        if variant not in self.fns:
            src = self.info.variants[variant]
            ckey = digest(self.key, variant)
            path = self.cache.get_source(ckey) or self.cache.put_source(ckey, src.source)
            self.fns[variant] = load_kernel(path, src.fn_name, self.interpret)
        return self.fns[variant]

    def candidates(self, xnumel: int, rnumel: int | None) -> list:
        out = []
        for variant, src in self.info.variants.items():
            if self.only in self.info.variants and variant != self.only:
                continue  # a forced variant, where this kernel has it
            if variant == "pointwise":
                if self.interpret:
                    out.append((variant, {"XBLOCK": min(_pow2(xnumel), INTERP_BLOCK)}, 4))
                else:
                    out += [(variant, {"XBLOCK": x}, w) for x, w in ((1024, 4), (2048, 8), (512, 4))]
            elif variant == "persistent":
                rb = _pow2(rnumel)
                if rb > (INTERP_PERSISTENT_MAX if self.interpret else GPU_PERSISTENT_MAX):
                    continue
                if self.interpret:
                    out.append((variant, {"XBLOCK": max(1, min(_pow2(xnumel), INTERP_BLOCK // rb)), "RBLOCK": rb}, 4))
                else:  # row blocks from one row per program to about 16k elements
                    for xb in (1, 2, 4, 8, 16, 32, 64):
                        if xb * rb <= 16384 and xb <= _pow2(xnumel) and (xb == 1 or xb * rb >= 512):
                            out += [(variant, {"XBLOCK": xb, "RBLOCK": rb}, w) for w in _warps(xb * rb)]
            elif variant == "looped":
                if self.interpret:
                    rb = min(_pow2(rnumel), 4096)
                    out.append((variant, {"XBLOCK": max(1, min(_pow2(xnumel), INTERP_BLOCK // rb)), "RBLOCK": rb}, 4))
                else:
                    # long rows: one row per program; reductions over a strided dim (columns): wide
                    # blocks of columns so that each load is coalesced
                    for xb, rb in ((1, 2048), (4, 512), (64, 64), (128, 32)):
                        if rb <= _pow2(rnumel) and xb <= _pow2(xnumel):
                            out.append((variant, {"XBLOCK": xb, "RBLOCK": rb}, 4 if xb * rb <= 1024 else 8))
                    if not any(c[0] == "looped" for c in out):
                        out.append((variant, {"XBLOCK": 1, "RBLOCK": min(2048, _pow2(rnumel))}, 4))
            elif variant.startswith("mix_order"):
                out += _mix_candidates(variant, _pow2(rnumel), src.constants["SPLIT"], self.interpret)
        if not out:  # rows too long to keep: only the looped form, whatever the heuristics say
            raise Unsupported("no kernel variant fits")
        if self.interpret:  # the interpreter's cost is per program and op: prefer persistent
            out.sort(key=lambda c: c[0] != "persistent")
            return out[:1]
        return out

    def launch(self, cand, args, xnumel: int, rnumel: int | None):
        """Launch variant `cand` = (variant, blocks, num_warps); `args(variant)` gives its arguments."""
        variant, blocks, warps = cand
        src = self.info.variants[variant]
        per = blocks[src.grid_per_program]
        grid = (max(1, math.ceil(xnumel / per)),)
        extra = [xnumel] + ([rnumel] if rnumel is not None else [])
        with interpreting(self.interpret):
            return self.fn(variant)[grid](*args(variant), *extra, **blocks, num_warps=warps)

    @staticmethod
    def bucket(xnumel: int, rnumel: int | None) -> tuple:
        """Sizes that share one configuration: the same powers of two. A persistent or mix-order kernel's
        RBLOCK holds a whole row, so under dynamic shapes a longer row must get a choice of its own
        (reusing the first call's read past RBLOCK's end: wrong values at the second sequence length)."""
        return _pow2(xnumel), (_pow2(rnumel) if rnumel is not None else None)

    def chosen(self, xnumel: int, rnumel: int | None):
        """The configuration already chosen for these sizes, or None."""
        return self.choices.get(self.bucket(xnumel, rnumel))

    def run(self, args, xnumel: int, rnumel: int | None, after=None):
        """Launch the configuration chosen for these sizes (chosen now at their first call); `after(cand)`,
        where given, runs right after each timed candidate (a mix-order kernel's finishing kernel)."""
        key = self.bucket(xnumel, rnumel)
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = self._choose(args, xnumel, rnumel, after)
        if choice is not self.choice:
            self.choice = choice
            self.info.chosen, self.info.blocks = choice[0], dict(choice[1], num_warps=choice[2])
        self.launch(choice, args, xnumel, rnumel)

    def _choose(self, args, xnumel, rnumel, after=None):
        cands = self.candidates(xnumel, rnumel)
        if len(cands) == 1 or not self.gpu_tune:
            return cands[0]
        return self._remembered(digest(self.key, xnumel, rnumel, torch.cuda.get_device_name()), lambda: self._best(
            self._leaders(self._time(cands, args, xnumel, rnumel)), args, xnumel, rnumel))

    def _remembered(self, ckey: str, pick):
        """The choice stored on disk under `ckey`, or `pick()`'s, stored."""
        saved = self.cache.get_choice(ckey)
        if saved is not None:
            return saved["variant"], saved["blocks"], saved["num_warps"]
        best = pick()
        self.cache.put_choice(ckey, {"variant": best[0], "blocks": best[1], "num_warps": best[2]})
        return best

    def _bench(self, c, args, xnumel, rnumel, after=None, rep: int = 20) -> float:
        from triton.testing import do_bench

        def go():
            self.launch(c, args, xnumel, rnumel)
            if after is not None:
                after(c)
        return do_bench(go, warmup=5, rep=rep, return_mode="median")

    def _time(self, cands, args, xnumel, rnumel, after=None, place=None) -> list:
        """[(seconds, candidate)], fastest first; a configuration that does not compile (too many
        registers) is no candidate. `place(candidate, compiled)`, where given, gives the candidate to time
        once its kernel is compiled (a mix-order kernel's split, from its registers)."""
        timed = []
        for c in cands:
            try:
                compiled = self.launch(c, args, xnumel, rnumel)
                c = place(c, compiled) if place is not None else c
                t = self._bench(c, args, xnumel, rnumel, after)
            except Exception as e:
                self.info.timings[f"{c[0]} {c[1]}"] = repr(e)[:80]
                continue
            regs = f" regs={getattr(compiled, 'n_regs', '?')} spills={getattr(compiled, 'n_spills', '?')}"
            self.info.timings[f"{c[0]} {c[1]} w{c[2]}{regs}" + (" +finish" if after else "")] = t
            timed.append((t, c))
        if not timed:
            raise RuntimeError(f"no kernel configuration of {self.info.name} ran")
        return sorted(timed, key=lambda tc: tc[0])

    @staticmethod
    def _leaders(timed: list) -> list:
        return [c for t, c in timed[:3] if t <= 1.1 * timed[0][0]]

    def _best(self, leaders, args, xnumel, rnumel, after=None):
        """The first timing pass is short and near-equal configurations swap places from run to run:
        the leaders are timed again, longer and interleaved, and the best median of those runs wins."""
        if len(leaders) == 1:
            return leaders[0]
        again = {i: [] for i in range(len(leaders))}
        for _ in range(3):
            for i, c in enumerate(leaders):
                again[i].append(self._bench(c, args, xnumel, rnumel, after, rep=30))
        return leaders[min(again, key=lambda i: sorted(again[i])[1])]


MAX_PROGRAMS_PER_SM = 32  # resident blocks per SM on recent NVIDIA GPUs: the most a split may ask for


def _resident(regs: int, warps: int, smem: int = 0) -> int:
    """Programs of `warps` warps using `regs` registers a thread and `smem` bytes of shared memory that
    one SM holds at once."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    max_warps = getattr(props, "max_threads_per_multi_processor", 2048) // 32
    per_warp = -(-regs * 32 // 256) * 256  # registers are given to a warp 256 at a time
    # the shared memory an SM has (228 KiB on Hopper), 1 KiB of it reserved per program
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (smem + 1024)
    return max(1, min(MAX_PROGRAMS_PER_SM, max_warps // warps, per_sm // (per_warp * warps), by_smem))


class _MixKernel(_Kernel):
    """A mix-order kernel, whose rows per program (SPLIT, a run-time argument) is chosen with its
    configuration when the node allows it (`MixOrderNode.tune_split`). Each configuration is timed at
    one whole wave — as many programs as all SMs hold at once, from the compiled kernel's registers, warps
    and shared memory — and the leaders again at the IR's split and two to four whole waves, each time
    followed by the finishing kernel, which sums one workspace row per program. (Timed first at the IR's
    split, the configurations that win at a whole wave were sometimes not among the leaders: 350 or 362
    µs from one run to the next, bfloat16 LayerNorm backward (576000, 384).) On an H200, bfloat16
    LayerNorm backward (576000, 384) with the loads of the next rows held in registers (two rows a block,
    two warps, 8 programs per SM) took 413 µs at 128 rows per program (4500 programs: four waves of 1056
    and a fifth a quarter full) and 385 µs at 546 (one wave); not rounded to a multiple of 16 (which
    Triton specializes on): 560 rows took 396 µs. With the loads pipelined through shared memory the
    split matters less (four rows on two warps, 4 per SM: 329, 330 and 332 µs at one, two and three
    waves), and fewer, longer programs still make the finishing kernel cheaper."""

    def __init__(self, *a, split: int, tune_split: bool, **kw):
        super().__init__(*a, **kw)
        self.split, self.tune_split = split, tune_split

    def _tuned(self) -> bool:
        return not self.interpret and self.gpu_tune and self.tune_split

    def _floor(self, xnumel: int) -> int:
        """The smallest split tried: at most MAX_PROGRAMS_PER_SM programs per SM, never under 16 rows
        (tiny blocks make huge workspaces)."""
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return max(16, math.ceil(xnumel / (sms * MAX_PROGRAMS_PER_SM)))

    def splits(self, xnumel: int, compiled, warps: int) -> list[int]:
        """The splits that give one to four whole waves of programs (the first: one wave), from what the
        compiled kernel says of its registers (64, a common figure, if this Triton does not) and its
        shared memory (the pipelined loads' buffers); those under the smallest split allowed are left out."""
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        regs = getattr(compiled, "n_regs", 0) or 64
        smem = getattr(getattr(compiled, "metadata", None), "shared", 0) or 0
        wave = sms * _resident(regs, warps, smem)
        floor = self._floor(xnumel)
        return [s for s in dict.fromkeys(math.ceil(xnumel / (wave * k)) for k in (1, 2, 3, 4)) if s >= floor]

    def workspace_rows(self, xnumel: int) -> int:
        """Rows of each workspace: one per program at the smallest split that may be tried."""
        smallest = min(self.split, self._floor(xnumel)) if self._tuned() else self.split
        return max(1, math.ceil(xnumel / smallest))

    def _choose(self, args, xnumel, rnumel, after=None):
        if not self._tuned():
            return super()._choose(args, xnumel, rnumel)
        ckey = digest(self.key, xnumel, rnumel, torch.cuda.get_device_name(), "split")
        return self._remembered(ckey, lambda: self._pick_split(args, xnumel, rnumel, after))

    def _pick_split(self, args, xnumel, rnumel, after):
        """Each configuration timed at one whole wave of its programs, the leaders again at the IR's split
        and two to four whole waves; the finishing kernel is timed after each."""
        waves: dict = {}  # configuration (split left out) -> its whole-wave splits

        def config(c) -> tuple:
            return c[0], tuple((k, x) for k, x in c[1].items() if k != "SPLIT"), c[2]

        def one_wave(c, compiled):
            waves[config(c)] = self.splits(xnumel, compiled, c[2])
            return c[0], dict(c[1], SPLIT=(waves[config(c)] or [self.split])[0]), c[2]

        first = self._time(self.candidates(xnumel, rnumel), args, xnumel, rnumel, after, one_wave)
        leaders = self._leaders(first)
        timed = [(t, c) for t, c in first if c in leaders]  # each leader's one-wave time is kept
        for v, b, w in leaders:
            for split in dict.fromkeys([self.split] + waves[config((v, b, w))]):
                if split != b["SPLIT"] and b["XBLOCK"] <= split:
                    c = (v, dict(b, SPLIT=split), w)
                    t = self._bench(c, args, xnumel, rnumel, after)
                    self.info.timings[f"{v} {c[1]} w{w} +finish"] = t
                    timed.append((t, c))
        return self._best(self._leaders(sorted(timed, key=lambda tc: tc[0])), args, xnumel, rnumel, after)


class TritonRunner:
    """Callable that runs the graph with generated Triton kernels: `runner(*inputs) -> outputs`."""

    def __init__(self, graph, interpret: bool, cache: KernelCache | None = None, variant: str = "auto"):
        self.graph = graph
        self.interpret = interpret
        self.variant = None if variant == "auto" else variant
        self.cache = cache or KernelCache()
        self.reference = ReferenceRunner(graph)
        self.buffers = graph.buffers()
        self.kernels: list[KernelInfo] = []
        self.fallbacks: dict = {}  # node name -> why it runs on the reference backend
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
        self._plan_memory()
        self._bind = None  # static shapes: the first call's binding, reused by every call
        self._binds: dict = {}  # dynamic shapes: recent bindings by their sizes (a training loop repeats them)
        self._ws_layouts: dict = {}  # (mix kernel, rows) -> its workspaces' layouts

    # -- compile ------------------------------------------------------------------------------------
    def _key(self, node, stored) -> str:
        from . import kernel, printer

        return digest(__version__, self.interpret, repr(node), repr(node.members() if hasattr(node, "members") else node),
                      repr(getattr(node, "ranges", None)), repr(getattr(node, "reduction_ranges", None)),
                      sorted(stored), _SOURCE_HASH)

    def _kernel(self, node, kind: str, variants: dict, stored, cls=_Kernel, **extra) -> _Kernel:
        info = KernelInfo(next(iter(variants.values())).name, node.name, kind, variants)
        r, w = node_bytes(self.graph, node) if not kind.startswith("mix_finish") else (0, 0)
        info.bytes = r + w
        self.kernels.append(info)
        # PASSLINE_AUTOTUNE=0: take each kernel's first candidate instead of timing them (quick GPU checks)
        gpu_tune = not self.interpret and os.environ.get("PASSLINE_AUTOTUNE", "1") != "0"
        return cls(info, self.cache, self.interpret, gpu_tune, self._key(node, stored), self.variant, **extra)

    def _compile(self, node):
        if isinstance(node, MixOrderNode):
            bad = [m.reduction_type for m in node.column_reductions() if m.reduction_type != "sum"]
            if bad:
                raise Unsupported(f"mix-order column reduction {bad[0]}")
            blocks = {"XBLOCK": 1, "RBLOCK": 1, "SPLIT": int(node.split_rows)}
            main, finish = kgen.generate_mix(node, self.graph, self.interpret, blocks)
            variants = {"mix_order": main}
            for form in kgen.MIX_FORMS[1:]:  # more multi-kernel candidates (on the CPU: when forced)
                variants[form] = kgen.generate_mix(node, self.graph, self.interpret, blocks, form)[0]
            stored = kgen._stored(node, self.graph)
            k_main = self._kernel(node, "mix_order", variants, stored, _MixKernel, split=int(node.split_rows),
                                  tune_split=node.tune_split)
            fin_stored = kgen._stored(finish, self.graph) & set(finish.output_names())
            k_fin = self._kernel(finish, "mix_finish", self._variants(finish, fin_stored), fin_stored)
            return ("mix", node, (k_main, main, k_fin, finish, kgen.workspace_layouts(node)))
        stored = kgen._stored(node, self.graph)
        variants = self._variants(node, stored)
        k = self._kernel(node, "pointwise" if "pointwise" in variants else "reduction", variants, stored)
        return ("kernel", node, (k, variants))

    def _variants(self, node, stored) -> dict:
        red = getattr(node, "reduction_ranges", ())
        if not red:
            return {"pointwise": kgen.generate(node, self.graph, self.interpret, "pointwise", {}, stored)}
        return {v: kgen.generate(node, self.graph, self.interpret, v, {}, stored) for v in ("persistent", "looped")}

    # -- memory -------------------------------------------------------------------------------------
    def _plan_memory(self) -> None:
        keep = self.graph.output_names() | set(self.graph.input_buffers())
        last: dict = {}
        for k, (_, node, _) in enumerate(self.steps):
            for b in node.read_names():
                last[b] = k
        self.free_after: dict = {}
        for b, k in last.items():
            if b not in keep:
                self.free_after.setdefault(k, []).append(b)

    def _alloc(self, layout, bind: _Bindings, pool: dict, owned: dict, name: str):
        plan = bind.plans.get(name)  # a binding is reused for the same sizes: so is its plan
        if plan is None:
            size, stride = bind.ints(layout.size), bind.ints(layout.stride)
            span = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
            plan = bind.plans[name] = size, stride, span * layout.dtype.itemsize
        size, stride, nbytes = plan
        if not nbytes:
            return torch.empty_strided(size, stride, dtype=layout.dtype, device=layout.device)
        key = (layout.device, nbytes)
        flat = pool[key].pop() if pool.get(key) else torch.empty(nbytes, dtype=torch.uint8, device=layout.device)
        owned[name] = key, flat
        return flat.view(layout.dtype).as_strided(size, stride)

    def _release(self, name: str, env: dict, pool: dict, owned: dict) -> None:
        env.pop(name, None)
        if name in owned:
            key, flat = owned.pop(name)
            pool.setdefault(key, []).append(flat)

    # -- run ----------------------------------------------------------------------------------------
    def _binding(self, args) -> _Bindings:
        """The sizes of this call. A binding memoizes its sympy -> int conversions, so calls with sizes
        seen before reuse theirs instead of evaluating every size expression again."""
        bind = _Bindings(self.graph, args)
        if not bind.values:
            self._bind = bind
            return bind
        key = tuple(bind.values.items())
        if key not in self._binds and len(self._binds) >= 16:
            self._binds.clear()
        return self._binds.setdefault(key, bind)

    def __call__(self, *args):
        # static shapes (nothing to bind): one binding for every call, its sympy -> int conversions
        # memoized (the wrapper's Python time runs before the first kernel and between kernels)
        bind = self._bind or self._binding(args)
        env: dict = {}
        pool: dict = {}
        owned: dict = {}
        for inp, arg in zip(self.graph.inputs, args):
            if inp.buffer is not None:
                env[inp.name] = arg
        for k, (kind, node, data) in enumerate(self.steps):
            if kind == "extern":
                self.reference._extern(node, env, bind)
            elif kind == "reference":
                for m in node.members() if hasattr(node, "members") else (node,):
                    env[m.output.name] = self.reference._loop(m, env, bind)
            elif kind == "kernel":
                k_obj, _ = data
                self._launch(k_obj, node, env, bind, pool, owned)
            else:
                k_main, main, k_fin, finish, workspaces = data
                rows = bind.int(main.xnumel)
                for name, layout in self._workspaces(k_main, workspaces, rows).items():
                    env[name] = self._alloc(layout, bind, pool, owned, name)
                after = None
                if k_main.chosen(rows, bind.int(main.rnumel)) is None:
                    # being tuned: each candidate is timed with the finish after it
                    fin_args, ncols = self._args(k_fin, env, bind, pool, owned), bind.int(finish.numel)

                    def after(cand):  # the finish's first candidate, for the candidate's program count
                        n = max(1, math.ceil(rows / cand[1]["SPLIT"]))
                        k_fin.launch(k_fin.candidates(ncols, n)[0], fin_args, ncols, n)

                self._launch(k_main, node, env, bind, pool, owned, after=after)
                split = k_main.choice[1]["SPLIT"] if k_main.choice else k_main.split
                self._launch(k_fin, finish, env, bind, pool, owned, rnumel=max(1, math.ceil(rows / split)))
                for name in workspaces:
                    self._release(name, env, pool, owned)
            for b in self.free_after.get(k, ()):
                self._release(b, env, pool, owned)
        return [self.reference._output(o, env, bind) for o in self.graph.outputs]

    def _workspaces(self, k_main: "_MixKernel", workspaces: dict, rows: int) -> dict:
        """Name -> Layout [programs, columns] of a mix-order node's workspaces for `rows` rows (the split
        is chosen at run time); built once per row count, off the per-call path."""
        key = (k_main.info.name, rows)
        if key not in self._ws_layouts:
            n = k_main.workspace_rows(rows)
            self._ws_layouts[key] = {name: Layout.contiguous([n, layout.size[1]], layout.dtype, layout.device)
                                     for name, layout in workspaces.items()}
        return self._ws_layouts[key]

    def _args(self, k: _Kernel, env, bind: _Bindings, pool, owned):
        """`args(variant)`: the kernel's arguments, allocating outputs on first use."""
        def args(variant: str) -> list:
            out = []
            for kind, value in k.info.variants[variant].args:
                if kind == "buffer":
                    if value not in env:
                        env[value] = self._alloc(self.buffers[value].layout, bind, pool, owned, value)
                    out.append(env[value])
                else:
                    out.append(bind.int(value))
            return out
        return args

    def _launch(self, k: _Kernel, node, env, bind: _Bindings, pool, owned, rnumel: int | None = None,
                after=None) -> None:
        src = next(iter(k.info.variants.values()))
        xnumel = bind.int(src.xnumel)
        if rnumel is None:
            rnumel = bind.int(src.rnumel) if src.rnumel is not None else None
        if xnumel == 0 or rnumel == 0:
            if rnumel == 0:  # an empty reduction: the reference backend knows each identity
                for m in node.members() if hasattr(node, "members") else (node,):
                    env[m.output.name] = self.reference._loop(m, env, bind)
            return
        k.run(self._args(k, env, bind, pool, owned), xnumel, rnumel, after)


def _source_hash() -> str:
    """Generated code changes with the generator: its source is part of every cache key."""
    import inspect

    from . import kernel, printer

    return digest(inspect.getsource(kernel), inspect.getsource(printer))


_SOURCE_HASH = _source_hash()
