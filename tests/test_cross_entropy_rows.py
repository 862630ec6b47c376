"""passline/ops/cross_entropy_rows.py: the chunk kernel of passline::linear_cross_entropy (issue 16, part 4).

The kernel (Triton's interpreter here) against F.cross_entropy and against its aten path, row by row; the
three ops against `F.cross_entropy(F.linear(x, w, b), target, ...)` forward and `loss.backward()` in
float32 and bfloat16, every reduction, ignore_index (all rows ignored too), label smoothing, bias, odd
vocabularies, chunks that do not divide the rows, several column blocks a row; the kernel compiled for
sm_90."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from passline.ops import cross_entropy_rows as rows_mod
from passline.ops.linear_cross_entropy import default_chunk_rows

pytestmark = pytest.mark.skipif(rows_mod.implementation(torch.empty(1, 1)) != "triton",
                                reason="the kernel runs on the CPU under TRITON_INTERPRET=1 only")


def _rel(got, exact) -> float:
    got, exact = got.double(), exact.double()
    return float((got - exact).norm() / exact.norm().clamp_min(1e-30))


def _close(got, eager, exact, what: str):
    """got within max(2 x eager's error, a floor) of the float64 result (NaN where it is NaN)."""
    if exact.isnan().any():
        assert torch.equal(got.isnan(), exact.isnan()), what
        keep = ~exact.isnan()
        got, eager, exact = got[keep], eager[keep], exact[keep]
    if exact.numel() == 0 or exact.abs().max() == 0:
        assert got.abs().max() == 0 if got.numel() else True, what
        return
    floor = 1e-5 if got.dtype == torch.float32 else 5e-3
    err, bound = _rel(got, exact), max(2 * _rel(eager, exact), floor)
    assert err <= bound, f"{what}: relative error {err:.2e} > {bound:.2e}"


# -- the kernel, row by row -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("vocab,block", [(257, 64), (1031, 128), (1000, None), (50, 16)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_rows_match_cross_entropy_and_the_aten_path(dtype, vocab, block, eps):
    gen = torch.Generator().manual_seed(vocab)
    n = 9
    z = (torch.randn(n, vocab, generator=gen) * 4).to(dtype)
    t = torch.randint(0, vocab, (n,), generator=gen)
    t[[2, 5]] = -1
    scale = torch.rand(n, generator=gen) + 0.5  # a per-row loss's gradient
    zr = z.double().requires_grad_()
    expected = F.cross_entropy(zr, t, reduction="none", ignore_index=-1, label_smoothing=eps)
    (expected * scale.double()).sum().backward()
    results = {}
    for mode in ("triton", "aten"):
        for per_row in (True, False):
            got, losses = z.clone(), torch.full((n,), float("nan"))
            s = scale if per_row else scale[:1]
            with rows_mod.use(mode, block):
                rows_mod.rows(got, t, -1, eps, losses=losses, scale=s)
            want = zr.grad if per_row else zr.grad / scale.double().unsqueeze(1) * scale[0].double()
            torch.testing.assert_close(losses.double(), expected.detach(), atol=2e-5, rtol=2e-5)
            half_ulp = 0 if dtype == torch.float32 else torch.finfo(dtype).eps / 2  # rounded once, to nearest
            torch.testing.assert_close(got.double(), want.to(dtype).double(), atol=2e-6, rtol=half_ulp + 1e-5)
            results[mode, per_row] = losses, got
    # the loss alone (a forward), the gradient alone (a backward): each part as with both
    for mode in ("triton", "aten"):
        only_loss, untouched = torch.empty(n), z.clone()
        only_grad = z.clone()
        with rows_mod.use(mode, block):
            rows_mod.rows(untouched, t, -1, eps, losses=only_loss)
            rows_mod.rows(only_grad, t, -1, eps, scale=scale)
        assert torch.equal(untouched, z) and torch.equal(only_loss, results[mode, True][0])
        assert torch.equal(only_grad, results[mode, True][1])


def test_rows_ignored_out_of_range_and_extreme_logits():
    z = torch.tensor([[0.0, 1.0, 2.0], [1e4, -1e4, 0.0], [5.0, 5.0, 5.0], [1.0, 2.0, 3.0]])
    t = torch.tensor([7, 0, -100, 2])  # out of range, a huge margin, ignored, plain
    losses, got = torch.empty(4), z.clone()
    rows_mod.rows(got, t, -100, 0.0, losses=losses, scale=torch.ones(1))
    assert losses[0].isnan() and got[0].isnan().all()  # eager asserts on the device; never a wild read
    assert losses[1] == 0 and torch.equal(got[1], torch.zeros(3))
    assert losses[2] == 0 and torch.equal(got[2], torch.zeros(3))
    torch.testing.assert_close(losses[3], F.cross_entropy(z[3:], t[3:]))


def test_the_kernel_compiles_for_sm90(tmp_path):
    """Every variant (dtype, loss, gradient, smoothing) compiles for an H100/H200 on this machine, with 16-byte
    loads and stores where the row is aligned. A fresh process without TRITON_INTERPRET (see
    tests/test_indexing.py: Triton's helpers are the interpreter's in this one)."""
    script = tmp_path / "compile.py"
    script.write_text("""
import itertools, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from passline.ops import cross_entropy_rows as R
out = {}
kernel = R._kernel(False)
for dt, loss, grad, smooth in itertools.product(("bf16", "fp16", "fp32"), (True, False), (True, False), (True, False)):
    if not (loss or grad):
        continue
    sig = {"z_ptr": "*" + dt, "z_stride": "i32", "target_ptr": "*i64", "loss_ptr": "*fp32", "scale_ptr": "*fp32",
           "scale_stride": "i32", "ignore_index": "i32", "eps": "fp32", "VOCAB": "constexpr", "HAS_LOSS": "constexpr",
           "HAS_GRAD": "constexpr", "SMOOTH": "constexpr", "BLOCK": "constexpr", "ROUND_BF16": "constexpr"}
    try:
        c = triton.compile(ASTSource(kernel, signature=sig, constexprs={"VOCAB": 128256, "HAS_LOSS": loss,
                                                                        "HAS_GRAD": grad, "SMOOTH": smooth,
                                                                        "BLOCK": 4096, "ROUND_BF16": False},
                                     attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4)}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": R.WARPS})
    except RuntimeError as e:  # no CUDA toolchain in this Triton build
        print(json.dumps({"skip": str(e)}))
        raise SystemExit(0)
    words = {w for line in c.asm["ptx"].splitlines() for w in line.split()}
    out[f"{dt} {loss} {grad} {smooth}"] = [("ld.global.v4.b32" in words), ("st.global.v4.b32" in words) or not grad]
print(json.dumps(out))
""")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(rows_mod.__file__)))
    env["PYTHONPATH"] = os.path.dirname(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"Triton cannot compile for CUDA here: {result['skip']}")
    assert len(result) == 18 and all(all(v) for v in result.values()), result


# -- the ops against eager --------------------------------------------------------------------------------
ROWS, HIDDEN = 13, 16
# (dtype, vocab, chunk rows, reduction, ignore, label smoothing, bias, upcast, op, column block):
# every option in both dtypes, odd vocabularies, chunks of 4 and 5 over 13 rows (a short last one), the
# rule's chunks (one), several column blocks a row
CASES = [
    (torch.float32, 257, 4, "mean", "some", 0.0, False, True, "plain", None),
    (torch.float32, 257, 5, "sum", "some", 0.1, True, True, "with_grads", 64),
    (torch.float32, 1031, 4, "none", "some", 0.0, True, True, "plain", 128),
    (torch.float32, 1031, 0, "mean", "all", 0.1, False, True, "with_grads", None),
    (torch.float32, 1000, 5, "mean", "none", 0.2, True, True, "plain", 256),
    (torch.float32, 1000, 4, "sum", "all", 0.0, False, True, "plain", None),
    (torch.float32, 257, 5, "none", "all", 0.1, False, True, "plain", None),
    (torch.float32, 1031, 5, "mean", "some", 0.0, True, True, "with_grads", 128),
    (torch.bfloat16, 257, 4, "mean", "some", 0.0, False, True, "with_grads", 64),
    (torch.bfloat16, 257, 5, "sum", "some", 0.1, True, False, "plain", None),
    (torch.bfloat16, 1031, 4, "none", "some", 0.1, False, True, "plain", 128),
    (torch.bfloat16, 1031, 5, "mean", "all", 0.0, True, False, "with_grads", None),
    (torch.bfloat16, 1000, 0, "mean", "none", 0.1, False, True, "plain", 256),
    (torch.bfloat16, 1000, 5, "sum", "some", 0.0, True, True, "with_grads", None),
    (torch.bfloat16, 257, 4, "none", "some", 0.0, True, False, "plain", None),
    (torch.bfloat16, 1031, 4, "mean", "some", 0.1, False, False, "plain", 128),
    (torch.bfloat16, 1000, 4, "sum", "all", 0.1, False, True, "with_grads", None),
]


def _inputs(dtype, vocab, ignore, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, HIDDEN, generator=gen).to(dtype)
    w = (torch.randn(vocab, HIDDEN, generator=gen) * 0.5).to(dtype)
    b = torch.randn(vocab, generator=gen).to(dtype) if bias else None
    t = torch.randint(0, vocab, (ROWS,), generator=gen)
    if ignore == "some":
        t[::4] = -1
    elif ignore == "all":
        t[:] = -1
    return x, w, b, t


def _eager(x, w, b, t, reduction, eps, upcast, grad, dtype=None):
    """loss and (dx, dw, db) of eager's F.cross_entropy(F.linear(...)) on leaves in `dtype`."""
    leaves = [v.detach().to(dtype or v.dtype).clone().requires_grad_() if v is not None else None
              for v in (x, w, b)]
    z = F.linear(*[v for v in leaves if v is not None]) if b is None else F.linear(*leaves)
    loss = F.cross_entropy(z.float() if upcast else z, t, ignore_index=-1, reduction=reduction, label_smoothing=eps)
    loss.backward(grad.to(loss.dtype))
    return loss.detach(), [None if v is None else v.grad for v in leaves]


@pytest.mark.parametrize("dtype,vocab,chunk,reduction,ignore,eps,bias,upcast,op,block", CASES,
                         ids=[f"{str(c[0])[6:]}-V{c[1]}-c{c[2]}-{c[3]}-{c[4]}-eps{c[5]}-{'b' if c[6] else 'nob'}-"
                              f"{'up' if c[7] else 'noup'}-{c[8]}-blk{c[9]}" for c in CASES])
def test_ops_match_eager(dtype, vocab, chunk, reduction, ignore, eps, bias, upcast, op, block):
    x, w, b, t = _inputs(dtype, vocab, ignore, bias)
    gen = torch.Generator().manual_seed(7)
    grad = torch.rand(ROWS if reduction == "none" else (), generator=gen) + 0.5
    if reduction != "none":
        grad = torch.tensor(0.75)  # the with_grads op's backward scales what the forward computed
    eager_loss, eager_grads = _eager(x, w, b, t, reduction, eps, upcast, grad)
    exact_loss, exact_grads = _eager(x, w, b, t, reduction, eps, upcast, grad.double(), torch.float64)
    results = {}
    for mode in ("triton", "aten"):
        leaves = [v.detach().clone().requires_grad_() if v is not None else None for v in (x, w, b)]
        with rows_mod.use(mode, block):
            if op == "plain":
                loss = torch.ops.passline.linear_cross_entropy(*leaves, t, -1, eps, reduction, upcast, chunk)
            else:
                loss = torch.ops.passline.linear_cross_entropy_with_grads(*leaves, t, -1, eps, reduction, upcast,
                                                                          chunk, True, True, bias)[0]
            loss.backward(grad.to(loss.dtype))
        assert loss.dtype == (torch.float32 if upcast else dtype) == eager_loss.dtype
        got_grads = [None if v is None else v.grad for v in leaves]
        _close(loss.detach(), eager_loss, exact_loss, f"{mode} loss")
        for name, g, e, ex in zip("xwb", got_grads, eager_grads, exact_grads):
            if name == "b" and not bias:
                continue
            assert g.dtype == e.dtype and g.shape == e.shape, name
            _close(g, e, ex, f"{mode} d{name}")
        results[mode] = loss.detach(), got_grads
    # the kernel and the aten path (the oracle) agree closely
    (kl, kg), (al, ag) = results["triton"], results["aten"]
    torch.testing.assert_close(kl, al, equal_nan=True, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 1e-2)
    for k, a in zip(kg, ag):
        if k is not None:
            torch.testing.assert_close(k, a, atol=1e-5 if dtype == torch.float32 else 2e-3,
                                       rtol=1e-4 if dtype == torch.float32 else 2e-2)


def test_all_ignored_is_nan_for_a_mean_and_gives_zero_gradients():
    x, w, b, t = _inputs(torch.float32, 257, "all", False)
    for op in ("plain", "with_grads"):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        if op == "plain":
            loss = torch.ops.passline.linear_cross_entropy(xr, wr, None, t, -1, 0.0, "mean", True, 4)
        else:
            loss = torch.ops.passline.linear_cross_entropy_with_grads(xr, wr, None, t, -1, 0.0, "mean", True, 4,
                                                                      True, True, False)[0]
        loss.backward()
        assert loss.isnan() and F.cross_entropy(x @ w.T, t, ignore_index=-1).isnan()
        assert torch.equal(xr.grad, torch.zeros_like(x)) and torch.equal(wr.grad, torch.zeros_like(w))


def test_no_rows():
    x, w, t = torch.randn(0, HIDDEN), torch.randn(257, HIDDEN, requires_grad=True), torch.zeros(0, dtype=torch.long)
    loss = torch.ops.passline.linear_cross_entropy_with_grads(x, w, None, t, -1, 0.0, "sum", True, 0, False, True,
                                                              False)[0]
    loss.backward()
    assert loss == 0 and torch.equal(w.grad, torch.zeros_like(w))


def test_the_chunk_rule_at_the_benchmark_shape():
    """8 x 1024 tokens, hidden 768, vocabulary 128256: chunks of 768 rows, whose bfloat16 logits are the
    size of the weight (see the module docstring's peak)."""
    assert default_chunk_rows(8192, 768, 128256) == 768
    assert default_chunk_rows(8192, 768, 50257) == 768
