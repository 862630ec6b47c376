"""Odd sizes, hand-written: what the aligned loop and whole blocks (docs/backends.md, *Odd widths: whole blocks and
aligned loops*) gain over loading one element at a time, against Inductor, in one process.

    python benchmarks/odd_widths.py            # CUDA: every form at several chunks and warps, timed (do_bench, µs)
    python benchmarks/odd_widths.py --check    # any machine (the interpreter on a CPU): small sizes, checked only

A LayerNorm forward over rows not on 16-byte boundaries (2671 x 50257 bfloat16, ...), written as passline wrote it
before (`ln_scalar`: `p + W * row + q`, masked by `q < W`) and as the aligned loop writes it (`ln_aligned`: chunks
of the flat buffer from the 16-element boundary at or before the row, inside chunks unmasked); a bias + GELU over an
odd element count, masked throughout (`gelu_masked`) and with whole blocks unmasked (`gelu_split`). Aligned widths
(50264) are timed too: there the plain forms load vectors already. Each result is checked against torch; the
kernels are the design's probes, passline's own are generated (kernel.py) and timed by sweep.py.
"""
import sys

import torch
import triton
import triton.language as tl

GPU = torch.cuda.is_available() and "--check" not in sys.argv
dev = "cuda" if GPU else "cpu"


@triton.jit
def ln_scalar(X, Wt, B, Y, N: tl.constexpr, RB: tl.constexpr):
    row = tl.program_id(0)
    xr = X + row * N
    yr = Y + row * N
    acc = tl.zeros([RB], tl.float32)
    for off in range(0, N, RB):
        c = off + tl.arange(0, RB)
        acc += tl.load(xr + c, c < N, other=0).to(tl.float32)
    mean = tl.sum(acc, 0) / N
    acc2 = tl.zeros([RB], tl.float32)
    for off in range(0, N, RB):
        c = off + tl.arange(0, RB)
        d = tl.where(c < N, tl.load(xr + c, c < N, other=0).to(tl.float32) - mean, 0)
        acc2 += d * d
    rstd = tl.rsqrt(tl.sum(acc2, 0) / N + 1e-5)
    for off in range(0, N, RB):
        c = off + tl.arange(0, RB)
        m = c < N
        x = tl.load(xr + c, m, other=0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(Wt + c, m, other=0).to(tl.float32)
        b = tl.load(B + c, m, other=0).to(tl.float32)
        tl.store(yr + c, ((x - mean) * rstd * w + b).to(Y.dtype.element_ty), m)


@triton.jit
def ln_aligned(X, Wt, B, Y, N: tl.constexpr, RB: tl.constexpr, V: tl.constexpr):
    row = tl.program_id(0)
    start = row * N
    end = start + N
    lo = (start // V) * V
    acc = tl.zeros([RB], tl.float32)
    for off in range(lo, end, RB):
        f = off + tl.arange(0, RB)
        if (off >= start) & (off + RB <= end):
            x = tl.load(X + f).to(tl.float32)
        else:
            x = tl.load(X + f, (f >= start) & (f < end), other=0).to(tl.float32)
        acc += x
    mean = tl.sum(acc, 0) / N
    acc2 = tl.zeros([RB], tl.float32)
    for off in range(lo, end, RB):
        f = off + tl.arange(0, RB)
        if (off >= start) & (off + RB <= end):
            d = tl.load(X + f).to(tl.float32) - mean
        else:
            m = (f >= start) & (f < end)
            d = tl.where(m, tl.load(X + f, m, other=0).to(tl.float32) - mean, 0)
        acc2 += d * d
    rstd = tl.rsqrt(tl.sum(acc2, 0) / N + 1e-5)
    for off in range(lo, end, RB):
        f = off + tl.arange(0, RB)
        c = f - start
        if (off >= start) & (off + RB <= end):
            x = tl.load(X + f, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(Wt + c).to(tl.float32)
            b = tl.load(B + c).to(tl.float32)
            tl.store(Y + f, ((x - mean) * rstd * w + b).to(Y.dtype.element_ty))
        else:
            m = (f >= start) & (f < end)
            x = tl.load(X + f, m, other=0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(Wt + c, m, other=0).to(tl.float32)
            b = tl.load(B + c, m, other=0).to(tl.float32)
            tl.store(Y + f, ((x - mean) * rstd * w + b).to(Y.dtype.element_ty), m)


@triton.jit
def gelu_masked(X, Bias, Y, NUMEL: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr):
    f = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = f < NUMEL
    v = tl.load(X + f, m, other=0).to(tl.float32) + tl.load(Bias + f % W, m, other=0).to(tl.float32)
    tl.store(Y + f, (0.5 * v * (1 + tl.erf(v * 0.7071067811865476))).to(Y.dtype.element_ty), m)


@triton.jit
def gelu_split(X, Bias, Y, NUMEL: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr):
    off = tl.program_id(0) * BLOCK
    f = off + tl.arange(0, BLOCK)
    if off + BLOCK <= NUMEL:
        v = tl.load(X + f).to(tl.float32) + tl.load(Bias + f % W).to(tl.float32)
        tl.store(Y + f, (0.5 * v * (1 + tl.erf(v * 0.7071067811865476))).to(Y.dtype.element_ty))
    else:
        m = f < NUMEL
        v = tl.load(X + f, m, other=0).to(tl.float32) + tl.load(Bias + f % W, m, other=0).to(tl.float32)
        tl.store(Y + f, (0.5 * v * (1 + tl.erf(v * 0.7071067811865476))).to(Y.dtype.element_ty), m)


def bench(fn):
    if not GPU:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=25, rep=100) * 1000


WRONG = []  # (kernel, config) whose result did not match torch's


def _tbs(mb: float, us: float) -> str:
    return f"{mb / us:6.2f} TB/s" if us == us else "   (untimed)"  # MB a µs is TB a s


def _forms(title: str, label: str, launches: dict, y, ref, inductor) -> None:
    """Run each form (`launches`: (name, block, warps) -> a launch writing `y`), check it against `ref`, time it,
    and Inductor's compiled function (`inductor`) beside them; print them fastest first."""
    out = {}
    for key, launch in launches.items():
        y.zero_()
        launch()
        ok = (y.float() - ref.float()).abs().max().item() < (0.05 if y.dtype == torch.bfloat16 else 1e-3)
        WRONG.extend([] if ok else [key])
        out[key] = (bench(launch), ok)
    if GPU:
        inductor()
        out[("inductor", 0, 0)] = (bench(inductor), True)
    mb = 2 * y.numel() * y.element_size() / 1e6  # read once, written once
    print(f"{title} ({mb:.0f} MB moved)")
    for (name, block, warps), (us, ok) in sorted(out.items(), key=lambda kv: kv[1][0]):
        print(f"   {name:9s} {label}={block:6d} w={warps:2d}  {us:8.1f} us  {_tbs(mb, us)}  {'ok' if ok else 'WRONG'}")
    sys.stdout.flush()


def ln_case(rows, n, dtype, configs):
    x = torch.randn(rows, n, device=dev, dtype=dtype)
    w = torch.randn(n, device=dev, dtype=dtype)
    b = torch.randn(n, device=dev, dtype=dtype)
    ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float()).to(dtype)
    y = torch.empty_like(x)
    forms = (("scalar", ln_scalar, {}), ("aligned", ln_aligned, {"V": 16 // x.element_size()}))
    launches = {(name, rb, warps): (lambda k=k, rb=rb, warps=warps, extra=extra:
                                    k[(rows,)](x, w, b, y, n, rb, num_warps=warps, **extra))
                for rb, warps in configs for name, k, extra in forms}
    comp = torch.compile(lambda x, w, b: torch.nn.functional.layer_norm(x, (n,), w, b)) if GPU else None
    _forms(f"LayerNorm fwd {rows}x{n} {dtype}", "RB", launches, y, ref, lambda: comp(x, w, b))


def gelu_case(rows, n, dtype):
    x = torch.randn(rows, n, device=dev, dtype=dtype)
    bias = torch.randn(n, device=dev, dtype=dtype)
    ref = torch.nn.functional.gelu(x.float() + bias.float()).to(dtype)
    y = torch.empty_like(x)
    launches = {(name, block, warps): (lambda k=k, block=block, warps=warps:
                                       k[(triton.cdiv(x.numel(), block),)](x, bias, y, x.numel(), n, block,
                                                                           num_warps=warps))
                for block, warps in ((1024, 4), (2048, 4), (4096, 8), (1024, 8))
                for name, k in (("masked", gelu_masked), ("split", gelu_split))}
    comp = torch.compile(lambda x, b: torch.nn.functional.gelu(x + b)) if GPU else None
    _forms(f"bias+GELU {rows}x{n} {dtype}", "BLOCK", launches, y, ref, lambda: comp(x, bias))


if __name__ == "__main__":
    if GPU and "--check" not in sys.argv:
        print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
        cfgs = [(4096, 8), (4096, 16), (8192, 16), (8192, 32), (16384, 32), (2048, 8)]
        for rows, n, dt in ((2671, 50257, torch.bfloat16), (2671, 50264, torch.bfloat16),
                            (1335, 50257, torch.float32), (1335, 50264, torch.float32),
                            (3355, 20001, torch.bfloat16), (2048, 65535, torch.bfloat16)):
            ln_case(rows, n, dt, cfgs)
        for rows, n, dt in ((1335, 50257, torch.float32), (2671, 50257, torch.bfloat16),
                            (86369, 777, torch.float32), (1335, 50264, torch.float32)):
            gelu_case(rows, n, dt)
    else:
        ln_case(7, 301, torch.float32, [(64, 4)])
        ln_case(7, 301, torch.bfloat16, [(128, 4)])
        gelu_case(7, 301, torch.float32)
    sys.exit(1 if WRONG else 0)
