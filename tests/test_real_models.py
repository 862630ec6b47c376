"""Real models through torch.compile with passline: one training step forward and backward, matching
eager; buffers (BatchNorm running stats) updated like eager; dynamic shapes; the backend by name."""
import copy
import subprocess
import sys
import textwrap

import pytest
import torch

import passline
from passline.testing import tolerance


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax((q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5, -1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class TransformerBlock(torch.nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class SwiGLUBlock(torch.nn.Module):
    def __init__(self, d=32, hidden=64):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up = torch.nn.Linear(d, hidden, bias=False), torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def training_step(model, x):
    """One step: forward, loss, backward, SGD update; returns the loss and the updated parameters."""
    out = model(x)
    loss = out.float().square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return loss.detach(), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make", [lambda: TransformerBlock(), lambda: SwiGLUBlock()], ids=["transformer", "swiglu"])
def test_training_step_matches_eager(make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 8, 32)
    eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    compiled = torch.compile(compiled_model, backend=be)
    loss_c, params_c = training_step(compiled, x)
    loss_e, params_e = training_step(eager_model, x)
    torch.testing.assert_close(loss_c, loss_e, **tolerance(torch.float32))
    for a, b in zip(params_c, params_e):
        torch.testing.assert_close(a, b, **tolerance(torch.float32))
    kinds = {r.name.rstrip("0123456789") for r in be.reports}
    assert kinds == {"forward", "backward"}
    assert all(r.kernels > 0 for r in be.reports)


def test_conv_batchnorm_relu_updates_running_stats_like_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(4, 3, 8, 8)
    eager_model, compiled_model = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend=passline.backend(fallback="raise"))
    loss_c, params_c = training_step(compiled, x)
    loss_e, params_e = training_step(eager_model, x)
    torch.testing.assert_close(loss_c, loss_e, **tolerance(torch.float32))
    for a, b in zip(params_c, params_e):
        torch.testing.assert_close(a, b, **tolerance(torch.float32))
    bn_c, bn_e = compiled_model[1], eager_model[1]
    torch.testing.assert_close(bn_c.running_mean, bn_e.running_mean, **tolerance(torch.float32))
    torch.testing.assert_close(bn_c.running_var, bn_e.running_var, **tolerance(torch.float32))
    assert int(bn_c.num_batches_tracked) == int(bn_e.num_batches_tracked) == 1


def test_in_place_ops_on_inputs_write_back():
    def fn(x, y):
        x.add_(1)
        y.mul_(2)
        return x * y

    x, y = torch.randn(5), torch.randn(5)
    xe, ye = x.clone(), y.clone()
    torch._dynamo.reset()
    out = torch.compile(fn, backend=passline.backend(fallback="raise"))(x, y)
    torch.testing.assert_close(out, fn(xe, ye))
    torch.testing.assert_close(x, xe)
    torch.testing.assert_close(y, ye)


def test_dynamic_shapes_compile_once():
    fn = lambda x, w: torch.softmax(x @ w, -1).sum(0) + torch.nn.functional.layer_norm(x, (16,)).mean(0)
    w = torch.randn(16, 16)
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for batch in (3, 7, 12):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x, w), fn(x, w), **tolerance(torch.float32))
    assert len(be.reports) == 1, [r.name for r in be.reports]
    sizes = {str(s) for n in be.reports[0].graph.leaf_nodes() for s in getattr(n, "ranges", ())}
    assert any(not s.isdigit() for s in sizes), sizes  # the batch is a symbol in the IR


def test_backend_by_name_in_a_fresh_process():
    code = textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="passline")
        x = torch.randn(4, 8)
        torch.testing.assert_close(f(x), torch.softmax(x * 2, -1))
        import passline
        print("compiled by", passline.last_report().codegen)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled by" in proc.stdout


def test_fallback_runs_a_failing_graph_eagerly_or_raises():
    @passline.register_pass("t_explodes", replace=True)
    def t_explodes(graph, ctx):
        raise RuntimeError("boom")

    try:
        fn = lambda x: (x * 2).exp()
        x = torch.randn(4)
        torch._dynamo.reset()
        be = passline.backend("t_explodes", fallback="eager")
        with pytest.warns(UserWarning, match="runs it eagerly.*boom"):
            out = torch.compile(fn, backend=be)(x)
        torch.testing.assert_close(out, fn(x))
        assert be.failures and be.failures[0][0] == "inference"
        torch._dynamo.reset()
        with pytest.raises(Exception, match="boom"):
            torch.compile(fn, backend=passline.backend("t_explodes", fallback="raise"))(x)
    finally:
        passline.unregister_pass("t_explodes")
