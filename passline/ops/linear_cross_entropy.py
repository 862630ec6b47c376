"""`passline::linear_cross_entropy`: `F.cross_entropy(F.linear(x, weight, bias), target)` whose
`[rows, vocabulary]` logits never exist whole.

An LM head's logits are the largest tensor of a training step (8k tokens x 128k vocabulary: 2 GiB in
bfloat16, twice that once upcast to float32), and autograd keeps them from the forward to the backward.
Here the rows are taken in chunks. The forward computes each chunk's logits (one matmul, in the input's
dtype) and their float32 log-softmax, and keeps the chunk's rows of the loss. The backward computes each
chunk's logits again and their float32 softmax, turns that into the logits' gradient at once (minus the
smoothed one-hot, times the loss's gradient, written in the logits' dtype) and consumes it into the
gradients of `x` (the chunk's rows), `weight` and `bias` (summed over chunks in float32). Autograd saves
`x`, `weight`, `bias` and `target`; the price is the forward's matmul run again in the backward.

The loss is F.cross_entropy's: `ignore_index` rows count for nothing (and `mean` divides by the rows
left: all ignored is 0/0, NaN, as eager), `label_smoothing` eps makes a row's loss
`(1 - eps) * (lse - z[target]) + eps * (lse - mean(z))`, `reduction` is "mean", "sum" or "none". The
loss is computed in float32 whatever the input's dtype: `upcast` says whether it is returned in float32
(the model wrote `cross_entropy(logits.float(), ...)`, or the input is float32) or rounded to the input's
dtype (eager's bfloat16 cross-entropy rounds every log-probability to bfloat16: ours is closer to exact).
"""
import torch

Tensor = torch.Tensor

REDUCTIONS = ("mean", "sum", "none")


def default_chunk_rows(rows: int, hidden: int, vocab: int) -> int:
    """Rows per chunk when none is given: a chunk's logits `[chunk, vocab]` hold at most as many elements
    as the larger of `weight` `[vocab, hidden]` and `x` `[rows, hidden]`, tensors the step holds anyway
    (with their gradients), so the chunk's buffers (float32 logits and their gradient) stay a small
    multiple of them. A wide vocabulary gives chunks of `hidden` rows — a matmul of `hidden` rows by
    `hidden` by `vocab`, large enough to keep a GPU's tensor cores busy —; a vocabulary narrower than the
    rows gives one chunk (the logits are no larger than `x`: nothing to save)."""
    if rows <= 0:
        return 1
    budget = max(vocab, rows) * hidden
    return max(1, min(rows, -(-budget // max(vocab, 1))))


def _chunks(rows: int, chunk: int):
    return ((s, min(rows, s + chunk)) for s in range(0, rows, chunk))


def _logits(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # addmm, as F.linear computes it (one rounding of product plus bias)
    return x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t())


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


def chunked_forward(x, weight, bias, target, ignore_index, label_smoothing, reduction, upcast, chunk_rows):
    """The loss of cross_entropy(linear(x, weight, bias), target); chunk_rows 0: `default_chunk_rows`. The
    body of the op `passline::linear_cross_entropy`."""
    _check(x, weight, bias, target, reduction)
    rows, vocab = x.shape[0], weight.shape[0]
    chunk = chunk_rows if chunk_rows > 0 else default_chunk_rows(rows, x.shape[1], vocab)
    losses = torch.empty(rows, dtype=torch.float32, device=x.device)
    valid = target != ignore_index
    for s, e in _chunks(rows, chunk):
        # eager's log_softmax of the float32 logits, in one kernel that reads them in their dtype: the
        # chunk's buffers are its logits and one float32 copy
        logp = torch.log_softmax(_logits(x[s:e], weight, bias), 1, dtype=torch.float32)
        loss = logp.gather(1, torch.where(valid[s:e], target[s:e], 0).unsqueeze(1)).squeeze(1).neg_()
        if label_smoothing:
            loss = (1 - label_smoothing) * loss - label_smoothing * logp.mean(1)
        losses[s:e] = torch.where(valid[s:e], loss, 0.0)
    if reduction == "none":
        out = losses
    else:
        out = losses.sum()
        if reduction == "mean":
            out = out / valid.sum()
    return out.to(torch.float32 if upcast else x.dtype)


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
    """(dx, dweight, dbias) of linear_cross_entropy; a gradient not needed is an empty tensor. The body of
    the op `passline::linear_cross_entropy_backward`."""
    rows, hidden = x.shape
    vocab = weight.shape[0]
    chunk = chunk_rows if chunk_rows > 0 else default_chunk_rows(rows, hidden, vocab)
    valid = target != ignore_index
    # each row's share of the loss's gradient: 0 for ignored rows, 1/valid rows under "mean"
    scale = grad.float()
    if reduction == "mean":
        scale = scale / valid.sum()
    scale = torch.where(valid, scale, 0.0).expand(rows).unsqueeze(1)
    # d loss / d logit = scale * (softmax - (1 - eps) * onehot - eps / vocab): the last term per row
    shift = scale * (-label_smoothing / vocab) if label_smoothing else None
    dx = x.new_empty((rows, hidden) if need_x else (0,))
    # weight and bias gradients summed over chunks in float32: each chunk's product is rounded once, as
    # eager's single matmul over all rows is, and the sum adds no rounding of its own
    dweight = torch.zeros(vocab, hidden, dtype=torch.float32, device=x.device) if need_weight else None
    dbias = torch.zeros(vocab, dtype=torch.float32, device=x.device) if need_bias else None
    for s, e in _chunks(rows, chunk):
        p = torch.softmax(_logits(x[s:e], weight, bias), 1, dtype=torch.float32)
        onehot = torch.where(valid[s:e], target[s:e], 0).unsqueeze(1)
        p.scatter_add_(1, onehot, p.new_full(onehot.shape, -(1.0 - label_smoothing)))
        # the logits' gradient, written once in their dtype (as eager's backward of .float() rounds it)
        dz = p if x.dtype == torch.float32 else torch.empty(p.shape, dtype=x.dtype, device=x.device)
        if shift is None:
            torch.mul(p, scale[s:e], out=dz)
        else:
            torch.addcmul(shift[s:e], p, scale[s:e], out=dz)
        del p
        if need_x:
            torch.mm(dz, weight, out=dx[s:e])
        if need_weight:
            if dz.dtype == torch.float32:
                dweight.addmm_(dz.t(), x[s:e])
            else:
                dweight.add_(dz.t() @ x[s:e])
        if need_bias:
            dbias.add_(dz.sum(0, dtype=torch.float32))
    dweight = dweight.to(weight.dtype) if need_weight else weight.new_empty(0)
    dbias = dbias.to(bias.dtype) if need_bias else weight.new_empty(0)
    return dx, dweight, dbias


linear_cross_entropy_backward = torch.library.custom_op(
    "passline::linear_cross_entropy_backward", chunked_backward, mutates_args=(),
    schema="(Tensor grad, Tensor x, Tensor weight, Tensor? bias, Tensor target, int ignore_index, "
           "float label_smoothing, str reduction, int chunk_rows, bool need_x, bool need_weight, bool need_bias)"
           " -> (Tensor, Tensor, Tensor)")


@linear_cross_entropy_backward.register_fake
def _(grad, x, weight, bias, target, ignore_index, label_smoothing, reduction, chunk_rows, need_x, need_weight,
      need_bias):
    dx = x.new_empty(x.shape if need_x else (0,))
    dweight = weight.new_empty(weight.shape if need_weight else (0,))
    dbias = (bias if need_bias else weight).new_empty(bias.shape if need_bias else (0,))
    return dx, dweight, dbias


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
