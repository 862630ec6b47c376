"""Probe one norm case on the GPU: passline's kernels with the autotuner's timing of every configuration,
next to Inductor's generated code and time, for the forward and the backward.

    python benchmarks/norm_probe.py [--norm layer_norm|rms_norm] [--shape 576000x384] [--dtype bfloat16]
                                    [--splits 0,1024] [--out DIR]

For each split size of the mix-order reduction (0 = the pass's automatic choice) it prints the
backward's time, each passline kernel's chosen configuration and the autotuner's timings (with registers
and spills), then Inductor's forward and backward times. With --out it writes passline's kernel sources
and Inductor's generated code there, to read side by side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import RMSNorm  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import passline  # noqa: E402


def timed(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def make(norm: str, n: int, dtype):
    if norm == "layer_norm":
        return torch.nn.LayerNorm(n, device="cuda", dtype=dtype)
    return RMSNorm(n, dtype, "cuda")


def kernels(report) -> list:
    return [(k.name[:40], k.kind, k.chosen, k.blocks,
             {c: round(v * 1e3, 4) if isinstance(v, float) else v for c, v in k.timings.items()})
            for k in report.kernel_info]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--norm", default="layer_norm")
    ap.add_argument("--shape", default="576000x384")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--splits", default="0")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch._functorch.config.donated_buffer = False
    m, n = map(int, a.shape.split("x"))
    dtype = getattr(torch, a.dtype)
    es = torch.tensor([], dtype=dtype).element_size()
    out = Path(a.out) if a.out else None
    mod = make(a.norm, n, dtype)
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    tag = f"{a.norm}_{a.shape}_{a.dtype}"
    print(f"== {tag}")

    for split in map(int, a.splits.split(",")):
        torch._dynamo.reset()
        pipe = passline.DEFAULT_PIPELINE
        if split:
            pipe = pipe.replace("mix_order_reduction", f"mix_order_reduction(split_rows={split})")
        be = passline.backend(pipe)
        f = torch.compile(mod, backend=be)
        with torch.no_grad():
            f(x)
        fwd_report = be.reports[-1]
        t_fwd = timed(lambda f=f: f(x))  # in training mode: the forward that saves for backward
        with torch.no_grad():
            t_inf = timed(lambda f=f: f(x))
        y = f(x)
        dy = torch.randn_like(y)
        t_bwd = timed(lambda y=y, dy=dy: torch.autograd.grad(y, [x], dy, retain_graph=True))
        bwd_report = be.reports[-1]
        print(f"passline split={split}: inference fwd {t_inf:.3f} ms ({2 * m * n * es / t_inf / 1e6:.0f} GB/s), "
              f"training fwd {t_fwd:.3f} ms, bwd {t_bwd:.3f} ms ({3 * m * n * es / t_bwd / 1e6:.0f} GB/s)")
        for name, report in (("inference", fwd_report), ("backward", bwd_report)):
            for k in kernels(report):
                print(f"   {name}: {k}")
            if out:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"passline_{tag}_{name}_split{split}.py").write_text(
                    "\n\n".join(f"# {k.name} chosen={k.chosen} {k.blocks}\n{k.source}" for k in report.kernel_info))

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    g = torch.compile(mod)
    with torch.no_grad():
        _, code_inf = run_and_get_code(g, x)
        t_inf = timed(lambda: g(x))
    dy = torch.randn_like(x)
    # forward with grad and backward in one capture (the backward may be compiled with the forward or
    # lazily at its first call)
    _, code_bwd = run_and_get_code(lambda: torch.autograd.grad(g(x), [x], dy))
    y = g(x)
    t_bwd = timed(lambda: torch.autograd.grad(y, [x], dy, retain_graph=True))
    print(f"inductor: inference fwd {t_inf:.3f} ms ({2 * m * n * es / t_inf / 1e6:.0f} GB/s), "
          f"bwd {t_bwd:.3f} ms ({3 * m * n * es / t_bwd / 1e6:.0f} GB/s)")
    if out:
        (out / f"inductor_{tag}_inference.py").write_text("\n\n".join(code_inf))
        (out / f"inductor_{tag}_backward.py").write_text("\n\n".join(code_bwd))


if __name__ == "__main__":
    main()
