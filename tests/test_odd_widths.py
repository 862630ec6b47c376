"""Odd sizes (docs/backends.md, *Odd widths: whole blocks and aligned loops*): a pointwise kernel over an element
count that is not a multiple of 16 runs its whole blocks under a constant mask, and a looped row kernel whose rows
do not start on 16-byte boundaries walks aligned chunks of the flat buffer where a program has one row, and a
persistent one that reads or writes such rows does so through an aligned window. Both branches of each run
under the interpreter here, against eager; the sm_90 binaries are checked for vector loads."""
import re

import attrs
import pytest
import torch
import torch.nn.functional as F
from test_dynamic_kernels import gpu_compile  # noqa: F401  (a fixture)

from passline.backends.triton import compat, configs
from passline.testing import assert_matches_eager

ODD = 9001  # 15 rows in 16 start off a 16-element boundary, each at another offset from it

ROWS = {
    "layer_norm": lambda: (torch.nn.LayerNorm(ODD), [torch.randn(5, ODD, requires_grad=True)]),
    "rms_norm_bf16": lambda: (torch.nn.RMSNorm(ODD).bfloat16(),
                              [torch.randn(5, ODD, dtype=torch.bfloat16, requires_grad=True)]),
    "log_softmax": lambda: (lambda x: torch.log_softmax(x, -1), [torch.randn(5, ODD, requires_grad=True)]),
    "cross_entropy": lambda: (lambda x, t: F.cross_entropy(x, t),
                              [torch.randn(5, ODD, requires_grad=True), torch.randint(0, ODD, (5,))]),
    "argmax_ties": lambda: (lambda x: x.argmax(-1), [torch.randint(0, 3, (5, ODD)).float()]),
    # rows of the reduction's identity: the lanes before a row (masked, at negative indices) must lose every tie
    "argmax_no_true": lambda: (lambda m: m.to(torch.uint8).argmax(-1), [torch.zeros(5, ODD, dtype=torch.bool)]),
    "argmax_of_neg_inf": lambda: (lambda x: x.argmax(-1), [torch.full((5, ODD), float("-inf"))]),
    "argmin_of_inf": lambda: (lambda x: x.argmin(-1), [torch.full((5, ODD), float("inf"))]),
}


def _reductions(be) -> list:
    return [k for r in be.reports for k in r.kernel_info if k.kind == "reduction"]


@pytest.mark.parametrize("case", sorted(ROWS))
def test_odd_width_rows_run_the_aligned_loop_like_eager(monkeypatch, case):
    """Programs of one row (the interpreter's block shrunk to one chunk of 4096, looped forced): 5 rows of 9001,
    each with an inner chunk (the constant-True mask) and edge chunks (masked to the row) at its own offset from
    the 16-element boundary; forward and backward against eager, argmax's ties to the first index included."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 4096)
    torch.manual_seed(0)
    fn, inputs = ROWS[case]()
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="looped")
    aligned = [k for k in _reductions(be) if "rflat = rlo" in k.source]  # (not a column sum's classes)
    assert aligned, [k.source for k in _reductions(be)]
    for k in aligned:  # a chunk at most half a row: whichever the row's offset, one lies inside it
        assert k.blocks["XBLOCK"] == 1 and 2 * k.blocks["RBLOCK"] <= ODD, (k.name, k.blocks)


def test_aligned_rows_keep_the_plain_loop():
    """Rows on 16-byte boundaries (1000 float32 or bfloat16 elements: 4000 and 2000 bytes) load vectors in the plain
    loop, which was the faster there: no aligned loop is written; several rows a program take the plain loop."""
    x = torch.randn(6, 1000, requires_grad=True)
    be = assert_matches_eager(torch.nn.LayerNorm(1000), [x], codegen="triton", kernel_variant="looped")
    assert not any("rflat" in k.source for k in _reductions(be))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_ragged_pointwise_kernel_runs_whole_blocks_unmasked(monkeypatch, dynamic):
    """A bias + GELU over 3 x 9001 = 27003 elements in blocks of 4096 (the interpreter's, shrunk): six whole blocks
    under the constant mask, the last one masked; with dynamic shapes the count is passed at run time, split alike
    (here at two sizes, one of them a multiple of 16)."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 4096)
    bias = torch.randn(ODD)

    def fn(x):
        return F.gelu(x + bias)

    for rows in ((3,) if not dynamic else (3, 16)):
        be = assert_matches_eager(fn, [torch.randn(rows, ODD, requires_grad=True)], codegen="triton",
                                  dynamic=dynamic)
        pointwise = [k for r in be.reports for k in r.kernel_info if k.kind == "pointwise"]
        assert pointwise and all("if xoffset <= " in k.source for k in pointwise), \
            [k.source for k in pointwise]


WINDOWED = {
    "softmax_bf16": lambda: (lambda x: torch.softmax(x, -1), [torch.randn(5, ODD, dtype=torch.bfloat16,
                                                                          requires_grad=True)]),
    "log_softmax": lambda: (lambda x: torch.log_softmax(x, -1), [torch.randn(5, ODD, requires_grad=True)]),
    # the backward's one-hot compares each lane's column with the target: columns before the row are negative
    "cross_entropy_bf16": lambda: (lambda x, t: F.cross_entropy(x, t, ignore_index=3, label_smoothing=0.1),
                                   [torch.randn(6, ODD, dtype=torch.bfloat16, requires_grad=True),
                                    torch.tensor([0, ODD - 1, 3, 17, ODD - 2, 4000])]),
    # rows only read (nothing row-sized written: a row max, a log-sum-exp), off 16-byte boundaries
    # (each row 10 above the one before: a neighbour's lanes leaking into a row's max or argmax would change it)
    "row_max_bf16": lambda: (lambda x: x.amax(-1), [(torch.randn(5, ODD) + 10 * torch.arange(5.0)[:, None])
                                                    .to(torch.bfloat16)]),
    "row_argmax": lambda: (lambda x: x.argmax(-1), [torch.randn(5, ODD) + 10 * torch.arange(5.0)[:, None]]),
    "logsumexp": lambda: (lambda x: torch.logsumexp(x, -1), [torch.randn(4, ODD)]),
    # a weight and a bias read by columns: loaded at each lane's column (negative before the row, masked)
    "layer_norm": lambda: (torch.nn.LayerNorm(ODD), [torch.randn(5, ODD, requires_grad=True)]),
    "rms_norm_bf16": lambda: (torch.nn.RMSNorm(ODD).bfloat16(),
                              [torch.randn(6, ODD, dtype=torch.bfloat16, requires_grad=True)]),
    # a float32 row of 9001 (36004 bytes) starts 4 bytes further on each row: a group of 4
    "softmax_of_neg_inf_rows": lambda: (lambda x: torch.softmax(x.masked_fill(x > 1, float("-inf")), -1),
                                        [torch.randn(5, ODD, requires_grad=True)]),
}


def _launches_windows(monkeypatch) -> list:
    """The WINDOW constexpr of every launch of a kernel that has the window, as the launches pass it."""
    from passline.backends.triton.runner import Kernel

    seen = []
    constexprs = Kernel.constexprs

    def spy(self, *a, **k):
        out = constexprs(self, *a, **k)
        if "WINDOW" in out:
            seen.append(out["WINDOW"])
        return out

    monkeypatch.setattr(Kernel, "constexprs", spy)
    return seen


def _asking_for_the_window(monkeypatch, window: bool, one_row: bool = False) -> None:
    """Every rule's configuration asks for the window (`window`) where its kernel has one, or asks for none; with
    `one_row`, a row a program there (the interpreter's block takes several rows narrower than it)."""
    from passline.backends.triton.runner import Kernel

    rule = Kernel._rule

    def asking(self, *a, **k):
        cfg = rule(self, *a, **k)
        asks = window and bool(self.windows)
        return attrs.evolve(cfg, window=asks, **({"xblock": 1} if asks and one_row else {}))

    monkeypatch.setattr(Kernel, "_rule", asking)


@pytest.mark.parametrize("window", [True, False], ids=["window", "plain"])
@pytest.mark.parametrize("case", sorted(WINDOWED))
def test_odd_width_rows_run_through_the_window_like_eager(monkeypatch, case, window):
    """Persistent programs of one row (the interpreter's block shrunk to 16384, persistent forced) over rows of 9001
    that do not start on 16-byte boundaries, each at its own offset from one: the kernels that write such rows
    have the window branch, and every launch of them runs it (their configurations asking for it) or the plain
    branch (asking for none); forward and backward against eager, a cross-entropy's ignored target and label
    smoothing, rows of -inf included."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_the_window(monkeypatch, window)
    seen = _launches_windows(monkeypatch)
    torch.manual_seed(0)
    fn, inputs = WINDOWED[case]()
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="persistent")
    assert any("if WINDOW:" in k.source for k in _reductions(be))
    # the rows it writes off 16-byte boundaries, or none (a row max, an argmax, a log-sum-exp only read theirs)
    writes = {src.window_writes for k in _reductions(be) for src in k.variants.values() if src.window}
    assert (writes == {False}) if case in ("row_max_bf16", "row_argmax", "logsumexp") else (True in writes), writes
    assert seen and set(seen) == {window}, seen


def test_the_rule_takes_the_window_for_a_kernel_that_reduces_nothing(tmp_path, monkeypatch):
    """A kernel whose persistent form has the window takes it by rule where it reduces nothing of its own
    (KernelSource.window_by_rule: on a GPU, cross-entropy's backward, the row's gradient from its saved log-sum-exp);
    one that reduces its rows (softmax's forward, here) keeps the plain block, the window timed against it where a
    band has them (configs.uncertain). The interpreter's one-row block and a GPU's (132 SMs, 10872 rows)."""
    from passline.backends.triton.cache import KernelCache
    from passline.backends.triton.configs import Config, Device, Variant
    from passline.backends.triton.runner import Kernel, KernelInfo

    info, src = _windowed_softmax(monkeypatch)
    assert not src.window_by_rule  # its max and sum
    for by_rule in (False, True):
        variants = {Variant.PERSISTENT: attrs.evolve(src, window_by_rule=by_rule)}
        for interpret, rows in ((True, 3), (False, 10872)):
            k = Kernel(KernelInfo("k", "node", "reduction", variants), KernelCache(str(tmp_path)), interpret, False,
                       "key", None, Device(132))
            cfg = k._rule(rows, ODD)
            assert cfg.window == by_rule and cfg.variant == Variant.PERSISTENT, (by_rule, interpret, cfg)
            if by_rule and not interpret:
                assert cfg == Config(Variant.PERSISTENT, 1, 16384, 4, window=True)


def test_each_dtype_reads_and_writes_its_own_16_byte_groups(monkeypatch):
    """A window over a bfloat16 row and a float32 row (groups of 8 and 4 elements): each dtype's accesses take the
    masks of its own group — with the bfloat16 group for both, the float32 row was read 16 bytes past the vector
    holding its last element (the review's finding) — and the kernel matches eager through the window."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_the_window(monkeypatch, True)
    seen = _launches_windows(monkeypatch)
    x = torch.randn(5, ODD, dtype=torch.bfloat16)
    y = torch.randn(5, ODD)
    be = assert_matches_eager(lambda x, y: torch.softmax(x.float() + y, -1).to(torch.bfloat16), [x, y],
                              codegen="triton", kernel_variant="persistent")
    (k,) = [k for k in _reductions(be) if "if WINDOW:" in k.source]
    start = k.source.index("if WINDOW:")
    window = k.source[start:k.source.index("    else:", start)]
    assert "rlo = (rbase // 8) * 8" in window
    assert re.search(r"p_arg\d+_1 \+ rflat, xmask & rtake4", window) and re.search(r"\+ rflat, xmask & rtake8", window)
    assert "xmask & rwhole8" in window and "xmask & redge8" in window  # the bfloat16 output
    assert seen and all(seen), seen


@pytest.mark.parametrize("layout", ["transposed", "rows_of_a_wider_buffer"])
def test_the_window_with_inputs_not_laid_out_as_rows(monkeypatch, layout):
    """A softmax and cross-entropy's training step over odd-width bfloat16 rows given transposed (the rows are the
    input's columns) or as a slice of a wider buffer (rows 9001 wide, 9003 apart), every configuration asking for
    the window: forward and backward against eager, whatever the kernels read their rows through."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_the_window(monkeypatch, True)
    torch.manual_seed(0)
    if layout == "transposed":
        x = torch.randn(ODD, 5, dtype=torch.bfloat16).t().requires_grad_()
    else:
        x = torch.randn(5, ODD + 2, dtype=torch.bfloat16)[:, 1:ODD + 1].requires_grad_()
    target = torch.tensor([0, ODD - 1, 3, 17, 9])
    assert_matches_eager(lambda x, t: torch.softmax(x, -1) * 2 + F.cross_entropy(x, t), [x, target],
                         codegen="triton", kernel_variant="persistent")


def test_a_weight_by_columns_is_read_through_the_window_at_each_lanes_column(monkeypatch):
    """A norm's weight and bias, read along the columns, are loaded at each lane's column (`q0`, the row's index:
    negative before the row) under the row's mask, while the row itself is read and written in whole groups; such a
    kernel is timed, never windowed by rule (KernelSource.window_by_rule), and its rows wider than 16384 are not held
    whole through the window (KernelSource.window_columns: it lost there). Rows on 16-byte boundaries (1000 float32
    elements, read or written) have no window."""
    from passline.backends.triton.configs import Variant

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    be = assert_matches_eager(torch.nn.LayerNorm(ODD), [torch.randn(3, ODD, requires_grad=True)], codegen="triton",
                              kernel_variant="persistent")
    fwd = be.reports[0].kernel_info[0].variants[Variant.PERSISTENT]
    assert fwd.window == 4 and fwd.window_columns and fwd.window_writes and not fwd.window_by_rule
    window = fwd.source[fwd.source.index("if WINDOW:"):fwd.source.index("    else:")]
    assert "+ rflat, xmask & rtake4" in window and re.search(r"tl\.load\(p_\w+ \+ q0, rmask, other=0\)", window)
    assert "q0 = rindex" in window
    for fn, x in ((lambda x: torch.softmax(x, -1), torch.randn(3, 1000, requires_grad=True)),
                  (lambda x: x.amax(-1), torch.randn(3, 1000))):
        be = assert_matches_eager(fn, [x], codegen="triton", kernel_variant="persistent")
        assert not any("WINDOW" in k.source for k in _reductions(be))


def _windowed_softmax(monkeypatch):
    """The persistent source of a bfloat16 softmax forward over rows of ODD (it has the window)."""
    from passline.backends.triton.configs import Variant

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    be = assert_matches_eager(lambda x: torch.softmax(x, -1), [torch.randn(3, ODD, dtype=torch.bfloat16)],
                              codegen="triton", kernel_variant="persistent")
    (info,) = [k for k in _reductions(be) if k.variants[Variant.PERSISTENT].window]
    return info, info.variants[Variant.PERSISTENT]


def test_a_window_writes_its_rows_and_nothing_around_them(tmp_path, monkeypatch):
    """The softmax's windowed kernel launched by hand under the interpreter, its output rows inside a larger buffer
    of NaN at an offset of 3 elements (each row another offset from a 16-byte boundary, the buffer's pointer too),
    with WINDOW on and off: the rows match eager, and not one element around them is written (the edge groups are
    stored element by element; a whole group there would write a neighbour's lanes)."""
    from passline.backends.triton.cache import interpreting, load_kernel

    _, src = _windowed_softmax(monkeypatch)
    assert src.window == 8  # 16 bytes of bfloat16
    path = tmp_path / "k.py"
    path.write_text(src.source)
    fn = load_kernel(path, src.fn_name, True)
    rows = 3  # the kernel's (a number in its source)
    x = torch.randn(rows, ODD).to(torch.bfloat16)
    want = torch.softmax(x.float(), -1).to(torch.bfloat16)
    for window in (True, False):
        buf = torch.full((rows * ODD + 40,), float("nan"), dtype=torch.bfloat16)
        out = buf[3:3 + rows * ODD].view(rows, ODD)
        ptrs = [x if name.startswith("arg") else out for kind, name in src.args if kind == "buffer"]
        assert len(ptrs) == 2 and sum(p is out for p in ptrs) == 1, src.args
        with interpreting(True):
            fn[(rows,)](*ptrs, rows, ODD, XBLOCK=1, RBLOCK=16384, WINDOW=window, num_warps=4)
        torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=1e-5)
        assert torch.isnan(buf[:3]).all() and torch.isnan(buf[3 + rows * ODD:]).all(), window


def test_the_window_is_the_launchs_to_take(tmp_path, monkeypatch):
    """WINDOW as the launch sets it (configs.windowed, and every pointer that may change between calls aligned):
    a configuration asking for it, a program of one row holding the row and the window's head; off where it does
    not ask, for two rows a program, for a block without room for the head, and for a misaligned pointer among the
    arguments checked per call (an extern's view: its whole groups could reach past the buffer's end)."""
    from passline.backends.triton.cache import KernelCache
    from passline.backends.triton.configs import Config, Device, Variant
    from passline.backends.triton.runner import Kernel, KernelInfo

    info, src = _windowed_softmax(monkeypatch)
    k = Kernel(KernelInfo("k", "node", "reduction", {Variant.PERSISTENT: src}), KernelCache(str(tmp_path)), False,
               False, "key", None, Device(132))
    x, buf = torch.empty(3, ODD, dtype=torch.bfloat16), torch.empty(3 * ODD + 8, dtype=torch.bfloat16)
    aligned, misaligned = (x, buf[:3 * ODD].view(3, ODD), 3, ODD), (x, buf[1:1 + 3 * ODD].view(3, ODD), 3, ODD)
    one_row = Config(Variant.PERSISTENT, 1, 16384, 4, window=True)
    assert k.constexprs(one_row, 3, ODD, full=aligned)["WINDOW"]
    assert not k.constexprs(attrs.evolve(one_row, window=False), 3, ODD, full=aligned)["WINDOW"]  # not asked
    assert not k.constexprs(attrs.evolve(one_row, xblock=2), 3, ODD, full=aligned)["WINDOW"]  # two rows a program
    assert not configs.windowed(Config(Variant.PERSISTENT, 1, 8192, 4, window=True), 8191, 8)  # no room for the head
    k.check = (1,)  # the output: an extern's view, say
    assert k.constexprs(one_row, 3, ODD, full=aligned)["WINDOW"]
    assert not k.constexprs(one_row, 3, ODD, full=misaligned)["WINDOW"]


def test_the_rule_takes_the_window_where_rows_are_written_off_boundaries():
    """configs.rule with a window (kernel.KernelWriter._window's group, given where the kernel reduces nothing of its
    own): a row a program in a block holding the row and the window's head, 16 groups a thread (256 bytes of the
    narrowest dtype), 4 warps at least; the bands time it as a candidate of its own, next to the plain blocks.
    Rows under 8193, rows whose block would double to hold the window's head, and few rows (fewer than SMs) keep
    the plain block."""
    from passline.backends.triton.configs import GPU_PERSISTENT_MAX, Config, Device, Variant, rule, uncertain

    h200 = Device(132)
    both = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def by_rule(rows, width, window):
        return rule(both, rows, width, False, h200, window=window)

    def through(rb, warps):
        return Config(Variant.PERSISTENT, 1, rb, warps, window=True)

    assert by_rule(10872, 12345, 8) == through(16384, 4)  # 128 bfloat16 elements a thread
    assert by_rule(5436, 12345, 4) == through(16384, 8)  # float32: 64 a thread
    assert by_rule(10872, 16377, 8) == through(16384, 4)  # 16377 + 7 lanes: 16384 still
    # narrow; 8191 + 7 lanes would double the block; fewer rows than SMs; 16380 + 7 past 16384
    for rows, width in ((44739, 3001), (16384, 8191), (64, 12345), (10872, 16380)):
        assert by_rule(rows, width, 8) == by_rule(rows, width, 0), (rows, width)
    band = uncertain(both, 10872, 12345, False, h200, base=by_rule(10872, 12345, 0), window=8)
    assert through(16384, 4) in band and Config(Variant.PERSISTENT, 1, 16384, 8) in band  # the plain block too
    assert through(16384, 2) in band  # and on half the rule's warps: 32 groups a thread
    wide = uncertain(both, 2671, 50257, False, h200, base=by_rule(2671, 50257, 0), window=8)
    assert through(65536, 16) in wide and GPU_PERSISTENT_MAX < 65536
    assert not any(c.window for c in uncertain(both, 2671, 50257, False, h200, base=by_rule(2671, 50257, 0)))
    # rows only read (a cross-entropy forward) are not held whole through the window past 16384 (it lost there)
    assert not any(c.window for c in uncertain(both, 2671, 50257, False, h200, base=by_rule(2671, 50257, 0),
                                               window=8, wide_window=False))


def test_rows_up_to_8192_off_boundaries_time_the_window_and_fewer_warps():
    """configs.uncertain's window band (`_window_band`): rows 2049 to 8192 wide read or written off 16-byte
    boundaries, a row a program by rule, time the rule's block, itself on half its warps, and the window on both
    warp counts — the window only where its block holds the row's head without doubling (8191 + 7 lanes do not fit
    8192); aligned rows (no window), rows of 2048 or less and launch-sized kernels time nothing."""
    from passline.backends.triton.configs import Config, Device, Variant, rule, uncertain

    h200 = Device(132)
    both = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def band(rows, width, window, row_bytes=None):
        base = rule(both, rows, width, False, h200, row_bytes=row_bytes)
        return base, uncertain(both, rows, width, False, h200, base=base, row_bytes=row_bytes, window=window)

    base, got = band(44724, 3001, 8)
    assert base == Config(Variant.PERSISTENT, 1, 4096, base.warps) and base.warps >= 2
    half = base.warps // 2
    assert got == [base, attrs.evolve(base, warps=half), attrs.evolve(base, window=True),
                   Config(Variant.PERSISTENT, 1, 4096, half, window=True)]
    base, got = band(16386, 8191, 8)  # the window's head would double the block: the plain block on two warp counts
    assert got == [base, attrs.evolve(base, warps=base.warps // 2)]
    assert band(44724, 3001, 0)[1] == [] and band(100000, 2000, 8)[1] == []  # aligned; 2048 wide or less
    # a bfloat16 row only read: 2 warps by rule (64 elements a thread), not halved to one (never measured)
    base, got = band(44724, 3001, 8, row_bytes=2 * 3001)
    assert base.warps == 2 and got == [base, attrs.evolve(base, window=True)]
    assert band(150, 3001, 8, row_bytes=2 * 3001)[1] == []  # 900 KB of bfloat16 read: a launch's worth
    assert band(200, 3001, 8, row_bytes=2 * 3001)[1]


def _loads(ptx: str) -> dict:
    """16-byte vector loads and stores, cache hints or not (`ld.global.L1::evict_last.L2::cache_hint.v4.b32`)."""
    return {what: len(re.findall(rf"{what}\.global[\w.:]*\.v4", ptx)) for what in ("ld", "st")}


def test_odd_widths_load_vectors_on_sm90(gpu_compile):  # noqa: F811
    """Compiled for sm_90 with the rule's configuration: a bfloat16 LayerNorm over 8 rows of 20001 (looped, a row a
    program) and a bias + GELU over 7 x 20001 elements (an odd count) load and store 16-byte vectors; written the
    plain way, every element of both was a load of its own (no `.v4` in either binary)."""
    ln = torch.nn.LayerNorm(20001).to(torch.bfloat16)
    x = torch.randn(8, 20001, dtype=torch.bfloat16)
    (fwd,) = gpu_compile(ln, x, False, "layer_norm").values()
    assert _loads(fwd)["ld"] > 0 and _loads(fwd)["st"] > 0, _loads(fwd)
    bias = torch.randn(20001, dtype=torch.bfloat16)
    (pw,) = gpu_compile(lambda x: F.gelu(x + bias), torch.randn(7, 20001, dtype=torch.bfloat16), False,
                        "gelu").values()
    assert _loads(pw)["ld"] > 0 and _loads(pw)["st"] > 0, _loads(pw)


def test_a_row_only_read_loads_vectors_through_the_window_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a log-sum-exp over 64 bfloat16 rows of 12345 (24690 bytes: a row starts on a 16-byte
    boundary one row in eight) only reads its rows. Through the window its loads are 16-byte vectors; the plain
    branch loads every element alone (65 `ld.global.b16` a thread for a cross-entropy forward on 8 warps)."""
    x = torch.randn(64, 12345, dtype=torch.bfloat16)
    got = {}
    for window in (True, False):
        _asking_for_the_window(monkeypatch, window)
        (ptx,) = gpu_compile(lambda x: torch.logsumexp(x.float(), -1), x, False, f"lse_{window}").values()
        got[window] = _loads(ptx)["ld"]
    assert got[True] > 0 and got[False] == 0, got


def test_a_norm_loads_and_stores_its_rows_in_vectors_through_the_window_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a bfloat16 LayerNorm forward over 64 rows of 12345, its weight and bias read by columns.
    Through the window its rows are read and written in 16-byte vectors (the weight and bias element by element,
    at each lane's column); the plain branch has none (every row element a load and a store of its own). On an
    H200 its dx kernel at 10872 x 12345 took 264.7 µs so against the plain loop's 369.9 (sixtieth session)."""
    ln = torch.nn.LayerNorm(12345).to(torch.bfloat16)
    x = torch.randn(64, 12345, dtype=torch.bfloat16)
    got = {}
    for window in (True, False):
        _asking_for_the_window(monkeypatch, window)
        (ptx,) = gpu_compile(ln, x, False, f"ln_{window}").values()
        got[window] = _loads(ptx)
    assert got[True]["ld"] > 0 and got[True]["st"] > 0 and got[False] == {"ld": 0, "st": 0}, got


MIXED = {
    "layer_norm_bf16": lambda rows, width: (torch.nn.LayerNorm(width).bfloat16(),
                                            [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True)]),
    "rms_norm": lambda rows, width: (torch.nn.RMSNorm(width), [torch.randn(rows, width, requires_grad=True)]),
    # a pointwise row side (dh) with the bias's column sum: rows of h, dh and dy through the window
    "bias_gelu_bf16": lambda rows, width: (
        lambda h, b: F.gelu(h + b),
        [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True),
         torch.randn(width, dtype=torch.bfloat16, requires_grad=True)]),
}


# the interpreter of Triton 3.6 cannot run the classes' loop (compat.INTERPRETED_LOOP_BOUNDS): there, plain blocks
needs_loop_bounds = pytest.mark.skipif(not compat.INTERPRETED_LOOP_BOUNDS, reason="this Triton's interpreter")


@needs_loop_bounds
@pytest.mark.parametrize("split", [1, 2, 5, 16])
@pytest.mark.parametrize("case", sorted(MIXED))
def test_a_mixed_kernels_rows_in_classes_match_eager(monkeypatch, case, split):
    """A mix-order kernel over rows that do not start on 16-byte boundaries (21 rows of 1001: a bfloat16 row starts
    1001 % 8 elements past the last's boundary) takes its rows in classes of one offset through the aligned window
    (`KernelWriter._classes`), launched so wherever its programs give each class one (WINDOW): 21, 11 and 5
    programs at splits of 1, 2 and 5 rows (a float32 row's group is 4 elements: 5 programs cover 4 classes), and the
    plain blocks of rows at 16 (two programs). The norm's dx and the column sums (weight, bias) against eager."""
    from passline.ir import MixOrderNode

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    seen = _mix_launches(monkeypatch)
    torch.manual_seed(0)
    fn, inputs = MIXED[case](21, 1001)
    pipeline = _mixed_pipeline(split)
    be = assert_matches_eager(fn, inputs, codegen="triton", pipeline=pipeline)
    bwd = be.reports[-1]
    assert any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), [n.name for n in bwd.graph.nodes()]
    (main,) = [k for k in bwd.kernel_info if k.kind == "mix_order"]
    assert "if WINDOW:" in main.source and "rclass = program % " in main.source
    group = 4 if case == "rms_norm" else 8
    assert {c["WINDOW"] for c in seen} == {-(-21 // split) >= group}, (seen, split)


def _mix_launches(monkeypatch) -> list:
    """The launch constexprs of every mix-order main kernel launched from here on (runner.MixKernel.constexprs)."""
    from passline.backends.triton.runner import MixKernel

    seen = []
    constexprs = MixKernel.constexprs

    def spy(self, *a, **k):
        seen.append(constexprs(self, *a, **k))
        return seen[-1]

    monkeypatch.setattr(MixKernel, "constexprs", spy)
    return seen


def _mixed_pipeline(split: int) -> str:
    import passline

    return passline.DEFAULT_PIPELINE.replace("mix_order_reduction", f"mix_order_reduction(split_rows={split})")


def test_which_mixed_launches_take_their_rows_in_classes():
    """configs.windowed for a mix-order kernel (whatever the configuration asks): its block holds the row and the
    window's head, its programs give each class one, and its rows are 1 KB or longer."""
    from passline.backends.triton.configs import Config, Variant, windowed

    mix = Config(Variant.MIX_ORDER, 1, 4096, 4, 3, 170)
    assert windowed(mix, 3001, 8, 264) and windowed(attrs.evolve(mix, variant=Variant.MIX_ORDER_ACC2D), 3001, 8, 8)
    assert not windowed(mix, 3001, 8, 7)  # a class without a program
    assert not windowed(attrs.evolve(mix, rblock=128), 100, 8, 264)  # 200-byte rows
    assert not windowed(attrs.evolve(mix, rblock=256), 250, 8, 264)  # 250 + 7 lanes: past the block
    assert windowed(attrs.evolve(mix, rblock=1024), 777, 4, 264)  # float32: 3108 bytes
    assert not windowed(attrs.evolve(mix, variant=Variant.MIX_ORDER_TILED), 3001, 8, 264)


def test_mixed_rows_on_boundaries_or_read_across_keep_the_blocks_of_rows(monkeypatch):
    """No classes where the rows start on 16-byte boundaries (1000 bfloat16 elements) or where a row side reads its
    input across its memory order (a transposed x: memory_order walks it column-first); both against eager."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    torch.manual_seed(0)
    for x in (torch.randn(21, 1000, dtype=torch.bfloat16, requires_grad=True),
              torch.randn(1001, 21, dtype=torch.bfloat16).t().requires_grad_()):
        be = assert_matches_eager(torch.nn.LayerNorm(x.shape[1]).bfloat16(), [x], codegen="triton",
                                  pipeline=_mixed_pipeline(2))
        assert not any("WINDOW" in k.source for k in be.reports[-1].kernel_info if k.kind == "mix_order")


def test_a_mixed_kernels_rows_in_classes_load_vectors_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a bfloat16 LayerNorm backward over 2000 rows of 1001, mixed (32 programs of 64 rows): its
    rows in classes read x and dy in 16-byte copies (its loop's loads are asynchronous copies into shared memory,
    pipelined: `cp.async` of 16 bytes) and write dx in 16-byte vectors; the plain blocks of rows (WINDOW off) copy
    no 16 bytes and store no vector."""
    from passline.backends.triton import runner

    ln = torch.nn.LayerNorm(1001).to(torch.bfloat16)
    x = torch.randn(2000, 1001, dtype=torch.bfloat16, requires_grad=True)
    got = {}
    for window in (True, False):
        if not window:
            monkeypatch.setattr(runner, "windowed", lambda *a: False)
        ptx = gpu_compile(ln, x, False, f"mix_{window}")
        (main,) = [p for name, p in ptx.items() if name.startswith("k_mix") and not name.endswith("finish")]
        got[window] = len(re.findall(r"cp\.async\.c[ag]\.shared\.global [^\n]*, 0x10,", main)), _loads(main)["st"]
    assert got[True][0] > 0 and got[True][1] > 0 and got[False] == (0, 0), got


def _one_function_over_rows(module, rows: tuple, **options) -> None:
    """`module`'s training step at each of `rows` row counts through one compiled function (dynamic shapes: the same
    runner, kernels, binaries and choices for every count, as a model whose batch varies runs), its output and the
    input's and parameters' gradients against eager's. `assert_matches_eager` compiles afresh at each call."""
    import copy

    import passline
    from passline.testing import tolerance

    torch._dynamo.reset()
    ours, eager = copy.deepcopy(module), copy.deepcopy(module)
    compiled = torch.compile(ours, backend=passline.backend(fallback="raise", codegen="triton", **options),
                             dynamic=True)
    width = next(module.parameters()).shape[-1]
    dtype = next(module.parameters()).dtype
    tol = tolerance(dtype)
    for n in rows:
        x = torch.randn(n, width, dtype=dtype)
        weight = torch.randn(n, width)
        got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        got, want = compiled(got_x), eager(want_x)
        (got.float() * weight).sum().backward()
        (want.float() * weight).sum().backward()
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(got_x.grad, want_x.grad, **tol)
        for p, q in zip(ours.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=tol["rtol"], atol=tol["atol"] * n)


@needs_loop_bounds
def test_a_mixed_kernels_rows_in_classes_under_a_run_time_row_count(monkeypatch):
    """With a run-time row count a mix-order kernel's WINDOW follows each launch's programs (21 rows in splits of 2:
    11 programs, the classes; 5 rows: 3, the blocks of rows): both against eager in one compiled function (one
    kernel, its binaries kept across the calls), and a binary is kept per WINDOW (runner.Kernel.binary_key): one
    compiled with the classes, launched where a class has no program, would leave that class's rows undone."""
    from passline.backends.triton.runner import MixKernel

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    seen = []  # (kernel, configuration, constexprs) of each launch
    constexprs = MixKernel.constexprs

    def spy(self, cfg, *a, **k):
        seen.append((self, cfg, constexprs(self, cfg, *a, **k)))
        return seen[-1][2]

    monkeypatch.setattr(MixKernel, "constexprs", spy)
    torch.manual_seed(0)
    _one_function_over_rows(torch.nn.LayerNorm(1001).bfloat16(), (21, 5, 21), pipeline=_mixed_pipeline(2))
    assert {c["WINDOW"] for _, _, c in seen} == {True, False}, seen
    assert len({k for k, _, _ in seen}) == 1, seen  # one kernel throughout
    k, cfg, consts = seen[0]
    full = (16,) * (max(k.check, default=0) + 1)  # the arguments the key specializes on
    assert k.binary_key(cfg, {**consts, "WINDOW": True}, full) != k.binary_key(cfg, {**consts, "WINDOW": False}, full)


def _asking_for_classes(monkeypatch, split: int, xblock: int = 1) -> None:
    """Every persistent rule's configuration of a kernel with rows in classes (KernelSource.window_classes) asks for
    them, `split` rows a program, `xblock` a step of its loop: the row's block and the window's head, on 4 warps."""
    from passline.backends.triton.configs import Config, Variant
    from passline.backends.triton.runner import Kernel

    rule = Kernel._rule

    def classes(self, xnumel, rnumel, *a, **k):
        cfg = rule(self, xnumel, rnumel, *a, **k)
        if not self.window_classes or cfg.variant != Variant.PERSISTENT:
            return cfg
        return Config(Variant.PERSISTENT, xblock, configs.pow2(rnumel + self.window - 1), 4, split=split, window=True)

    monkeypatch.setattr(Kernel, "_rule", classes)


NORMS = {
    "layer_norm_bf16": lambda rows, width: (torch.nn.LayerNorm(width).bfloat16(),
                                            [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True)]),
    "layer_norm": lambda rows, width: (torch.nn.LayerNorm(width), [torch.randn(rows, width, requires_grad=True)]),
    "rms_norm_bf16": lambda rows, width: (torch.nn.RMSNorm(width).bfloat16(),
                                          [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True)]),
    # a bfloat16 row beside a float32 weight: groups of 8 for the rows, the weight loaded at the columns
    "layer_norm_bf16_f32_weight": lambda rows, width: (
        lambda x, w, b: F.layer_norm(x.float(), (width,), w, b).to(torch.bfloat16),
        [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True), torch.randn(width, requires_grad=True),
         torch.randn(width, requires_grad=True)]),
}
UNMIXED = "dce, fuse, reorder_loops"  # the backward's dx a row kernel of its own (a weight by columns), no mix


@needs_loop_bounds
@pytest.mark.parametrize("split, xblock", [(1, 1), (2, 1), (2, 2), (3, 1), (5, 4)])
@pytest.mark.parametrize("case", sorted(NORMS))
def test_a_norms_rows_in_classes_match_eager(monkeypatch, case, split, xblock):
    """A persistent norm over 21 rows of 1001 (a bfloat16 row starts 1001 % 8 elements past the last one's 16-byte
    boundary, a float32 row 1001 % 4) whose configuration asks for rows in classes (WINDOW == CLASSES: a program's
    share of one class's rows, its weight and bias loaded once; KernelWriter._classes): 21 and 11 programs at
    splits of 1 and 2 rows, steps of 1 and 2 rows, take them; 7 at a split of 3 and 5 at 5 leave a bfloat16 class
    without a program and run the plain form, a row a program (runner.Kernel.grid) — a float32 row's 4 classes still
    take theirs at 7 and 5 (the plain form at a step of 4 rows: 6 programs). Forward and backward (dx unmixed: a
    row kernel reading the weight by columns) against eager."""
    from passline.backends.triton.kernel import CLASSES

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_classes(monkeypatch, split, xblock)
    seen = _class_launches(monkeypatch, columns=False)
    torch.manual_seed(0)
    fn, inputs = NORMS[case](21, 1001)
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="persistent", pipeline=UNMIXED)
    with_classes = [k for k in _reductions(be) if f"if WINDOW == {CLASSES}:" in k.source]
    assert len(with_classes) == 2, [k.source for k in _reductions(be)]  # the forward and dx
    programs = -(-21 // split)
    for group, window, grid in seen:
        assert (window, grid) == ((CLASSES, programs) if programs >= group else (False, -(-21 // xblock))), seen
    assert {g for g, _, _ in seen} == ({4} if case == "layer_norm" else {8}), seen


@needs_loop_bounds
def test_a_norms_rows_in_classes_under_a_run_time_row_count(monkeypatch):
    """Under dynamic shapes the classes follow each launch's programs (21 rows in splits of 2: 11 programs, the
    classes; 5 rows: 3, a row a program), all in one compiled function against eager, and the binary is kept per
    WINDOW (runner.Kernel.binary_key)."""
    from passline.backends.triton.kernel import CLASSES
    from passline.backends.triton.runner import Kernel

    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_classes(monkeypatch, 2)
    seen = []
    constexprs = Kernel.constexprs

    def spy(self, cfg, *a, **k):
        out = constexprs(self, cfg, *a, **k)
        if cfg.classes:
            seen.append((self, cfg, out))
        return out

    monkeypatch.setattr(Kernel, "constexprs", spy)
    torch.manual_seed(0)
    _one_function_over_rows(torch.nn.LayerNorm(1001).bfloat16(), (21, 5, 21), kernel_variant="persistent",
                            pipeline=UNMIXED)
    assert {c["WINDOW"] for _, _, c in seen} == {CLASSES, False}, seen
    assert len({k for k, _, _ in seen}) == 2, seen  # the forward's kernel and dx's, throughout
    k, cfg, consts = seen[0]
    full = (16,) * (max(k.check, default=0) + 1)
    assert k.binary_key(cfg, {**consts, "WINDOW": CLASSES}, full) != k.binary_key(cfg, {**consts, "WINDOW": False},
                                                                                  full)


def test_rows_in_classes_are_timed_for_a_norm_that_reads_a_weight_by_columns():
    """configs.class_band on a GPU of 132 SMs: a bfloat16 LayerNorm forward over 44724 rows of 3001 (its block of
    4096 on 4 warps, 32 elements a thread) times, beside the rule's block, its rows in classes in as many programs as
    fill the SMs' warp slots once (44724 // (132 * 16) = 21 rows a program); rows of 1001 on one warp (15 rows).
    None for rows under 1 KB (500 bfloat16), for a launch's worth of bytes, or where a program would have fewer than
    two rows."""
    from passline.backends.triton.configs import Config, Device, Variant, class_band, windowed

    gpu = Device(132)
    base = Config(Variant.PERSISTENT, 1, 4096, 4)
    got = class_band([], base, 44724, 3001, 8, gpu, 3001 * 4.0)
    assert got == [base, Config(Variant.PERSISTENT, 1, 4096, 4, split=21, window=True)], got
    assert all(c.programs(44724, 3001) >= 8 and windowed(c, 3001, 8, c.programs(44724, 3001)) for c in got[1:])
    plain = [base, attrs.evolve(base, warps=2)]
    assert class_band(plain, base, 44724, 3001, 8, gpu, None)[:2] == plain  # appended to a band
    narrow = class_band([], Config(Variant.PERSISTENT, 2, 1024, 2), 134218, 1001, 8, gpu, None)
    assert [(c.split, c.warps, c.rblock) for c in narrow[1:]] == [(15, 1, 1024)], narrow
    assert class_band([], base, 134218, 500, 8, gpu, None) == []  # 1000-byte rows
    assert class_band([], base, 100, 3001, 8, gpu, None) == []  # 600 KB: a launch's worth
    assert class_band([], base, 3000, 3001, 8, gpu, None) == []  # 1 row a program
    assert class_band([], base, 4300, 3001, 8, gpu, None) == [base, attrs.evolve(got[1], split=2)]  # 2 rows
    cfg = Config(Variant.PERSISTENT, 1, 4096, 4, split=21, window=True)
    assert cfg.classes and cfg.per_program == 21 and not attrs.evolve(cfg, window=False).classes
    assert not windowed(cfg, 3001, 8, 7)  # a class without a program: the plain form, a row a program


def _norm_forward_with_and_without_classes(gpu_compile, monkeypatch, width: int, count) -> dict:  # noqa: F811
    """`count` of the sm_90 PTX of a bfloat16 LayerNorm forward over 64 rows of `width`, with the rule's plain block
    (False) and asking for rows in classes, 2 rows a program (True)."""
    ln = torch.nn.LayerNorm(width).to(torch.bfloat16)
    x = torch.randn(64, width, dtype=torch.bfloat16)
    got = {}
    for classes in (False, True):
        if classes:
            _asking_for_classes(monkeypatch, 2)
        (ptx,) = gpu_compile(ln, x, False, f"classes_{width}_{classes}").values()
        got[classes] = count(ptx)
    return got


def test_a_norms_rows_in_classes_load_vectors_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a bfloat16 LayerNorm forward over 64 rows of 3001 (a row starts 3001 % 8 elements past a
    16-byte boundary) asking for rows in classes (2 rows a program: 32 programs, 8 classes) reads and writes its rows
    in 16-byte vectors; with the rule's plain block it has none (every row element a load and a store of its own)."""
    got = _norm_forward_with_and_without_classes(gpu_compile, monkeypatch, 3001, _loads)
    assert got[True]["ld"] > 0 and got[True]["st"] > 0 and got[False] == {"ld": 0, "st": 0}, got


def _asking_for_column_classes(monkeypatch, lanes: int, rows: int) -> None:
    """Every looped rule's configuration of a column sum with rows in classes (KernelSource.column_classes) asks for
    them: `lanes` lanes (lanes - G columns a program) by `rows` rows of a class a step, on 4 warps."""
    from passline.backends.triton.configs import Config, Variant
    from passline.backends.triton.runner import Kernel

    rule = Kernel._rule

    def classes(self, xnumel, rnumel, *a, **k):
        cfg = rule(self, xnumel, rnumel, *a, **k)
        return Config(Variant.LOOPED, lanes, rows, 4, window=True) if self.column_group else cfg

    monkeypatch.setattr(Kernel, "_rule", classes)


def _class_launches(monkeypatch, columns: bool) -> list:
    """(group, WINDOW, programs) of every launch asking for rows in classes: of a column sum that has them
    (`columns`), else of a persistent configuration asking for them (`Config.classes`)."""
    from passline.backends.triton.runner import Kernel

    seen = []
    constexprs = Kernel.constexprs

    def spy(self, cfg, *a, **k):
        out = constexprs(self, cfg, *a, **k)
        if self.column_group if columns else cfg.classes:
            seen.append((self.column_group or self.window, out["WINDOW"], self.grid(cfg, out, *a[:2])))
        return out

    monkeypatch.setattr(Kernel, "constexprs", spy)
    return seen


COLUMN_SUMS = {
    # the weight's and bias's gradients: x and dy by rows, the row's statistics by rows alone
    **{case: NORMS[case] for case in ("layer_norm_bf16", "layer_norm", "rms_norm_bf16")},
    # the bias gradient: dy and h by rows, the bias by columns (loaded at each lane's column of a class)
    "bias_gelu_bf16": lambda rows, width: (
        lambda h, b: F.gelu(h + b),
        [torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True),
         torch.randn(width, dtype=torch.bfloat16, requires_grad=True)]),
    # a bfloat16 column sum in float32 and scaled after it (an epilogue at the program's own columns), rows of 10
    # apart (a lane summing another row's or column's element would show)
    "column_mean_bf16": lambda rows, width: (
        lambda x: x.float().mean(0) * 3,
        [(torch.randn(rows, width) + 10 * torch.arange(float(rows))[:, None]).to(torch.bfloat16)]),
}


@needs_loop_bounds
@pytest.mark.parametrize("lanes, rows", [(16, 8), (32, 4), (64, 16)])
@pytest.mark.parametrize("case", sorted(COLUMN_SUMS))
def test_a_column_sums_rows_in_classes_match_eager(monkeypatch, case, lanes, rows):
    """A column sum over 37 rows of 1001 (a bfloat16 row starts 1001 % 8 elements past a 16-byte boundary, a float32
    one 1001 % 4), unmixed, asking for its rows in classes (KernelWriter._column_classes): each program owns `lanes` -
    G columns and walks the G classes, each class's rows through one aligned window, `rows` a step; every launch of
    such a kernel takes the classes, cdiv(1001, lanes - G) programs. Forward and backward against eager."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_column_classes(monkeypatch, lanes, rows)
    seen = _class_launches(monkeypatch, columns=True)
    torch.manual_seed(0)
    fn, inputs = COLUMN_SUMS[case](37, 1001)
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="looped", pipeline=UNMIXED)
    assert any("xbase = " in k.source for r in be.reports for k in r.kernel_info), case
    assert seen and all(window is True and programs == -(-1001 // (lanes - group)) for group, window, programs in seen)
    # the rows' narrowest dtype's group: 8 where the sum reads bfloat16 rows (the bias gradient's dy and h), 4 where
    # it reads float32 ones (a norm's statistics and x in float32, the float32 mean)
    assert {g for g, _, _ in seen} <= ({4} if case == "layer_norm" else {4, 8}), seen
    assert case != "bias_gelu_bf16" or {g for g, _, _ in seen} == {8}, seen


@needs_loop_bounds
def test_a_column_sums_rows_in_classes_under_a_run_time_row_count(monkeypatch):
    """Rows counted at run time (37, 5, 2 and 37 rows in one compiled function: classes without rows among them), a
    LayerNorm's weight and bias gradients in classes, against eager."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_column_classes(monkeypatch, 32, 4)
    seen = _class_launches(monkeypatch, columns=True)
    torch.manual_seed(0)
    _one_function_over_rows(torch.nn.LayerNorm(1001).bfloat16(), (37, 5, 2, 37), kernel_variant="looped",
                            pipeline=UNMIXED)
    assert seen and {w for _, w, _ in seen} == {True}, seen


def test_column_sums_without_classes():
    """No classes for a column sum whose rows start on 16-byte boundaries (1000 bfloat16 elements), reads its input
    across memory (a transposed x: a row sum), or reads it as a slice of a wider buffer (rows 1001 wide, 1003 apart:
    the window would take another row's group); each against eager."""
    torch.manual_seed(0)
    for x in (torch.randn(37, 1000, dtype=torch.bfloat16), torch.randn(1001, 37, dtype=torch.bfloat16).t(),
              torch.randn(37, 1003, dtype=torch.bfloat16)[:, 1:1002]):
        be = assert_matches_eager(lambda x: x.float().sum(0), [x], codegen="triton", kernel_variant="looped")
        assert not any(src.column_classes for k in _reductions(be) for src in k.variants.values()), x.shape


def test_a_column_sums_rows_in_classes_are_timed():
    """configs.column_class_band: beside the rule's block (or a band's), two blocks of the classes, 16 elements a
    thread, where their lanes hold a group of the program's own columns and fit the columns; none for a launch's
    worth of bytes. configs.column_windowed: a looped configuration asking for the window, lanes for a group of its
    own columns beside the head."""
    from passline.backends.triton.configs import Config, Variant, column_class_band, column_windowed

    base = Config(Variant.LOOPED, 32, 128, 8)
    got = column_class_band([], base, 12345, 10872, 8, 10872 * 4.0)
    assert got == [base] + [Config(Variant.LOOPED, x, r, w, window=True) for x, r, w in configs.COLUMN_CLASS_BLOCKS]
    assert all(c.xblock * c.rblock == 16 * 32 * c.warps for c in got[1:])
    assert column_class_band([], base, 40, 10872, 8, None) == [base, got[2]]  # 64 lanes: past the columns
    assert column_class_band([], base, 12345, 4, 8, 16.0) == []  # 200 KB
    assert column_windowed(got[1], 8) and column_windowed(Config(Variant.LOOPED, 16, 8, 4, window=True), 8)
    assert not column_windowed(Config(Variant.LOOPED, 8, 8, 4, window=True), 8) and not column_windowed(base, 8)


def test_a_column_sums_rows_in_classes_load_vectors_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a column sum of 64 bfloat16 rows of 3001 (a row starts 3001 % 8 elements past a 16-byte
    boundary) asking for its rows in classes reads them in 16-byte vectors; the rule's plain block reads each element
    alone."""
    x = torch.randn(64, 3001, dtype=torch.bfloat16)
    got = {}
    for classes in (False, True):
        if classes:
            _asking_for_column_classes(monkeypatch, 64, 64)
        ptx = gpu_compile(lambda x: x.sum(0), x, False, f"columns_{classes}").values()
        got[classes] = sum(_loads(p)["ld"] for p in ptx)
    assert got[True] > 0 and got[False] == 0, got


def test_rows_in_classes_are_not_timed_on_a_doubled_block():
    """A width within G - 1 of a power of two (bfloat16 1020: its block would double to 2048 to hold the head, half
    its lanes idle) times no rows in classes, as the mix-order kernel never takes them there; 1001 does."""
    from passline.backends.triton.configs import Config, Device, Variant, class_band

    base = Config(Variant.PERSISTENT, 1, 1024, 1)
    assert class_band([], base, 134218, 1020, 8, Device(132), None) == []
    assert len(class_band([], base, 134218, 1001, 8, Device(132), None)) == 2


@pytest.mark.parametrize("dtype, dynamic", [(torch.int8, True), (torch.float16, False)])
def test_a_column_sums_rows_in_classes_compiles_for_sm90_in_other_dtypes(gpu_compile, monkeypatch, dtype,  # noqa: F811
                                                                          dynamic):
    """The column sum's classes compiled for sm_90 where no other test compiles them (the review of the sixty-first
    session): an int8 column sum (16-element groups) under dynamic shapes, a float16 one static."""
    _asking_for_column_classes(monkeypatch, 64, 64)
    x = (torch.randn(64, 3001) * 3).to(dtype)
    fn = (lambda x: x.sum(0)) if dtype.is_floating_point else (lambda x: x.sum(0, dtype=dtype))
    assert gpu_compile(fn, x, dynamic, f"columns_{dtype}_{dynamic}")


def test_a_norms_rows_in_classes_compiles_for_sm90_two_rows_a_step_under_dynamic_shapes(gpu_compile,  # noqa: F811
                                                                                         monkeypatch):
    """The persistent classes compiled for sm_90 with two rows a step of the class loop and a run-time row count."""
    _asking_for_classes(monkeypatch, 2, xblock=2)
    x = torch.randn(64, 3001, dtype=torch.bfloat16, requires_grad=True)  # (the training step: forward and backward)
    ptx = gpu_compile(torch.nn.LayerNorm(3001).to(torch.bfloat16), x, True, "classes_dynamic")
    assert any(_loads(p)["ld"] > 0 for p in ptx.values()), {k: _loads(p) for k, p in ptx.items()}


def test_the_window_narrows_its_groups_where_a_16_byte_head_would_double_the_block():
    """kernel.window_cap: the widest group whose head (up to G - 1 lanes before the row) fits beside the row in its own
    block, pow2(width): 2 elements at 2**k - 1 and 2**k - 2, 4 at 2**k - 3 to 2**k - 4, 8 at 2**k - 7; widths far from
    a power of two keep 16 bytes of any dtype (16 1-byte elements at most)."""
    from passline.backends.triton.kernel import window_cap

    assert [window_cap(w) for w in (8191, 8190, 8189, 8188, 8185, 4095, 1023, 3)] == [2, 2, 4, 4, 8, 2, 2, 2]
    assert min(window_cap(w) for w in (12345, 3001, 1001, 777, 50257, 9001, 5001)) >= 16


NEAR_POW2 = {
    # 1023 bfloat16 elements (2046 bytes): 16-byte groups would take 1030 lanes; groups of 2 take 1024
    "softmax_bf16": lambda rows: (lambda x: torch.softmax(x, -1),
                                  [torch.randn(rows, 1023, dtype=torch.bfloat16, requires_grad=True)]),
    "cross_entropy_bf16": lambda rows: (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
                                        [torch.randn(rows, 1023, dtype=torch.bfloat16, requires_grad=True),
                                         torch.randint(0, 1023, (rows,))]),
    # float32 rows of 2047 (8188 bytes): groups of 2 (8-byte vectors) where 4 would need 2050 lanes
    "layer_norm": lambda rows: (torch.nn.LayerNorm(2047), [torch.randn(rows, 2047, requires_grad=True)]),
}


@pytest.mark.parametrize("case", sorted(NEAR_POW2))
def test_rows_a_lane_short_of_a_power_of_two_run_through_a_window_of_smaller_groups(monkeypatch, case):
    """A persistent kernel over rows one element short of a power of two, each row at its own offset from a 16-byte
    boundary: its window takes groups of 2 elements (`window_cap`), so that the row's own block (1024, 2048) holds
    it and its head; every launch asking for the window runs it (WINDOW), forward and backward against eager."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    _asking_for_the_window(monkeypatch, True, one_row=True)
    seen = _launches_windows(monkeypatch)
    torch.manual_seed(0)
    fn, inputs = NEAR_POW2[case](6)
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="persistent")
    windows = [src for k in _reductions(be) for src in k.variants.values() if src.window]
    assert windows and {src.window for src in windows} == {2}, [src.window for src in windows]
    assert all("rlo = (rbase // 2) * 2" in src.source and "rtake2" in src.source for src in windows)
    assert {src.window_itemsize for src in windows} == {inputs[0].element_size()}
    assert seen and all(seen), seen


@needs_loop_bounds
@pytest.mark.parametrize("case", ["layer_norm_bf16", "rms_norm"])
def test_a_mixed_kernels_rows_a_lane_short_of_a_power_of_two_take_classes_of_two(monkeypatch, case):
    """A mix-order kernel over 21 rows of 1023 (bfloat16: 2046-byte rows; float32: 4092) takes its rows in two classes
    (groups of 2 elements: a row's head fits its block of 1024), launched so (WINDOW) where its 11 programs give
    each class one; dx and the column sums against eager. Before, such a width never took classes (16-byte groups
    would have doubled the block) and read every element on its own."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    seen = _mix_launches(monkeypatch)
    torch.manual_seed(0)
    fn, inputs = MIXED[case](21, 1023)
    be = assert_matches_eager(fn, inputs, codegen="triton", pipeline=_mixed_pipeline(2))
    (main,) = [k for k in be.reports[-1].kernel_info if k.kind == "mix_order"]
    assert "rclass = program % 2" in main.source and "rtake2" in main.source
    assert {c["WINDOW"] for c in seen} == {True}, seen


def test_which_launches_take_a_window_of_smaller_groups():
    """configs.windowed and class_band with a 2-element group: the row's own block holds it; rows of 1 KB or more by
    the rows' dtype (`itemsize`), not by 16 bytes over the group (511 bfloat16 elements are 1022 bytes)."""
    from passline.backends.triton.configs import Config, Device, Variant, class_band, windowed

    mix = Config(Variant.MIX_ORDER, 1, 1024, 4, 3, 170)
    assert windowed(mix, 1023, 2, 264, itemsize=2) and windowed(attrs.evolve(mix, rblock=4096), 4095, 2, 264, 4)
    assert not windowed(attrs.evolve(mix, rblock=512), 511, 2, 264, itemsize=2)  # 1022-byte rows
    assert windowed(Config(Variant.PERSISTENT, 1, 8192, 4, window=True), 8191, 2)  # the one-row window: no bound
    base = Config(Variant.PERSISTENT, 1, 1024, 1)
    assert len(class_band([], base, 134218, 1023, 2, Device(132), None, itemsize=2)) == 2
    assert class_band([], Config(Variant.PERSISTENT, 1, 512, 1), 134218, 511, 2, Device(132), None, itemsize=2) == []


def test_rows_a_lane_short_of_a_power_of_two_load_pairs_on_sm90(gpu_compile, monkeypatch):  # noqa: F811
    """Compiled for sm_90: a bfloat16 LayerNorm forward over 64 rows of 4095 asking for rows in classes reads and
    writes its rows two elements at a time (`ld.global.b32`, `st.global.b32`: a 4-byte pair of bfloat16); its plain
    block reads each element on its own (no 4-byte load of a row). On an H200 a hand-written LayerNorm forward at
    32776 x 4095 took 141.8 µs so against 275.0 element by element (`kernel.window_cap`)."""
    got = _norm_forward_with_and_without_classes(gpu_compile, monkeypatch, 4095, lambda ptx: {
        what: len(re.findall(rf"{what}\.global[\w.:]*\.b32 ", ptx)) for what in ("ld", "st")})
    assert got[True]["ld"] > 0 and got[True]["st"] > 0 and got[False] == {"ld": 0, "st": 0}, got


@needs_loop_bounds
@pytest.mark.parametrize("dtype, classes", [(torch.bfloat16, False), (torch.float32, True)])
def test_a_mixed_kernels_4_byte_pairs_stay_out_of_a_block_of_8192(monkeypatch, dtype, classes):
    """A mix-order kernel over rows of 8191 takes classes of 2-element groups in float32 (8 bytes: faster at every
    width timed) but not in bfloat16 (4 bytes, block of 8192: on an H200 LayerNorm's backward at 16386 x 8191 went from
    416 to 565 µs so; kernel.MIX_CLASS_PAIRS_MAX_BLOCK); both against eager."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 16384)
    torch.manual_seed(0)
    x = torch.randn(9, 8191, dtype=dtype, requires_grad=True)
    be = assert_matches_eager(torch.nn.LayerNorm(8191).to(dtype), [x], codegen="triton", pipeline=_mixed_pipeline(2))
    (main,) = [k for k in be.reports[-1].kernel_info if k.kind == "mix_order"]
    assert ("if WINDOW:" in main.source) == classes and ("rtake2" in main.source) == classes
