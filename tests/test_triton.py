"""The Triton backend specifically: both reduction variants, the kernel cache, the report, fallbacks.
(The other end-to-end tests run on Triton too: make test sets TRITON_INTERPRET=1 and codegen='auto'
picks the interpreter.)"""
import os
import re
import sys
import tempfile

import pytest
import torch
from modules import MIXED, RMSNorm

import passline
from passline.testing import assert_matches_eager

REDUCING = {
    "layer_norm": (lambda: torch.nn.LayerNorm(48), lambda: [torch.randn(40, 48, requires_grad=True)]),
    "rms_norm": (lambda: RMSNorm(48), lambda: [torch.randn(40, 48, requires_grad=True)]),
    "softmax_t": (lambda: (lambda x: torch.softmax(x.t() * 3, -1)), lambda: [torch.randn(33, 20, requires_grad=True)]),
    "arg_and_minmax": (lambda: (lambda x: (x.argmax(1), x.argmin(0), x.amax(0), x.amin(1))),
                       lambda: [torch.randn(30, 70)]),
    "any_all_prod": (lambda: (lambda x: ((x > 1).any(1), (x > -2).all(0), (x * 0.1 + 1).prod(1))),
                     lambda: [torch.randn(30, 70)]),
    "var_mean": (lambda: (lambda x: torch.var_mean(x, 0)), lambda: [torch.randn(300, 7)]),
}


@pytest.mark.parametrize("variant", ["persistent", "looped"])
@pytest.mark.parametrize("name", sorted(REDUCING))
def test_reduction_variants(name, variant):
    make_fn, make_inputs = REDUCING[name]
    be = assert_matches_eager(make_fn(), make_inputs(), codegen="triton", kernel_variant=variant)
    chosen = {k.chosen for r in be.reports for k in r.kernel_info if k.kind == "reduction"}
    assert chosen <= {variant}


@pytest.mark.parametrize("form", ["mix_order", "mix_order_acc2d"])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_mix_order_kernel_forms(norm, form):
    # 300 rows in blocks of 64: several row blocks per program and a ragged last program
    pipeline = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(split_rows=64)")
    make = {"layer_norm": lambda: torch.nn.LayerNorm(48), "rms_norm": lambda: RMSNorm(48)}[norm]
    be = assert_matches_eager(make(), [torch.randn(300, 48, requires_grad=True)], codegen="triton",
                              kernel_variant=form, pipeline=pipeline)
    chosen = {k.chosen: k.blocks for r in be.reports for k in r.kernel_info if k.kind == "mix_order"}
    assert list(chosen) == [form]
    assert chosen[form]["SPLIT"] == 64 > chosen[form]["XBLOCK"]


def test_mix_order_row_loop_is_pipelined_on_gpus_only():
    from passline.backends.triton.configs import Variant, mix_candidates

    be = assert_matches_eager(torch.nn.LayerNorm(48), [torch.randn(300, 48, requires_grad=True)], codegen="triton",
                              pipeline=MIXED)  # 300 rows: mixed on a GPU too
    (mix,) = [k for r in be.reports for k in r.kernel_info if k.kind == "mix_order"]
    assert "tl.range(0, SPLIT, XBLOCK, num_stages=STAGES)" in mix.source
    on_gpu = "GPU" in be.reports[0].codegen_reason
    assert mix.blocks["STAGES"] in ((1, 3, 4) if on_gpu else (1,))  # the interpreter runs the loop as it is
    # on a GPU: three and four stages for each configuration, one unpipelined baseline
    gpu = mix_candidates(Variant.MIX_ORDER, 512, 128, interpret=False)
    assert sorted(c.stages for c in gpu).count(1) == 1 and {c.stages for c in gpu} == {1, 3, 4}
    # two rows with the one-row accumulator only where a thread holds its columns of both rows:
    # 512 columns in 16-byte loads are 64 threads, so one or two warps; 4096 columns need 8 to 16
    assert {c.warps for c in gpu if c.xblock == 2} == {1, 2}
    wide = mix_candidates(Variant.MIX_ORDER, 4096, 128, interpret=False)
    assert {c.warps for c in wide if c.xblock == 2} == {8, 16}
    assert all(c.xblock >= 2 for c in mix_candidates(Variant.MIX_ORDER_ACC2D, 512, 128, interpret=False))


@pytest.mark.parametrize("variant", ["persistent", "looped"])
def test_nan_and_inf_propagate_like_eager(variant):
    # an argmax or argmin takes the first NaN, and the first of tied extremes (under the interpreter through
    # numpy's reductions: printer's _argmax_of)
    x = torch.randn(16, 32)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, :] = float("-inf")
    x[3, [9, 4]] = float("nan")
    x[4, [7, 2]], x[5, [6, 1]] = 10.0, -10.0
    fn = lambda x: (torch.relu(x), x.amax(1), x.argmax(1), x.argmin(1), torch.maximum(x, x.t().contiguous().t() * 0),
                    x.sum(1))
    assert_matches_eager(fn, [x], codegen="triton", kernel_variant=variant)


def test_bool_plus_bool_is_logical_or():
    # Triton's int1 add wraps: True + True stored False
    a = torch.tensor([[7, -7, 2, -1], [5, -3, 0, 1]])
    fn = lambda a: ((a > 0) + (a < 3), torch.add(a > 0, a < 3, alpha=True), (a > 0) * (a < 3))
    be = assert_matches_eager(fn, [a], codegen="triton")
    assert "reference" not in (be.reports[0].codegen_reason or "")


def test_float_floor_division_remainder_and_edge_values_match_eager():
    # from the exact fmod, as eager: floor(a / b) rounds first (1.0 // 0.1 is 9, not 10; 1.0 % 0.1 is 0.0999..,
    # not 0; inf // 2 is NaN); sign(NaN) is 0; pow(-inf, 2.5) is inf, pow(1, NaN) 1, pow(-0.0, -1) -inf;
    # log1p(inf) is inf
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([1.0, -1.0, 0.3, 7.0, 5.5, inf, -1.0, 1.0, 0.0, -0.0, 2.0, 1e30, -inf, 1.0, nan, -0.0])
    b = torch.tensor([0.1, inf, 0.1, 0.7, -1.1, 2.0, 0.0, -inf, -3.0, 3.0, 0.0, 3.0, 2.5, nan, 0.0, -1.0])
    fn = lambda a, b: (a // b, a // 0.1, torch.remainder(a, b), a % -0.7, torch.fmod(a, b), a.sign(),
                       a.pow(b), a.log1p())
    be = assert_matches_eager(fn, [a, b], codegen="triton")
    assert "reference" not in (be.reports[0].codegen_reason or "")


INTERPRETED = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton's interpreter only (a GPU run compiles, configurations by rule)")


def test_kernel_modules_hold_only_the_helpers_they_name():
    # a floor division's kernel needs _floordiv_f, which needs _fmod; a sigmoid's needs _sigmoid alone
    be = assert_matches_eager(lambda a, b: (a // b, torch.sigmoid(a)), [torch.randn(64), torch.rand(64) + 0.5],
                              codegen="triton")
    sources = "\n".join(k.source for r in be.reports for k in r.kernel_info)
    defined = set(re.findall(r"^def (_\w+)\(", sources, flags=re.M))
    assert {"_floordiv_f", "_fmod", "_sigmoid"} <= defined, defined
    assert not defined & {"_tanh", "_argmax_combine", "_round", "_erfc", "_pow"}, defined
    for k in (k for r in be.reports for k in r.kernel_info):  # each module defines every helper it names
        named = set(re.findall(r"\b(_[a-z]\w*)\(", k.source)) - {"_check_index", "_check_divisor"}
        assert named <= set(re.findall(r"^def (_\w+)\(", k.source, flags=re.M)), (named, k.source)


@INTERPRETED
def test_interpreted_sums_use_tritons_own_combine():
    """Under the interpreter a module binds _sum_combine to Triton's own (the interpreter then sums with numpy;
    with a function of ours it calls it once per element and step: a tiled mix-order test took 60 s, 2 s
    with it); a binding, not a def, so the helper trimming must keep it."""
    be = assert_matches_eager(lambda a: a.sum(0) + a.sum(1).sum(), [torch.randn(33, 65)], codegen="triton")
    sources = [k.source for r in be.reports for k in r.kernel_info]
    assert sources and all("\n_sum_combine = tl.standard._sum_combine" in s for s in sources if "_sum_combine" in s)
    assert any("_sum_combine" in s for s in sources) and not any("def _sum_combine" in s for s in sources)


@pytest.mark.parametrize("variant", ["persistent", "looped"])
def test_reductions_keep_the_sign_of_zero(variant):
    # a value is broadcast to its block by adding zeros: +0.0 turned -0.0 into +0.0, so a product
    # over [-0.0, 2, 3, -1] came out -0.0 (eager: +0.0, and 1 / it is inf, not -inf)
    x = torch.tensor([[-0.0, 2.0, 3.0, -1.0], [0.0, -2.0, 3.0, 1.0], [-0.0, -0.0, 1.0, 1.0]])
    fn = lambda x: (1 / x.prod(-1), 1 / x.amax(-1).clamp(max=0), x.argmax(-1))
    assert_matches_eager(fn, [x], codegen="triton", kernel_variant=variant)


def test_negative_zero_constants_keep_their_sign():
    # a -0.0 literal in a kernel (tl.full) must stay -0.0 on every Triton: 1 / it is -inf
    x = torch.tensor([1.0, -2.0, 0.0, -0.0])
    fn = lambda x: (1 / (x * -0.0), 1 / torch.full_like(x, -0.0), 1 / (x.sum() * -0.0 + x), 1 / -x)
    assert_matches_eager(fn, [x], codegen="triton")


def test_relu_clamp_tanh_expm1_keep_negative_zero():
    # eager's relu and clamp keep x on a tie (relu(-0.0) is -0.0), tanh and expm1 are odd: the kernels
    # gave +0.0 (the interpreter's tanh and expm1 too), so 1 / them was inf where eager's is -inf
    x = torch.tensor([-0.0, 0.0, -1.0, 2.0, float("nan")])
    fn = lambda x: (torch.relu(x), x.clamp(min=0.0), x.clamp(max=0.0), x.clamp(-0.0, 0.0), torch.tanh(x),
                    torch.expm1(x), torch.nn.functional.celu(x, 0.5))
    compiled = torch.compile(fn, backend=passline.backend(codegen="triton", fallback="raise"))
    for k, (got, want) in enumerate(zip(compiled(x), fn(x))):
        torch.testing.assert_close(got, want, equal_nan=True, msg=f"output {k}")
        assert torch.equal(got.signbit(), want.signbit()), (k, got, want)


def test_bfloat16_negative_zero_is_false():
    # the interpreter holds bfloat16 as raw words: -0.0 (0x8000) != 0 made bool(-0.0) True
    x = torch.tensor([-0.0, 0.0, 1.0, float("nan"), -2.0], dtype=torch.bfloat16)
    assert_matches_eager(lambda x: (x.bool(), x.bool().sum()), [x], codegen="triton")


def test_tanh_expm1_sinh_keep_their_digits_near_zero():
    # the interpreter's 1 - exp(-2|x|) cancelled: tanh(1e-6) was 1.5% off, tanh(1e-8) was 0
    x = torch.cat([torch.logspace(-8, -1, 29), -torch.logspace(-8, -1, 29)])
    fn = lambda x: (torch.tanh(x) / x, torch.expm1(x) / x, torch.sinh(x) / x)
    assert_matches_eager(fn, [x], codegen="triton")


def test_erfc_of_large_arguments():
    # 1 - erf(x) is 0 from x = 4 on: log(erfc(x)) was -inf where eager's is -18.6 (x = 4) .. -83 (x = 9)
    x = torch.linspace(-3, 9, 25)
    assert_matches_eager(lambda x: (torch.special.erfc(x), torch.special.erfc(x).log()), [x], codegen="triton")


def test_round_half_to_even_of_large_odd_values_and_signed_zeros():
    # floor(x + 0.5) rounded the sum: round(8388609.0) was 8388610; round(-0.4) is -0.0 (1 / it: -inf)
    x = torch.tensor([8388609.0, -8388609.0, 16777215.0, 2.5, -2.5, 0.5, -0.5, 1.5, 0.49999997, -0.4, 1e20])
    assert_matches_eager(lambda x: (x.round(), 1 / x.round(), x.round(decimals=1)), [x], codegen="triton")


def test_negative_scalars_with_unsigned_tensors_wrap_as_eager():
    # u8 + (-1): the scalar is uint8 255, as torch converts it; tl.full refused -1 for tl.uint8
    u = torch.tensor([0, 1, 3, 200, 255], dtype=torch.uint8)
    assert_matches_eager(lambda u: (u > -1, u + (-1), torch.where(u > 3, u, -1)), [u], codegen="triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_constants_round_to_nearest_as_eager(dtype):
    # a bfloat16 literal was truncated by the interpreter's tl.full: where(x > 1, x, 0.1) gave 0.0996 where
    # eager's is 0.1001 (one ulp: inside the dtype's tolerance, so compared bitwise here)
    x = torch.tensor([0.1, 2.0, 0.3, 5.0], dtype=dtype)
    fn = lambda x: (torch.where(x > 1, x, 0.1), torch.full_like(x, 0.3), x.clamp(max=1 / 3),
                    x.masked_fill(x > 1, 1e-3))
    compiled = torch.compile(fn, backend=passline.backend(codegen="triton", fallback="raise"))
    for got, want in zip(compiled(x), fn(x)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_report_has_kernel_sources_variants_and_bytes():
    be = assert_matches_eager(torch.nn.LayerNorm(32), [torch.randn(64, 32)], codegen="triton")
    (report,) = be.reports
    (k,) = report.kernel_info
    assert "@triton.jit" in k.source and k.chosen in ("persistent", "looped") and k.blocks["RBLOCK"] >= 32
    assert k.bytes == report.bytes_accessed
    on_gpu = report.graph.input_buffers()["primals_3" if "primals_3" in report.graph.input_buffers()
                                           else next(iter(report.graph.input_buffers()))].layout.device.type == "cuda"
    assert report.codegen == "triton" and ("GPU" if on_gpu else "interpreter") in report.codegen_reason


@INTERPRETED  # (a GPU's second compile loads its binaries by record: it never reads the kept sources)
def test_second_compile_does_no_codegen_and_corrupted_entries_rebuild(tmp_path):
    fn = lambda x: torch.softmax(x * 2, -1)
    x = torch.randn(8, 16)
    first = assert_matches_eager(fn, [x], codegen="triton", cache_dir=tmp_path).reports[0].runner.cache
    assert first.misses >= 1 and first.hits == 0
    second = assert_matches_eager(fn, [x], codegen="triton", cache_dir=tmp_path).reports[0].runner.cache
    assert second.hits >= 1 and second.misses == 0
    for f in tmp_path.glob("k*.py"):
        f.write_text(f.read_text().replace("tl.exp", "tl.log"))  # corrupt: the checksum no longer holds
    third = assert_matches_eager(fn, [x], codegen="triton", cache_dir=tmp_path).reports[0].runner.cache
    assert third.rebuilt >= 1


def test_ops_without_triton_code_run_on_reference_and_the_report_says_so():
    fn = lambda x: torch.atan2(x, x + 1) * 2
    be = assert_matches_eager(fn, [torch.randn(5, 6)], codegen="triton")
    report = be.reports[0]
    assert "on the reference backend" in report.codegen_reason and "atan2" in report.codegen_reason


def test_auto_codegen_is_said_in_the_report(monkeypatch):
    # CPU tensors whatever device the suite runs on: the choice is the CPU's (a GPU run got triton here)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    be = assert_matches_eager(lambda x: x * 2, [torch.randn(3)], codegen="auto", device="cpu")
    assert be.reports[0].codegen == "reference" and "TRITON_INTERPRET" in be.reports[0].codegen_reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    be = assert_matches_eager(lambda x: x * 2, [torch.randn(3)], codegen="auto", device="cpu")
    assert be.reports[0].codegen == "triton"


def test_index_width():
    from passline.backends.triton.kernel import index_width
    from passline.testing.synthetic import chain_and_fanout

    def _int64(graph, node):
        return index_width(graph, node)[0]

    small = chain_and_fanout(4)
    assert _int64(small, small.nodes()[0]) is False
    big = chain_and_fanout(4, size=(1 << 16, 1 << 16))
    assert _int64(big, big.nodes()[0]) is True
    # only the kernel's own buffers count: a small node in a graph that also holds a huge buffer keeps
    # 32-bit offsets (the huge buffer is added to what the graph reports, the node does not touch it)
    from passline.ir import Buffer, Layout

    huge = Buffer("huge", Layout.contiguous((1 << 16, 1 << 16), torch.float32))
    buffers = {**small.buffers(), "huge": huge}
    small.buffers = lambda: buffers
    assert _int64(small, small.nodes()[0]) is False
    # an element count set at launch (a mix-order finishing kernel's splits): chosen per launch
    assert index_width(small, small.nodes()[0], frozenset({"rnumel"})) == (None, ())


def _check_call_liveness(source: str) -> None:
    """In a generated call: every buffer it assigns is deleted after its last use or returned, and
    none is used after its `del`."""
    lines = source.splitlines()
    returned = set(re.findall(r"\bb_\w+", lines[-1]))
    assigned = {m for line in lines for m in re.findall(r"^\s*(b_\w+) = ", line)}
    deleted = {}
    for i, line in enumerate(lines):
        m = re.search(r"(?:^\s*|; )del (.*)$", line)
        if m:
            for name in m.group(1).split(", "):
                deleted[name] = i
    for name, i in deleted.items():
        later = [line for line in lines[i + 1:] if re.search(rf"\b{name}\b", line)]
        assert not later, f"{name} used after its del: {later}"
        before = [line for line in lines[:i + 1] if re.search(rf"\b{name}\b", line)]
        assert len(before) > 1, f"{name} never used"
    inputs = {m for line in lines for m in re.findall(r"^\s*(b_\w+) = args\[", line)}
    assert assigned - inputs <= set(deleted) | returned, sorted(assigned - inputs - set(deleted) - returned)


def test_generated_call_frees_buffers_after_last_use():
    fn = lambda x, w: ((x * 2) @ w + 1) @ w  # kernel, mm, kernel, mm: each kernel's buffer dies at its mm
    dev = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
    x, w = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev)
    runner = assert_matches_eager(fn, [x, w], codegen="triton").reports[0].runner
    # the second kernel's buffer takes the storage of the first's, dead at the mm between them
    assert runner.source.count("empty0(") == 1 and "b_buf2 = b_buf0; del b_buf0" in runner.source, \
        runner.source
    _check_call_liveness(runner.source)
    for _ in range(2):  # later calls take the launch path of the compiled binaries (on a GPU)
        torch.testing.assert_close(runner(x, w)[0], fn(x, w))
    # a training step: forward and backward graphs, a mix-order node, externs, saved activations
    be = assert_matches_eager(torch.nn.LayerNorm(48), [torch.randn(300, 48, device=dev, requires_grad=True)],
                              codegen="triton")
    for report in be.reports:
        _check_call_liveness(report.runner.source)


def test_cudagraphs_option_replays_training_steps_like_eager():
    # on the CPU the option is accepted and the report says why it is off; on a GPU the graphs are
    # captured at the second call and replayed, inputs copied where their storage changes per call
    dev = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
    torch._dynamo.reset()  # earlier tests' compiles of the same module code would count toward dynamo's limit
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU()).to(dev)
    ours = __import__("copy").deepcopy(model)
    be = passline.backend(codegen="triton", fallback="raise", cudagraphs=True)
    compiled = torch.compile(ours, backend=be)
    kept = []
    for step in range(4):
        x = torch.randn(16, 32, device=dev)
        out_a, out_b = compiled(x), model(x)
        kept.append((out_a, out_b))
        torch.testing.assert_close(out_a, out_b, rtol=1e-4, atol=1e-5)
        out_a.square().mean().backward()
        out_b.square().mean().backward()
        for (name, pa), pb in zip(ours.named_parameters(), model.parameters()):
            where = f"step {step}, {name}"
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5, msg=lambda m, w=where: f"{w}: {m}")
    for out_a, out_b in kept:  # outputs kept across steps are not overwritten by later replays
        torch.testing.assert_close(out_a, out_b, rtol=1e-4, atol=1e-5)
    states = {r.cudagraphs.split(":")[0] for r in be.reports}
    assert states == ({"on"} if dev == "cuda" else {"off"}), [r.cudagraphs for r in be.reports]
    if dev == "cuda":  # the kept outputs were the forward's own buffers: later calls ran uncaptured instead
        assert "0 calls uncaptured" not in be.reports[0].cudagraphs, be.reports[0].cudagraphs


@pytest.mark.skipif(os.environ.get("PASSLINE_TEST_DEVICE", "cpu") != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("accumulate", [False, True])
def test_cudagraphs_replay_into_their_own_buffers_unless_held(accumulate):
    # a training loop as users write one (the loss kept in a variable until the next step's): from the
    # third step on both graphs replay, the backward reads the forward's saved activations in place, and
    # every replay is right; gradients accumulated across steps (no zero_grad) are added into .grad, which
    # never takes a replay's output then. (An input that requires grad, kept alive by the previous loss's
    # graph, would keep its .grad — a backward output — and so block the forward's replay: test_cudagraphs_
    # option_replays_training_steps_like_eager covers outputs held across steps.)
    import re

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).cuda()
    ours = __import__("copy").deepcopy(model)
    be = passline.backend(codegen="triton", fallback="raise", cudagraphs=True)
    compiled = torch.compile(ours, backend=be)
    for step in range(6):
        x = torch.randn(16, 32, device="cuda")
        if not accumulate:
            ours.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
        loss_a, loss_b = compiled(x).square().mean(), model(x).square().mean()
        loss_a.backward()
        loss_b.backward()
        torch.testing.assert_close(loss_a, loss_b, rtol=1e-4, atol=1e-5)
        for (name, pa), pb in zip(ours.named_parameters(), model.parameters()):
            where = f"step {step}, {name}"
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5, msg=lambda m, w=where: f"{w}: {m}")
    said = {r.name: r.cudagraphs for r in be.reports}
    uncaptured = {name: int(re.search(r"(\d+) calls uncaptured", s).group(1)) for name, s in said.items()}
    assert not any(uncaptured.values()), said
    forward, backward = (next(s for name, s in said.items() if name.startswith(g)) for g in ("forward", "backward"))
    copied = int(re.search(r"(\d+) inputs", backward).group(1))
    small = int(re.search(r"(\d+) small outputs", forward).group(1))
    # the forward copies only its small output that reaches the caller (its result, 512 bytes); LayerNorm's
    # per-row statistics (64 bytes each) are saved for the backward, which reads them in place like every
    # other saved activation: it copies at most x and the cotangent
    assert small == 1 and copied <= 2, said


@pytest.mark.skipif(os.environ.get("PASSLINE_TEST_DEVICE", "cpu") != "cuda", reason="CUDA graphs need a GPU")
def test_cudagraphs_pool_holds_one_steps_peak_and_replays_only_where_nothing_held_is_reused():
    # a training step whose backward reads a wide saved activation (the tanh's output, saved for its own
    # backward and for the second matmul's weight gradient): captured, the backward's buffers reuse the
    # forward's saved activations once read, so the captured steps peak near an uncaptured step, not at
    # forward + backward. Where a later step holds an output whose memory the backward's capture had reused
    # (the hidden state, dropped before the captured backward ran), that backward runs uncaptured and the
    # output stays right.
    import re

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 256)).cuda()

    class Net(torch.nn.Module):  # the model, also returning its hidden state
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            h = self.inner[1](self.inner[0](x))
            return self.inner[2](h), h

    def run(cudagraphs, hidden=False, hold_at=None):
        torch._dynamo.reset()
        wrap = Net if hidden else (lambda m: m)
        net, ref = wrap(__import__("copy").deepcopy(model)), wrap(__import__("copy").deepcopy(model))
        be = passline.backend(codegen="triton", fallback="raise", cudagraphs=cudagraphs)
        compiled = torch.compile(net, backend=be)
        for step in range(6):
            x = torch.randn(4096, 256, device="cuda")
            net.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            if step == 1:  # the capture and the replays
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            (out, h), (out_ref, h_ref) = (compiled(x), ref(x)) if hidden else ((compiled(x), None), (ref(x), None))
            if step != hold_at:
                del h, h_ref
            out.square().mean().backward()
            out_ref.square().mean().backward()
            del out, out_ref
            if step == hold_at:  # held across the backward: not overwritten by it
                torch.testing.assert_close(h, h_ref, rtol=1e-4, atol=1e-5)
                del h, h_ref
            for (name, pa), pb in zip(net.named_parameters(), ref.parameters()):
                where = f"step {step}, {name}"
                torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-5,
                                           msg=lambda m, w=where: f"{w}: {m}")
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), {r.name: r.cudagraphs for r in be.reports}

    plain, _ = run(False)
    captured, said = run(True)
    assert all(s.startswith("on") and " 0 calls uncaptured" in s for s in said.values()), said
    assert captured <= 1.05 * plain, (captured / 2**20, plain / 2**20, said)
    _, said = run(True, hidden=True, hold_at=4)
    backward = next(s for name, s in said.items() if name.startswith("backward"))
    assert int(re.search(r"(\d+) calls uncaptured", backward).group(1)) == 1, said


@pytest.mark.skipif(os.environ.get("PASSLINE_TEST_DEVICE", "cpu") != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("loop", ["adamw", "retain_graph", "inference_kept", "kept_every_step", "kept_every_other"])
def test_cudagraphs_training_loops_match_eager(loop):
    # loops as users write them, under cudagraphs=True against eager copies, every step: an optimizer
    # updating parameters in place; two backwards of one graph (retain_graph: the saved activations stay
    # held by autograd, so nothing the first backward reads may be overwritten); inference with every output
    # kept; outputs kept every step, or every other step, across later steps
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.LayerNorm(512), torch.nn.GELU(),
                                torch.nn.Linear(512, 64)).cuda()
    ours = __import__("copy").deepcopy(model)
    compiled = torch.compile(ours, backend=passline.backend(codegen="triton", fallback="raise", cudagraphs=True))
    opt_a = torch.optim.AdamW(ours.parameters(), lr=1e-2) if loop == "adamw" else None
    opt_b = torch.optim.AdamW(model.parameters(), lr=1e-2) if loop == "adamw" else None
    kept = []
    for step in range(7):
        x = torch.randn(256, 64, device="cuda")
        if loop == "inference_kept":
            with torch.no_grad():
                kept.append((compiled(x), model(x)))
            continue
        ours.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        out_a, out_b = compiled(x), model(x)
        if loop == "kept_every_step" or (loop == "kept_every_other" and step % 2):
            kept.append((out_a, out_b))
        loss_a, loss_b = out_a.square().mean(), out_b.square().mean()
        del out_a, out_b
        if loop == "retain_graph":
            loss_a.backward(retain_graph=True)
            loss_b.backward(retain_graph=True)
        loss_a.backward()
        loss_b.backward()
        for (name, pa), pb in zip(ours.named_parameters(), model.parameters()):
            where = f"{loop}, step {step}, {name}"
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-5, msg=lambda m, w=where: f"{w}: {m}")
        if opt_a is not None:
            opt_a.step()
            opt_b.step()
    for k, (a, b) in enumerate(kept):  # nothing kept was overwritten by a later replay
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=lambda m, k=k: f"{loop}, kept {k}: {m}")
    for pa, pb in zip(ours.parameters(), model.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(os.environ.get("PASSLINE_TEST_DEVICE", "cpu") != "cuda", reason="CUDA graphs need a GPU")
def test_cudagraphs_outputs_outlive_the_backend():
    # a replay's gradients are tensors over the pool's memory that own none of it: dropping the compiled
    # model and its backend (dynamo's reset) while .grad still holds them must not free that memory for
    # others to overwrite
    import gc

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    ref = __import__("copy").deepcopy(model)
    compiled = torch.compile(model, backend=passline.backend(codegen="triton", fallback="raise", cudagraphs=True))
    for _ in range(4):  # the third and fourth steps replay
        x = torch.randn(512, 256, device="cuda")
        model.zero_grad(set_to_none=True)
        compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    del compiled
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    from passline.backends import cudagraphs

    grad = model[0].weight.grad.untyped_storage().data_ptr()
    assert any(s.ptr == grad for arena in cudagraphs._KEPT for s in arena.slots)  # the backend was dropped
    junk = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(16)]  # reuses what was freed
    for (name, pa), pb in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    del junk


def test_configuration_rules_follow_from_sizes_and_device():
    # hand facts of configs.rule on a 132-SM GPU (no timing): what each kernel launches with
    from passline.backends.triton.configs import Device, Variant, rule

    gpu = Device(sms=132)
    pw = rule({Variant.POINTWISE: None}, 10_000_000, None, False, gpu)
    assert (pw.variant, pw.xblock, pw.warps) == (Variant.POINTWISE, 1024, 4)
    assert rule({Variant.POINTWISE: None}, 100, None, False, gpu).xblock == 128  # small: the next power of two
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}
    # rows of 384 (block 512, wider than a warp covers in any dtype): one warp a program, 2 rows a block make
    # 1024 elements; 576000 rows keep every SM busy
    c = rule(red, 576000, 384, False, gpu)
    assert (c.variant, c.xblock, c.rblock, c.warps) == (Variant.PERSISTENT, 2, 512, 1)
    # few rows: fewer rows per block, so at least two programs per SM where rows allow
    assert rule(red, 300, 384, False, gpu).xblock == 1
    # rows wider than 1024: a warp per 1024 elements of the block (32 a thread), and a warp per 2048 (64) where
    # the kernel only reads a 2-byte row (a bfloat16 cross-entropy forward: its row, the target, a loss a row);
    # a row it also writes (a bfloat16 softmax: 4 bytes an element) or reads in float32 keeps 32 a thread
    for width, row_bytes, warps in ((3000, None, 4), (3000, 3000 * 2 + 16, 2), (3000, 3000 * 4, 4),
                                    (3000, 3000 * 4 + 16, 4), (2048, 2048 * 2 + 16, 1), (8192, 8192 * 2 + 16, 4)):
        c = rule(red, 44739, width, False, gpu, row_bytes=row_bytes)
        assert (c.variant, c.xblock, c.warps) == (Variant.PERSISTENT, 1, warps), (width, row_bytes)
    # rows within a warp's reach, few rows (programs with an SM each) and column sums keep their own rules
    assert rule(red, 576000, 384, False, gpu, row_bytes=384 * 2 + 16).warps == 1
    assert rule(red, 699051, 192, False, gpu, row_bytes=192 * 2 + 16).warps == 2  # 8 rows of 256, 32 a thread
    assert rule({Variant.PERSISTENT: None}, 100000, 4096, False, gpu, rows_contiguous=False,
                row_bytes=4096 * 2 + 16).warps == 4
    assert rule(red, 64, 3000, False, gpu, row_bytes=3000 * 2 + 16).warps == 16
    # rows too long for registers loop, one row a program, on as many warps as keep the rows in flight
    # within half of L2 (50 MB): 30000 elements of 4 bytes (unknown traffic), 264 rows on 32 warps
    c = rule(red, 4000, 30000, False, gpu)
    assert (c.variant, c.xblock, c.rblock, c.warps) == (Variant.LOOPED, 1, 8192, 32)
    # column sums (strided): 3072 columns in blocks of 16 (192 programs), not 128 (24 programs)
    c = rule(red, 3072, 8192, False, gpu, rows_contiguous=False)
    assert (c.variant, c.xblock, c.rblock) == (Variant.LOOPED, 16, 256)
    assert rule(red, 1 << 20, 64, False, gpu, rows_contiguous=False).xblock == 128
    # ... 16 elements a thread of 4 bytes or less; a column sum reading two float32 inputs (8 bytes an
    # element: a norm's dw and db from x and dy) 8, in blocks of 64 columns x 32 rows on 8 warps
    c = rule(red, 65536, 1024, False, gpu, rows_contiguous=False, row_bytes=1024 * 4)
    assert (c.xblock, c.rblock, c.warps) == (128, 32, 8)
    c = rule(red, 30000, 2237, False, gpu, rows_contiguous=False, row_bytes=2237 * 8.13)
    assert (c.xblock, c.rblock, c.warps) == (64, 32, 8)
    # ... and 32 of a bfloat16 column sum (2 bytes an element): 64 bytes a thread as float32's 16 (a bias
    # gradient of 10872 x 12345 bfloat16 on an H200: 182 µs at 16 a thread, 105 at 32)
    c = rule(red, 12345, 10872, False, gpu, rows_contiguous=False, row_bytes=10872 * 2)
    assert (c.xblock, c.rblock, c.warps) == (32, 256, 8)
    # mix-order: two-dimensional accumulator, four stages, the IR's split; a norm's backward (row sums)
    # takes rows for ~2048 elements and 192 bytes of traffic a thread: bfloat16 (6 bytes an element) 2 warps,
    # float32 (12) 4; a pointwise row side (a bias gradient) two rows and 96 bytes a thread
    mix = {Variant.MIX_ORDER: 128, Variant.MIX_ORDER_ACC2D: 128}
    c = rule(mix, 576000, 384, False, gpu, row_bytes=384 * 6, row_sums=True)
    assert (c.variant, c.xblock, c.warps, c.stages, c.split) == (Variant.MIX_ORDER_ACC2D, 4, 2, 4, 128)
    assert rule(mix, 576000, 384, False, gpu, row_bytes=384 * 12, row_sums=True).warps == 4
    c = rule(mix, 576000, 384, False, gpu, row_bytes=384 * 6)
    assert (c.variant, c.xblock, c.warps) == (Variant.MIX_ORDER_ACC2D, 2, 2)
    # narrow rows: one warp; two or four rows a block (48 bytes a thread), one row where the side is pointwise
    c = rule(mix, 1 << 21, 64, False, gpu, row_bytes=64 * 6, row_sums=True)
    assert (c.variant, c.xblock, c.warps) == (Variant.MIX_ORDER_ACC2D, 4, 1)
    assert rule(mix, 1 << 20, 64, False, gpu, row_bytes=64 * 12, row_sums=True).xblock == 2
    c = rule(mix, 1 << 21, 64, False, gpu, row_bytes=64 * 6)
    assert (c.variant, c.xblock, c.warps) == (Variant.MIX_ORDER, 1, 1)
    c = rule(mix, 32768, 4096, False, gpu, row_sums=True)
    assert (c.variant, c.xblock, c.warps) == (Variant.MIX_ORDER_ACC2D, 2, 16)
    assert rule(mix, 1000, 8192, False, gpu).variant == Variant.MIX_ORDER  # too wide for two rows a block
    # pipeline stages bounded by shared memory (227 KB): a float32 row of 8192 moving 96 KB gets two, not four
    assert rule(mix, 8192, 8192, False, gpu, row_bytes=8192 * 4 * 3).stages == 2
    assert rule(mix, 8192, 8192, False, gpu, row_bytes=8192 * 2 * 3).stages == 4  # bfloat16
    # a forced variant wins where the kernel has it
    assert rule(red, 576000, 384, False, gpu, only="looped").variant == Variant.LOOPED


def test_short_column_sums_are_timed():
    """configs.uncertain's column band: a column sum over at most 256 rows with a column per SM (a few
    rows' weight gradient) times the rule's chunk against whole columns in persistent blocks of 16, 32 and 64
    columns; over 257 to 2048 rows (a bias gradient over 2048 tokens), against 8 to 32 whole columns in blocks
    of 4096 to 16384 elements, 32 a thread; longer columns, fewer columns than SMs, contiguous rows and the
    interpreter keep the rule."""
    from passline.backends.triton.configs import Device, Variant, rule, uncertain

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def band(cols, rows, interpret=False, rows_contiguous=False):
        base = rule(red, cols, rows, interpret, gpu, rows_contiguous=rows_contiguous, row_bytes=rows * 8)
        return uncertain(red, cols, rows, interpret, gpu, rows_contiguous=rows_contiguous, base=base,
                         row_bytes=rows * 8)

    found = band(30000, 64)
    assert found[0] == rule(red, 30000, 64, False, gpu, rows_contiguous=False, row_bytes=64 * 8)
    assert [(c.variant, c.xblock, c.rblock, c.warps) for c in found[1:]] == [
        (Variant.PERSISTENT, 16, 64, 1), (Variant.PERSISTENT, 32, 64, 4), (Variant.PERSISTENT, 64, 64, 8)]
    assert all(c.xblock * c.rblock <= 32 * 32 * c.warps for c in band(768, 256))  # at most 32 a thread
    medium = band(12345, 2048)
    assert medium[0] == rule(red, 12345, 2048, False, gpu, rows_contiguous=False, row_bytes=2048 * 8)
    assert [(c.variant, c.xblock, c.rblock, c.warps) for c in medium[1:]] == [(Variant.PERSISTENT, 8, 2048, 16)]
    assert [(c.xblock, c.warps) for c in band(30000, 300)[1:]] == [(8, 4), (16, 8), (32, 16)]  # 300 rows: 512
    assert band(30000, 2049) == [] and band(100, 64) == [] and band(30000, 64, interpret=True) == []
    assert band(512, 64) == []  # 256 KB: a launch's worth (a split reduction's finishing sum)
    rows = band(30000, 64, rows_contiguous=True)  # a row sum of 64: the tall-rows band's one-warp programs
    assert [(c.variant, c.xblock, c.warps) for c in rows[1:]] == [
        (Variant.PERSISTENT, 32, 1), (Variant.PERSISTENT, 16, 1), (Variant.PERSISTENT, 8, 1)]


def test_a_rows_own_values_are_stored_after_the_row():
    """A persistent kernel stores a row's own values (LayerNorm's training forward: the mean and rstd it saves)
    after every member, the row's output included, not between the row's reductions where they were computed
    (on an H200 that store order was 13% slower); the values stay eager's (under Triton's interpreter)."""
    from passline.backends.triton import kernel as kgen

    x = torch.randn(37, 250, requires_grad=True)
    be = assert_matches_eager(torch.nn.LayerNorm(250), [x])  # x requires grad: the training forward, then backward
    graph = be.reports[0].graph  # the forward
    sources = [kgen.generate(n, graph, interpret=False, variant="persistent", blocks={}).source for n in graph.nodes()]
    (src,) = [s for s in sources if "tl.reduce(" in s]
    body = [ln.strip() for ln in src.split("\ndef ")[-1].splitlines() if ln.strip()]
    # rows of 1000 bytes start off 16-byte boundaries, and the weight is read by columns: the rows in classes'
    # branch, the aligned window's, then the plain one
    starts = [body.index(f"if WINDOW == {kgen.CLASSES}:"), body.index("elif WINDOW:"), body.index("else:")]
    branches = [body[a:b] for a, b in zip(starts, starts[1:] + [len(body)])]
    for body in branches:
        stores = [k for k, ln in enumerate(body) if ln.startswith("tl.store(")]
        # the normalized row (one element a column; through the window, whole groups then the edges)
        row = [k for k in stores if "q0" in body[k] or "rflat" in body[k]]
        assert len(row) in (1, 2) and len(stores) == len(row) + 2, body  # and the mean and rstd, one element a row
        assert stores[:len(row)] == row and stores == list(range(stores[0], stores[0] + len(stores))), body
        reduces = [k for k, ln in enumerate(body) if "tl.reduce(" in ln]
        assert len(reduces) == 2 and max(reduces) < row[0], body


def test_tall_rows_read_once_are_timed_in_many_rows_a_program():
    """configs.uncertain's tall-rows band: tall rows 64 to 1024 wide moving under 3 bytes an element (a bfloat16 row
    read once, nothing row-sized written: a cross-entropy forward) time the rule's block against 64 rows a program
    looped in chunks of 64 on 8 warps and, where the rule's program is one warp, twice its rows on it (64 elements a
    thread); rows of at most 256, whatever they move, one-warp programs of 2048, 1024 and 512 elements; rows 257-1024
    wide that are written too, float32 rows, wider or narrower rows, few rows, small work and the interpreter keep
    the rule."""
    from passline.backends.triton.configs import Device, Variant, rule, uncertain

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def band(rows, width, per_element, interpret=False, rows_contiguous=True):
        row_bytes = width * per_element + 16  # (a target read, a loss and a flag written a row)
        base = rule(red, rows, width, interpret, gpu, rows_contiguous=rows_contiguous, row_bytes=row_bytes)
        out = uncertain(red, rows, width, interpret, gpu, rows_contiguous=rows_contiguous, base=base,
                        row_bytes=row_bytes)
        assert not out or out[0] == base  # the rule's own block first
        return [(c.variant, c.xblock, c.rblock, c.warps) for c in out[1:]]

    looped = (Variant.LOOPED, 64, 64, 8)
    one_warp = [(Variant.PERSISTENT, 8, 256, 1), (Variant.PERSISTENT, 4, 256, 1),
                (Variant.PERSISTENT, 2, 256, 1)]  # rows of at most 256 (below)
    # the rule: 2 rows of 512 on 1 warp, 8 of 256 on 2, 1 of 1024 on 1 (32 a thread); twice the rows on one warp
    assert band(349525, 384, 2) == [looped, (Variant.PERSISTENT, 4, 512, 1)]
    assert band(699051, 192, 2) == [looped, *one_warp]  # two warps a program: 64 of them an SM
    assert band(134218, 1000, 2) == [looped, (Variant.PERSISTENT, 2, 1024, 1)]
    assert band(32768, 768, 2) == [looped, (Variant.PERSISTENT, 2, 1024, 1)]  # a model's tokens: 248 rows an SM
    timed = [looped]
    assert band(349525, 384, 4) == []  # float32 read once, or bfloat16 read and written (a softmax)
    assert band(699051, 192, 4) == one_warp  # ... but at most 256 wide: one-warp programs whatever is moved
    assert band(671089, 100, 12) == [(Variant.PERSISTENT, 16, 128, 1), (Variant.PERSISTENT, 8, 128, 1),
                                     (Variant.PERSISTENT, 4, 128, 1)]
    assert band(2000, 100, 12) == [] and band(2112, 100, 12) != []  # from 16 rows an SM
    assert band(44739, 3000, 2) == [] and band(2097152, 32, 2) == []  # wider than 1024, narrower than 64
    assert band(2000, 384, 2) == []  # under 16 rows an SM
    assert band(349525, 384, 2, interpret=True) == []
    assert timed[0] not in band(349525, 384, 2, rows_contiguous=False)  # column sums: the column band's


def test_few_rows_are_timed_whole_and_in_chunks():
    """configs.uncertain's few-rows band: fewer rows than SMs along contiguous memory, 1 MB moved at least,
    time the rule's block against a whole row held in one persistent block (8, 16 and 32 warps up to 16384
    elements; 16 and 32 up to 65536) and, past 16384, chunks of 16384 and 4096 on 32 warps; a row per SM, rows
    longer than 65536, small work, strided rows and the interpreter keep the rule."""
    from passline.backends.triton.configs import Device, Variant, rule, uncertain

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def band(rows, width, interpret=False, rows_contiguous=True, variants=red):
        base = rule(variants, rows, width, interpret, gpu, rows_contiguous=rows_contiguous, row_bytes=width * 12)
        return uncertain(variants, rows, width, interpret, gpu, rows_contiguous=rows_contiguous, base=base,
                         row_bytes=width * 12)

    def shapes(found):
        return [(c.variant, c.xblock, c.rblock, c.warps) for c in found]

    P, L = Variant.PERSISTENT, Variant.LOOPED
    assert shapes(band(64, 30000)) == [(L, 1, 8192, 32), (P, 1, 32768, 16), (P, 1, 32768, 32), (L, 1, 16384, 32),
                                       (L, 1, 4096, 32)]
    assert shapes(band(64, 8192)) == [(P, 1, 8192, 32), (P, 1, 8192, 8), (P, 1, 8192, 16)]
    assert band(64, 30000)[0] == rule(red, 64, 30000, False, gpu, row_bytes=30000 * 12)  # the rule's first
    assert band(64, 100000) == []  # past 65536: looped by rule
    assert band(16, 4096) == []  # 768 KB: a launch's worth
    assert band(64, 30000, interpret=True) == [] and band(64, 30000, rows_contiguous=False) == []
    assert band(64, 30000, variants={L: None}) == []  # no persistent form to time
    # a row per SM: the wide-row band, no persistent row
    assert shapes(band(132, 30000)) == [(L, 1, 16384, 32), (L, 1, 8192, 32), (L, 1, 4096, 32), (L, 1, 2048, 8),
                                        (L, 1, 4096, 16), (P, 1, 32768, 16), (P, 1, 32768, 32)]
    assert (P, 1, 65536, 32) not in shapes(band(132, 40000))  # held whole up to 32768


def test_tall_mix_order_kernels_no_rule_decides_are_timed():
    """configs.uncertain's mix-order band: tall mix-order kernels (rows >= 64 x SMs) whose rows are reduced
    and at most 128 wide, or (rows >= 16 x SMs) 129-4096 wide, reduced (a norm's backward) or pointwise (a bias
    gradient), time the rule's block against a few others at the first launch, the one-row form among them
    where the kernel has it; other shapes, the one-row form as the rule's and the interpreter keep the rule."""
    from passline.backends.triton.configs import (
        MIX_BAND_ROWS_PER_SM,
        MIX_POINTWISE_BAND_ROWS_PER_SM,
        Device,
        Variant,
        rule,
        uncertain,
    )

    gpu = Device(sms=132)
    mix = {Variant.MIX_ORDER: 128, Variant.MIX_ORDER_ACC2D: 128}

    def band(rows, width, row_bytes, row_sums, interpret=False, device=gpu, variants=mix):
        base = rule(variants, rows, width, interpret, device, row_bytes=row_bytes, row_sums=row_sums)
        out = uncertain(variants, rows, width, interpret, device, base=base, row_bytes=row_bytes, row_sums=row_sums)
        assert not out or out[0] == base  # the rule's own block first
        return [(c.variant, c.xblock, c.warps, c.stages, c.split) for c in out]

    acc2d, one_row = Variant.MIX_ORDER_ACC2D, Variant.MIX_ORDER
    # RMSNorm backward, bfloat16 (6 bytes an element): the rule's 4 rows on 1 warp, 8 on 1 and 2, and 2; and 32 rows
    # at 16 elements a thread (4 warps at 64 lanes, 8 at 128)
    assert band(1 << 21, 64, 64 * 6, True) == [(acc2d, 4, 1, 4, 128), (acc2d, 8, 1, 4, 128), (acc2d, 8, 2, 4, 128),
                                               (acc2d, 2, 1, 4, 128), (acc2d, 32, 4, 4, 128)]
    assert band(1 << 21, 96, 96 * 6, True)[-1] == (acc2d, 32, 8, 4, 128)
    # ... float32 (12 bytes): the rule's 2 rows, 4 on 1 and 2 warps (never fewer than 2 rows), 32 on 4
    assert band(1 << 20, 64, 64 * 12, True) == [(acc2d, 2, 1, 4, 128), (acc2d, 4, 1, 4, 128), (acc2d, 4, 2, 4, 128),
                                                (acc2d, 32, 4, 4, 128)]
    # a bias gradient (pointwise row side) 384 wide, bfloat16: the rule's 2 rows on 2 warps, 1 on 1, 4 on 4
    # (96 bytes a thread), and 4 rows on 2 (32 elements a thread); the one-row form, a row on 4 warps and two
    # rows on the fewest warps whose threads each hold their columns of both (one: 64 threads of 8 columns)
    assert band(349525, 384, 384 * 6, False) == [
        (acc2d, 2, 2, 4, 128), (acc2d, 1, 1, 4, 128), (acc2d, 4, 4, 4, 128), (acc2d, 4, 2, 4, 128),
        (one_row, 1, 4, 3, 128), (one_row, 2, 1, 3, 128)]
    # ... 3072 wide at a model's 8192 tokens: the rule's 2 rows on 16 warps, 1 row on 4 and 2 on 8 (32 elements a
    # thread), the one-row form's 1 row on 4 warps and 2 on 8; float32's stages as shared memory allows; from 16
    # rows an SM on
    assert band(8192, 3072, 3072 * 6, False) == [(acc2d, 2, 16, 4, 128), (acc2d, 1, 4, 4, 128), (acc2d, 2, 8, 4, 128),
                                                 (one_row, 1, 4, 3, 128), (one_row, 2, 8, 3, 128)]
    assert band(8192, 3072, 3072 * 12, False) == [(acc2d, 2, 16, 2, 128), (acc2d, 1, 4, 4, 128), (acc2d, 2, 8, 2, 128),
                                                  (one_row, 1, 4, 3, 128), (one_row, 2, 8, 3, 128)]
    few = MIX_POINTWISE_BAND_ROWS_PER_SM * gpu.sms
    assert band(few, 3072, 3072 * 6, False) != [] and band(few - 1, 3072, 3072 * 6, False) == []
    # a norm's backward 257-4096 wide (rows reduced) from 16 rows an SM: the rule's block against one row on 4, 8
    # and 16 warps (at least 4 elements a thread: 4 warps only at 512); float32 RMSNorm at 8192 x 2304 took 77.6
    # us by rule on an H200, 57.5 on one row and 8 warps (Inductor 65.6)
    assert band(8192, 2304, 2304 * 12, True) == [(acc2d, 2, 16, 2, 128), (one_row, 1, 4, 3, 128),
                                                 (one_row, 1, 8, 3, 128), (one_row, 1, 16, 3, 128)]
    assert band(576000, 384, 384 * 6, True) == [(acc2d, 4, 2, 4, 128), (one_row, 1, 4, 3, 128)]
    assert band(few - 1, 2304, 2304 * 12, True) == []
    assert band(8192, 2304, 2304 * 12, True, variants={acc2d: 128}) == []  # no one-row form: the rule
    # rows per block within the split: at a split of 4 the reduced band cannot double its 4 rows
    assert band(1 << 21, 64, 64 * 6, True, variants={Variant.MIX_ORDER: 4, acc2d: 4}) == [
        (acc2d, 4, 1, 4, 4), (acc2d, 2, 1, 4, 4)]
    # from 64 rows an SM on
    rows = MIX_BAND_ROWS_PER_SM * gpu.sms
    assert len(band(rows, 64, 64 * 6, True)) == 5 and band(rows - 1, 64, 64 * 6, True) == []
    assert band(rows - 1, 64, 64 * 6, True, device=Device(sms=100)) != []
    # rows reduced 129 to 256 wide: the rule's 8 rows, 4 on its warps and 2 on half of them
    assert band(671089, 200, 200 * 6, True) == [(acc2d, 8, 2, 4, 128), (acc2d, 4, 2, 4, 128), (acc2d, 2, 1, 4, 128)]
    # the rule decides: the interpreter; a bias gradient of 128 or fewer columns (the one-row form) or wider than
    # 4096; one form only (no two-dimensional accumulator)
    assert band(1 << 21, 64, 64 * 6, True, interpret=True) == []
    assert band(1 << 21, 128, 128 * 6, False) == [] and band(1 << 18, 8192, 8192 * 6, False) == []
    assert band(1 << 21, 64, 64 * 6, True, variants={Variant.MIX_ORDER: 128}) == []
    # without the rule's configuration, nothing to time around
    assert uncertain(mix, 1 << 21, 64, False, gpu, row_bytes=64 * 6, row_sums=True) == []


def test_a_pointwise_row_side_times_narrow_blocks():
    """configs._narrow_blocks: a mix-order kernel whose row side is pointwise and which has the tiled form
    beside the whole-row ones (runner: on a GPU) also times many rows of 64 or 128 columns, 16 elements a
    thread: whole rows where they are 64 or 128 wide, blocks of columns (the tiled form) where wider."""
    from passline.backends.triton.configs import Device, Variant, rule, uncertain

    gpu = Device(sms=132)
    acc2d, one_row, tiled = Variant.MIX_ORDER_ACC2D, Variant.MIX_ORDER, Variant.MIX_ORDER_TILED
    forms = {one_row: 128, acc2d: 128, tiled: 128}

    def band(rows, width, row_bytes, row_sums=False, variants=forms):
        base = rule(variants, rows, width, False, gpu, row_bytes=row_bytes, row_sums=row_sums)
        out = uncertain(variants, rows, width, False, gpu, base=base, row_bytes=row_bytes, row_sums=row_sums)
        assert not out or out[0] == base
        return [(c.variant, c.xblock, c.rblock, c.warps, c.stages) for c in out]

    # 64 wide: the rule's one row on one warp (the one-row form), then 32 and 64 whole rows on 4 and 8 warps
    assert band(1 << 21, 64, 64 * 6) == [(one_row, 1, 64, 1, 4), (acc2d, 32, 64, 4, 3), (acc2d, 64, 64, 8, 3)]
    assert band(1 << 21, 128, 128 * 6) == [(one_row, 1, 128, 1, 4), (acc2d, 32, 128, 8, 3)]
    # 2304 wide (4096 lanes): the rule's two rows, the one-row form's one and two rows, then blocks of 64 and 128
    # columns (the whole-row band's other blocks of one to four rows give way to them)
    assert band(8192, 2304, 2304 * 6) == [(acc2d, 2, 4096, 16, 4), (one_row, 1, 4096, 4, 3), (one_row, 2, 4096, 8, 3),
                                          (tiled, 32, 64, 4, 3), (tiled, 64, 64, 8, 3), (tiled, 32, 128, 8, 3)]
    without = band(8192, 2304, 2304 * 6, variants={one_row: 128, acc2d: 128})
    assert len(without) == 5 and all(v != tiled for v, *_ in without)
    # 129-256 wide (the rule's two rows of 256 lanes on one warp): the narrow blocks, and 64 and 128 rows of 32 columns
    assert band(838861, 160, 160 * 6) == [(acc2d, 2, 256, 1, 4), (tiled, 32, 64, 4, 3), (tiled, 64, 64, 8, 3),
                                          (tiled, 32, 128, 8, 3), (tiled, 64, 32, 4, 3), (tiled, 128, 32, 8, 3)]
    assert all(v != tiled for v, *_ in band(838861, 160, 160 * 12, row_sums=True))  # a reduced row side: not these
    # rows within the split: at a split of 16, 16 rows a block (and its warps)
    assert band(1 << 21, 64, 64 * 6, variants={one_row: 16, acc2d: 16, tiled: 16})[1:] == [(acc2d, 16, 64, 2, 3)]
    # not for a row side that reduces its rows, rows under 64 wide, or without the tiled form
    assert all(v != tiled and xb <= 8 for v, xb, *_ in band(8192, 2304, 2304 * 12, row_sums=True))
    assert band(1 << 21, 32, 32 * 6) == []
    assert band(1 << 21, 64, 64 * 6, variants={one_row: 128, acc2d: 128}) == []
    # the tiled form beside the whole-row ones is not the wide row side's rule (that is its only form)
    assert rule(forms, 8192, 2304, False, gpu, row_bytes=2304 * 6).variant == acc2d
    assert rule({tiled: 128}, 8192, 8192, False, gpu, row_bytes=8192 * 6).variant == tiled


@pytest.mark.parametrize("dtype,rows", [(torch.bfloat16, 1), (torch.float32, 2)])
def test_a_bias_gradient_in_blocks_of_one_or_two_wide_rows_matches_eager(dtype, rows):
    # the mix band's blocks of a pointwise row side 257-4096 wide (configs._mix_band): the two-dimensional
    # accumulator with one or two rows of 4096 a block (3000 columns padded), here forced through the
    # split (rows per program) and the variant; the GELU epilogue's gradients, bias gradient included
    text = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                             f"mix_order_reduction(split_rows={rows}, fill_sms=false)")
    x = torch.randn(40, 3000, dtype=dtype, requires_grad=True)
    b = torch.randn(3000, dtype=dtype, requires_grad=True)
    be = assert_matches_eager(lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"), [x, b],
                              pipeline=text, codegen="triton", kernel_variant="mix_order_acc2d")
    mixed = [k.blocks for r in be.reports for k in r.kernel_info if k.chosen == "mix_order_acc2d"]
    assert mixed and all((m["XBLOCK"], m["RBLOCK"]) == (rows, 4096) for m in mixed), mixed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_bias_gradient_in_blocks_of_columns_of_whole_rows_matches_eager(dtype):
    # the tiled form on a node of whole rows (the mix band's narrow blocks, configs._narrow_blocks; here forced):
    # 3000 columns in blocks of 1024 (the last one partial), 4 rows a program; the GELU epilogue's gradients
    text = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                             "mix_order_reduction(split_rows=4, fill_sms=false)")
    x = torch.randn(42, 3000, dtype=dtype, requires_grad=True)
    b = torch.randn(3000, dtype=dtype, requires_grad=True)
    be = assert_matches_eager(lambda x, b: torch.nn.functional.gelu(x + b), [x, b], pipeline=text, codegen="triton",
                              kernel_variant="mix_order_tiled")
    tiled = [k for r in be.reports for k in r.kernel_info if k.chosen == "mix_order_tiled"]
    assert tiled and all(k.blocks["RBLOCK"] == 1024 for k in tiled), [k.blocks for k in tiled]
    assert all("mix_order" in k.variants for k in tiled)  # a node of whole rows, not one the pass tiled


@INTERPRETED
@pytest.mark.parametrize("width,dtype,layout,cols", [
    (100, torch.float32, "rows", 64), (130, torch.bfloat16, "rows", 64), (384, torch.float32, "padded", 64),
    (1000, torch.bfloat16, "rows", 64), (160, torch.bfloat16, "rows", 32), (200, torch.float32, "padded", 32)])
def test_narrow_blocks_of_columns_match_eager_at_odd_widths_and_layouts(monkeypatch, width, dtype, layout, cols):
    # the GPU band's narrow blocks (configs._narrow_blocks: 64 columns a block, or 32 where rows are 129-256
    # wide, many rows) on nodes of whole rows under the interpreter: the tiled form forced and its candidate
    # narrowed to `cols` columns of 8 rows. Widths that are not a multiple of the block (a partial last block of
    # columns), a 130-wide row (three blocks, the last of two columns), and rows further apart than their width
    # (x a slice of wider rows)
    from passline.backends.triton import configs

    def narrow(rb, split, interpret):
        return [configs.Config(configs.Variant.MIX_ORDER_TILED, min(8, configs.pow2(split)), cols, 4, 1, split)]
    monkeypatch.setattr(configs, "tiled_candidates", narrow)
    text = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                             "mix_order_reduction(split_rows=16, fill_sms=false)")
    x = torch.randn(70, width + 24 if layout == "padded" else width, dtype=dtype)[:, :width].requires_grad_()
    b = torch.randn(width, dtype=dtype, requires_grad=True)
    be = assert_matches_eager(lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh") * 2, [x, b],
                              pipeline=text, codegen="triton", kernel_variant="mix_order_tiled")
    tiled = [k for r in be.reports for k in r.kernel_info if k.chosen == "mix_order_tiled"]
    assert tiled and all(k.blocks["RBLOCK"] == cols and "mix_order" in k.variants for k in tiled), tiled


def test_finishing_kernels_take_few_columns_in_blocks_of_four():
    """configs.finish_rule, hand facts on a 132-SM GPU: a mix-order step's finish sums a float32 workspace
    [splits, columns]; 264 to 2047 columns take 4 columns a program in steps of up to 1024 rows on 4 warps,
    fewer columns a program a column (the rule's persistent rows), 2048 and more the column sums' rule."""
    from passline.backends.triton.configs import Config, Device, Variant, finish_rule, rule

    gpu, red = Device(sms=132), {Variant.PERSISTENT: None, Variant.LOOPED: None}
    assert finish_rule(red, 384, 3680, False, gpu) == Config(Variant.LOOPED, 4, 1024, 4)
    assert finish_rule(red, 768, 256, False, gpu) == Config(Variant.LOOPED, 4, 256, 4)  # rows: the workspace's
    assert finish_rule(red, 64, 16000, False, gpu) == rule(red, 64, 16000, False, gpu, rows_contiguous=True)
    assert finish_rule(red, 4096, 256, False, gpu) == rule(red, 4096, 256, False, gpu, rows_contiguous=False)
    assert finish_rule(red, 384, 3680, True, gpu) == rule(red, 384, 3680, True, gpu)  # the interpreter's one


def test_a_finishing_kernel_in_blocks_of_four_columns_matches_eager(monkeypatch):
    # the GPU's finishing kernel (configs.finish_rule: 4 columns a program, a step of rows) run under the
    # interpreter on an 8-SM device, so that 30 columns (not a multiple of 4) take it; 132 workspace rows in
    # a step of 256, both masked; the bias gradient and the input's gradient as eager's
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Device, finish_rule

    taken = []

    def gpu_rule(self, xnumel, rnumel, args=None):
        taken.append(cfg := finish_rule(self.splits, xnumel, rnumel, False, Device(sms=8)))
        return cfg
    monkeypatch.setattr(prunner.FinishKernel, "_rule", gpu_rule)
    text = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                             "mix_order_reduction(split_rows=4, fill_sms=false)")
    x = torch.randn(528, 30, requires_grad=True)
    b = torch.randn(30, requires_grad=True)
    assert_matches_eager(lambda x, b: torch.nn.functional.gelu(x + b), [x, b], pipeline=text, codegen="triton")
    assert any((c.xblock, c.rblock, c.warps) == (4, 256, 4) for c in taken), taken


def test_autotuning_times_the_rules_configuration_and_the_band():
    """autotune=True times `candidates`' fixed list and, where missing from it, the rule's configuration and the
    timed band's: a float32 row kernel over 64 rows of 30000 (an RMSNorm backward) loops in chunks of 8192 on 32
    warps by rule, which the fixed list (chunks of 2048 at most) lacks; on an H200 autotuning chose 2048 on 8
    warps, 15.7 us against the rule's 8.4. A persistent row of 8192 on many rows: the band's four too."""
    from passline.backends.triton.configs import (
        Device,
        Variant,
        autotune_candidates,
        candidates,
        rule,
        uncertain,
    )

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}
    for rows, width in ((64, 30000), (10872, 12345)):
        fixed = candidates(red, rows, width, False)
        base = rule(red, rows, width, False, gpu, row_bytes=8 * width)
        band = uncertain(red, rows, width, False, gpu, base=base, row_bytes=8 * width)
        out = autotune_candidates(fixed, base, band)
        assert out[:len(fixed)] == fixed and base in out and all(c in out for c in band)
        assert len(out) == len(set(out))
        if rows == 64:
            assert base not in fixed and (base.variant, base.rblock, base.warps) == (Variant.LOOPED, 8192, 32)
        else:
            assert band and any(c not in fixed for c in band)
    assert autotune_candidates(fixed, None) == fixed


def test_rows_of_8193_to_16384_read_once_are_timed_on_4_warps_too():
    # configs.uncertain's band for the widest persistent rows: held on 8 and 32 warps, looped in chunks of
    # 2048 on 16 and 1024 on 8; a row read once at 2 bytes an element (a bfloat16 cross-entropy forward:
    # the row, a target and a loss a row) also on 4 warps; a row read and written (a softmax) not
    from passline.backends.triton.configs import Device, Variant, rule, uncertain

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def band(per_element):
        row_bytes = 12345 * per_element + 16
        base = rule(red, 10872, 12345, False, gpu, row_bytes=row_bytes)
        return [(c.variant, c.rblock, c.warps) for c in uncertain(red, 10872, 12345, False, gpu, base=base,
                                                                  row_bytes=row_bytes)]

    four = [(Variant.PERSISTENT, 16384, 8), (Variant.PERSISTENT, 16384, 16), (Variant.PERSISTENT, 16384, 32),
            (Variant.LOOPED, 2048, 16)]
    assert band(2) == four + [(Variant.PERSISTENT, 16384, 4)]
    assert band(4) == four and band(8) == four


def test_persistent_rows_take_32_elements_a_thread_and_few_rows_more_warps():
    # hand facts of configs.rule on a 132-SM GPU for rows held in registers and rows that loop
    from passline.backends.triton.configs import Device, Variant, rule

    gpu = Device(sms=132)
    red = {Variant.PERSISTENT: None, Variant.LOOPED: None}

    def pick(rows, width):
        c = rule(red, rows, width, False, gpu)
        return c.variant, c.xblock, c.rblock, c.warps

    # many rows: blocks of about 2048 elements on one warp per 1024 (32 elements a thread); rows of 512 to
    # 1024 one warp a program, so that no row's reduction crosses warps
    assert pick(576000, 384) == (Variant.PERSISTENT, 2, 512, 1)
    assert pick(134218, 1000) == (Variant.PERSISTENT, 1, 1024, 1)  # cross-entropy's rows, 1000 wide
    assert pick(1 << 20, 200) == (Variant.PERSISTENT, 8, 256, 2)  # within a warp in bfloat16: 2048 a block
    assert pick(1 << 20, 100) == (Variant.PERSISTENT, 16, 128, 2)
    assert pick(16384, 8192) == (Variant.PERSISTENT, 1, 8192, 8)  # LayerNorm 8192 wide: 8 warps, not 16
    assert pick(1024, 16384) == (Variant.PERSISTENT, 1, 16384, 16)
    assert pick(1 << 20, 64) == (Variant.PERSISTENT, 32, 64, 2)
    # 300 rows: one row a program (two programs per SM), still 32 elements a thread
    assert pick(300, 384) == (Variant.PERSISTENT, 1, 512, 1)
    # fewer rows than SMs: each program has an SM to itself, 8 elements a thread (up to 32 warps)
    assert pick(64, 1000) == (Variant.PERSISTENT, 1, 1024, 4)
    assert pick(100, 16384) == (Variant.PERSISTENT, 1, 16384, 32)
    assert pick(131, 4096) == (Variant.PERSISTENT, 1, 4096, 16)
    assert pick(132, 4096) == (Variant.PERSISTENT, 1, 4096, 4)
    # rows that loop: the fewest warps (8, 16, 32) whose rows in flight (132 SMs x 64 / warps) touch at most
    # half of L2, chunks of 16 elements a thread up to 8192; with fewer rows than SMs, 8192 on 32 warps
    assert pick(4000, 30000) == (Variant.LOOPED, 1, 8192, 32)  # 4 bytes an element assumed: 120 KB a row
    looped = rule(red, 4000, 30000, False, gpu, row_bytes=20_000)  # 1056 rows on 8 warps: 21 MB
    assert (looped.rblock, looped.warps) == (4096, 8)
    looped = rule(red, 4000, 30000, False, gpu, row_bytes=40_000)  # 528 rows on 16 warps: 21 MB
    assert (looped.rblock, looped.warps) == (8192, 16)
    assert rule(red, 4000, 30000, False, Device(sms=132, l2_bytes=256 << 20)).warps == 8  # a bigger L2
    # a softmax's online max-and-sum loop: chunks of 2048 on 8 warps; 4096 on 32 for a float32 row read and
    # written (8 bytes an element)
    online = rule(red, 4000, 30000, False, gpu, online=True, row_bytes=30000 * 4)
    assert (online.rblock, online.warps) == (2048, 8)
    online = rule(red, 4000, 30000, False, gpu, online=True, row_bytes=30000 * 8)
    assert (online.rblock, online.warps) == (4096, 32)
    assert pick(64, 30000) == (Variant.LOOPED, 1, 8192, 32)
    assert pick(64, 3 << 20) == (Variant.LOOPED, 1, 8192, 32)
    # a 64-SM GPU: 100 rows are no longer fewer than its SMs
    assert rule(red, 100, 16384, False, Device(sms=64)).warps == 16


def test_static_counts_are_literals_but_a_tuned_split_reaches_the_finishing_kernel(monkeypatch):
    """Static element counts are written into kernel bodies (Triton then proves the vector width of masked
    loads), except where the launch sets another value: a mix-order node's finishing kernel sums as many
    workspace rows as the main kernel's SPLIT gives, and on a GPU that split is chosen at the first launch.
    Here the split is forced to a third of the IR's, so the finishing kernel sees three times the IR's
    splits; with its count written in, LayerNorm's weight and bias gradients summed only the first third."""
    from passline.backends.triton import runner as triton_runner

    def other_split(self, args, xnumel, rnumel, stream, after=None):
        cfg = self._rule(xnumel, rnumel)
        return cfg.with_split(max(1, self.split // 3))

    monkeypatch.setattr(triton_runner.MixKernel, "_choose", other_split)
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(40)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    pipeline = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(split_rows=64)")
    be = assert_matches_eager(ln, [torch.randn(301, 40, requires_grad=True)], codegen="triton", pipeline=pipeline)
    kernels = {k.kind: k.source for r in be.reports for k in r.runner.kernels}
    assert "mix_order" in kernels and "mix_finish" in kernels
    assert "xindex < 301" in kernels["mix_order"]  # the rows, written in
    assert "rindex < rnumel" in kernels["mix_finish"]  # the splits, passed at launch


@pytest.mark.parametrize("shape", [(7, 123), (5, 3, 37)])
def test_contiguous_accesses_of_a_multi_dim_loop_use_the_flat_index(shape):
    """A bias add over rows of an odd width keeps two loop variables (the bias needs the column), and the
    row-major input's address, `12345 * o0 + o1`, is written as `xindex`: Triton proves vectors from
    `xindex`, not from `(xindex // 12345) * 12345 + xindex % 12345` (odd widths loaded element by element)."""
    x = torch.randn(*shape)
    b = torch.randn(shape[-1])
    be = assert_matches_eager(lambda x, b: torch.nn.functional.gelu(x + b), [x, b], codegen="triton")
    (k,) = be.reports[0].runner.kernels
    ptr = lambda name: re.search(rf"tl\.load\((p_\w+) \+ {name}\b", k.source)
    assert ptr("xindex") and ptr(r"o\d+"), k.source  # the input flat, the bias by its column
    assert re.search(r"tl\.store\(p_\w+ \+ xindex,", k.source), k.source


_FREED: list = []  # (probe) whether the weakly referenced input was gone when the extern ran
_REF: list = []


@torch.library.custom_op("passline_test::probe_freed", mutates_args=())
def _probe_freed(x: torch.Tensor) -> torch.Tensor:
    _FREED.append(_REF[0]() is None)
    return x.clone()


@_probe_freed.register_fake
def _(x):
    return torch.empty_like(x)


def test_boxed_inputs_die_at_their_last_use():
    """aot_autograd hands a compiled graph its inputs in a list it lets go of (a backward's saved
    activations): the generated call empties that list, so an input held by nothing else is freed after
    the last kernel that reads it, before the graph's later steps run — as Inductor's calls do."""
    import weakref

    from passline.backends.dynamo import FxStage
    from passline.lowering import decomposition_table

    def f(a, b):
        c = (a * 2).sum()  # a's last reader
        return torch.ops.passline_test.probe_freed(b + c)  # an extern step after it

    # integer values: the 2048-term sum is exact in any order, so the kernel's summation order cannot move it
    # off eager's (unseeded normal values missed assert_close's float32 tolerance once in CI: 1.4e-4)
    a, b = torch.randint(-4, 5, (64, 32)).float(), torch.randint(-4, 5, (16,)).float()
    _REF[:] = [weakref.ref(b)]  # (alive: tracing and eager call the probe too)
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, decomposition_table())(a, b)
    be = passline.backend(codegen="triton", fallback="raise")
    call = be._compiler("inference", FxStage())(gm, [a, b])
    want = f(a, b)
    _REF[:], _FREED[:] = [weakref.ref(a)], []
    args = [a, b]
    del a
    out = call(args)
    assert args == [] and _FREED == [True], _FREED  # the list emptied; `a` gone when the extern ran
    torch.testing.assert_close(out[0], want)
    assert "args.clear()" in be.reports[0].runner.source


def test_kernel_probe_compiles_for_sm90_cross_entropy_rows_in_16_byte_loads():
    """benchmarks/kernel_probe.py (in a process of its own: it patches passline to generate GPU code for CPU
    graphs): cross-entropy over 4099 rows of 1000 bfloat16 logits compiles, for sm_90, to a row kernel that
    loads 16 bytes a thread (Triton proves the vector width against the literal 1000) at 32 elements a
    thread without spilling, and, planned for 2 SMs, a loss partial kernel with one program per chunk (4
    chunks of 1025 rows, the last clamped: 4099 is prime; read as rows, not as a column sum of 4 chunks a
    program), then the finishing kernel: 3 kernels."""
    import subprocess
    import sys

    from modules import BENCHMARKS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # (min_program_bytes=0: a loss over 4099 rows is too short to split by default; the split's form is tested)
    pipeline = passline.DEFAULT_PIPELINE.replace("split_reductions", "split_reductions(min_program_bytes=0)")
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "kernel_probe.py"), "--case", "cross_entropy",
                           "--shape", "4099x1000", "--sms", "2", "--pipeline", pipeline], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "(3 kernels, 0 extern calls)" in out, out
    kernels = out.split("\n-- ")[1:]
    row = next(k for k in kernels if "[4099 x 1000]" in k)
    assert "XBLOCK=1 RBLOCK=1024 warps=1" in row and "'ld.global.v4.b32': 4" in row and "local (spills) 0 B" in row, row
    partial = next(k for k in kernels if "partial" in k)
    assert "[4 x 1025]" in partial and "XBLOCK=1 " in partial, partial


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the script itself (gpu_check.sh); set in a process "
                    "that imported Triton compiled, the interpreter fails on a loop's helper functions")
def test_config_check_launches_each_candidate_beside_the_rules(monkeypatch):
    """benchmarks/config_check.py: the GPU's candidates of log-softmax's row kernels (the band's and looped
    blocks of several rows) launched beside each real launch agree with it here; a candidate made to write wrong
    values is named, with its kernel and configuration, and the script exits 1."""
    from modules import BENCHMARKS

    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Variant

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (main sets it for --device cpu; restored after the test)
    import config_check

    argv = ["--device", "cpu", "--cases", "log_softmax", "--widths", "160", "--dtypes", "float32", "--rows", "67",
            "--variant", "looped"]
    checked = []
    monkeypatch.setattr(config_check.Checker, "uninstall",
                        lambda self: (checked.append((self.checked, list(self.bad))),
                                      setattr(self.runner.Kernel, "__call__", self._call)))
    assert config_check.main(argv) == 0
    assert checked[-1][0] >= 2 and checked[-1][1] == [], checked

    launch = prunner.Kernel.launch

    def wrong(self, cfg, stream, args, xnumel, rnumel):
        out = launch(self, cfg, stream, args, xnumel, rnumel)
        if cfg.variant == Variant.LOOPED and cfg.xblock > 1:
            for a in args:
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    a.add_(1)
        return out

    monkeypatch.setattr(prunner.Kernel, "launch", wrong)
    assert config_check.main(argv) == 1
    assert any("looped XBLOCK=64" in b and "relative error" in b for b in checked[-1][1]), checked[-1]


def test_a_spilling_rule_configuration_gets_twice_the_warps(tmp_path):
    # what Kernel does once ptxas reports spills for the rule's persistent configuration (on a GPU; here a
    # stand-in for the compiled kernel): the same block on twice the warps from the next launch, and only
    # for a rule's persistent choice
    from types import SimpleNamespace

    from passline.backends.triton.cache import KernelCache
    from passline.backends.triton.configs import Config, Device, Variant
    from passline.backends.triton.runner import Kernel, KernelInfo

    def kernel(autotune=False):
        info = KernelInfo("k", "node", "reduction", {})
        return Kernel(info, KernelCache(str(tmp_path)), False, autotune, "key", None, Device(132))

    cfg = Config(Variant.PERSISTENT, 1, 8192, 8)  # 32 elements a thread
    k = kernel()
    k.choices[k.bucket(16384, 8192)] = cfg
    k._unspill(cfg, SimpleNamespace(n_spills=0), 16384, 8192)
    assert k.cached(16384, 8192) == cfg  # no spills: kept
    k._unspill(cfg, SimpleNamespace(n_spills=64), 16384, 8192)
    assert k.cached(16384, 8192) == Config(Variant.PERSISTENT, 1, 8192, 16)
    assert k.info.blocks["num_warps"] == 16
    # a timed choice, a looped kernel, or a block already one element a thread: left as they are
    timed = kernel(autotune=True)
    timed._unspill(cfg, SimpleNamespace(n_spills=64), 16384, 8192)
    assert timed.cached(16384, 8192) is None
    looped = Config(Variant.LOOPED, 1, 2048, 8)
    k._unspill(looped, SimpleNamespace(n_spills=64), 4000, 30000)
    assert k.cached(4000, 30000) is None
    k._unspill(Config(Variant.PERSISTENT, 1, 1024, 32), SimpleNamespace(n_spills=64), 64, 1000)
    assert k.cached(64, 1000) is None


_PTRS: list = []  # (probe) the data pointer of what the extern was given


@torch.library.custom_op("passline_test::probe_ptr", mutates_args=())
def _probe_ptr(x: torch.Tensor) -> torch.Tensor:
    _PTRS.append(x.data_ptr())
    return x.clone()


@_probe_ptr.register_fake
def _(x):
    return torch.empty_like(x)


def _inference_call(f, example, **options):
    from passline.backends.dynamo import FxStage
    from passline.lowering import decomposition_table

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, decomposition_table())(*example)
    be = passline.backend(codegen="triton", fallback="raise", **options)
    return be._compiler("inference", FxStage())(gm, list(example)), be


def test_a_kernel_writes_its_result_over_an_input_only_it_holds():
    """A kernel whose output has the layout of an input it reads last, at the same positions, writes the
    output over that input when nothing else holds it (aot_autograd's list was the last holder of a
    backward's saved activation): one allocation less. An input the caller still holds is never written."""
    def f(a):
        return torch.ops.passline_test.probe_ptr(a.sin() * 2)

    a = torch.randn(64, 32, device=os.environ.get("PASSLINE_TEST_DEVICE", "cpu"))
    call, be = _inference_call(f, (a,))
    want, kept = f(a), a.clone()
    _PTRS[:] = []
    out = call([a])  # the caller keeps `a`
    assert torch.equal(a, kept) and _PTRS[0] != a.data_ptr()
    torch.testing.assert_close(out[0], want)
    ptr, args = a.data_ptr(), [a]
    del a
    _PTRS[:] = []
    out = call(args)  # the list held it alone
    assert _PTRS == [ptr], "the kernel's output did not take the dying input's storage"
    torch.testing.assert_close(out[0], want)
    assert "if sole(" in be.reports[0].runner.source


def test_a_looped_kernel_overwrites_only_what_no_later_loop_reads():
    """In a looped reduction, `y = 2x` is stored in the first loop and `x` is read again in the second
    (for `y / sum(y)`): y over x's storage would make the second loop read 2x for x. Only the last loop's
    output may take x's storage."""
    from passline.backends.triton.kernel import overwritable

    def f(x):
        y = x * 2
        return y, y / y.sum(1, keepdim=True)

    x = torch.randn(6, 300, device=os.environ.get("PASSLINE_TEST_DEVICE", "cpu")) + 3
    call, be = _inference_call(f, (x,), kernel_variant="looped")
    want = f(x)
    report = be.reports[0]
    kernels = [n for n in report.graph.nodes() if overwritable(n, report.graph)]
    assert len(kernels) == 1
    pairs = overwritable(kernels[0], report.graph)
    assert len(pairs) == 1 and len(next(iter(pairs.values()))) == 1, pairs  # z's buffer, not y's
    ptr, args = x.data_ptr(), [x]
    del x
    out = call(args)
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[1], want[1])
    assert out[1].data_ptr() == ptr and out[0].data_ptr() != ptr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_row_mix_kernel_writes_dh_over_dy(dtype):
    """A GELU backward with its bias's column sum, rows mixed whole (not tiled): dh = dy * gelu'(h) reads dy
    and h at the point it writes, in the step of the one program that owns those rows, so dh takes dy's
    storage when dy dies there (ViT-style's MLP backward: one [tokens, 4d] buffer less at the peak); h may
    serve as well (here the test holds it). The column sum reads dh from registers, never the overwritten
    memory."""
    from modules import MIXED

    from passline.backends.triton.kernel import overwritable
    from passline.ir import MixOrderNode

    def f(dy, h):
        dh = torch.ops.aten.gelu_backward(dy, h)
        return dh, dh.float().sum(0)

    device = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
    dy, h = (torch.randn(50, 200, device=device, dtype=dtype) for _ in range(2))
    want = f(dy, h)
    call, be = _inference_call(f, (dy, h), pipeline=MIXED)
    graph = be.reports[0].graph
    (mix,) = [n for n in graph.nodes() if isinstance(n, MixOrderNode)]
    (donors,) = overwritable(mix, graph).values()
    assert not mix.tiled and sorted(donors) == ["dy_1", "h_1"], (donors, graph.format())
    ptr, args = dy.data_ptr(), [dy, h]
    del dy
    out = call(args)
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[1], want[1], rtol=1e-4, atol=1e-3)
    assert out[0].data_ptr() == ptr


def test_two_outputs_each_take_a_dying_input():
    """x + y and x * y from two dying inputs: each output is offered both (sole() at the call decides), so the
    second takes the input the first did not; never the same storage twice."""
    def f(x, y):
        return x + y, x * y

    x, y = torch.randn(64, 32), torch.randn(64, 32)
    want = f(x, y)
    call, _ = _inference_call(f, (x, y))
    ptrs, args = {x.data_ptr(), y.data_ptr()}, [x, y]
    del x, y
    out = call(args)
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[1], want[1])
    assert {o.data_ptr() for o in out} == ptrs


def test_autotuning_a_mix_kernel_that_writes_over_its_input_times_on_a_copy(monkeypatch):
    """With autotune=True a mix-order kernel's candidates are timed at its first launch, before the call's own
    launch: where its output took a dying input's storage, each timing launch would read what the one before
    wrote (dh wrong in 99% of its elements). Timed on a private copy, as the band's timing and other kernels'.
    The interpreter never times: its timing is simulated (one launch a candidate) with the split tuned."""
    from modules import MIXED

    from passline.backends.triton import runner

    launches = []

    def bench_once(self, c, args, xnumel, rnumel, stream, after=None, rep=None):
        launches.append(c)
        self.launch(c, stream, args, xnumel, rnumel)
        if after is not None:
            after(c)
        return 1.0

    init = runner.MixKernel.__init__

    def tuned(self, *a, **kw):
        init(self, *a, **kw)
        self.autotune = True  # (the runner turns it off under the interpreter)

    monkeypatch.setattr(runner.MixKernel, "_tuned", lambda self: True)
    monkeypatch.setattr(runner.MixKernel, "__init__", tuned)
    monkeypatch.setattr(runner.Kernel, "_bench", bench_once)

    def f(dy, h):
        dh = torch.ops.aten.gelu_backward(dy, h)
        return dh, dh.sum(0)

    dy, h = torch.randn(48, 200), torch.randn(48, 200)
    want = f(dy, h)
    call, _ = _inference_call(f, (dy, h), pipeline=MIXED, cache_dir=tempfile.mkdtemp())
    ptrs, args = {dy.data_ptr(), h.data_ptr()}, [dy, h]
    del dy, h
    out = call(args)
    assert launches and out[0].data_ptr() in ptrs  # timed, and written over an input
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[1], want[1], rtol=1e-4, atol=1e-4)


def test_a_backward_kept_by_retain_graph_reads_its_saved_activations_intact(monkeypatch):
    """A backward's saved activation dying at a kernel is overwritten by that kernel's output only when
    autograd let go of it: with retain_graph=True it keeps them for the next backward, which must see them
    unchanged (here the second backward would read cos(y) * g for y)."""
    from passline.backends.triton import compat

    counted, hops = [], []  # what sole() compares, recorded (at the same call depths: counts unchanged)

    def counts(t):
        c = sys.getrefcount(t), t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)
        counted.append(c)
        return c

    def hop(o):
        hops.append(compat._refs(o))
        return hops[-1]

    monkeypatch.setattr(compat, "_counts", counts)
    monkeypatch.setattr(compat, "_hop", hop)

    def f(x, w):
        return (x @ w).sin().sum()

    torch.manual_seed(0)
    x, w = torch.randn(16, 24, requires_grad=True), torch.randn(24, 32, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=passline.backend(codegen="triton", fallback="raise"))
    grads = []
    for fn in (f, compiled):
        xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        fn(xs, ws).backward(retain_graph=True)
        counted[:], hops[:] = [], []
        fn(xs, ws).backward()  # a fresh graph: its saved activation may be overwritten
        donated = any(c == (h, 1, compat.ALONE) for c, h in zip(counted, hops))
        loss = fn(xs, ws)
        loss.backward(retain_graph=True)
        loss.backward()  # the same graph twice
        grads.append((xs.grad, ws.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    torch.testing.assert_close(grads[1][1], grads[0][1])
    assert donated, "no saved activation was overwritten in a plain backward"


def test_looped_kernels_keep_in_l2_what_a_later_loop_reads_again():
    """A looped row kernel (GPU form, generated on any machine): the first loop's loads of what the second
    loop reads again are `evict_last`, the second loop's last reads `evict_first`, and a weight read by
    every row `evict_last`; a persistent kernel (no loop) has no hint."""
    import re

    from passline.backends.triton import kernel as kgen

    x = torch.randn(4, 3000)
    be = assert_matches_eager(lambda x, w: torch.rms_norm(x, (3000,), w), [x, torch.randn(3000)],
                              codegen="reference", backward=False)
    graph = be.reports[0].graph
    (node,) = graph.nodes()
    looped = kgen.generate(node, graph, interpret=False, variant="looped", blocks={}).source
    loops = looped.split("for roffset")[1:]
    assert len(loops) == 2, looped
    policy = [dict(re.findall(r"tl\.load\(p_(\w+) \+ [^\n]*eviction_policy='(\w+)'", loop)) for loop in loops]
    x_name = next(b for b in policy[0] if b in policy[1])
    assert policy[0][x_name] == "evict_last" and policy[1][x_name] == "evict_first", looped
    assert [p for b, p in policy[1].items() if b != x_name] == ["evict_last"], looped  # the weight
    persistent = kgen.generate(node, graph, interpret=False, variant="persistent", blocks={}).source
    assert "eviction_policy" not in persistent


def test_column_sums_with_per_row_statistics_are_column_reductions():
    """rows_contiguous decides a reduction's block shape by its data loads (those moving with both loops):
    a column sum that also reads per-row statistics (recompute_columns' dw) is still a strided reduction."""
    from passline.backends.triton import kernel as kgen

    x = torch.randn(12, 24)
    mean, rstd = torch.randn(12, 1), torch.rand(12, 1) + 0.5
    unmixed = passline.DEFAULT_PIPELINE.replace(" mix_order_reduction,", "")  # a column sum of its own
    be = assert_matches_eager(lambda x, m, r, dy: (dy * (x - m) * r).sum(0), [x, mean, rstd, torch.randn(12, 24)],
                              codegen="reference", pipeline=unmixed)
    (node,) = [n for n in be.reports[0].graph.nodes() if getattr(n, "reduction_ranges", ())]
    assert not kgen.rows_contiguous(node), be.reports[0].graph.format()
    be = assert_matches_eager(lambda x, m, r: ((x - m) * r).sum(1), [x, mean, rstd], codegen="reference")
    (node,) = be.reports[0].graph.nodes()
    assert kgen.rows_contiguous(node)


def test_the_kernel_cache_never_serves_another_dtypes_kernel():
    """The same program in float32, then float64: a scatter's two kernels differ only in the dtype they
    add in, which the IR's repr omits. The float64 graph ran the float32 kernel from the cache (embedding
    and unfold gradients at float32 precision) until the cache key named the sources."""
    import torch.nn.functional as F

    def fn(idx, w):
        return F.embedding(idx, w) * 3

    device = passline.settings.test_device or "cpu"
    idx = torch.randint(0, 5, (40,), device=device)
    for dtype in (torch.float32, torch.float64):
        torch._dynamo.reset()
        w0 = torch.randn(5, 3, dtype=dtype, device=device) * 1e3 + 1 / 3
        cot = torch.randn(40, 3, dtype=dtype, device=device) / 3
        ours, ref = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        torch.compile(fn, backend=passline.backend(fallback="raise"))(idx, ours).backward(cot)
        fn(idx, ref).backward(cot)
        tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else {}
        torch.testing.assert_close(ours.grad, ref.grad, **tol)


@pytest.mark.parametrize("autotune", [False, True])
def test_kernels_timed_at_their_first_launch_match_eager_when_they_write_in_place(tmp_path, autotune):
    """softmax(a @ w), 4096 rows 12345 wide: the forward writes its result over the matmul's, the backward
    its gradient over the cotangent (buffers that die there), and on a GPU their configurations are timed at
    the first launch (rows no rule decides, configs.uncertain; or autotuning). The timing launches run on a
    copy of such storage: on the call's own, each read what the one before wrote. (Softmax, not log-softmax:
    log-softmax and its backward give the same result applied twice, and hid it. On the CPU, where the rule
    decides, rows 300 wide check the values only: the interpreter took minutes at 12345.)"""
    dev = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
    torch.manual_seed(0)
    rows, width = (4096, 12345) if dev == "cuda" else (200, 300)  # (few rows are split: split_reductions)
    a, w = torch.randn(rows, 64, device=dev), torch.randn(64, width, device=dev) / 8
    be = passline.backend(codegen="triton", fallback="raise", autotune=autotune, cache_dir=str(tmp_path))
    torch._dynamo.reset()
    f = torch.compile(lambda a, w: torch.softmax(a @ w, -1), backend=be)
    ours = [a.clone().requires_grad_(), w.clone().requires_grad_()]
    ref = [a.clone().requires_grad_(), w.clone().requires_grad_()]
    y, y_ref = f(*ours), torch.softmax(ref[0] @ ref[1], -1)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-6)
    c = torch.randn_like(y)
    (y * c).sum().backward()  # the cotangent (c, made by autograd) dies in the backward: written over in place
    (y_ref * c).sum().backward()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    if dev == "cuda":
        timed = [k for r in be.reports for k in r.kernel_info if k.timings]
        assert timed, [(k.name, k.chosen) for r in be.reports for k in r.kernel_info]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width", [3, 8, 33, 1000])
def test_online_softmax_groups_match_eager_with_special_values(dtype, width):
    """A looped softmax's online max-and-sum keeps one max and sum for each group of lanes a thread loads as
    one vector (kernel._online_step): softmax, log-softmax and cross-entropy forced looped, at widths under,
    at and over a group and with a ragged last chunk, with rows of -inf, NaN, +inf and huge values, match
    eager (the interpreter runs the chunk the rule gives it: groups whole, or the chunk narrower than one)."""
    torch.manual_seed(width)
    x = (torch.randn(6, width) * 4).to(dtype)
    x[1] = float("-inf")  # a row of -inf: NaN, as eager
    x[2, width // 2] = float("nan")
    x[3, 0] = float("inf")
    x[4, -1] = 3e38  # a max far from the rest
    target = torch.randint(0, width, (6,))
    for fn in (lambda x, t: torch.softmax(x, -1), lambda x, t: torch.log_softmax(x.float(), -1),
               lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, reduction="none")):
        # the target is an input, not a closure's CPU tensor: the check moves inputs to the test's device
        assert_matches_eager(fn, [x, target], codegen="triton", kernel_variant="looped", backward=False)


def test_online_softmax_groups_follow_the_loaded_elements():
    """The group is one 16-byte vector of the widest element the loop loads, at most 4 lanes (a chunk may
    give a thread no more): 4 for bfloat16 and float32 logits, 2 for float64; the accumulators are a group
    wide and the step reduces each group in its thread."""
    from passline.backends.triton import kernel as kgen

    for dtype, group in ((torch.bfloat16, 4), (torch.float32, 4), (torch.float64, 2)):
        x = torch.randn(4, 3000, dtype=dtype)
        be = assert_matches_eager(lambda x: torch.log_softmax(x, -1), [x], codegen="reference",
                                  backward=False)
        graph = be.reports[0].graph
        (node,) = [n for n in graph.nodes() if hasattr(n, "reduction_type") or hasattr(n, "nodes")][:1]
        src = kgen.generate(node, graph, interpret=False, variant="looped", blocks={}).source
        g = f"({group} if RBLOCK >= {group} else RBLOCK)"
        assert f"tl.full([XBLOCK, RBLOCK // {g}]" in src and "tl.reshape(" in src, src
        # any lanes a thread holds where a program has one row; with more, each row's own lanes
        from passline.backends.triton import compat

        reorder = ", can_reorder=XBLOCK == 1" if compat.RESHAPE_REORDERS else ""  # (gone in Triton 3.10)
        assert f"[XBLOCK, RBLOCK // {g}, {g}]{reorder})" in src, src


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled code reorders; the interpreter never")
@pytest.mark.parametrize("case", ["log_softmax", "cross_entropy"])
def test_an_online_loop_over_several_rows_a_program_keeps_each_rows_lanes(monkeypatch, case):
    """Looped blocks of 64 rows (the timed band's candidate for rows read once; autotuning's too): the online
    step's groups of lanes must stay within their rows. Allowed to reorder, Triton 3.6 grouped lanes of the two
    rows a thread held: an H200's bfloat16 cross-entropy at 838861 x 160 had wrong maxima and sums (its loss 0.4%
    off, the gradient 3.6%), log-softmax's output up to 4% off at 3001 x 160."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Config, Variant

    rule = prunner.rule

    def several_rows(variants, xnumel, rnumel, *a, **kw):
        if rnumel is not None and Variant.LOOPED in variants:
            return Config(Variant.LOOPED, 64, 64, 8)
        return rule(variants, xnumel, rnumel, *a, **kw)

    monkeypatch.setattr(prunner, "rule", several_rows)
    monkeypatch.setattr(prunner, "uncertain", lambda *a, **kw: [])
    torch.manual_seed(0)
    x = torch.randn(3001, 160, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 160, (3001,), device="cuda")
    fn = {"log_softmax": lambda x, t: torch.log_softmax(x.float(), -1),
          "cross_entropy": lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, reduction="none")}[case]
    got = torch.compile(fn, backend=passline.backend(fallback="raise", kernel_variant="looped"))(x, t)
    torch.testing.assert_close(got, fn(x, t), rtol=1e-5, atol=1e-5)


# on a GPU, 3 rows of 70000 are split across programs (split_reductions): these tests are about one loop a row
_UNSPLIT = passline.DEFAULT_PIPELINE.replace(", split_reductions", "")


def test_a_looped_kernels_per_row_loads_come_before_its_loop():
    # a row's value (s[i]) and a scalar (c) are the same in every step of a looped reduction: loaded once,
    # before the loop (in it, each step loaded them again: Triton cannot move a load past the loop's
    # stores), and s[i] is not loaded again after it for the epilogue; the row's elements stay in the loop
    def f(x, s, c):
        return ((x * s[:, None] + c) ** 2).sum(-1) * s

    x, s, c = torch.randn(3, 70000), torch.randn(3), torch.tensor(0.5)
    be = assert_matches_eager(f, [x, s, c], codegen="triton", pipeline=_UNSPLIT)
    (k,) = [k for r in be.reports for k in r.kernel_info if k.chosen == "looped"]
    before, loop = k.source.split("for roffset")
    assert before.count("tl.load(") == 2 and loop.count("tl.load(") == 1, k.source


def _at_first_reduction(source: str) -> tuple:
    """A kernel's body split at its first reduction: `tl.reduce(`, or the interpreter's `_max_of(` / `_min_of(` /
    `_argmax_of(` / `_argmin_of(`."""
    body = source[source.index("\ndef k_"):]
    i = min(body.index(s) for s in ("tl.reduce(", "_max_of(", "_min_of(", "_argmax_of(", "_argmin_of(") if s in body)
    return body[:i], body[i:]


def test_a_persistent_kernels_gather_comes_before_its_reductions():
    # cross-entropy's target logit x[i, t[i]]: its index reads no reduction, so the target's arithmetic, its
    # bounds check and the gathered load are written before the row's max and sum (after them, the load was
    # a second round trip to memory at each program's end); the sum's terms are `_exp_term`s (the GPU's
    # ex2.approx.ftz; the interpreter's tl.exp), while softmax, whose exponentials are stored, keeps tl.exp.
    # A gather at a reduction's result (an argmax) stays after it. All against eager.
    import torch.nn.functional as F

    x, t = torch.randn(6, 1000, requires_grad=True), torch.tensor([0, 999, 5, -100, 17, 3])
    be = assert_matches_eager(lambda x, t: F.cross_entropy(x, t), [x, t], codegen="triton")
    (k,) = [k for r in be.reports[:1] for k in r.kernel_info if "gather" in k.source]
    assert k.chosen == "persistent"
    before, after = _at_first_reduction(k.source)
    check = "_check_index(" if "_check_index(" in k.source else "tl.device_assert("  # the interpreter's, a GPU's
    assert check in before and before.count("tl.load(") == 3, k.source  # logits, target, target logit
    assert "= _exp_term(" in after and "= tl.exp(" not in after, k.source
    be = assert_matches_eager(lambda x: torch.softmax(x, -1), [torch.randn(6, 1000)], codegen="triton")
    (k,) = [k for r in be.reports for k in r.kernel_info]
    assert "= tl.exp(" in k.source and "= _exp_term(" not in k.source, k.source

    def picked(x):
        return x.gather(1, x.argmax(1, keepdim=True)) * x.sum(1, keepdim=True)

    be = assert_matches_eager(picked, [torch.randn(6, 1000)], codegen="triton")
    (k,) = [k for r in be.reports for k in r.kernel_info if k.chosen == "persistent"]
    before, after = _at_first_reduction(k.source)
    assert before.count("tl.load(") == 1 and after.count("tl.load(") == 1, k.source


def test_a_looped_kernels_row_index_is_checked_once_before_its_loop():
    # w[idx[i]] is the same in every step of row i's loop: the index, its bounds check and the load go
    # before the loop; out of range still raises as eager does
    def f(x, idx, w):
        return (x * w[idx][:, None]).sum(-1)

    x, w = torch.randn(3, 70000), torch.randn(10)
    be = assert_matches_eager(f, [x, torch.tensor([4, 0, 9]), w], codegen="triton", pipeline=_UNSPLIT)
    (k,) = [k for r in be.reports for k in r.kernel_info if k.chosen == "looped"]
    before, loop = k.source.split("for roffset")
    check = "_check_index(" if "_check_index(" in k.source else "tl.device_assert("  # the interpreter's, a GPU's
    assert check in before and check not in loop and loop.count("tl.load(") == 1, k.source
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=passline.backend(codegen="triton", fallback="raise"))
    # on the CPU on a GPU run too: a device-side assert ends the CUDA context (test_indexing checks it apart)
    with pytest.raises(Exception, match="index 10 is out of bounds"):  # the interpreter wraps the IndexError
        compiled(x, torch.tensor([4, 10, 9]), w)


@pytest.mark.parametrize("pipeline", ["", None])
def test_row_kernels_address_a_row_then_its_elements(pipeline):
    """A row kernel's access is `p + (row part) + (element part)`: the pointer advanced a row at a time, then by
    each lane's position (which the compiler folds into the load's address), where a lane's elements are
    consecutive; a column sum's (lanes a row apart) stays one sum. Values as eager's, with reductions over
    several dims (whose element part is a flat index, not a size argument: found by fuzzing a draft)."""
    from passline.backends.triton import kernel as kgen

    options = {} if pipeline is None else {"pipeline": pipeline}
    for fn, shape in ((lambda x: x.prod(-1), (13, 2, 3)), (lambda x: x.sum((1, 2)), (5, 3, 7)),
                      (lambda x: (x - x.amax(-1, keepdim=True)).exp(), (6, 37))):
        assert_matches_eager(fn, [torch.randn(*shape)], codegen="triton", **options)
    accesses = []
    for fn in (lambda x: x.softmax(-1), lambda x: x.sum(0)):
        be = assert_matches_eager(fn, [torch.randn(40, 37)], codegen="reference", pipeline="fuse")
        graph = be.reports[0].graph
        accesses += [a for n in graph.nodes() if n.kind in ("reduction", "fused") for v in ("persistent", "looped")
                     for a in re.findall(r"tl\.(?:load|store)\((p_\w+ \+ [^,]*),",
                                         kgen.generate(n, graph, interpret=False, variant=v, blocks={}).source)]
    assert "p_arg0_1 + ((37 * o0)) + (q0)" in accesses, accesses  # the softmax's rows
    assert "p_arg0_1 + (o0 + (37 * q0))" in accesses, accesses  # the column sum's


def _a_log_softmax_launch(monkeypatch):
    """The row kernel of a compiled log-softmax over 67 x 160 and its first launch's arguments, as launched:
    (kernel, args, xnumel, rnumel), the input checked against eager."""
    from passline.backends.triton import runner as prunner

    launches = []
    call = prunner.Kernel.__call__

    def seen(self, stream, args, xnumel, rnumel=None, wide=False):
        call(self, stream, args, xnumel, rnumel, wide)
        if rnumel is not None:
            launches.append((self, args, xnumel, rnumel))

    monkeypatch.setattr(prunner.Kernel, "__call__", seen)
    x = torch.randn(67, 160)
    got = torch.compile(lambda x: torch.log_softmax(x, -1), backend=passline.backend(codegen="triton"))(x)
    torch.testing.assert_close(got, torch.log_softmax(x, -1))
    return launches[0]


def test_a_timed_choice_that_disagrees_with_the_rule_is_refused(monkeypatch):
    """A configuration chosen by timing (the band's, or autotuning's) is held to the rule's result before it
    is kept (runner.Kernel._agreeing): a candidate that agrees is kept; one whose launch writes other values is
    refused for the rule's configuration, counted and said in the kernel's timings."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Config, Variant

    kernel, args, xnumel, rnumel = _a_log_softmax_launch(monkeypatch)
    block = Config(Variant.LOOPED, 64, 64, 8)  # several rows a program, as the band times
    rule = kernel._rule(xnumel, rnumel, args)

    def run(cfg):
        return kernel._on_copies(cfg, args, xnumel, rnumel, None)
    assert kernel._agreeing(block, rule, run) == block
    assert kernel.counters["kernel_choices_refused"] == 0

    launch = prunner.Kernel.launch

    def wrong(self, cfg, stream, args, xnumel, rnumel):
        out = launch(self, cfg, stream, args, xnumel, rnumel)
        if cfg == block:
            for a in args:
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    a.mul_(1.01)
        return out

    monkeypatch.setattr(prunner.Kernel, "launch", wrong)
    assert kernel._agreeing(block, rule, run) == rule
    assert kernel.counters["kernel_choices_refused"] == 1
    assert "relative error" in kernel.info.timings[f"refused {block}"], kernel.info.timings
    assert rule in kernel.refused  # taken where the check refused: not a timed choice (kept from _unspill)


def test_a_refused_winners_rule_is_stored_as_refused(monkeypatch, tmp_path):
    """The rule's configuration taken where the timed winner was refused is stored on disk as refused, and a later
    process (a kernel with its own state, the same cache) loads it as refused, not as a timed choice: its spilling
    binary may still be unspilled (`_unspill`) there as here. A timed winner stored loads as timed."""
    from passline.backends.triton.cache import KernelCache
    from passline.backends.triton.configs import Config, Variant

    kernel, args, xnumel, rnumel = _a_log_softmax_launch(monkeypatch)
    kernel.cache = KernelCache(tmp_path)  # a cache of this test's own: its keys are no real kernel's
    rule = kernel._rule(xnumel, rnumel, args)
    block = Config(Variant.LOOPED, 64, 64, 8)
    kernel.refused.add(rule)  # as _agreeing leaves it after a refusal
    assert kernel._timed(kernel._remembered("refused winner", lambda: rule)) == rule and rule not in kernel.timed
    assert kernel._timed(kernel._remembered("kept winner", lambda: block)) == block and block in kernel.timed
    kernel.refused.clear()
    kernel.timed.clear()  # a later process: nothing known but what is on disk
    assert kernel._timed(kernel._saved("refused winner")) == rule
    assert rule in kernel.refused and rule not in kernel.timed
    assert kernel._timed(kernel._saved("kept winner")) == block and block in kernel.timed


def test_a_stored_choice_is_not_served_to_other_candidates_or_another_launch_code(monkeypatch, tmp_path):
    """A choice stored on disk is a configuration timed among some candidates and checked against the rule's result
    by some code (the review of the sixtieth session's cache keys): a backend forcing another variant, whose
    candidates do not include it, times its own (autotuning's key names the candidates); and a choice stored before
    the code that launches configurations or Triton changed (runner._CHOICE_STAMP) is not loaded at all — it would be
    served without its check. The GPU's timing is replaced by a pick; everything else is passline's path."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Variant

    def kernel_of(variant: str):
        torch._dynamo.reset()
        be = passline.backend(codegen="triton", cache_dir=str(tmp_path), kernel_variant=variant, graph_cache=False)
        x = torch.randn(64, 1000)
        torch.testing.assert_close(torch.compile(lambda x: torch.softmax(x, -1), backend=be)(x), torch.softmax(x, -1))
        (k,) = [s[2][0] for s in be.reports[-1].runner.steps if s[0] == "kernel"]
        k.interpret, k.autotune = False, True  # as on a GPU with autotune=True
        return k

    auto, forced = kernel_of("auto"), kernel_of("persistent")
    looped = [c for c in auto._autotune_candidates(64, 1000, None) if c.variant == Variant.LOOPED][0]
    monkeypatch.setattr(auto, "_fastest", lambda cands, *a, **k: looped)
    assert auto._choose((), 64, 1000, None) == looped
    persistent = [c for c in forced._autotune_candidates(64, 1000, None) if c.variant == Variant.PERSISTENT][0]
    monkeypatch.setattr(forced, "_fastest", lambda cands, *a, **k: persistent)
    assert forced._choose((), 64, 1000, None) == persistent  # timed among its own, not the stored LOOPED one
    assert auto._saved("a choice") is None
    auto._remembered("a choice", lambda: looped)
    assert auto._saved("a choice") == looped
    monkeypatch.setattr(prunner, "_CHOICE_STAMP", "another Triton, or another runner")
    assert auto._saved("a choice") is None


def test_a_timed_choice_is_refused_for_rows_it_leaves_unwritten(monkeypatch):
    """The call's output buffers already hold what the timing launches wrote — the rule's configuration among
    them — so a candidate that skips rows (a grid or mask fault) would leave right values in its copy and agree,
    then be wrong at the next call on fresh buffers. The copies' write-only outputs are poisoned first
    (`runner._poison`: NaN), so it is refused. A rule that does not run leaves the winner unchecked, counted; a
    winner whose own check raises is refused."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Config, Variant

    kernel, args, xnumel, rnumel = _a_log_softmax_launch(monkeypatch)
    assert len(kernel.fresh) == 1  # the output; the input is read
    block = Config(Variant.LOOPED, 64, 64, 8)
    rule = kernel._rule(xnumel, rnumel, args)

    def run(cfg):
        return kernel._on_copies(cfg, args, xnumel, rnumel, None)

    launch = prunner.Kernel.launch

    def skipping(self, cfg, stream, args, xnumel, rnumel):
        if cfg != block:
            return launch(self, cfg, stream, args, xnumel, rnumel)
        kept = [a[-3:].clone() if a.dim() == 2 else None for a in args if isinstance(a, torch.Tensor)]
        result = launch(self, cfg, stream, args, xnumel, rnumel)
        for a, k in zip([a for a in args if isinstance(a, torch.Tensor)], kept):
            if k is not None:
                a[-3:] = k  # its last three rows as they were before the launch
        return result

    monkeypatch.setattr(prunner.Kernel, "launch", skipping)
    assert kernel._agreeing(block, rule, run) == rule
    assert "NaN" in kernel.info.timings[f"refused {block}"], kernel.info.timings
    assert kernel.counters["kernel_choices_refused"] == 1

    def raising(self, cfg, stream, args, xnumel, rnumel):
        if cfg == raising.cfg:
            raise RuntimeError("no launch")
        return launch(self, cfg, stream, args, xnumel, rnumel)

    monkeypatch.setattr(prunner.Kernel, "launch", raising)
    raising.cfg = rule  # nothing to hold the winner to: kept, counted
    assert kernel._agreeing(block, rule, run) == block
    assert kernel.counters["kernel_choices_unchecked"] == 1 and f"unchecked {block}" in kernel.info.timings
    raising.cfg = block  # the winner's own check raises: refused
    assert kernel._agreeing(block, rule, run) == rule
    assert kernel.counters["kernel_choices_refused"] == 2


def test_a_timed_mix_order_choice_is_held_to_the_rules_step(monkeypatch):
    """A mix-order kernel's timed choice (configuration and split: MixKernel._fastest_split) is held to the
    rule's result too, the whole step compared — main kernel, then the finishing kernel for its count of
    programs — on copies of the call's arguments, the workspaces left out (their rows follow the split):
    another split of the same block agrees; a main kernel writing other values is refused."""
    from passline.backends.triton import runner as prunner

    steps = []
    call = prunner.MixStep.__call__

    def seen(self, empty, stream, margs, fargs, rows, cols, wide=False, wide_finish=False):
        call(self, empty, stream, margs, fargs, rows, cols, wide, wide_finish)
        steps.append((self, empty, margs, fargs, rows, cols))

    monkeypatch.setattr(prunner.MixStep, "__call__", seen)
    text = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                             "mix_order_reduction(split_rows=32, fill_sms=false)")
    x = torch.randn(300, 48, requires_grad=True)
    w, b = torch.randn(48, requires_grad=True), torch.randn(48, requires_grad=True)
    assert_matches_eager(lambda x, w, b: torch.nn.functional.layer_norm(x, (48,), w, b), [x, w, b], pipeline=text,
                         codegen="triton")
    step, empty, margs, fargs, rows, cols = steps[0]
    main = step.main
    rule = main._rule(rows, cols, margs)
    other = rule.with_split(rule.split // 2)  # twice the programs, each summing half the rows
    assert other != rule and other.split >= other.xblock
    ws = step._alloc(empty, step.programs(rows, other), cols)
    m, f = step._with(margs, step.main_slots, ws), step._with(fargs, step.finish_slots, ws)
    after = prunner._After(step, None, m, f, rows, cols)
    got = after.outputs(other)
    assert sum(a is None for a in got) == len(step.main_slots) + len(step.finish_slots)  # the workspaces
    assert main._agreeing(other, rule, after.outputs) == other
    assert main.counters["kernel_choices_refused"] == 0

    launch = prunner.Kernel.launch

    def wrong(self, cfg, stream, args, xnumel, rnumel):
        out = launch(self, cfg, stream, args, xnumel, rnumel)
        if self is main and cfg == other:
            for k, a in enumerate(args):
                if isinstance(a, torch.Tensor) and a.is_floating_point() and k not in step.main_slots.values():
                    a.add_(1.0)
        return out

    monkeypatch.setattr(prunner.Kernel, "launch", wrong)
    assert main._agreeing(other, rule, after.outputs) == rule
    assert main.counters["kernel_choices_refused"] == 1 and f"refused {other}" in main.info.timings


@pytest.mark.parametrize("kind", ["row", "mix"])
def test_a_timed_choice_is_held_again_at_other_sizes_of_its_bucket(monkeypatch, kind):
    """Under dynamic shapes a choice serves every size of its power-of-two bucket (Kernel.bucket). One chosen by
    timing is held to the rule's result at each other size it runs at, once (Kernel._hold): a candidate right at
    300 rows and wrong at 301 (a partial block's fault, simulated) is kept at 300 and refused at 301, where the
    rule's configuration runs. A row kernel (log-softmax) and a mix-order step (a bias gradient, whole step)."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Config

    kernels = []
    cls = prunner.MixKernel if kind == "mix" else prunner.Kernel

    def band(self, xnumel, rnumel, args=None):  # the GPU's timed band, here the rule and one other block
        if type(self) is not cls or rnumel is None:
            return []
        rule = self._rule(xnumel, rnumel, args)
        self.target = Config(rule.variant, rule.xblock, rule.rblock, rule.warps * 2, rule.stages, rule.split)
        kernels.append(self) if self not in kernels else None
        return [rule, self.target]

    def bench(self, c, args, xnumel, rnumel, stream, after=None, rep=None):  # the other block is the fastest
        self.launch(c, stream, args, xnumel, rnumel)
        if after is not None:
            after(c)
        return 1.0 if c.with_split(0) == self.target.with_split(0) else 2.0

    launch = prunner.Kernel.launch

    def odd_rows_wrong(self, cfg, stream, args, xnumel, rnumel):
        out = launch(self, cfg, stream, args, xnumel, rnumel)
        if self in kernels and cfg.with_split(0) == self.target.with_split(0) and xnumel % 2:
            for k, a in enumerate(args):
                if k in self.fresh and a.shape == (xnumel, rnumel):  # its output's last row
                    a[-1] += 1.0
        return out

    monkeypatch.setattr(cls, "uncertain", band)
    monkeypatch.setattr(prunner.Kernel, "_bench", bench)
    monkeypatch.setattr(prunner.Kernel, "launch", odd_rows_wrong)
    if kind == "mix":
        monkeypatch.setattr(prunner.MixKernel, "_tuned", lambda self: True)
        monkeypatch.setattr(prunner.MixKernel, "_wave_splits", lambda self, cfg, compiled, args, x, r: [16])

        def f(dy, h):
            dh = torch.ops.aten.gelu_backward(dy, h)
            return dh, dh.sum(0)
        pipeline = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(fill_sms=false)")
    else:
        def f(dy, h):
            return torch.log_softmax(dy, -1) + h
        pipeline = passline.DEFAULT_PIPELINE

        def timed(self, args, x, r, stream, after=None):  # the interpreter takes the rule: time as on a GPU
            cands = self.uncertain(x, r, args)
            best = self._timed_choice(x, r, lambda: self._fastest(cands, args, x, r, stream)) if cands else None
            return best or self._rule(x, r, args)
        monkeypatch.setattr(prunner.Kernel, "_choose", timed)
    g = torch.compile(f, dynamic=True, backend=passline.backend(codegen="triton", pipeline=pipeline))
    for rows, refused in ((300, 0), (301, 1), (301, 1)):
        dy, h = torch.randn(rows, 200), torch.randn(rows, 200)
        want = f(dy, h)
        got = g(dy.clone(), h.clone())
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        (kernel,) = kernels
        assert kernel.counters["kernel_choices_refused"] == refused, kernel.info.timings
    assert kernel.held[(300, 200)] == kernel.target.with_split(kernel.held[(300, 200)].split)


def test_disagreement_sees_a_wrong_row_an_infinity_and_huge_values():
    """runner.disagreement, which a timed choice must pass: rounding apart is agreement; one wrong row of a
    tall output (a small share of its norm), an infinity or NaN elsewhere, a bfloat16 output 1.5% off
    everywhere, and values whose float32 norm would overflow are not."""
    from passline.backends.triton.runner import disagreement

    torch.manual_seed(0)
    want = torch.randn(100000, 16)
    assert disagreement((want + 1e-7 * torch.randn_like(want),), (want,)) is None
    row = want.clone()
    row[-1] = 0
    assert "largest" in disagreement((row,), (want,))
    inf = want.clone()
    inf[3, 3] = float("inf")
    assert "infinities" in disagreement((inf,), (want,))
    nan = want.clone()
    nan[5, 5] = float("nan")
    assert "NaN" in disagreement((nan,), (want,))
    b = want.bfloat16()
    assert disagreement((b,), (b,)) is None and disagreement(((b.float() * 1.015).bfloat16(),), (b,)) is not None
    huge = torch.full((8,), 1e30)
    assert disagreement((huge * 2,), (huge,)) is not None
    assert disagreement((torch.arange(4),), (torch.arange(4).flip(0),)) is not None
    # memory past the views: a strided output's gaps, the rest of a wider buffer, compared bit for bit
    base = torch.randn(6, 10)
    a, b = base.clone(), base.clone()
    views = (a[:, :8], b[:, :8])  # rows of 8 in a buffer 10 wide
    views[0].add_(1e-9)  # within rounding: agreement
    assert disagreement((views[0],), (views[1],)) is None
    a[2, 9] = 7.0  # a gap no view covers
    assert "outside the arguments' views" in disagreement((views[0],), (views[1],))
    # two views of one storage (an output written over an input) cover each other's elements
    c, d = base.clone(), base.clone()
    assert disagreement((c[:, :8], c[:, 8:]), (d[:, :8], d[:, 8:])) is None
