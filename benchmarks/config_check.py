"""Every launch configuration a row kernel could be given, checked against the one it was given.

    python benchmarks/config_check.py [--cases layer_norm,...] [--widths 160,1000] [--rows 3001]
                                      [--dtypes bfloat16,float32] [--all]
    python benchmarks/config_check.py --device cpu          # small rows through Triton's interpreter

A configuration chosen by timing (`configs.uncertain`'s band at a kernel's first launch, or every candidate
with `autotune=True`) is picked for its speed alone: a candidate that computes a wrong value wins as readily as
a right one. This compiles each sweep case (benchmarks/bench_common.py, a training step and an inference call)
and, at each launch of a plain reduction kernel (not a mix-order kernel: its workspace depends on the split),
launches the candidates on a copy of the launch's arguments and compares every argument after it with the real
launch's (`runner.disagreement`, the check a timed choice must pass before it is kept: `Kernel._agreeing`): inputs
must be untouched, outputs equal within a reduction order's rounding. Candidates: the GPU's
lists (`configs.candidates` and the band) whatever the machine; by default the timed band's and every block of
several rows a program (the forty-ninth session found those regrouping lanes across rows, on the GPU
only: the interpreter never reorders), with `--all` every candidate. Exits 1 when a candidate disagrees.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class Checker:
    """Wraps `runner.Kernel.__call__`: after each real launch of a plain reduction kernel, launches the
    candidates on copies of the launch's arguments as they were before it, and records the differences."""

    def __init__(self, every: bool, variant: str | None = None):
        from passline.backends.triton import runner

        self.runner, self.every, self.variant = runner, every, variant
        self.checked, self.bad, self.skipped = 0, [], []
        self._call = runner.Kernel.__call__

    def install(self):
        checker, call = self, self._call

        def hooked(kernel, stream, args, xnumel, rnumel=None, wide=False):
            if type(kernel) is not checker.runner.Kernel or rnumel is None or kernel.mutates:
                return call(kernel, stream, args, xnumel, rnumel, wide)
            before = checker.runner._over_copies(args)  # (arguments sharing a storage still share it)
            call(kernel, stream, args, xnumel, rnumel, wide)
            checker.check(kernel, stream, args, before, xnumel, rnumel, wide)

        self.runner.Kernel.__call__ = hooked

    def uninstall(self):
        self.runner.Kernel.__call__ = self._call

    def candidates(self, kernel, xnumel, rnumel, args) -> list:
        """The GPU's candidates for this launch: the kernel's own band and autotuning lists (`Kernel._band`,
        `Kernel._autotune_candidates`), computed as for a GPU on any machine (the interpreter's are its rule)."""
        interpret, kernel.interpret = kernel.interpret, False
        try:
            band = kernel._band(xnumel, rnumel, args)
            every = kernel._autotune_candidates(xnumel, rnumel, args)
        finally:
            kernel.interpret = interpret
        every = [k for k in every if self.variant in (None, k.variant)]
        if self.every:
            return every
        return [k for k in every if k in band or k.xblock > 1]

    def check(self, kernel, stream, args, before, xnumel, rnumel, wide):
        import torch

        from passline.backends.triton import compat

        for cfg in self.candidates(kernel, xnumel, rnumel, args):
            trial = self.runner._over_copies(before, fresh=kernel.fresh)  # outputs poisoned: each must write them
            kernel.wide = wide
            where = f"{kernel.info.name} [{xnumel} x {rnumel}] {cfg}"
            try:
                kernel.launch(cfg, stream, trial, xnumel, rnumel)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            except compat.OutOfResources:
                self.skipped.append(where)  # does not compile here: the runner skips it too
                continue
            except Exception as e:  # noqa: BLE001 - a candidate that cannot launch otherwise is a finding
                self.bad.append(f"{where}: raised {e!r:.200}")
                continue
            self.checked += 1
            bad = self.runner.disagreement(trial, args)
            if bad is not None:
                self.bad.append(f"{where}: {bad}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--cases", default="cross_entropy,log_softmax,softmax,layer_norm,rms_norm,gelu_epilogue")
    ap.add_argument("--widths", default="48,160,1000,3000")
    ap.add_argument("--rows", type=int, default=None, help="rows of every point (default 3001; 67 on the CPU)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--all", action="store_true", help="every candidate, not only the band's and row blocks")
    ap.add_argument("--variant", default=None, help="only this variant's candidates (persistent, looped, ...)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import bench_common as bc
    import torch

    import passline

    rows = args.rows or (67 if args.device == "cpu" else 3001)
    checker = Checker(args.all, args.variant)
    checker.install()
    t0, failed = time.time(), False
    try:
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            for case in args.cases.split(","):
                for width in [int(w) for w in args.widths.split(",")]:
                    torch._dynamo.reset()
                    torch.manual_seed(0)
                    n0, c0 = len(checker.bad), checker.checked
                    try:
                        c = bc.make_case(case, rows, width, dtype, device=args.device)
                        fn = torch.compile(c.fn, backend=passline.backend(fallback="raise"), dynamic=False)
                        bc.grads(fn, c.inputs)
                        with torch.no_grad():
                            fn(*bc.fresh(c.inputs))
                    except Exception as e:  # noqa: BLE001 - reported, the other points still run
                        failed = True
                        print(f"{case} {dtype} {rows}x{width}: FAILED {e!r:.300}", flush=True)
                        continue
                    print(f"{case} {str(dtype)[6:]} {rows}x{width}: {checker.checked - c0} candidates, "
                          f"{len(checker.bad) - n0} disagree ({time.time() - t0:.0f} s)", flush=True)
    finally:
        checker.uninstall()
    print(f"\n{checker.checked} candidate launches, {len(checker.bad)} disagreeing, {len(checker.skipped)} not "
          "compiling on this device")
    for b in checker.bad:
        print("  ", b)
    return 1 if checker.bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
