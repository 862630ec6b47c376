"""passline's GPU kernels for one case of the sweep, compiled for sm_90 on any machine (no GPU needed).

    python benchmarks/kernel_probe.py --case cross_entropy --shape 4096x1000 [--dtype bfloat16]
                                      [--direction fwd|fwd_train|bwd] [--sms 132] [--source]
                                      [--configs "XBLOCK,WARPS;..."] [--pipeline TEXT]

The case is built on the CPU (benchmarks/bench_common.py `make_case`) and compiled with
`passline.backend()` as a CUDA graph would be: kernels generated for the GPU (not for Triton's
interpreter), `split_reductions` and the Triton rule planning for `--sms` SMs; the graphs then run eagerly
on the CPU. Every kernel whose sizes are static is compiled with the configuration its rule picks (and,
for reduction kernels, each `--configs` alternative: rows per program and warps) for sm_90 with Triton's
own ptxas, and printed with:

- its configuration (block sizes, warps);
- the global loads and stores of its PTX by width (`ld.global.v4.b32`: 16 bytes a thread; `ld.global.b16`:
  one bfloat16), i.e. whether Triton proved the vector width;
- registers a thread and local memory (spills), from cuobjdump;
- programs and rows one SM holds at once (65536 registers, 64 warps, at most 32 programs, 228 KiB of
  shared memory: an H100/H200), the bound on the bytes a persistent reduction has in flight.

The generated row count matters to the rule (rows per program, the split) but hardly to the source: a
small row count of the same width shows the same kernels, faster (the graphs run eagerly on the CPU).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

REGS, WARPS, PROGRAMS, SMEM = 65536, 64, 32, 233472  # one sm_90 SM


def resident(regs: int, warps: int, smem: int) -> int:
    """Programs of `warps` warps one SM holds at once (registers go to a warp 256 at a time)."""
    per_warp = -(-regs * 32 // 256) * 256
    return max(0, min(PROGRAMS, WARPS // warps, REGS // (per_warp * warps), SMEM // (smem + 1024)))


def with_option(pipeline: str, name: str, option: str) -> str:
    """`pipeline` with `option` added to pass `name`'s options (kept where it has some already)."""
    return re.sub(rf"\b{name}\b(?:\(([^()]*)\))?",
                  lambda m: f"{name}({option}" + (f", {m.group(1)}" if m.group(1) else "") + ")", pipeline)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="cross_entropy")
    ap.add_argument("--shape", default="4096x1000", help="ROWSxWIDTH")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--direction", default="fwd", choices=("fwd", "fwd_train", "bwd"))
    ap.add_argument("--sms", type=int, default=132, help="SMs the pass and the rule plan for (H200: 132)")
    ap.add_argument("--source", action="store_true", help="print each kernel's source and graph")
    ap.add_argument("--sass", metavar="DIR", help="write the rule's binary of each kernel, disassembled, to DIR")
    ap.add_argument("--configs", default="", help="alternatives for reduction kernels: 'XBLOCK,WARPS;...'")
    ap.add_argument("--pipeline", default=None,
                    help="passline's pipeline (default passline.DEFAULT_PIPELINE), e.g. with a pass's options changed")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # kernels for the GPU
    root = tempfile.mkdtemp(prefix="passline-probe-")
    os.environ["PASSLINE_CACHE_DIR"] = os.path.join(root, "passline")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    try:
        return run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args, root) -> int:
    import torch
    from bench_common import make_case
    from triton.backends.compiler import GPUTarget

    import passline
    from passline.backends import dynamo as pdynamo
    from passline.backends.triton import configs
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.cache import load_kernel
    from passline.backends.triton.precompile import _args, offline

    # GPU code for CPU graphs: the runner is built as on a GPU, its kernels listed instead of compiled
    jobs = []
    pdynamo._on_cpu = lambda graph: False
    configs.Device.current = staticmethod(lambda: configs.Device(args.sms))
    prunner.TritonRunner.precompile = lambda self, workers=8: jobs.extend(self.precompile_jobs())
    compile_aten = passline.Backend.compile_aten

    def eagerly(self, gm, example_inputs, kind="graph", fx=None):
        compile_aten(self, gm, example_inputs, kind, fx)
        return gm

    passline.Backend.compile_aten = eagerly
    m, n = map(int, args.shape.split("x"))
    case = make_case(args.case, m, n, getattr(torch, args.dtype), "cpu")
    pipeline = args.pipeline or passline.DEFAULT_PIPELINE
    for name in ("split_reductions", "tile_rows", "mix_order_reduction"):
        pipeline = with_option(pipeline, name, f"sms={args.sms}")
    be = passline.backend(pipeline=pipeline, fallback="raise")
    fn = torch.compile(case.fn, backend=be, dynamic=False)
    if args.direction == "fwd":
        with torch.no_grad():
            fn(*[x.detach() for x in case.inputs])
    else:
        ins = [x.detach().clone().requires_grad_(x.requires_grad) for x in case.inputs]
        y = fn(*ins)
        if args.direction == "bwd":
            y.backward(torch.randn_like(y))
    for r in be.reports:
        print(f"== {r.summary()}")
        if args.source:
            print(r.graph.format())
    target = GPUTarget("cuda", 90, 32)
    cuobjdump = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    alternatives = [tuple(map(int, c.split(","))) for c in args.configs.split(";") if c.strip()]
    for job in jobs:
        kw = dict(job.kwargs)
        variants = [kw] + [dict(kw, XBLOCK=xb, num_warps=w) for xb, w in alternatives
                           if "RBLOCK" in kw and "SPLIT" not in kw]
        for i, kwargs in enumerate(variants):
            fn_ = load_kernel(Path(job.path), job.fn_name, False)
            with offline(target):
                k = fn_.warmup(*_args(job), grid=(1,), **kwargs)
            ptx = k.asm["ptx"]
            loads = Counter(re.findall(r"ld\.global[.\w:]*", ptx))
            stores = Counter(re.findall(r"st\.global[.\w]*", ptx))
            cubin = Path(root) / "k.cubin"
            cubin.write_bytes(k.asm["cubin"])
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True,
                                   text=True).stdout
            regs = int(re.search(r"REG:(\d+)", usage).group(1))
            # spills land on the stack (STACK); LOCAL counts only local arrays and stays 0 when a kernel spills
            local = max(int(m) for m in re.findall(r"(?:LOCAL|STACK):(\d+)", usage))
            smem = k.metadata.shared
            progs = resident(regs, kwargs["num_warps"], smem)
            blocks = " ".join(f"{b}={kwargs[b]}" for b in ("XBLOCK", "RBLOCK", "SPLIT", "STAGES") if b in kwargs)
            sizes = " x ".join(str(a) for a in job.args if isinstance(a, int))
            print(f"{'--' if i == 0 else '  '} {job.fn_name} [{sizes}] {blocks} warps={kwargs['num_warps']}"
                  f"{' (rule)' if i == 0 else ''}\n   loads {dict(loads)} stores {dict(stores)}\n"
                  f"   registers {regs}, local (spills) {local} B, shared {smem} B: {progs} programs"
                  f" ({progs * kwargs['XBLOCK']} {'rows' if 'RBLOCK' in kwargs else 'elements'}) an SM")
            if args.sass and i == 0:  # the rule's binary as the GPU runs it, to count a loop's instructions
                out = Path(args.sass) / f"{job.fn_name}_{blocks.replace(' ', '_')}_w{kwargs['num_warps']}.sass"
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True,
                                              text=True).stdout)
                print(f"   sass: {out}")
            if args.source and i == 0:
                src = Path(job.path).read_text()
                print(src[src.index(f"def {job.fn_name}("):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
