"""A GPT-2-style LM head's training step at a wide vocabulary: peak memory and time of eager, Inductor,
passline, and passline with `fuse_linear_cross_entropy` (issue 16, part 4).

    python benchmarks/linear_cross_entropy.py [--device cuda|cpu] [--smoke] [--no-inductor]
        [--batch 8] [--seq 1024] [--hidden 768] [--vocab 128256] [--chunk-rows 0] [--out FILE.json]

The model is GPT-2's end (no downloads): the token embedding, whose weight is also the LM head's (tied),
added to a hidden state `h` that stands for the transformer blocks' output, the final LayerNorm, the head
and a float32 cross-entropy (`F.cross_entropy(logits.float().view(-1, V), targets.view(-1),
ignore_index=-1)`, a few targets ignored), all bfloat16. A step is zero_grad, forward and loss,
backward (no optimizer). Defaults: 8 x 1024 tokens, hidden 768, vocabulary 128256 (Llama 3's): the
logits are 2 GiB in bfloat16 and 4 GiB once upcast, the weight 188 MiB.

Contenders, each on a fresh copy of the same weights, in this process: eager, `torch.compile(model)`
(Inductor; --no-inductor leaves it out), `passline.backend()` (the default pipeline), and
`passline.backend(pipeline="fuse_linear_cross_entropy(chunk_rows=N, grads_in_forward=G), " +
DEFAULT_PIPELINE)` with the gradients computed with the loss (passline+lce, G=true, the pass's default: 3
matmuls) and computed again in the backward (passline+lce-recompute, G=false: 4 matmuls); passline with
fallback="raise", and the last two must report the rewrite (else the script fails).

Check (as benchmarks/models.py): the first step's loss and every gradient (the tied weight, the LayerNorm's,
h's) against a float64 eager step on the same bfloat16-rounded weights; relative error within
max(1e-2, 4 x eager's own error). Peak MB: torch.cuda.max_memory_allocated over three steps after the first
(weights, gradients, inputs and everything the step makes; CUDA only). Step ms: median of
triton.testing.do_bench (CUDA), wall time on the CPU (Triton's interpreter: --smoke sizes only).
Prints a table and whether the fused step's peak is at most half of Inductor's; exits 1 when a check
fails or the pass did not fire.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch  # (does not import triton: TRITON_INTERPRET is set in main(), before anything does)
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import FACTOR, FLOOR, rel_err, steady_cuda  # noqa: E402  (the check benchmarks/models.py uses)

CONFIG = dict(batch=8, seq=1024, hidden=768, vocab=128256)
SMOKE = dict(batch=2, seq=16, hidden=32, vocab=512)
FUSED_PIPELINE = "fuse_linear_cross_entropy(chunk_rows={chunk_rows}, grads_in_forward={grads_in_forward}), "


class Head(nn.Module):
    """GPT-2's end: tied token embedding, final LayerNorm, LM head, float32 cross-entropy."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's
        nn.init.normal_(self.wte.weight, std=0.02)

    def forward(self, idx, h, targets):
        logits = self.lm_head(self.ln_f(h + self.wte(idx)))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def build(cfg: dict, device: str):
    """(float32 model on the CPU, inputs on `device`): same seed, same weights for every contender."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = Head(cfg["vocab"], cfg["hidden"])
    shape = (cfg["batch"], cfg["seq"])
    idx = torch.randint(0, cfg["vocab"], shape, generator=g)
    targets = torch.randint(0, cfg["vocab"], shape, generator=g)
    targets[:, -3:] = -1  # ignored positions (padding)
    h = torch.randn(*shape, cfg["hidden"], generator=g)
    return model, (idx.to(device), h.to(device=device, dtype=torch.bfloat16), targets.to(device))


def snapshot(model, loss, h):
    """The loss and every gradient, float64 on the CPU."""
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters()}
    grads["h"] = h.grad.detach().to("cpu", torch.float64)
    return float(loss.detach().double()), grads


def errors(result, ref) -> dict:
    (loss, grads), (ref_loss, ref_grads) = result, ref
    return {"loss": abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
            **{n: rel_err(grads[n], g) for n, g in ref_grads.items()}}


def reference(master, inputs):
    """The float64 eager step on the bfloat16-rounded weights and inputs."""
    idx, h, targets = inputs
    model = copy.deepcopy(master).to(torch.bfloat16).to(device=h.device, dtype=torch.float64)
    h = h.double().requires_grad_()
    loss = model(idx, h, targets)
    loss.backward()
    return snapshot(model, loss, h)


def contenders(args) -> dict:
    """name -> how to compile the model: None (eager), "inductor", or a passline pipeline."""
    import passline

    out = {"eager": None}
    if not args.no_inductor:
        out["inductor"] = "inductor"
    out["passline"] = passline.DEFAULT_PIPELINE
    for name, grads_in_forward in (("passline+lce", "true"), ("passline+lce-recompute", "false")):
        out[name] = FUSED_PIPELINE.format(chunk_rows=args.chunk_rows, grads_in_forward=grads_in_forward) \
            + passline.DEFAULT_PIPELINE
    return out


def run_contender(name, how, master, inputs, ref, eager_errors, args) -> tuple[dict, dict]:
    import passline

    cuda = args.device == "cuda"
    torch._dynamo.reset()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    model = copy.deepcopy(master).to(device=args.device, dtype=torch.bfloat16)
    idx, h0, targets = inputs
    h = h0.detach().clone().requires_grad_()
    be = None
    if how is None:
        fn = model
    elif how == "inductor":
        fn = torch.compile(model)
    else:
        be = passline.backend(pipeline=how, fallback="raise")
        fn = torch.compile(model, backend=be)

    def step():
        model.zero_grad(set_to_none=True)
        h.grad = None
        loss = fn(idx, h, targets)
        loss.backward()
        return loss

    row = dict(contender=name)
    t0 = time.perf_counter()
    loss = step()
    if cuda:
        torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    result = snapshot(model, loss, h)
    del loss
    row["loss"] = result[0]
    errs = errors(result, ref)
    row["errors"] = errs
    if be is not None:
        row["passline_failures"] = [f"{k}: {e!r}" for k, e in be.failures]
        row["fused"] = sum(r.metrics.counters["linear_cross_entropy_fused"] for r in be.reports)
    if eager_errors is None:
        row.update(check="baseline", passed=True)
    else:
        bounds = {n: max(FLOOR[torch.bfloat16], FACTOR * eager_errors[n]) for n in errs}
        worst = max(errs, key=lambda n: errs[n] / bounds[n] if errs[n] == errs[n] else float("inf"))
        passed = all(errs[n] <= bounds[n] for n in errs)  # a NaN error fails
        row.update(passed=passed, check="ok" if passed else f"FAIL ({worst}: {errs[worst]:.2e})")
    if "lce" in name and not row.get("fused"):
        row.update(passed=False, check="FAIL (fuse_linear_cross_entropy did not fire)")

    if cuda:  # the steady state: three steps after the first, this contender's model alone on the device
        row["peak_mb"], row["step_ms"] = steady_cuda(step, args.warmup, args.rep)
    else:
        row["peak_mb"] = None
        wall = []
        for _ in range(args.cpu_steps):
            t0 = time.perf_counter()
            step()
            wall.append((time.perf_counter() - t0) * 1e3)
        row["step_ms"] = statistics.median(wall)
    torch._dynamo.reset()
    return row, result  # this contender's model, compiled code and buffers go with the frame


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def table(rows) -> list[str]:
    ind = next((r for r in rows if r["contender"] == "inductor" and "error" not in r), None)
    lines = ["| contender | check | step ms | step / Inductor | peak MB | peak / Inductor | first call s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['contender']} | ERROR: {r['error']} | | | | | |")
            continue
        peak = "n/a" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
        lines.append(f"| {r['contender']} | {r['check']} | {r['step_ms']:.2f} | "
                     f"{_ratio(r['step_ms'], ind and ind['step_ms'])} | {peak} | "
                     f"{_ratio(r['peak_mb'], ind and ind['peak_mb'])} | {r['first_call_s']:.1f} |")
    return lines


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help=f"tiny sizes {SMOKE} (CPU: Triton's interpreter)")
    ap.add_argument("--no-inductor", action="store_true", help="leave Inductor out (its C++ compile is slow on CPU)")
    for k, v in CONFIG.items():
        ap.add_argument(f"--{k}", type=int, help=f"default {v} ({SMOKE[k]} with --smoke)")
    ap.add_argument("--chunk-rows", type=int, default=0, help="the pass's chunk_rows (0: its rule)")
    ap.add_argument("--warmup", type=int, default=100, help="do_bench warmup, ms (CUDA)")
    ap.add_argument("--rep", type=int, default=500, help="do_bench repetition time, ms (CUDA)")
    ap.add_argument("--cpu-steps", type=int, default=1, help="timed steps on the CPU")
    ap.add_argument("--out", help="write the raw numbers to this JSON file")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # passline's Triton kernels on CPU tensors; before triton's import
    sys.path.insert(0, str(ROOT))
    import triton

    import passline

    cfg = {k: getattr(args, k) or (SMOKE if args.smoke else CONFIG)[k] for k in CONFIG}
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (Triton interpreter)"
    print(f"{device}; torch {torch.__version__}, triton {triton.__version__}, passline {passline.__version__}; "
          + ", ".join(f"{k}={v}" for k, v in cfg.items()) + f"; chunk_rows={args.chunk_rows or 'rule'}", flush=True)
    master, inputs = build(cfg, args.device)
    ref = reference(master, inputs)
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    rows, eager_errors, failed = [], None, False
    for name, how in contenders(args).items():
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            row, result = run_contender(name, how, master, inputs, ref, eager_errors, args)
            if name == "eager":
                eager_errors = row["errors"]
            del result
        except Exception as e:  # one failing contender must not hide the others
            traceback.print_exc(limit=-8)
            row = dict(contender=name, error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", passed=False)
            if name == "eager":
                rows.append(row)
                failed = True
                break
        failed |= not row["passed"]
        rows.append(row)
    print("\n".join(["", *table(rows), ""]))
    by = {r["contender"]: r for r in rows if "error" not in r}
    for name in ("passline+lce", "passline+lce-recompute"):
        if "inductor" in by and name in by and by["inductor"]["peak_mb"]:
            share = by[name]["peak_mb"] / by["inductor"]["peak_mb"]
            print(f"{name}: peak {share:.2f} of Inductor's "
                  f"({'at most half: goal met' if share <= 0.5 else 'more than half: goal missed'})")
    print(f"\nchecks: {'all passed' if not failed else 'FAILED'}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(config=cfg, device=device, rows=rows), indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
