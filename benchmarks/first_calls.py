"""First training steps in fresh processes: cold (empty caches) and warm (a second process, the same caches),
passline against Inductor, with where passline's time goes.

    python benchmarks/first_calls.py [--models gpt2,llama] [--contenders inductor,passline,passline:threads]
                                     [--rounds 2] [--device cuda|cpu] [--smoke] [--out FILE.json]

Issue 14 asks for a first call no slower than Inductor's, cold and warm. In one process (benchmarks/models.py) the
contender that goes first pays what every compiler shares once a process (dynamo's and aot_autograd's imports,
cuBLAS's start), so here each first step runs in a process of its own: for each round, model and contender (the
order rotated from round to round), a cold run with a new, empty cache directory (Triton's, Inductor's, passline's),
then a warm run with that same directory. A contender is `inductor`, `passline`, or passline with settings of its
own, `passline:SETTING=VALUE[+SETTING=VALUE]`, each read as its `PASSLINE_*` variable would be (passline/config.py;
`passline:compile_in=threads`: the kernels compiled in the parent's threads instead of the compile workers, the
default since the forty-fourth session, for which `passline:threads` is short, as `passline:processes` is for the
workers). A run times the first call as a user waits for it: from the compiler's import (passline's package;
Inductor imports its code generators in `torch.compile()`, ~0.7-0.9 s) through `torch.compile()` and the first step
(the forward, compiled at the call, and `loss.backward()`, which compiles the backward), synchronized; the step
alone is reported beside it (`first_step_s`; the figure of the sessions before the forty-third). Then the median of
`--steps` steady steps (10). Marks, in seconds from the import: `compile()` (torch.compile returned), and for
passline where the rest goes: `dynamo` (its tracing, until the backend has the graph), `aot` (aot_autograd's tracing
and partitioning, or the load of its cached result in a warm run, until passline has the forward), and per graph
passline's own stages (`report.seconds`: lower, passes, codegen) and `precompile` (`TritonRunner.compile_seconds`:
the kernels compiled and loaded before the graph's first call; `binaries`, how many, and `by_record`, how many of
them were built straight from their Triton cache entries), and `forward` / `backward` (when each half of the
step finished); `compile_workers`: how many compile workers the process started (none in a warm run whose
graphs all come from the caches).

Before the rounds, each model runs once through each contender at `--smoke` sizes, untimed (`--no-warmup` skips
it): every module they import is then in the OS's file cache and compiled to bytecode, as on a user's
installation. Where Python finds no bytecode beside torch's sources and may not write it there (a read-only
installation nothing compiled, or PYTHONDONTWRITEBYTECODE: the lent GPU host), each process would compile every
module it imports from source
(under cProfile, 1837 modules in Inductor's first call there and 544 in passline's), so the runs keep bytecode in
a directory of their own (`PYTHONPYCACHEPREFIX`, `--pycache`), which the warm-up fills.

The table gives the median over the rounds and each contender's ratio to Inductor's (below 1 is faster).
On `--device cpu` passline runs its kernels under Triton's interpreter (and Inductor its C++ backend, slow to
compile there): `--smoke` sizes, for checking the script.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(model_name: str, contender: str, root: str, device: str, smoke: bool, steps: int) -> dict:
    """One first step in this (fresh) process; the caches under `root`."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton's import
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import models as M
    import torch

    cfg = dict(M.CONFIGS[model_name][2 if smoke else 1])
    master, dtype, inputs, fmt = M.build(model_name, cfg, device)
    model = M.place(master, device, dtype, fmt)
    marks: dict = {}
    M.sync(device)
    # the user's wait starts at the compiler's import: Inductor imports its code generators in torch.compile(),
    # passline its own package (dynamo's import is in both)
    t0 = [time.perf_counter()]

    def mark(what: str) -> None:
        marks.setdefault(what, round(time.perf_counter() - t0[0], 3))

    if contender.startswith("passline"):
        import passline
        from passline.backends import dynamo

        options = contender_settings(contender)
        with passline.settings(**options):
            backend = passline.backend(fallback="raise", cache_dir=os.path.join(root, "passline"))
        entry, compile_aten, load_aten = dynamo.Backend.__call__, dynamo.Backend.compile_aten, dynamo.Backend.load_aten

        def entered(self, gm, example_inputs):
            mark("dynamo")
            return entry(self, gm, example_inputs)

        def handed(self, gm, example_inputs, kind="graph", fx=None, **kw):
            mark("aot")
            return compile_aten(self, gm, example_inputs, kind, fx, **kw)
        def loaded(self, gm, kind, fx, key):  # aot_autograd's cache gave the graph back: nothing traced
            mark("aot")
            return load_aten(self, gm, kind, fx, key)
        dynamo.Backend.__call__, dynamo.Backend.compile_aten, dynamo.Backend.load_aten = entered, handed, loaded
    else:
        backend = "inductor"
    compiled = torch.compile(model, backend=backend)
    mark("compile()")
    step = M.make_step(compiled, inputs, device == "cuda")

    def sync():  # models.py's, for this device
        M.sync(device)
    t_step = time.perf_counter()
    model.zero_grad(set_to_none=True)
    loss = compiled(*inputs)  # the first step, in its two halves: the forward compiles here
    sync()
    mark("forward")
    loss.backward()  # and the backward here
    sync()
    mark("backward")
    first = marks["backward"]
    first_step = round(marks["backward"] - (t_step - t0[0]), 3)  # the step alone, imports and compile() not
    for _ in range(min(3, steps)):
        step()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    out = {"first_call_s": first, "first_step_s": first_step, "step_ms": round(statistics.median(times) * 1e3, 3),
           "marks": marks}
    if contender.startswith("passline"):
        out["graphs"] = [{"name": r.name, **{k: round(v, 3) for k, v in r.seconds.items()},
                          "aot_cache_hit": bool(r.metrics.counters.get("aot_cache_hits")),
                          "precompile": round(getattr(r.runner, "compile_seconds", 0.0), 3),
                          "binaries": r.metrics.counters.get("kernels_precompiled", 0),
                          "by_record": r.metrics.counters.get("binaries_loaded_by_record", 0)}
                         for r in backend.reports]
        from passline.backends.triton import precompile

        pool = precompile._POOL  # the compile workers forked in this process (none where nothing was compiled)
        out["compile_workers"] = pool.started if pool is not None else 0
    return out


def contender_settings(contender: str) -> dict:
    """passline's settings for a contender `passline[:SETTING=VALUE[+SETTING=VALUE]]`, each value read as its
    PASSLINE_* variable is (`autotune=0` is off)."""
    import attrs

    sys.path.insert(0, str(ROOT))
    from passline.config import Settings

    _, _, spec = contender.partition(":")
    spec = {"processes": "compile_in=processes", "threads": "compile_in=threads"}.get(spec, spec)
    pairs = [p.split("=", 1) for p in spec.split("+") if p]
    names = {f.name for f in attrs.fields(Settings)}
    for p in pairs:
        if len(p) != 2 or p[0] not in names:
            raise SystemExit(f"contender {contender!r}: expected passline:SETTING=VALUE[+SETTING=VALUE], "
                             f"a setting among {', '.join(sorted(names))}")
    try:
        parsed = Settings.from_environ({f"PASSLINE_{k.upper()}": v for k, v in pairs})
    except ValueError as e:
        raise SystemExit(f"contender {contender!r}: {e}") from None
    return {k: getattr(parsed, k) for k, _ in pairs}


def bytecode_kept() -> bool:
    """Whether the modules' bytecode is there for a new process: an installed package's is (pip compiles it at
    install, and Python writes what is missing beside the sources), so no module is compiled from source during
    a user's first call. Where none was compiled and Python may not write it (a read-only installation,
    PYTHONDONTWRITEBYTECODE), every process compiles each module it imports from source: seconds of a first
    call, which `main` moves to a bytecode directory of its own, filled by the warm-up runs."""
    import importlib.util

    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return True
    source = Path(importlib.util.find_spec("torch").origin).parent / "_inductor" / "compile_fx.py"
    if Path(importlib.util.cache_from_source(str(source))).exists():
        return True
    pycache = source.parent / "__pycache__"
    return not sys.flags.dont_write_bytecode and os.access(pycache if pycache.exists() else source.parent, os.W_OK)


def run_child(model_name, contender, root, args, smoke=None) -> dict:
    cmd = [sys.executable, __file__, "--child", model_name, contender, root, "--device", args.device]
    if args.smoke if smoke is None else smoke:
        cmd.append("--smoke")
    cmd += ["--steps", str(args.steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PASSLINE_COMPILE_IN")}
    if args.pycache:
        env["PYTHONPYCACHEPREFIX"] = args.pycache
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout)[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--contenders", default="inductor,passline,passline:threads",
                    help="inductor, passline, passline:SETTING=VALUE[+SETTING=VALUE] (e.g. compile_in=threads)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (models.py's), for checking the script")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a run may take")
    ap.add_argument("--steps", type=int, default=10, help="steady steps timed after the first (their median)")
    ap.add_argument("--out", help="write every run as JSON")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed smoke-size runs (each model through each contender) that first "
                         "import every module")
    ap.add_argument("--pycache", help="PYTHONPYCACHEPREFIX for the runs (default: a temporary one where Python "
                                      "cannot keep bytecode beside torch's sources)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "CONTENDER", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.smoke, max(1, args.steps))), flush=True)
        return 0
    models, contenders = args.models.split(","), args.contenders.split(",")
    for c in contenders:
        if c != "inductor" and not c.startswith("passline"):
            raise SystemExit(f"unknown contender {c!r}: inductor, passline, passline:SETTING=VALUE")
        contender_settings(c)  # a bad one stops here, before any run
    runs = []
    scratch = tempfile.TemporaryDirectory(prefix="passline-pycache-")
    if args.pycache is None and not bytecode_kept():
        args.pycache = scratch.name
        print(f"bytecode: none beside torch's sources and none to be written there; kept in {args.pycache}",
              file=sys.stderr, flush=True)
    if not args.no_warmup:  # a user's installation has every module's bytecode and its files in the OS's cache
        for m in models:  # (each model: a convolution imports what a transformer does not)
            for c in contenders:
                with tempfile.TemporaryDirectory(prefix="passline-warmup-") as root:
                    res = run_child(m, c, root, args, smoke=True)
                    print(f"warm-up [{m}] {c} (smoke sizes, untimed): "
                          + ("ok" if "error" not in res else res["error"][-300:]), file=sys.stderr, flush=True)
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for m in models:
            for c in order:
                with tempfile.TemporaryDirectory(prefix="passline-first-") as root:
                    for state in ("cold", "warm"):
                        res = run_child(m, c, root, args)
                        runs.append({"round": r, "model": m, "contender": c, "state": state, **res})
                        print(f"[{m}] {c} {state}: " + (f"{res['first_call_s']:.2f} s (the step alone "
                              f"{res['first_step_s']:.2f}), step {res['step_ms']:.2f} ms"
                              f" {res.get('marks', '')}" if "error" not in res else "ERROR " + res["error"][-300:]),
                              file=sys.stderr, flush=True)
                        if args.out:  # after every run: a run cut short keeps what it measured
                            Path(args.out).write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1))
    print(table(runs, models, contenders))
    scratch.cleanup()
    return 1 if any("error" in r for r in runs) else 0


def table(runs, models, contenders) -> str:
    """Medians over the rounds: the first call (from the compiler's import to the first backward's end) and,
    after the slash, the first step alone (from its start), each with its ratio to Inductor's."""
    def median(m, c, state, what):
        vals = [r[what] for r in runs if (r["model"], r["contender"], r["state"]) == (m, c, state)
                and "error" not in r and what in r]
        return statistics.median(vals) if vals else None

    lines = ["| model | contender | cold s: call / step | cold / Inductor | warm s: call / step | warm / Inductor |",
             "|---|---|---|---|---|---|"]
    whats = ("first_call_s", "first_step_s")
    for m in models:
        base = {(s, w): median(m, "inductor", s, w) for s in ("cold", "warm") for w in whats}
        for c in contenders:
            cells = []
            for s in ("cold", "warm"):
                v = {w: median(m, c, s, w) for w in whats}
                cells.append(" / ".join(f"{v[w]:.2f}" if v[w] is not None else "n/a" for w in whats))
                cells.append(" / ".join(f"{v[w] / base[s, w]:.2f}" if v[w] is not None and base[s, w] else "n/a"
                                        for w in whats))
            lines.append(f"| {m} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
