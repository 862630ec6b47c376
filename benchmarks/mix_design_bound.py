"""What the mix-order design can reach, written by hand: a Triton LayerNorm backward kernel for
bfloat16 (576000, 384) in the shape passline generates (rows in blocks, whole columns in registers,
column partial sums per program into a workspace), swept over its choices — the weight loaded once or
per block (HOIST), the next block's loads issued ahead (PREF), a [XBLOCK, RBLOCK] or [1, RBLOCK]
accumulator (ACC2D), rows per block, warps and rows per program — against the measured copy bandwidth.

    python benchmarks/mix_design_bound.py      # on a GPU; about a minute

On an H200 (2026-11-21) the best with one row per block was 392 µs (PREF=1, 2 warps, 64 rows per
program); without the look-ahead loads, 431 µs. Two rows per block with the [1, RBLOCK] accumulator
(third session) reached 374 µs (1 warp without look-ahead, or 2 warps with it, 64 rows per program, 96
registers a thread). passline's generated kernel with the look-ahead loads, two rows on two warps,
measured 385 µs at one whole wave of programs (546 rows per program; 118 registers). Fourth session: the
same generated kernel without look-ahead, its row loop pipelined by Triton through shared memory
(`tl.range(..., num_stages=4)`), reached 329 µs (four rows, [XBLOCK, RBLOCK] accumulator, two warps):
the look-ahead by hand is no longer generated, and this script's PREF is the record of why it was.
"""
import itertools

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def lnb(px, pdy, pmean, prstd, pw, pdx, pws_w, pws_b, M, N, split,
        XB: tl.constexpr, RB: tl.constexpr, HOIST: tl.constexpr, PREF: tl.constexpr, ACC2D: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, RB)[None, :]
    cmask = cols < N
    if ACC2D:
        accw = tl.zeros([XB, RB], tl.float32)
        accb = tl.zeros([XB, RB], tl.float32)
    else:
        accw = tl.zeros([1, RB], tl.float32)
        accb = tl.zeros([1, RB], tl.float32)
    if HOIST:
        w = tl.load(pw + cols, cmask, other=0).to(tl.float32)
    row0 = pid * split
    ar = tl.arange(0, XB)[:, None]
    rows = row0 + ar
    msk = (rows < M) & (ar < split) & cmask
    if PREF:
        x_n = tl.load(px + rows * N + cols, msk, other=0)
        dy_n = tl.load(pdy + rows * N + cols, msk, other=0)
        mean_n = tl.load(pmean + rows, (rows < M) & (ar < split), other=0)
        rstd_n = tl.load(prstd + rows, (rows < M) & (ar < split), other=0)
    for off in range(0, split, XB):
        rows = row0 + off + ar
        rm = (rows < M) & (off + ar < split)
        msk = rm & cmask
        if PREF:
            x = x_n
            dy = dy_n
            mean = mean_n
            rstd = rstd_n
            nrows = rows + XB
            nrm = (nrows < M) & (off + XB + ar < split)
            x_n = tl.load(px + nrows * N + cols, nrm & cmask, other=0)
            dy_n = tl.load(pdy + nrows * N + cols, nrm & cmask, other=0)
            mean_n = tl.load(pmean + nrows, nrm, other=0)
            rstd_n = tl.load(prstd + nrows, nrm, other=0)
        else:
            x = tl.load(px + rows * N + cols, msk, other=0)
            dy = tl.load(pdy + rows * N + cols, msk, other=0)
            mean = tl.load(pmean + rows, rm, other=0)
            rstd = tl.load(prstd + rows, rm, other=0)
        if not HOIST:
            w = tl.load(pw + cols, cmask, other=0).to(tl.float32)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xhat = (xf - mean) * rstd
        wdy = dyf * w
        c1 = tl.sum(tl.where(msk, xhat * wdy, 0), 1)[:, None] / N
        c2 = tl.sum(tl.where(msk, wdy, 0), 1)[:, None] / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(pdx + rows * N + cols, dx.to(tl.bfloat16), msk)
        if ACC2D:
            accw += tl.where(msk, dyf * xhat, 0)
            accb += tl.where(msk, dyf, 0)
        else:
            accw += tl.sum(tl.where(msk, dyf * xhat, 0), 0)[None, :]
            accb += tl.sum(tl.where(msk, dyf, 0), 0)[None, :]
    if ACC2D:
        tl.store(pws_w + pid * N + cols, tl.sum(accw, 0)[None, :], cmask)
        tl.store(pws_b + pid * N + cols, tl.sum(accb, 0)[None, :], cmask)
    else:
        tl.store(pws_w + pid * N + cols, accw, cmask)
        tl.store(pws_b + pid * N + cols, accb, cmask)


def main():
    M, N = 576000, 384
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = (torch.rand(N, device="cuda") + 0.5).bfloat16()
    xf = x.float()
    mean = xf.mean(1)
    rstd = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
    dx = torch.empty_like(x)
    xr = xf.clone().requires_grad_()
    wr = w.float().requires_grad_()
    br = torch.zeros(N, device="cuda", requires_grad=True)
    y = torch.nn.functional.layer_norm(xr, (N,), wr, br)
    y.backward(dy.float())
    copy = do_bench(lambda: dx.copy_(x), rep=200, return_mode="median")
    print(f"copy {copy*1e3:.1f} us; 80% target {3*x.numel()*2/(0.8*2*x.numel()*2/copy)*1e3:.1f} us", flush=True)
    results = []
    for HOIST, PREF, ACC2D, XB in itertools.product((1, 0), (0, 1), (1, 0), (1, 2, 4)):
        if XB > 2 and not ACC2D:
            continue  # two rows on 1-2 warps: the column sum stays in a thread
        for nw in (1, 2, 4, 8):
            if nw * 32 > XB * 512:
                continue
            for split in (64, 128, 256, 512, 1024, 4364):
                P = triton.cdiv(M, split)
                wsw = torch.empty(P, N, device="cuda")
                wsb = torch.empty(P, N, device="cuda")

                def f(P=P, wsw=wsw, wsb=wsb, split=split, XB=XB, HOIST=HOIST, PREF=PREF, ACC2D=ACC2D, nw=nw):
                    return lnb[(P,)](x, dy, mean, rstd, w, dx, wsw, wsb, M, N, split, XB=XB, RB=512, HOIST=HOIST,
                                     PREF=PREF, ACC2D=ACC2D, num_warps=nw)
                try:
                    f()
                    torch.cuda.synchronize()
                except Exception as e:
                    print("fail", HOIST, PREF, ACC2D, XB, nw, split, repr(e)[:100])
                    continue
                t = do_bench(f, warmup=10, rep=50, return_mode="median")
                results.append((t, HOIST, PREF, ACC2D, XB, nw, split))
                if len(results) == 1 or t == min(r[0] for r in results):
                    err = (dx.float() - xr.grad).abs().max().item()
                    errw = (wsw.sum(0) - wr.grad).abs().max().item()
                    print(f"new best {t*1e3:.1f} us HOIST={HOIST} PREF={PREF} ACC2D={ACC2D} XB={XB} w{nw} "
                          f"split={split} err dx {err:.3f} dw {errw:.3f}", flush=True)
    results.sort()
    for r in results[:15]:
        print("%.1f us HOIST=%d PREF=%d ACC2D=%d XB=%d w%d split=%d" % (r[0]*1e3, *r[1:]))
    for key in ("HOIST", "PREF", "ACC2D"):
        i = {"HOIST": 1, "PREF": 2, "ACC2D": 3}[key]
        for v in (0, 1):
            sub = [r for r in results if r[i] == v]
            if sub:
                print(key, v, "best %.1f" % (min(sub)[0]*1e3))


if __name__ == "__main__":
    main()
