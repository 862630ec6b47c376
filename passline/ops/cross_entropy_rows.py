"""The rows of a chunk of logits turned, in place, into their loss and gradient: one Triton kernel.

`rows(z, target, ...)` reads a chunk's logits `z` `[n, vocab]` (bfloat16, float16 or float32, contiguous
rows) and, per row, computes in float32 registers:

- the log-sum-exp, by an online softmax over blocks of columns (a running maximum `m` and sum
  `s = sum(exp(z - m))`, rescaled when `m` grows): one read of the row, whatever the vocabulary;
- with `losses`: the row's loss `(1 - eps) * (lse - z[target]) + eps * (lse - mean(z))`, 0 where the target
  is `ignore_index` (the mean of the row's logits is summed in the same read);
- with `scale`: the logits' gradient `(softmax(z) - (1 - eps) * onehot(target) - eps / vocab) * scale[row]`
  (0 for an ignored row), written *over `z`* in its dtype: a second read and one write of the row, and no
  float32 `[n, vocab]` tensor anywhere.

`scale` is a float32 tensor of 1 element (every row's share of the loss's gradient: 1 for a sum, 1 / valid
rows for a mean, times the loss's gradient) or of `n` (a per-row loss's gradient); it is read on the
device, so nothing here waits for the GPU. A target outside `[0, vocab)` that is not `ignore_index` reads
the row's first logit and makes the row's loss and gradient NaN (eager asserts on the device).

The kernel runs where Triton can: CUDA tensors, or CPU tensors with `TRITON_INTERPRET=1` (Triton's
interpreter). Elsewhere, or under `use("aten")` (the oracle the kernel is tested against), `rows` computes
the same with aten ops over a float32 copy of the chunk (two `[n, vocab]` float32 tensors: a CPU's
memory is not what the kernel saves).
"""
import contextlib
import os

import torch
import triton  # (this module is imported when the op first runs, not with passline)
import triton.language as tl

from ..backends.triton.compat import COMPILE_OPTIONS
from ..config import environment_variable

Tensor = torch.Tensor

MAX_BLOCK = 4096  # columns a program holds at once: 16 a thread at 8 warps, one 32-byte load each (bf16)
WARPS = 8

_mode = "auto"  # "auto" | "triton" | "aten"
_kernels: dict = {}  # interpret (bool) -> the jitted kernel
_block_override: int | None = None  # tests: narrow blocks, so a small vocabulary takes several


@contextlib.contextmanager
def use(mode: str, block: int | None = None):
    """Within: `rows` runs as `mode` ("auto": the kernel where Triton can run it, else aten; "triton";
    "aten") with, for tests, the kernel's column blocks `block` wide (a power of 2)."""
    global _mode, _block_override
    if mode not in ("auto", "triton", "aten"):
        raise ValueError(f"cross_entropy_rows.use: mode is auto, triton or aten, not {mode!r}")
    old = _mode, _block_override
    _mode, _block_override = mode, block
    try:
        yield
    finally:
        _mode, _block_override = old


def implementation(z: Tensor) -> str:
    """"triton" or "aten": what `rows` runs for a chunk like `z`."""
    if _mode != "auto":
        return _mode
    if z.device.type == "cuda" or (z.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return "triton"
    return "aten"


def rows(z: Tensor, target: Tensor, ignore_index: int, label_smoothing: float, losses: Tensor | None = None,
         scale: Tensor | None = None) -> None:
    """Write the rows' losses into `losses` (float32 `[n]`, when given) and, with `scale`, the logits'
    gradient over `z` (see the module docstring)."""
    n, vocab = z.shape
    if n == 0 or (losses is None and scale is None):
        return
    if scale is not None and scale.numel() not in (1, n):
        raise ValueError(f"cross_entropy_rows: scale of 1 or {n} elements expected, got {scale.numel()}")
    if implementation(z) == "aten":
        _rows_aten(z, target, ignore_index, label_smoothing, losses, scale)
    else:
        _rows_triton(z, target, ignore_index, label_smoothing, losses, scale)


def _rows_aten(z, target, ignore_index, eps, losses, scale):
    n, vocab = z.shape
    valid = target != ignore_index
    safe = torch.where(valid, target, 0).unsqueeze(1)
    zf = z.float()
    lse = torch.logsumexp(zf, 1, keepdim=True)
    if losses is not None:
        loss = lse.squeeze(1) - zf.gather(1, safe).squeeze(1)
        if eps:
            loss = (1 - eps) * loss + eps * (lse.squeeze(1) - zf.mean(1))
        losses.copy_(torch.where(valid, loss, 0.0))
    if scale is None:
        return
    p = zf.sub_(lse).exp_()  # the softmax, over zf's storage
    p.scatter_add_(1, safe, p.new_full(safe.shape, -(1.0 - eps)))
    if eps:
        p.sub_(eps / vocab)
    p.mul_(torch.where(valid, scale.float().expand(n), 0.0).unsqueeze(1))
    z.copy_(p)


def _rows_body(z_ptr, z_stride, target_ptr, loss_ptr, scale_ptr, scale_stride, ignore_index, eps,
               VOCAB: tl.constexpr, HAS_LOSS: tl.constexpr, HAS_GRAD: tl.constexpr, SMOOTH: tl.constexpr,
               BLOCK: tl.constexpr, ROUND_BF16: tl.constexpr):
    """One program per row (see the module docstring); jitted by `_kernel`. The vocabulary is a constexpr:
    a model has one (one compile), and Triton 3.6's interpreter turns a run-time int into a one-element
    array, which `range` refuses under NumPy >= 2.5."""
    row = tl.program_id(0)
    z_row = z_ptr + row.to(tl.int64) * z_stride
    target = tl.load(target_ptr + row)
    valid = target != ignore_index
    inside = (target >= 0) & (target < VOCAB)
    cols = tl.arange(0, BLOCK)
    # pass 1: the online softmax's running maximum and sum, and the row's sum for label smoothing. Every
    # block holds at least one column (start < VOCAB), so the maximum is finite from the first block on
    # and exp(m - m_new) never sees -inf - -inf.
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    total = tl.full((), 0.0, tl.float32)
    for start in range(0, VOCAB, BLOCK):
        mask = start + cols < VOCAB
        x = tl.load(z_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
        if SMOOTH:
            total += tl.sum(tl.where(mask, x, 0.0), 0)
    lse = m + tl.log(s)
    if HAS_LOSS:
        z_target = tl.load(z_row + tl.where(inside, target, 0)).to(tl.float32)
        loss = lse - z_target
        if SMOOTH:
            loss = (1.0 - eps) * loss + eps * (lse - total / VOCAB)
        loss = tl.where(inside, loss, float("nan"))
        tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    if HAS_GRAD:
        row_scale = tl.load(scale_ptr + row * scale_stride)
        row_scale = tl.where(valid, tl.where(inside, row_scale, float("nan")), 0.0)
        for start in range(0, VOCAB, BLOCK):
            mask = start + cols < VOCAB
            x = tl.load(z_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(x - lse)
            g = tl.where(start + cols == target, g - (1.0 - eps), g)
            if SMOOTH:
                g = g - eps / VOCAB
            g = g * row_scale
            if ROUND_BF16:  # Triton's interpreter truncates float32 to bfloat16; a GPU rounds to nearest even
                bits = g.to(tl.int32, bitcast=True)
                bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
                g = bits.to(tl.float32, bitcast=True)
            tl.store(z_row + start + cols, g.to(z_ptr.dtype.element_ty), mask=mask)


def _kernel(interpret: bool):
    """The kernel, jitted for Triton's interpreter or for the GPU: Triton decides which when `triton.jit`
    runs, by TRITON_INTERPRET, so each is made with the variable set accordingly."""
    k = _kernels.get(interpret)
    if k is None:
        with environment_variable("TRITON_INTERPRET", "1" if interpret else None):
            k = _kernels[interpret] = triton.jit(_rows_body)
    return k


def block_for(vocab: int) -> int:
    if _block_override is not None:
        return _block_override
    return min(MAX_BLOCK, 1 << max(4, (vocab - 1).bit_length()))


def _rows_triton(z, target, ignore_index, eps, losses, scale):
    n, vocab = z.shape
    if z.stride(1) != 1:
        raise ValueError("cross_entropy_rows: the chunk's rows must be contiguous")
    interpret = z.device.type == "cpu"
    kernel = _kernel(interpret)
    target = target.contiguous()
    dummy = z.new_empty(1, dtype=torch.float32) if losses is None or scale is None else None
    loss_arg = losses if losses is not None else dummy
    scale_arg = scale.float().contiguous() if scale is not None else dummy
    args = (z, z.stride(0), target, loss_arg, scale_arg, 0 if scale_arg.numel() == 1 else 1,
            int(ignore_index), float(eps))
    meta = dict(VOCAB=vocab, HAS_LOSS=losses is not None, HAS_GRAD=scale is not None, SMOOTH=bool(eps),
                BLOCK=block_for(vocab), ROUND_BF16=interpret and z.dtype == torch.bfloat16, num_warps=WARPS,
                **COMPILE_OPTIONS)
    with environment_variable("TRITON_INTERPRET", "1" if interpret else None):
        if interpret:
            kernel[(n,)](*args, **meta)
        else:
            with torch.cuda.device(z.device):
                kernel[(n,)](*args, **meta)
