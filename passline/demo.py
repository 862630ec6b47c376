"""`make demo`: compile LayerNorm and a GELU MLP, forward and backward, print the scheduler graphs
and confirm the results match eager PyTorch."""
from __future__ import annotations

import torch

import passline
from passline.testing import assert_matches_eager


def main() -> None:
    torch.manual_seed(0)
    cases = {
        "LayerNorm(64)": (torch.nn.LayerNorm(64), [torch.randn(128, 64, requires_grad=True)]),
        "MLP Linear→GELU→Linear": (
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)),
            [torch.randn(128, 64, requires_grad=True)]),
    }
    for title, (model, inputs) in cases.items():
        print(f"=== {title} ===")
        be = assert_matches_eager(model, inputs)  # raises if any output or gradient differs
        for report in be.reports:
            print(f"--- {report.summary()}")
            print(report.graph.format())
        print(f"✓ {title}: forward and backward match eager PyTorch\n")
    print(f"passline {passline.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
