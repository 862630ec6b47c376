"""mix_order_reduction's tiled form: a pointwise row side (a bias gradient's dh) too wide for whole rows in
registers is mixed with its column sums anyway, the kernel taking its columns in blocks (mix_order_tiled): one
main kernel writing dh and the workspace, one finishing kernel, where it was a pointwise kernel and a column sum
reading dh back (4 passes over memory instead of 3)."""
import pytest
import torch

import passline
from passline.backends.triton.configs import Config, Device, rule, tiled_candidates, uncertain
from passline.backends.variants import KernelVariant as Variant
from passline.ir import FusedNode, MixOrderNode, Pointwise
from passline.testing import assert_matches_eager

# sms=1: no row count is too few for the SMs, so a GPU run (PASSLINE_TEST_DEVICE=cuda) tiles these small shapes
# as the CPU target does; the SM gates are tested below with sms=132
ONE_SM = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=1)")
# rows of 3000 float32 fit the width gates (12 KB): a smaller max_row_bytes makes them a tiled pair
NARROW_GATE = ONE_SM.replace("sms=1", "max_row_bytes=8192, sms=1")


def _gelu_bias(h, b):
    return torch.nn.functional.gelu(h + b)


def _scale_bias(x, w, b):
    return x * w + b


def _tiled(be, columns: int):
    """The backward's report, asserting it is one tiled mix-order node launched as its main kernel (the
    tiled form, blocks of fewer columns than the row has) and the finishing kernel, and nothing else."""
    bwd = be.reports[-1]
    nodes = bwd.graph.nodes()
    assert len(nodes) == 1 and isinstance(nodes[0], MixOrderNode) and nodes[0].tiled, bwd.graph.format()
    assert nodes[0].columns == columns or not nodes[0].columns.is_number  # a run-time width: its traced one
    kinds = sorted(k.kind for k in bwd.kernel_info)
    assert kinds == ["mix_finish", "mix_order"], kinds
    (main,) = [k for k in bwd.kernel_info if k.kind == "mix_order"]
    assert main.chosen == "mix_order_tiled" and main.blocks["RBLOCK"] < columns, main.blocks
    assert "split_id = program // column_blocks" in main.source
    return bwd


@pytest.mark.parametrize("shape, dtype, pipeline", [
    ((40, 12344), torch.bfloat16, None),  # past max_columns' 8192 in registers: refused before
    ((40, 12344), torch.float32, None),
    ((300, 3000), torch.float32, NARROW_GATE),  # three splits of 128 rows, the last ragged; 3 column blocks
    ((2, 30, 9000), torch.float32, None),  # rows over two dims; 9000 float32 take 36 KB
])
def test_wide_bias_gradient_mixes_tiled(shape, dtype, pipeline):
    h = torch.randn(*shape, dtype=dtype, requires_grad=True)
    b = torch.randn(shape[-1], dtype=dtype, requires_grad=True)
    be = assert_matches_eager(_gelu_bias, [h, b], pipeline=pipeline or ONE_SM, codegen="triton")
    bwd = _tiled(be, shape[-1])
    # dh is written over a buffer of its size that dies at the kernel (h's saved copy or the incoming
    # gradient), where nothing else holds it: each point is read and written by one program, loads first
    (line,) = [ln for ln in bwd.runner.source.splitlines() if " if sole(" in ln]
    assert "empty0((" in line, line


def test_scale_and_bias_gradients_mix_tiled():
    """x * w + b: dx = dy * w is the row side, dw and db two column sums of the same rows, all in one kernel."""
    x = torch.randn(64, 3000, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3000, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(3000, dtype=torch.bfloat16, requires_grad=True)
    be = assert_matches_eager(_scale_bias, [x, w, b], pipeline=NARROW_GATE.replace(
        "max_row_bytes=8192", "max_row_bytes=4096"), codegen="triton")
    bwd = _tiled(be, 3000)
    assert len(bwd.graph.nodes()[0].column_groups) >= 1


@pytest.mark.parametrize("make_h", [lambda: torch.randn(64, 3100)[:, :3000],  # rows 3100 apart
                                    lambda: torch.randn(64, 6000)[:, ::2]])  # every other column
def test_non_contiguous_input_mixes_tiled(make_h):
    """h a non-contiguous view: the pass still mixes, the kernel reads it through its strides. (A transposed
    h is not a mix-order pair: memory_order runs the column sum along memory and it fuses with dh.)"""
    h = make_h().requires_grad_()
    b = torch.randn(3000, requires_grad=True)
    be = assert_matches_eager(_gelu_bias, [h, b], pipeline=NARROW_GATE, codegen="triton")
    _tiled(be, 3000)


def test_tile_columns_off_and_row_sums_keep_the_width_gates():
    """tile_columns=False refuses a wide pointwise pair as before; a row side that reduces its rows (LayerNorm's
    backward) is never tiled, whatever the option."""
    h = torch.randn(16, 9000, requires_grad=True)
    b = torch.randn(9000, requires_grad=True)
    off = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(tile_columns=false)")
    bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=off, codegen="reference").reports[-1]
    assert not any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), bwd.graph.format()
    refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
    assert any("max_row_bytes" in d for d in refused), refused
    bwd = assert_matches_eager(torch.nn.LayerNorm(9000), [h], codegen="reference").reports[-1]
    assert not any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), bwd.graph.format()


@pytest.mark.parametrize("make_h, dtype", [
    (lambda dt: torch.randn(40, 12345, dtype=dt), torch.bfloat16),  # an odd width
    (lambda dt: torch.randn(40, 9002, dtype=dt), torch.float32),  # 36008 bytes a row: 8 past a vector
    (lambda dt: torch.randn(40, 9004, dtype=dt)[:, :9000], torch.bfloat16),  # rows 18008 bytes apart
])
def test_rows_off_vector_boundaries_are_not_tiled(make_h, dtype):
    """A tiled kernel loads a block of columns in 16-byte vectors only where every row starts on a 16-byte
    boundary and the width is whole vectors; elsewhere it loads element by element (2.2-2.5x the unmixed pair's
    time at 12345 wide on an H200), so the pair stays unmixed, saying why."""
    h = make_h(dtype).requires_grad_()
    b = torch.randn(h.shape[-1], dtype=dtype, requires_grad=True)
    bwd = assert_matches_eager(_gelu_bias, [h, b], codegen="triton").reports[-1]
    assert not any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), bwd.graph.format()
    refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
    assert any("not a multiple of 16" in d and "tile_columns" in d for d in refused), refused


def test_narrow_pairs_keep_their_whole_row_forms():
    """A pair that fits the width gates is mixed as before: not tiled, the whole-row forms its variants."""
    h = torch.randn(64, 384, requires_grad=True)
    b = torch.randn(384, requires_grad=True)
    bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=ONE_SM, codegen="triton").reports[-1]
    (mix,) = bwd.graph.nodes()
    assert isinstance(mix, MixOrderNode) and not mix.tiled
    (main,) = [k for k in bwd.kernel_info if k.kind == "mix_order"]
    assert main.chosen in ("mix_order", "mix_order_acc2d") and "column_blocks" not in main.source


def test_tiled_rule_and_grid():
    """By rule on a GPU: blocks of 1024 columns on 4 warps, 96 bytes of traffic a thread (one float32 row of dy,
    h and dh a step, two bfloat16 rows), 3 stages; a program per block of SPLIT rows and block of columns."""
    variants = {Variant.MIX_ORDER_TILED: 128}
    cfg = rule(variants, 2237, 30000, False, Device(), row_bytes=12 * 30000)
    assert (cfg.variant, cfg.xblock, cfg.rblock, cfg.warps, cfg.stages) == (Variant.MIX_ORDER_TILED, 1, 1024, 4, 3)
    # bfloat16 dy, h and dh: 6 bytes an element, and the workspace's share (6.08 a GELU epilogue's)
    assert rule(variants, 2237, 30000, False, Device(), row_bytes=6.08 * 30000).xblock == 2
    assert cfg.column_blocks(30000) == 30 and cfg.programs(2237, 30000) == 18 * 30
    assert Config(Variant.MIX_ORDER_ACC2D, 2, 512, 4, 1, 128).programs(2237, 500) == 18  # whole rows: one
    small = rule(variants, 100, 700, False, Device(), row_bytes=12 * 700)
    assert small.rblock == 1024 and small.column_blocks(700) == 1
    on_gpu = tiled_candidates(32768, 128, interpret=False)
    assert {c.rblock for c in on_gpu} == {512, 1024, 2048} and all(1024 <= c.xblock * c.rblock <= 4096 for c in on_gpu)
    (interp,) = tiled_candidates(16384, 128, interpret=True)
    assert (interp.rblock, interp.xblock) == (1024, 128)


def test_tiled_split_counts_every_program_of_a_wave():
    """MixKernel.waves: one whole wave counts a block of rows as its column blocks' programs, never under 64
    rows a program (the workspace [splits, columns] stays small against the data)."""
    from passline.backends.triton.runner import MixKernel, _resident

    class Compiled:
        n_regs, metadata = 48, None

    k = MixKernel.__new__(MixKernel)
    k.device, k.info = Device(sms=132), type("I", (), {"variants": {Variant.MIX_ORDER_TILED: None}})()
    tiled = Config(Variant.MIX_ORDER_TILED, 2, 1024, 8, 4, 128)  # 30 blocks of columns at 30000
    waves = k.waves(tiled, Compiled(), 2237, 30000)
    per_wave = 132 * _resident(48, 8)  # 48 registers a thread on 8 warps: 5 programs an SM
    assert waves[0] == -(-2237 * 30 // per_wave) and all(s >= 64 for s in waves)
    # every k-wave split's programs fit k waves: whole blocks of rows, each its 50 column blocks' programs
    wide = k.waves(tiled, Compiled(), 8192, 50304)
    for n, s in enumerate(wide, 1):
        assert -(-8192 // s) * 50 <= n * per_wave
    assert -(-8192 // (wide[0] - 1)) * 50 > per_wave  # and one row fewer a program would not
    whole_rows = Config(Variant.MIX_ORDER_ACC2D, 2, 1024, 8, 4, 128)  # one program a block of rows
    assert k.waves(whole_rows, Compiled(), 2237, 1000) == []  # a split of 3 rows is under the floor


@pytest.mark.parametrize("width, scalar", [(4099, True), (4100, False), (1001, True)])
def test_rows_off_16_byte_boundaries_are_said_to_the_band(width, scalar):
    """A mix-order kernel whose rows do not start on 16-byte boundaries (4099 or 1001 float32: each element a
    load of its own) says so (`KernelSource.scalar_rows`, which configs.uncertain reads); 4100 does not."""
    h = torch.randn(64, width, requires_grad=True)
    b = torch.randn(width, requires_grad=True)
    bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=ONE_SM, codegen="triton").reports[-1]
    (main,) = [k for k in bwd.kernel_info if k.kind == "mix_order"]
    assert {src.scalar_rows for src in main.variants.values()} == {scalar}


def test_wide_pointwise_row_sides_time_the_one_row_and_the_tiled_forms():
    """Rows 4097-8192 wide of a pointwise row side: the rule holds them whole (the one-row form) and the first
    launch times that against the tiled form's block and two rows a block on 16 warps (on an H200 a bias gradient
    at 19174 x 7000 bfloat16 took 424 µs whole, 276 tiled; at 32760 x 4097, 554, 1596 and 397); a row side with row
    sums (a norm) keeps its rule.
    At 129-4096 wide the tiled block joins the band where the rows are loaded an element at a time."""
    forms = {Variant.MIX_ORDER: 128, Variant.MIX_ORDER_ACC2D: 128, Variant.MIX_ORDER_TILED: 128}
    gpu = Device(sms=132)
    base = rule(forms, 19174, 7000, False, gpu, row_bytes=6.08 * 7000)
    assert (base.variant, base.xblock, base.rblock) == (Variant.MIX_ORDER, 1, 8192)
    band = uncertain(forms, 19174, 7000, False, gpu, base=base, row_bytes=6.08 * 7000)
    assert band[0] == base and [(c.variant, c.xblock, c.rblock, c.warps) for c in band[1:]] == [
        (Variant.MIX_ORDER_TILED, 2, 1024, 4), (Variant.MIX_ORDER, 2, 8192, 16)]  # and two rows a block
    whole = {Variant.MIX_ORDER: 128, Variant.MIX_ORDER_ACC2D: 128}
    norm = rule(whole, 19174, 7000, False, gpu, row_bytes=8 * 7000, row_sums=True)
    assert uncertain(whole, 19174, 7000, False, gpu, base=norm, row_bytes=8 * 7000, row_sums=True) == []
    narrow = rule(forms, 22362, 3001, False, gpu, row_bytes=12 * 3001)
    plain, scalar = (uncertain(forms, 22362, 3001, False, gpu, base=narrow, row_bytes=12 * 3001, scalar_rows=s)
                     for s in (False, True))
    tiled = Config(Variant.MIX_ORDER_TILED, 1, 1024, 4, 3, 128)
    assert tiled not in plain and scalar == plain + [tiled]


@pytest.mark.parametrize("rows, tuned", [(100, False), (300, True)])
def test_a_node_of_one_split_keeps_its_split(tmp_path, rows, tuned):
    """A node whose split covers every row (100 rows tiled at 128 a split) has a finishing kernel that reads the
    workspace's one row (the sum over one split drops its index): a GPU's whole-wave split (64 rows: two programs)
    would have summed row 0 twice and lost the second program's column sums (a review's find, by a forced split).
    Such a node's split is not the GPU's to choose; 300 rows (three splits) still is."""
    from passline.backends.triton.cache import KernelCache
    from passline.backends.triton.runner import TritonRunner

    h = torch.randn(rows, 12344, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(12344, dtype=torch.bfloat16, requires_grad=True)
    bwd = _tiled(assert_matches_eager(_gelu_bias, [h, b], pipeline=ONE_SM, codegen="triton"), 12344)
    runner = TritonRunner(bwd.graph, interpret=False, cache=KernelCache(tmp_path / "passline"))  # a GPU's plan
    (main,) = [data[0] for kind, _, data in runner.steps if kind == "mix"]
    assert main.tune_split is tuned and main._tuned() is tuned


def test_dynamic_rows_and_width_mix_tiled():
    """Run-time rows and width: the node is gated at the traced width and tiled; its kernel's column blocks
    follow the width each call passes (`tl.cdiv(rnumel, RBLOCK)`)."""
    torch._dynamo.reset()
    be = passline.backend(fallback="raise", codegen="triton", pipeline=ONE_SM)
    compiled = torch.compile(_gelu_bias, backend=be)
    for rows, cols in [(40, 9000), (33, 9100)]:
        h = torch.randn(rows, cols, requires_grad=True)
        b = torch.randn(cols, requires_grad=True)
        if rows == 40:
            torch._dynamo.mark_dynamic(h, 0)
        h2, b2 = h.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        dy = torch.randn(rows, cols)
        compiled(h, b).backward(dy)
        _gelu_bias(h2, b2).backward(dy)
        torch.testing.assert_close(h.grad, h2.grad)
        torch.testing.assert_close(b.grad, b2.grad, atol=1e-4, rtol=1e-4)
    assert be.reports[-1].graph.hints and _tiled(be, 9100)


def _column_form(bwd):
    """The backward's one node when it is the column form: a FusedNode over (columns | rows) whose pointwise
    members store dh inside the row loop; else None."""
    nodes = bwd.graph.nodes()
    if len(nodes) != 1 or not isinstance(nodes[0], FusedNode) or not nodes[0].reduction_ranges:
        return None
    return nodes[0]


@pytest.mark.parametrize("rows, form", [(64, "columns"), (300, "unmixed"), (1024, "tiled")])
def test_too_few_rows_for_the_gpu_are_not_tiled(rows, form):
    """Planned for a GPU (`sms`), a tiled kernel has at most one program a block of 64 rows and 1024 columns:
    300 x 9000 makes 45 for 132 SMs, each walking its rows alone (on an H200 64 x 30000 took ten times
    Inductor's time), so the pair is not tiled, saying why; 64 rows get the column form instead (9000 columns
    make a program of 16 for every SM, and 64 rows are few enough); 1024 rows make 144, tiled. No GPU
    planned for: no bound."""
    h = torch.randn(rows, 9000, requires_grad=True)
    b = torch.randn(9000, requires_grad=True)
    gpu = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=132)")
    bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=gpu, codegen="reference").reports[-1]
    tiled = any(isinstance(n, MixOrderNode) and n.tiled for n in bwd.graph.nodes())
    assert tiled == (form == "tiled") and (_column_form(bwd) is not None) == (form == "columns"), bwd.graph.format()
    if form == "unmixed":
        refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
        assert any("45 tiled programs" in d and "132 SMs" in d for d in refused), refused
    if form != "tiled":  # (sms=1: the CPU target's bound, on a GPU run too)
        bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=ONE_SM, codegen="reference").reports[-1]
        assert any(isinstance(n, MixOrderNode) and n.tiled for n in bwd.graph.nodes()), bwd.graph.format()


@pytest.mark.parametrize("columns, form", [(2112, True), (1000, False)])
def test_few_rows_of_a_bias_gradient_take_the_column_form(columns, form):
    """64 rows are too few to mix whole on a GPU (4 programs of 16 rows for 132 SMs). A pointwise row side (a
    bias gradient's dh) is then fused into its column sum in the sum's loop order — one kernel whose programs
    take 16 or more columns down all 64 rows, storing dh as they sum it, where the unmixed pair wrote dh and
    read it back in a second kernel (on an H200, 64 x 8192 bfloat16: 3.9 us against Inductor's one kernel's
    3.3) — where the columns make a program for every SM: 2112 columns do (132 blocks of 16), 1000 do not
    (63), and stay the unmixed pair. A norm's backward (row sums) has no such form; `column_form=false` turns
    it off. Generated by Triton (the interpreter here) and checked against eager."""
    h = torch.randn(64, columns, requires_grad=True)
    b = torch.randn(columns, requires_grad=True)
    gpu = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=132)")
    be = assert_matches_eager(_gelu_bias, [h, b], pipeline=gpu, codegen="triton")
    bwd = be.reports[-1]
    assert (_column_form(bwd) is not None) == form, bwd.graph.format()
    assert bwd.kernels == (1 if form else 2)
    if form:
        node = _column_form(bwd)
        assert [int(n) for n in node.ranges] == [columns] and [int(n) for n in node.reduction_ranges] == [64]
        stats = {k: v for ps in bwd.passes for k, v in ps.stats.items()}
        assert stats.get("column_form") == 1
        off = gpu.replace("sms=132", "sms=132, column_form=false")
        bwd = assert_matches_eager(_gelu_bias, [h, b], pipeline=off, codegen="reference").reports[-1]
        assert _column_form(bwd) is None and bwd.kernels == 2
    ln = torch.nn.LayerNorm(columns)
    bwd = assert_matches_eager(ln, [h], pipeline=gpu, codegen="reference").reports[-1]
    assert not any(ps.stats.get("column_form") for ps in bwd.passes), bwd.graph.format()
    # a pointwise side beside the column sum (both read x, neither reads the other) takes the form too
    x = torch.randn(64, columns)
    fwd = assert_matches_eager(lambda x: (torch.nn.functional.gelu(x), x.sum(0)), [x], pipeline=gpu,
                               codegen="triton").reports[0]
    assert fwd.kernels == (1 if form else 2), fwd.graph.format()


def _dx_with_column_sums(bwd):
    """The backward's node that computes the norm's dx inside the column sums' loop (the column form: ranges
    the columns, reduced over the rows, a pointwise member among its reductions), or None."""
    for n in bwd.graph.nodes():
        if isinstance(n, FusedNode) and n.reduction_ranges and any(isinstance(m, Pointwise) for m in n.members()):
            return n
    return None


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_a_norms_dx_split_from_its_row_sums_takes_the_column_form(norm):
    """A norm's backward over few long rows, planned for a 132-SM GPU: split_reductions splits the row sums
    (8 rows of 32768 float32 are too few programs), which leaves dx a pointwise node of its own beside the
    weight's column sums. mix_order_reduction, run again after it (the default pipeline), gives that pair the
    column form — one kernel walking blocks of columns down every row, storing dx as it sums — so x and dy are
    read twice (the partial row sums, then the column form), not three times (partial row sums, column sums,
    dx). Generated by Triton (the interpreter here) and checked against eager."""
    m = torch.nn.LayerNorm(32768) if norm == "layer_norm" else torch.nn.RMSNorm(32768)
    x = torch.randn(8, 32768, requires_grad=True)
    gpu = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=132)")
    gpu = gpu.replace("split_reductions", "split_reductions(sms=132)")
    bwd = assert_matches_eager(m, [x], pipeline=gpu, codegen="triton").reports[-1]
    stats = {k: v for ps in bwd.passes for k, v in ps.stats.items()}
    assert stats.get("num_split_reductions") and stats.get("column_form") == 1, bwd.graph.format()
    node = _dx_with_column_sums(bwd)
    assert node is not None, bwd.graph.format()
    assert [int(n) for n in node.ranges] == [32768] and [int(n) for n in node.reduction_ranges] == [8]
    assert bwd.kernels == 3, bwd.graph.format()  # partial row sums, their finish, the column form
    # without the second run: dx a kernel of its own, reading x and dy a third time
    once = gpu.replace("split_reductions(sms=132), mix_order_reduction(sms=132)", "split_reductions(sms=132)")
    assert once.count("mix_order_reduction") == 1
    alone = assert_matches_eager(m, [x], pipeline=once, codegen="reference").reports[-1]
    assert _dx_with_column_sums(alone) is None and alone.kernels == 4, alone.graph.format()


def test_a_norms_split_dx_is_not_tiled_where_its_tiled_programs_would_fill_the_sms():
    """Planned for 16 SMs, 8 rows of 32768 make 32 tiled programs (blocks of 64 rows and 1024 columns): enough for
    the tiled form, which the second run gave this dx until it was timed (H200, float32 norms' backwards at 129-256
    rows: 1.42x Inductor's kernel time tiled, 1.26x unmixed, 0.70-1.05x in the column form). dx reads its rows'
    finished sums (`_reads_row_values`), so the pair takes the column form; checked against eager."""
    gpu = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=16)")
    gpu = gpu.replace("split_reductions", "split_reductions(sms=16)")
    x = torch.randn(8, 32768, requires_grad=True)
    bwd = assert_matches_eager(torch.nn.LayerNorm(32768), [x], pipeline=gpu, codegen="reference").reports[-1]
    stats = {k: v for ps in bwd.passes for k, v in ps.stats.items()}
    assert stats.get("num_split_reductions") and stats.get("column_form") == 1, bwd.graph.format()
    assert not any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), bwd.graph.format()
    assert _dx_with_column_sums(bwd) is not None and bwd.kernels == 3, bwd.graph.format()


@pytest.mark.parametrize("rows, mixed", [(64, False), (2112, True)])
def test_too_few_rows_for_the_gpu_are_not_mixed_whole(rows, mixed):
    """Planned for a GPU, a pair mixed whole has at most one program a block of 16 rows: 64 rows make 4 for
    132 SMs (on an H200 a bfloat16 LayerNorm backward 64 x 8192 took 23 µs mixed, 7 unmixed), so the pair
    stays unmixed, saying why; 2112 rows make 132, mixed. A split the pipeline fixes mixes anyway."""
    ln = torch.nn.LayerNorm(64)
    x = torch.randn(rows, 64, requires_grad=True)
    gpu = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=132)")
    bwd = assert_matches_eager(ln, [x], pipeline=gpu, codegen="reference").reports[-1]
    assert any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()) == mixed, bwd.graph.format()
    refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
    assert mixed or any("64 rows make 4 programs" in d and "132 SMs" in d for d in refused), refused
    if not mixed:
        fixed = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(sms=132, split_rows=16)")
        bwd = assert_matches_eager(ln, [x], pipeline=fixed, codegen="reference").reports[-1]
        assert any(isinstance(n, MixOrderNode) for n in bwd.graph.nodes()), bwd.graph.format()


def test_expanded_input_rows_are_aligned():
    """A broadcast (stride 0) dim starts every row of an expanded input at the same address: its rows are on
    16-byte boundaries where the width is, and the pair is tiled (the smallest stride, 0, is not the one a row's
    elements run along)."""
    x = torch.randn(1, 3000).expand(64, 3000)
    h = torch.randn(64, 3000, requires_grad=True)
    b = torch.randn(3000, requires_grad=True)
    be = assert_matches_eager(lambda h, x, b: torch.nn.functional.gelu(h * x + b), [h, x, b], pipeline=NARROW_GATE,
                              codegen="triton")
    bwd = be.reports[-1]
    assert any(isinstance(n, MixOrderNode) and n.tiled for n in bwd.graph.nodes()), (
        bwd.graph.format(), [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"])


def test_a_stride_without_a_traced_value_refuses_by_name():
    """A row stride with no traced value is checked (and refuses, named), not sorted as the smallest."""
    from types import SimpleNamespace as NS

    import sympy

    from passline.ir.nodes import Layout
    from passline.passes.mix_order_reduction import _unaligned

    s1 = sympy.Symbol("s1", integer=True, positive=True)
    x = NS(layout=Layout((64, 9000), (s1, 1), torch.float32), dtype=torch.float32)
    side = NS(read_names=lambda: ["x"], output_names=lambda: [])
    col = NS(read_names=lambda: [], output_names=lambda: [])
    why = _unaligned(side, col, {"x": x}, sympy.Integer(64 * 9000), sympy.Integer(9000), {})
    assert why and "row stride of s1 (no traced value)" in why, why
    assert _unaligned(side, col, {"x": x}, sympy.Integer(64 * 9000), sympy.Integer(9000), {s1: 9004}) is None


def test_a_bool_mask_needs_8_byte_rows():
    """A 1-byte buffer (a dropout-style mask) is loaded 8 adjacent elements a thread: rows of 9000 bools (8-byte
    multiples, not 16) are tiled; 9004 (float32 rows of whole vectors, bool rows 4 bytes off) not."""
    for width, tiled in ((9000, True), (9004, False)):
        h = torch.randn(64, width, requires_grad=True)
        b = torch.randn(width, requires_grad=True)
        mask = torch.rand(64, width) > 0.3
        bwd = assert_matches_eager(lambda h, b, m: torch.nn.functional.gelu(h + b) * m, [h, b, mask],
                                   pipeline=ONE_SM, codegen="reference").reports[-1]
        assert any(isinstance(n, MixOrderNode) and n.tiled for n in bwd.graph.nodes()) == tiled, bwd.graph.format()
        if not tiled:
            refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
            assert any("x 1 bytes, not a multiple of 8" in d for d in refused), refused


def test_a_transposed_input_is_not_tiled():
    """x stored transposed (its rows adjacent in memory): a block of columns would read it one element a row,
    while unmixed, memory_order lets the pointwise kernel take it in its own order. The pair stays unmixed,
    saying why; the same x contiguous is tiled."""
    h = torch.randn(64, 9000, requires_grad=True)
    b = torch.randn(9000, requires_grad=True)
    fn = lambda h, b, x: torch.nn.functional.gelu(h * x + b)  # noqa: E731
    for x, tiled in ((torch.randn(9000, 64).t(), False), (torch.randn(64, 9000), True)):
        bwd = assert_matches_eager(fn, [h, b, x], pipeline=ONE_SM, codegen="triton").reports[-1]
        assert any(isinstance(n, MixOrderNode) and n.tiled for n in bwd.graph.nodes()) == tiled, bwd.graph.format()
        refused = [f.detail for f in bwd.metrics.refusals if f.pass_name == "mix_order_reduction"]
        assert tiled or any("a transposed layout" in d and "tile_columns" in d for d in refused), refused
