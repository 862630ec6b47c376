"""CPU cost of a step where the CPU bounds the time: tiny training steps, eager vs Inductor vs passline.

    python benchmarks/launch.py [--steps 300] [--dtype bfloat16]
    python benchmarks/launch.py --per-launch [--launches 2000]

Each case is a training step (forward, `loss.backward()`) on tensors so small that the GPU finishes each
kernel before the host has issued the next: the time per step is the host's time to run the compiled
wrappers and launch the kernels. Steps are issued back to back and synchronized once at the end. The
table gives µs per step and, for passline, the kernels and extern calls it launches per step and the
µs per launch (step time / launches, an upper bound: the step also runs autograd and the compiled
region's wrappers); then the same with CUDA graphs: Inductor's `mode="reduce-overhead"` against
`passline.backend(cudagraphs=True)`.

With `--per-launch`, one launch's host time alone, Inductor's against passline's in one process: each
contender's step runs once with its launcher recorded (Inductor's `CachingAutotuner.run`, passline's
`Kernel.__call__`: the path from the generated call to the driver), then every recorded launch is replayed
`--launches` times in a row, the contenders interleaved over five rounds; the figure is µs a launch, the
median of the rounds of the mean over the step's kernels.
"""
from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import passline  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))


class Chain(torch.nn.Module):
    """Many small kernels per step: 24 row-centerings, each a reduction fused with its epilogue."""

    def __init__(self, d, n=24):
        super().__init__()
        self.n, self.w = n, torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        for _ in range(self.n):
            x = x - x.mean(-1, keepdim=True)
            x = x * torch.sigmoid(x) * self.w
        return x


CASES = {
    "layer_norm": (lambda d: torch.nn.LayerNorm(d), (64, 768)),
    "rms_norm": (lambda d: torch.nn.RMSNorm(d), (64, 1024)),
    "mlp_block": (lambda d: MLP(d), (64, 256)),
    "chain": (lambda d: Chain(d), (64, 256)),
}


def step_fn(model, mark=False):
    params = list(model.parameters())

    def step(x):
        # gradients set to None each step, as optimizer.zero_grad() does (with CUDA graphs a kept
        # .grad would be a replayed graph's output that the next replay overwrites)
        x.grad = None
        for p in params:
            p.grad = None
        if mark:  # Inductor's CUDA graph trees: a new step may overwrite the previous one's outputs
            torch.compiler.cudagraph_mark_step_begin()
        out = model(x)
        out.float().pow(2).mean().backward()
    return step


def per_step_us(step, x, steps: int) -> float:
    for _ in range(5):
        step(x)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            step(x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps * 1e6)
    return best


def case_inputs(name: str, dtype):
    """(the case's module on the GPU, an input requiring grad, its shape)."""
    make, shape = CASES[name]
    base = make(shape[-1]).to("cuda", dtype)
    return base, torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True), shape


def recorded_launches(run_step, x) -> dict:
    """{"inductor": [...], "passline": [...]}: (function, args, kwargs) of every kernel launch one step makes,
    through each compiler's launcher (Inductor's CachingAutotuner.run, passline's Kernel.__call__)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from passline.backends.triton.runner import Kernel

    seen = {"inductor": [], "passline": []}
    originals = CachingAutotuner.run, Kernel.__call__

    def inductor_run(self, *args, **kwargs):
        seen["inductor"].append((functools.partial(originals[0], self), args, kwargs))
        return originals[0](self, *args, **kwargs)

    def passline_call(self, *args, **kwargs):
        seen["passline"].append((functools.partial(originals[1], self), args, kwargs))
        return originals[1](self, *args, **kwargs)

    CachingAutotuner.run, Kernel.__call__ = inductor_run, passline_call
    try:
        for step in run_step:
            step(x)
        torch.cuda.synchronize()
    finally:
        CachingAutotuner.run, Kernel.__call__ = originals
    return seen


def per_launch_us(launches: list, n: int) -> float:
    """Mean host µs of one launch over `launches`, each replayed n times back to back."""
    total = 0.0
    for fn, args, kwargs in launches:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args, **kwargs)
        total += (time.perf_counter() - t0) / n
        torch.cuda.synchronize()
    return total / len(launches) * 1e6


def main_per_launch(a, dtype) -> int:
    print("| case | Inductor launches a step | passline launches a step | Inductor µs a launch | passline µs a launch "
          "| passline / Inductor (rounds) |")
    print("|---|---|---|---|---|---|")
    for name in a.cases.split(","):
        base, x, shape = case_inputs(name, dtype)
        steps = []
        for backend in ("inductor", passline.backend(fallback="raise")):
            torch._dynamo.reset()
            step = step_fn(torch.compile(copy.deepcopy(base), backend=backend))
            for _ in range(3):
                step(x)
            steps.append(step)
        seen = recorded_launches(steps, x)
        times = {k: [] for k in seen}
        for r in range(5):
            for k in (list(seen) if r % 2 else list(reversed(list(seen)))):
                times[k].append(per_launch_us(seen[k], a.launches))
        ratios = sorted(p / i for p, i in zip(times["passline"], times["inductor"]))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} {tuple(shape)} | {len(seen['inductor'])} | {len(seen['passline'])} | {med['inductor']:.2f} "
              f"| {med['passline']:.2f} | {statistics.median(ratios):.3f} ({ratios[0]:.3f}–{ratios[-1]:.3f}) |",
              flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--per-launch", action="store_true",
                   help="one launch's host time, Inductor's launcher against passline's (replayed launches)")
    p.add_argument("--launches", type=int, default=2000, help="with --per-launch: replays of each launch a round")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}, {a.dtype}, {a.steps} steps")
    if a.per_launch:
        return main_per_launch(a, dtype)
    print("| case | eager µs | Inductor µs | passline µs | passline / Inductor | passline launches | µs per launch "
          "| Inductor reduce-overhead µs | passline cudagraphs µs | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.cases.split(","):
        base, x, shape = case_inputs(name, dtype)
        eager = per_step_us(step_fn(copy.deepcopy(base)), x, a.steps)
        torch._dynamo.reset()
        ind = per_step_us(step_fn(torch.compile(copy.deepcopy(base))), x, a.steps)
        torch._dynamo.reset()
        be = passline.backend(fallback="raise")
        pl = per_step_us(step_fn(torch.compile(copy.deepcopy(base), backend=be)), x, a.steps)
        launches = sum(r.kernels + r.externs for r in be.reports)
        torch._dynamo.reset()
        ind_ro = per_step_us(step_fn(torch.compile(copy.deepcopy(base), mode="reduce-overhead"), mark=True), x, a.steps)
        torch._dynamo.reset()
        be_cg = passline.backend(fallback="raise", cudagraphs=True)
        pl_cg = per_step_us(step_fn(torch.compile(copy.deepcopy(base), backend=be_cg)), x, a.steps)
        print(f"| {name} {tuple(shape)} | {eager:.0f} | {ind:.0f} | {pl:.0f} | {pl / ind:.2f} | {launches} | "
              f"{pl / max(1, launches):.1f} | {ind_ro:.0f} | {pl_cg:.0f} | {pl_cg / ind_ro:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
