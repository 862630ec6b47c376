"""End-to-end: real forward/backward graphs through passline match eager PyTorch."""
import pytest
import torch

import passline
from passline.ir import Extern, Reduction
from passline.testing import assert_matches_eager


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


def layer_norm():
    ln = torch.nn.LayerNorm(32)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    return ln


MODELS = {
    "layer_norm": layer_norm,
    "rms_norm": lambda: RMSNorm(32),
    "softmax": lambda: (lambda x: torch.softmax(x, -1)),
    "log_softmax": lambda: (lambda x: torch.log_softmax(x, -1)),
    "gelu_mlp": mlp,
}


def inputs(kind: str, dtype: torch.dtype):
    torch.manual_seed(0)
    if kind == "contiguous":
        x = torch.randn(16, 32)
    elif kind == "transposed":
        x = torch.randn(32, 16).t()
    elif kind == "sliced":
        x = torch.randn(20, 70)[2:18, 5:69:2]
    elif kind == "broadcast":
        x = torch.randn(1, 32).expand(16, 32)
    return x.to(dtype).requires_grad_()


def model(name, dtype):
    m = MODELS[name]()
    return m.to(dtype) if isinstance(m, torch.nn.Module) else m


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "broadcast"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_float32(name, layout):
    be = assert_matches_eager(model(name, torch.float32), [inputs(layout, torch.float32)])
    assert {r.name.rstrip("0123456789") for r in be.reports} == {"forward", "backward"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_bfloat16(name):
    assert_matches_eager(model(name, torch.bfloat16), [inputs("contiguous", torch.bfloat16)])


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_norms_and_softmax_lower_natively(name):
    be = assert_matches_eager(model(name, torch.float32), [inputs("contiguous", torch.float32)])
    for report in be.reports:
        nodes = report.graph.leaf_nodes()
        assert any(isinstance(n, Reduction) for n in nodes), report.graph.format()
        assert not [n for n in nodes if isinstance(n, Extern)], report.graph.format()


def test_mlp_only_matmuls_are_extern():
    be = assert_matches_eager(model("gelu_mlp", torch.float32), [inputs("contiguous", torch.float32)])
    ops = {str(n.op) for r in be.reports for n in r.graph.leaf_nodes() if isinstance(n, Extern)}
    assert ops and ops <= {"aten.mm.default", "aten.addmm.default"}, ops


def test_last_report_has_graph_kernels_passes():
    assert_matches_eager(torch.nn.LayerNorm(32), [torch.randn(4, 32)])
    report = passline.last_report()
    assert report.kernels == len(report.graph) > 0
    default = passline.Pipeline.parse(passline.DEFAULT_PIPELINE)
    assert {p.name for p in report.passes} == {c.name for c in default.calls()}
