"""fuse_linear_cross_entropy (issue 16, part 4): an LM head's loss in chunks of rows, its logits never whole.

Losses and every gradient against eager's loss.backward(); the forms the pass recognizes and the ones it
leaves alone; the FX stage in pipelines; the chunk bound, seen from inside the op."""
import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from modules import benchmark_script
from torch.utils._python_dispatch import TorchDispatchMode

import passline
from passline.ops import cross_entropy_rows
from passline.ops.linear_cross_entropy import (
    chunked_backward,
    chunked_forward,
    chunked_forward_with_grads,
    default_chunk_rows,
)
from passline.testing import assert_matches_eager

VOCAB, HIDDEN = 300, 16
# 4-row chunks over 14 rows: several chunks and a short last one
PIPELINE = "fuse_linear_cross_entropy(chunk_rows=4), " + passline.DEFAULT_PIPELINE


def _leaf(*shape, dtype=torch.float32, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).requires_grad_()


def _targets(*shape, ignore=-100, seed=1):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, VOCAB, shape, generator=gen)
    t.view(-1)[::5] = ignore  # every fifth row ignored
    return t


def _fired(be) -> int:
    """Rewrites the FX stage made, counted once per captured graph (in its forward's metrics)."""
    return sum(r.metrics.counters["linear_cross_entropy_fused"] for r in be.reports)


# (name, fn(x, w, b, t), 3-D x, bias, dtype, F.cross_entropy options)
FORMS = {
    "linear_view": lambda x, w, b, t, **o: F.cross_entropy(F.linear(x, w).view(-1, VOCAB), t.view(-1), **o),
    "matmul_T_float_flatten": lambda x, w, b, t, **o: F.cross_entropy((x @ w.T).float().flatten(0, 1),
                                                                      t.flatten(), **o),
    "linear_bias_float": lambda x, w, b, t, **o: F.cross_entropy(F.linear(x, w, b).float().reshape(-1, VOCAB),
                                                                 t.reshape(-1), **o),
    "matmul_t_to": lambda x, w, b, t, **o: F.cross_entropy(torch.matmul(x, w.t()).to(torch.float32).view(-1, VOCAB),
                                                           t.view(-1), **o),
    "matmul_untransposed": lambda x, w, b, t, **o: F.cross_entropy((x @ w).view(-1, VOCAB), t.view(-1), **o),
}
CASES = [  # every form, both dtypes, every reduction, label smoothing, ignore_index -100 and -1, both backwards
    ("linear_view", torch.float32, dict(), True),
    ("linear_view", torch.float32, dict(), False),
    ("linear_view", torch.bfloat16, dict(reduction="sum"), True),  # bfloat16 loss: no upcast
    ("linear_view", torch.bfloat16, dict(reduction="sum"), False),
    ("matmul_T_float_flatten", torch.bfloat16, dict(label_smoothing=0.1), True),
    ("matmul_T_float_flatten", torch.bfloat16, dict(label_smoothing=0.1), False),
    ("matmul_T_float_flatten", torch.float32, dict(reduction="none", ignore_index=-1), True),
    ("linear_bias_float", torch.bfloat16, dict(reduction="none", label_smoothing=0.2), True),
    ("linear_bias_float", torch.float32, dict(reduction="sum", label_smoothing=0.1), True),
    ("linear_bias_float", torch.float32, dict(reduction="mean", label_smoothing=0.1), False),
    ("matmul_t_to", torch.float32, dict(label_smoothing=0.05), True),
    ("matmul_untransposed", torch.float32, dict(reduction="sum"), True),
]


@pytest.mark.parametrize("form,dtype,options,grads_in_forward", CASES,
                         ids=[f"{f}-{str(d)[6:]}-{o}-{g}" for f, d, o, g in CASES])
def test_loss_and_gradients_match_eager(form, dtype, options, grads_in_forward):
    x = _leaf(2, 7, HIDDEN, dtype=dtype)
    w = _leaf(*((HIDDEN, VOCAB) if form == "matmul_untransposed" else (VOCAB, HIDDEN)), dtype=dtype, scale=0.5, seed=2)
    b = _leaf(VOCAB, dtype=dtype, seed=3)
    t = _targets(2, 7, ignore=options.get("ignore_index", -100))
    fn = FORMS[form]
    pipeline = f"fuse_linear_cross_entropy(chunk_rows=4, grads_in_forward={str(grads_in_forward).lower()}), dce"
    be = assert_matches_eager(lambda x, w, b, t: fn(x, w, b, t, **options), [x, w, b, t], pipeline=pipeline,
                              codegen="reference")
    assert _fired(be) == 1
    forward = be.reports[0]
    assert forward.passes[0].name == "fuse_linear_cross_entropy" and forward.passes[0].stage == "fx"
    ops = {str(n.op) for n in forward.graph.nodes() if isinstance(n, passline.ir.Extern)}
    # gradients with the loss for a mean or a sum; a per-row loss's backward computes the logits again
    with_grads = grads_in_forward and options.get("reduction") != "none"
    assert ops == {f"passline.linear_cross_entropy{'_with_grads' if with_grads else ''}.default"}, ops


@pytest.mark.parametrize("dtype,vocab,options,grads_in_forward", [
    (torch.bfloat16, 1031, dict(label_smoothing=0.1), True),
    (torch.bfloat16, 1031, dict(label_smoothing=0.1), False),
    (torch.float32, 257, dict(reduction="sum", ignore_index=-1), True),
    (torch.bfloat16, 257, dict(reduction="none"), True),
], ids=["bf16-1031-smooth", "bf16-1031-smooth-recompute", "f32-257-sum", "bf16-257-none"])
def test_odd_vocabularies_through_the_pass(dtype, vocab, options, grads_in_forward):
    """Vocabularies that are no power of two (the kernel's last column block is partial), chunks of 5 over 14
    rows, the graphs around the op on Triton's interpreter."""
    x, w = _leaf(2, 7, HIDDEN, dtype=dtype), _leaf(vocab, HIDDEN, dtype=dtype, scale=0.5, seed=2)
    t = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(5))
    t.view(-1)[::5] = options.get("ignore_index", -100)
    fn = lambda x, w, t: F.cross_entropy(F.linear(x, w).float().view(-1, vocab), t.view(-1), **options)
    pipeline = f"fuse_linear_cross_entropy(chunk_rows=5, grads_in_forward={str(grads_in_forward).lower()}), dce"
    be = assert_matches_eager(fn, [x, w, t], pipeline=pipeline, codegen="triton")
    assert _fired(be) == 1


def test_no_tensor_of_the_logits_size_is_saved_or_made():
    """What the forward hands the backward, and every buffer of both graphs, is far below tokens x vocab."""
    x, w, t = _leaf(4, 8, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(4, 8)
    be = assert_matches_eager(lambda x, w, t: F.cross_entropy(F.linear(x, w).float().view(-1, VOCAB), t.view(-1)),
                              [x, w, t], pipeline=PIPELINE, codegen="reference")
    tokens = 32
    for report in be.reports:
        largest = max(int(b.layout.numel) for b in report.graph.buffers().values())
        assert largest <= VOCAB * HIDDEN < tokens * VOCAB, (report.name, largest)
    saved = [n for n in be.reports[0].gm.graph.find_nodes(op="output")[0].args[0] if hasattr(n, "meta")]
    assert all(n.meta["val"].numel() < tokens * VOCAB for n in saved if isinstance(n.meta.get("val"), torch.Tensor))


class _Largest(TorchDispatchMode):
    """The bytes of the largest tensor any op makes within (Triton's interpreter copies a kernel's arguments'
    storages as bytes, the size of the chunk's buffer), and every float32 tensor's shape."""

    def __init__(self):
        super().__init__()
        self.largest, self.float32 = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel() * o.element_size())
                if o.dtype == torch.float32:
                    self.float32.append(tuple(o.shape))
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_op_holds_one_chunk_of_logits_at_a_time(dtype):
    """Every tensor the op makes, forward and backward, is at most a chunk of logits (in their dtype) or the
    float32 weight-gradient sum; under the kernel no float32 tensor has a chunk's rows of the vocabulary."""
    rows, chunk = 64, 8
    x, w, t = torch.randn(rows, HIDDEN).to(dtype), torch.randn(VOCAB, HIDDEN).to(dtype), _targets(rows)
    with _Largest() as seen:
        loss = chunked_forward(x, w, None, t, -100, 0.1, "mean", True, chunk)
        grads = chunked_backward(torch.ones(()), x, w, None, t, -100, 0.1, "mean", chunk, True, True, False)
        loss_and_grads = chunked_forward_with_grads(x, w, None, t, -100, 0.1, "mean", True, chunk, True, True, False)
    assert seen.largest == max(chunk * VOCAB * dtype.itemsize, VOCAB * HIDDEN * 4) < rows * VOCAB * dtype.itemsize
    if dtype != torch.float32 and cross_entropy_rows.implementation(x) == "triton":
        assert not [s for s in seen.float32 if len(s) == 2 and s[1] == VOCAB and s != (VOCAB, HIDDEN)], seen.float32
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected = F.cross_entropy((xr @ wr.T).float(), t, label_smoothing=0.1)
    expected.backward()
    tol = {} if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-2)
    for got in (loss, loss_and_grads[0]):
        torch.testing.assert_close(got, expected, **tol)
    for got in (grads, loss_and_grads[1:3]):
        torch.testing.assert_close(got[0], xr.grad, **tol)
        torch.testing.assert_close(got[1].to(dtype), wr.grad, **tol)


def test_chunk_rule():
    assert default_chunk_rows(8192, 768, 128256) == 768  # chunk logits no larger than the weight
    assert default_chunk_rows(100, 16, 10) == 100  # a vocabulary narrower than the rows: one chunk
    assert default_chunk_rows(4096, 64, 1024) == 256  # x [4096, 64] is larger than the weight [1024, 64]
    assert default_chunk_rows(0, 16, 10) == 1


def test_the_default_rule_and_a_tied_embedding():
    """GPT-2's head: the embedding's weight is the head's; its gradient from both uses adds up. Default chunks."""
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, HIDDEN)
            self.norm = nn.LayerNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx, t):
            logits = self.head(self.norm(self.emb(idx)))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), t.view(-1), ignore_index=-1)

    torch.manual_seed(0)
    model = Tied()
    idx, t = _targets(3, 40, ignore=0), _targets(3, 40, ignore=-1, seed=4)  # 120 rows: chunks of 16 (hidden)
    be = assert_matches_eager(model, [idx, t], pipeline="fuse_linear_cross_entropy, " + passline.DEFAULT_PIPELINE,
                              codegen="reference")
    assert _fired(be) == 1
    # the comparison above can fail on either part: the embedding's part alone is far from the sum
    model.zero_grad()
    idx, t = idx.to(model.emb.weight.device), t.to(model.emb.weight.device)  # (a GPU run moved the model)
    torch.compile(model, backend=be)(idx, t).backward()
    both = model.emb.weight.grad.clone()
    model.zero_grad()
    logits = model.norm(model.emb(idx)) @ model.emb.weight.detach().T  # the head's use cut off
    F.cross_entropy(logits.view(-1, VOCAB), t.view(-1), ignore_index=-1).backward()
    assert not torch.allclose(both, model.emb.weight.grad, atol=1e-3)


def test_generated_kernels_around_the_op():
    """The graph around the op (flatten, the embedding's scatter) on Triton's interpreter."""
    x, w, t = _leaf(2, 5, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, 5)
    be = assert_matches_eager(lambda x, w, t: F.cross_entropy(F.linear(x * 2, w).view(-1, VOCAB), t.view(-1)),
                              [x, w, t], pipeline=PIPELINE, codegen="triton")
    assert _fired(be) == 1


def test_dynamic_shapes_one_compile():
    be = passline.backend(PIPELINE, codegen="reference", fallback="raise")
    torch._dynamo.reset()
    f = torch.compile(lambda x, w, t: F.cross_entropy((x @ w.T).float().flatten(0, 1), t.flatten()), backend=be,
                      dynamic=True)
    for tokens in (5, 9, 12):
        x, w, t = _leaf(2, tokens, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, tokens)
        ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        f(x, w, t).backward()
        F.cross_entropy((ex @ ew.T).flatten(0, 1), t.flatten()).backward()
        torch.testing.assert_close(x.grad, ex.grad)
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(be.reports) == 2 and _fired(be) == 1  # one forward, one backward


def _stats(fn, inputs, pipeline=PIPELINE):
    be = assert_matches_eager(fn, inputs, pipeline=pipeline, codegen="reference")
    record = be.reports[0].passes[0]
    assert record.name == "fuse_linear_cross_entropy"
    return be, record


def test_left_alone_when_the_logits_are_needed_or_the_loss_is_not_plain():
    x, w, t = _leaf(2, 7, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, 7)
    cases = {
        # the logits are returned: they exist anyway
        "logits_read_elsewhere": lambda x, w, t: (lambda z: (F.cross_entropy(z.view(-1, VOCAB), t.view(-1)), z))(
            F.linear(x, w)),
        "options": lambda x, w, t: F.cross_entropy(F.linear(x, w).view(-1, VOCAB), t.view(-1),
                                                   weight=torch.ones(VOCAB, device=x.device)),
        "no_linear": lambda x, w, t: F.cross_entropy((x.view(-1, HIDDEN) * 2).exp(), t.view(-1) % HIDDEN),
        "shapes": lambda x, w, t: F.cross_entropy(F.linear(x[0, 0], w), t[0, 0] % VOCAB),  # one row, unbatched
    }
    for reason, fn in cases.items():
        be, record = _stats(fn, [x, w, t])
        assert not record.changed and record.stats == {f"linear_cross_entropy_refused_{reason}": 1}, (reason, record)
        assert _fired(be) == 0


def test_mixed_dtypes_are_left_alone():
    """An autocast region's linear makes bfloat16 logits of float32 operands: not the op's contract."""
    x, w, t = _leaf(2, 7, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, 7)

    def fn(x, w, t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = F.linear(x, w)
        return F.cross_entropy(z.float().view(-1, VOCAB), t.view(-1))

    be = passline.backend(PIPELINE, codegen="reference", fallback="raise")
    torch._dynamo.reset()
    torch.compile(fn, backend=be)(x, w, t)
    assert be.reports[0].passes[0].stats == {"linear_cross_entropy_refused_dtypes": 1}


def test_a_torch_func_transform_keeps_its_cross_entropy():
    """A loss differentiated by torch.func (a gradient penalty, double backward through an LM head) is left alone:
    the fused op has no rules for the transforms (aot_autograd raised, and its fallback could not recover the
    frame: a campaign's find, thirty-seventh session)."""
    from torch.func import grad

    x, w, t = _leaf(7, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(1, 7).view(-1)

    def fn(x, w):
        return grad(lambda v: F.cross_entropy(F.linear(v, w), t))(x)

    be = passline.backend(PIPELINE, codegen="triton", fallback="raise")
    torch._dynamo.reset()
    got = torch.compile(fn, backend=be)(x.detach(), w.detach())
    torch.testing.assert_close(got, fn(x.detach(), w.detach()))
    assert be.reports[0].passes[0].stats == {"linear_cross_entropy_refused_transform": 1} and _fired(be) == 0

    # vmap and jvp alike; a loss outside the transform in the same graph is still fused
    def two(x, w):
        per_row = torch.vmap(lambda v: F.cross_entropy(F.linear(v, w), t[0]))(x)
        tangent = torch.func.jvp(lambda v: F.cross_entropy(F.linear(v, w), t), (x,), (torch.ones_like(x),))[1]
        return per_row.sum() + tangent + F.cross_entropy(F.linear(x, w), t)

    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    be = assert_matches_eager(two, [x, w], pipeline=PIPELINE, codegen="reference")
    assert be.reports[0].passes[0].stats == {"linear_cross_entropy_refused_transform": 2,
                                             "linear_cross_entropy_fused": 1}


def test_a_graph_aot_autograd_refuses_runs_as_captured_not_as_rewritten(monkeypatch):
    """When aot_autograd fails on a graph the FX stage rewrote, the default fallback runs dynamo's graph as it was
    captured (the rewrite is what may have failed; inside a torch.func transform it was)."""
    from passline.backends import dynamo as pdynamo

    def refusing(**kwargs):
        def compiler(gm, example_inputs):
            raise RuntimeError("aot_autograd refused this graph")
        return compiler

    monkeypatch.setattr(pdynamo, "aot_autograd", refusing)
    x, w, t = _leaf(2, 7, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, 7)
    fn = lambda x, w, t: F.cross_entropy(F.linear(x, w).view(-1, VOCAB), t.view(-1))  # noqa: E731
    be = passline.backend(PIPELINE, codegen="reference")
    returned = []

    def spy(gm, example_inputs):  # what the backend hands dynamo to run
        returned.append(be(gm, example_inputs))
        return returned[-1]

    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="could not trace a graph with aot_autograd"):
        got = torch.compile(fn, backend=spy)(x, w, t)
    torch.testing.assert_close(got, fn(x, w, t))
    assert [kind for kind, _ in be.failures] == ["aot_autograd"] and len(returned) == 1
    assert be.reports == [] and "cross_entropy" in returned[0].__self__.code
    assert "passline" not in returned[0].__self__.code  # not the rewritten graph, with the fused op


def test_a_bisect_limit_stops_the_rewrite():
    x, w, t = _leaf(2, 7, HIDDEN), _leaf(VOCAB, HIDDEN, scale=0.5), _targets(2, 7)
    fn = lambda x, w, t: F.cross_entropy(F.linear(x, w).view(-1, VOCAB), t.view(-1))
    be = assert_matches_eager(fn, [x, w, t], pipeline=PIPELINE, codegen="reference", decision_limits={1: 0})
    record = be.reports[0].passes[0]
    assert not record.changed and [d.allowed for d in record.decisions] == [False] and _fired(be) == 0
    # pass_limit counts the FX stage: 1 runs it and no scheduler pass
    be = assert_matches_eager(fn, [x, w, t], pipeline=PIPELINE, codegen="reference", pass_limit=1)
    assert [r.name for r in be.reports[0].passes] == ["fuse_linear_cross_entropy"] and _fired(be) == 1


def test_fx_stage_in_pipelines():
    p = passline.Pipeline.parse("fuse_linear_cross_entropy(chunk_rows=64), dce, fuse")
    assert [c.name for c in p.fx_calls()] == ["fuse_linear_cross_entropy"]
    assert [str(i) for i in p.scheduler_items()] == ["dce", "fuse"]
    assert passline.Pipeline.parse(str(p)) == p
    assert passline.passes()["fuse_linear_cross_entropy"].stage == "fx"
    assert passline.passes()["dce"].stage == "scheduler"
    # written after a scheduler pass, an FX-stage pass still runs in its stage, first
    late = passline.Pipeline.parse("dce, fuse_linear_cross_entropy")
    assert [c.name for c in late.fx_calls()] == ["fuse_linear_cross_entropy"]
    assert [str(i) for i in late.scheduler_items()] == ["dce"]
    with pytest.raises(passline.PipelineError, match="cannot be inside repeat"):
        passline.Pipeline.parse("repeat(fuse_linear_cross_entropy, dce)")
    with pytest.raises(ValueError, match="stage is one of"):
        passline.register_pass("t_bad_stage", stage="aten")(lambda graph, ctx: graph)
    # a PassManager run on a lowered graph runs the scheduler stage only
    graph, records = passline.PassManager(p).run(passline.SchedulerGraph())
    assert [r.name for r in records] == ["dce", "fuse"]


def test_a_failing_fx_pass_runs_the_graph_as_dynamo_captured_it():
    @passline.register_pass("t_breaks_fx", stage="fx", replace=True)
    def t_breaks_fx(gm, ctx):
        for n in list(gm.graph.nodes):
            if n.op == "call_function":
                n.target = torch.sub  # a half-done rewrite, then a failure
        raise RuntimeError("t_breaks_fx failed")

    try:
        x = torch.randn(5)
        with pytest.warns(UserWarning, match="t_breaks_fx failed"):
            be = passline.backend("t_breaks_fx, dce", codegen="reference", fallback="eager")
            torch._dynamo.reset()
            out = torch.compile(lambda x: x + 1, backend=be)(x)
        torch.testing.assert_close(out, x + 1)
        assert [kind for kind, _ in be.failures] == ["fx"]
        with pytest.raises(RuntimeError, match="t_breaks_fx failed"):
            torch._dynamo.reset()
            torch.compile(lambda x: x + 1, backend=passline.backend("t_breaks_fx", fallback="raise"))(x)
    finally:
        passline.unregister_pass("t_breaks_fx")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the CPU smoke run needs Triton's interpreter from the start: Triton 3.6 does not "
                           "switch to it inside a process whose Triton was imported without it (a GPU run)")
def test_benchmark_smoke_run(tmp_path, monkeypatch):
    """benchmarks/linear_cross_entropy.py at tiny sizes: every contender within its check, the pass fired."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main() sets it for --device cpu: undone after the test
    out = tmp_path / "lce.json"
    code = benchmark_script("linear_cross_entropy").main(["--smoke", "--device", "cpu", "--no-inductor",
                                                          "--out", str(out)])
    rows = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}
    assert code == 0 and set(rows) == {"eager", "passline", "passline+lce", "passline+lce-recompute"}, rows
    assert rows["passline+lce"]["fused"] == rows["passline+lce-recompute"]["fused"] == 1
    assert rows["passline"]["fused"] == 0
    assert all(r["passed"] for r in rows.values())


def test_a_frozen_head_and_a_gradient_not_computed():
    """Gradients with the loss are computed for the inputs autograd will differentiate, as dynamo saw them;
    a gradient asked for that was not computed is an error, never a zero."""
    x, t = _leaf(2, 7, HIDDEN), _targets(2, 7)
    w = _leaf(VOCAB, HIDDEN, scale=0.5).detach()  # a frozen head
    be = assert_matches_eager(lambda x, w, t: F.cross_entropy(F.linear(x, w).view(-1, VOCAB), t.view(-1)),
                              [x, w, t], pipeline=PIPELINE, codegen="reference")
    (op,) = [n for n in be.reports[0].gm.graph.nodes if "with_grads" in str(n.target)]
    assert op.args[-3:] == (True, False, False)  # need x, not the weight nor a bias
    loss = torch.ops.passline.linear_cross_entropy_with_grads(x.view(-1, HIDDEN), w.requires_grad_(), None,
                                                              t.view(-1), -100, 0.0, "mean", True, 4,
                                                              True, False, False)[0]
    with pytest.raises(RuntimeError, match="gradient of input 1 was not computed"):
        loss.backward()
