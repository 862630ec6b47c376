"""Modules shared by the test files."""
import importlib.util
from pathlib import Path

import torch

import passline

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# the default pipeline with whole rows mixed however few (mix_order_reduction's fill_sms off): as on the CPU, on
# a GPU run too (PASSLINE_TEST_DEVICE=cuda), for tests of mixing at small sizes
MIXED = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", "mix_order_reduction(fill_sms=false)")


def benchmark_script(name: str):
    """benchmarks/<name>.py imported as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class RMSNorm(torch.nn.Module):
    """RMSNorm in the input's own dtype (no upcast), weight away from zero."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
