"""A channels_last conv -> BatchNorm -> ReLU training step with and without split_reductions.

    python benchmarks/split_reductions.py                   # GPU: ResNet's first stage, 128 x 64 x 56 x 56
    python benchmarks/split_reductions.py --batch 128 --channels 64 --size 56 --dtype float32
    TRITON_INTERPRET=1 python benchmarks/split_reductions.py --device cpu --batch 2 --size 8   # a smoke run

For each pipeline: the step's time (triton.testing.do_bench on a GPU, median ms; one timed step on the
CPU), the reductions whose kernels were split, and every reduction kernel's programs as the Triton rule
launches them (configs.rule on this device), so the idle-GPU problem and its fix show side by side.
Results are checked against eager before timing.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
from bench_common import errors, grads  # benchmarks/ is the script's directory

import passline

WITHOUT = passline.DEFAULT_PIPELINE.replace(", split_reductions", "")


def block(channels: int, dtype, device):
    m = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                            torch.nn.BatchNorm2d(channels), torch.nn.ReLU())
    return m.to(device=device, dtype=dtype, memory_format=torch.channels_last)


def reduction_programs(be) -> list:
    """(kernel, programs) of every reduction kernel under the Triton rule."""
    from passline.backends.triton.configs import Device, Variant, rule
    from passline.backends.triton.kernel import rows_contiguous
    from passline.ir import FusedNode, MixOrderNode, Reduction

    device = Device.current()
    out = []
    for r in be.reports:
        for n in r.graph.nodes():
            if isinstance(n, MixOrderNode) or not isinstance(n, (Reduction, FusedNode)) or not \
                    getattr(n, "reduction_ranges", ()):
                continue
            x, red = int(n.numel), int(n.reduction_numel)
            cfg = rule({Variant.PERSISTENT: None, Variant.LOOPED: None}, x, red, False, device, rows_contiguous(n))
            out.append((f"{r.name}:{n.name}", -(-x // cfg.xblock)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    m = block(args.channels, dtype, args.device)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=args.device, dtype=dtype)
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    # float64 reference on the same (dtype-rounded) weights and input, given the same cotangent
    reference = grads(copy.deepcopy(m).double(), [x.detach().double().requires_grad_()], dy_dtype=dtype)
    names = ["out", "x.grad"] + [f"param{k}.grad" for k in range(len(list(m.parameters())))]
    eager_err = dict(zip(names, errors(*grads(m, [x]), reference)))
    for name, pipeline in (("without split_reductions", WITHOUT), ("default (split_reductions)", None)):
        be = passline.backend(pipeline=pipeline, fallback="raise")
        step = torch.compile(m, backend=be)
        # checked first against a float64 run: a sum over N*H*W (400k) elements differs from eager's by
        # its order alone more than an elementwise tolerance allows, so errors are compared with eager's
        err = dict(zip(names, errors(*grads(step, [x]), reference)))
        bad = [k for k in err if err[k] > max(1e-4 if dtype == torch.float32 else 1e-2, 4 * eager_err[k])]
        if bad:
            raise SystemExit(f"{name}: {bad[0]} rel. error {err[bad[0]]:.2e} (eager {eager_err[bad[0]]:.2e})")
        print(f"{name}: worst rel. error {max(err.values()):.1e} (eager {max(eager_err.values()):.1e})")

        def train(step=step):
            m.zero_grad(set_to_none=True)
            step(x).float().sum().backward()

        train()
        if args.device == "cuda":
            from triton.testing import do_bench

            ms = do_bench(train, warmup=100, rep=500)
        else:
            t0 = time.perf_counter()
            train()
            ms = (time.perf_counter() - t0) * 1e3
        split = sum(p.stats.get("num_split_reductions", 0) for r in be.reports for p in r.passes)
        print(f"{name:28s} {ms:9.3f} ms/step, {split} reductions split")
        for kernel, programs in reduction_programs(be):
            print(f"    {kernel:40s} {programs:6d} programs")


if __name__ == "__main__":
    main()
