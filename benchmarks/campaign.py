"""Correctness campaign: train models the test suite has not seen through passline and compare
outputs, loss, every parameter's and input's .grad, and buffers (running stats) with eager.

    PYTHONPATH=$PWD TRITON_INTERPRET=1 python benchmarks/campaign.py [substring ...] [--codegen triton,reference]

float32 is compared with passline.testing's tolerance; bfloat16/float16 against a float64 run of the
same model, with eager's own error as the scale (passline must be about as close as eager is).
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import passline
from passline.testing import _same_layout, tolerance

CASES = {}


def case(name):
    def deco(fn):
        CASES[name] = fn
        return fn
    return deco


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    return []


def step(model, inputs, weights=None):
    outs = _flat(model(*inputs))
    if weights is None:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(o.shape, generator=gen) if o.is_floating_point() else None for o in outs]
    terms = [(o.double() * w.double()).sum() for o, w in zip(outs, weights) if w is not None and o.requires_grad]
    loss = torch.stack(terms).sum() if terms else None
    if loss is not None:
        loss.backward()
    return outs, loss, weights


def grads(model, inputs):
    gs = {}
    if isinstance(model, nn.Module):
        for n, p in model.named_parameters():
            gs["param " + n] = p.grad
        for n, b in model.named_buffers():
            gs["buffer " + n] = b
    for k, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            gs[f"input {k}"] = x.grad
    return gs


def copy_inputs(inputs, dtype=None):
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = _same_layout(x)
            if dtype is not None and y.is_floating_point():
                y = y.detach().to(dtype).requires_grad_(x.requires_grad)
            out.append(y)
        else:
            out.append(x)
    return out


def compare(what, got, want, ref=None, dtype=torch.float32):
    if got is None or want is None:
        assert got is None and want is None, f"{what}: {got is None=} {want is None=}"
        return
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs {want.dtype}"
    if not got.is_floating_point():
        assert torch.equal(got, want), f"{what}: integer values differ"
        return
    if ref is None or dtype == torch.float32:
        tol = tolerance(torch.float32 if want.dtype == torch.float64 else want.dtype)  # the float64 loss
        torch.testing.assert_close(got, want, **tol, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    else:
        r = ref.double()
        e_got = (got.double() - r).abs().nan_to_num(0).max().item()
        e_eager = (want.double() - r).abs().nan_to_num(0).max().item()
        scale = r.abs().max().item() + 1e-6
        # a scalar (a loss summing many rounded terms) carries their noise: a wider band around it
        tol = 4 * e_eager + tolerance(dtype)["atol"] * (0.5 if r.numel() == 1 else 0.05) * scale + 1e-6
        assert e_got <= tol, f"{what}: error vs float64 {e_got:.3g}, eager's {e_eager:.3g} (scale {scale:.3g})"
    if got.numel() and got.dim():
        gs = [s for s, n in zip(got.stride(), got.shape) if n > 1]
        ws = [s for s, n in zip(want.stride(), want.shape) if n > 1]
        assert gs == ws, f"{what}: strides {got.stride()} vs eager {want.stride()}"


class EagerRaises(Exception):
    pass


PIPELINE = None  # --pipeline: the passes to run (default passline's)


def run_case(name, codegen, dtype=torch.float32, dynamic=None, sizes=None):
    make = CASES[name]
    torch.manual_seed(0)
    model, inputs = make()[:2]
    if dtype != torch.float32:
        if isinstance(model, nn.Module):
            model = model.to(dtype)
        inputs = copy_inputs(inputs, dtype)
    eager_model, ours_model = copy.deepcopy(model), copy.deepcopy(model)
    eager_in, ours_in = copy_inputs(inputs), copy_inputs(inputs)
    torch._dynamo.reset()
    be = passline.backend(fallback="raise", codegen=codegen, pipeline=PIPELINE)
    compiled = torch.compile(ours_model, backend=be, dynamic=dynamic)
    try:
        eo, el, w = step(eager_model, eager_in)
    except Exception as e:  # noqa: BLE001
        raise EagerRaises(str(e).splitlines()[0][:120]) from e
    oo, ol, _ = step(compiled, ours_in, w)
    refs = None
    if dtype != torch.float32:
        ref_model = copy.deepcopy(model).double() if isinstance(model, nn.Module) else model
        ref_in = copy_inputs(inputs, torch.float64)
        ro, rl, _ = step(ref_model, ref_in, w)
        refs = (ro, rl, grads(ref_model, ref_in))
    assert len(oo) == len(eo), f"{len(oo)} outputs vs {len(eo)}"
    for k, (a, b) in enumerate(zip(oo, eo)):
        compare(f"output {k}", a, b, refs and refs[0][k], dtype)
    if el is not None:
        compare("loss", ol, el, refs and refs[1], dtype)
    ga, gb = grads(ours_model, ours_in), grads(eager_model, eager_in)
    for k in gb:
        compare(k, ga[k], gb[k], refs and refs[2][k], dtype)
    return be


# ---------------------------------------------------------------- cases

def rg(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype).requires_grad_()


class Fn(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


@case("transformer_encoder_bf")
def _():
    m = nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True)
    return m, [rg(2, 7, 16)]


@case("transformer_encoder_seqfirst_normfirst_mask")
def _():
    m = nn.TransformerEncoderLayer(16, 4, dim_feedforward=20, dropout=0.0, norm_first=True)
    mask = torch.tensor([[False] * 5 + [True] * 2, [False] * 7, [False] * 6 + [True]])
    enc = Fn(lambda s, x: s.l(x, src_key_padding_mask=mask), l=m)
    return enc, [rg(7, 3, 16)]


@case("transformer_encoder_causal")
def _():
    m = nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True, activation="gelu")
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    return Fn(lambda s, x: s.l(x, src_mask=causal, is_causal=True), l=m), [rg(3, 5, 16)]


@case("transformer_decoder")
def _():
    m = nn.TransformerDecoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True, norm_first=True)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    mem_mask = torch.tensor([[False] * 6 + [True], [False] * 7])
    return Fn(lambda s, x, mem: s.l(x, mem, tgt_mask=causal, memory_key_padding_mask=mem_mask), l=m), \
        [rg(2, 5, 16), rg(2, 7, 16)]


@case("mha_kdim_vdim")
def _():
    m = nn.MultiheadAttention(12, 3, kdim=10, vdim=6, batch_first=True)
    return Fn(lambda s, q, k, v: s.m(q, k, v, need_weights=True)[0:2], m=m), [rg(2, 5, 12), rg(2, 7, 10), rg(2, 7, 6)]


class ViT(nn.Module):
    def __init__(self, c=3, d=16, p=4, n=4):
        super().__init__()
        self.patch = nn.Conv2d(c, d, p, stride=p)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.1)
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        h = self.ln(t)
        t = t + self.attn(h, h, h, need_weights=False)[0]
        t = t + self.mlp(self.ln(t))
        return self.head(t[:, 0])


@case("vit")
def _():
    return ViT(), [rg(2, 3, 8, 8)]


@case("vit_channels_last")
def _():
    return ViT().to(memory_format=torch.channels_last), \
        [torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()]


class Mixer(nn.Module):
    def __init__(self, tokens=7, d=12):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.tok = nn.Sequential(nn.Linear(tokens, 9), nn.GELU(), nn.Linear(9, tokens))
        self.ch = nn.Sequential(nn.Linear(d, 20), nn.GELU(), nn.Linear(20, d))

    def forward(self, x):
        x = x + self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.ln2(x))


@case("mlp_mixer")
def _():
    return Mixer(), [rg(3, 7, 12)]


@case("conv1d_bn1d")
def _():
    m = nn.Sequential(nn.Conv1d(4, 6, 3, padding=2, dilation=2), nn.BatchNorm1d(6), nn.SiLU(),
                      nn.Conv1d(6, 6, 5, groups=3, stride=2), nn.Hardswish())
    return m, [rg(3, 4, 13)]


@case("conv3d_groupnorm")
def _():
    m = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Mish(), nn.AvgPool3d(2, ceil_mode=True))
    return m, [rg(2, 2, 5, 4, 3)]


@case("depthwise_instancenorm")
def _():
    m = nn.Sequential(nn.Conv2d(6, 6, 3, groups=6, padding=1), nn.InstanceNorm2d(6, affine=True), nn.ReLU(),
                      nn.Conv2d(6, 3, 1))
    return m, [rg(2, 6, 7, 5)]


@case("convtranspose_pixelshuffle")
def _():
    m = nn.Sequential(nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1), nn.PixelShuffle(2),
                      nn.Softplus(), nn.Upsample(scale_factor=2, mode="nearest"))
    return m, [rg(2, 4, 3, 5)]


@case("layernorm_2d_trailing")
def _():
    return nn.Sequential(nn.LayerNorm([5, 6]), nn.Tanh()), [rg(3, 4, 5, 6)]


@case("layernorm_3d_trailing_sliced")
def _():
    x = torch.randn(2, 4, 5, 7)[:, 1:, :, ::2].requires_grad_()
    return nn.LayerNorm([3, 5, 4]), [x]


@case("batchnorm_eval")
def _():
    m = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.ReLU6())
    m[1].running_mean.normal_()
    m[1].running_var.uniform_(0.5, 2)
    m.eval()
    return m, [rg(2, 3, 6, 7)]


@case("pooling")
def _():
    def f(s, x):
        a = F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True)
        b = F.avg_pool2d(x, 2, padding=1, count_include_pad=False)
        c = F.adaptive_avg_pool2d(x, (3, 2))
        d = F.adaptive_max_pool2d(x, 2)
        return a.sum((2, 3)) + b.mean((2, 3)), c, d
    return Fn(f), [rg(2, 3, 7, 5)]


@case("interp_bilinear_pad")
def _():
    def f(s, x):
        y = F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=False)
        z = F.interpolate(x, size=(4, 9), mode="bilinear", align_corners=True)
        p = F.pad(x, (1, 2, 2, 1), mode="reflect")
        q = F.pad(x, (2, 0, 1, 1), mode="replicate")
        return y, z, p, q
    return Fn(f), [rg(2, 3, 5, 6)]


@case("unfold_fold")
def _():
    def f(s, x):
        u = F.unfold(x, 3, padding=1, stride=2)
        return F.fold(u * 2, (5, 6), 3, padding=1, stride=2), u.transpose(1, 2)
    return Fn(f), [rg(2, 2, 5, 6)]


@case("embedding_padding_idx")
def _():
    m = nn.Embedding(11, 8, padding_idx=0)
    lin = nn.Linear(8, 11)
    idx = torch.tensor([[0, 3, 5, 0, 10], [1, 1, 2, 7, 0]])

    def f(s, i):
        h = s.e(i)
        return F.cross_entropy(s.lin(h).transpose(1, 2), i, ignore_index=0, label_smoothing=0.1)
    return Fn(f, e=m, lin=lin), [idx]


@case("embedding_bag")
def _():
    m = nn.EmbeddingBag(10, 6, mode="mean")
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    off = torch.tensor([0, 4])
    return Fn(lambda s, i, o: s.e(i, o), e=m), [idx, off]


@case("weight_tying")
def _():
    e = nn.Embedding(13, 8)
    ln = nn.LayerNorm(8)

    def f(s, i):
        h = s.ln(s.e(i) * 2.0)
        h = h + s.ln(h)  # ln used twice
        logits = h @ s.e.weight.t()
        return F.cross_entropy(logits.reshape(-1, 13), i.reshape(-1))
    return Fn(f, e=e, ln=ln), [torch.randint(0, 13, (3, 5))]


@case("misc_pointwise")
def _():
    def f(s, x, m):
        a = x.masked_fill(m, -1.5).clamp(-1, 0.7)
        b = torch.where(m, F.softplus(x), F.mish(x))
        c = torch.logsumexp(x, dim=-1)
        d = torch.cumsum(x, 1) + torch.cumprod(x * 0.5 + 1, -1)
        return a, b, c, d, F.one_hot(x.argmax(-1), 7).float() * x
    m = torch.rand(3, 5, 7) > 0.6
    return Fn(f), [rg(3, 5, 7), m]


@case("topk_sort")
def _():
    def f(s, x):
        v, i = x.topk(3, dim=1)
        sv, si = x.sort(dim=-1, descending=True)
        return v * 2, sv[..., :2], i, si
    return Fn(f), [rg(4, 9)]


@case("norms_cosine")
def _():
    def f(s, a, b):
        n = torch.linalg.vector_norm(a, ord=2, dim=-1)
        n3 = torch.linalg.vector_norm(a, ord=3, dim=(0, 2))
        c = F.cosine_similarity(a, b, dim=-1)
        p = F.pairwise_distance(a.reshape(-1, 7), b.reshape(-1, 7))
        z = F.normalize(a, dim=1)
        return n, n3, c, p, z
    return Fn(f), [rg(3, 4, 7), rg(3, 4, 7)]


@case("losses_regression")
def _():
    def f(s, x, y):
        return (F.mse_loss(x, y), F.l1_loss(x, y, reduction="sum"), F.smooth_l1_loss(x, y, beta=0.5),
                F.huber_loss(x, y, delta=0.7, reduction="none"))
    return Fn(f), [rg(5, 3), torch.randn(5, 3)]


@case("losses_classification")
def _():
    w = torch.rand(6) + 0.5
    pw = torch.rand(6) + 0.5

    def f(s, x, t, tb, tp):
        ce = F.cross_entropy(x, t, weight=w, label_smoothing=0.2)
        nll = F.nll_loss(F.log_softmax(x, -1), t, weight=w, ignore_index=2)
        bce = F.binary_cross_entropy_with_logits(x, tb, pos_weight=pw)
        kl = F.kl_div(F.log_softmax(x, -1), tp, reduction="batchmean")
        klt = F.kl_div(F.log_softmax(x, -1), tp.log(), reduction="sum", log_target=True)
        return ce, nll, bce, kl, klt
    t = torch.tensor([0, 2, 5, 2, 1, 3, 4])
    return Fn(f), [rg(7, 6), t, torch.rand(7, 6), torch.softmax(torch.randn(7, 6), -1)]


@case("ctc")
def _():
    def f(s, x):
        lp = x.log_softmax(-1)
        return F.ctc_loss(lp, torch.tensor([[1, 2, 2], [3, 1, 0]]), torch.tensor([6, 5]), torch.tensor([3, 2]))
    return Fn(f), [rg(6, 2, 5)]


@case("inplace_views")
def _():
    lin = nn.Linear(8, 8)

    def f(s, x):
        h = s.lin(x)
        h = h * 1.0
        h.relu_()
        h = h * 2.0
        h.add_(1.0)
        g = h.view(2, 3, 2, 4).permute(0, 2, 3, 1).reshape(2, 8, 3)
        return g[:, ::2] * 3, g.transpose(0, 2).contiguous()
    return Fn(f, lin=lin), [rg(6, 8)]


@case("transposed_input_t")
def _():
    lin = nn.Linear(5, 6)
    return Fn(lambda s, x: F.silu(s.lin(x.t())).sum(0), lin=lin), [torch.randn(5, 9).requires_grad_()]


@case("expanded_input")
def _():
    ln = nn.LayerNorm(6)
    x = torch.randn(1, 6).expand(4, 6)
    return Fn(lambda s, x, y: s.ln(x * y), ln=ln), [x, rg(4, 6)]


@case("sliced_storage_offset")
def _():
    base = torch.randn(5, 9, 11)
    x = base[1:4, 2:, 3:10:2].requires_grad_()
    return nn.Sequential(nn.Linear(4, 5), nn.GELU(approximate="tanh")), [x]


@case("scalar_0dim_size1")
def _():
    def f(s, x, t, y):
        return (x * t).sigmoid() + y, (x - t).pow(2).mean(dim=1, keepdim=True)
    return Fn(f), [rg(1, 5, 1), rg(), rg(1, 1, 3)]


@case("batch1_rms_dropout_eval")
def _():
    m = nn.Sequential(nn.Linear(9, 9), nn.Dropout(0.0), nn.RMSNorm(9), nn.Dropout(0.3))
    m.eval()
    return m, [rg(1, 9)]


@case("glu_prelu_elu_leaky")
def _():
    m = nn.Sequential(nn.Linear(7, 10), nn.GLU(), nn.PReLU(5), nn.ELU(0.5), nn.Linear(5, 5), nn.LeakyReLU(0.1),
                      nn.Hardsigmoid(), nn.Softsign(), nn.LogSoftmax(-1))
    return m, [rg(3, 7)]


@case("channels_last_convnet")
def _():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.GroupNorm(4, 8), nn.GELU(),
                      nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.Hardswish(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).to(memory_format=torch.channels_last)
    return m, [torch.randn(2, 3, 9, 7).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("int_inputs")
def _():
    def f(s, a, b, x):
        c = (a * 3 + b) // 2 - a % 3
        d = torch.bitwise_and(a, b) + (a > b).long()
        return x * c.float(), d, c.sum(0), torch.maximum(a, b).max()
    return Fn(f), [torch.randint(-5, 9, (4, 6)), torch.randint(-5, 9, (4, 6)), rg(4, 6)]


@case("gru_cell_manual")
def _():
    cell = nn.GRUCell(5, 6)

    def f(s, x):
        h = torch.zeros(x.shape[1], 6)
        outs = []
        for t in range(x.shape[0]):
            h = s.cell(x[t], h)
            outs.append(h)
        return torch.stack(outs)
    return Fn(f, cell=cell), [rg(3, 2, 5)]


@case("lstm")
def _():
    return Fn(lambda s, x: s.l(x)[0], l=nn.LSTM(5, 6, batch_first=True)), [rg(2, 3, 5)]




@case("sdpa_masks_transposed")
def _():
    def f(s, q, k, v, m):
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=m)
        b = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=m.float().log(), scale=0.3)
        return a.transpose(1, 2), b
    m = torch.rand(5, 7) > 0.3
    m[:, 0] = True
    return Fn(f), [rg(2, 5, 3, 4), rg(2, 7, 3, 4), rg(2, 7, 3, 4), m]


@case("maxpool_indices_unpool")
def _():
    def f(s, x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y * 2, i, 2, output_size=x.shape[-2:]), y
    return Fn(f), [rg(2, 3, 6, 5)]


@case("interp_modes")
def _():
    def f(s, x, v):
        return (F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False),
                F.interpolate(x, size=(7, 3), mode="nearest-exact"),
                F.interpolate(v, scale_factor=(1.5, 2, 1), mode="trilinear"),
                F.interpolate(x[:, 0], size=9, mode="linear"))
    return Fn(f), [rg(2, 3, 5, 4), rg(1, 2, 3, 4, 2)]


@case("grid_sample")
def _():
    def f(s, x, theta):
        grid = F.affine_grid(theta, (2, 3, 5, 4), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return Fn(f), [rg(2, 3, 6, 7), (torch.eye(2, 3).expand(2, 2, 3) + 0.1 * torch.randn(2, 2, 3)).requires_grad_()]


@case("shape_ops")
def _():
    def f(s, x):
        a = torch.roll(x, (1, -2), (0, 2)).flip(1)
        b = x.repeat(1, 2, 1)[:, 1:4]
        c = torch.repeat_interleave(x, 2, dim=2)
        d = torch.tril(x @ x.transpose(-1, -2), diagonal=-1) + torch.triu(torch.ones(3, 3), 1)
        e = torch.diagonal(x[:, :, :3], dim1=1, dim2=2)
        return a, b, c, d, e, x.narrow(2, 1, 2).unflatten(0, (1, 2))
    return Fn(f), [rg(2, 3, 5)]


@case("gather_scatter_index_put")
def _():
    def f(s, x, idx, src):
        g = torch.gather(x, 1, idx)
        sa = torch.zeros(4, 6).scatter_add(1, idx, src * g)
        y = x.clone()
        y[torch.tensor([0, 2, 2])] += 1.5 * x[1]
        ii = x.index_select(1, torch.tensor([5, 0, 0, 3]))
        return g, sa, y, ii, x[idx[:, 0], idx[:, 1]]
    return Fn(f), [rg(4, 6), torch.randint(0, 6, (4, 3)), rg(4, 3)]


@case("input_mutation_alias_outputs")
def _():
    def f(s, x, y):
        y.mul_(2)  # y does not require grad: a buffer-like in-place update
        z = x * y
        return z, z.view(-1), x.t(), y
    return Fn(f), [rg(3, 4), torch.randn(3, 4)]


@case("var_std_softmax_dims")
def _():
    def f(s, x):
        v, m = torch.var_mean(x, dim=(0, 2), correction=0, keepdim=True)
        sd = x.std(1, unbiased=True)
        sm0 = torch.softmax(x, 0)
        lsm = torch.log_softmax(x.transpose(0, 2), 1)
        return (x - m) / (v + 1e-5).sqrt(), sd, sm0, lsm, x.amax((1, 2)) * x.prod(-1).sum()
    return Fn(f), [rg(3, 5, 4)]


@case("einsum_bmm_baddbmm")
def _():
    def f(s, a, b, c):
        e = torch.einsum("bij,bjk->bik", a, b)
        e2 = torch.einsum("bij,bkj->bik", a, c)
        return torch.baddbmm(e, a, b, beta=0.5, alpha=2.0), e2.tanh(), torch.addmm(e[0], a[0], b[0].t().t())
    return Fn(f), [rg(2, 3, 4), rg(2, 4, 5), rg(2, 3, 4)]


@case("clamp_tensor_hardtanh_threshold")
def _():
    def f(s, x, lo, hi):
        return (torch.clamp(x, lo, hi), F.hardtanh(x, -0.5, 0.5), F.threshold(x, 0.2, -1.0), F.relu6(x * 4),
                F.celu(x), F.selu(x), F.gelu(x, approximate="tanh"), F.logsigmoid(x), F.tanhshrink(x))
    return Fn(f), [rg(4, 5), rg(1, 5) - 1, rg(4, 1) + 1]


@case("layernorm_noaffine_nobias_groupnorm_cl")
def _():
    m = nn.ModuleList([nn.LayerNorm(6, elementwise_affine=False), nn.LayerNorm(6, bias=False), nn.GroupNorm(3, 6)])

    def f(s, x, y):
        return s.m[0](x), s.m[1](x.transpose(0, 1)), s.m[2](y)
    return Fn(f, m=m), [rg(4, 3, 6), torch.randn(2, 6, 5, 3).contiguous(memory_format=torch.channels_last)
                        .requires_grad_()]


@case("bn_2d_input_eval_cl")
def _():
    bn1 = nn.BatchNorm1d(5)
    bn2 = nn.BatchNorm2d(4, momentum=None)
    bn3 = nn.BatchNorm2d(4, affine=False, track_running_stats=False)

    def f(s, x, y):
        return s.bn1(x), s.bn2(y), s.bn3(y)
    return Fn(f, bn1=bn1, bn2=bn2, bn3=bn3), \
        [rg(6, 5), torch.randn(3, 4, 2, 5).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("autocast_bf16")
def _():
    lin = nn.Sequential(nn.Linear(8, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 4))

    def f(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = s.lin(x)
        return y.float().softmax(-1)
    return Fn(f, lin=lin), [rg(5, 8)]


@case("no_grad_detach_inside")
def _():
    lin = nn.Linear(6, 6)

    def f(s, x):
        with torch.no_grad():
            scale = x.abs().amax(-1, keepdim=True)
        y = s.lin(x / scale)
        return y * y.detach().sigmoid()
    return Fn(f, lin=lin), [rg(4, 6)]


@case("prod_amax_ties")
def _():
    def f(s, x):
        return x.amax(1), x.amin(0), x.max(1).values, torch.prod(x, 1), x.norm(dim=1), x.abs().sum()
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    return Fn(f), [x.requires_grad_()]


@case("strided_slices_inputs")
def _():
    base = torch.randn(4, 10, 9)
    x = base[:, ::2, 1::3].requires_grad_()  # step in the last dim
    y = torch.randn(5, 4).t()[1:, ::2].requires_grad_()
    return Fn(lambda s, x, y: ((x * 2).softmax(1) + x.mean(), y.cumsum(0) @ y.t())), [x, y]


@case("conv_transpose1d_3d_dilated")
def _():
    m = nn.ModuleList([nn.ConvTranspose1d(3, 4, 4, stride=3, padding=1, dilation=2),
                       nn.ConvTranspose3d(2, 2, 2, stride=2, groups=2), nn.Conv2d(3, 6, (3, 1), dilation=(2, 1))])

    def f(s, x, v, y):
        return s.m[0](x), s.m[1](v), s.m[2](y)
    return Fn(f, m=m), [rg(2, 3, 5), rg(1, 2, 2, 3, 2), rg(2, 3, 7, 4)]


@case("lstm_gru_modules")
def _():
    m = nn.ModuleList([nn.GRU(4, 5, batch_first=True), nn.LSTM(4, 3, num_layers=2, bidirectional=True)])

    def f(s, x):
        return s.m[0](x)[0], s.m[1](x.transpose(0, 1))[0]
    return Fn(f, m=m), [rg(2, 3, 4)]


class EMA(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("ema", torch.zeros(d))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("hist", torch.zeros(4, d))

    def forward(self, x):
        h = self.lin(x)
        old = self.ema * 1.0  # reads the old value
        self.ema.mul_(0.9).add_(h.detach().mean(0) * 0.1)
        self.count += 1
        self.hist[self.count % 4] = self.ema  # index_put into a buffer, reading the new value
        return h - old + self.ema, self.hist.sum(0)


@case("buffer_mutations_ema")
def _():
    return EMA(), [rg(5, 6)]


@case("scatters_reads_between")
def _():
    def f(s, a, b, i, j):
        y = torch.zeros(5, 3)
        y.index_add_(0, i, a)
        z = y * 2
        y.index_add_(0, j, b * z[j])
        y[i[0]] = a[1] + 1  # a store after two adds
        w = y.clone()
        w[:, 1] += 3 * y[:, 0]
        return z, y, w
    return Fn(f), [rg(4, 3), rg(6, 3), torch.tensor([0, 2, 2, 4]), torch.tensor([1, 1, 3, 0, 2, 2])]


@case("input_index_put_inplace")
def _():
    def f(s, x, idx, v):
        y = x * 1
        y[idx] = v.sigmoid()
        y[:, 0] *= 2
        return y.cumsum(1), torch.index_put(x, (idx,), v, accumulate=True)
    return Fn(f), [rg(6, 4), torch.tensor([4, 1, 1]), rg(3, 4)]


@case("embedding_scale_grad_max_norm")
def _():
    e1 = nn.Embedding(9, 5, scale_grad_by_freq=True)
    e2 = nn.Embedding(9, 5, padding_idx=8)

    def f(s, i):
        return (s.e1(i) * s.e2(i.flip(0))).sum(-1), s.e1(i).transpose(0, 1)
    return Fn(f, e1=e1, e2=e2), [torch.tensor([[1, 8, 3, 3], [0, 8, 3, 7], [1, 1, 1, 2]])]


class MiniUNet(nn.Module):
    def __init__(self, c=3, w=6):
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(inplace=True))
        self.d2 = nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1), nn.GroupNorm(2, 2 * w), nn.SiLU())
        self.up = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.u1 = nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(w, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        u = self.up(b)
        u = F.interpolate(u, size=a.shape[-2:], mode="nearest")
        return self.out(self.u1(torch.cat([u, a], 1)))


@case("unet_cat_skip")
def _():
    return MiniUNet(), [rg(2, 3, 9, 7)]


@case("unet_cat_skip_channels_last")
def _():
    return MiniUNet().to(memory_format=torch.channels_last), \
        [torch.randn(2, 3, 8, 6).contiguous(memory_format=torch.channels_last).requires_grad_()]


class MoE(nn.Module):
    def __init__(self, d=8, e=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, e)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, 12), nn.GELU(), nn.Linear(12, d)) for _ in range(e)])

    def forward(self, x):
        t = x.reshape(-1, x.shape[-1])
        probs = self.router(t).softmax(-1)
        w, idx = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(t)
        for e, expert in enumerate(self.experts):
            mask = (idx == e)
            gate = (w * mask).sum(-1, keepdim=True)
            out = out + gate * expert(t)
        aux = (probs.mean(0) * F.one_hot(idx[:, 0], probs.shape[-1]).float().mean(0)).sum()
        return out.view_as(x), aux


@case("moe_topk_router")
def _():
    return MoE(), [rg(2, 5, 8)]


@case("losses_more")
def _():
    w = torch.rand(5) + 0.5

    def f(s, x, y, t, p):
        return (F.cross_entropy(x, t, weight=w, ignore_index=1, label_smoothing=0.3),
                F.cross_entropy(x.unsqueeze(-1).expand(7, 5, 3), t.unsqueeze(-1).expand(7, 3), reduction="none"),
                F.multi_margin_loss(x, t, margin=0.5),
                F.margin_ranking_loss(x[:, 0], y[:, 0], t.float().sign() * 2 - 1),
                F.triplet_margin_loss(x, y, x.flip(0)), F.cosine_embedding_loss(x, y, (t > 2).float() * 2 - 1),
                F.poisson_nll_loss(x, p), F.gaussian_nll_loss(x, y, p + 0.1),
                F.hinge_embedding_loss(x, y.detach().sign()),
                F.binary_cross_entropy(torch.sigmoid(x), p.clamp(0, 1), weight=w),
                F.soft_margin_loss(x, y.detach().sign()), F.multilabel_soft_margin_loss(x, (p > 0.5).float()))
    t = torch.tensor([0, 1, 4, 2, 1, 3, 0])
    return Fn(f), [rg(7, 5), rg(7, 5), t, torch.rand(7, 5)]


@case("weight_norm_spectral_param")
def _():
    lin = nn.utils.parametrizations.weight_norm(nn.Linear(6, 5))
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 3, 3), dim=0)
    return Fn(lambda s, x, y: (s.lin(x), s.conv(y)), lin=lin, conv=conv), [rg(4, 6), rg(2, 2, 7)]


@case("channel_shuffle_flatten")
def _():
    def f(s, x):
        n, c, h, w = x.shape
        y = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        z = nn.Unflatten(1, (2, 3))(nn.Flatten(2)(y).mean(-1))
        return F.pixel_unshuffle(y, 2), z, F.channel_shuffle(x, 3)
    return Fn(f), [torch.randn(2, 6, 4, 6).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("nan_inf_masks")
def _():
    def f(s, x):
        y = torch.where(x > 0, x.log(), torch.zeros_like(x))
        z = torch.nan_to_num(x.log(), nan=0.0, neginf=-5.0)
        m = torch.isfinite(z) & (x.abs() < 1.5)
        return y, z * m, torch.where(m, x, 0.0).sum(0), x.masked_fill(~m, float("-inf")).softmax(-1)
    x = torch.randn(4, 5)
    x[:, 0] = 0.3  # every row keeps a finite entry
    return Fn(f), [x.requires_grad_()]


# ---------------------------------------------------------------- dynamic shapes: one compile, several sizes
DYNAMIC = {
    "encoder_seq": (lambda: nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, norm_first=True),
                    lambda n: [rg(2, n, 16)]),
    "conv1d_len": (lambda: nn.Sequential(nn.Conv1d(3, 5, 3, padding=1), nn.BatchNorm1d(5), nn.GELU(),
                                         nn.AdaptiveAvgPool1d(2)), lambda n: [rg(2, 3, n)]),
    "mixer_batch": (lambda: Mixer(), lambda n: [rg(n, 7, 12)]),
    "interp_pad_hw": (lambda: Fn(lambda s, x: (F.interpolate(x, scale_factor=2, mode="bilinear"),
                                               F.pad(x, (1, 1, 1, 1), mode="reflect"))),
                      lambda n: [rg(2, 2, n, n + 1)]),
    "ce_batch": (lambda: Fn(lambda s, x, t: F.cross_entropy(s.l(x), t, label_smoothing=0.1), l=nn.Linear(6, 9)),
                 lambda n: [rg(n, 6), torch.randint(0, 9, (n,))]),
    "embedding_seq": (lambda: Fn(lambda s, i: s.ln(s.e(i)).sum(1), e=nn.Embedding(10, 8, padding_idx=1),
                                 ln=nn.LayerNorm(8)), lambda n: [torch.randint(0, 10, (3, n))]),
    "vit_batch": (lambda: ViT(), lambda n: [rg(n, 3, 8, 8)]),
    "groupnorm_hw": (lambda: nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.GroupNorm(2, 4), nn.SiLU()),
                     lambda n: [rg(2, 4, n, 3)]),
}


def run_dynamic(name, codegen, sizes=(5, 7, 13)):
    make_model, make_inputs = DYNAMIC[name]
    torch.manual_seed(0)
    model = make_model()
    torch._dynamo.reset()
    be = passline.backend(fallback="raise", codegen=codegen, pipeline=PIPELINE)
    ours_model, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(ours_model, backend=be, dynamic=True)
    for n in sizes:
        inputs = make_inputs(n)
        ours_model.zero_grad(set_to_none=True)
        eager_model.zero_grad(set_to_none=True)
        eager_in, ours_in = copy_inputs(inputs), copy_inputs(inputs)
        eo, el, w = step(eager_model, eager_in)
        oo, ol, _ = step(compiled, ours_in, w)
        for k, (a, b) in enumerate(zip(oo, eo)):
            compare(f"size {n} output {k}", a, b)
        ga, gb = grads(ours_model, ours_in), grads(eager_model, eager_in)
        for k in gb:
            compare(f"size {n} {k}", ga[k], gb[k])
    return be


def main_dynamic(names, codegens):
    for name in [n for n in DYNAMIC if not names or any(s in n for s in names)]:
        for cg in codegens:
            t = time.time()
            try:
                be = run_dynamic(name, cg)
                status = f"pass ({len(be.reports)} graphs compiled)"
            except Exception as e:  # noqa: BLE001
                status = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                traceback.print_exc()
            print(f"dynamic {name:37s} {cg:9s} {status} ({time.time() - t:.1f}s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--codegen", default="reference,triton")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--dynamic", action="store_true", help="the DYNAMIC cases: one compile, three sizes")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--pipeline", default=None, help="a pipeline's text (default: passline's)")
    args = ap.parse_args()
    global PIPELINE
    PIPELINE = args.pipeline
    dtype = getattr(torch, args.dtype)
    if args.dynamic:
        main_dynamic(args.names, args.codegen.split(","))
        return 0
    names = [n for n in CASES if not args.names or any(s in n for s in args.names)]
    results = []
    for name in names:
        for cg in args.codegen.split(","):
            t = time.time()
            try:
                be = run_case(name, cg, dtype)
                ext = sum(getattr(r, "externs", 0) or 0 for r in be.reports)
                status = f"pass (externs {ext})"
            except EagerRaises as e:
                status = f"skip (eager raises: {e})"
            except Exception as e:  # noqa: BLE001
                status = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                if args.v:
                    traceback.print_exc()
                ext = None
            line = f"{name:45s} {cg:9s} {args.dtype:8s} {status} ({time.time() - t:.1f}s)"
            print(line, flush=True)
            results.append(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
