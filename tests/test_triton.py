"""The Triton backend specifically: both reduction variants, the kernel cache, the report, fallbacks.
(The other end-to-end tests run on Triton too: make test sets TRITON_INTERPRET=1 and codegen='auto'
picks the interpreter.)"""
import os

import pytest
import torch
from modules import RMSNorm

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
    from passline.backends.triton.runner import _mix_candidates

    be = assert_matches_eager(torch.nn.LayerNorm(48), [torch.randn(300, 48, requires_grad=True)], codegen="triton")
    (mix,) = [k for r in be.reports for k in r.kernel_info if k.kind == "mix_order"]
    assert "tl.range(0, SPLIT, XBLOCK, num_stages=STAGES)" in mix.source
    on_gpu = "GPU" in be.reports[0].codegen_reason
    assert mix.blocks["STAGES"] in ((1, 3, 4) if on_gpu else (1,))  # the interpreter runs the loop as it is
    # on a GPU: three and four stages for each configuration, one unpipelined baseline
    gpu = _mix_candidates("mix_order", 512, 128, interpret=False)
    assert sorted(c[1]["STAGES"] for c in gpu).count(1) == 1 and {c[1]["STAGES"] for c in gpu} == {1, 3, 4}
    # two rows with the one-row accumulator only where a thread holds its columns of both rows:
    # 512 columns in 16-byte loads are 64 threads, so one or two warps; 4096 columns need 8 to 16
    assert {c[2] for c in gpu if c[1]["XBLOCK"] == 2} == {1, 2}
    wide = _mix_candidates("mix_order", 4096, 128, interpret=False)
    assert {c[2] for c in wide if c[1]["XBLOCK"] == 2} == {8, 16}
    assert all(c[1]["XBLOCK"] >= 2 for c in _mix_candidates("mix_order_acc2d", 512, 128, interpret=False))


def test_nan_and_inf_propagate_like_eager():
    x = torch.randn(16, 32)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, :] = float("-inf")
    fn = lambda x: (torch.relu(x), x.amax(1), x.argmax(1), torch.maximum(x, x.t().contiguous().t() * 0), x.sum(1))
    assert_matches_eager(fn, [x], codegen="triton")


def test_report_has_kernel_sources_variants_and_bytes():
    be = assert_matches_eager(torch.nn.LayerNorm(32), [torch.randn(64, 32)], codegen="triton")
    (report,) = be.reports
    (k,) = report.kernel_info
    assert "@triton.jit" in k.source and k.chosen in ("persistent", "looped") and k.blocks["RBLOCK"] >= 32
    assert k.bytes == report.bytes_accessed
    on_gpu = report.graph.input_buffers()["primals_3" if "primals_3" in report.graph.input_buffers()
                                           else next(iter(report.graph.input_buffers()))].layout.device.type == "cuda"
    assert report.codegen == "triton" and ("GPU" if on_gpu else "interpreter") in report.codegen_reason


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
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    be = assert_matches_eager(lambda x: x * 2, [torch.randn(3)], codegen="auto")
    assert be.reports[0].codegen == "reference" and "TRITON_INTERPRET" in be.reports[0].codegen_reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    be = assert_matches_eager(lambda x: x * 2, [torch.randn(3)], codegen="auto")
    assert be.reports[0].codegen == "triton"


def test_index_width():
    from passline.backends.triton.kernel import _int64
    from passline.testing.synthetic import chain_and_fanout

    small = chain_and_fanout(4)
    assert not _int64(small, small.nodes()[0])
    big = chain_and_fanout(4, size=(1 << 16, 1 << 16))
    assert _int64(big, big.nodes()[0])


def test_wrapper_frees_buffers_after_last_use_and_reuses_their_storage():
    fn = lambda x, w: ((x * 2) @ w + 1) @ w  # kernel, mm, kernel, mm: the second kernel's buffer can reuse
    dev = os.environ.get("PASSLINE_TEST_DEVICE", "cpu")
    x, w = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev)
    runner = assert_matches_eager(fn, [x, w], codegen="triton").reports[0].runner
    allocated = []
    alloc = runner._alloc

    def watch(layout, bind, pool, owned, name):
        t = alloc(layout, bind, pool, owned, name)
        allocated.append((name, t.untyped_storage().data_ptr()))
        return t

    runner._alloc = watch
    for _ in range(2):  # the second call takes its plans from the first (static shapes)
        allocated.clear()
        out = runner(x, w)[0]
        torch.testing.assert_close(out, fn(x, w))
        names = [n for n, _ in allocated]
        ptrs = [p for _, p in allocated]
        assert len(set(names)) == 2 and len(set(ptrs)) == 1, allocated  # two buffers, one storage
