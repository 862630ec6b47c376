"""passline under DDP and FSDP2: training steps of the GPT-style model, eager vs Inductor vs passline.

    torchrun --nproc-per-node 2 benchmarks/distributed.py --device cuda [--steps 20] [--modes ddp,fsdp2]
             [--backends eager,inductor,passline] [--layers N] [--batch N] [--seq N] [--out FILE.json]
    torchrun --nproc-per-node 2 benchmarks/distributed.py --device cpu --smoke    # gloo; a few minutes

The model is the GPT-2-style model of benchmarks/models.py (`GPT`, its `gpt2` config: bfloat16 weights,
the loss computed in the compiled forward); --smoke takes its tiny config. Every rank builds it from the
same seed and trains on its own batches (a different random token batch per rank and step, the same for
every contender). One training step: `zero_grad`, `loss = model(x, y)`, `loss.backward()`, AdamW `step`.

- ddp: `DistributedDataParallel(model)`, then `torch.compile` of it (dynamo's DDPOptimizer splits the graph
  at gradient-bucket boundaries; DDP's all-reduces run between the compiled pieces).
- fsdp2: `fully_shard` on every block and on the root, then `torch.compile` of the root (FSDP2's
  all-gathers and reduce-scatters run in its hooks, outside the compiled graphs).

Contenders, one after another in the same processes, each from the same initial weights: eager,
Inductor (`torch.compile(model)`), passline (`passline.backend(fallback="raise")`: a graph passline cannot
compile is an error, never a quiet eager fallback). Each runs --steps steps; the losses of every step on
every rank are compared with eager's (bfloat16 tolerance: |loss - eager| <= 2e-2 + 2e-2 |eager|; float32:
1e-4), and the script exits 1 if passline's are not within it (Inductor's difference is shown beside, for
scale: both differ from eager by rounding).

Columns, printed by rank 0 as a markdown table: step ms (median over the steps after the first --warmup,
each step timed from a synchronized start to a synchronized end; the slowest rank's median), / Inductor,
first step s (compilation included), peak GiB per rank (torch.cuda.max_memory_allocated over the timed
steps: weights, gradients, optimizer state, activations; "n/a" on the CPU), max |Δloss| against eager
over all steps and ranks, and graphs compiled (dynamo graphs' forward + backward).

The model comes from one place, `build_model` below: to benchmark another, change it there.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def model_config(args) -> dict:
    from models import CONFIGS  # benchmarks/models.py

    cfg = dict(CONFIGS["gpt2"][2 if args.smoke else 1])
    for key in ("layers", "batch", "seq", "vocab", "dtype"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    return cfg


def build_model(cfg, device):
    """The model in its dtype on `device`: the same weights on every rank and for every contender."""
    from models import GPT  # benchmarks/models.py

    torch.manual_seed(0)
    model = GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["seq"])
    return model.to(device=device, dtype=getattr(torch, cfg["dtype"]))


def batches(cfg, rank: int, steps: int, device):
    """Each rank its own tokens (DDP and FSDP2 must combine the ranks' gradients), the same for every
    contender."""
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g)
        out.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return out


def wrap(mode: str, model, args):
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[args.local_rank] if args.device == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def run_contender(mode: str, name: str, args, rank: int) -> dict:
    import passline

    torch._dynamo.reset()
    cfg = model_config(args)
    model = build_model(cfg, args.device_obj)
    data = batches(cfg, rank, args.steps, args.device_obj)
    model = wrap(mode, model, args)
    be = None
    if name == "inductor":
        model = torch.compile(model)
    elif name == "passline":
        be = passline.backend(fallback="raise")
        model = torch.compile(model, backend=be)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, times = [], []
    for k, (x, y) in enumerate(data):
        if k == args.warmup and args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(args)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        sync(args)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    out = dict(losses=[float(v) for v in losses], first_s=times[0],
               step_ms=statistics.median(times[args.warmup:]) * 1e3, peak_gib=peak)
    if be is not None:
        out["graphs"] = len(be.reports)
        out["fallbacks"] = len(be.failures)
    del model, opt, data
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


def gather(value):
    """Every rank's value, in rank order (on every rank)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def compare(results: dict, dtype) -> None:
    """Adds `max_dloss` (against eager, over all steps and ranks) and `ok` to each non-eager result."""
    tol = TOL.get(dtype, 1e-4)
    for by_name in results.values():
        eager = by_name.get("eager")
        for name, per_rank in by_name.items():
            if name == "eager" or eager is None or any("error" in r for r in per_rank + eager):
                continue
            worst, ok = 0.0, True
            for mine, ref in zip(per_rank, eager):
                for a, b in zip(mine["losses"], ref["losses"], strict=True):
                    worst = max(worst, abs(a - b))
                    ok &= abs(a - b) <= tol + tol * abs(b)
            for r in per_rank:
                r["max_dloss"], r["ok"] = worst, ok


def table(results: dict, args) -> str:
    lines = ["| mode | backend | step ms | / Inductor | first step s | peak GiB per rank | max abs(Δloss) vs eager "
             "| graphs |", "|---|---|---|---|---|---|---|---|"]
    for mode, by_name in results.items():
        ind = by_name.get("inductor")
        ind_ms = max(r["step_ms"] for r in ind) if ind and not any("error" in r for r in ind) else None
        for name, per_rank in by_name.items():
            if any("error" in r for r in per_rank):
                err = next(r["error"] for r in per_rank if "error" in r).strip().splitlines()[-1]
                lines.append(f"| {mode} | {name} | error: {err[:120]} | | | | | |")
                continue
            ms = max(r["step_ms"] for r in per_rank)  # the slowest rank sets the pace
            ratio = f"{ms / ind_ms:.2f}" if ind_ms else "-"
            peak = " / ".join(f"{r['peak_gib']:.2f}" for r in per_rank) if per_rank[0]["peak_gib"] is not None \
                else "n/a"
            dloss = "-" if name == "eager" else f"{per_rank[0]['max_dloss']:.1e}" + \
                ("" if per_rank[0]["ok"] else " **MISMATCH**")
            graphs = str(per_rank[0].get("graphs", "-")) + \
                (f" ({per_rank[0]['fallbacks']} eager)" if per_rank[0].get("fallbacks") else "")
            lines.append(f"| {mode} | {name} | {ms:.1f} | {ratio} | {max(r['first_s'] for r in per_rank):.1f} | "
                         f"{peak} | {dloss} | {graphs} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="the tiny model config (a quick check of the path)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per contender (default 20; 4 with --smoke)")
    ap.add_argument("--warmup", type=int, default=None, help="first steps not timed (default 3; 1 with --smoke)")
    ap.add_argument("--modes", default="ddp,fsdp2")
    ap.add_argument("--backends", default="eager,inductor,passline")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--batch", type=int, help="sequences per rank and step")
    ap.add_argument("--seq", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: the model config's (bfloat16)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", help="write the results as JSON (rank 0)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (4 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    if not 0 <= args.warmup < args.steps:
        ap.error("--warmup must be smaller than --steps")
    args.modes = [m for m in args.modes.split(",") if m]
    args.backends = [b for b in args.backends.split(",") if b]
    if "eager" not in args.backends:
        args.backends.insert(0, "eager")  # the losses are compared with eager's
    bad = [m for m in args.modes if m not in ("ddp", "fsdp2")] + \
        [b for b in args.backends if b not in ("eager", "inductor", "passline")]
    if bad:
        ap.error(f"unknown mode or backend: {', '.join(bad)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit("launch with torchrun: torchrun --nproc-per-node 2 benchmarks/distributed.py --device cpu --smoke")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # passline's Triton kernels on CPU tensors
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(args.local_rank)
        args.device_obj = torch.device("cuda", args.local_rank)
        dist.init_process_group("nccl", device_id=args.device_obj, timeout=datetime.timedelta(minutes=20))
    else:
        args.device_obj = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=20))
    import triton

    import passline

    cfg = model_config(args)
    dtype = getattr(torch, cfg["dtype"])
    results: dict = {}
    failed = False
    try:
        for mode in args.modes:
            results[mode] = {}
            for name in args.backends:
                t0 = time.perf_counter()
                try:
                    mine = run_contender(mode, name, args, rank)
                except Exception:  # recorded; the other contenders still run (a symmetric failure)
                    mine = dict(error=traceback.format_exc())
                    failed = True
                results[mode][name] = gather(mine)
                if rank == 0:
                    print(f"[{mode} {name}] {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        compare(results, dtype)
        if rank == 0:
            device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (gloo)"
            head = (f"{world} ranks on {device}; GPT-2-style {cfg['layers']} layers, d {cfg['d']}, "
                    f"batch {cfg['batch']} x seq {cfg['seq']} per rank, {dtype}; {args.steps} steps "
                    f"(median of the last {args.steps - args.warmup}); torch {torch.__version__}, "
                    f"triton {triton.__version__}, passline {passline.__version__}")
            print(head + "\n\n" + table(results, args), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(dict(meta=head, config=cfg, results=results), indent=1))
        bad = [f"{mode}/{name}" for mode, by_name in results.items() for name, rs in by_name.items()
               if name == "passline" and any(not r.get("ok", True) or "error" in r for r in rs)]
        failed |= bool(bad)
        if bad and rank == 0:
            print(f"passline's losses differ from eager's (or it failed): {', '.join(bad)}", file=sys.stderr)
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
