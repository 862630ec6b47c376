"""GPU check and benchmark: passline against eager and torch.compile (Inductor), in one process.

    python benchmarks/gpu_suite.py [--shapes 576000x384,32768x4096] [--dtypes float32,bfloat16]
                                   [--cases layer_norm,rms_norm,softmax,gelu_epilogue,cross_entropy]
                                   [--out DIR]

Issue 16's rows (vocabularies from 1k to 256k; embedding forward and backward):
    python benchmarks/gpu_suite.py --cases cross_entropy,cross_entropy_native,embedding \
        --shapes 8192x1024,8192x32768,8192x50304,4096x131072,2048x262144

For each case, shape and dtype it checks passline's forward and backward against eager (relative
error against a float64 reference), then times eager, Inductor and passline (median of do_bench) and
prints a Markdown table: times, passline's speed relative to Inductor (Inductor time / passline time:
above 1 is faster), the GPU time of each contender's kernels alone (torch.profiler, bench_common.kernel_ms:
a step of a few tens of µs is the host's, do_bench measures its issue rate) and their ratio, and
passline's GB/s as a percentage of the device-to-device copy bandwidth measured
at the start of the same run. Bytes are the minimum each row must move (inputs read once, outputs
written once).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import bench, copy_bandwidth, differentiated, errors, grads, kernel_ms, make_case, passed, reference  # noqa: E402

import passline  # noqa: E402


def run_case(name, m, n, dtype, copy_gbs, rows, out_dir):
    torch.manual_seed(0)
    case = make_case(name, m, n, dtype)
    fn, inputs = case.fn, case.inputs
    ref = reference(case, dtype)  # float64 on the same inputs
    compiled = {}
    be = passline.backend()
    for label, backend in (("inductor", "inductor"), ("passline", be)):
        torch._dynamo.reset()
        compiled[label] = torch.compile(fn, backend=backend)
        t0 = time.time()
        grads(compiled[label], inputs)  # compile forward and backward
        compiled[label + "_s"] = time.time() - t0
    errs = errors(*grads(compiled["passline"], inputs), ref)
    eager_errs = errors(*grads(fn, inputs), ref)
    ok = passed(errs, eager_errs, dtype)
    # forward (inference) and backward timings
    det = [x.detach() for x in inputs]
    for phase, nbytes in (("fwd", case.fwd_bytes), ("bwd", case.bwd_bytes)):
        times, kernels = {}, {}
        for label, f in (("eager", fn), ("inductor", compiled["inductor"]), ("passline", compiled["passline"])):
            if phase == "fwd":
                with torch.no_grad():
                    f(*det)  # compile the inference graph outside the timing
                    times[label] = bench(lambda f=f: f(*det))
                    kernels[label] = kernel_ms(lambda f=f: f(*det))
            else:
                ins = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
                y = f(*ins)
                dy = torch.randn_like(y)
                wrt = differentiated(f, ins)
                call = (lambda y=y, wrt=wrt, dy=dy: torch.autograd.grad(y, wrt, dy, retain_graph=True))
                times[label], kernels[label] = bench(call), kernel_ms(call)
                del y, ins, call
        gbs = nbytes / (times["passline"] * 1e-3) / 1e9
        row = dict(case=name, phase=phase, shape=f"{m}x{n}", dtype=str(dtype).replace("torch.", ""),
                   eager_ms=times["eager"], inductor_ms=times["inductor"], passline_ms=times["passline"],
                   vs_inductor=times["inductor"] / times["passline"], gbs=gbs, pct_copy=100 * gbs / copy_gbs,
                   inductor_kernel_ms=kernels["inductor"], passline_kernel_ms=kernels["passline"],
                   kernels_vs_inductor=kernels["inductor"] / kernels["passline"],
                   check="ok" if ok else "MISMATCH", rel_err=max(errs), eager_rel_err=max(eager_errs),
                   compile_s_passline=compiled["passline_s"], compile_s_inductor=compiled["inductor_s"],
                   kernels=[(r.name, k.name, k.chosen, k.blocks) for r in be.reports for k in r.kernel_info
                            if (phase == "bwd") == r.name.startswith("backward")])
        rows.append(row)
        print(fmt(row), flush=True)
        if out_dir:
            with open(Path(out_dir) / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
    del fn, inputs, case, ref, compiled
    torch.cuda.empty_cache()


HEADER = ("| case | phase | shape | dtype | eager ms | Inductor ms | passline ms | passline vs Inductor | "
          "kernels alone: Inductor / passline ms (vs) | passline GB/s | % of copy | check |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def fmt(r) -> str:
    return (f"| {r['case']} | {r['phase']} | {r['shape']} | {r['dtype']} | {r['eager_ms']:.3f} | "
            f"{r['inductor_ms']:.3f} | {r['passline_ms']:.3f} | {r['vs_inductor']:.2f}x | "
            f"{r['inductor_kernel_ms']:.3f} / {r['passline_kernel_ms']:.3f} ({r['kernels_vs_inductor']:.2f}x) | "
            f"{r['gbs']:.0f} | "
            f"{r['pct_copy']:.0f}% | {r['check']} (rel err {r['rel_err']:.1e}) |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="576000x384,32768x4096")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cases", default="layer_norm,rms_norm,softmax,gelu_epilogue,cross_entropy")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for results.jsonl (made if missing)")
    args = ap.parse_args(argv)
    import triton

    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)  # a missing folder failed each row after its first phase

    # backward timings replay one backward with retain_graph=True, which donated buffers forbid
    torch._functorch.config.donated_buffer = False
    copy_gbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"passline {passline.__version__}; device-to-device copy {copy_gbs:.0f} GB/s")
    print(HEADER)
    rows = []
    for shape in args.shapes.split(","):
        m, n = map(int, shape.split("x"))
        for dt in args.dtypes.split(","):
            for case in args.cases.split(","):
                try:
                    run_case(case, m, n, getattr(torch, dt), copy_gbs, rows, args.out)
                except Exception as e:  # one failing row must not hide the others
                    print(f"| {case} | - | {shape} | {dt} | FAILED: {type(e).__name__}: {str(e)[:300]} |", flush=True)
    print("\n" + HEADER)
    for r in rows:
        print(fmt(r))


if __name__ == "__main__":
    main()
