"""The decomposition table passline hands to aot_autograd.

torch's core-ATen decompositions, plus the composite ops whose decompositions expose reductions and
pointwise math that passline lowers natively: softmax/log_softmax and their backwards, layer norm and
its backward, batch norm, GELU/SiLU and their backwards, NLL loss. What is left un-decomposed (mm,
convolution, ...) runs as an Extern aten call.
"""
from __future__ import annotations

import collections.abc
import functools

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._prims_common import get_computation_dtype

aten = torch.ops.aten

EXTRA = """_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data
native_layer_norm native_layer_norm_backward native_batch_norm _native_batch_norm_legit_functional
_native_batch_norm_legit _native_batch_norm_legit_no_training native_batch_norm_backward
gelu gelu_backward silu silu_backward sigmoid_backward tanh_backward threshold_backward
nll_loss_forward nll_loss_backward mse_loss mse_loss_backward hardtanh hardtanh_backward leaky_relu
leaky_relu_backward logsumexp rsub addcmul addcdiv lerp rms_norm _fused_rms_norm
_fused_rms_norm_backward""".split()

# Kept whole: these run as Extern aten calls, faster than any loop-level lowering of ours.
# _to_copy with only a dtype is a cast we lower; kept whole so a device move stays one call.
# The fused attention kernels must stay whole: their backward is an aten kernel that reads the forward's
# saved output and logsumexp, and core ATen's math decomposition of the CPU flash forward saves values
# that kernel misreads (every gradient of scaled_dot_product_attention was wrong; Inductor's table also
# leaves it out).
KEEP = """mm bmm addmm baddbmm convolution convolution_backward _to_copy _scaled_dot_product_flash_attention_for_cpu
_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
_scaled_dot_product_cudnn_attention""".split()
# Kept whole and lowered by passline.lowering.indexing: torch's decompositions into index_put wrap negative
# indices (index_add(0, tensor([-1]), ..) added into the last row), where eager raises
KEEP += ["index_add", "index_add_", "index_copy", "index_copy_"]


def _channel_shuffle(x, groups: int):
    """channel_shuffle with eager's output layout on each device: eager's CPU kernel keeps the input's
    memory format (torch's decomposition clones to contiguous, so a channels_last ShuffleNet activation
    came back with other strides than eager's), while on CUDA eager returns a contiguous tensor (seen on
    an H200, torch 2.11: (120, 20, 5, 1) for a channels_last (2, 6, 4, 5) input)."""
    from torch._prims_common import suggest_memory_format

    n, c = x.shape[0], x.shape[1]
    y = x.view(n, groups, c // groups, *x.shape[2:]).transpose(1, 2).reshape(x.shape)
    if x.device.type != "cpu":
        return y.contiguous()
    return y.contiguous(memory_format=suggest_memory_format(x))


def _roll(x, shifts, dims=()):
    """roll with eager's output layout: the CPU kernel writes x's suggested memory format (a channels_last
    activation stays channels_last, a transposed one comes back contiguous), while torch's decomposition
    (an index_select) and eager's CUDA kernel give a contiguous tensor."""
    from torch._prims_common import suggest_memory_format
    from torch._refs import roll

    y = roll(x, shifts, dims)
    if x.device.type != "cpu":
        return y
    return y.contiguous(memory_format=suggest_memory_format(x))


def _weight_norm_interface(v, g, dim=0):
    """weight_norm's forward with the norms in float32 for float16 as well as bfloat16, as eager's kernels
    keep them (their accumulation type): torch's decomposition keeps float16 norms, which the backward (an
    extern aten call, `_weight_norm_interface_backward`) refuses ("expected scalar type Float but found
    Half" at the first float16 training step)."""
    keep = tuple(i for i in range(v.dim()) if i != dim)
    norm = v.norm(2, keep, keepdim=True, dtype=torch.float if g.dtype in (torch.float16, torch.bfloat16) else None)
    return v * (g / norm.to(g.dtype)), norm


# ours in place of torch's (each says why)
OVERRIDES = {"channel_shuffle": _channel_shuffle, "native_channel_shuffle": _channel_shuffle, "roll": _roll,
             "_weight_norm_interface": _weight_norm_interface}


def _multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """F.multilabel_margin_loss in torch ops: for each row, the hinge `max(0, 1 - (x[y] - x[i])) / C`
    summed over its targets y — those before the first -1 — and the classes i that are not targets."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    x, t = torch.atleast_2d(input), torch.atleast_2d(target)
    dim = x.shape[1]
    idx = torch.arange(dim, device=t.device)
    end = torch.amin(torch.where(t == -1, idx, dim), dim=-1, keepdim=True)
    valid = idx < end  # [N, targets]
    u = torch.gather(x, -1, torch.where(valid, t, 0))  # each target's score
    is_target = (idx == torch.where(valid, t, -1).unsqueeze(-1)).any(1)  # [N, classes]
    z = (1.0 - u.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / dim  # [N, targets, classes]
    loss = torch.where(valid.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0).sum((1, 2))
    loss = loss.reshape(input.shape[:-1])
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                   mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """F.embedding_bag in torch ops: the rows `weight[input]` gathered, then summed, averaged or maxed per bag,
    so that aot_autograd differentiates ops passline lowers (a gather; a reduction over each row of a 2-D input,
    whose bags are its rows; an index_add or scatter_reduce over bags given by offsets). Sums accumulate in
    float32 as eager's kernels do; a mean divides by the bag's entries that are not `padding_idx`; an empty
    bag is zeros; a max takes, per column, the first entry of the bag holding the maximum, or a NaN that is the
    bag's first entry (eager's kernels keep a running maximum from the first entry, replaced by a later one
    only if greater), and the gradient goes to that entry alone. What this does not cover — sparse
    gradients, gradients scaled by frequency, nested inputs, arguments eager refuses — is F.embedding_bag's
    own call, as before (its aten op is then refused by the lowering on the CPU: the graph runs eagerly).
    So is a 1-D input with offsets on a GPU where `_aten_bags` says aten's kernel is the faster."""
    fn = torch.nn.functional.embedding_bag
    plain = (not sparse and not scale_grad_by_freq and mode in ("sum", "mean", "max") and weight.dim() == 2
             and weight.is_floating_point() and input.dim() in (1, 2) and not input.is_nested
             and not input.is_floating_point()
             and (per_sample_weights is None or (mode == "sum" and per_sample_weights.shape == input.shape
                                                 and per_sample_weights.dtype == weight.dtype))
             and ((input.dim() == 2 and offsets is None)
                  or (input.dim() == 1 and offsets is not None and offsets.dim() == 1
                      and not offsets.is_floating_point()))
             and (padding_idx is None or -weight.shape[0] <= padding_idx < weight.shape[0])
             and (input.dim() == 1 or input.shape[1] > 0))
    grad = torch.is_grad_enabled() and (weight.requires_grad or (per_sample_weights is not None
                                                                 and per_sample_weights.requires_grad))
    if not plain or (include_last_offset and input.dim() == 1 and offsets.shape[0] < 1) \
            or (input.dim() == 1 and _aten_bags(weight, mode, grad)):
        return fn(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                  per_sample_weights, include_last_offset, padding_idx)
    if max_norm is not None:
        with torch.no_grad():
            torch.embedding_renorm_(weight, input, max_norm, norm_type)
    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    keep = None if padding_idx is None else input != (padding_idx % weight.shape[0])
    vals = torch.embedding(weight, input)  # [bags, entries, dim] or [entries, dim]; a negative index raises
    if mode != "max":
        vals = vals.to(acc)
        psw = None if per_sample_weights is None else per_sample_weights.to(acc)
        if keep is not None:  # both, before the product: a padding entry's inf or NaN (a row's, or its weight's)
            vals = torch.where(keep.unsqueeze(-1), vals, 0)  # would make NaN of the product or of its gradient
            psw = None if psw is None else torch.where(keep, psw, 0)
        if psw is not None:
            vals = vals * psw.unsqueeze(-1)
    if input.dim() == 2:  # bags are rows
        if mode == "max":
            # eager's running max starts at the bag's first entry (not padding) and takes a later one only if
            # greater: a NaN wins as that first entry, and only then; a column of -inf (padding, masked to -inf,
            # ties it: never the maximum) keeps that entry. Its value is gathered again from the weight: read from
            # `vals`, the gathered rows would be stored whole for two readers instead of reduced as they load
            pos = input.new_zeros(input.shape[0], 1, dtype=torch.int64) if keep is None \
                else keep.to(torch.int8).argmax(1, keepdim=True)  # [bags, 1]: the first entry not padding
            lead = torch.embedding(weight.detach(), torch.gather(input, 1, pos).squeeze(1))  # [bags, dim]
            v = vals.detach() if keep is None else torch.where(keep.unsqueeze(-1), vals.detach(), float("-inf"))
            v = torch.where(torch.isnan(v), float("-inf"), v)
            if not grad:  # the value alone: one row reduction, no first maximum to find
                out = torch.where(torch.isnan(lead), lead, v.amax(1))
            else:  # the maximum and its first entry in one reduction; the gradient goes to that entry alone
                top, first = v.max(1)  # [bags, dim]
                first = torch.where(torch.isnan(lead) | (top == float("-inf")), pos, first)
                out = _columns_of_rows(weight, torch.gather(input, 1, first))
            return out if keep is None else torch.where(keep.any(1, keepdim=True), out, 0)
        out = vals.sum(1)
        if mode == "mean":
            count = input.shape[1] if keep is None else keep.sum(1, keepdim=True).clamp_min(1)
            out = out / count
        return out.to(weight.dtype)
    n, bags = input.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    if offsets.shape[0]:  # what offsets mean (eager's CPU kernels check most of it), where a scatter would go on
        last = offsets[-1] == n if include_last_offset else offsets[-1] <= n  # CSR: the last offset ends the input
        torch._assert_async((offsets[0] == 0) & last & (offsets[1:] >= offsets[:-1]).all(),
                            "embedding_bag: offsets must start at 0, never decrease, and not exceed the input's "
                            "length (with include_last_offset, the last one is the input's length)")
    # each entry's bag: the last offset at or before it; past the last bag (include_last_offset) and the
    # padding entries go to a bag of their own, `bags`, dropped at the end
    bag = torch.searchsorted(offsets.to(torch.int64), torch.arange(n, device=input.device), right=True) - 1
    if keep is not None:
        bag = torch.where(keep, bag, bags)
    bag = torch.where((bag < 0) | (bag >= bags), bags, bag)  # (< 0: no offsets at all, no bags)
    dim = weight.shape[1]
    if mode == "max":
        if n == 0:  # zeros, still a function of the weight (its gradient, zeros, is asked for)
            return weight[:0].sum(0).expand(bags, dim).contiguous()
        index = bag.unsqueeze(1).expand(n, dim)
        v = torch.where(torch.isnan(vals.detach()), float("-inf"), vals.detach())
        top = torch.zeros(bags + 1, dim, dtype=v.dtype, device=v.device).scatter_reduce(
            0, index, v, "amax", include_self=False)
        pos = torch.arange(n, device=input.device)
        hit = torch.where(v == top.gather(0, index), pos.unsqueeze(1), n)
        first = torch.full((bags + 1, dim), n, dtype=torch.int64, device=input.device).scatter_reduce(
            0, index, hit, "amin", include_self=True)
        # a NaN wins as the bag's first entry (as in eager's running max), and only then
        lead = torch.full((bags + 1,), n, dtype=torch.int64, device=input.device).scatter_reduce(
            0, bag, pos, "amin", include_self=True).clamp_max(n - 1)
        first = torch.where(torch.isnan(vals.detach()[lead]) & (first < n), lead.unsqueeze(1), first)[:bags]
        return torch.where(first < n, _columns_of_rows(weight, input[first.clamp_max(n - 1)]), 0)
    out = torch.zeros(bags + 1, dim, dtype=acc, device=vals.device).index_add(0, bag, vals)[:bags]
    if mode == "mean":
        if keep is None:  # a bag's entries run from its offset to the next (the last bag's to the end)
            ends = torch.cat([offsets[1:bags + 1], offsets.new_full((1,), n)])[:bags].clamp(0, n)
            count = (ends - offsets[:bags].clamp(0, n)).to(acc)
        else:
            count = torch.zeros(bags + 1, dtype=acc, device=vals.device).index_add(0, bag, keep.to(acc))[:bags]
        out = out / count.clamp_min(1).unsqueeze(1)
    return out.to(weight.dtype)


def _columns_of_rows(weight, rows):
    """out[b, c] = weight[rows[b, c], c]: a max's value gathered from the weight at the row of each column's first
    maximum. (Gathered from the bag's gathered rows instead, its backward wrote a gradient for every entry of every
    bag, zeros but one a column, and scattered them all into the weight: pooling × more atomic adds.)"""
    return torch.gather(weight, 0, rows)


def _aten_bags(weight, mode: str, grad: bool) -> bool:
    """Whether bags given by offsets run aten's `_embedding_bag` (an extern call) rather than the gather and
    the scatter over bags. The scatter adds every entry into its bag's row with an atomic add (a max: an
    atomic compare-and-swap loop, three scatters to find the first maximum), where aten's GPU kernel reduces
    each bag's entries in one program: on an H200 at 4096 bags the forward was 1.1–9× aten's time for a sum
    or mean, 3–30× for a max, and a max's training step 1.5–13×; a sum's or mean's training step was
    0.65–1.03× (aten's dense backward sorts the indices, the gather's backward is one scatter). So on a GPU,
    aten's for a max and for a forward without gradients; ours where it trains a sum or a mean, and a max
    of bfloat16 (aten has no CUDA kernel for its backward; eager raises). On the CPU always ours: aten's CPU
    kernel returns other shapes than its meta function (lowering/extern.py)."""
    return weight.device.type == "cuda" and (mode == "max" or not grad) \
        and not (mode == "max" and grad and weight.dtype == torch.bfloat16)  # (no such kernel in aten: ours)


# Functions of dynamo's graphs replaced before aot_autograd traces them, where torch's decomposition is
# wrong and runs at the autograd key (`py_impl(DispatchKey.Autograd)`), before any decomposition table:
# aten.multilabel_margin_loss_forward's sums the hinge over the positions after a target row's -1 too
# (wrong losses and gradients; aot_eager's as well; pytorch/pytorch PR #189552). Only the public function
# (nn.MultiLabelMarginLoss calls it): the private binding torch._C._nn.multilabel_margin_loss takes the
# reduction as an enum, with a default of its own, and is left to torch. Or where torch has no decomposition
# and its op cannot be an extern call: `_embedding_bag`'s CPU kernel returns other shapes than its meta
# function (lowering/extern.py, META_DISAGREES), so a graph with an EmbeddingBag used to run eagerly whole.
FX_REPLACEMENTS = {torch.nn.functional.multilabel_margin_loss: _multilabel_margin_loss,
                   torch.nn.functional.embedding_bag: _embedding_bag}


def replace_wrong_decompositions(gm: torch.fx.GraphModule) -> None:
    """Point dynamo's calls of FX_REPLACEMENTS' functions at ours (in place)."""
    hits = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in FX_REPLACEMENTS]
    for n in hits:
        n.target = FX_REPLACEMENTS[n.target]
    if hits:
        gm.recompile()

# Batch norm's forward ops: eager's kernels (CPU, CUDA, cuDNN) write the normalized output as
# empty_like(input, input.suggest_memory_format()), but torch's decompositions compute it pointwise from
# the input, in the input's stride order: BatchNorm1d on a transposed [N, C, L] activation returned a
# [N, C, L] tensor with strides (C*L, 1, C) where eager's is contiguous (a .view() of it after the
# compiled region failed). Ours call torch's and give the output eager's memory format; where it is
# already that (contiguous, channels_last), `contiguous` is the tensor itself and adds no node.
BATCH_NORMS = "native_batch_norm _native_batch_norm_legit_functional _native_batch_norm_legit " \
              "_native_batch_norm_legit_no_training".split()


def _negative_indices_wrapped(decomposition):
    """index_fill with eager's negative indices, which count from the end: torch's decomposition calls
    index_copy, which refuses them (as eager's index_copy does; see KEEP). Those below -n stay as they are,
    out of range, so the error names the index the caller gave."""

    @functools.wraps(decomposition)
    def index_fill(x, dim, index, value, *args, **kwargs):
        n = x.shape[dim] if x.ndim else 1
        return decomposition(x, dim, torch.where((index < 0) & (index >= -n), index + n, index), value, *args,
                             **kwargs)

    return index_fill


def _floating_only(decomposition):
    """softmax and log-softmax decomposed for floating inputs only: eager has no kernel for an integer or bool
    input and raises (an empty one it returns as it is), where the decomposition computed a value. Left whole
    (NotImplemented: not decomposed), the op runs as an Extern aten call and does as eager does."""

    @functools.wraps(decomposition)
    def floating(x, *args, **kwargs):
        if not x.dtype.is_floating_point:
            return NotImplemented
        return decomposition(x, *args, **kwargs)

    return floating


def _fill_in_range(decomposition):
    """masked_fill decomposed only with a fill its dtype holds: eager refuses `masked_fill(x_f16, m, -1e9)`
    ("cannot be converted to type c10::Half without overflow"), where the decomposition's scalar_tensor
    made it -inf. Left whole, the op runs as an aten call and raises as eager does."""
    from .pointwise import overflows

    @functools.wraps(decomposition)
    def masked_fill(x, mask, value, *args, **kwargs):
        if overflows(value, x.dtype):
            return NotImplemented
        return decomposition(x, mask, value, *args, **kwargs)

    return masked_fill


def _mixed_type(input, *args, **kwargs) -> bool:
    """Eager's "mixed type" norm: a bfloat16 or float16 input with a float32 parameter (weight, bias or running
    statistic), as autocast hands a BatchNorm after a convolution, or a model in bfloat16 keeps its norms'
    parameters in float32. Eager's kernels then keep the saved mean and inverse std float32."""
    return input.dtype in (torch.bfloat16, torch.float16) and any(
        isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in (*args, *kwargs.values()))


def _float32_statistics(decomposition, whole_otherwise: bool = False):
    """A batch, layer or group norm of mixed type (`_mixed_type`) decomposed on its input in float32 (what the
    decomposition computes in anyway), the output cast back to the input's dtype: its saved mean and inverse
    std stay float32, as eager's kernels keep them. torch's decompositions round them to the input's dtype —
    on the CPU for batch and layer norms, on every device for group norm — and the backward reads them: a
    float32 BatchNorm weight's gradient behind a bfloat16 activation was 6.8e-2 off eager's (0.3%, bfloat16's
    rounding of the inverse std), eager's own 1.8e-6 off float64's (Inductor's is as far off as passline's
    was). `whole_otherwise`: other calls are left whole (NotImplemented: an Extern aten call)."""

    @functools.wraps(decomposition)
    def norm(input, *args, **kwargs):
        if _mixed_type(input, *args, **kwargs):
            out, *stats = decomposition(input.float(), *args, **kwargs)
            return (out.to(input.dtype), *stats)
        return NotImplemented if whole_otherwise else decomposition(input, *args, **kwargs)

    return norm


def _float32_saved_statistics(decomposition):
    """LayerNorm's backward reading its saved mean and inverse std in the dtype it computes in (float32 for a
    float16 or bfloat16 input), as eager's kernels do. torch's decomposition computes in float32 but takes
    `rstd / N` in the statistics' own dtype, and a float16 forward saves them in float16 on the CPU (torch's
    decomposition, as eager's CPU kernel): at 9001 wide with inputs of std 100, rstd / N is 1.1e-6, below
    float16's smallest normal (6.1e-5), and the input gradient was 45x further from float64's than eager's
    (3.75e-3 against 8.4e-5; at std 1000, 120x). On a GPU the statistics are float32 already: nothing changes."""

    @functools.wraps(decomposition)
    def backward(grad_out, input, normalized_shape, mean, rstd, *args, **kwargs):
        wide = get_computation_dtype(input.dtype)
        return decomposition(grad_out, input, normalized_shape, mean.to(wide), rstd.to(wide), *args, **kwargs)

    return backward


def _in_eager_layout(decomposition):
    from torch._prims_common import suggest_memory_format

    @functools.wraps(decomposition)
    def batch_norm(input, *args, **kwargs):
        out, *stats = decomposition(input, *args, **kwargs)
        return (out.contiguous(memory_format=suggest_memory_format(input)), *stats)

    return batch_norm


def _packets(names):
    """The op packets of this torch version among `names` (some ops are newer than others)."""
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


def _overloads(names, out: bool = True) -> list:
    """Every overload of the op packets of this torch version among `names` (with `out=False`, not the `.out`
    ones)."""
    return [getattr(packet, name) for packet in _packets(names) for name in packet.overloads()
            if out or not name.endswith("out")]


def _wrap(table: dict, ops, wrapper) -> None:
    """Replace the decomposition of each of `ops` that `table` has with `wrapper` around it."""
    for op in ops:
        if op in table:
            table[op] = wrapper(table[op])


def decomposition_table() -> dict:
    """The table aot_autograd traces with (a fresh copy: a caller may change its own)."""
    return dict(_table())


class DeferredTable(collections.abc.Mapping):
    """`decomposition_table()`, built at its first read. aot_autograd reads its table only when it traces,
    which a hit of its cache does not: a warm process whose graphs all come from the cache never builds it
    (core_aten_decompositions() walks every registered decomposition: 0.15 s of a warm ResNet-style first
    call on this CPU)."""

    def __init__(self):
        self._built: dict | None = None

    def _table(self) -> dict:
        if self._built is None:
            self._built = decomposition_table()
        return self._built

    def __getitem__(self, op):
        return self._table()[op]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    # built once per process: core_aten_decompositions() walks every registered decomposition (~0.1-0.4 s
    # per compile otherwise)
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_packets(EXTRA)))
    for op in _overloads(KEEP):
        table.pop(op, None)
    for name, fn in OVERRIDES.items():
        if hasattr(aten, name):
            table[getattr(aten, name).default] = fn
    # torch's decompositions wrapped where they differ from eager (each wrapper says how)
    _wrap(table, _overloads(["index_fill", "index_fill_"], out=False), _negative_indices_wrapped)
    _wrap(table, _overloads(["_softmax", "_log_softmax"]), _floating_only)
    _wrap(table, [aten.masked_fill.Scalar, aten.masked_fill_.Scalar], _fill_in_range)
    _wrap(table, _overloads(BATCH_NORMS + ["native_layer_norm"], out=False), _float32_statistics)
    _wrap(table, _overloads(BATCH_NORMS), _in_eager_layout)
    _wrap(table, _overloads(["native_layer_norm_backward"], out=False), _float32_saved_statistics)
    # group norm otherwise runs whole (an Extern aten call), whose float32 statistics the graph, typed by
    # torch's meta function, would round to the input's dtype
    table[aten.native_group_norm.default] = _float32_statistics(
        torch._decomp.decomposition_table[aten.native_group_norm.default], whole_otherwise=True)
    return table
