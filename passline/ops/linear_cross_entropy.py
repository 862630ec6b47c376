"""`passline::linear_cross_entropy`: `F.cross_entropy(F.linear(x, weight, bias), target)` whose
`[rows, vocabulary]` logits never exist whole.

An LM head's logits are the largest tensor of a training step (8k tokens x 128k vocabulary: 2 GiB in
bfloat16, twice that once upcast to float32), and autograd keeps them from the forward to the backward.
Here the rows are taken in chunks. Per chunk: one matmul writes the chunk's logits, in the input's dtype,
into a buffer every chunk reuses; one kernel (`cross_entropy_rows`: Triton, on a GPU or under
TRITON_INTERPRET=1; aten elsewhere) computes each row's log-sum-exp by an online softmax in float32
registers, the row's loss and, where asked, the logits' gradient (softmax minus the smoothed one-hot, times
each row's share of the loss's gradient), written *over the logits* in their dtype — no float32
`[chunk, vocabulary]` tensor —; two matmuls consume it into the chunk's rows of `dx` (written in place) and
into `dweight`, summed in one float32 buffer (`_accumulate`: addmm with a float32 out_dtype where cuBLAS
has it), and a sum into `dbias`. Nothing waits for the GPU (a mean's 1 / valid rows is a device scalar the
kernel reads). Three ops:

- `passline::linear_cross_entropy` (the loss) and `passline::linear_cross_entropy_backward` (its
  gradients): autograd saves `x`, `weight`, `bias` and `target`, and the backward computes each chunk's
  logits again — 4 matmuls in all;
- `passline::linear_cross_entropy_with_grads` (the loss and the gradients for a loss gradient of 1, for a
  "mean" or "sum" loss, whose gradient only scales them): the backward scales what the forward saved —
  3 matmuls, and the gradients (in the parameters' dtypes: the float32 sums rounded once) held from the
  forward to the backward.

The loss is F.cross_entropy's: `ignore_index` rows count for nothing (and `mean` divides by the rows
left: all ignored is 0/0, NaN, as eager, with zero gradients), `label_smoothing` eps makes a row's loss
`(1 - eps) * (lse - z[target]) + eps * (lse - mean(z))`, `reduction` is "mean", "sum" or "none". The
loss is computed in float32 whatever the input's dtype: `upcast` says whether it is returned in float32
(the model wrote `cross_entropy(logits.float(), ...)`, or the input is float32) or rounded to the input's
dtype (eager's bfloat16 cross-entropy rounds every log-probability to bfloat16: ours is closer to exact).
A target outside the vocabulary (not `ignore_index`) gives that row a NaN loss under the kernel (eager
asserts on the device); the aten path raises.

Memory, for benchmarks/linear_cross_entropy.py's step (GPT-2's tied head, bfloat16, 8 x 1024 tokens,
hidden 768, vocabulary 128256; MiB, as the benchmark's peak): the weight W is 187.9, a float32 [V, H]
375.8, a chunk of 768 rows of logits 187.9 (the rule: as large as W), a token-sized [8192, 768] 12.0.
- forward, inside the op: W 187.9 + the float32 dweight sum 375.8 + the chunk's buffer 187.9 + h, the
  saved sum h + wte(idx), the LayerNorm's output (the op's x) and dx 4 x 12.0 = 799.5 where cuBLAS adds
  into the float32 sum itself, 987.4 where each chunk's bfloat16 product is a temporary W (`_accumulate`);
  at the op's end the sum is rounded to dweight (W) and freed: 799.5;
- backward (passline's graph: the tied embedding's gradient is a float32 [V, H] scatter, then one kernel
  adds the head's scaled dweight to it, in bfloat16): W + the saved dweight 187.9 + the scatter 375.8 +
  W's gradient 187.9 + h and dh 2 x 12.0 = 963.4.
Expected peak: 963-987 MiB plus allocator and library workspaces, about 0.34 of Inductor's 2868 (the
previous version measured 1815: each chunk's bfloat16 logits, a float32 copy made by log_softmax(dtype=),
the float32 log-probabilities and the float32 dweight sum were alive together, and the sum was saved for
the backward in float32).
"""
import torch

Tensor = torch.Tensor

REDUCTIONS = ("mean", "sum", "none")


def default_chunk_rows(rows: int, hidden: int, vocab: int) -> int:
    """Rows per chunk when none is given: a chunk's logits `[chunk, vocab]` hold at most as many elements
    as the larger of `weight` `[vocab, hidden]` and `x` `[rows, hidden]`, tensors the step holds anyway. The
    chunk's only buffer is its logits in x's dtype (the kernel writes their gradient over them), so at a wide
    vocabulary it is as large as the weight: `hidden` rows (768 for GPT-2 and the 128k benchmark) — a matmul
    of `hidden` rows by `hidden` by `vocab`, large enough to keep a GPU's tensor cores busy. Smaller chunks
    would not lower the step's peak (the module docstring: the op's 3 weights' worth of buffers plus the
    chunk stay under the backward's 5) and would cost time: each chunk reads and writes the float32 weight
    gradient's sum once more (2 x 375.8 MiB at 128k x 768). A vocabulary narrower than the rows gives
    larger chunks (the logits are no larger than `x`: little to save)."""
    if rows <= 0:
        return 1
    budget = max(vocab, rows) * hidden
    return max(1, min(rows, -(-budget // max(vocab, 1))))


def _chunks(rows: int, chunk: int):
    return ((s, min(rows, s + chunk)) for s in range(0, rows, chunk))


def _check(x, weight, bias, target, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, not {reduction!r}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: x [rows, hidden] and weight [vocab, hidden] expected, got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if target.shape != x.shape[:1]:
        raise ValueError(f"linear_cross_entropy: target of shape {tuple(x.shape[:1])} expected, "
                         f"got {tuple(target.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear_cross_entropy: bias of shape {tuple(weight.shape[:1])} expected")


class _Gradients:
    """dx, dweight and dbias, filled chunk by chunk from each chunk's logits' gradient: dx's rows of the chunk
    by one matmul written in place, dweight and dbias summed in float32 buffers (see `_accumulate`)."""

    def __init__(self, x, weight, bias, need_x: bool, need_weight: bool, need_bias: bool):
        rows, hidden = x.shape
        vocab = weight.shape[0]
        self.dx = x.new_empty((rows, hidden) if need_x else (0,))
        self.dweight = torch.zeros(vocab, hidden, dtype=torch.float32, device=x.device) if need_weight else None
        self.dbias = torch.zeros(vocab, dtype=torch.float32, device=x.device) if need_bias else None
        self.need_x = need_x

    def add(self, dz, x, weight, s: int, e: int) -> None:
        if self.need_x:
            torch.mm(dz, weight, out=self.dx[s:e])
        if self.dweight is not None:
            _accumulate(self.dweight, dz.t(), x)
        if self.dbias is not None:
            self.dbias.add_(dz.sum(0, dtype=torch.float32))

    def rounded(self, weight, bias):
        """(dx, dweight, dbias), the float32 sums rounded once to the weight's and the bias's dtypes (the float32
        buffer is freed with this object); a gradient not needed is an empty tensor."""
        bias_dtype = weight.dtype if bias is None else bias.dtype
        dweight = weight.new_empty(0) if self.dweight is None else self.dweight.to(weight.dtype)
        self.dweight = None
        dbias = weight.new_empty(0, dtype=bias_dtype) if self.dbias is None else self.dbias.to(bias_dtype)
        return self.dx, dweight, dbias


# Whether aten's addmm takes a float32 `out_dtype` for operands of a 16-bit dtype, by device type and that dtype:
# CUDA since torch 2.8 (cuBLAS's float32 output), with a float32 `self` in recent versions; tried once, remembered
# (an out-of-memory error is not an answer: it is raised, and nothing remembered).
_OUT_DTYPE_ADDMM: dict = {}


def _accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b, acc a float32 buffer. The weight's gradient is a sum over the chunks, and summed in
    float32 it is as exact as eager's one matmul over every row: measured against float64 for bfloat16
    operands, 8192 rows in chunks of 768 (11 sums), hidden 768 — eager's single bfloat16 matmul 1.66e-3
    relative (norm-wise), float32 sums rounded once at the end 1.66e-3, bfloat16 sums (addmm_ into a bfloat16
    buffer) 4.12e-3, 2.5x eager's and growing with the square root of the chunk count. Hence float32 (2
    bytes more a weight element, held until the backward). Where cuBLAS can (CUDA: addmm with
    out_dtype=float32 into `acc` itself), one matmul accumulates into it with no temporary (its float32
    product is rounded once, into the sum); else each chunk's product is made in the operands' dtype
    (rounded once, like eager's) and added: a temporary the size of the weight (bfloat16: 1.4x eager's
    error on the test above, 2.34e-3; inside the check's bound of 4x)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
        return
    kind = acc.device.type, a.dtype
    if _OUT_DTYPE_ADDMM.get(kind, kind[0] == "cuda"):
        try:
            torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
            _OUT_DTYPE_ADDMM[kind] = True
            return
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError, NotImplementedError):  # checked before any work: acc is untouched
            _OUT_DTYPE_ADDMM[kind] = False
    acc.add_(a @ b)


def _scale(target, valid, reduction: str, grad=None) -> Tensor:
    """Each row's share of the loss's gradient `grad` (1 when None) as a float32 tensor of 1 element (a sum or
    a mean: 1 / valid rows, computed on the device — no wait for it) or one a row (`reduction="none"`). The
    kernel gives ignored rows 0."""
    if grad is None:
        scale = torch.ones((), dtype=torch.float32, device=target.device)
    else:
        scale = grad.detach().float()
    if reduction == "mean":
        scale = scale / valid.sum()
    return scale.reshape(-1).contiguous()


def _sweep(x, weight, bias, target, ignore_index, label_smoothing, chunk_rows, losses=None, scale=None,
           grads: _Gradients | None = None) -> None:
    """One pass over the rows in chunks, each chunk's logits computed once, into one buffer that every chunk
    reuses: with `losses`, the chunk's rows of the loss are written there; with `grads`, the logits'
    gradient (times `scale`, each row's share of the loss's gradient) is written over the logits by the same
    kernel and consumed into them. Per chunk: the logits' matmul, the kernel, and the gradients' matmuls."""
    from . import cross_entropy_rows

    rows, hidden = x.shape
    vocab = weight.shape[0]
    if rows == 0:
        return
    chunk = chunk_rows if chunk_rows > 0 else default_chunk_rows(rows, hidden, vocab)
    buffer = x.new_empty(min(chunk, rows), vocab)
    per_row = scale is not None and scale.numel() != 1
    for s, e in _chunks(rows, chunk):
        z = buffer[: e - s]
        if bias is None:
            torch.mm(x[s:e], weight.t(), out=z)
        else:  # addmm, as F.linear computes it (one rounding of product plus bias)
            torch.addmm(bias, x[s:e], weight.t(), out=z)
        cross_entropy_rows.rows(z, target[s:e], ignore_index, label_smoothing,
                                losses=None if losses is None else losses[s:e],
                                scale=None if grads is None else (scale[s:e] if per_row else scale))
        if grads is not None:
            grads.add(z, x[s:e], weight, s, e)


def _reduce(losses, valid, reduction: str, dtype):
    if reduction == "none":
        out = losses
    else:
        out = losses.sum()
        if reduction == "mean":
            out = out / valid.sum()
    return out.to(dtype)


def chunked_forward(x, weight, bias, target, ignore_index, label_smoothing, reduction, upcast, chunk_rows):
    """The loss of cross_entropy(linear(x, weight, bias), target); chunk_rows 0: `default_chunk_rows`. The
    body of the op `passline::linear_cross_entropy`."""
    _check(x, weight, bias, target, reduction)
    losses = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _sweep(x, weight, bias, target, ignore_index, label_smoothing, chunk_rows, losses=losses)
    return _reduce(losses, target != ignore_index, reduction, torch.float32 if upcast else x.dtype)


linear_cross_entropy = torch.library.custom_op(
    "passline::linear_cross_entropy", chunked_forward, mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, Tensor target, int ignore_index, float label_smoothing, "
           "str reduction, bool upcast, int chunk_rows) -> Tensor")


@linear_cross_entropy.register_fake
def _(x, weight, bias, target, ignore_index, label_smoothing, reduction, upcast, chunk_rows):
    _check(x, weight, bias, target, reduction)
    return x.new_empty(x.shape[:1] if reduction == "none" else (), dtype=torch.float32 if upcast else x.dtype)


def chunked_backward(grad, x, weight, bias, target, ignore_index, label_smoothing, reduction, chunk_rows,
                     need_x, need_weight, need_bias):
    """(dx, dweight, dbias) of linear_cross_entropy, each chunk's logits computed again; a gradient not needed
    is an empty tensor. The body of the op `passline::linear_cross_entropy_backward`."""
    grads = _Gradients(x, weight, bias, need_x, need_weight, need_bias)
    scale = _scale(target, target != ignore_index, reduction, grad)
    _sweep(x, weight, bias, target, ignore_index, label_smoothing, chunk_rows, scale=scale, grads=grads)
    return grads.rounded(weight, bias)


linear_cross_entropy_backward = torch.library.custom_op(
    "passline::linear_cross_entropy_backward", chunked_backward, mutates_args=(),
    schema="(Tensor grad, Tensor x, Tensor weight, Tensor? bias, Tensor target, int ignore_index, "
           "float label_smoothing, str reduction, int chunk_rows, bool need_x, bool need_weight, bool need_bias)"
           " -> (Tensor, Tensor, Tensor)")


def _fake_grads(x, weight, bias, need_x, need_weight, need_bias, dtype=None):
    dx = x.new_empty(x.shape if need_x else (0,))
    dweight = weight.new_empty(weight.shape if need_weight else (0,), dtype=dtype)
    dbias = weight.new_empty(bias.shape if need_bias else (0,), dtype=dtype or (bias if need_bias else weight).dtype)
    return dx, dweight, dbias


@linear_cross_entropy_backward.register_fake
def _(grad, x, weight, bias, target, ignore_index, label_smoothing, reduction, chunk_rows, need_x, need_weight,
      need_bias):
    return _fake_grads(x, weight, bias, need_x, need_weight, need_bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, target, ignore_index, label_smoothing, reduction, _upcast, chunk_rows = inputs
    ctx.save_for_backward(x, weight, bias, target)
    ctx.options = (ignore_index, label_smoothing, reduction, chunk_rows)


def _backward(ctx, grad):
    x, weight, bias, target = ctx.saved_tensors
    need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
    dx, dweight, dbias = linear_cross_entropy_backward(grad, x, weight, bias, target, *ctx.options,
                                                       need_x, need_weight, need_bias)
    return (dx if need_x else None, dweight if need_weight else None, dbias if need_bias else None,
            None, None, None, None, None, None)


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


def chunked_forward_with_grads(x, weight, bias, target, ignore_index, label_smoothing, reduction, upcast,
                               chunk_rows, need_x, need_weight, need_bias):
    """(loss, dx, dweight, dbias) for a loss's gradient of 1, each chunk's logits computed once: the loss is
    a sum or a mean, so its gradient only scales these (the backward of
    `passline::linear_cross_entropy_with_grads` does, 3 matmuls in all where recomputing takes 4).
    dweight and dbias are float32 sums rounded once to the weight's and bias's dtypes, here: what autograd
    holds until the backward is then as large as the weight, not twice (bfloat16), and for a loss gradient of
    1 (a training loss) the backward's scaling is exact; any other scale rounds them once more, as it does
    dx. A gradient not needed is empty."""
    _check(x, weight, bias, target, reduction)
    if reduction == "none":
        raise ValueError("linear_cross_entropy_with_grads: a per-row loss's gradient is not a scale; use "
                         "linear_cross_entropy")
    valid = target != ignore_index
    losses = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    grads = _Gradients(x, weight, bias, need_x, need_weight, need_bias)
    _sweep(x, weight, bias, target, ignore_index, label_smoothing, chunk_rows, losses=losses,
           scale=_scale(target, valid, reduction), grads=grads)
    return (_reduce(losses, valid, reduction, torch.float32 if upcast else x.dtype), *grads.rounded(weight, bias))


linear_cross_entropy_with_grads = torch.library.custom_op(
    "passline::linear_cross_entropy_with_grads", chunked_forward_with_grads, mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, Tensor target, int ignore_index, float label_smoothing, "
           "str reduction, bool upcast, int chunk_rows, bool need_x, bool need_weight, bool need_bias) "
           "-> (Tensor, Tensor, Tensor, Tensor)")


@linear_cross_entropy_with_grads.register_fake
def _(x, weight, bias, target, ignore_index, label_smoothing, reduction, upcast, chunk_rows, need_x, need_weight,
      need_bias):
    _check(x, weight, bias, target, reduction)
    loss = x.new_empty((), dtype=torch.float32 if upcast else x.dtype)
    return (loss, *_fake_grads(x, weight, bias, need_x, need_weight, need_bias))


def _setup_context_with_grads(ctx, inputs, output):
    ctx.computed = inputs[-3:]  # need_x, need_weight, need_bias
    ctx.dtypes = (inputs[1].dtype, None if inputs[2] is None else inputs[2].dtype)
    ctx.save_for_backward(*output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _backward_with_grads(ctx, grad, *_):
    missing = [k for k in range(3) if ctx.needs_input_grad[k] and not ctx.computed[k]]
    if missing:  # the pass read requires_grad from dynamo's example values; never answer zero instead
        raise RuntimeError(f"linear_cross_entropy_with_grads: the gradient of input {missing[0]} was not "
                           f"computed in the forward")
    dx, dweight, dbias = ctx.saved_tensors
    # the loss's gradient scales the unit gradients, each in its parameter's dtype: exact for a gradient of 1,
    # else rounded once more (computed in float32)
    return (dx * grad if ctx.computed[0] else None,
            (dweight * grad.float()).to(ctx.dtypes[0]) if ctx.computed[1] else None,
            (dbias * grad.float()).to(ctx.dtypes[1]) if ctx.computed[2] else None,
            *[None] * 9)


linear_cross_entropy_with_grads.register_autograd(_backward_with_grads, setup_context=_setup_context_with_grads)
