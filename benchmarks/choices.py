"""Decompose-K as a choice: (M x K) @ (K x N) with small M, N and a long K, against aten's mm and Inductor.

    python benchmarks/choices.py                          # GPU: M, N in 16 32 64, K 4096..32768, fp16 and bf16
    python benchmarks/choices.py --dtypes float16 --ms 16 # a slice (the full table compiles ~700 graphs)
    TRITON_INTERPRET=1 python benchmarks/choices.py --smoke --device cpu     # a quick check that it runs

Per shape, in one process, two pairs of contenders, as a graph runs in each mode:
- without CUDA graphs: aten's mm called directly; Inductor's default `torch.compile` of the same function;
  passline's default compile, whose chooser times aten and decompose-K's versions at the first call by calls
  issued back to back (host included: `choosing.calls_ms`, the candidates' rounds interleaved) and keeps the
  fastest, unless aten is within 10% of it (`choosing.CALL_NOISE`);
- with CUDA graphs: Inductor's `mode="reduce-overhead"`; passline's `cudagraphs=True`, whose chooser times
  candidates by their GPU time alone (`choosing.gpu_ms`, CUDA-graph replays).
Each is timed two ways: `*_call_ms`, calls back to back with a synchronization at the end, over the calls
(`call_ms`: what a loop of calls costs, host included — at these sizes a call's host work, 20-100 µs, is more
than its GPU work), and `*_gpu_ms`, the device time of its kernels (torch.profiler over 10 calls: what it
costs a GPU that is kept busy). Speed-ups are aten's or Inductor's time over passline's (> 1: passline
faster): `call_vs_*` for the default pair, `cg_vs_*` (GPU time) for the CUDA-graph pair. Results are checked
against a float64 product first (a relative error within max(the dtype's floor, 4 x aten's own)). On the CPU:
one timed call of each (only a check that the path runs; no Inductor), and passline runs as chosen (the rule:
aten) and with decompose_k forced. `--csv PATH` also writes the rows. Choices are cached in `--cache-dir`
(default: a fresh directory, so every shape is timed in this run).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's passline
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_common, also when imported by a test
from bench_common import TOLERANCE, bench, kernel_ms, rel_err  # noqa: E402

import passline  # noqa: E402
from passline.backends.choosing import call_ms  # noqa: E402

COLUMNS = ["dtype", "m", "n", "k", "aten_call_ms", "inductor_call_ms", "passline_call_ms", "chosen",
           "call_vs_aten", "call_vs_inductor", "aten_gpu_ms", "inductor_ro_gpu_ms", "passline_cg_gpu_ms",
           "cg_chosen", "cg_vs_aten", "cg_vs_inductor", "inductor_gpu_ms", "passline_gpu_ms", "passline_cg_call_ms",
           "inductor_ro_call_ms", "cg_timed_aten_ms", "cg_timed_best_dk", "cg_timed_best_dk_ms", "rel_err", "check"]
WIDE = ("chosen", "cg_chosen", "cg_timed_best_dk")  # printed in wider columns


def matmul(a, b):
    return a @ b


def compiled(backend, a, b, mode=None):
    """fn compiled by `backend` (None: Inductor, in `mode`) for these inputs, called once (the compile), and its
    output."""
    torch._dynamo.reset()  # one code object for every shape: a fresh cache, never dynamo's recompile limit
    fn = torch.compile(matmul, dynamic=False, mode=mode) if backend is None else \
        torch.compile(matmul, backend=backend, dynamic=False)
    return fn, fn(a, b)


def timed(fn, device) -> tuple[float, float]:
    """(ms of a call issued back to back, ms of its kernels' GPU time); on the CPU one call's wall time, NaN."""
    if device != "cuda":
        return bench(fn, device=device), math.nan
    return call_ms(fn), kernel_ms(fn, device)


def _choice(be) -> tuple[str, dict]:
    rec = next((c for r in be.reports for c in r.choices), None)
    return (rec.chosen, rec.timings) if rec else ("aten", {})


def run_case(m, n, k, dtype, device, cache_dir, force=None) -> dict:
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1009 + k)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    ref = a.double() @ b.double()
    row = dict(dtype=str(dtype).removeprefix("torch."), m=m, n=n, k=k)
    floor = max(TOLERANCE.get(dtype, 1e-4), 4 * rel_err(torch.mm(a, b), ref))
    row["aten_call_ms"], row["aten_gpu_ms"] = timed(lambda: torch.mm(a, b), device)
    errs = []
    overrides = {"mm": force} if force else None
    contenders = [("passline", dict(cudagraphs=False))]
    if device == "cuda":  # Inductor's CPU code needs a C++ toolchain: not part of this check
        contenders += [("inductor", None), ("inductor_ro", "reduce-overhead"), ("passline_cg", dict(cudagraphs=True))]
    for label, how in contenders:
        if label.startswith("inductor"):
            fn, out = compiled(None, a, b, mode=how)
        else:
            be = passline.backend(cache_dir=cache_dir, fallback="raise", choice_overrides=overrides, **how)
            fn, out = compiled(be, a, b)
            chosen, timings = _choice(be)
            if label == "passline":
                row["chosen"] = chosen
            else:
                dks = {k_: v for k_, v in timings.items() if k_ != "aten"}
                best = min(dks, key=dks.get) if dks else ""
                row.update(cg_chosen=chosen, cg_timed_aten_ms=timings.get("aten", math.nan), cg_timed_best_dk=best,
                           cg_timed_best_dk_ms=dks.get(best, math.nan))
        errs.append(rel_err(out, ref))
        row[f"{label}_call_ms"], row[f"{label}_gpu_ms"] = timed(lambda fn=fn: fn(a, b), device)
        errs.append(rel_err(fn(a, b), ref))  # after the timing: a replay, for the CUDA-graph contenders
    for col in ("inductor_call_ms", "inductor_gpu_ms", "inductor_ro_call_ms", "inductor_ro_gpu_ms",
                "passline_cg_call_ms", "passline_cg_gpu_ms", "cg_timed_aten_ms", "cg_timed_best_dk_ms"):
        row.setdefault(col, math.nan)
    row.setdefault("cg_chosen", "")
    row.setdefault("cg_timed_best_dk", "")
    row["call_vs_aten"] = row["aten_call_ms"] / row["passline_call_ms"]
    row["call_vs_inductor"] = row["inductor_call_ms"] / row["passline_call_ms"]
    row["cg_vs_aten"] = row["aten_gpu_ms"] / row["passline_cg_gpu_ms"]
    row["cg_vs_inductor"] = row["inductor_ro_gpu_ms"] / row["passline_cg_gpu_ms"]
    row["rel_err"] = max(errs)
    row["check"] = "ok" if all(e <= floor for e in errs) else f"FAILED (floor {floor:.2e})"
    return row


def fmt(v, column="") -> str:
    if column == "rel_err":
        return f"{v:.1e}"
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return str(v)


def _geo(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary(rows) -> list[str]:
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        rs = [r for r in rows if r["dtype"] == dtype]
        dk = sum(r["chosen"] != "aten" for r in rs)
        line = (f"{dtype}: {len(rs)} shapes. Without CUDA graphs decompose-K chosen in {dk}; passline over aten "
                f"(calls back to back): geomean {_geo([r['call_vs_aten'] for r in rs]):.3f}x, worst "
                f"{min(r['call_vs_aten'] for r in rs):.3f}x")
        ind = [r["call_vs_inductor"] for r in rs if not math.isnan(r["call_vs_inductor"])]
        if ind:
            line += f"; over Inductor: geomean {_geo(ind):.3f}x, worst {min(ind):.3f}x"
        cg = [r for r in rs if not math.isnan(r["cg_vs_aten"])]
        if cg:
            line += (f". With CUDA graphs decompose-K chosen in {sum(r['cg_chosen'] != 'aten' for r in cg)}; "
                     f"passline over aten (GPU time): geomean {_geo([r['cg_vs_aten'] for r in cg]):.3f}x, worst "
                     f"{min(r['cg_vs_aten'] for r in cg):.3f}x; over Inductor reduce-overhead: geomean "
                     f"{_geo([r['cg_vs_inductor'] for r in cg]):.3f}x, worst "
                     f"{min(r['cg_vs_inductor'] for r in cg):.3f}x")
        lines.append(line)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--ms", default="16,32,64", help="M values (comma-separated)")
    ap.add_argument("--ns", default="16,32,64", help="N values")
    ap.add_argument("--ks", default=",".join(str(4096 * i) for i in range(1, 9)), help="K values")
    ap.add_argument("--smoke", action="store_true", help="two tiny shapes, float32 and bfloat16 (CPU: the interpreter)")
    ap.add_argument("--force", default=None, help="a candidate to force for mm (e.g. decompose_k); default: choose")
    ap.add_argument("--cache-dir", default=None, help="passline's cache (default: a fresh temporary directory)")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.dtypes, args.ms, args.ns, args.ks = "float32,bfloat16", "4", "8", "512,1024"
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    ints = [[int(v) for v in s.split(",")] for s in (args.ms, args.ns, args.ks)]
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="passline-choices-")
    if args.device == "cuda":
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    forced = [args.force] if args.force else ([None, "decompose_k"] if args.device == "cpu" else [None])
    rows = []
    print(" ".join(f"{c:>10}" if c not in WIDE else f"{c:>22}" for c in COLUMNS))
    for dtype in dtypes:
        for m in ints[0]:
            for n in ints[1]:
                for k in ints[2]:
                    for force in forced:
                        row = run_case(m, n, k, dtype, args.device, cache_dir, force)
                        rows.append(row)
                        print(" ".join(f"{fmt(row[c], c):>10}" if c not in WIDE else f"{fmt(row[c], c):>22}"
                                       for c in COLUMNS), flush=True)
    for line in summary(rows):
        print(line)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, COLUMNS)
            w.writeheader()
            w.writerows(rows)
    failed = [r for r in rows if r["check"] != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} rows failed the check against float64")


if __name__ == "__main__":
    main()
