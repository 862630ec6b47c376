"""Where the first training step's time goes, stage by stage, on a machine without a GPU.

    python benchmarks/first_call.py [--models gpt2,llama,resnet] [--smoke] [--compile serial,threads,pool]
                                    [--workers N] [--hashes FILE.json] [--profile FILE.prof]

Each model of benchmarks/models.py (real sizes, or --smoke's) is built on the CPU and compiled with
`passline.backend()`, with kernels generated for the GPU (not for Triton's interpreter: what a CUDA run
generates) and the graphs run eagerly on the CPU, so the first step completes and the backward is compiled
too. `launches` counts the binaries the graphs' first calls launch (two for a mix-order step), `jobs` those
the runners would compile before it: equal where nothing is left to a first launch.
Stages, in seconds: dynamo (tracing, guards: the first step's wall time less everything below),
aot_autograd (joint tracing, decompositions, partitioning), and passline's own per graph: lower, passes,
codegen (kernel sources and the wrapper). Then the kernels the runner would compile before the first call
(static shapes, by rule) are compiled for sm_90 (`GPUTarget("cuda", 90, 32)`, Triton's own ptxas) into a
fresh Triton cache: one after another, in 8 threads, and in a process pool (passline's, as on a GPU).

--hashes writes a sha256 of every generated kernel source and wrapper per model, to compare two versions
of the generator (`diff`): a change meant only to make compilation faster must leave them equal.
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama,resnet")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--compile", default="serial,threads,pool", help="comma-separated: serial, threads, pool ('' none)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--hashes", help="write kernel/wrapper source hashes per model to this JSON file")
    ap.add_argument("--profile", help="cProfile the compile of the first model into this file")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="passline-firstcall-")
    os.environ["PASSLINE_CACHE_DIR"] = os.path.join(root, "passline")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")  # aot_autograd's cache: cold too
    try:
        return run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args, root) -> int:
    import models as M
    import torch

    import passline
    from passline.backends import dynamo as pdynamo
    from passline.backends.triton import precompile
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.precompile import compile_jobs

    jobs: list = []
    # GPU code for CPU graphs: the runner is built as on a GPU (interpret=False) and not run
    pdynamo._on_cpu = lambda graph: False
    prunner.TritonRunner.precompile = lambda self, workers=8: jobs.extend(self.precompile_jobs())
    compile_aten = passline.Backend.compile_aten
    times = {"aot+passline(fw)": 0.0, "run": 0.0}

    def eager_compile_aten(self, gm, example_inputs, kind="graph", fx=None):
        compile_aten(self, gm, example_inputs, kind, fx)  # timed in its report

        def run_eagerly(*a):
            t = time.perf_counter()
            out = gm(*a)
            times["run"] += time.perf_counter() - t
            return out
        return run_eagerly

    passline.Backend.compile_aten = eager_compile_aten
    call = passline.Backend.__call__

    def timed_call(self, gm, example_inputs):
        t = time.perf_counter()
        try:
            return call(self, gm, example_inputs)
        finally:
            times["aot+passline(fw)"] += time.perf_counter() - t

    passline.Backend.__call__ = timed_call
    rows, hashes = [], {}
    for m in args.models.split(","):
        cfg = dict(M.CONFIGS[m][2 if args.smoke else 1])
        master, dtype, inputs, fmt = M.build(m, cfg, "cpu")
        model = M.place(master, "cpu", dtype, fmt)
        torch._dynamo.reset()
        jobs.clear()
        times.update({"aot+passline(fw)": 0.0, "run": 0.0})
        be = passline.backend(fallback="raise")
        fn = torch.compile(model, backend=be)
        prof = cProfile.Profile() if args.profile and not rows else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        model.zero_grad(set_to_none=True)
        fn(*inputs).backward()
        if prof:
            prof.disable()
            prof.dump_stats(args.profile)
        total = time.perf_counter() - t0
        stage = {k: sum(r.seconds.get(k, 0.0) for r in be.reports) for k in ("lower", "passes", "codegen")}
        fw = [r for r in be.reports if not r.name.startswith("backward")]
        fw_passline = sum(sum(r.seconds.values()) for r in fw)
        bw_passline = sum(sum(r.seconds.values()) for r in be.reports) - fw_passline
        row = dict(model=m, graphs=len(be.reports), kernels=sum(r.kernels for r in be.reports),
                   total=total, run=times["run"], aot=times["aot+passline(fw)"] - fw_passline, **stage)
        row["dynamo"] = total - times["aot+passline(fw)"] - bw_passline - times["run"]
        h = {}
        for r in be.reports:
            rn = r.runner
            h[r.name] = dict(wrapper=hashlib.sha256(rn.source.encode()).hexdigest()[:16],
                             kernels=[hashlib.sha256(s.source.encode()).hexdigest()[:16]
                                      for k in rn.kernels for _, s in sorted(k.variants.items())])
        hashes[m] = h
        unique = list({(j.path, j.kwargs_key()): j for j in jobs}.values())
        row["jobs"] = len(unique)
        row["launches"] = sum(first_launches(r.runner) for r in be.reports)
        for how in [w for w in args.compile.split(",") if w]:
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(dir=root, prefix=f"triton-{how}-")
            for mod in [v for k, v in sys.modules.items() if k.startswith("passline_kernels.")]:
                for fn in vars(mod).values():  # forget binaries compiled in this process by another mode
                    getattr(fn, "device_caches", {}).clear()
            t, c = time.perf_counter(), time.process_time()
            results = compile_jobs(unique, how=how, workers=args.workers)
            row[f"compile_{how}"] = time.perf_counter() - t
            row[f"cpu_{how}"] = time.process_time() - c  # this process's CPU time, all its threads
            row[f"failed_{how}"] = sum(1 for ok in results if not ok)
            if how == "pool":  # the next model's workers start afresh (their cache dir, a cold start)
                precompile.pool().close()
                precompile._POOL = None
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    cols = ["total", "dynamo", "aot", "lower", "passes", "codegen", "run"] + \
        [f"compile_{w}" for w in args.compile.split(",") if w]
    print(f"| model | graphs | kernels | launches | jobs | {' | '.join(cols)} |")
    print("|---" * (len(cols) + 5) + "|")
    for r in rows:
        print(f"| {r['model']} | {r['graphs']} | {r['kernels']} | {r['launches']} | {r['jobs']} | "
              + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")
    if args.hashes:
        Path(args.hashes).write_text(json.dumps(hashes, indent=1, sort_keys=True))
    return 0


def first_launches(runner) -> int:
    """Binaries the graph's first call launches: one a kernel step and two a mix-order step (main and
    finishing kernel), less the steps that launch nothing (a zero count: the reference backend), each kernel
    counted once where steps share it (a model's repeated layers: TritonRunner._kernel)."""
    launched = set()
    for kind, _, data in getattr(runner, "steps", ()):
        if kind in ("kernel", "mix"):
            src = next(iter(data[0].info.variants.values()))
            try:
                empty = int(src.xnumel) == 0 or (src.rnumel is not None and int(src.rnumel) == 0)
            except TypeError:  # symbolic: launched, never compiled ahead
                empty = False
            if not empty:
                launched |= {id(data[0])} if kind == "kernel" else {id(data[0]), id(data[2])}
    return len(launched)


if __name__ == "__main__":
    sys.exit(main())
