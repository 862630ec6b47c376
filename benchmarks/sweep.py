"""Sweep: every case over many row widths, both dtypes, three directions: eager, Inductor and passline.

    python benchmarks/sweep.py [--quick] [--cases ...] [--dtypes ...] [--widths ...] [--directions ...]
                               [--target-mb 256] [--max-minutes M] [--out DIR]
    python benchmarks/sweep.py --smoke --device cpu [--out DIR]   # tiny sizes, Triton's interpreter
    python benchmarks/sweep.py --plot DIR/sweep.csv [--plot-dir docs/img]   # needs matplotlib
    python benchmarks/sweep.py --out DIR --max-minutes 8 --resume   # again: runs the points DIR lacks
    python benchmarks/sweep.py --shards 4 --out DIR   # 4 processes at once, one GPU and a quarter of the cores each

benchmarks/gpu_suite.py times two shapes; this times the norms (LayerNorm, RMSNorm), softmax, log-softmax,
a bias add + GELU epilogue and cross-entropy over row widths from 64 to 65536 (powers of two and not).
A width alone (`4096`) is measured at a memory-bound size: its rows are derived from the width and
--target-mb (the input's size), so narrow widths are tall, middle ones square and wide ones have few rows
but as many bytes. `ROWSxWIDTH` (`64x30000`) gives the rows: the "few rows" points.

Directions: fwd (inference: no input requires grad), fwd_train (inputs require grad, so the forward also
writes what the backward saves) and bwd (the backward alone, replayed from one forward with
retain_graph=True). Each (case, shape, dtype) compiles (dynamic=False) for Inductor (`torch.compile`
default) and for passline (`passline.backend(fallback="raise")`) after one `torch._dynamo.reset()`; the
compile seconds are the first training call (forward and backward) plus the first inference call,
synchronized. Then every contender's every direction is timed in --rounds interleaved rounds (the order
rotated each round) and the fastest round kept, so a contender is not judged on a moment the others did
not see; the CSV's `*_ms_rounds` columns hold every round.

Check: passline's output (inference and training forward) and input gradients against a float64 reference
on the same inputs; each relative error must be within max(the dtype's floor, 4 x eager's own error):
benchmarks/bench_common.py. The script exits 1 when a passline check fails or a point fails to run.

Writes DIR/sweep.csv (one row per case, direction, dtype and shape, written as each point finishes) and
DIR/sweep.md (geometric mean of passline/Inductor over all points and per case, points slower than 1.05x,
memory-bound points under 85% of copy bandwidth, and those slower than Inductor by step and by the kernels'
own time); docs/benchmarks.md explains the columns.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch  # (does not import triton: TRITON_INTERPRET is set in main(), before anything does)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    EXTRA_SWEEP_CASES,
    SWEEP_CASES,
    bench,
    copy_bandwidth,
    differentiated,
    errors,
    fresh,
    grads,
    kernel_ms,
    make_case,
    passed,
    reference,
)

DIRECTIONS = ("fwd", "fwd_train", "bwd")
DTYPES = ("float32", "bfloat16")
# The issue's widths: powers of two and not, from 64 to 65536, and few-rows points of wide rows; 50257 (GPT-2's
# vocabulary): rows off 16-byte boundaries past a persistent block, which a sweep found 1.27x Inductor's time before
# the aligned loop (docs/backends.md, *Odd widths*); 8191: a row one element short of a power of two, whose 16-byte
# groups do not fit its block beside their head (the sixty-third session found such widths 1.14-1.18x Inductor's).
ALL_WIDTHS = "64,100,384,1000,1024,3000,4096,8191,8192,12345,30000,50257,65536,64x8192,64x30000,64x65536"
# The default: 9 shapes x 6 cases x 2 dtypes = 108 points, ~15 minutes on an H200 before the timing rounds, ~20
# with three (docs/benchmarks.md).
DEFAULT_WIDTHS = "64,384,1000,4096,8192,12345,30000,65536,64x8192,64x30000"
# --quick: the three losses reported in issue 15 (RMSNorm 1000-wide, LayerNorm backward square 8192-wide
# bf16, softmax 30000-wide few rows) for every case: 18 points, ~4 minutes on an H200.
QUICK = dict(dtypes="bfloat16", widths="1000,8192,64x30000", max_minutes=5)
# --smoke: shapes small enough for Triton's interpreter on a CPU (a few rows of each width).
# (The interpreter runs a reduction's combine function in Python, element by element: ~0.1 ms each.)
SMOKE = dict(widths="64,2x100", target_mb=2 / 1024)
SLOWER = 1.05  # the summary lists points where passline takes more than this times Inductor's time
UNDER_COPY_PCT = 85  # ... and memory-bound points under this % of the copy bandwidth

# read back as text, not numbers (read_rows)
TEXT_COLUMNS = ("case", "direction", "dtype", "shape", "shape_class", "kind", "check", "passline_codegen", "error",
                "inductor_ms_rounds", "passline_ms_rounds")
INT_COLUMNS = ("rows", "width", "passline_kernels", "passline_externs", "passline_choices_timed",
               "passline_choices_refused", "passline_choices_unchecked")
COLUMNS = ("case", "direction", "dtype", "rows", "width", "shape", "shape_class", "kind", "input_mb",
           "eager_ms", "inductor_ms", "passline_ms", "passline_over_inductor", "inductor_kernel_ms",
           "passline_kernel_ms", "kernels_over_inductor", "inductor_call_ms", "passline_call_ms",
           "calls_over_inductor", "passline_gbs",
           "passline_pct_copy", "inductor_gbs", "inductor_pct_copy", "check", "rel_err", "eager_rel_err",
           "compile_s_inductor", "compile_s_passline", "passline_codegen", "passline_kernels",
           "passline_externs", "passline_choices_timed", "passline_choices_refused", "passline_choices_unchecked",
           "error", "inductor_ms_rounds",
           "passline_ms_rounds")


# ---------------------------------------------------------------------------------------------- points


def points(widths: str, dtype, target_bytes: float):
    """(rows, width, kind) per entry: `N` sized (rows = target bytes / row bytes), `RxN` given."""
    es = torch.tensor([], dtype=dtype).element_size()
    for w in widths.split(","):
        w = w.strip()
        if "x" in w:
            m, n = map(int, w.split("x"))
            yield m, n, "given"
        else:
            n = int(w)
            yield max(1, round(target_bytes / (n * es))), n, "sized"


def shape_class(m: int, n: int) -> str:
    """tall: at least 4x more rows than columns; wide: 4x more columns than rows; else square."""
    return "tall" if m >= 4 * n else "wide" if n >= 4 * m else "square"


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def free(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def direction_calls(fn, case, directions) -> tuple[dict, list]:
    """({direction: a call of `fn` (compiled and warm) to time}, what the calls hold on to). A backward
    replays one backward of a forward run here (retain_graph=True); an inference call runs under no_grad."""
    calls, held = {}, []
    for d in directions:
        if d == "fwd":
            det = [x.detach() for x in case.inputs]

            def call(det=det):
                with torch.no_grad():
                    return fn(*det)
        elif d == "fwd_train":
            ins = fresh(case.inputs)

            def call(ins=ins):
                return fn(*ins)
        else:
            ins = fresh(case.inputs)
            y = fn(*ins)
            dy = torch.randn_like(y)
            wrt = differentiated(fn, ins)
            held.append((y, dy, wrt, ins))

            def call(y=y, wrt=wrt, dy=dy):
                return torch.autograd.grad(y, wrt, dy, retain_graph=True)
        calls[d] = call
    return calls, held


def time_rounds(calls: dict, device, reps_ms, rounds: int) -> tuple[dict, dict]:
    """({contender: {direction: [ms of each round]}}, {contender: the exception its timing raised}): every
    contender's every direction timed once a round, the contenders' order rotated from round to round, so
    each is timed at about the moment the others are (a lent GPU's speed, or its host's, moves between one
    contender's timing and the next's: steps of both compilers jumped by ~0.1 ms in single timings whose
    kernels had not moved). A contender whose call raises is left out of later rounds; the others go on."""
    labels = list(calls)
    out = {label: {d: [] for d in calls[label]} for label in labels}
    errors = {}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            if label in errors:
                continue
            try:
                for d, call in calls[label].items():
                    out[label][d].append(bench(call, reps_ms, device))
            except Exception as e:  # noqa: BLE001
                errors[label] = e
    return {label: ms for label, ms in out.items() if label not in errors}, errors


def back_to_back(calls: dict) -> dict:
    """{contender: {direction: ms a call issued back to back takes}} (`choosing.calls_ms`: every contender's
    rounds interleaved with the others'); a contender whose call raises gets none."""
    from passline.backends.choosing import calls_ms

    runs = {(label, d): call for label in calls for d, call in calls[label].items()}
    try:
        ms = calls_ms(runs)
    except Exception:  # noqa: BLE001 - one contender's failure: time the others without it
        ms = {}
        for label in calls:
            try:
                ms |= calls_ms({(label, d): call for d, call in calls[label].items()})
            except Exception:  # noqa: BLE001
                pass
    return {label: {d: ms[(label, d)] for d in calls[label] if (label, d) in ms} for label in calls}


def run_point(name, m, n, dtype, directions, contenders, device, reps_ms, pipeline=None, rounds=3):
    """({contender: {"ms": {direction: ms}, "ms_rounds", "kernel_ms", "call_ms", "compile_s", "errors",
    "error", "reports"}}, eager's errors, {direction: bytes}). Every contender is compiled and checked
    first, then all are timed in `rounds` interleaved rounds (`time_rounds`): "ms" is a direction's fastest
    round, "ms_rounds" every round's."""
    import passline

    torch.manual_seed(0)
    case = make_case(name, m, n, dtype, device)
    train = any(d != "fwd" for d in directions)  # fwd_train and bwd run the training graphs
    ref = reference(case, dtype)
    eager_errs = errors(*grads(case.fn, case.inputs), ref)
    results, calls, keep = {}, {}, []
    torch._dynamo.reset()  # then each contender's graphs stay cached beside the others' (keyed by backend)
    for label in contenders:
        res = results[label] = {"ms": {}, "compile_s": None, "errors": None, "error": ""}
        be = None
        try:
            if label == "eager":
                fn = case.fn
            elif label == "inductor":
                fn = torch.compile(case.fn, dynamic=False)
            else:
                be = passline.backend(pipeline=pipeline, fallback="raise")
                fn = torch.compile(case.fn, backend=be, dynamic=False)
            t0 = time.perf_counter()
            if train:  # compiles the training forward and the backward
                y, gs = grads(fn, case.inputs)
                errs = errors(y, gs, ref)
                del y, gs
            else:
                errs = [math.nan] * len(eager_errs)
            if "fwd" in directions:  # compiles the inference graph
                with torch.no_grad():
                    y = fn(*[x.detach() for x in case.inputs])
                errs.append(errors(y, [], ref)[0])
                del y
            sync(device)
            res["compile_s"] = time.perf_counter() - t0
            res["errors"] = errs
            calls[label], held = direction_calls(fn, case, directions)
            keep.append((fn, held))
            if be is not None:
                res["reports"] = {r.name.rstrip("0123456789"): (
                    r.codegen, r.kernels, r.externs, r.metrics.counters["kernel_choices_timed"],
                    r.metrics.counters["kernel_choices_refused"], r.metrics.counters["kernel_choices_unchecked"])
                    for r in be.reports}
        except Exception as e:  # one failing point must not hide the others
            failed(res, f"{name} {m}x{n} {dtype}: {label}", e)
            calls.pop(label, None)
        finally:
            fn = be = None
    timed, errs = time_rounds(calls, device, reps_ms, rounds)
    for label, e in errs.items():
        failed(results[label], f"{name} {m}x{n} {dtype}: {label}'s timing", e)
        del calls[label]
    for label, by_dir in timed.items():
        results[label]["ms_rounds"], results[label]["ms"] = by_dir, {d: min(ms) for d, ms in by_dir.items()}
        results[label]["kernel_ms"] = {d: kernel_ms(call, device) for d, call in calls[label].items()}
    if device == "cuda":
        for label, by_dir in back_to_back(calls).items():
            results[label]["call_ms"] = by_dir
    del calls, keep
    torch._dynamo.reset()
    nbytes = {d: case.bytes(d) for d in DIRECTIONS}
    del case, ref
    free(device)
    return results, eager_errs, nbytes


def failed(res: dict, what: str, e: Exception) -> None:
    """Record a contender's failure; one failing point must not hide the others. The CSV keeps the first
    line of the error, the log the whole story."""
    res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    print(f"{what} failed", file=sys.stderr)
    traceback.print_exc()


def rows_of_point(name, m, n, kind, dtype, directions, results, eager_errs, nbytes, copy_gbs) -> list[dict]:
    es = torch.tensor([], dtype=dtype).element_size()
    out = []
    for d in directions:
        # the errors this direction is checked on: the inference output, the training output, the gradients
        pick = {"fwd": lambda e: e[-1:], "fwd_train": lambda e: e[:1], "bwd": lambda e: e[1:len(eager_errs)]}[d]
        eager_pick = {"fwd": eager_errs[:1], "fwd_train": eager_errs[:1], "bwd": eager_errs[1:]}[d]
        row = dict(case=name, direction=d, dtype=str(dtype).removeprefix("torch."), rows=m, width=n,
                   shape=f"{m}x{n}", shape_class=shape_class(m, n), kind=kind, input_mb=m * n * es / 2**20,
                   eager_rel_err=max(eager_pick))
        for label in ("eager", "inductor", "passline"):
            ms = results.get(label, {}).get("ms", {}).get(d)
            row[f"{label}_ms"] = ms
            rounds = results.get(label, {}).get("ms_rounds", {}).get(d)
            if rounds and label != "eager":
                row[f"{label}_ms_rounds"] = " ".join(f"{x:.4g}" for x in rounds)
            if ms and label != "eager":
                gbs = nbytes[d] / (ms * 1e-3) / 1e9
                row[f"{label}_gbs"] = gbs
                row[f"{label}_pct_copy"] = 100 * gbs / copy_gbs
        for label in ("inductor", "passline"):
            row[f"compile_s_{label}"] = results.get(label, {}).get("compile_s")
        for label in ("inductor", "passline"):
            row[f"{label}_kernel_ms"] = results.get(label, {}).get("kernel_ms", {}).get(d)
            row[f"{label}_call_ms"] = results.get(label, {}).get("call_ms", {}).get(d)
        if row.get("passline_ms") and row.get("inductor_ms"):
            row["passline_over_inductor"] = row["passline_ms"] / row["inductor_ms"]
        if row.get("passline_kernel_ms") and row.get("inductor_kernel_ms"):
            row["kernels_over_inductor"] = row["passline_kernel_ms"] / row["inductor_kernel_ms"]
        if row.get("passline_call_ms") and row.get("inductor_call_ms"):
            row["calls_over_inductor"] = row["passline_call_ms"] / row["inductor_call_ms"]
        p = results.get("passline")
        if p is None:
            row["check"] = "-"
        elif p["error"] or not p["errors"]:
            row["check"] = "FAILED"
        else:
            errs = pick(p["errors"])
            row["rel_err"] = max(errs)
            row["check"] = "ok" if passed(errs, eager_pick, dtype) else "MISMATCH"
        graph = {"fwd": "inference", "fwd_train": "forward", "bwd": "backward"}[d]
        if p and graph in p.get("reports", {}):
            (row["passline_codegen"], row["passline_kernels"], row["passline_externs"], row["passline_choices_timed"],
             row["passline_choices_refused"], row["passline_choices_unchecked"]) = p["reports"][graph]
        row["error"] = "; ".join(f"{k}: {v['error']}" for k, v in results.items() if v["error"])
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- output


def read_rows(csv_path) -> list[dict]:
    """sweep.csv's rows as `rows_of_point` made them: numbers as numbers, empty cells None."""
    def value(k, v):
        if v == "":
            return None
        if k in TEXT_COLUMNS:
            return v
        try:
            return int(v) if k in INT_COLUMNS else float(v)
        except ValueError:
            return v

    with open(csv_path, newline="") as f:
        return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def point_key(name: str, dtype_name: str, m: int, n: int) -> tuple:
    return name, dtype_name, int(m), int(n)


def fmt(v) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def progress(r: dict) -> str:
    """One direction of a point, for the log: passline's time, against Inductor's, % of copy, check."""
    text = f"{r['direction']} {fmt(r.get('passline_ms'))} ms"
    if r.get("passline_over_inductor"):
        text += f" ({fmt(r['passline_over_inductor'])}x Inductor)"
    if r.get("passline_pct_copy") is not None:
        text += f" {fmt(r['passline_pct_copy'])}% copy"
    return f"{text} {r['check']}"


def kernel_pct_copy(r: dict, label: str = "passline"):
    """A row's % of copy bandwidth by its kernels' own GPU time (`pct_copy` is by the step's, host included):
    the same bytes over the kernel time, so the step's percentage scaled by step / kernels."""
    pct, ms, kernel_ms = r.get(f"{label}_pct_copy"), r.get(f"{label}_ms"), r.get(f"{label}_kernel_ms")
    return pct * ms / kernel_ms if pct is not None and ms and kernel_ms else None


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def summary(rows: list[dict], header: str, skipped: list[str]) -> str:
    ratio = [r for r in rows if r.get("passline_over_inductor")]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    dirs = [d for d in DIRECTIONS if any(r["direction"] == d for r in rows)]
    lines = [header, "",
             f"{len(rows)} rows; passline checks: {sum(r['check'] == 'ok' for r in rows)} ok, "
             f"{sum(r['check'] == 'MISMATCH' for r in rows)} mismatched, "
             f"{sum(r['check'] == 'FAILED' for r in rows)} failed.", "",
             "## passline / Inductor, geometric mean (below 1: passline faster)", ""]
    if not ratio:
        lines.append("No point has both times (Inductor off, or every point failed).")
    else:
        lines += [f"All points: **{geomean(r['passline_over_inductor'] for r in ratio):.3f}** ({len(ratio)} points)",
                  "", "| case | " + " | ".join(dirs) + " | all |", "|---|" + "---|" * (len(dirs) + 1)]
    for c in cases if ratio else ():
        cells = [geomean(r["passline_over_inductor"] for r in ratio if r["case"] == c and r["direction"] == d)
                 for d in dirs]
        cells.append(geomean(r["passline_over_inductor"] for r in ratio if r["case"] == c))
        lines.append(f"| {c} | " + " | ".join(f"{x:.3f}" for x in cells) + " |")
    if ratio:
        by_dtype = {dt: geomean(r["passline_over_inductor"] for r in ratio if r["dtype"] == dt)
                    for dt in dict.fromkeys(r["dtype"] for r in ratio)}
        lines += ["", "By dtype: " + ", ".join(f"{dt} {g:.3f}" for dt, g in by_dtype.items())]
    kernels = [r for r in rows if r.get("kernels_over_inductor")]
    if kernels:  # GPU work alone (torch.profiler): what host-bound steps hide
        slow = sum(r["kernels_over_inductor"] > SLOWER for r in kernels)
        lines += ["", f"GPU time of the kernels alone, passline / Inductor: geometric mean "
                      f"**{geomean(r['kernels_over_inductor'] for r in kernels):.3f}** ({len(kernels)} points, "
                      f"{slow} above {SLOWER}x)"]
    calls = [r for r in rows if r.get("calls_over_inductor")]
    if calls:  # steady state, host included, without do_bench's cache flush between calls
        slow = sum(r["calls_over_inductor"] > SLOWER for r in calls)
        lines += ["", f"Calls issued back to back, passline / Inductor: geometric mean "
                      f"**{geomean(r['calls_over_inductor'] for r in calls):.3f}** ({len(calls)} points, "
                      f"{slow} above {SLOWER}x)"]
    timed = [r for r in rows if r.get("passline_choices_timed")]
    if timed:  # runner.Kernel._agreeing: a timed choice whose launch disagreed with the rule's was refused
        refused = [r for r in timed if r.get("passline_choices_refused")]
        unchecked = [r for r in timed if r.get("passline_choices_unchecked")]
        lines += ["", f"Graphs whose kernels timed a choice at the first call: {len(timed)}; where a timed choice "
                      f"disagreed with the rule's result and was refused: {len(refused)}"
                      + "".join(f"\n- {r['case']} {r['direction']} {r['dtype']} {r['shape']}: "
                                f"{r['passline_choices_refused']} refused" for r in refused)
                      + (f"\n\nGraphs with a timed choice left unchecked (the rule's configuration did not run): "
                         f"{len(unchecked)}" if unchecked else "")
                      + "".join(f"\n- {r['case']} {r['direction']} {r['dtype']} {r['shape']}: "
                                f"{r['passline_choices_unchecked']} unchecked" for r in unchecked)]
    # compile seconds per point (each point's rows repeat them: one per point)
    per_point = {(r["case"], r["dtype"], r["shape"]): r for r in rows}.values()
    for label in ("passline", "inductor"):
        secs = sorted(r[f"compile_s_{label}"] for r in per_point if r.get(f"compile_s_{label}"))
        if secs:
            lines.append(f"\nCompile seconds per point, {label}: median "
                         f"{secs[len(secs) // 2]:.1f}, max {secs[-1]:.1f}, total {sum(secs):.0f}")
    cols = ("| case | direction | dtype | shape | Inductor ms | passline ms | passline / Inductor | "
            "kernels alone, passline / Inductor | calls back to back, passline / Inductor | % of copy | "
            "% of copy by kernels, passline / Inductor | check |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"

    def table(rs):
        return [cols, sep] + [
            f"| {r['case']} | {r['direction']} | {r['dtype']} | {r['shape']} | {fmt(r.get('inductor_ms'))} | "
            f"{fmt(r.get('passline_ms'))} | {fmt(r.get('passline_over_inductor'))} | "
            f"{fmt(r.get('kernels_over_inductor'))} | {fmt(r.get('calls_over_inductor'))} | "
            f"{fmt(r.get('passline_pct_copy'))} | {fmt(kernel_pct_copy(r))} / {fmt(kernel_pct_copy(r, 'inductor'))} | "
            f"{r['check']} |"
            for r in rs]

    slow = sorted((r for r in ratio if r["passline_over_inductor"] > SLOWER),
                  key=lambda r: -r["passline_over_inductor"])
    lines += ["", f"## Points where passline is slower than {SLOWER}x Inductor ({len(slow)})", ""]
    lines += table(slow) if slow else ["None."]
    under = sorted((r for r in rows if r["kind"] == "sized" and r.get("passline_pct_copy") is not None
                    and r["passline_pct_copy"] < UNDER_COPY_PCT), key=lambda r: r["passline_pct_copy"])
    lines += ["", f"## Memory-bound (sized) points under {UNDER_COPY_PCT}% of copy bandwidth ({len(under)})", ""]
    lines += table(under) if under else ["None."]
    # issue 15's bar: a memory-bound point under the copy share must at least be faster than Inductor; by step a
    # short step's share is the host's, so the same test by the kernels' own time beside it
    behind = [r for r in under if (r.get("passline_over_inductor") or 0) > 1]
    by_kernels = sorted((r for r in rows if r["kind"] == "sized" and (kernel_pct_copy(r) or 100) < UNDER_COPY_PCT
                         and (r.get("kernels_over_inductor") or 0) > 1), key=kernel_pct_copy)
    lines += ["", f"## Memory-bound points under {UNDER_COPY_PCT}% of copy and slower than Inductor: "
                  f"by step {len(behind)}, by kernels {len(by_kernels)}", ""]
    lines += table(by_kernels) if by_kernels else ["None by kernels."]
    bad = [r for r in rows if r["check"] in ("MISMATCH", "FAILED") or r["error"]]
    lines += ["", f"## Failed or mismatched ({len(bad)})", ""]
    lines += [f"- {r['case']} {r['direction']} {r['dtype']} {r['shape']}: {r['check']} "
              f"(rel err {fmt(r.get('rel_err'))}, eager {fmt(r.get('eager_rel_err'))}) {r['error']}"
              for r in bad] or ["None."]
    if skipped:
        lines += ["", f"## Not run: --max-minutes reached ({len(skipped)} points)", "", ", ".join(skipped)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- plot


def plot(csv_path: str, out_dir: str) -> list[Path]:
    """docs/img/sweep_<case>.svg: % of copy bandwidth against row width (log axis), passline and Inductor,
    one panel per direction x dtype; sized points as lines, given (few rows) points as hollow markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        dirs = [d for d in DIRECTIONS if any(r["direction"] == d for r in rs)]
        dtypes = list(dict.fromkeys(r["dtype"] for r in rs))
        fig, axes = plt.subplots(len(dirs), len(dtypes), figsize=(4.5 * len(dtypes), 3 * len(dirs)),
                                 squeeze=False, sharex=True, sharey=True)
        for i, d in enumerate(dirs):
            for j, dt in enumerate(dtypes):
                ax = axes[i][j]
                for label, color in (("passline", "tab:blue"), ("Inductor", "tab:orange")):
                    col = f"{label.lower()}_pct_copy"
                    for kind, style in (("sized", dict(marker="o", linestyle="-")),
                                        ("given", dict(marker="s", linestyle="none", markerfacecolor="none"))):
                        pts = sorted((int(r["width"]), float(r[col])) for r in rs
                                     if r["direction"] == d and r["dtype"] == dt and r["kind"] == kind and r[col])
                        if pts:
                            ax.plot(*zip(*pts), color=color, markersize=4,
                                    label=label if kind == "sized" else f"{label}, few rows", **style)
                ax.set_xscale("log", base=2)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{case} {d} {dt}", fontsize=9)
                ax.grid(True, alpha=0.3)
                if j == 0:
                    ax.set_ylabel("% of copy bandwidth")
                if i == len(dirs) - 1:
                    ax.set_xlabel("row width")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"sweep_{case}.svg"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------- main


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--cases", default=",".join(SWEEP_CASES),
                    help=f"comma-separated (default: {','.join(SWEEP_CASES)}; also {','.join(EXTRA_SWEEP_CASES)})")
    ap.add_argument("--dtypes", help=f"comma-separated (default: {','.join(DTYPES)})")
    ap.add_argument("--widths", help=f"WIDTH or ROWSxWIDTH, comma-separated, or 'all' ({ALL_WIDTHS}); "
                                     f"default {DEFAULT_WIDTHS}")
    ap.add_argument("--directions", default=",".join(DIRECTIONS), help="comma-separated (default: all)")
    ap.add_argument("--target-mb", type=float, help="input size of a width's sized point (default 256)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "sweep_out", help="directory for sweep.csv, sweep.md")
    ap.add_argument("--quick", action="store_true",
                    help=f"a subset: {QUICK['dtypes']}, widths {QUICK['widths']}, every case; "
                         f"stops starting points after {QUICK['max_minutes']} minutes")
    ap.add_argument("--smoke", action="store_true", help=f"tiny sizes (widths {SMOKE['widths']}, a few rows each)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--inductor", action=argparse.BooleanOptionalAction,
                    help="time Inductor (default: on CUDA; off on the CPU, where its C++ compile takes minutes)")
    ap.add_argument("--reps-ms", type=float, default=100, help="do_bench's rep per timing (default 100)")
    ap.add_argument("--rounds", type=int, help="interleaved timing rounds a point, the fastest kept (default 3 on "
                                               "CUDA, 1 on the CPU)")
    ap.add_argument("--pipeline", help="passline's pipeline (default passline.DEFAULT_PIPELINE): to compare a "
                                       "pass's options, e.g. without split_reductions; --no-inductor then")
    ap.add_argument("--max-minutes", type=float, help="start no new point after this many minutes")
    ap.add_argument("--resume", action="store_true",
                    help="keep OUT/sweep.csv's points and run only the others, appending (a sweep longer than "
                         "one sitting, run over several calls); the summary covers them all")
    ap.add_argument("--shards", type=int, default=1,
                    help="run the points in N processes at once, each on its own GPU (CUDA_VISIBLE_DEVICES) and "
                         "its own slice of the cores; OUT/shardK holds each one's files, OUT/sweep.csv all of them")
    ap.add_argument("--shard", help=argparse.SUPPRESS)  # K/N: this process runs every N-th point from the K-th
    ap.add_argument("--plot", metavar="CSV", help="only plot a sweep.csv (matplotlib) and exit")
    ap.add_argument("--plot-dir", default=str(Path(__file__).resolve().parents[1] / "docs" / "img"))
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else SMOKE if args.smoke else {}
    args.dtypes = args.dtypes or preset.get("dtypes") or ",".join(DTYPES)
    args.widths = args.widths or preset.get("widths") or DEFAULT_WIDTHS
    if args.widths == "all":
        args.widths = ALL_WIDTHS
    args.target_mb = args.target_mb or preset.get("target_mb") or 256
    args.max_minutes = args.max_minutes or preset.get("max_minutes")
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    if args.shards > 1 and args.device == "cuda" and torch.cuda.is_available() \
            and args.shards > torch.cuda.device_count():
        ap.error(f"--shards {args.shards}: one GPU a shard, and torch sees {torch.cuda.device_count()}")
    if args.shard:
        k, n = map(int, args.shard.split("/"))
        args.shard = (k, n)
    if args.inductor is None:
        args.inductor = args.device == "cuda"
    if args.device == "cuda" and not torch.cuda.is_available() and not args.plot:
        ap.error("--device cuda, but torch sees no CUDA device (use --smoke --device cpu)")
    try:  # a malformed width is an error now, not after the copy measurement
        for dt in args.dtypes.split(","):
            list(points(args.widths, getattr(torch, dt, torch.float32), 2**20))
    except ValueError as e:
        ap.error(f"--widths {args.widths!r}: {e}")
    for what, given, known in (("case", args.cases, SWEEP_CASES + EXTRA_SWEEP_CASES),
                               ("direction", args.directions, DIRECTIONS),
                               ("dtype", args.dtypes, ("float32", "bfloat16", "float16"))):
        unknown = [x for x in given.split(",") if x not in known]
        if unknown:
            ap.error(f"unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return args


def work(args) -> list[tuple]:
    """The points to run, (dtype name, rows, width, kind, case), in order; with --shard K/N every N-th from
    the K-th (so each shard gets every case, dtype and width class, and about equal work)."""
    items = [(dt_name, m, n, kind, name) for dt_name in args.dtypes.split(",")
             for m, n, kind in points(args.widths, getattr(torch, dt_name), args.target_mb * 2**20)
             for name in args.cases.split(",")]
    if args.shard:
        k, n = args.shard
        items = items[k::n]
    return items


def any_failed(rows: list[dict]) -> bool:
    """Whether a passline check failed or a point failed to run (the script then exits 1)."""
    return any(r["check"] in ("MISMATCH", "FAILED") or r["error"] for r in rows)


def _without(argv: list, *options: str) -> list:
    """argv without each of `options` and its value (`--out DIR` or `--out=DIR`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out


def run_shards(args, argv: list) -> int:
    """--shards N: this script once a shard (`--shard K/N`), all at once, shard K on the K-th visible GPU and
    the K-th slice of this process's cores (a shard's compiles then never take the cores another times on),
    writing OUT/shardK; then every shard's rows merged into OUT/sweep.csv and summed up in OUT/sweep.md. Each
    shard is one process, so its ratios are same-process ratios. --resume resumes each shard from its own CSV."""
    import subprocess

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = args.shards
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()] \
        or [str(k) for k in range(n)]
    pin = hasattr(os, "sched_setaffinity")  # Linux; elsewhere the shards share the cores
    cores = sorted(os.sched_getaffinity(0)) if pin else []
    per = max(1, len(cores) // n)
    base = _without(argv, "--shards", "--out")
    procs = []
    for k in range(n):
        d = out / f"shard{k}"
        d.mkdir(exist_ok=True)
        env = dict(os.environ)
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = visible[k]
        mine = set(cores[k * per:(k + 1) * per] or cores)
        cmd = [sys.executable, str(Path(__file__).resolve()), *base, "--shard", f"{k}/{n}", "--out", str(d)]
        with open(d / "log.txt", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=(lambda m=mine: os.sched_setaffinity(0, m)) if pin else None))
    codes = [p.wait() for p in procs]
    rows = []
    for k in range(n):
        path = out / f"shard{k}" / "sweep.csv"
        rows += read_rows(path) if path.exists() else []
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: fmt(r.get(c)) for c in COLUMNS})
    ran = {point_key(r["case"], r["dtype"], r["rows"], r["width"]) for r in rows}
    skipped = [f"{name} {dt} {m}x{w}" for dt, m, w, _, name in work(args) if point_key(name, dt, m, w) not in ran]
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.machine()})"
    header = (f"# passline sweep, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n\n"
              f"{n} shards, one process each ({device}; each shard's own copy bandwidth for % of copy, "
              f"OUT/shardK/sweep.md)\n\n`python benchmarks/sweep.py {' '.join(argv)}`")
    text = summary(rows, header, skipped)
    (out / "sweep.md").write_text(text)
    print(text)
    for k, code in enumerate(codes):
        if code:
            print(f"shard {k} exited {code}: {out / f'shard{k}' / 'log.txt'}")
    return 1 if any(codes) or any_failed(rows) else 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.plot:
        for p in plot(args.plot, args.plot_dir):
            print(p)
        return 0
    if args.shards > 1:
        return run_shards(args, list(argv if argv is not None else sys.argv[1:]))
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # passline's Triton kernels on CPU tensors; before triton's import
    import triton

    import passline

    # bwd replays one backward with retain_graph=True, which donated buffers forbid
    torch._functorch.config.donated_buffer = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    copy_gbs = copy_bandwidth(args.device, numel=1 << 28 if args.device == "cuda" else 1 << 20)
    device = torch.cuda.get_device_name() if args.device == "cuda" else \
        f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    header = (f"# passline sweep, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n\n"
              f"{device}, torch {torch.__version__}, triton {triton.__version__}, passline {passline.__version__}; "
              f"device-to-device copy {copy_gbs:.3g} GB/s\n\n"
              f"`python benchmarks/sweep.py {' '.join(argv if argv is not None else sys.argv[1:])}`")
    print(header, flush=True)
    contenders = ["eager"] + (["inductor"] if args.inductor else []) + ["passline"]
    directions = args.directions.split(",")
    csv_path = out / "sweep.csv"
    rows, skipped = [], []
    resumed = args.resume and csv_path.exists()
    if resumed:  # the points an earlier call finished are kept, not run again
        rows = read_rows(csv_path)
        print(f"resuming: {len(rows)} rows of {csv_path} kept", flush=True)
    done = {point_key(r["case"], r["dtype"], r["rows"], r["width"]) for r in rows}
    start = time.perf_counter()
    with open(csv_path, "a" if resumed else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if not resumed:
            writer.writeheader()
        for dt_name, m, n, kind, name in work(args):
            label = f"{name} {dt_name} {m}x{n}"
            if point_key(name, dt_name, m, n) in done:
                continue
            if args.max_minutes and time.perf_counter() - start > 60 * args.max_minutes:
                skipped.append(label)
                continue
            t0 = time.perf_counter()
            dtype = getattr(torch, dt_name)
            results, eager_errs, nbytes = run_point(name, m, n, dtype, directions, contenders, args.device,
                                                    args.reps_ms, args.pipeline,
                                                    args.rounds or (3 if args.device == "cuda" else 1))
            new = rows_of_point(name, m, n, kind, dtype, directions, results, eager_errs, nbytes, copy_gbs)
            for r in new:
                writer.writerow({k: fmt(r.get(k)) for k in COLUMNS})
            f.flush()
            rows += new
            print(f"{label}: " + ", ".join(progress(r) for r in new)
                  + (f" [{new[0]['error']}]" if new[0]["error"] else "")
                  + f" — {time.perf_counter() - t0:.1f} s", flush=True)
    text = summary(rows, header, skipped)
    (out / "sweep.md").write_text(text)
    print("\n" + text)
    print(f"wrote {csv_path} and {out / 'sweep.md'} in {(time.perf_counter() - start) / 60:.1f} minutes")
    return 1 if any_failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
