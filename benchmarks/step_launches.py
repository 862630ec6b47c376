"""What one training step of a benchmarks/models.py model launches: kernels, device-to-device copies and
memsets per step, for passline and Inductor, from torch.profiler.

    python benchmarks/step_launches.py [--models resnet] [--device cuda|cpu] [--smoke] [--no-inductor]
                                       [--passline-option KEY=VALUE ...]

A host-bound step pays for every launch, so this counts them: on a GPU, the device activities of one step
(after two warm steps) by kind, and the most frequent names; on the CPU (Triton's interpreter, no device
activity) the step's aten::copy_ calls stand in (the interpreter adds its own: compare two runs). ResNet-18-style with
BatchNorm in training mode wrote its running statistics with one `Memcpy DtoD` each (60 a step) until
passline stored them from the kernels computing them (docs/architecture.md, "Mutations of graph inputs").
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _kind(name: str) -> str:
    if name.startswith("Memcpy DtoD"):
        return "memcpy DtoD"
    if name.startswith("Memcpy"):
        return "memcpy other"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def count_step(step, device: str, top: int = 5) -> dict:
    """{kind: count} of what one call of `step` launches (CUDA), or of its aten::copy_ calls (CPU)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    counts: collections.Counter = collections.Counter()
    names: collections.Counter = collections.Counter()
    for e in prof.events():
        on_device = getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        if device == "cuda" and on_device:
            counts[_kind(e.name)] += 1
            names[e.name[:70]] += 1
        elif device != "cuda" and e.name == "aten::copy_":
            counts["aten::copy_"] += 1
    return {"counts": dict(counts), "top": names.most_common(top)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU: Triton's interpreter)")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--passline-option", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import ast

    import models
    import torch

    import passline

    options = {}
    for kv in args.passline_option:
        k, v = kv.split("=", 1)
        try:
            options[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            options[k] = v
    for name in args.models.split(","):
        cfg = dict(models.CONFIGS[name][2 if args.smoke else 1])
        master, dtype, inputs, fmt = models.build(name, cfg, args.device)
        contenders = {"passline": lambda m: torch.compile(m, backend=passline.backend(fallback="raise", **options))}
        if not args.no_inductor:
            contenders["inductor"] = torch.compile
        for label, wrap in contenders.items():
            torch._dynamo.reset()
            model = wrap(models.place(master, args.device, dtype, fmt))

            def step(model=model, inputs=inputs):
                model.zero_grad(set_to_none=True)
                model(*inputs).backward()

            found = count_step(step, args.device)
            print(f"{name} {label}: {found['counts']}")
            for n, c in found["top"]:
                print(f"    {c:4d}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
