"""Choices (issue 17): other implementations of an aten op competing with it, decompose-K for matmuls,
user-registered choices, overrides, timing and its cache, and the records on the compile report."""
import collections
import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from modules import benchmark_script

import passline
from passline.backends.choosing import TimedChooser
from passline.ir import Extern, FusedNode, Reduction, members
from passline.lowering import choices
from passline.testing import assert_matches_eager, tolerance

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@contextlib.contextmanager
def registered(op, name, fn, **how):
    passline.register_choice(op, name, **how)(fn)
    try:
        yield
    finally:
        passline.unregister_choice(op, name)


def mm_and_weight_grad(a, b, x, w):
    # a @ b: a long K in the forward; x @ w: a long K in the backward (w's gradient is x^T @ dy)
    return (a @ b).relu() * 2, x @ w


def long_k_inputs(dtype, grad=True):
    torch.manual_seed(0)
    shapes = [(4, 1024), (1024, 8), (512, 8), (8, 8)]
    return [torch.randn(s, dtype=dtype, requires_grad=grad) for s in shapes]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decompose_k_matches_eager_forward_and_backward(dtype):
    be = assert_matches_eager(mm_and_weight_grad, long_k_inputs(dtype), choice_overrides={"mm": "decompose_k"})
    fwd, bwd = be.reports
    # forward: the (4 x 1024) @ (1024 x 8) product; backward: w's gradient, (8 x 512) @ (512 x 8)
    assert [(c.op, c.chosen, c.how) for c in fwd.choices] == [("mm", "decompose_k(chunks=8)", "override")]
    assert fwd.choices[0].candidates == ("aten", "decompose_k(chunks=8)", "decompose_k(chunks=4)",
                                         "decompose_k(chunks=2)")
    assert [(c.op, c.chosen) for c in bwd.choices] == [("mm", "decompose_k(chunks=4)")]
    assert all(c.timings == {} for c in (*fwd.choices, *bwd.choices))  # nothing timed on the CPU
    # each long-K product is one bmm of the chunks; the four short-K mms stay (x @ w, the gradients of a,
    # b and x)
    ops = [n.op for r in be.reports for n in r.graph.leaf_nodes() if isinstance(n, Extern)]
    bmms = ops.count(aten.bmm.default) + ops.count(getattr(aten.bmm, "dtype", None))  # CUDA: bmm with out_dtype
    assert (bmms, ops.count(aten.mm.default)) == (2, 4)


def test_the_sum_and_the_epilogue_fuse_into_one_kernel():
    a, b = torch.randn(4, 1024, dtype=torch.bfloat16), torch.randn(1024, 8, dtype=torch.bfloat16)
    be = assert_matches_eager(lambda a, b: (a @ b).relu() * 2, [a, b], choice_overrides={"mm": "decompose_k"})
    graph = be.reports[0].graph
    assert not any(isinstance(n, Extern) and "sum" in str(n.op) for n in graph.leaf_nodes())
    fused = [n for n in graph.nodes() if isinstance(n, FusedNode) and any(isinstance(m, Reduction)
                                                                           for m in members(n))]
    assert len(fused) == 1
    body = " ".join(repr(m.body) for m in members(fused[0]))
    assert "to_bfloat16" in body and "relu" in body and "mul" in body  # the cast and the epilogue
    assert {o for m in members(fused[0]) for o in m.origins} >= {"mm", "relu", "mul"}  # provenance: the op


def test_without_a_gpu_the_rule_keeps_the_op_and_records_it():
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    be = assert_matches_eager(torch.mm, [a, b], device="cpu")  # (on a GPU the candidates are timed)
    (rec,) = be.reports[0].choices
    assert (rec.node, rec.chosen, rec.how, rec.timings) == ("mm", "aten", "rule", {})
    assert [n.op for n in be.reports[0].graph.nodes()] == [aten.mm.default]
    assert "choice mm (mm): aten [rule]" in be.reports[0].graph.format()


def test_overrides_force_aten_or_one_version():
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    be = assert_matches_eager(torch.mm, [a, b], choice_overrides={aten.mm: "decompose_k(chunks=2)"})
    assert be.reports[0].choices[0].chosen == "decompose_k(chunks=2)"
    assert be.choice_overrides == {"mm": "decompose_k(chunks=2)"}  # ops by name, whatever was given
    be = assert_matches_eager(torch.mm, [a, b], choice_overrides={"mm": "aten"})
    assert (be.reports[0].choices[0].chosen, be.reports[0].choices[0].how) == ("aten", "override")


def test_no_record_where_nothing_but_the_op_applies():
    # K too short next to M and N (K < 32 max(M, N)), an integer matmul, dynamic sizes: the op, no choice
    be = assert_matches_eager(torch.mm, [torch.randn(16, 256), torch.randn(256, 16)],
                              choice_overrides={"mm": "decompose_k"})
    assert be.reports[0].choices == []
    be = assert_matches_eager(torch.mm, [torch.randint(0, 5, (2, 512)), torch.randint(0, 5, (512, 2))],
                              device="cpu")  # (CUDA has no integer mm)
    assert be.reports[0].choices == []
    torch._dynamo.reset()
    be = passline.backend(choice_overrides={"mm": "decompose_k"}, fallback="raise")
    f = torch.compile(torch.mm, backend=be, dynamic=True)
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    torch.testing.assert_close(f(a, b), a @ b)
    assert be.reports[0].choices == []


def test_a_user_registered_choice_is_used_and_recorded():
    def doubled(a, b):  # (2a) b / 2: exact in binary floating point, and visible in the graph
        return (a * 2) @ b / 2

    with registered(aten.mm, "doubled", doubled, applies=lambda a, b: a.shape[0] < b.shape[1]):
        a, b = torch.randn(3, 40, requires_grad=True), torch.randn(40, 5, requires_grad=True)
        be = assert_matches_eager(torch.mm, [a, b], choice_overrides={"mm": "doubled"})
        fwd = be.reports[0]
        assert [(c.chosen, c.candidates) for c in fwd.choices] == [("doubled", ("aten", "doubled"))]
        bodies = " ".join(repr(n.body) for n in fwd.graph.leaf_nodes() if not isinstance(n, Extern))
        assert "mul(load(primals_1[i0]), 2.0)" in bodies and "truediv(" in bodies
        # the candidate's own mm is lowered by itself: no choice offered inside a choice
        assert [n.op for n in fwd.graph.leaf_nodes() if isinstance(n, Extern)] == [aten.mm.default]
        # where the predicate says no (M >= N), the op runs; an override naming it changes nothing
        be = assert_matches_eager(torch.mm, [torch.randn(5, 40), torch.randn(40, 3)],
                                  choice_overrides={"mm": "doubled"})
        assert be.reports[0].choices == []
    assert "doubled" not in choices.registered().get("mm", {})


def test_an_override_that_does_not_apply_keeps_the_op():
    with registered(aten.mm, "never", lambda a, b: a @ b, applies=lambda a, b: False):
        be = assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)],
                                  choice_overrides={"mm": "never"})
    (rec,) = be.reports[0].choices
    assert (rec.chosen, rec.how) == ("aten", "override not applicable")
    assert "never" not in rec.candidates


def test_bad_overrides_and_registrations_error_clearly():
    with pytest.raises(ValueError, match=r"no choices are registered for 'mmm'; did you mean 'mm'\?"):
        passline.backend(choice_overrides={"mmm": "decompose_k"})
    with pytest.raises(ValueError, match=r"mm has no candidate 'decompose'; did you mean 'decompose_k'\?.*aten"):
        passline.backend(choice_overrides={"mm": "decompose"})
    with pytest.raises(ValueError, match="already registered"):
        passline.register_choice(aten.mm, "decompose_k")(lambda a, b: a @ b)
    with pytest.raises(ValueError, match="names the op itself"):
        passline.register_choice(aten.mm, "aten")
    with pytest.raises(KeyError):
        passline.unregister_choice("mm", "nothing")


def test_a_choice_that_raises_is_named(recwarn):
    """A choice whose function raises fails lowering with its name; one whose `applies` raises is no
    candidate (a warning names it) and the op runs as it is."""
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    with registered(aten.mm, "broken", lambda a, b: 1 / 0):
        with pytest.raises(Exception, match="choice broken of mm failed when traced: ZeroDivisionError"):
            assert_matches_eager(torch.mm, [a, b], choice_overrides={"mm": "broken"})
    with registered(aten.mm, "picky", lambda a, b: a @ b, applies=lambda a, b: 1 / 0):
        be = assert_matches_eager(torch.mm, [a, b])
    assert all(c.chosen == "aten" for r in be.reports for c in r.choices)
    assert any("choice 'picky' of mm" in str(w.message) for w in recwarn.list)


def test_a_candidate_of_the_wrong_shape_is_refused_at_lowering():
    with registered(aten.mm, "wrong_shape", lambda a, b: (a @ b).t()):
        with pytest.raises(Exception, match=r"choice wrong_shape of mm returns \(8, 4\)"):
            assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)],
                                 choice_overrides={"mm": "wrong_shape"})


def test_addmm_and_bmm_decompose_where_they_apply():
    bias, a, b = torch.randn(8), torch.randn(4, 1024), torch.randn(1024, 8)
    be = assert_matches_eager(lambda bias, a, b: torch.addmm(bias, a, b, beta=0.5, alpha=2), [bias, a, b],
                              choice_overrides={"addmm": "decompose_k"})
    assert be.reports[0].choices[0].chosen == "decompose_k(chunks=8)"
    # beta = 0: the bias is not read, its NaNs do not propagate (as addmm)
    nan = torch.full((8,), float("nan"))
    assert_matches_eager(lambda bias, a, b: torch.addmm(bias, a, b, beta=0), [nan, a, b],
                         choice_overrides={"addmm": "decompose_k"})
    # a batched weight gradient, x^T @ dy: the chunks are views of x and dy
    x, dy = torch.randn(3, 512, 8), torch.randn(3, 512, 4)
    be = assert_matches_eager(lambda x, dy: torch.bmm(x.transpose(1, 2), dy), [x, dy],
                              choice_overrides={"bmm": "decompose_k"})
    assert be.reports[0].choices[0].chosen == "decompose_k(chunks=4)"
    # row-major [B, M, K]: chunks of every batch would need a copy of `a`; not a candidate
    be = assert_matches_eager(torch.bmm, [x.transpose(1, 2).contiguous(), dy], choice_overrides={"bmm": "decompose_k"})
    assert be.reports[0].choices == []


def test_chunk_counts_follow_the_sizes():
    assert choices.chunk_counts(32, 32, 28672) == [224, 112, 56, 32]  # K / 128 = 224 = 2^5 x 7
    assert choices.chunk_counts(16, 16, 4096) == [32, 16, 8, 4]
    assert choices.chunk_counts(64, 64, 32768) == [256, 128, 64, 32]
    assert choices.chunk_counts(64, 16, 4096) == [32, 16, 8, 4]  # chunks no shorter than M (64 <= 128)
    assert choices.chunk_counts(4, 4, 1000) == []  # no whole 128-long chunk
    assert choices.chunk_counts(300, 4, 1024) == [2]  # chunks of 512, no shorter than M
    assert choices.chunk_counts(600, 4, 1024) == []  # two chunks would be shorter than M


def test_dumps_and_explain_show_the_choices(tmp_path):
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    assert_matches_eager(torch.mm, [a, b], choice_overrides={"mm": "decompose_k"}, dump_dir=str(tmp_path))
    text = next(tmp_path.rglob("000-input.txt")).read_text()
    assert "choice mm (mm): decompose_k(chunks=8) [override] among aten, decompose_k(chunks=8)" in text


def test_the_cli_explains_and_sets_choices(tmp_path, capsys):
    from passline.cli import main

    (tmp_path / "f.py").write_text("def fn(a, b):\n    return (a @ b).relu()\n")
    target = f"{tmp_path / 'f.py'}:fn"
    assert main(["explain", target, "--shape", "4x1024", "--shape", "1024x8", "--choice", "mm=decompose_k"]) == 0
    out = capsys.readouterr().out
    assert "choices (node (op): chosen [how] among candidates; timings):" in out
    assert "mm (mm): decompose_k(chunks=8) [override]" in out and "extern calls: 1" in out
    assert main(["explain", target, "--shape", "4x1024", "--shape", "1024x8", "--choice", "mm=decompos"]) == 2
    assert "did you mean 'decompose_k'?" in capsys.readouterr().err
    # draw lowers the graph again with the report's choices: every node of it is coloured by its kernel
    assert main(["draw", target, "--shape", "4x1024", "--shape", "1024x8", "--choice", "mm=decompose_k",
                 "--out", str(tmp_path / "g.dot")]) == 0
    dot = (tmp_path / "g.dot").read_text()
    assert "aten.bmm" in dot and "fillcolor" in dot


# -- timing (the GPU path, run on the CPU: only the timing itself, `bench`, is replaced) ---------------------

def _timed(monkeypatch, ms: dict, calls: list):
    """Let the backend's chooser time CPU tensors, with its `bench` replaced by `ms` per candidate in the order
    the chooser times them (the op first)."""
    monkeypatch.setattr(TimedChooser, "can_time", lambda self, tensors: True)
    order = iter(ms.values())

    def bench(runs, replayed=False):
        calls.extend(runs.values())
        return {name: next(order) for name in runs}

    monkeypatch.setattr(TimedChooser, "bench", staticmethod(bench))


def test_timing_picks_the_fastest_and_caches_it(monkeypatch, tmp_path):
    ms = {"aten": 1.0, "decompose_k(chunks=8)": 0.5, "decompose_k(chunks=4)": 0.25, "decompose_k(chunks=2)": 0.75}
    calls = []
    _timed(monkeypatch, ms, calls)
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    state = torch.get_rng_state()
    be = assert_matches_eager(torch.mm, [a, b], cache_dir=str(tmp_path))
    # the random inputs came from a generator of their own: the user's random state is as it was
    assert torch.equal(torch.get_rng_state(), state)
    (rec,) = be.reports[0].choices
    assert (rec.chosen, rec.how, rec.timings) == ("decompose_k(chunks=4)", "timed", ms)
    assert len(calls) == 4
    assert any(isinstance(n, Extern) and n.op == aten.bmm.default for n in be.reports[0].graph.nodes())
    # a second compile of the same node reads the pick back, times nothing
    be = assert_matches_eager(torch.mm, [a, b], cache_dir=str(tmp_path))
    (rec,) = be.reports[0].choices
    assert (rec.chosen, rec.how, rec.timings) == ("decompose_k(chunks=4)", "cached", ms)
    assert len(calls) == 4
    # the same node under CUDA graphs is timed again (GPU time, not calls): a pick made by the other timing
    # is not reused
    ms2 = dict(zip(ms, (1.0, 0.5, 0.75, 0.25)))
    _timed(monkeypatch, ms2, calls)
    be = passline.backend(cache_dir=str(tmp_path), cudagraphs=True)
    torch.compile(torch.mm, backend=be)(a, b)
    (rec,) = be.reports[0].choices
    assert (rec.chosen, rec.how, len(calls)) == ("decompose_k(chunks=2)", "timed", 8)
    _timed(monkeypatch, ms, calls)
    # another shape is another key
    be = assert_matches_eager(torch.mm, [torch.randn(2, 1024), b], cache_dir=str(tmp_path),
                              choice_overrides={"mm": "decompose_k(chunks=2)"})
    assert be.reports[0].choices[0].how == "override"  # one candidate left: nothing to time
    # an override naming a choice of several versions forces its first one: an override is never timed
    be = assert_matches_eager(torch.mm, [torch.randn(3, 1024), b], cache_dir=str(tmp_path),
                              choice_overrides={"mm": "decompose_k"})
    assert (be.reports[0].choices[0].chosen, be.reports[0].choices[0].how) == ("decompose_k(chunks=8)", "override")
    assert len(calls) == 8


def test_the_candidates_binaries_are_built_side_by_side_before_any_runs(monkeypatch, tmp_path):
    """Each candidate's runner is made without its binaries; all of them are then built at once (each build
    waits on the compile pool's processes), in the compile's settings, before the first candidate runs."""
    import threading

    from passline.backends.triton.runner import TritonRunner
    from passline.config import current_settings

    ms = {"aten": 1.0, "decompose_k(chunks=8)": 0.5, "decompose_k(chunks=4)": 0.25, "decompose_k(chunks=2)": 0.75}
    calls, builds, ran, lock = [], [], [], threading.Lock()
    together = threading.Barrier(4, timeout=10)  # the four candidates' builds: all waiting at once, or broken
    _timed(monkeypatch, ms, calls)
    made, call = TritonRunner.__init__, TritonRunner.__call__

    def init(self, *a, precompile=True, **kw):
        self.deferred = not precompile
        made(self, *a, precompile=precompile, **kw)

    def build(self):
        if not self.deferred:  # the graph's own runner, built in its constructor
            return
        try:
            together.wait()
            met = True
        except threading.BrokenBarrierError:
            met = False
        with lock:
            builds.append((self, met, current_settings().cache_dir, len(ran)))

    monkeypatch.setattr(TritonRunner, "__init__", init)
    monkeypatch.setattr(TritonRunner, "precompile", build)
    monkeypatch.setattr(TritonRunner, "__call__", lambda self, *a: ran.append(self) or call(self, *a))
    be = assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)], cache_dir=str(tmp_path))
    assert len(builds) == 4 and len(calls) == 4
    assert all(b[1] for b in builds)  # the four builds were under way at the same time
    assert {b[2] for b in builds} == {str(tmp_path)}  # in the compile's settings, not the thread's defaults
    assert {b[3] for b in builds} == {0}  # every build done before any candidate ran
    checked = {r for r in ran if r.deferred}  # each of decompose-K's versions against the op's result
    assert len(checked) == 3 and checked < {b[0] for b in builds}
    assert be.reports[0].choices[0].chosen == "decompose_k(chunks=4)"


def test_a_win_within_the_timing_noise_keeps_the_op(monkeypatch, tmp_path):
    ms = {"aten": 1.0, "decompose_k(chunks=8)": 0.99, "decompose_k(chunks=4)": 1.5, "decompose_k(chunks=2)": 1.2}
    _timed(monkeypatch, ms, [])
    be = assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)], cache_dir=str(tmp_path))
    (rec,) = be.reports[0].choices
    assert (rec.chosen, rec.how, rec.timings) == ("aten", "timed", ms)


@pytest.mark.parametrize("cudagraphs, chosen", [(False, "aten"), (True, "decompose_k(chunks=8)")])
def test_calls_need_a_wider_win_than_gpu_time(monkeypatch, tmp_path, cudagraphs, chosen):
    """5% faster is a win by GPU time (NOISE: 2%), not by calls, whose host share moves more (CALL_NOISE: 10%)."""
    from passline.backends.choosing import CALL_NOISE, NOISE

    assert NOISE < 0.05 < CALL_NOISE
    ms = {"aten": 1.0, "decompose_k(chunks=8)": 0.95, "decompose_k(chunks=4)": 1.5, "decompose_k(chunks=2)": 1.2}
    _timed(monkeypatch, ms, [])
    be = passline.backend(cache_dir=str(tmp_path), cudagraphs=cudagraphs)
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    torch.testing.assert_close(torch.compile(torch.mm, backend=be)(a, b), a @ b, atol=1e-4, rtol=1e-4)  # chunked sum
    assert be.reports[0].choices[0].chosen == chosen


def test_calls_are_timed_in_interleaved_rounds(monkeypatch):
    """calls_ms runs round r of every candidate before round r + 1 of any, so a host's drift is shared."""
    import passline.backends.choosing as choosing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order = []
    runs = {name: (lambda name=name: order.append(name)) for name in ("op", "dk")}
    ms = choosing.calls_ms(runs, rounds=3, round_s=0.0)
    assert set(ms) == {"op", "dk"} and all(v > 0 for v in ms.values())
    timed = order[4:]  # each warmed and sized by two calls first, then 3 rounds of 10 calls each
    assert timed == (["op"] * 10 + ["dk"] * 10) * 3


def test_timing_drops_a_candidate_that_disagrees_with_the_op(monkeypatch, tmp_path):
    calls = []
    # the op and decompose-K's three versions are timed, in this order; "bad" never is
    _timed(monkeypatch, {"aten": 1.0, "decompose_k(chunks=8)": 0.9, "decompose_k(chunks=4)": 0.8,
                         "decompose_k(chunks=2)": 0.7}, calls)
    with registered(aten.mm, "bad", lambda a, b: (a @ b) * 1.5):
        with pytest.warns(UserWarning, match="choice bad of mm disagrees with aten.mm.default"):
            be = assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)],
                                      cache_dir=str(tmp_path))
    (rec,) = be.reports[0].choices
    assert "bad" in rec.candidates and "bad" not in rec.timings
    assert (rec.chosen, len(calls)) == ("decompose_k(chunks=2)", 4)


# -- property: every registered candidate agrees with its op ----------------------------------------------

@st.composite
def mm_cases(draw):
    """(op, args, kwargs) of random mm, addmm and bmm nodes shaped so that decompose-K applies: K a multiple
    of 128, at least 32 times M and N."""
    op = draw(st.sampled_from(["mm", "addmm", "bmm"]))
    dtype = draw(st.sampled_from(DTYPES))
    m, n = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    k = 128 * draw(st.integers(2, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(dtype)

    if op == "bmm":  # batched weight gradients: a column-major
        bsz = draw(st.integers(1, 3))
        return aten.bmm.default, (rand(bsz, k, m).transpose(1, 2), rand(bsz, k, n)), {}
    a = rand(m, k) if draw(st.booleans()) else rand(k, m).t()
    b = rand(k, n) if draw(st.booleans()) else rand(n, k).t()
    if op == "mm":
        return aten.mm.default, (a, b), {}
    bias = rand(*draw(st.sampled_from([(n,), (1, n), (m, n)])))
    kwargs = dict(beta=draw(st.sampled_from([0, 1, 0.5])), alpha=draw(st.sampled_from([1, 2])))
    return aten.addmm.default, (bias, a, b), kwargs


@settings(max_examples=40)
@given(mm_cases())
def test_every_registered_candidate_agrees_with_its_op(case):
    op, args, kwargs = case
    cands = choices.candidates(choices.op_name(op), args, kwargs)
    assert len(cands) > 1  # the cases are built for decompose-K
    want = op(*args, **kwargs)
    for c in cands[1:]:
        torch.testing.assert_close(c(*args, **kwargs), want, **tolerance(want.dtype),
                                   msg=lambda m, c=c: f"{c.name}: {m}")


@settings(max_examples=4)
@given(mm_cases(), st.data())
def test_every_registered_candidate_compiled_matches_eager(case, data):
    op, args, kwargs = case
    cands = choices.candidates(choices.op_name(op), args, kwargs)
    pick = data.draw(st.sampled_from(cands[1:]))
    be = assert_matches_eager(lambda *a: op(*a, **kwargs), list(args),
                              choice_overrides={choices.op_name(op): pick.name})
    assert be.reports[0].choices[0].chosen == pick.name


def test_the_benchmark_runs_a_shape(tmp_path):
    bench = benchmark_script("choices")
    row = bench.run_case(4, 8, 512, torch.bfloat16, "cpu", str(tmp_path), force="decompose_k")
    assert (row["chosen"], row["check"]) == ("decompose_k(chunks=4)", "ok")
    assert row["passline_call_ms"] > 0 and row["aten_call_ms"] > 0


def test_candidates_are_timed_as_the_graph_will_run(monkeypatch):
    """With CUDA graphs a call costs the GPU's time alone; without, back-to-back calls' (host included)."""
    import passline.backends.choosing as choosing

    seen = []
    monkeypatch.setattr(choosing, "gpu_ms", lambda run: seen.append("gpu") or 1.0)
    monkeypatch.setattr(choosing, "calls_ms", lambda runs: seen.append("calls") or dict.fromkeys(runs, 1.0))
    a, b = torch.randn(4, 1024), torch.randn(1024, 8)
    for cudagraphs, dynamic in ((False, False), (True, False), (True, True)):
        be = passline.backend(cudagraphs=cudagraphs)
        gm = torch.fx.experimental.proxy_tensor.make_fx(torch.mm, tracing_mode="symbolic" if dynamic else "fake")(a, b)
        node = next(n for n in gm.graph.nodes if n.op == "call_function")
        chooser = TimedChooser(None, be)
        chooser.bench({"op": lambda: None}, chooser.replayed(node))
    # replayed only with CUDA graphs and static shapes (a graph with symbolic sizes is not captured)
    assert seen == ["calls", "gpu", "calls"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times a GPU")
def test_gpu_time_leaves_the_host_out_and_calls_keep_it():
    import time

    from passline.backends.choosing import call_ms, gpu_ms

    x = torch.zeros(1024, device="cuda")

    def run():  # half a millisecond of host work, a microsecond of GPU work
        time.sleep(0.0005)
        x.add_(1)

    assert call_ms(run) >= 0.5 > 0.05 > gpu_ms(run)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures on a GPU")
def test_an_uncapturable_call_has_no_gpu_time_and_leaves_the_callers_stream():
    """A call that synchronizes with the host cannot be captured: gpu_ms says None, the caller's stream is
    current again (torch's capture leaves its own stream current when ending the capture fails), and random
    numbers can be drawn (its capture_end raises before it takes the CUDA generator out of capture mode:
    cudagraphs._release_generators). In a process of its own, so that a failure here fails no other test."""
    import subprocess
    import sys

    code = ("import torch\n"
            "from passline.backends.choosing import gpu_ms\n"
            "x = torch.zeros(8, device='cuda')\n"
            "stream = torch.cuda.current_stream()\n"
            "assert gpu_ms(lambda: x.sum().item()) is None\n"
            "assert torch.cuda.current_stream() == stream\n"
            "torch.randn(8, device='cuda').sum().item()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_candidates_kernels_launch_by_rule_and_the_chosen_graphs_time_their_bands(monkeypatch, tmp_path):
    """A choice's candidates are timed as wholes with each kernel at its rule's configuration
    (`TritonRunner(bands=False)`: no configuration band timed at a candidate's first run, ~0.1 s a candidate on an
    H200 for the same picks); the graph the choice goes into times its kernels' bands as ever."""
    from passline.backends.triton import runner as triton_runner
    from passline.backends.triton.runner import TritonRunner

    made, runners = TritonRunner.__init__, []

    def init(self, *a, **kw):
        made(self, *a, **kw)
        runners.append(self)

    monkeypatch.setattr(TritonRunner, "__init__", init)
    ms = {"aten": 1.0, "decompose_k(chunks=8)": 0.5, "decompose_k(chunks=4)": 0.25, "decompose_k(chunks=2)": 0.75}
    _timed(monkeypatch, ms, [])
    # (codegen="triton": the graph's runner too, wherever the test runs; a CPU graph on a GPU host would otherwise go
    # to the reference backend, whose graphs have no kernels)
    be = assert_matches_eager(torch.mm, [torch.randn(4, 1024), torch.randn(1024, 8)], cache_dir=str(tmp_path),
                              codegen="triton")
    assert be.reports[0].choices[0].chosen == "decompose_k(chunks=4)"
    band = [object()]  # whatever configs.uncertain would time at a GPU's sizes
    monkeypatch.setattr(triton_runner, "uncertain", lambda *a, **kw: band)
    candidates, graphs = [r for r in runners if not r.bands], [r for r in runners if r.bands]
    assert len(candidates) == 4 and graphs  # the op and decompose-K's three; the compiled graph's own
    timing = collections.Counter()  # kernels that time the band: the graph's, and the candidates' were they allowed
    for r in runners:
        for k in r._by_code.values():  # (a GPU target's split finishing kernel never times one)
            if r.bands:
                timing["graph"] += k.uncertain(4096, 1024) == band
            else:
                assert k.uncertain(4096, 1024) == []
                k.bands = True
                timing["candidates"] += k.uncertain(4096, 1024) == band
    assert timing["graph"] and timing["candidates"]  # decompose-K's column sum in the graph and in its candidate
