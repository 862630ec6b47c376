"""Probe the mix-order kernel of LayerNorm/RMSNorm backward: backward time for several split sizes,
and the autotuner's timings of each block configuration.

    python benchmarks/mix_probe.py [--shape 576000x384] [--dtype bfloat16] [--splits 0,256,2250,4500]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import passline  # noqa: E402
from triton.testing import do_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="576000x384")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--splits", default="0,256,2250,4500")
    ap.add_argument("--norm", default="layer_norm")
    a = ap.parse_args()
    torch._functorch.config.donated_buffer = False
    m, n = map(int, a.shape.split("x"))
    for dt in a.dtypes.split(","):
        dtype = getattr(torch, dt)
        mod = torch.nn.LayerNorm(n, device="cuda", dtype=dtype)
        x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
        for split in map(int, a.splits.split(",")):
            torch._dynamo.reset()
            pipe = passline.DEFAULT_PIPELINE.replace("mix_order_reduction", f"mix_order_reduction(split_rows={split})")
            be = passline.backend(pipe)
            f = torch.compile(mod, backend=be)
            y = f(x)
            dy = torch.randn_like(y)
            t = do_bench(lambda: torch.autograd.grad(y, [x], dy, retain_graph=True), warmup=25, rep=200,
                         return_mode="median")
            bwd = be.reports[-1]
            ks = [(k.name[:30], k.kind, k.chosen, k.blocks, {c: round(v, 4) if isinstance(v, float) else v
                                                          for c, v in k.timings.items()}) for k in bwd.kernel_info]
            print(f"{dt} split={split} bwd {t:.3f} ms  {3 * m * n * x.element_size() / t / 1e6:.0f} GB/s")
            for k in ks:
                print("   ", k)


if __name__ == "__main__":
    main()
