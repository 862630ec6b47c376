"""What benchmarks/gpu_suite.py and benchmarks/sweep.py share: the cases, the bytes each must move, the
check against a float64 reference, and the timers.

Imports torch only (never triton or passline at import time), so a script can set TRITON_INTERPRET before
anything imports triton.
"""
from __future__ import annotations

import copy
import functools
import time

import attrs
import torch

# Cases of the sweep (gpu_suite also has cross_entropy_native and embedding).
SWEEP_CASES = ("layer_norm", "rms_norm", "softmax", "log_softmax", "gelu_epilogue", "cross_entropy")
# Cases the sweep runs only when named in --cases.
EXTRA_SWEEP_CASES = ("cross_entropy_smooth",)
EMBEDDING_VOCAB = 32768
# Tolerance floor of the check, per dtype: a result passes when each relative error is within
# max(floor, 4 x eager's own error against the same float64 reference).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


class RMSNorm(torch.nn.Module):
    def __init__(self, n, dtype, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n, dtype=dtype, device=device) + 0.5)

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


@attrs.frozen
class Case:
    """A function (or module) and its inputs; bytes are the minimum each direction must move: inputs
    read once, outputs written once. `train` is the forward with inputs requiring grad, which also writes
    what the backward needs beyond the inputs and outputs (per-row statistics)."""
    fn: object
    inputs: list
    fwd_bytes: int
    train_bytes: int
    bwd_bytes: int

    def bytes(self, direction: str) -> int:
        return {"fwd": self.fwd_bytes, "fwd_train": self.train_bytes, "bwd": self.bwd_bytes}[direction]


def make_case(name: str, m: int, n: int, dtype, device="cuda") -> Case:
    es = torch.tensor([], dtype=dtype).element_size()
    mn = m * n * es
    stat = m * 4  # one float32 per row (a mean, an rstd, a logsumexp)
    x = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True)
    if name == "layer_norm":
        mod = torch.nn.LayerNorm(n, device=device, dtype=dtype)
        with torch.no_grad():
            mod.weight.uniform_(0.5, 1.5)
            mod.bias.uniform_(-0.5, 0.5)
        return Case(mod, [x], 2 * mn, 2 * mn + 2 * stat, 3 * mn)  # saves mean and rstd
    if name == "rms_norm":
        return Case(RMSNorm(n, dtype, device), [x], 2 * mn, 2 * mn + stat, 3 * mn)  # saves rstd
    if name == "softmax":  # the backward reads the output (saved) and dy
        return Case(lambda x: torch.softmax(x, -1), [x], 2 * mn, 2 * mn, 3 * mn)
    if name == "log_softmax":
        return Case(lambda x: torch.log_softmax(x, -1), [x], 2 * mn, 2 * mn, 3 * mn)
    if name == "gelu_epilogue":  # the epilogue of an MLP's first matmul: bias add + GELU
        b = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
        return Case(lambda h, b: torch.nn.functional.gelu(h + b), [x, b], 2 * mn, 2 * mn, 3 * mn)
    if name == "cross_entropy":  # reads the logits; the backward reads them again and writes their gradient
        t = torch.randint(0, n, (m,), device=device)
        return Case(lambda x, t: torch.nn.functional.cross_entropy(x.float(), t), [x, t], mn, mn + stat, 2 * mn)
    if name == "cross_entropy_smooth":  # label smoothing adds a row sum of the log-softmax; some rows ignored
        t = torch.randint(0, n, (m,), device=device)
        t[::7] = -100
        return Case(lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, label_smoothing=0.1), [x, t], mn,
                    mn + stat, 2 * mn)
    if name == "cross_entropy_native":  # the logits' own dtype (the decomposition computes in float32)
        t = torch.randint(0, n, (m,), device=device)
        t[::7] = -100  # some ignored rows
        return Case(lambda x, t: torch.nn.functional.cross_entropy(x, t), [x, t], mn, mn + stat, 2 * mn)
    if name == "embedding":  # m tokens of an n-wide table of EMBEDDING_VOCAB rows; the backward sums duplicates
        w = torch.randn(EMBEDDING_VOCAB, n, device=device, dtype=dtype, requires_grad=True)
        i = torch.randint(0, EMBEDDING_VOCAB, (m,), device=device)
        return Case(lambda i, w: torch.nn.functional.embedding(i, w), [i, w], 2 * mn, 2 * mn,
                    (m + EMBEDDING_VOCAB) * n * es)
    raise ValueError(f"unknown case {name!r}")


def rel_err(a, b) -> float:
    """Norm of the difference over the reference's norm (NaN or inf anywhere gives NaN or inf)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fresh(inputs):
    """Copies of the inputs, leaves again where they required grad."""
    return [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]


def differentiated(fn, ins) -> list:
    """What a training step's backward computes: the inputs that require grad, then the module's parameters
    (a LayerNorm's weight and bias gradients are column sums, mix-order reduction's work)."""
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    return [x for x in ins if x.requires_grad] + params


def grads(fn, inputs, dy_dtype=None, dy_seed=0):
    """(output, gradients of differentiated()) of one forward and backward. The cotangent is drawn in
    float32 and rounded to dy_dtype (default: the output's dtype), so a float64 reference given the
    contender's dtype gets exactly the cotangent the contender got."""
    ins = fresh(inputs)
    y = fn(*ins)
    g = torch.Generator(device=y.device).manual_seed(dy_seed)
    dy = torch.randn(y.shape, device=y.device, dtype=torch.float32, generator=g)
    dy = dy.to(dy_dtype or y.dtype).to(y.dtype)
    gs = torch.autograd.grad(y, differentiated(fn, ins), dy)
    return y.detach(), gs


def reference(case: Case, dtype):
    """(output, gradients) of the case in float64 on the same (dtype-rounded) inputs and weights (a
    compiled module's parameters are its original's, in the same order)."""
    fn = copy.deepcopy(case.fn).double() if isinstance(case.fn, torch.nn.Module) else case.fn
    ins = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
           for x in case.inputs]
    return grads(fn, ins, dy_dtype=dtype)


def errors(y, gs, ref) -> list[float]:
    """Relative errors of an output and its gradients against reference()'s."""
    y_ref, g_ref = ref
    return [rel_err(y, y_ref)] + [rel_err(a, b) for a, b in zip(gs, g_ref)]


def passed(errs, eager_errs, dtype) -> bool:
    """Each error within max(the dtype's floor, 4 x eager's error on the same tensor): as accurate as eager
    in the same dtype. NaN fails (every comparison with NaN is false)."""
    tol = TOLERANCE.get(dtype, 1e-4)
    return len(errs) == len(eager_errs) and all(e <= max(tol, 4 * ee) for e, ee in zip(errs, eager_errs))


def bench(fn, reps_ms=200, device="cuda") -> float:
    """Milliseconds per call: CUDA, the median of triton.testing.do_bench; CPU, the wall time of one call of
    a function already called once (a check that the path runs: under Triton's interpreter, which takes
    seconds per kernel, the number means nothing)."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=reps_ms, return_mode="median")
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def kernel_ms(fn, device="cuda", calls=10) -> float | None:
    """Milliseconds of GPU work per call of `fn`: the device time of every kernel, memset and copy that
    `calls` calls issue (torch.profiler), divided by `calls`. Where a call is host-bound its step time
    (`bench`) measures the host's issue rate; this measures the kernels alone. None off a GPU."""
    if device != "cuda":
        return None
    from torch.autograd import DeviceType

    prof = gpu_profile(fn, calls)
    return sum(e.device_time for e in prof.events() if e.device_type == DeviceType.CUDA) / calls / 1e3


def gpu_profile(fn, calls=10):
    """torch.profiler's record of the GPU work of `calls` calls of `fn`, after one call outside it."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


def copy_bandwidth(device="cuda", numel=1 << 28) -> float:
    """GB/s of a device-to-device copy of `numel` float32 (read once, written once): the roof a memory-bound
    kernel is compared with."""
    x = torch.randn(numel, device=device)
    y = torch.empty_like(x)
    y.copy_(x)  # (the CPU timer times one call: not the first)
    t = bench(functools.partial(y.copy_, x), device=device)
    del x, y
    return 2 * numel * 4 / (t * 1e-3) / 1e9
