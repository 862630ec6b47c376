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
        # NaN where eager has NaN (a fully masked softmax row), nowhere else; the rest vs float64
        assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at other positions than eager's"
        if not got.numel():
            return
        r = ref.double()
        e_got = (got.double() - r).abs().nan_to_num(0).max().item()
        e_eager = (want.double() - r).abs().nan_to_num(0).max().item()
        scale = r.abs().nan_to_num(0, posinf=0, neginf=0).max().item() + 1e-6
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
VARIANT = "auto"  # --variant: force "persistent" or "looped" reduction kernels (Triton)


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
    be = passline.backend(fallback="raise", codegen=codegen, pipeline=PIPELINE, kernel_variant=VARIANT)
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


# ---------------------------------------------------------------- third model campaign (2026-11-24)

@case("lstm_cell_unrolled")
def _():
    cell = nn.LSTMCell(5, 6)

    def f(s, x, h0):
        h, c = h0, torch.zeros_like(h0)
        outs = []
        for t in range(x.shape[1]):              # batch-first input: x[:, t] is a strided slice
            h, c = s.cell(x[:, t], (h, c))
            outs.append(h)
        return torch.stack(outs, 1), c
    return Fn(f, cell=cell), [rg(2, 3, 5), rg(6, 2).t()]


@case("gru_cell_proj_unrolled")
def _():
    cell = nn.GRUCell(4, 5, bias=False)
    proj = nn.Linear(5, 4)

    def f(s, x):
        h = x.new_zeros(x.shape[0], 5)
        inp = x
        for _ in range(3):
            h = s.cell(inp, h)
            inp = torch.tanh(s.proj(h))
        return h, inp
    return Fn(f, cell=cell, proj=proj), [rg(3, 4)]


@case("sdpa_causal_bool_additive")
def _():
    def f(s, q, k, v, bm, am):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=bm)              # [L, S] bool, broadcast
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=am, scale=0.5)   # [B, 1, L, S] additive
        return a, b, c
    bm = torch.rand(5, 5) > 0.4
    bm[:, 2] = True
    am = torch.randn(2, 1, 5, 5)
    return Fn(f), [rg(2, 3, 5, 4), rg(2, 3, 5, 4), rg(2, 3, 5, 4), bm, am]


@case("sdpa_gqa_cross_lengths")
def _():
    def f(s, q, k, v):
        kk = k.repeat_interleave(2, dim=1)                                     # grouped-query heads
        vv = v[:, :, None].expand(2, 2, 2, 7, 3).reshape(2, 4, 7, 3)
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=torch.ones(5, 7, dtype=torch.bool).tril(2))
    return Fn(f), [rg(2, 4, 5, 3), rg(2, 2, 7, 3), rg(2, 2, 7, 3)]


def t5_bucket(rel, bidirectional=True, num_buckets=8, max_distance=20):
    ret = torch.zeros_like(rel)
    n = -rel
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = torch.max(n, torch.zeros_like(n))
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (torch.log(n.float() / max_exact) / torch.log(torch.tensor(max_distance / max_exact))
                                * (num_buckets - max_exact)).long()
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


class T5Attn(nn.Module):
    def __init__(self, d=12, h=3, bidirectional=True):
        super().__init__()
        self.h, self.bi = h, bidirectional
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.rel = nn.Embedding(8, h)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        pos = torch.arange(n)
        bucket = t5_bucket(pos[None, :] - pos[:, None], self.bi)
        bias = self.rel(bucket).permute(2, 0, 1)[None]
        if not self.bi:
            bias = bias.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        s = q @ k.transpose(-1, -2) + bias
        out = s.softmax(-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, n, d)), bucket


@case("t5_relative_bias")
def _():
    return T5Attn(), [rg(2, 13, 12)]


@case("t5_relative_bias_causal")
def _():
    return T5Attn(bidirectional=False), [rg(1, 24, 12)]


@case("alibi_attention")
def _():
    def f(s, q, k, v):
        h, n = q.shape[1], q.shape[2]
        slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1) / h)
        pos = torch.arange(n)
        dist = (pos[None, :] - pos[:, None]).clamp(max=0).float()
        bias = slopes[:, None, None] * dist
        sc = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + bias
        sc = sc.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return sc.softmax(-1) @ v
    return Fn(f), [rg(2, 3, 7, 4), rg(2, 3, 7, 4), rg(2, 3, 7, 4)]


class SwinBlock(nn.Module):
    def __init__(self, c=8, heads=2, ws=3, shift=1):
        super().__init__()
        self.ws, self.shift, self.heads = ws, shift, heads
        self.norm = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads) * 0.1)
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + ws - 1
        self.register_buffer("rel_index", rel[..., 0] * (2 * ws - 1) + rel[..., 1], persistent=False)
        self.mlp = nn.Sequential(nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.GELU(), nn.Linear(2 * c, c))

    def forward(self, x):                       # x: [B, H, W, C]
        b, hh, ww, c = x.shape
        ws = self.ws
        y = torch.roll(self.norm(x), shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = y.view(b, hh // ws, ws, ww // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        nw = win.shape[0]
        q, k, v = self.qkv(win).view(nw, ws * ws, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        attn = attn + self.table[self.rel_index.view(-1)].view(ws * ws, ws * ws, -1).permute(2, 0, 1)
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(nw, ws * ws, c)
        out = self.proj(out).view(b, hh // ws, ww // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c)
        x = x + torch.roll(out, shifts=(self.shift, self.shift), dims=(1, 2))
        return x + self.mlp(x)


@case("swin_window_attention")
def _():
    return SwinBlock(), [rg(2, 6, 9, 8)]


class ConvNeXtBlock(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1 = nn.Linear(c, 4 * c)
        self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pw2(F.gelu(self.pw1(self.norm(y))))
        y = y.permute(0, 3, 1, 2)
        keep = torch.ones(x.shape[0], 1, 1, 1)     # stochastic depth in eval: identity
        return x + y * keep


@case("convnext_block")
def _():
    return ConvNeXtBlock(), [rg(2, 8, 7, 9)]


@case("convnext_block_channels_last")
def _():
    m = ConvNeXtBlock().to(memory_format=torch.channels_last)
    return m, [torch.randn(1, 8, 9, 7).contiguous(memory_format=torch.channels_last).requires_grad_()]


class InvertedResidual(nn.Module):
    def __init__(self, c=6, e=3, act=nn.ReLU6, se=False):
        super().__init__()
        h = c * e
        layers = [nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), act(),
                  nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), act()]
        self.body = nn.Sequential(*layers)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(h, 4, 1), nn.SiLU(), nn.Conv2d(4, h, 1),
                                nn.Hardsigmoid()) if se else None
        self.out = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.body(x)
        if self.se is not None:
            y = y * self.se(y)
        return x + self.out(y)


@case("mobilenetv2_block_cl")
def _():
    m = InvertedResidual().to(memory_format=torch.channels_last)
    return m, [torch.randn(2, 6, 7, 5).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("efficientnet_mbconv_se_hardswish")
def _():
    return InvertedResidual(act=nn.Hardswish, se=True), [rg(2, 6, 5, 7)]


@case("mbconv_se_silu_eval")
def _():
    m = InvertedResidual(act=nn.SiLU, se=True)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m.eval(), [rg(1, 6, 4, 4)]


class DenseBlock(nn.Module):
    def __init__(self, c=4, g=3, n=4):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(c + i * g), nn.ReLU(), nn.Conv2d(c + i * g, g, 3, padding=1, bias=False))
            for i in range(n))

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


@case("densenet_cat_growth")
def _():
    return DenseBlock(), [rg(2, 4, 5, 5)]


@case("cat_many_inputs_mixed_dtypes")
def _():
    def f(s, x, i):
        parts = [x[:, k:k + 1] * (k + 1) for k in range(x.shape[1])]          # 10 inputs: past the 8 of a gather
        y = torch.cat(parts, 1)
        z = torch.cat([x[:, :2], i.float(), x[:, :1].exp()], 1)               # int and float: promoted
        w = torch.cat([x[:0], x[:2]], 0)                                      # an empty piece
        return y, z, w
    return Fn(f), [rg(3, 10), torch.randint(0, 4, (3, 2))]


class DiffResBlock(nn.Module):
    def __init__(self, cin=4, cout=6, temb=5):
        super().__init__()
        self.n1 = nn.GroupNorm(2, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2 = nn.GroupNorm(3, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x, t):
        half = 2
        freqs = torch.exp(-torch.log(torch.tensor(1000.0)) * torch.arange(half) / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([args.sin(), args.cos(), t[:, None].float()], -1)
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(emb))[:, :, None, None]
        h = self.c2(F.dropout(F.silu(self.n2(h)), 0.1, training=False))
        return (self.skip(x) + h) / 2 ** 0.5


@case("diffusion_resblock")
def _():
    return DiffResBlock(), [rg(2, 4, 6, 5), torch.tensor([3, 17])]


@case("clip_contrastive")
def _():
    class Clip(nn.Module):
        def __init__(self):
            super().__init__()
            self.img = nn.Linear(7, 6)
            self.txt = nn.Linear(5, 6)
            self.logit_scale = nn.Parameter(torch.tensor(2.659))

        def forward(self, a, b):
            i = F.normalize(self.img(a), dim=-1)
            t = self.txt(b)
            t = t / t.norm(dim=-1, keepdim=True)
            logits = self.logit_scale.exp().clamp(max=100) * i @ t.t()
            labels = torch.arange(a.shape[0])
            return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2, logits
    return Clip(), [rg(5, 7), rg(5, 5)]


class MLMHead(nn.Module):
    def __init__(self, vocab=13, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(16, d) * 0.1)
        self.ln0 = nn.LayerNorm(d)
        self.dense = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids, labels):
        h = self.ln0(self.emb(ids) + self.pos[: ids.shape[1]])
        h = self.ln(F.gelu(self.dense(h), approximate="tanh"))
        logits = h @ self.emb.weight.t() + self.bias                           # tied decoder
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               label_smoothing=0.1)
        return loss, logits


@case("bert_mlm_head_tied")
def _():
    ids = torch.randint(0, 13, (2, 7))
    labels = torch.full((2, 7), -100)
    labels[0, 1], labels[0, 4], labels[1, 6] = 3, 12, 0
    return MLMHead(), [ids, labels]


@case("mlm_all_ignored")
def _():
    return MLMHead(), [torch.randint(0, 13, (1, 5)), torch.full((1, 5), -100)]


@case("losses_third")
def _():
    def f(s, x, y, t, p):
        logp = F.log_softmax(x, -1)
        q = F.softmax(y, -1)
        focal_p = torch.sigmoid(x)
        tt = (p > 0.5).float()
        pt = focal_p * tt + (1 - focal_p) * (1 - tt)
        focal = (-(0.25 * tt + 0.75 * (1 - tt)) * (1 - pt) ** 2 *
                 F.binary_cross_entropy_with_logits(x, tt, reduction="none")).mean()
        return (F.kl_div(logp, q, reduction="batchmean"),
                F.kl_div(logp, F.log_softmax(y, -1), reduction="sum", log_target=True),
                F.kl_div(logp, q, reduction="none"),
                F.cosine_embedding_loss(x, y, (t % 2).float() * 2 - 1, margin=0.2),
                F.triplet_margin_loss(x, y, x.roll(1, 0), margin=0.5, p=1, swap=True),
                F.triplet_margin_with_distance_loss(
                    x, y, y.flip(0), distance_function=lambda a, b: 1 - F.cosine_similarity(a, b)),
                F.smooth_l1_loss(x, y, beta=0.5), F.smooth_l1_loss(x, y, reduction="none", beta=0.0),
                F.huber_loss(x, y, delta=0.7), F.l1_loss(x, y, reduction="sum"),
                F.binary_cross_entropy_with_logits(x, p, pos_weight=torch.linspace(0.5, 2, 5)),
                focal, F.nll_loss(logp, t, reduction="none"))
    return Fn(f), [rg(7, 5), rg(7, 5), torch.tensor([0, 1, 4, 2, 1, 3, 0]), torch.rand(7, 5)]


class MoEScatter(nn.Module):
    def __init__(self, d=6, e=3, k=2):
        super().__init__()
        self.k, self.e = k, e
        self.gate = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.randn(e, d, 10) * 0.3)
        self.w2 = nn.Parameter(torch.randn(e, 10, d) * 0.3)

    def forward(self, x):
        t = x.reshape(-1, x.shape[-1])
        logits = self.gate(t)
        top, idx = logits.topk(self.k, -1)
        w = top.softmax(-1)
        flat = idx.reshape(-1)                                # token-slot -> expert
        tok = torch.arange(t.shape[0]).repeat_interleave(self.k)
        h = torch.bmm(t[tok].unsqueeze(1), self.w1[flat]).squeeze(1)
        h = torch.bmm(F.silu(h).unsqueeze(1), self.w2[flat]).squeeze(1) * w.reshape(-1, 1)
        out = torch.zeros_like(t).index_add(0, tok, h)
        load = torch.zeros(self.e).scatter_add(0, flat, torch.ones_like(flat, dtype=torch.float))
        imp = torch.zeros(self.e).scatter_add(0, flat, w.reshape(-1))
        aux = (load * imp).sum() / t.shape[0] + torch.logsumexp(logits, -1).pow(2).mean() * 1e-3
        return out.view_as(x), aux, load


@case("moe_topk_scatter_index_add")
def _():
    return MoEScatter(), [rg(2, 5, 6)]


@case("cumulative_ops")
def _():
    def f(s, x, y):
        return (x.cumsum(1), x.cumsum(0).flip(0), y.cumprod(-1), x.logcumsumexp(1),
                torch.logcumsumexp(x.t(), 0), x.cummax(1)[0], x.cummin(0)[0],
                (x > 0).cumsum(1), torch.cumsum(x, 1, dtype=torch.float64))
    y = torch.rand(3, 7) + 0.5
    y[1, 3] = 0.0                                        # a zero inside cumprod (its backward divides)
    return Fn(f), [rg(4, 7), y.requires_grad_()]


@case("masked_fill_fully_masked_rows")
def _():
    def f(s, x, m):
        a = x.masked_fill(m, float("-inf"))
        p = a.softmax(-1)                                    # row 1 fully masked: NaN, as eager
        q = a.log_softmax(-1)
        r = torch.where(m.all(-1, keepdim=True), 0.0, p)     # zeroed afterwards: finite grads? eager decides
        lse = a.logsumexp(-1)
        return p, q, r, lse, a.amax(-1)
    m = torch.rand(4, 6) > 0.5
    m[1] = True
    m[2] = False
    return Fn(f), [rg(4, 6), m]


@case("nan_to_num_clamp_tensors")
def _():
    def f(s, x, lo, hi):
        y = torch.nan_to_num(x.log(), nan=-1.0, posinf=3.0)
        z = torch.nan_to_num(x / (x - x.detach()), neginf=0.0)   # inf/NaN by construction: grads NaN too
        c = torch.clamp(x, min=lo, max=hi)
        d = torch.clamp(x, min=lo)
        e = x.clamp(max=hi[0])
        return y, z, c, d, e, torch.clip(x, -0.5, 0.5)
    return Fn(f), [rg(4, 5), rg(5), rg(4, 1).detach().abs()]


@case("spectral_norm_train")
def _():
    lin = nn.utils.parametrizations.spectral_norm(nn.Linear(6, 5))
    conv = nn.utils.parametrizations.spectral_norm(nn.Conv2d(2, 3, 3), n_power_iterations=2)
    return Fn(lambda s, x, y: (s.lin(x), s.conv(y)), lin=lin, conv=conv), [rg(3, 6), rg(1, 2, 5, 5)]


@case("weight_norm_whole_tied_embedding")
def _():
    emb = nn.Embedding(9, 6)
    lin = nn.utils.parametrizations.weight_norm(nn.Linear(6, 6), dim=None)   # one norm over the whole weight

    def f(s, i):
        h = s.lin(s.emb(i))
        return F.linear(h, s.emb.weight)
    return Fn(f, emb=emb, lin=lin), [torch.randint(0, 9, (2, 3))]


@case("int_bool_intermediates")
def _():
    def f(s, x):
        am = x.argmax(-1)
        oh = F.one_hot(am, x.shape[-1])                               # int64
        pos = (x > 0)
        cnt = pos.sum(-1)                                             # int64 from bool
        frac = cnt.float() / x.shape[-1]
        rank = (x.unsqueeze(-1) > x.unsqueeze(-2)).sum(-1)           # int64 ranks
        sel = torch.where(pos.any(-1, keepdim=True), x, -x)
        bucket = torch.bucketize(x.detach(), torch.tensor([-1.0, 0.0, 1.0]))
        return (x * oh).sum(-1), frac * x.sum(-1), rank, sel * (rank.float() + 1), bucket, (~pos).logical_xor(oh.bool())
    return Fn(f), [rg(3, 6)]


@case("input_layouts_third")
def _():
    def f(s, a, b, c, d, e):
        return (a * b).sum(0), F.layer_norm(c, (7,)) * d, (e + 1).softmax(-1), a.t() @ b
    base = torch.randn(6, 10)
    a = base[1:, 2:9].t().detach().requires_grad_()          # transposed view of a slice: offset + strides
    b = torch.randn(5, 1).expand(7, 5, 1)[:, :, 0].detach()  # stride-0 input (no grad)
    c = torch.randn(3, 2, 7).transpose(0, 1).requires_grad_()
    d = torch.randn(1, 7).expand(3, 7)
    e = torch.randn(4, 9)[::2, 1::2].requires_grad_()        # a non-contiguous leaf
    return Fn(f), [a, b, c, d, e]


@case("conv3d_channels_last_3d")
def _():
    m = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.SiLU(), nn.AvgPool3d(2),
                      nn.Conv3d(4, 2, 1)).to(memory_format=torch.channels_last_3d)
    return m, [torch.randn(2, 3, 4, 5, 4).contiguous(memory_format=torch.channels_last_3d).requires_grad_()]


@case("zero_size_and_size1")
def _():
    def f(s, x, z, o):
        return (s.l(z), s.l(z).sum(0), z.softmax(-1), F.layer_norm(z, (6,)), x.sum(0) + z.sum(0),
                o.softmax(-1), o.squeeze(1).sum(-1), (o * x[:1, None]).mean(), torch.cat([z, x], 0))
    return Fn(f, l=nn.Linear(6, 3)), [rg(2, 6), rg(0, 6), rg(1, 1, 6)]


@case("stochastic_depth_layerscale_train_off")
def _():
    def f(s, x):
        y = s.block(x)
        keep = torch.ones(x.shape[0], 1, 1).bernoulli_(1.0)     # keep prob 1: deterministic
        return x + s.ls * y * keep / 1.0
    block = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.Hardswish(), nn.Linear(8, 8))
    return Fn(f, block=block, ls=nn.Parameter(torch.full((8,), 1e-1))), [rg(2, 5, 8)]


@case("grad_ties_and_kinks")
def _():
    def f(s, x, y):
        return (x.amax(-1), x.amin((0, 1)), x.max(-1)[0], x.min(0)[0], torch.maximum(x, y), torch.minimum(x, y),
                x.clamp(0, 1), x.relu(), F.hardtanh(x, -1, 1), F.leaky_relu(x, 0.1), x.abs(), F.l1_loss(x, y),
                F.smooth_l1_loss(x, y, beta=1.0), x.topk(2, -1)[0], x.sort(0)[0], x.median(-1)[0], x.prod(-1),
                x.norm(dim=-1), torch.nn.functional.normalize(x, dim=-1), x.pow(2), x.sign() * x, x.max())
    x = torch.tensor([[1.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 2.0, 1.0]])
    y = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, -2.0, 0.0], [2.0, -1.0, 1.0, 2.0]])
    return Fn(f), [x.requires_grad_(), y.requires_grad_()]


@case("grad_nan_traps")
def _():
    def f(s, x, m):
        a = torch.where(x > 0, x.sqrt(), torch.zeros_like(x))       # NaN grad at x < 0, as eager
        b = torch.where(x > 0, x, x.log())                            # log of negatives: NaN in the other branch
        c = x.masked_fill(m, float("-inf")).softmax(-1)              # a fully masked row: NaN
        d = (x * 0).sum() + x.std(-1, keepdim=True)                   # std of a constant row: NaN grad
        e = x.pow(0.5).nan_to_num(0.0)
        g = x.clamp_min(0) ** 0.5                                     # inf grad at 0
        h = torch.atan2(x, x.flip(1))
        k = x / x.roll(1, 1)                                          # division by zero
        return a, b, c, d, e, g, h, k, torch.logsumexp(x.masked_fill(m, float("-inf")), -1)
    x = torch.tensor([[1.0, -1.0, 0.0, 4.0], [2.0, 2.0, 2.0, 2.0], [0.5, 0.0, -3.0, 1.5]])
    m = torch.tensor([[False, True, False, False], [True, True, True, True], [False, False, True, False]])
    return Fn(f), [x.requires_grad_(), m]


@case("grad_duplicates_index_put_accumulate")
def _():
    def f(s, x, w, i):
        y = torch.zeros(5, 3).index_put((i,), w, accumulate=True)
        z = x[i] * 2                                                  # gather with repeats: grads summed
        u = x.index_put((i[:2],), w[:2] * 3)                          # overwrite (not accumulate), no dup
        return y, z, u, x[[0, 0, 4]].sum(0)
    return Fn(f), [rg(5, 3), rg(4, 3), torch.tensor([1, 3, 1, 1])]


@case("layouts_grad_leaves_odd")
def _():
    def f(s, a, b, c, d):
        return (a * 2).sum(0), b.exp(), (c @ d).tanh(), c.permute(2, 0, 1) + 1, (a.unsqueeze(0) * c[:1, :1, :1]).mean()
    a = torch.randn(5).expand(3, 5).detach().requires_grad_()          # stride-0 leaf that needs grad
    base = torch.randn(40)
    b = base[3:33].view(5, 6)[:, 1::2].detach().requires_grad_()       # offset, step-2 columns
    c = torch.randn(2, 5, 4).permute(0, 2, 1).detach().requires_grad_() # [2, 4, 5] transposed
    d = torch.randn(5, 1).requires_grad_()
    return Fn(f), [a, b, c, d]


@case("convnext_cl_size1_spatial")
def _():
    m = ConvNeXtBlock().to(memory_format=torch.channels_last)
    return m, [torch.randn(2, 8, 1, 7).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("se_block_1x1_channels_last_bf")
def _():
    m = InvertedResidual(act=nn.SiLU, se=True).to(memory_format=torch.channels_last)
    return m, [torch.randn(3, 6, 1, 1).contiguous(memory_format=torch.channels_last).requires_grad_()]


@case("norms_odd_layouts_third")
def _():
    def f(s, x, y):
        a = F.layer_norm(x.transpose(1, 2), (3, 5), s.w, s.b)                  # two trailing dims, transposed
        b = F.group_norm(y, 1, s.g.weight, s.g.bias)                           # one group, channels_last
        c = s.inorm(y)                                                         # tracked running stats
        d = s.bn(x.transpose(1, 2))                                            # BatchNorm1d on a strided [N, C, L]
        e = x.softmax(1) + x.log_softmax(0)                                    # softmax over a size-1 dim... and dim 0
        return a, b, c, d, e, F.rms_norm(x, (3,), eps=1e-3)
    x = torch.randn(4, 5, 3).requires_grad_()
    y = torch.randn(2, 6, 3, 4).contiguous(memory_format=torch.channels_last).requires_grad_()
    return Fn(f, w=nn.Parameter(torch.rand(3, 5) + 0.5), b=nn.Parameter(torch.randn(3, 5)), g=nn.GroupNorm(1, 6),
              inorm=nn.InstanceNorm2d(6, affine=True, track_running_stats=True), bn=nn.BatchNorm1d(3)), [x, y]


@case("softmax_size1_dims_keepdim")
def _():
    def f(s, x):
        return x.softmax(0), x.log_softmax(2), x.sum(0, keepdim=True).expand_as(x) * x, x.mean((0, 2)), \
            x.amax(2, keepdim=True) - x, torch.logsumexp(x, (0, 2))
    return Fn(f), [rg(1, 5, 1)]


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
    # third model campaign
    "t5_seq": (lambda: T5Attn(), lambda n: [rg(2, n, 12)]),
    "t5_causal_seq": (lambda: T5Attn(bidirectional=False), lambda n: [rg(1, n, 12)]),
    "convnext_hw": (lambda: ConvNeXtBlock(), lambda n: [rg(1, 8, n, n - 2)]),
    "mbconv_se_hw": (lambda: InvertedResidual(act=nn.Hardswish, se=True), lambda n: [rg(2, 6, n, 3)]),
    "densenet_hw": (lambda: DenseBlock(n=2), lambda n: [rg(1, 4, n, 4)]),
    "diffusion_batch": (lambda: DiffResBlock(), lambda n: [rg(n, 4, 3, 4), torch.arange(n) * 7]),
    # at least two windows along H (one would be a size-1 dim, which dynamo specializes), never W's 6
    "swin_windows": (lambda: SwinBlock(), lambda n: [rg(1, 3 * (n // 3 + 2), 6, 8)]),
    "mlm_seq": (lambda: MLMHead(), lambda n: [torch.randint(0, 13, (2, n)),
                                              torch.randint(0, 13, (2, n)).masked_fill_(
                                                  torch.arange(n) % 2 == 0, -100)]),
    "moe_scatter_tokens": (lambda: MoEScatter(), lambda n: [rg(1, n, 6)]),
    "lstm_cell_batch": (lambda: Fn(lambda s, x: s.c(x)[0] * s.c(x)[1], c=nn.LSTMCell(4, 5)), lambda n: [rg(n, 4)]),
    "alibi_seq": (lambda: Fn(lambda s, q: CASES["alibi_attention"]()[0].fn(s, q, q * 2, q.flip(-1))),
                  lambda n: [rg(1, 3, n, 4)]),
    "cumsum_masked_len": (lambda: Fn(lambda s, x: (x.cumsum(-1), x.masked_fill(x < -0.5, float("-inf")).softmax(-1),
                                                   x.logcumsumexp(-1))),
                          lambda n: [rg(3, n)]),
    "size_arith_slices": (lambda: Fn(lambda s, x: (x[:, : x.shape[1] // 2] * 2, x[..., x.shape[1] - 3:].exp(),
                                                    x.narrow(1, x.shape[1] // 3, 2).sum(1),
                                                    torch.cat([x[:, 1:], x[:, :1]], 1) - x.roll(-1, 1),
                                                    x.roll(x.shape[1] // 2, 1), x.flip(1).cumsum(1))),
                          lambda n: [rg(3, n)]),
    "causal_mask_symbolic": (lambda: Fn(lambda s, x: (x @ x.transpose(-1, -2)).masked_fill(
        torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ x),
        lambda n: [rg(2, n, 4)]),
    "pad_to_multiple": (lambda: Fn(lambda s, x: F.pad(x, (0, (-x.shape[-1]) % 4)).view(x.shape[0], -1, 4).mean(-1)),
                        lambda n: [rg(2, n)]),
    "arange_full_new_zeros": (lambda: Fn(lambda s, x: (x * torch.arange(x.shape[1]) / x.shape[1]
                                                       + torch.full((x.shape[1],), 0.5) + x.new_zeros(x.shape[1]),
                                                       x.sum(1) / x.shape[1], x * (x.shape[0] * x.shape[1]) ** 0.5)),
                              lambda n: [rg(2, n)]),
    "chunk_split_symbolic": (lambda: Fn(lambda s, x: [t.sum(1) for t in x.split([2, x.shape[1] - 2], 1)]
                                        + [x.unflatten(1, (-1, 1)).squeeze(-1).tanh()]),
                             lambda n: [rg(3, n)]),
    "interpolate_size_symbolic": (lambda: Fn(lambda s, x: (
        F.interpolate(x, size=x.shape[-1] * 2 - 1, mode="linear", align_corners=True),
        F.adaptive_max_pool1d(x, 3), F.avg_pool1d(x, 2, ceil_mode=True))), lambda n: [rg(2, 3, n)]),
    # one_hot's num_classes is fixed (a symbolic one is specialized by dynamo itself)
    "one_hot_topk_symbolic": (lambda: Fn(lambda s, x: (
        F.one_hot(x.argmax(-1) % 4, 4).float() * x[:, :4], x.topk(2, -1)[0],
        x.sort(-1, descending=True)[0][:, :3])), lambda n: [rg(3, n)]),
    # an int argument beside the sizes (its symbol's range is unbounded); the slice start stays >= 1, as
    # a start that may be 0 is guarded on (a recompile) by dynamo
    "int_arg_scale": (lambda: Fn(lambda s, x, k: (torch.cat([x, x * k], 1)[:, k % 3 + 1:], x + k)),
                      lambda n: [rg(2, n), n % 5 + 1]),
}


def run_dynamic(name, codegen, sizes=(5, 7, 13), dynamic=True):
    make_model, make_inputs = DYNAMIC[name]
    torch.manual_seed(0)
    model = make_model()
    torch._dynamo.reset()
    be = passline.backend(fallback="raise", codegen=codegen, pipeline=PIPELINE, kernel_variant=VARIANT)
    ours_model, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(ours_model, backend=be, dynamic=dynamic)
    counts = []
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
        counts.append(len(be.reports))
    # dynamic=True: every graph compiled once, at the first size; automatic dynamic (dynamic=None): once
    # more at the second size (the switch to dynamic), never after
    settled = counts[0] if dynamic else counts[1]
    assert counts[-1] == settled, f"graphs compiled after each size: {counts}"
    return be


def main_dynamic(names, codegens, dynamic=True):
    for name in [n for n in DYNAMIC if not names or any(s in n for s in names)]:
        for cg in codegens:
            t = time.time()
            try:
                be = run_dynamic(name, cg, dynamic=dynamic)
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
    ap.add_argument("--auto-dynamic", action="store_true",
                    help="the DYNAMIC cases with automatic dynamic shapes (recompiled once, at the second size)")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--pipeline", default=None, help="a pipeline's text (default: passline's)")
    ap.add_argument("--variant", default="auto", help="reduction kernels: auto, persistent or looped")
    args = ap.parse_args()
    global PIPELINE, VARIANT
    PIPELINE, VARIANT = args.pipeline, args.variant
    dtype = getattr(torch, args.dtype)
    if args.dynamic or args.auto_dynamic:
        main_dynamic(args.names, args.codegen.split(","), dynamic=True if args.dynamic else None)
        return 0
    names = [n for n in CASES if not args.names or any(s in n for s in args.names)]
    results = []
    for name in names:
        for cg in args.codegen.split(","):
            t = time.time()
            try:
                be = run_case(name, cg, dtype)
                ext = sum(getattr(r, "externs", 0) or 0 for r in be.reports)
                status = f"pass (graphs {len(be.reports)}, externs {ext})"
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
