"""Per kernel: what a training step of one sweep case launches, passline's choice for each, and its GPU time.

    python benchmarks/kernel_times.py CASE:ROWSxWIDTH:DTYPE [...]          # e.g. rms_norm:8192x2304:float32
                                      [--autotune] [--no-inductor] [--calls 20] [--timings 6] [--json FILE]
                                      [--pipeline LABEL=PIPELINE ...]
    python benchmarks/kernel_times.py gelu_epilogue:64x300:float32 --device cpu   # choices only, interpreter

A case is one of benchmarks/bench_common.py's (`layer_norm`, `rms_norm`, `softmax`, `log_softmax`,
`gelu_epilogue`, `cross_entropy`, ...), at the given shape and dtype. Its training step is the forward with
every input requiring grad and `torch.autograd.grad` of the output with a fixed random cotangent (a scalar
loss: ones), for each contender compiled alone after `torch._dynamo.reset()`: Inductor (`torch.compile`
default), passline (`passline.backend(fallback="raise")`, a fresh cache directory so every choice is made in
this run) and, with --autotune, passline with `autotune=True`.

CUDA: the step runs (compiling; checked against eager), once more, then --calls steps under torch.profiler;
each kernel's device time is summed over them and divided by --calls (µs a step; memsets and copies included
under their own names). For passline's kernels the table adds the configuration the kernel launched with
(variant and blocks, the report's `KernelInfo`) and, where the first launch timed candidates (the timed bands
of docs/backends.md, or all of them with --autotune), the fastest --timings of them in µs as timed (a mix-order
kernel's with its finishing kernel, `+finish`). What the sweep (`sweep.py`) reports as one number per
direction, this splits by kernel: which kernel is slower than its Inductor counterpart, and whether the rule or
the timing chose it.

Each contender's gradients are compared with eager's in the case's dtype (relative error: norm of the difference
over eager's norm, printed and in --json; the sweep's float64 check is the strict one).

CPU (`--device cpu`, Triton's interpreter): nothing is timed; each passline kernel and its configuration are
listed (the interpreter's: few, large programs), which checks that the case compiles and runs.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import torch  # (does not import triton: TRITON_INTERPRET is set in main(), before anything does)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import differentiated, fresh, gpu_profile, make_case, rel_err  # noqa: E402


def parse_case(text: str) -> tuple:
    """`CASE:ROWSxWIDTH:DTYPE` -> (case, rows, width, dtype)."""
    try:
        name, shape, dtype = text.split(":")
        rows, width = (int(n) for n in shape.lower().split("x"))
        return name, rows, width, getattr(torch, dtype)
    except (ValueError, AttributeError) as e:
        raise argparse.ArgumentTypeError(f"want CASE:ROWSxWIDTH:DTYPE (rms_norm:8192x2304:float32), got {text!r}") \
            from e


def training_step(fn, case):
    """A call running `fn`'s forward on fresh leaves and the gradients of everything the case differentiates."""
    ins = fresh(case.inputs)
    y0 = case.fn(*fresh(case.inputs))
    g = torch.Generator(device=y0.device).manual_seed(0)  # the same cotangent for every contender
    cotangent = torch.ones_like(y0) if y0.dim() == 0 else \
        torch.randn(y0.shape, generator=g, device=y0.device, dtype=torch.float32).to(y0.dtype)

    def step():
        y = fn(*ins)
        return torch.autograd.grad(y, differentiated(case.fn, ins), cotangent)

    return step


def kernel_us(step, calls: int) -> dict:
    """{kernel name: device µs a step} over `calls` steps under torch.profiler (bench_common.gpu_profile)."""
    from torch.autograd import DeviceType

    out: dict = collections.defaultdict(float)
    for e in gpu_profile(step, calls).events():
        if e.device_type == DeviceType.CUDA:
            out[e.name] += e.device_time / calls
    return dict(out)


def passline_kernels(be) -> dict:
    """{kernel name: its KernelInfo} of every graph the backend compiled (a shared kernel under its own name)."""
    return {k.name: k for r in be.reports for k in r.kernel_info}


def fastest_timings(info, most: int) -> list:
    """The `most` fastest configurations the kernel's first launch timed: [(ms, configuration)]."""
    timed = [(t, c) for c, t in info.timings.items() if isinstance(t, float)]
    return sorted(timed)[:most]


def contenders(autotune: bool, inductor: bool, device: str, pipelines=()) -> list:
    out = [("inductor", None)] if inductor and device == "cuda" else []
    out.append(("passline", dict(autotune=False)))
    if autotune and device == "cuda":
        out.append(("passline autotune", dict(autotune=True)))
    for text in pipelines:  # LABEL=PIPELINE: passline again, with that pipeline
        label, _, pipeline = text.partition("=")
        out.append((f"passline {label}", dict(autotune=False, pipeline=pipeline)))
    return out


def pipeline_option(text: str) -> str:
    """--pipeline's LABEL=PIPELINE, checked: a label (a word) before the first '='."""
    label, sep, pipeline = text.partition("=")
    if not sep or not label.isidentifier() or not pipeline.strip():
        raise argparse.ArgumentTypeError(f"want LABEL=PIPELINE (wide='dce, fuse(max_nodes=64)'), got {text!r}")
    return text


def run_case(spec: tuple, args) -> dict:
    name, rows, width, dtype = spec
    case = make_case(name, rows, width, dtype, device=args.device)
    result = {"case": f"{name}:{rows}x{width}:{str(dtype).split('.')[-1]}", "contenders": {}}
    print(f"\n== {result['case']}")
    expected = training_step(case.fn, case)()  # eager's gradients, to check each contender's against
    for who, options in contenders(args.autotune, not args.no_inductor, args.device, args.pipeline):
        import passline

        torch._dynamo.reset()
        be = None
        if options is None:
            fn = torch.compile(case.fn, dynamic=False)
        else:
            be = passline.backend(fallback="raise", cache_dir=tempfile.mkdtemp(prefix="passline-kt-"), **options)
            fn = torch.compile(case.fn, backend=be, dynamic=False)
        step = training_step(fn, case)
        err = max(rel_err(a, b) for a, b in zip(step(), expected))
        infos = passline_kernels(be) if be is not None else {}  # (compiled by the step above)
        # the interpreter: compiled and run (above), nothing timed
        times = kernel_us(step, args.calls) if args.device == "cuda" else dict.fromkeys(infos)
        total = sum(t for t in times.values() if t) if args.device == "cuda" else None
        print(f"  {who}: " + (f"{total:.1f} us a step" if total is not None else "kernels (not timed)")
              + f"; gradients against eager's: relative error {err:.1e}")
        kernels = []
        for kname, t in sorted(times.items(), key=lambda kv: -(kv[1] or 0)):
            info = infos.get(kname)
            config = f"{info.chosen} {info.blocks}" if info is not None else ""
            print(f"    {'' if t is None else f'{t:9.1f}'}  {kname[:48]:48s} {config}")
            timed = fastest_timings(info, args.timings) if info is not None else []
            for ms, c in timed:
                print(f"               {ms * 1e3:9.1f} us timed  {c}")
            kernels.append({"kernel": kname, "us": t, "config": config,
                            "timed": [{"us": ms * 1e3, "config": c} for ms, c in timed]})
        result["contenders"][who] = {"total_us": total, "rel_err": err, "kernels": kernels}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", type=parse_case, help="CASE:ROWSxWIDTH:DTYPE (layer_norm:8192x768:bfloat16)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--autotune", action="store_true", help="also passline with autotune=True")
    ap.add_argument("--no-inductor", action="store_true", help="leave Inductor out")
    ap.add_argument("--calls", type=int, default=20, help="profiled steps (default 20)")
    ap.add_argument("--timings", type=int, default=6, help="timed configurations shown a kernel (default 6)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--pipeline", action="append", default=[], metavar="LABEL=PIPELINE", type=pipeline_option,
                    help="also passline with this pipeline, shown as 'passline LABEL' (repeatable), e.g. "
                         "wide='dce, fuse(max_nodes=64)'")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # passline's Triton kernels on CPU tensors; before triton's import
    results = [run_case(spec, args) for spec in args.cases]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
