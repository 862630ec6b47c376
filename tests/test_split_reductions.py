"""split_reductions: reductions with few outputs over a long range, split into partial and finishing
reductions — against eager on both backends, the rule on a GPU target, and what it must leave alone."""
import pytest
import sympy
import torch
from modules import MIXED

import passline
from passline.ir import Buffer, FusedNode, Layout, Load, MixOrderNode, Op, Reduction, TensorArg, loop_vars, walk
from passline.lowering import GraphInput, Program
from passline.pipeline import SchedulerGraph
from passline.pipeline.registry import PipelineError
from passline.pipeline.target import Target
from passline.testing import assert_matches_eager

BOTH = ["reference", "triton"]


def pipeline(**options) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    return MIXED.replace("split_reductions", f"split_reductions({opts})")  # these tests are about the split


def split_count(be) -> int:
    return sum(p.stats.get("num_split_reductions", 0) for r in be.reports for p in r.passes)


def partials(be) -> list:
    return [m for r in be.reports for m in r.graph.leaf_nodes() if m.name.endswith("_partial")]


def cl(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).to(memory_format=torch.channels_last)


# fn, inputs, reductions split (splits=4): every kind the pass combines, in both layouts and dtypes
CASES = {
    "full_sum": (lambda x: x.sum(), lambda: [torch.randn(37, 29)], 1),
    "column_sum": (lambda x: x.sum(0), lambda: [torch.randn(600, 8)], 1),
    "column_sum_bf16": (lambda x: x.sum(0), lambda: [torch.randn(600, 8, dtype=torch.bfloat16)], 1),
    "channels_last_stats": (lambda x: x.sum((0, 2, 3)), lambda: [cl(4, 8, 9, 9)], 1),
    # reduced dims with a kept dim between them: the flat index is split back with FloorDiv/ModularIndexing
    "gapped_dims": (lambda x: x.sum((0, 2)), lambda: [torch.randn(6, 4, 50)], 1),
    "gapped_masked": (lambda x: x.sum((0, 2)), lambda: [torch.randn(7, 3, 11)], 1),
    "long_rows": (lambda x: x.sum(1), lambda: [torch.randn(3, 1000)], 1),
    "prime_column": (lambda x: x.sum(0), lambda: [torch.randn(997, 4)], 1),  # 997 points: a masked last chunk
    "max_min": (lambda x: (x.amax(0), x.amin(1)), lambda: [torch.randn(3, 501)], 2),
    "max_bf16": (lambda x: x.amax(), lambda: [torch.randn(523, dtype=torch.bfloat16)], 1),
    "prod_any_all": (lambda x: ((x * 0.01 + 1).prod(0), (x > 2).any(0), (x > -3).all(1)),
                     lambda: [torch.randn(301, 3)], 3),
}


@pytest.mark.parametrize("codegen", BOTH)
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_matches_eager(name, codegen):
    fn, inputs, n = CASES[name]
    be = assert_matches_eager(fn, inputs(), pipeline=pipeline(splits=4), codegen=codegen)
    assert split_count(be) == n
    if codegen == "triton":
        assert "reference backend" not in be.reports[0].codegen_reason  # every kernel ran on Triton


def test_prime_range_is_masked_and_never_read_past_its_end():
    be = assert_matches_eager(lambda x: x.sum(0), [torch.randn(997, 4)], pipeline=pipeline(splits=4),
                              codegen="reference")
    (p,) = partials(be)
    # 997 = 4 chunks of 250 (the last one 3 short): the points past the end add 0, and the index is clamped
    assert p.reduction_ranges == (250,) and p.ranges == (4, 4)
    assert any(isinstance(v, Op) and v.name == "where" for v in walk(p.body))
    (ld,) = [v for v in walk(p.body) if isinstance(v, Load)]
    assert ld.index.has(sympy.Min)


def test_batchnorm_training_step_channels_last():
    # conv -> BN -> ReLU: the forward's mean and sum of squares are split; the backward's two column sums
    # (dweight, dbias) are already split by mix-order, with dx (its pointwise members' loops in
    # channels_last order), and a MixOrderNode is left alone
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    block = block.to(memory_format=torch.channels_last)
    x = cl(4, 3, 16, 16).requires_grad_()
    for codegen in BOTH:
        be = assert_matches_eager(block, [x], pipeline=pipeline(splits=4), codegen=codegen)
        forward, backward = be.reports
        assert [sum(p.stats.get("num_split_reductions", 0) for p in r.passes) for r in be.reports] == [2, 0]
        (mix,) = [n for n in backward.graph.nodes() if isinstance(n, MixOrderNode)]
        assert len(mix.column_reductions()) == 2 and mix.columns == 8
        # the epilogue stays with the finishing reduction: the mean's division is in the mean's group
        groups = [n for n in forward.graph.nodes() if isinstance(n, FusedNode) and n.reduction_ranges == (4,)]
        assert any({"buf2", "buf3"} <= set(g.member_names()) for g in groups), forward.graph.format()
        # the column sums read channels_last memory with the columns contiguous: (S, C) partial outputs
        for p in partials(be):
            assert p.ranges == (4, 8)


def test_layernorm_backward_keeps_mix_order():
    be = assert_matches_eager(torch.nn.LayerNorm(48), [torch.randn(300, 48, requires_grad=True)],
                              pipeline=pipeline(splits=4), codegen="reference")
    backward = be.reports[-1].graph
    assert any(isinstance(n, MixOrderNode) for n in backward.nodes()), backward.format()
    assert not any(m.name.endswith("_partial") for m in backward.leaf_nodes())


def test_argmax_is_refused():
    be = assert_matches_eager(lambda x: x.argmax(0), [torch.randn(400, 3)], pipeline=pipeline(splits=4),
                              codegen="reference")
    assert split_count(be) == 0
    assert sum(p.stats.get("split_reductions_refused", 0) for r in be.reports for p in r.passes) == 1


def test_inner_member_read_outside_stays_a_node():
    # relu(x) is both returned and summed: it stays a pointwise node, and is recomputed in the partials
    be = assert_matches_eager(lambda x: (torch.relu(x), torch.relu(x).sum(1)), [torch.randn(3, 1000)],
                              pipeline=pipeline(splits=4), codegen="reference")
    assert split_count(be) == 1
    graph = be.reports[0].graph
    # (in any order: peak_memory runs the partial sums, which read the input, before the output is allocated)
    assert sorted(n.kind for n in graph.nodes()) == ["pointwise", "reduction", "reduction"], graph.format()
    assert set(partials(be)[0].read_names()) == {"arg0_1"}


def test_row_tiles_of_pointwise_members_are_not_split():
    # tile_rows makes a group over (rows | columns) with no reduction in it; split_reductions after it
    # took that for a reduction group and failed with "max() arg is an empty sequence" (found by fuzzing)
    fn = lambda x, m: (x - m.amax(1, keepdim=True)).exp() * m.sum(1, keepdim=True)
    be = assert_matches_eager(fn, [torch.randn(6, 9, requires_grad=True), torch.randn(6, 9)],
                              pipeline="tile_rows(sms=1, min_rows_per_sm=1), split_reductions(splits=2)")
    assert sum(r.metrics.counters.get("row_tiles", 0) for r in be.reports) > 0
    assert split_count(be) == 2  # the amax and the sum, still split


@pytest.mark.cpu_target
def test_cpu_target_splits_nothing_by_default():
    # on the CPU whatever PASSLINE_TEST_DEVICE says (on a GPU this very sum is split)
    be = assert_matches_eager(lambda x: x.sum(), [torch.randn(1 << 16)], codegen="reference", device="cpu")
    assert "split_reductions" in str(be.pipeline) and split_count(be) == 0


# -- the rule, on a GPU target (the IR only: nothing runs) ------------------------------------------
i0, = loop_vars("i", 1)
r0, = loop_vars("r", 1)


def column_sum_graph(rows: int, cols: int) -> SchedulerGraph:
    """out[c] = sum over rows of x[r, c] (x row-major: a channels_last activation viewed as (N*H*W, C))."""
    x = GraphInput("x", buffer=Buffer("x", Layout.contiguous([rows, cols], torch.float32)))
    red = Reduction("s", (cols,), (rows,), "sum", Load("x", i0 + cols * r0, torch.float32),
                    Buffer("s", Layout.contiguous([cols], torch.float32)))
    return SchedulerGraph.from_program(Program((x,), (red,), (TensorArg("s", (cols,), (1,)),)))


def programs(node, sizes=None) -> int:
    """Programs of a reduction kernel under the Triton rule on an H200-like GPU (132 SMs); `sizes`: its graph's
    `numels`, as the runner passes them."""
    from passline.backends.triton.configs import Device, Variant, rule
    from passline.backends.triton.kernel import rows_contiguous

    xnumel, rnumel = int(node.numel), int(node.reduction_numel)
    cfg = rule({Variant.PERSISTENT: None, Variant.LOOPED: None}, xnumel, rnumel, False, Device(132),
               rows_contiguous(node, sizes))
    return -(-xnumel // cfg.xblock)


def test_rule_on_a_gpu_target_splits_batchnorm_statistics():
    gpu = Target("cuda", 132, interpreted=False)
    g = column_sum_graph(401408, 64)  # ResNet's first BatchNorm: 64 channels over 256 x 56 x 28 rows
    before = programs(g.node("s"))
    out, (rec,) = passline.PassManager("split_reductions").run(g, target=gpu)
    assert rec.stats == {"num_split_reductions": 1}
    partial, finish = out.nodes()
    # 4 column blocks of 16 want 66 splits for 2 programs per SM; 64 divides 401408 (no mask)
    assert partial.ranges == (64, 64) and partial.reduction_ranges == (6272,)
    assert not any(isinstance(v, Op) for v in walk(partial.body))
    assert finish.reduction_ranges == (64,)
    assert (before, programs(partial)) == (4, 256)
    # the same graph on the CPU target, or with enough programs already: left alone
    _, (rec,) = passline.PassManager("split_reductions").run(column_sum_graph(401408, 64))
    assert rec.stats == {}
    _, (rec,) = passline.PassManager("split_reductions").run(column_sum_graph(4096, 8192), target=gpu)
    assert rec.stats == {}


def test_rule_with_sms_option_and_no_divisor():
    # 4099 is prime: no divisor near the 8 splits wanted for 4 SMs, so 4 chunks (min_chunk 1024), masked
    # (min_program_bytes=0: sums this small are not split by default, a few kernels cost more than they save)
    be = assert_matches_eager(lambda x: x.sum(), [torch.randn(4099)], pipeline=pipeline(sms=4, min_program_bytes=0),
                              codegen="reference")
    (p,) = partials(be)
    assert p.ranges == (4,) and p.reduction_ranges == (1025,)
    be = assert_matches_eager(lambda x: x.sum(), [torch.randn(50000)], pipeline=pipeline(sms=4, min_program_bytes=0),
                              codegen="reference")
    (p,) = partials(be)
    assert p.ranges == (8,) and p.reduction_ranges == (6250,)  # 8 divides 50000


@pytest.mark.parametrize("option", ["splits=-2", "programs_per_sm=0", "min_chunk=0"])
def test_bad_options_are_clear_errors(option):
    with pytest.raises(PipelineError, match=option.split("=")[0]):
        passline.PassManager(f"split_reductions({option})").run(column_sum_graph(64, 4))


def test_target_validates():
    with pytest.raises(ValueError):
        Target("cuda", 0, interpreted=False)
    assert str(Target()) == "cpu (interpreted)"


# -- reductions that read another's result: split beside it, one partial and one finishing kernel ----
def ce(x, t):
    return torch.nn.functional.cross_entropy(x.float(), t)


# fn, inputs(dtype): widths that 4 chunks divide (1000) and that leave a short last chunk (1001, 999)
PAIRED = {
    "layer_norm": (lambda: torch.nn.LayerNorm(1001), lambda dt: [torch.randn(3, 1001, dtype=dt) * 2 + 3]),
    "layer_norm_even": (lambda: torch.nn.LayerNorm(1000), lambda dt: [torch.randn(2, 1000, dtype=dt)]),
    "softmax": (lambda: (lambda x: torch.softmax(x * 4, -1)), lambda dt: [torch.randn(3, 1001, dtype=dt)]),
    "log_softmax": (lambda: (lambda x: torch.log_softmax(x, -1)), lambda dt: [torch.randn(2, 1000, dtype=dt)]),
    "cross_entropy": (lambda: ce, lambda dt: [torch.randn(3, 999, dtype=dt), torch.tensor([0, 998, 5])]),
    "var_mean_column": (lambda: (lambda x: torch.var_mean(x, 0)), lambda dt: [torch.randn(1001, 3, dtype=dt)]),
}


def groups_of_partials(graph) -> list:
    return [n for n in graph.nodes() if isinstance(n, FusedNode) and all(m.name.endswith("_partial") for m in n.nodes)]


@pytest.mark.parametrize("codegen", BOTH)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(PAIRED))
def test_paired_reductions_split_beside_each_other(name, dtype, codegen):
    """var_mean's squared deviations and softmax's sum of exponentials read the finished mean or max: each
    chunk computes its own pair (deviations about its own mean, exponentials against its own max) in one
    partial kernel, and the finishing kernel combines them; forward and backward against eager."""
    make_fn, make_inputs = PAIRED[name]
    inputs = [x.requires_grad_() if x.is_floating_point() else x for x in make_inputs(dtype)]
    fn = make_fn()
    if isinstance(fn, torch.nn.Module):  # parameters in the input's dtype (eager's CUDA LayerNorm takes no mix)
        fn = fn.to(dtype)
    be = assert_matches_eager(fn, inputs, pipeline=pipeline(splits=4), codegen=codegen)
    forward = be.reports[0].graph
    # the pair's partial group: its second reduction reads the first one's chunk result, not a finished one
    (group,) = [g for g in groups_of_partials(forward) if set(g.nodes[1].read_names()) & {g.nodes[0].output.name}]
    kinds = [m.reduction_type for m in group.nodes]
    assert kinds in (["sum", "sum"], ["max", "sum"]), forward.format()
    # and no partial reduction of the forward stands alone (each pair's partials share one kernel)
    assert not any(isinstance(n, Reduction) and n.name.endswith("_partial") for n in forward.nodes()), forward.format()
    if codegen == "triton":
        assert "reference backend" not in be.reports[0].codegen_reason


def test_deviations_about_each_chunk_mean_keep_large_means_exact():
    # a mean of 1000 and a spread of 1: the sum of squares less the squared sum would lose about 6% of the
    # variance to float32 rounding (1e6 * 6e-8); deviations about each chunk's mean are as exact as eager's
    # Welford. Against float64, not eager: at values near 1000 (an ulp of 6e-5) two correct float32 results
    # differ by ~1e-4, so a comparison with eager at a fixed tolerance failed for some draws on a GPU
    device = passline.settings.test_device or "cpu"
    x = torch.randn(4, 1001, generator=torch.Generator().manual_seed(0)).add(1000).to(device).requires_grad_()
    ln = torch.nn.LayerNorm(1001).to(device)
    be = passline.backend(pipeline=pipeline(splits=4), codegen="reference", fallback="raise")
    xs = [x.detach().clone().requires_grad_() for _ in range(3)]
    outs = [torch.compile(ln, backend=be)(xs[0]), ln(xs[1]),
            torch.nn.functional.layer_norm(xs[2].double(), (1001,), ln.weight.double(), ln.bias.double())]
    g = torch.linspace(-1, 1, x.numel(), device=device).reshape(x.shape)
    for y in outs:
        (y * g).sum().backward()
    err = [(outs[k].double() - outs[2]).abs().max().item() for k in (0, 1)]
    grad_err = [(xs[k].grad.double() - xs[2].grad).abs().max().item() for k in (0, 1)]
    # the floor is an ulp of the inputs (6e-5 at 1000): both sides' errors are of that order, so a floor of
    # 1e-6 made the ratio of two roundings the test (it failed once in a GPU run of the file, passed alone)
    ulp = 6.1e-5
    assert err[0] <= 2 * err[1] + ulp and grad_err[0] <= 2 * grad_err[1] + ulp, (err, grad_err)
    assert err[0] < 1e-3  # the squares' difference would be off by about 3% of the spread (0.03)
    assert len(groups_of_partials(be.reports[0].graph)) == 1


@pytest.mark.parametrize("codegen", BOTH)
def test_rescaled_chunks_propagate_inf_and_nan_like_eager(codegen):
    x = torch.randn(5, 1001)
    x[0] = float("-inf")  # a row of -inf: NaN, as eager's exp(-inf - -inf)
    x[1, :300] = float("-inf")  # a whole chunk of -inf in a finite row adds 0
    x[2, 5] = float("inf")
    x[3, 700] = float("nan")
    for fn in (lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1)):
        be = passline.backend(pipeline=pipeline(splits=4), codegen=codegen, fallback="raise")
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend=be)(x), fn(x), equal_nan=True)
        assert len(groups_of_partials(be.reports[0].graph)) == 1


def test_rule_on_a_gpu_target_few_long_rows():
    """LayerNorm over 64 rows of 30000 on a 132-SM GPU: 64 row programs would leave half the SMs idle, so
    the rows are split in 5 chunks of 6000 (264 programs wanted, 5 divides 30000): one partial kernel of
    320 programs computing each chunk's sum and squared deviations, one finishing kernel, then the
    normalization, 3 kernels instead of the 5 of a mean, then a variance, each split on its own — where a
    row's 120 KB are worth splitting (min_program_bytes=0 here; by default they are not: below)."""
    from passline.backends.triton.configs import Device, Variant, rule
    from passline.backends.triton.kernel import rows_contiguous

    ln = torch.nn.LayerNorm(30000)
    be = assert_matches_eager(ln, [torch.randn(64, 30000, requires_grad=True)],
                              pipeline=pipeline(sms=132, min_program_bytes=0), codegen="reference")
    forward = be.reports[0].graph
    (group,) = groups_of_partials(forward)
    assert (group.ranges, group.reduction_ranges, len(group.nodes)) == ((64, 5), (6000,), 2)
    assert len(forward) == 3, forward.format()
    # the partial kernel under the Triton rule: a 6000-wide chunk held in registers (block 8192), one per
    # program, 8 warps for 32 elements a thread (320 programs: more than the SMs)
    cfg = rule({Variant.PERSISTENT: None, Variant.LOOPED: None}, 320, 6000, False, Device(132), rows_contiguous(group))
    assert (cfg.variant, cfg.xblock, cfg.rblock, cfg.warps) == (Variant.PERSISTENT, 1, 8192, 8)


def test_a_split_pays_only_for_programs_that_load_enough():
    """By default a row whose split adds a pass over the rows (softmax's normalization, a kernel of its own)
    is split only where its program would load at least 256 KB (min_program_bytes): on an H200, 64 float32
    rows of 30000 (120 KB) ran faster unsplit; of 65536 (256 KB) they are split. A column sum counts 16
    columns a program: 64 float32 columns over 4096 rows (256 KB a program) are split, bfloat16 (128 KB) not.
    One program whose split adds only its finishing kernel (a loss's mean, a full sum) pays from 80 KB
    (min_finish_only_bytes): a cross-entropy's mean over 10000 rows (a float32 loss and a bool a row: 49 KB)
    stays whole, over 20000 (98 KB) it is split; a row sum over 64 rows of 30000 (120 KB a program, the split
    adding only its finishing kernel too) keeps the 256 KB bound."""
    forward = lambda be: be.reports[0]  # noqa: E731
    for width, split in ((30000, False), (65536, True)):
        be = assert_matches_eager(lambda x: x.softmax(-1), [torch.randn(64, width)], pipeline=pipeline(sms=132),
                                  codegen="reference")
        assert (split_count(be) > 0) == split, forward(be).graph.format()
    for dtype, split in ((torch.bfloat16, False), (torch.float32, True)):  # 128 KB a program, 256 KB
        be = assert_matches_eager(lambda x: x.sum(0), [torch.randn(4096, 64, dtype=dtype)], pipeline=pipeline(sms=132),
                                  codegen="reference")
        assert (split_count(be) > 0) == split, forward(be).graph.format()
    be = assert_matches_eager(lambda x: x.sum(1), [torch.randn(64, 30000)], pipeline=pipeline(sms=132),
                              codegen="reference")
    assert split_count(be) == 0, forward(be).graph.format()
    for rows, split in ((10000, False), (20000, True)):
        x, t = torch.randn(rows, 8), torch.randint(0, 8, (rows,))
        be = assert_matches_eager(torch.nn.functional.cross_entropy, [x, t], pipeline=pipeline(sms=132),
                                  codegen="reference", backward=False)
        assert (split_count(be) > 0) == split, forward(be).graph.format()
    for option in ("min_program_bytes", "min_finish_only_bytes"):
        with pytest.raises(PipelineError, match=option):
            passline.PassManager(f"split_reductions({option}=-1)").run(column_sum_graph(64, 4))


def test_a_column_sum_that_reads_a_statistic_of_each_row_is_a_column_sum(monkeypatch, tmp_path):
    """A norm's weight gradient sums dy * (x - mean[r]) * rstd[r] over the rows r: x and dy, the stream, go across
    the rows (a column sum), while each row's statistics step along r by 1. The pass (`_columns`) and the Triton
    kernel's rule (`rows_contiguous`) both let the loads of the largest buffers decide (`ir.streamed`) and take it
    as a column sum: 512 columns over 8192 rows are 32 blocks of 16 columns, split
    into 8 chunks on 132 SMs, the partial laid out (chunk, column) and ruled as columns (wide blocks of columns, not
    a column a program). Before, the statistic's step made it a row sum: programs estimated as 512, never split;
    and a split partial's `mean[s * chunk + r]`, moving with its outer chunk loop, made the partial's kernel a row
    a program (at 10872 x 12345 bfloat16, XBLOCK 1 over 3624 strided rows)."""
    from passline.backends.triton import kernel
    from passline.backends.triton.kernel import rows_contiguous

    ruled = {}  # what the runner's rule was told, node by node

    def spy(node, sizes=None):
        ruled[node.name] = rows_contiguous(node, sizes)
        return ruled[node.name]

    monkeypatch.setattr(kernel, "rows_contiguous", spy)

    def weight_grad(x, dy, mean, rstd):
        return (dy * (x - mean[:, None]) * rstd[:, None]).sum(0)

    ins = [torch.randn(8192, 512), torch.randn(8192, 512), torch.randn(8192), torch.rand(8192) + 0.5]
    # as past mix_order_reduction's rows (over 32 KB): unmixed, the column sum recomputing what it sums
    unmixed = pipeline(sms=132).replace("mix_order_reduction(fill_sms=false), ", "").replace(
        "recompute_columns", "recompute_columns(min_row_bytes=0)")
    be = assert_matches_eager(weight_grad, ins, pipeline=unmixed, codegen="triton", backward=False,
                              graph_cache=False, aot_cache=False, cache_dir=str(tmp_path))  # (made here: the spy)
    assert any(p.stats.get("recomputed_columns") for r in be.reports for p in r.passes)
    (p,) = partials(be)
    assert p.ranges == (8, 512) and p.reduction_ranges == (1024,), p
    assert {v.buffer for v in walk(p.body) if isinstance(v, Load)} == {"arg0_1", "arg1_1", "arg2_1", "arg3_1"}
    sizes = be.reports[0].graph.numels()
    assert not rows_contiguous(p, sizes) and ruled[p.name] is False, ruled
    assert programs(p, sizes) > 100  # 8 x 512 columns in blocks of columns (a row a program would be 4096)


def test_a_small_weight_broadcast_against_rows_does_not_make_them_columns():
    """A sum over a broadcast product, `(x[:, :, None] * w[None]).sum(1)` (a matmul written out: x 2048 x 512, w
    512 x 2): w's element steps along the reduction by 2, with the output's innermost loop, while x, 256 times
    larger, is read along its rows. x decides (`ir.streamed`): a row sum for the Triton rule and for the pass,
    which the results match eager's under either."""
    from passline.backends.triton.kernel import rows_contiguous

    def matmul(x, w):
        return (x[:, :, None] * w[None]).sum(1)

    be = assert_matches_eager(matmul, [torch.randn(2048, 512), torch.randn(512, 2)], pipeline=pipeline(sms=132),
                              codegen="triton", backward=False)
    graph = be.reports[0].graph
    (node,) = [n for n in graph.nodes() if n.reduction_ranges]
    assert rows_contiguous(node, graph.numels())


def test_a_gathered_element_counts_a_sector():
    """A gather in a reduction, another element at each reduced point, costs its program the 32-byte sector
    memory moves for each, not the element's bytes: a sum of 16384 elements gathered through int32 indices
    loads 64 KB directly and 576 KB with the sectors, split on a 132-SM target (a cross-entropy's mean whose
    target logits were gathered in it ran 8192 dependent gathers on one SM: 12.2 us on an H200, split 2.5 +
    0.9); the same sum of a tensor read directly stays whole."""
    x, i = torch.randn(5000), torch.randint(0, 5000, (16384,), dtype=torch.int32)
    be = assert_matches_eager(lambda x, i: x[i].sum(), [x, i], pipeline=pipeline(sms=132), codegen="reference")
    assert split_count(be) == 1, be.reports[0].graph.format()
    be = assert_matches_eager(lambda v: v.sum(), [torch.randn(16384)], pipeline=pipeline(sms=132),
                              codegen="reference")
    assert split_count(be) == 0
    # a gathered element the reduction reuses (one a row of a row sum: 4 bytes a point, 32 KB a program) is a
    # program's once, not a sector a point (which would make 288 KB and split it)
    x, w, idx = torch.randn(64, 8192), torch.randn(100), torch.randint(0, 100, (64,))
    be = assert_matches_eager(lambda x, w, i: (x * w[i][:, None]).sum(1), [x, w, idx], pipeline=pipeline(sms=132),
                              codegen="reference")
    assert split_count(be) == 0, be.reports[0].graph.format()


def test_independent_reductions_share_their_partial_and_finishing_kernels():
    """Cross-entropy's mean over rows sums the losses and counts the rows not ignored: two reductions that
    read no result of each other are split into one partial kernel and one finishing kernel (with the
    division), not two each; the clamped last chunk (4099 rows is prime) still reads its rows contiguously,
    so the Triton rule gives the partial kernel one program per chunk, not blocks of 16 chunks."""
    from passline.backends.triton.kernel import rows_contiguous

    x, t = torch.randn(4099, 10), torch.randint(0, 10, (4099,))
    t[::5] = -100
    be = assert_matches_eager(torch.nn.functional.cross_entropy, [x, t],
                              pipeline=pipeline(sms=132, min_program_bytes=0), codegen="reference")
    graph = be.reports[0].graph
    (group,) = groups_of_partials(graph)
    assert sorted(m.reduction_type for m in group.nodes) == ["sum", "sum"]
    assert group.ranges == (4,) and group.reduction_ranges == (1025,)
    assert any(isinstance(v, Load) and v.index.has(sympy.Min) for m in group.nodes for v in walk(m.body))
    assert rows_contiguous(group)
    (finish,) = [n for n in graph.nodes() if isinstance(n, FusedNode) and n.reduction_ranges == (4,)]
    assert sum(isinstance(m, Reduction) for m in finish.nodes) == 2
    assert len(graph) == 3, graph.format()  # the row statistics, the partials, the finish


@pytest.mark.parametrize("codegen", BOTH)
def test_run_time_reduced_ranges_split_into_a_fixed_number_of_chunks(codegen):
    """Under dynamic shapes a reduced range of run-time size (BatchNorm's rows over a varying batch) is split
    into S chunks of ceil(R / S), every chunk masked: one compile serves every size, including sizes below
    S * (S - 1), whose last chunks hold no point (their partials are the identity, and the variance's
    combination skips them rather than add 0 * NaN). var_mean's deviations and softmax's exponentials still
    pair with their mean and max chunk by chunk."""
    def fn(x):
        var, mean = torch.var_mean(x, dim=0)
        return var * 2 + mean, torch.softmax(x, dim=0), x.amax(0)

    torch._dynamo.reset()
    be = passline.backend(codegen=codegen, pipeline=pipeline(splits=8), fallback="raise")
    compiled = torch.compile(fn, backend=be)
    for rows in (3, 9, 61):  # 3 and 9 leave chunks empty (ceil(3/8) = 1: chunks 3..7 hold nothing)
        x = torch.randn(rows, 6) * 3 + 50
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch._dynamo.mark_dynamic(xa, 0)  # the rows vary, the 6 columns stay numbers
        outs_a, outs_b = compiled(xa), fn(xb)
        for a, b in zip(outs_a, outs_b):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        sum((a * torch.linspace(-1, 1, a.numel()).reshape(a.shape)).sum() for a in outs_a).backward()
        sum((b * torch.linspace(-1, 1, b.numel()).reshape(b.shape)).sum() for b in outs_b).backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-4)
    assert len(be.reports) == 2  # one forward and one backward for every size
    forward = be.reports[0].graph
    assert split_count(be) >= 4 and any(not s.is_number for p in partials(be) for s in p.reduction_ranges)
    # the pairs share their partial kernels as at static sizes
    assert any(set(g.nodes[1].read_names()) & {g.nodes[0].output.name} for g in groups_of_partials(forward))
    if codegen == "triton":
        assert all("reference backend" not in r.codegen_reason for r in be.reports)


def test_run_time_reduced_ranges_split_by_the_rule_at_the_traced_size():
    """The rule counts chunks from the device (programs per SM) and caps them by the size dynamo traced the
    graph at (its hint): a BatchNorm-like column sum over a run-time number of rows is split on a GPU
    target, into a fixed number of masked chunks."""
    torch._dynamo.reset()
    be = passline.backend(codegen="reference", pipeline=pipeline(sms=132), fallback="raise")
    compiled = torch.compile(lambda x: x.sum(0), backend=be)
    for rows in (40000, 123):
        x = torch.randn(rows, 64)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), x.sum(0), rtol=1e-4, atol=1e-3)
    (p,) = partials(be)
    # 4 column blocks want 66 chunks for 2 programs per SM; 40000 rows of the trace allow 39 (min_chunk 1024)
    assert p.ranges == (39, 64) and not p.reduction_ranges[0].is_number
    assert len(be.reports) == 1


@pytest.mark.parametrize("codegen", ["reference", "triton"])
def test_a_group_whose_split_could_not_be_ordered_stays_whole(codegen):
    """A fused group reducing `c` whose in-loop member reads both the finished minimum and `s`'s old value,
    while its epilogue overwrites `s` in place: split, the member kept outside would run after the finishing
    node (the minimum) and before it (the old `s`) — a cycle the verifier named split_reductions for (found by
    fuzzing). The group stays whole (`split_reductions_refused`), and the results are eager's."""

    def f(s, c):
        low = c.amin(0) * 3
        out = (c * low) * 3 - (s + c)
        s.copy_(low)
        return out, s.clone()

    be = assert_matches_eager(f, [torch.randn(()).half(), torch.randn(4).double()],
                              pipeline="dce, fuse, split_reductions(splits=2)", codegen=codegen)
    assert be.reports[0].metrics.counters["split_reductions_refused"] == 1


@pytest.mark.parametrize("small", [0, 1])
def test_split_pieces_keep_their_side_of_an_in_place_write(small):
    """A group whose one-point epilogue writes an input in place (`scale.mul_(0.9)`, joined to a sum's division
    by fuse's `small`, or the sum's own result copied into `c`) sits at its first member's program position,
    before a node reading the input's old value. Split, its pieces were added back by program order and the
    write ran before that read (y = z + 1.8 for eager's z + 2.0; found by the session's fuzz campaign): each
    piece now keeps the group's side of the read."""

    def f(x, z, scale, c):
        loss = x.sum() / 7
        y = z + scale                    # scale's old value
        e = torch.cumsum(c.view(1), 0)   # c's old value, through an extern call
        scale.mul_(0.9)
        c.copy_(loss)
        return loss, y, e

    args = [torch.randn(4096), torch.randn(300), torch.tensor(2.0), torch.tensor(5.0)]
    pipeline = f"dce, fuse(small={small}), split_reductions(splits=2)"
    for codegen in ("reference", "triton"):
        be = assert_matches_eager(f, args, pipeline=pipeline, codegen=codegen)
        assert be.reports[0].metrics.counters["num_split_reductions"] == 1
