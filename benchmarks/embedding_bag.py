"""nn.EmbeddingBag, passline against eager and torch.compile (Inductor), in one process.

    python benchmarks/embedding_bag.py [--modes sum,mean,max] [--forms 2d,offsets] [--pooling 1,20,100]
                                       [--tables 100000x128,1000000x64] [--bags 4096] [--dtypes float32]
                                       [--device cuda|cpu]

For each point (mode, input form, pooling factor, table rows × width, dtype) it checks passline's output and
weight gradient against eager's (relative error against float64), then times the inference forward and a
training step (forward, then backward with a fixed cotangent; the table requires grad) for eager, Inductor
and passline, medians of do_bench. `2d` is a (bags, pooling) index tensor; `offsets` a flat one with bag
lengths drawn from 0 to 2 × pooling (some empty). Inductor runs aten's `_embedding_bag` as a fallback;
passline replaces `F.embedding_bag` in dynamo's graph by a gather and a per-bag reduction (decompositions.py).

Printed: a Markdown table with each contender's ms, passline's ratio to eager's and Inductor's time (below 1
is faster), and passline's GB/s as a percentage of the device-to-device copy bandwidth measured at the
start. Bytes are the minimum each direction moves: the forward reads the gathered rows and the indices and
writes one row per bag; the training step also writes the dense table gradient (eager's, zeros included)
and reads the output's gradient. On the CPU (`--device cpu`, Triton's interpreter) the times mean nothing;
it checks that every point runs and matches.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_point(form: str, pooling: int, rows: int, width: int, bags: int, dtype, device):
    """(indices, offsets or None, weight, numel of the indices)."""
    import torch

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(rows, width, generator=g).to(device=device, dtype=dtype).requires_grad_()
    if form == "2d":
        idx = torch.randint(0, rows, (bags, pooling), generator=g).to(device)
        return idx, None, weight, idx.numel()
    lengths = torch.randint(0, 2 * pooling + 1, (bags,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]).to(device)
    idx = torch.randint(0, rows, (int(lengths.sum()),), generator=g).to(device)
    return idx, offsets, weight, idx.numel()


def run_point(mode, idx, offsets, weight, n_idx, bags, copy_gbs, device, backend) -> list[tuple]:
    """Check passline's output and weight gradient against eager's, then time each contender's forward
    (no gradients) and training step: [(step, {contender: ms}, percent of copy, check text, passed)]."""
    import torch
    import torch.nn.functional as F
    from bench_common import bench, passed, rel_err

    def fn(i, o, w):
        return F.embedding_bag(i, w, o, mode=mode)

    rows, width = weight.shape
    dy = torch.randn(bags, width, device=device, dtype=weight.dtype)
    calls = {"eager": fn}
    for label, be in (("inductor", "inductor"), ("passline", backend)):
        torch._dynamo.reset()
        calls[label] = torch.compile(fn, backend=be, dynamic=False)
    w64 = weight.detach().double().requires_grad_()
    y_ref = fn(idx, offsets, w64)
    y_ref.backward(dy.double())
    errs = {}
    for label, f in calls.items():
        w = weight.detach().clone().requires_grad_()
        y = f(idx, offsets, w)
        y.backward(dy)
        errs[label] = [rel_err(y, y_ref), rel_err(w.grad, w64.grad)]
    ok = passed(errs["passline"], errs["eager"], weight.dtype)  # each within the dtype's floor or 4× eager's
    es = weight.element_size()
    gathered = n_idx * width * es + n_idx * idx.element_size()
    out = bags * width * es
    nbytes = {"fwd": gathered + out, "train": gathered + 2 * out + rows * width * es}

    def forward(f, w):
        with torch.no_grad():
            return f(idx, offsets, w)

    def step(f, w):
        w.grad = None
        f(idx, offsets, w).backward(dy)

    result = []
    for phase, run in (("fwd", forward), ("train", step)):
        times = {}
        for label, f in calls.items():
            call = functools.partial(run, f, weight.detach().clone().requires_grad_())
            call()
            times[label] = bench(call, device=device)
        pct = nbytes[phase] / (times["passline"] * 1e-3) / 1e9 / copy_gbs * 100
        result.append((phase, times, pct, f"{'ok' if ok else 'FAIL'} {max(errs['passline']):.1e}", ok))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="sum,mean,max")
    ap.add_argument("--forms", default="2d,offsets")
    ap.add_argument("--pooling", default="1,20,100")
    ap.add_argument("--tables", default="100000x128,1000000x64,100000x256")
    ap.add_argument("--bags", type=int, default=4096)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from bench_common import copy_bandwidth

    import passline

    device = args.device
    copy_gbs = copy_bandwidth(device, numel=1 << 28 if device == "cuda" else 1 << 20)
    print(f"# {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}, torch {torch.__version__}, "
          f"copy {copy_gbs:.0f} GB/s, {args.bags} bags")
    print("| mode | form | pooling | table | dtype | step | eager ms | Inductor ms | passline ms | vs eager "
          "| vs Inductor | passline % of copy | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    slower = failed = 0
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for table in args.tables.split(","):
            rows, width = map(int, table.split("x"))
            for form in args.forms.split(","):
                for pooling in map(int, args.pooling.split(",")):
                    point = make_point(form, pooling, rows, width, args.bags, dtype, device)
                    for mode in args.modes.split(","):
                        for phase, t, pct, check, ok in run_point(mode, *point, args.bags, copy_gbs, device,
                                                                  passline.backend()):
                            vs_ind = t["passline"] / t["inductor"]
                            slower += vs_ind > 1.05
                            failed += not ok
                            print(f"| {mode} | {form} | {pooling} | {rows}×{width} | {dtype_name} | {phase} "
                                  f"| {t['eager']:.3f} | {t['inductor']:.3f} | {t['passline']:.3f} "
                                  f"| {t['passline'] / t['eager']:.2f} | {vs_ind:.2f} | {pct:.0f}% | {check} |",
                                  flush=True)
                    del point
    print(f"# points slower than 1.05× Inductor: {slower}; failed checks: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
