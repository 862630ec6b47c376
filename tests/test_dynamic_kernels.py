"""Dynamic-shape kernels compile like their static twins (issue 20): the index width is chosen per launch
from the call's sizes (int32 offsets whenever they fit, as a static kernel of those sizes has; int64 when a
buffer or the points reached pass 2^31 - 1), and run-time sizes cost one division each in the index math.

The PTX tests compile passline's GPU kernels for sm_90 on this machine (Triton needs no GPU to compile),
with the specialization and constexprs the launch would use, and compare the dynamic kernels with the
static ones. The other tests run the interpreter at sizes that break divisibility, against eager."""
import re
from collections import Counter

import pytest
import sympy
import torch
from modules import MIXED

import passline
from passline.backends.reference import _Bindings, size_sources
from passline.backends.triton import kernel as kgen
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.runner import TritonRunner
from passline.ir import MixOrderNode

# -- PTX: the dynamic kernels against the static ones ----------------------------------------------------


def _training_reports(fn, x, dynamic: bool) -> list:
    """The compile reports (graphs captured, reference codegen) of fn's training step on x (its forward
    alone where x does not require grad)."""
    # MIXED: a norm's backward mixed however few its rows, whichever target plans it (PASSLINE_TEST_TARGET)
    be = passline.backend(codegen="reference", fallback="raise", capture=True, pipeline=MIXED)
    torch._dynamo.reset()
    out = torch.compile(fn, backend=be, dynamic=dynamic)(x)
    if x.requires_grad:
        out.float().square().mean().backward()
    return be.reports


def _gpu_kernels(fn, x, dynamic: bool, tmp_path, monkeypatch, split: int = 64) -> dict:
    """{kernel name: PTX} for the sm_90 kernels of fn's training step (forward and backward), generated for
    the GPU from graphs traced on the CPU, each compiled with the configuration its rule picks at x's sizes
    and what the launch passes (pointer alignment, integer divisibility, constexprs: INT64 included). A
    mix-order kernel takes `split` rows per program (the split is chosen on a GPU). Compiled by passline's
    precompile workers: processes that import Triton afresh, for the GPU (this one may have imported it
    for the interpreter, and then cannot compile for a GPU)."""
    from triton.backends.compiler import GPUTarget

    from passline.backends.triton.cache import digest
    from passline.backends.triton.precompile import Job, Pool

    jobs = {}
    for report in _training_reports(fn, x, dynamic):
        runner = TritonRunner(report.graph, interpret=False, cache=KernelCache(tmp_path / "passline"))
        bind = _Bindings.read(size_sources(report.graph), report.inputs)
        for kind, _, data in runner.steps:
            if kind not in ("kernel", "mix"):
                continue
            layouts = {name: b.layout for name, b in runner.buffers.items()} | (data[4] if kind == "mix" else {})
            first = next(iter(data[0].info.variants.values()))
            counts = bind.int(first.xnumel), None if first.rnumel is None else bind.int(first.rnumel)
            launches = [(data[0], counts)]
            if kind == "mix":  # the main kernel, then the finishing one: a workspace row per main program
                launches = [(data[0], counts), (data[2], (counts[1], -(-counts[0] // split)))]
            for k, (xn, rn) in launches:
                cfg = k._rule(xn, rn)
                if k.info.kind == "mix_order":
                    cfg = cfg.with_split(split)
                src = k.info.variants[cfg.variant]
                k.fn(cfg.variant)  # writes its source file
                args = [bind.int(v) if what == "size" else ("ptr", str(layouts[v].dtype).removeprefix("torch."))
                        for what, v in src.args]
                kwargs = {**k.constexprs(cfg, xn, rn), "num_warps": cfg.warps}
                path = runner.cache.source_path(digest(k.key, cfg.variant))
                assert src.fn_name not in jobs
                jobs[src.fn_name] = Job(str(path), src.fn_name, (*args, xn, *([rn] if rn is not None else [])),
                                        tuple(sorted(kwargs.items())))
    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))  # the workers' (started by this pool)
    pool = Pool(2)
    try:
        assert all(pool.run(list(jobs.values()), GPUTarget("cuda", 90, 32)))
    finally:
        pool.close()
    out = {}
    for name in jobs:
        (ptx,) = cache.glob(f"*/{name}.ptx")
        out[name] = ptx.read_text()
    return out


def _count(ptx: str, pattern: str) -> int:
    return len(re.findall(pattern, ptx))


def _ops64(ptx: str) -> Counter:
    """The kernel's instructions on 64-bit operands, by opcode (address and index arithmetic, compares)."""
    return Counter(op for op in re.findall(r"^\s+([a-z][\w.]*)", ptx, re.M) if re.search(r"\.[bsu]64\b", op))


@pytest.fixture
def gpu_compile(tmp_path, monkeypatch):
    """What _gpu_kernels needs: runners built for the GPU on the CPU, nothing compiled while they are made;
    skipped where this Triton has no CUDA backend to compile with."""
    monkeypatch.setattr(TritonRunner, "precompile", lambda self: None)
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Triton cannot compile for CUDA here: {e}")
    return lambda fn, x, dynamic, name: _gpu_kernels(fn, x, dynamic, tmp_path / name, monkeypatch)


# vector loads and stores, integer divisions in 64 bits
VECTOR = {"ld.v4": r"ld\.global[.\w]*\.v4", "st.v4": r"st\.global[.\w]*\.v4"}
DIV64 = r"\b(?:div|rem)\.[su]64\b"


@pytest.mark.parametrize("rows, width", [(255, 200)])
def test_dynamic_layer_norm_kernels_compile_like_static_ones(gpu_compile, rows, width):
    # the static kernels have their sizes written in; the dynamic ones take them as arguments, which the
    # launch specializes (divisible by 16 or not), and now compute their offsets in int32 as the static
    # kernels do: the same vector accesses and the same 64-bit instructions (pointer arithmetic), opcode
    # for opcode. Before, every dynamic kernel computed its offsets in 64 bits (at 32768 x 1024 the
    # mix-order backward took 255 registers a thread against the static kernel's 235)
    ln = torch.nn.LayerNorm(width).to(torch.bfloat16)
    x = torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True)
    static = gpu_compile(ln, x, False, "static")
    dynamic = gpu_compile(ln, x, True, "dynamic")
    assert sorted(static) == sorted(dynamic) and len(static) == 3  # forward, mix-order main and finish
    for name, ptx in dynamic.items():
        for what, pattern in VECTOR.items():
            assert _count(ptx, pattern) == _count(static[name], pattern), (name, what)
        assert _ops64(ptx) == _ops64(static[name]), name
        assert _count(ptx, DIV64) == 0, name


def test_run_time_sizes_divide_once_each(gpu_compile):
    # a head split and transpose over a symbolic batch and sequence: the copies walk (b, 4, t, 16) and
    # (b, t, 4, 16) in their outputs' order, so each flat index is split by the run-time t. Static sizes
    # divide by constants (multiplications); run-time ones chain their quotients: one 32-bit division by
    # t, its remainder from the same quotient (before: 64-bit divisions by 64*t and by t, and modulos)
    def heads(x):
        b, t, d = x.shape
        return x.view(b, t, 4, 16).transpose(1, 2).contiguous() * 2

    x = torch.randn(3, 40, 64, requires_grad=True)
    dynamic = gpu_compile(heads, x, True, "dynamic")
    transposing = [ptx for ptx in dynamic.values() if _count(ptx, r"\bdiv\.[su]32\b")]
    assert len(transposing) == 2, "the forward and backward transposes divide by the run-time t"
    for ptx in dynamic.values():
        assert _count(ptx, DIV64) == 0
        assert _count(ptx, r"\b(?:div|rem)\.[su]32\b") <= 2  # a division by t, and at most its remainder


# -- the per-launch width: chosen from the call's sizes, never int32 past int32 ----------------------------


def test_index_width_follows_the_launch(monkeypatch):
    # with the int32 limit lowered to 100 elements, the same compiled graph launches its kernels with int32
    # offsets at small sizes and int64 ones past the limit, and is right at both
    be = passline.backend(codegen="triton", fallback="raise")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kgen, "INT32_OFFSETS", 100)
    seen = []
    constexprs = TritonRunner.__init__.__globals__["Kernel"].constexprs

    def spy(self, cfg, xnumel, rnumel, full=()):
        out = constexprs(self, cfg, xnumel, rnumel, full=full)
        seen.append((xnumel, rnumel, out.get("INT64")))
        return out

    monkeypatch.setattr(TritonRunner.__init__.__globals__["Kernel"], "constexprs", spy)
    f = torch.compile(lambda x: (x * 2).sum(-1), backend=be, dynamic=True)
    for rows in (3, 30):
        x = torch.randn(rows, 7)
        torch.testing.assert_close(f(x), (x * 2).sum(-1))
    assert [w for _, _, w in seen] == [False, True]  # 3 x 7 points fit; 30 x 7 do not
    assert "INT64: tl.constexpr" in be.reports[0].kernel_info[0].source


def test_a_span_past_int32_makes_the_launch_wide(monkeypatch):
    # x[:, :4] reads 4 columns of each row: its kernel has rows x 4 points but reads a buffer spanning
    # rows x width elements, which only the call's sizes bound. The generated call passes that condition
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    be = passline.backend(codegen="triton", fallback="raise")
    f = torch.compile(lambda x: x[:, :4] * 2, backend=be, dynamic=True)
    x = torch.randn(5, 9)
    torch.testing.assert_close(f(x), x[:, :4] * 2)
    source = be.reports[0].runner.source
    (cond,) = re.findall(r"wide=(.*)\)$", source, re.M)
    names = set(re.findall(r"\bs_\w+", cond))
    assert names and not eval(cond, {n: 5 for n in names})
    assert eval(cond, {n: 50_000 for n in names})  # 50000 x 50000 elements: past int32


def test_torch_size_functions_are_python_arithmetic_in_the_call(monkeypatch):
    # a strided conv's output size is torch's FloorDiv ((h - 1)//2 + 1): the generated call computes it
    # as Python ints, not through sympy per call (bind.int: ~10 µs a step of a dynamic ResNet stem),
    # and gets it right at every size
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(3, 2, 1))
    be = passline.backend(codegen="triton", fallback="raise")
    f = torch.compile(model, backend=be, dynamic=True)
    for h, w in ((9, 12), (16, 7)):
        x = torch.randn(2, 3, h, w)
        torch.testing.assert_close(f(x), model(x))
    sources = [r.runner.source for r in be.reports]
    assert any("//" in s for s in sources)
    assert not any("bind." in s for s in sources)


# -- correctness at sizes that break divisibility, dynamic=True, forward and backward ---------------------


def _train_like_eager(make, shapes, dtype=torch.float32):
    torch.manual_seed(0)
    model = make()
    be = passline.backend(codegen="triton", fallback="raise", pipeline=MIXED)
    compiled = torch.compile(model, backend=be, dynamic=True)
    for shape in shapes:
        x = torch.randn(*shape, dtype=dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = compiled(xa), model(xb)
        torch.testing.assert_close(ya, yb, **passline.testing.tolerance(dtype))
        (ya.float().square().mean()).backward()
        (yb.float().square().mean()).backward()
        torch.testing.assert_close(xa.grad, xb.grad, **passline.testing.tolerance(dtype))
    return be


@pytest.mark.parametrize("width", [37, 48])
def test_dynamic_layer_norm_at_odd_sizes_matches_eager(monkeypatch, width):
    # rows 5, 19, 33 (none divisible by 16) and an odd or a 16-divisible width; one compile for all sizes
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    be = _train_like_eager(lambda: torch.nn.LayerNorm(width), [(5, width), (19, width), (33, width)])
    assert len(be.reports) == 2  # forward and backward, compiled once
    assert any(k.kind == "mix_order" for r in be.reports for k in r.kernel_info)


def test_dynamic_transposes_at_odd_sizes_match_eager(monkeypatch):
    # the chained index decomposition over two run-time sizes, forward and backward
    class Heads(torch.nn.Module):
        def forward(self, x):
            b, t, d = x.shape
            return (x.view(b, t, 3, 5).transpose(1, 2).contiguous() * 2).softmax(-1)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _train_like_eager(Heads, [(2, 7, 15), (3, 17, 15), (5, 9, 15)])


# -- the rule: a dynamic kernel gets its static twin's configuration ---------------------------------------


def _rule_choices(fn, x, dynamic: bool, tmp_path) -> list:
    """(kind, variant, XBLOCK, RBLOCK, warps) of each GPU kernel of fn's training step by rule, at x's sizes,
    with the arguments its launch passes (a dynamic kernel's size arguments are the call's sizes)."""
    reports = _training_reports(fn, x.detach().clone().requires_grad_(), dynamic)  # a fresh tensor: dynamo
    assert all(bool(size_sources(report.graph)) == dynamic for report in reports)  # remembers dynamic dims
    out = []
    for report in reports:
        runner = TritonRunner(report.graph, interpret=False, cache=KernelCache(tmp_path / "passline"))
        bind = _Bindings.read(size_sources(report.graph), report.inputs)
        for kind, _, data in runner.steps:
            if kind not in ("kernel", "mix"):
                continue
            k = data[0]
            first = next(iter(k.info.variants.values()))
            xn, rn = bind.int(first.xnumel), None if first.rnumel is None else bind.int(first.rnumel)
            args = [bind.int(v) if what == "size" else None for what, v in first.args]
            cfg = k._rule(xn, rn, args)
            out.append((k.info.kind, str(cfg.variant), cfg.xblock, cfg.rblock, cfg.warps))
    return sorted(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_kernels_take_the_static_configurations(tmp_path, dtype):
    # the rule reads the bytes a kernel moves an element (the mix-order blocks, online softmax loops): under
    # dynamic shapes they are evaluated at the launch's sizes, not assumed (float32 LayerNorm backward at
    # 384 columns took 2 warps dynamic against 4 static before)
    ln = torch.nn.LayerNorm(384).to(dtype)
    x = torch.randn(4099, 384, dtype=dtype, requires_grad=True)
    assert _rule_choices(ln, x, True, tmp_path) == _rule_choices(ln, x, False, tmp_path)
    sm = lambda x: torch.softmax(x.float(), -1)  # noqa: E731 - a looped online softmax (30000 wide)
    x = torch.randn(9, 30000, dtype=dtype, requires_grad=True)
    assert _rule_choices(sm, x, True, tmp_path) == _rule_choices(sm, x, False, tmp_path)


class _ResidualNorm(torch.nn.Module):
    """A GPT block's `x + linear(layer_norm(x))` over (batch, time, width): the rows are s0*s1, no size
    of the kernels' signature."""

    def __init__(self, d):
        super().__init__()
        self.ln, self.lin = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.lin(self.ln(x))


def test_rows_of_two_run_time_sizes_take_the_static_configuration_and_split(tmp_path):
    # the mix-order kernel's bytes a row are an expression of s0 and s1, neither a kernel argument: taken
    # at the traced sizes (it had 2 warps against 4), and its rows per program from the traced row count
    # (a fixed 64 left 4000 rows on 63 programs: 0.051 ms against the static 0.012 on an H200)
    m = _ResidualNorm(1024).to(torch.bfloat16)
    x = torch.randn(4, 1000, 1024, dtype=torch.bfloat16, requires_grad=True)
    assert _rule_choices(m, x, True, tmp_path) == _rule_choices(m, x, False, tmp_path)
    splits = [[n.split_rows for r in _training_reports(m, x.detach().clone().requires_grad_(), dynamic)
               for n in r.graph.nodes() if isinstance(n, MixOrderNode)] for dynamic in (False, True)]
    assert splits[0] == splits[1] == [16]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                   torch.bool])
def test_gpu_max_and_min_reductions_compile_in_every_dtype(gpu_compile, dtype):
    # the GPU prelude's max and min combines are one max.NaN / min.NaN instruction for floats (NaN still
    # wins, as the interpreter's where-form) and compares for integers and bools (any / all): each dtype
    # compiles for sm_90, and float32 takes the one-instruction form
    def f(x):
        if dtype == torch.bool:
            return x.any(-1), x.all(-1)
        return x.amax(-1), x.amin(-1)

    x = torch.randn(7, 300) > 0 if dtype == torch.bool else (torch.randn(7, 300) * 100).to(dtype)
    ptx = "".join(gpu_compile(f, x, False, "max").values())
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert _count(ptx, r"\bmax\.NaN\.") and _count(ptx, r"\bmin\.NaN\."), ptx[-2000:]


def test_a_persistent_log_sum_exps_terms_are_one_exponential_each_on_the_gpu(gpu_compile):
    # a row held whole (persistent): the sum's terms are ex2.approx.ftz (`_exp_term`) as in the online loop;
    # softmax's exponentials, stored, keep tl.exp's ex2.approx with its subnormal fix-up (no .ftz)
    x = torch.randn(3, 1000, dtype=torch.bfloat16)
    ptx = "".join(gpu_compile(lambda x: torch.log_softmax(x.float(), -1), x, False, "lse").values())
    assert _count(ptx, r"ex2\.approx\.ftz\.f32") >= 1, ptx[-3000:]
    ptx = "".join(gpu_compile(lambda x: torch.softmax(x.float(), -1), x, False, "softmax").values())
    assert _count(ptx, r"ex2\.approx\.ftz\.f32") == 0 and _count(ptx, r"ex2\.approx\.f32") >= 1, ptx[-3000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_online_softmax_terms_are_one_exponential_each_on_the_gpu(gpu_compile, dtype):
    # a row too wide to hold (looped, max and sum online): each term of the sum is one ex2.approx.ftz
    # (`_exp_term`), its running max one max.NaN; the exponentials whose results are stored (none here
    # in the forward but the rescaling's) keep tl.exp
    x = torch.randn(3, 70000, dtype=dtype)
    ptx = "".join(gpu_compile(lambda x: torch.log_softmax(x, -1), x, False, "online").values())
    assert _count(ptx, r"ex2\.approx\.ftz\.f32") >= 2, ptx[-3000:]
    assert _count(ptx, r"\bmax\.NaN\.f32")


def test_unknown_rows_take_the_traced_bytes_an_element_at_the_launchs_row_length():
    """Traffic of symbolic sizes where the rows are `s0*s1` (neither a kernel argument) and the row length `s2` is
    the launch's: the rule's bytes a row are the traced bytes an element (`hinted_element_bytes`) times the
    launch's row length. Kept as bytes a row at the traced length, a launch at twice that length saw half the
    bytes an element (a bfloat16 row read and written, 4 bytes an element, judged a row only read: under 3)."""
    from types import SimpleNamespace

    from passline.backends.triton.runner import Kernel

    s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
    k = Kernel.__new__(Kernel)
    src = SimpleNamespace(args=(("buffer", "x"), ("buffer", "y"), ("size", s2)), xnumel=s0 * s1, rnumel=s2)
    k.info = SimpleNamespace(bytes=4 * s0 * s1 * s2, variants={"persistent": src})  # read 2, written 2 an element
    k.hinted_element_bytes = 4.0  # as TritonRunner._made_kernel derives it at the traced sizes
    for width in (1000, 2000, 4000):
        assert k._row_bytes(8 * 1000, width, (None, None, width)) == 4.0 * width
    k.hinted_element_bytes = None
    assert k._row_bytes(8 * 1000, 2000, (None, None, 2000)) is None
