"""Decompose-K as a choice: (M x K) @ (K x N) with small M, N and a long K, against aten's mm and Inductor.

    python benchmarks/choices.py                          # GPU: M, N in 16 32 64, K 4096..32768, fp16 and bf16
    python benchmarks/choices.py --dtypes float16 --ms 16 # a slice (the full table compiles ~150 graphs)
    TRITON_INTERPRET=1 python benchmarks/choices.py --smoke --device cpu     # a quick check that it runs

Per shape, in one process: aten's mm called directly; Inductor's default `torch.compile` of the same
function; passline's compile, whose chooser times aten, decompose-K's versions and split-K's (decompose-K
in one kernel, 16-bit dtypes) at the first call (each candidate compiled by passline) and keeps the
fastest. Results are checked against a float64 product first (a relative error within max(the dtype's
floor, 4 x aten's own)). On a GPU times are triton.testing.do_bench medians; on the CPU one timed call
(only a check that the path runs), and passline runs three times there: as chosen (the rule: aten), with
decompose_k forced and with split_k forced.

Columns: ms of each (do_bench of the call); what passline chose and how; passline's speed-up over aten and
over Inductor (> 1: passline faster); the same three by GPU time alone (`*_gpu_ms`: replays of a CUDA graph
of ten calls, as the chooser times candidates — at these sizes a call's host work, 10-100 µs, is larger
than its GPU work and do_bench of a call measures the host), and their speed-ups; and the fastest
decompose-K and split-K versions its chooser timed, next to its timing of aten.
`--csv PATH` also writes the rows. Choices are cached in `--cache-dir` (default: a fresh directory, so
every shape is timed in this run).
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
from bench_common import TOLERANCE, bench, rel_err  # noqa: E402

import passline  # noqa: E402
from passline.backends.choosing import gpu_ms  # noqa: E402

COLUMNS = ["dtype", "m", "n", "k", "aten_ms", "inductor_ms", "passline_ms", "chosen", "how",
           "speedup_vs_aten", "speedup_vs_inductor", "aten_gpu_ms", "inductor_gpu_ms", "passline_gpu_ms",
           "gpu_speedup_vs_aten", "gpu_speedup_vs_inductor", "timed_aten_ms", "timed_best_dk", "timed_best_dk_ms",
           "timed_best_sk", "timed_best_sk_ms", "rel_err", "check"]
WIDE = ("chosen", "timed_best_dk", "timed_best_sk")  # printed in wider columns


def matmul(a, b):
    return a @ b


def compiled(backend, a, b):
    """fn compiled by `backend` (None: Inductor) for these inputs, called once (the compile), and its output."""
    torch._dynamo.reset()  # one code object for every shape: a fresh cache, never dynamo's recompile limit
    fn = torch.compile(matmul, dynamic=False) if backend is None else \
        torch.compile(matmul, backend=backend, dynamic=False)
    return fn, fn(a, b)


def run_case(m, n, k, dtype, device, cache_dir, force=None) -> dict:
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1009 + k)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    ref = a.double() @ b.double()
    row = dict(dtype=str(dtype).removeprefix("torch."), m=m, n=n, k=k)

    def timed(fn):  # (do_bench of the call, its GPU time alone: CUDA-graph replays; NaN on the CPU)
        return bench(fn, device=device), (gpu_ms(fn) if device == "cuda" else math.nan)

    aten_out = torch.mm(a, b)
    row["aten_ms"], row["aten_gpu_ms"] = timed(lambda: torch.mm(a, b))
    floor = max(TOLERANCE.get(dtype, 1e-4), 4 * rel_err(aten_out, ref))

    if device == "cuda":
        ind, out = compiled(None, a, b)
        row["inductor_ms"], row["inductor_gpu_ms"] = timed(lambda: ind(a, b))
        errs = [rel_err(out, ref)]
    else:  # Inductor's CPU code needs a C++ toolchain: not part of this check
        row["inductor_ms"] = row["inductor_gpu_ms"] = math.nan
        errs = []

    be = passline.backend(cache_dir=cache_dir, fallback="raise",
                          choice_overrides={"mm": force} if force else None)
    pl, out = compiled(be, a, b)
    row["passline_ms"], row["passline_gpu_ms"] = timed(lambda: pl(a, b))
    errs.append(rel_err(out, ref))
    report = be.reports[-1]
    rec = report.choices[0] if report.choices else None
    row["chosen"], row["how"] = (rec.chosen, rec.how) if rec else ("aten", "no candidate")
    timings = rec.timings if rec else {}
    row["timed_aten_ms"] = timings.get("aten", math.nan)
    for col, family in (("dk", "decompose_k"), ("sk", "split_k")):  # the fastest version of each
        mine = {k_: v for k_, v in timings.items() if k_.startswith(family + "(")}
        best = min(mine, key=mine.get) if mine else ""
        row[f"timed_best_{col}"], row[f"timed_best_{col}_ms"] = best, mine.get(best, math.nan)
    row["speedup_vs_aten"] = row["aten_ms"] / row["passline_ms"]
    row["speedup_vs_inductor"] = row["inductor_ms"] / row["passline_ms"]
    row["gpu_speedup_vs_aten"] = row["aten_gpu_ms"] / row["passline_gpu_ms"]
    row["gpu_speedup_vs_inductor"] = row["inductor_gpu_ms"] / row["passline_gpu_ms"]
    row["rel_err"] = max(errs)
    row["check"] = "ok" if all(e <= floor for e in errs) else f"FAILED (floor {floor:.2e})"
    return row


def fmt(v, column="") -> str:
    if column == "rel_err":
        return f"{v:.1e}"
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return str(v)


def summary(rows) -> list[str]:
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        rs = [r for r in rows if r["dtype"] == dtype]
        dk = [r for r in rs if r["chosen"] != "aten"]
        split = sum(r["chosen"].startswith("split_k") for r in dk)
        geo = math.exp(sum(math.log(r["speedup_vs_aten"]) for r in rs) / len(rs))
        line = (f"{dtype}: {len(rs)} shapes, a split of K chosen in {len(dk)} (split-K {split}, decompose-K "
                f"{len(dk) - split}); passline over aten: geomean {geo:.3f}x, "
                f"worst {min(r['speedup_vs_aten'] for r in rs):.3f}x")
        ind = [r["speedup_vs_inductor"] for r in rs if not math.isnan(r["speedup_vs_inductor"])]
        if ind:
            line += f"; over Inductor: worst {min(ind):.3f}x"
        if dk:
            line += f"; where chosen, over aten: {min(r['speedup_vs_aten'] for r in dk):.3f}x" \
                    f"..{max(r['speedup_vs_aten'] for r in dk):.3f}x"
        gpu = [r for r in rs if not math.isnan(r["gpu_speedup_vs_aten"])]
        if gpu:  # GPU time alone (CUDA-graph replays): what the chooser compares
            geo = math.exp(sum(math.log(r["gpu_speedup_vs_aten"]) for r in gpu) / len(gpu))
            line += (f". GPU time alone, passline over aten: geomean {geo:.3f}x, worst "
                     f"{min(r['gpu_speedup_vs_aten'] for r in gpu):.3f}x, over Inductor worst "
                     f"{min(r['gpu_speedup_vs_inductor'] for r in gpu):.3f}x")
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
    forced = [args.force] if args.force else ([None, "decompose_k", "split_k"] if args.device == "cpu" else [None])
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
