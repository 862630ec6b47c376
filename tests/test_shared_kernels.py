"""A model's repeated layers launch one kernel per distinct code (TritonRunner._kernel): compiled, timed and
loaded once, with each step passing its own buffers."""
import attrs
import pytest
import torch

import passline
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.runner import Kernel, TritonRunner, _anonymous


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return x + self.norm(torch.nn.functional.gelu(self.lin(x)))


def _layers(n=4, d=24):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(d) for _ in range(n)])


def kernel_steps(report) -> int:
    return sum(1 if kind == "kernel" else 2 for kind, _, _ in report.runner.steps if kind in ("kernel", "mix"))


def test_repeated_layers_share_kernels_and_train_as_eager():
    model = _layers()
    ref = _layers()
    x = torch.randn(6, 10, 24, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    be = passline.backend(codegen="triton", fallback="raise")
    torch._dynamo.reset()
    out = torch.compile(model, backend=be)(x)
    out.square().mean().backward()
    ref(xr).square().mean().backward()
    torch.testing.assert_close(out, ref(xr.detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    for r in be.reports:  # forward and backward: the middle layers' kernels are the first's
        shared = r.metrics.counters["kernels_shared"]
        assert shared >= 2, r.name
        assert len(r.runner.kernels) + shared == kernel_steps(r)
        assert sum(len(k.shared) for k in r.runner.kernels) == shared


def test_kernels_differing_in_a_pointer_dtype_stay_apart(tmp_path, monkeypatch):
    """The code does not show a loaded pointer's dtype, which Triton compiles a binary for: the key does."""
    be = passline.backend(codegen="reference", fallback="raise", pipeline="dce")
    torch._dynamo.reset()
    torch.compile(lambda a, b: (torch.isnan(a), torch.isnan(b)), backend=be)(torch.randn(8, 16), torch.randn(8, 16))
    monkeypatch.setattr(TritonRunner, "precompile", lambda self: None)
    runner = TritonRunner(be.reports[0].graph, interpret=False, cache=KernelCache(tmp_path))
    assert len(runner.kernels) == 1 and runner.counters["kernels_shared"] == 1  # one code, one dtype
    info = runner.kernels[0]
    src = next(iter(info.variants.values()))
    traffic = info.bytes

    def key():
        return runner._same_code("pointwise", Kernel, info.variants, {}, True, False, traffic, None, {})

    before = key()
    loaded = src.args[0][1]
    lay = runner.buffers[loaded].layout
    runner.buffers = {**runner.buffers, loaded: attrs.evolve(runner.buffers[loaded],
                                                             layout=attrs.evolve(lay, dtype=torch.float64))}
    assert key() != before


def test_anonymous_code_ignores_the_names_only():
    be = passline.backend(codegen="triton", fallback="raise", pipeline="dce")
    torch._dynamo.reset()
    a = torch.randn(8, 16)
    out = torch.compile(lambda a, b: (a.sin() * 2, b.sin() * 2, b.cos() * 2), backend=be)(a, a + 1)
    torch.testing.assert_close(out[0], a.sin() * 2)
    torch.testing.assert_close(out[1], (a + 1).sin() * 2)
    torch.testing.assert_close(out[2], (a + 1).cos() * 2)
    runner = be.reports[0].runner
    codes = [_anonymous(next(iter(k.variants.values()))) for k in runner.kernels]
    assert len(codes) == len(set(codes))  # the sines are one kernel; the cosine is another
    assert any("sin" in c for c in codes) and any("cos" in c for c in codes)
    assert runner.counters["kernels_shared"] >= 1


@pytest.mark.parametrize("n", [9, 10, 11])
def test_numbers_in_names_sort_by_value(n):
    from passline.backends.triton.kernel import _natural

    names = [f"buf{i}" for i in (n, 2 * n, 1)] + ["arg0_1", "addmm"]
    assert sorted(names, key=_natural) == ["addmm", "arg0_1", "buf1", f"buf{n}", f"buf{2 * n}"]
