"""Host time of a training step, passline against Inductor, measured step by step in turn.

    python benchmarks/host_steps.py [--models llama,resnet] [--rounds 60] [--option KEY=VALUE ...]
                                    [--variant KEY=VALUE ...]

The models of benchmarks/models.py (full size, CUDA) are compiled with both backends in one process; then
each round times one step of each contender, in alternating order, with the GPU held busy by a sleep
kernel queued first, so the time is the host's alone (guards, AOTAutograd's wrappers, the backend's call,
launches). The lent GPU hosts change speed by tens of percent within minutes, which moved the "CPU
ms/step" column of models.py (one contender after another) more than the changes it was meant to show;
two steps timed back to back see the same host. Reported: each contender's median, the median of the
per-round ratios passline / Inductor and their quartiles; then each contender's step time (do_bench,
three alternating runs). `--variant` adds a third contender, passline with those options on top of
`--option`'s, timed in the same rounds and reported on a row of its own (an A/B of one change, same host).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def host_ms(step, cycles_per_ms: float, sleep_ms: float) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_ms * cycles_per_ms))
    t0 = time.perf_counter()
    step()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    import models

    import passline

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama,resnet")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--option", action="append", default=[], type=models.parse_option, metavar="KEY=VALUE",
                    help="passed to passline.backend() (repeatable)")
    ap.add_argument("--variant", action="append", default=[], type=models.parse_option, metavar="KEY=VALUE",
                    help="a third contender: passline with these options too (repeatable)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_steps.py times CUDA steps: no GPU here")
        return 1
    options = dict(args.option)
    cpm = models.cycles_per_ms()
    print("| model | Inductor host ms | passline host ms | passline / Inductor (median of rounds) | quartiles "
          "| Inductor step ms | passline step ms | step ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        master, dtype, inputs, fmt = models.build(name, models.CONFIGS[name][1], "cuda")
        steps = {}
        contenders = {"inductor": "inductor", "passline": options}
        if args.variant:
            contenders["variant"] = {**options, **dict(args.variant)}
        for label, opts in contenders.items():
            torch._dynamo.reset()
            model = models.place(master, "cuda", dtype, fmt)
            backend = opts if label == "inductor" else passline.backend(fallback="raise", **opts)
            steps[label] = models.make_step(torch.compile(model, backend=backend), inputs, True)
            for _ in range(5):
                steps[label]()
        torch.cuda.synchronize()
        # the sleep outlasts a step's issue (the host never waits for the GPU): 3× a first timed step
        sleep_ms = max(20.0, 3 * max(host_ms(s, cpm, 50.0) for s in steps.values()))
        times = {k: [] for k in steps}
        for r in range(args.rounds):
            order = list(steps) if r % 2 else list(reversed(steps))
            for k in order:
                times[k].append(host_ms(steps[k], cpm, sleep_ms))
        torch.cuda.synchronize()
        from triton.testing import do_bench

        bench = {k: [] for k in steps}
        for _ in range(3):
            for k, s in steps.items():
                bench[k].append(do_bench(s, warmup=25, rep=150, return_mode="median"))
        ms = {k: statistics.median(v) for k, v in bench.items()}
        for label in [k for k in steps if k != "inductor"]:
            ratios = sorted(p / i for p, i in zip(times[label], times["inductor"]))
            q = len(ratios) // 4
            row = name if label == "passline" else f"{name} ({', '.join(f'{k}={v}' for k, v in args.variant)})"
            print(f"| {row} | {statistics.median(times['inductor']):.2f} | {statistics.median(times[label]):.2f} "
                  f"| {statistics.median(ratios):.3f} | {ratios[q]:.3f}–{ratios[-q - 1]:.3f} | {ms['inductor']:.2f} "
                  f"| {ms[label]:.2f} | {ms[label] / ms['inductor']:.3f} |", flush=True)
        del steps
    return 0


if __name__ == "__main__":
    sys.exit(main())
