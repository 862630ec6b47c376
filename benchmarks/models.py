"""Training steps of whole models: eager, Inductor and passline in one process, checked, then timed.

    python benchmarks/models.py [--models gpt2,llama,resnet] [--device cuda|cpu] [--smoke] [--no-inductor]
                                [--reduce-overhead] [--passline-option KEY=VALUE ...] [--vocab N] [--out FILE.json]

Three models written here (no downloads), at the sizes of docs/benchmarks.md (tiny ones with --smoke):
GPT-2-style (learned positions, LayerNorm, causal SDPA, tanh-GELU MLP, LM head tied to the token
embedding; bfloat16), LLaMA-style (RMSNorm, RoPE, causal SDPA, SwiGLU, untied LM head; bfloat16) and
ResNet-18-style (BatchNorm in training mode, channels_last, float32). Each returns its cross-entropy
loss (computed in float32) from forward, so the loss is inside the compiled graph.

A training step is `model.zero_grad(set_to_none=True)`, `loss = model(inputs, targets)`,
`loss.backward()`: no optimizer step (it would be the same eager foreach kernels for every contender).
The contenders start from the same weights (copies of one model) and run in this process: eager,
`torch.compile(model)` (Inductor), with --reduce-overhead also `mode="reduce-overhead"` (CUDA graphs),
and `torch.compile(model, backend=passline.backend(fallback="raise", **options))`, so a graph passline
cannot compile is an error, never a quiet eager fallback (with --reduce-overhead also `passline-cg`: the
same with `cudagraphs=True`).

Check: the first step of every contender is compared with a float64 eager reference of the same
(dtype-rounded) weights and inputs: the loss and every parameter's gradient, relative error
(norm of the difference over the norm of the reference). The eager step in the model's own dtype has an
error of its own against that reference (bfloat16 rounding); a contender passes when each of its errors
is within max(floor, 4 x eager's error on the same tensor), floor 1e-2 for bfloat16 and 1e-4 for
float32. Any failed check or error makes the script exit 1.

Columns: step ms (CUDA: median of triton.testing.do_bench; CPU: median wall time of --cpu-steps steps),
step / Inductor (below 1 is faster than Inductor), CPU ms/step (CUDA: the host's wall time to issue one
step, measured with the GPU held busy by a sleep kernel queued first, so the host never waits for the
GPU; "(waited)" when it did anyway: a synchronization inside the step, or a full launch queue; CPU:
process time per step), first call s (the first step, compilation of forward and backward included,
synchronized), peak MB (torch.cuda.max_memory_allocated over three steps after the first, less what was
allocated before this contender's model was placed but its inputs: weights, gradients, activations and the
inputs; what earlier contenders left behind is not counted against a later one, and cuBLAS's workspaces are
freed before each contender, which allocates its own, one per stream it runs matmuls on (a CUDA graph's
capture stream is one); "n/a" on the CPU).
"""
from __future__ import annotations

import argparse
import ast
import copy
import cProfile
import datetime
import gc
import inspect
import io
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch  # (does not import triton: TRITON_INTERPRET is set below, before anything does)
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------- models


def _init_transformer(model):
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases (PyTorch's N(0, 1) embedding would make a
    tied LM head's logits huge)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def f32(x):
    """At least float32 (the float64 reference stays float64)."""
    return x if x.dtype == torch.float64 else x.float()


class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, vocab, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        _init_transformer(self)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(f32(logits).flatten(0, 1), targets.flatten())


class RMSNorm(nn.Module):
    """LLaMA's: normalised in float32, scaled in the model's dtype."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = f32(x)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x, cos, sin):
    """RoPE, the rotate-half form (HF LLaMA)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w_gate, self.w_up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, layers, d, heads, hidden, vocab, seq, theta=10000.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        freqs = torch.outer(torch.arange(seq).float(), theta ** (-torch.arange(0, hd, 2).float() / hd))
        angles = torch.cat((freqs, freqs), dim=-1)  # (seq, hd)
        # computed in float32, cast with the model (model.to(dtype)), as the model's own activations
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        _init_transformer(self)

    def forward(self, idx, targets):
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(f32(logits).flatten(0, 1), targets.flatten())


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths, blocks, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x, targets):
        x = self.layers(self.stem(x))
        return F.cross_entropy(f32(self.fc(x.mean((2, 3)))), targets)


# name -> (label, full-size config, smoke config); the dtype is part of the config
CONFIGS = {
    "gpt2": ("GPT-2-style",
             dict(layers=4, d=768, heads=12, batch=8, seq=1024, vocab=50304, dtype="bfloat16"),
             dict(layers=2, d=16, heads=2, batch=2, seq=8, vocab=64, dtype="bfloat16")),
    "llama": ("LLaMA-style",
              dict(layers=2, d=1024, heads=16, hidden=2816, batch=4, seq=1024, vocab=32000, dtype="bfloat16"),
              dict(layers=2, d=16, heads=2, hidden=32, batch=2, seq=8, vocab=64, dtype="bfloat16")),
    "resnet": ("ResNet-18-style",
               dict(widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), batch=32, image=224, classes=1000,
                    dtype="float32"),
               dict(widths=(8, 16), blocks=(1, 1), batch=2, image=16, classes=10, dtype="float32")),
}


def build(name, cfg, device):
    """(float32 model on the CPU, its dtype, inputs on `device`, memory format): same seed, same weights."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "resnet":
        model = ResNet(cfg["widths"], cfg["blocks"], cfg["classes"])
        x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g)
        y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=g)
        inputs = (x.to(device).contiguous(memory_format=torch.channels_last), y.to(device))
        fmt = torch.channels_last
    else:
        if name == "gpt2":
            model = GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["seq"])
        else:
            model = Llama(cfg["layers"], cfg["d"], cfg["heads"], cfg["hidden"], cfg["vocab"], cfg["seq"])
        tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)
        inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        fmt = torch.preserve_format
    return model, getattr(torch, cfg["dtype"]), inputs, fmt


def place(master, device, dtype, fmt):
    return copy.deepcopy(master).to(device=device, dtype=dtype, memory_format=fmt)


# ----------------------------------------------------------------------------------------------- check

FLOOR = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-9}
FACTOR = 4.0


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def snapshot(model, loss):
    """The loss and every parameter's gradient, float64 on the CPU (kept across contenders)."""
    grads = {n: (None if p.grad is None else p.grad.detach().to("cpu", torch.float64))
             for n, p in model.named_parameters()}
    return float(loss.detach().double()), grads


def errors(result, ref):
    loss, grads = result
    ref_loss, ref_grads = ref
    errs = {"loss": abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)}
    for n, g in ref_grads.items():
        errs[n] = math.inf if grads.get(n) is None else rel_err(grads[n], g)
    return errs


def verdict(errs, eager_errs, dtype):
    """(passed, worst error, the tensor where the margin is smallest)."""
    floor = FLOOR.get(dtype, 1e-2)
    worst_name, worst_ratio = None, -1.0
    for n, e in errs.items():
        bound = max(floor, FACTOR * eager_errs[n])
        ratio = math.inf if math.isnan(e) else e / bound if bound > 0 else 0.0 if e == 0 else math.inf
        if ratio > worst_ratio:
            worst_name, worst_ratio = n, ratio
    return worst_ratio <= 1.0, max(errs.values(), key=lambda e: math.inf if math.isnan(e) else e), worst_name


# ---------------------------------------------------------------------------------------------- timing


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def make_step(model, inputs, cuda):
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if cuda else None

    def step():
        if mark is not None:
            mark()  # a new iteration for CUDA graph trees (reduce-overhead, passline's cudagraphs); cheap
        model.zero_grad(set_to_none=True)
        loss = model(*inputs)
        loss.backward()
        return loss

    return step


_CYCLES_PER_MS = None


def cycles_per_ms() -> float:
    global _CYCLES_PER_MS
    if _CYCLES_PER_MS is None:
        torch.cuda._sleep(1_000_000)  # warm up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS = 20_000_000 / start.elapsed_time(end)
    return _CYCLES_PER_MS


def steady_cuda(step, warmup: int, rep: int, base: int) -> tuple[float, float]:
    """(peak MB over three steps after the first, less `base` bytes, median step ms by do_bench): the steady
    state, with only this contender's model on the device."""
    from triton.testing import do_bench

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return peak, do_bench(step, warmup=warmup, rep=rep, return_mode="median")


def host_ms_cuda(step, gpu_ms, reps=10):
    """Host time to issue one step while the GPU is busy with a sleep kernel queued first: the host never
    waits for the GPU, unless the step synchronizes or fills the launch queue; then its time reaches the
    sleep's, and the second value says so. Kernels that are small next to this time leave the step bound
    by it."""
    sleep_ms = max(50.0, 3 * gpu_ms)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(sleep_ms * cycles_per_ms()))
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    ms = statistics.median(times)
    return ms, ms >= 0.9 * sleep_ms


# ------------------------------------------------------------------------------------------ contenders


def write_profile(prof, path: Path) -> None:
    """The profile's 60 costliest functions by cumulative and by own time, as text."""
    import pstats

    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(60)
    path.write_text(text.getvalue())


def contenders(args):
    """name -> torch.compile options (None: eager)."""
    out = {"eager": None}
    if not args.no_inductor:
        out["inductor"] = dict(backend="inductor")
        if args.reduce_overhead and args.device == "cuda":
            out["inductor-ro"] = dict(backend="inductor", mode="reduce-overhead")
    out["passline"] = "passline"  # built per model: a fresh Backend (its reports) each time
    if args.reduce_overhead and args.device == "cuda":
        out["passline-cg"] = "passline-cg"  # the same with cudagraphs=True, against inductor-ro
    return out


def run_contender(name, options, master, dtype, fmt, inputs, ref, eager_result, args, passline_options):
    import passline

    device, cuda = args.device, args.device == "cuda"
    row = dict(contender=name)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gc.collect()
    base = 0
    if cuda:
        # cuBLAS keeps a workspace per stream it ran on, allocated from torch's allocator at the first
        # matmul there: freed here, each contender allocates (and counts) its own
        getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
        torch.cuda.empty_cache()
        # what is allocated now that is not this contender's: the inputs are (they count), earlier
        # contenders' leftovers are not
        base = torch.cuda.memory_allocated() - sum(t.untyped_storage().nbytes() for t in inputs
                                                   if isinstance(t, torch.Tensor) and t.is_cuda)
    model = place(master, device, dtype, fmt)
    be = None
    if options is None:
        fn = model
    elif options in ("passline", "passline-cg"):
        extra = dict(cudagraphs=True) if options == "passline-cg" else {}
        be = passline.backend(fallback="raise", **{**passline_options, **extra})
        fn = torch.compile(model, backend=be)
    else:
        fn = torch.compile(model, **options)
    step = make_step(fn, inputs, cuda)

    # first call: compile (forward at the call, backward at loss.backward()), then the check
    prof = cProfile.Profile() if args.profile and options is not None else None
    sync(device)
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    loss = step()
    sync(device)
    row["first_call_s"] = time.perf_counter() - t0
    if prof:
        prof.disable()
        write_profile(prof, Path(args.profile) / f"first_call_{args.model_name}_{name}.txt")
    result = snapshot(model, loss)
    del loss
    row["loss"] = result[0]
    row["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    if be is not None:
        row["passline_graphs"] = [r.name for r in be.reports]
        row["passline_kernels"] = sum(r.kernels for r in be.reports)
        # binaries the first step's launches compiled themselves (0 where every static kernel was compiled ahead)
        row["passline_compiled_at_launch"] = sum(r.metrics.counters["kernels_compiled_at_launch"] for r in be.reports)
        row["passline_precompiled"] = sum(r.metrics.counters["kernels_precompiled"] for r in be.reports)
        row["passline_codegen"] = sorted({r.codegen for r in be.reports})
        row["passline_failures"] = [f"{k}: {e!r}" for k, e in be.failures]
    errs = errors(result, ref)
    row["errors"] = errs
    row["rel_err_vs_eager"] = max(errors(result, eager_result).values()) if eager_result is not None else 0.0
    if name == "eager":
        row["check"], row["passed"] = "baseline", True
        row["worst_err"] = max(errs.values())
    else:
        passed, worst, where = verdict(errs, errors(eager_result, ref), dtype)
        row.update(passed=passed, worst_err=worst, tightest=where, check="ok" if passed else f"FAIL ({where})")
    model.zero_grad(set_to_none=True)

    # peak memory: a few steady steps, this contender's model alone on the device
    if cuda:
        row["peak_mb"], row["step_ms"] = steady_cuda(step, args.warmup, args.rep, base)
        row["cpu_ms"], row["cpu_waited"] = host_ms_cuda(step, row["step_ms"])
        if args.profile and options is not None:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            prof.disable()
            write_profile(prof, Path(args.profile) / f"steps_{args.model_name}_{name}.txt")
    else:
        row["peak_mb"] = None
        if not args.smoke:
            step()  # a warm step (--smoke: the first call was enough; the interpreter is slow)
        wall, cpu = [], []
        for _ in range(args.cpu_steps):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        row["step_ms"], row["cpu_ms"], row["cpu_waited"] = statistics.median(wall), statistics.median(cpu), False
    del step, fn, model, be
    torch._dynamo.reset()
    return row, result


def reference(master, dtype, inputs, device):
    """The float64 eager step on the model's dtype-rounded weights (and the same inputs), contiguous: the
    memory format changes no value, and float64 convolutions need not support channels_last."""
    model = copy.deepcopy(master).to(dtype=dtype).to(device=device, dtype=torch.float64)
    ins = [x.double().contiguous() if x.is_floating_point() else x for x in inputs]
    loss = model(*ins)
    loss.backward()
    return snapshot(model, loss)


# ---------------------------------------------------------------------------------------------- output

HEADER = ("| model | contender | check | step ms | step / Inductor | CPU ms/step | first call s | peak MB |\n"
          "|---|---|---|---|---|---|---|---|")


def fmt_row(r) -> str:
    if "error" in r:
        return f"| {r['model']} | {r['contender']} | FAILED: {r['error'][:200]} | | | | | |"
    ratio = f"{r['step_ms'] / r['inductor_ms']:.2f}" if r.get("inductor_ms") else "n/a"
    cpu = f"{r['cpu_ms']:.2f}" + (" (waited)" if r["cpu_waited"] else "")
    peak = "n/a" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
    check = f"{r['check']} ({r['worst_err']:.1e})"
    return (f"| {r['model']} | {r['contender']} | {check} | {r['step_ms']:.2f} | {ratio} | {cpu} | "
            f"{r['first_call_s']:.2f} | {peak} |")


# ------------------------------------------------------------------------------------------------ main


def parse_option(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--passline-option wants KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass  # a bare word stays a string: kernel_variant=looped
    return key.strip(), value


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[5:]))
    ap.add_argument("--models", default="gpt2,llama,resnet", help="comma-separated subset of gpt2,llama,resnet")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU: through Triton's interpreter, minutes)")
    ap.add_argument("--no-inductor", action="store_true", help="leave Inductor out (its C++ compile is slow on CPU)")
    ap.add_argument("--reduce-overhead", action="store_true",
                    help='also torch.compile(mode="reduce-overhead") and passline with cudagraphs=True, CUDA only')
    ap.add_argument("--passline-option", action="append", default=[], type=parse_option, metavar="KEY=VALUE",
                    help="passed to passline.backend(...) (repeatable); VALUE is a Python literal or a bare word")
    ap.add_argument("--vocab", type=int, help="vocabulary of the GPT-2 and LLaMA models (defaults 50304 and 32000)")
    ap.add_argument("--warmup", type=int, default=200, help="do_bench warmup, ms (CUDA)")
    ap.add_argument("--rep", type=int, default=1000, help="do_bench repetition time, ms (CUDA)")
    ap.add_argument("--cpu-steps", type=int, help="timed steps on the CPU (default 1 with --smoke, else 10)")
    ap.add_argument("--keep-caches", action="store_true",
                    help="use the usual Inductor/Triton/passline caches (default: fresh empty ones, so first "
                         "call s is a cold compile)")
    ap.add_argument("--out", help="write the raw numbers to this JSON file")
    ap.add_argument("--profile", metavar="DIR",
                    help="cProfile each compiled contender's first call and 20 steady steps (the host's side): "
                         "DIR/first_call_<model>_<contender>.txt and DIR/steps_<model>_<contender>.txt")
    args = ap.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in CONFIGS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA device")
    if args.cpu_steps is None:
        args.cpu_steps = 1 if args.smoke else 10
    return ap, args


def check_passline_options(ap, options: dict) -> None:
    import passline

    params = inspect.signature(passline.Backend.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = [n for n in params if n != "self"]
    if "fallback" in options:
        ap.error("--passline-option fallback=...: this benchmark always uses fallback='raise'")
    unknown = [k for k in options if k not in known]
    if unknown and not takes_any:
        ap.error(f"unknown passline option(s) {', '.join(unknown)}; passline.backend() takes: {', '.join(known)}")
    try:
        passline.backend(fallback="raise", **options)
    except (TypeError, ValueError) as e:
        ap.error(f"passline.backend rejects --passline-option {options}: {e}")


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # passline's Triton kernels on CPU tensors; before triton's import
    cache_root = None
    if not args.keep_caches:  # before the imports that read them
        cache_root = tempfile.mkdtemp(prefix="passline-models-")
        for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                         ("PASSLINE_CACHE_DIR", "passline")):
            os.environ[var] = os.path.join(cache_root, sub)
    try:
        sys.path.insert(0, str(ROOT))
        import triton

        import passline

        options = dict(args.passline_option)
        check_passline_options(ap, options)
        return run(args, options, triton, passline)
    finally:
        if cache_root:
            shutil.rmtree(cache_root, ignore_errors=True)


def run(args, options, triton, passline) -> int:
    device = args.device
    cpu = platform.processor() or platform.machine()
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({cpu}, " \
                                                                   f"{os.cpu_count()} cores; Triton interpreter)"
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), device=name,
                torch=torch.__version__, triton=triton.__version__, passline=passline.__version__,
                python=platform.python_version(), smoke=args.smoke, passline_options=options,
                caches="kept" if args.keep_caches else "fresh",
                step="zero_grad, forward + loss, backward (no optimizer)")
    configs = {}
    for m in args.models:
        cfg = dict(CONFIGS[m][2 if args.smoke else 1])
        if args.vocab and "vocab" in cfg:
            cfg["vocab"] = args.vocab
        configs[m] = cfg
    meta["configs"] = configs
    lines = [f"{meta['date']}; {name}; torch {meta['torch']}, triton {meta['triton']}, passline {meta['passline']}, "
             f"Python {meta['python']}",
             f"passline.backend(fallback='raise'{''.join(f', {k}={v!r}' for k, v in options.items())}); "
             f"{'fresh' if not args.keep_caches else 'warm'} caches; step: {meta['step']}"]
    for m, cfg in configs.items():
        lines.append(f"{CONFIGS[m][0]}: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    for line in lines:
        print(line, flush=True)
    rows, failed = [], False
    for m, cfg in configs.items():
        args.model_name = m
        master, dtype, inputs, fmt = build(m, cfg, device)
        ref = reference(master, dtype, inputs, device)
        eager_result, model_rows = None, []
        for cname, copts in contenders(args).items():
            print(f"[{m}] {cname} ...", file=sys.stderr, flush=True)
            try:
                row, result = run_contender(cname, copts, master, dtype, fmt, inputs, ref, eager_result, args, options)
                if cname == "eager":
                    eager_result = result
                del result
            except Exception as e:  # one failing contender must not hide the others
                traceback.print_exc(limit=-8)
                row = dict(contender=cname, error=f"{type(e).__name__}: {' '.join(str(e).split())[:500]}",
                           passed=False)
                if cname == "eager":  # nothing to compare with
                    rows.append(dict(row, model=m))
                    failed = True
                    break
            row["model"] = m
            failed |= not row["passed"]
            model_rows.append(row)
            print(f"[{m}] {cname}: " + fmt_row({**row, "inductor_ms": None}), file=sys.stderr, flush=True)
        ind = next((r["step_ms"] for r in model_rows if r["contender"] == "inductor" and "error" not in r), None)
        for r in model_rows:
            r["inductor_ms"] = ind
        rows += model_rows
        del master, inputs, ref, eager_result
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    print()
    print(HEADER)
    for r in rows:
        print(fmt_row(r))
    print(f"\nchecks: {'all passed' if not failed else 'FAILED'}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
