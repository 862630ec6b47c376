"""Training steps of whole models: eager, Inductor and passline in one process, checked, then timed.

    python benchmarks/models.py [--models gpt2,llama,resnet,vit,bert,convnext] [--device cuda|cpu] [--smoke]
                                [--no-inductor] [--reduce-overhead] [--passline-option KEY=VALUE ...] [--vocab N]
                                [--out FILE.json]

Six models written here (no downloads), tiny ones with --smoke. The default three, at the sizes of
docs/benchmarks.md, are the ones passline was tuned on: GPT-2-style (learned positions, LayerNorm, causal
SDPA, tanh-GELU MLP, LM head tied to the token embedding; bfloat16), LLaMA-style (RMSNorm, RoPE, causal SDPA,
SwiGLU, untied LM head; bfloat16) and ResNet-18-style (BatchNorm in training mode, channels_last, float32).
Three more were added untuned, for measurements on models no change was made for (--models vit,bert,convnext):
ViT-style (patch embedding a strided Conv2d, class token, learned positions, pre-norm LayerNorm blocks,
SDPA without a mask, exact-erf GELU MLP, dropout p=0.1 on the attention's and the MLP's outputs, cross-entropy
with label smoothing 0.1; 224 px, patch 16, d=768, 6 layers, batch 64; bfloat16), BERT-style masked LM
(token + position + token-type embeddings and a LayerNorm, post-norm blocks, SDPA with an additive padding
mask built from a lengths tensor, GELU, MLM head: dense, GELU, LayerNorm and a decoder tied to the token
embedding with a bias of its own; cross-entropy with ignore_index=-100 on ~85% of the positions; vocabulary
30522, not a multiple of 64; seq 512, d=768, 4 layers, batch 16; bfloat16) and ConvNeXt-style (stem conv
4x4 stride 4, blocks of depthwise 7x7 conv, LayerNorm over channels by permuting to NHWC, 4x MLP of
nn.Linear with GELU, layer scale, residual; LayerNorm + 2x2 stride-2 conv between stages; widths
96-768, depths 2,2,4,2, 224 px, batch 32; channels_last, float32). Each returns its cross-entropy loss
(computed in float32) from forward, so the loss is inside the compiled graph.

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
Dropout (ViT-style): every checked step, the reference's included, starts from one torch.manual_seed, so
eager and passline (which runs random ops as aten calls, in program order) draw the same masks as the
reference (whose masks are drawn in the model's dtype: CUDA's differ between bfloat16 and float64), and they
are checked with dropout on. Inductor draws dropout's numbers with its own philox, never eager's, so its check
would fail whatever it computed: its first call (the timed one) runs at the config's p, then it is checked on
a second step with p=0 (a second compile), against eager's and the reference's steps at p=0; its check column
says "dropout off". Every timed step runs at the config's p.

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


class ViTBlock(nn.Module):
    """Pre-norm, as ViT: attention over every token (no causal mask), exact-erf GELU MLP, dropout on each branch's
    output (timm's proj_drop and the MLP's drop) — as nn.Dropout modules, so the check can set p."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop_attn, self.drop_mlp = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.drop_attn(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop_mlp(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class ViT(nn.Module):
    def __init__(self, layers, d, heads, classes, image, patch, dropout):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)  # the patch embedding: one strided convolution
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, d))
        self.blocks = nn.ModuleList(ViTBlock(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)  # not zeroed (timm's option): a zero head would zero every other gradient
        _init_transformer(self)
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x, targets):
        x = self.patch(x).flatten(2).transpose(1, 2)  # (batch, patches, d)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x)[:, 0])  # every token normalised, the class token classified, as timm
        return F.cross_entropy(f32(logits), targets, label_smoothing=0.1)


class BertLayer(nn.Module):
    """Post-norm, as BERT: LayerNorm after each residual sum."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.fc_out(F.gelu(self.fc(x))))


class Bert(nn.Module):
    def __init__(self, layers, d, heads, vocab, seq):
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(vocab, d), nn.Embedding(seq, d), nn.Embedding(2, d)
        self.ln_emb = nn.LayerNorm(d)
        self.layers = nn.ModuleList(BertLayer(d, heads) for _ in range(layers))
        self.dense, self.ln_mlm = nn.Linear(d, d), nn.LayerNorm(d)  # the MLM head's transform
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.word.weight  # tied, with a bias of its own, as BERT
        _init_transformer(self)

    def forward(self, idx, types, lengths, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.ln_emb(self.word(idx) + self.pos(pos) + self.token_type(types))
        # HF BERT's extended mask: 0 where a key is a real token, the dtype's lowest value past a row's length
        keep = (pos < lengths[:, None]).to(x.dtype)
        mask = ((1.0 - keep) * torch.finfo(x.dtype).min)[:, None, None, :]  # (batch, 1, 1, keys)
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.decoder(self.ln_mlm(F.gelu(self.dense(x))))
        return F.cross_entropy(f32(logits).flatten(0, 1), targets.flatten(), ignore_index=-100)


def channels_ln(norm, x):
    """LayerNorm over the channels of an NCHW tensor, by permuting to NHWC and back (ConvNeXt's stem and
    downsampling; with channels_last memory both permutes are views of contiguous NHWC)."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)  # depthwise
        self.norm = nn.LayerNorm(c)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)  # pointwise, on NHWC
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))  # layer scale, ConvNeXt's initial value

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)  # NHWC: LayerNorm and the Linears act on the channels, last
        y = self.gamma * self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, widths, depths, classes):
        super().__init__()
        self.stem, self.stem_norm = nn.Conv2d(3, widths[0], 4, 4), nn.LayerNorm(widths[0])
        self.down_norms = nn.ModuleList(nn.LayerNorm(w) for w in widths[:-1])
        self.downs = nn.ModuleList(nn.Conv2d(w, w2, 2, 2) for w, w2 in zip(widths, widths[1:]))
        self.stages = nn.ModuleList(nn.Sequential(*(ConvNeXtBlock(w) for _ in range(n)))
                                    for w, n in zip(widths, depths))
        self.norm = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], classes)
        for m in self.modules():  # ConvNeXt's: truncated N(0, 0.02) weights, zero biases
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x, targets):
        x = channels_ln(self.stem_norm, self.stem(x))
        for i, stage in enumerate(self.stages):
            if i:
                x = self.downs[i - 1](channels_ln(self.down_norms[i - 1], x))
            x = stage(x)
        return F.cross_entropy(f32(self.head(self.norm(x.mean((2, 3))))), targets)


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
    # the three below were added untuned: no passline change was measured on them before they were written
    "vit": ("ViT-style",
            dict(layers=6, d=768, heads=12, batch=64, image=224, patch=16, classes=1000, dropout=0.1,
                 dtype="bfloat16"),
            dict(layers=2, d=16, heads=2, batch=2, image=16, patch=4, classes=10, dropout=0.1, dtype="bfloat16")),
    "bert": ("BERT-style",
             dict(layers=4, d=768, heads=12, batch=16, seq=512, vocab=30522, dtype="bfloat16"),
             dict(layers=2, d=16, heads=2, batch=2, seq=16, vocab=67, dtype="bfloat16")),
    "convnext": ("ConvNeXt-style",
                 dict(widths=(96, 192, 384, 768), depths=(2, 2, 4, 2), batch=32, image=224, classes=1000,
                      dtype="float32"),
                 dict(widths=(8, 16), depths=(1, 1), batch=2, image=32, classes=10, dtype="float32")),
}


def build(name, cfg, device):
    """(float32 model on the CPU, its dtype, inputs on `device`, memory format): same seed, same weights."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    dtype = getattr(torch, cfg["dtype"])
    if name in ("resnet", "convnext", "vit"):
        if name == "resnet":
            model = ResNet(cfg["widths"], cfg["blocks"], cfg["classes"])
        elif name == "convnext":
            model = ConvNeXt(cfg["widths"], cfg["depths"], cfg["classes"])
        else:
            model = ViT(cfg["layers"], cfg["d"], cfg["heads"], cfg["classes"], cfg["image"], cfg["patch"],
                        cfg["dropout"])
        x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=g)
        y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=g)
        fmt = torch.preserve_format if name == "vit" else torch.channels_last
        x = x.to(device, dtype)  # images in the model's dtype (its convolution's)
        inputs = (x if name == "vit" else x.contiguous(memory_format=fmt), y.to(device))
    elif name == "bert":
        model = Bert(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["seq"])
        b, t, vocab = cfg["batch"], cfg["seq"], cfg["vocab"]
        tokens = torch.randint(0, vocab - 1, (b, t), generator=g)  # the last id is [MASK]
        lengths = torch.randint(t // 2, t, (b,), generator=g)  # padded past each length...
        lengths[0] = t  # ...but one row
        keep = torch.arange(t) < lengths[:, None]
        # a fifth of the real tokens are predicted (about 15% of all positions: ~85% of the targets are -100),
        # the first of each row at least, their inputs replaced by [MASK]; padding is token 0
        picked = (torch.rand(b, t, generator=g) < 0.2) & keep
        picked[:, 0] = True
        targets = tokens.masked_fill(~picked, -100)
        idx = tokens.masked_fill(picked, vocab - 1).masked_fill(~keep, 0)
        types = (torch.arange(t) >= (lengths // 2)[:, None]).long()  # sentence A, then sentence B
        inputs = tuple(z.to(device) for z in (idx, types, lengths, targets))
        fmt = torch.preserve_format
    else:
        if name == "gpt2":
            model = GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["seq"])
        else:
            model = Llama(cfg["layers"], cfg["d"], cfg["heads"], cfg["hidden"], cfg["vocab"], cfg["seq"])
        tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)
        inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        fmt = torch.preserve_format
    return model, dtype, inputs, fmt


def dropout_p(model) -> float:
    """The model's dropout probability (0.0 without nn.Dropout)."""
    return max((m.p for m in model.modules() if isinstance(m, nn.Dropout)), default=0.0)


def set_dropout(model, p: float) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p


def place(master, device, dtype, fmt):
    return copy.deepcopy(master).to(device=device, dtype=dtype, memory_format=fmt)


# ----------------------------------------------------------------------------------------------- check

FLOOR = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-9}
FACTOR = 4.0
# every checked step (the reference's, eager's, each contender's) starts from this seed: where dropout's random
# numbers come from the same aten calls in the same order (eager; passline, which runs them as aten calls in
# program order), the masks are the same, and the reference's with them
STEP_SEED = 2


def check_dropout(options, p: float) -> float:
    """The dropout probability a contender's first step is checked at (options as contenders() gives them; p the
    model's): p, but Inductor's (its options a dict) draws dropout's random numbers its own way (its own philox,
    seeded from torch's generator), never eager's, so it is checked with dropout off, after a first call at p
    (a second compile). Eager's step is taken at every probability a contender is checked at."""
    return 0.0 if isinstance(options, dict) else p


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


def run_contender(name, options, master, dtype, fmt, inputs, refs, eager_results, args, passline_options):
    """(row, {dropout p: the checked step's snapshot}); refs and eager_results keyed by p too."""
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
    torch.manual_seed(STEP_SEED)
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
    p = dropout_p(model)
    checked = sorted(refs) if options is None else [check_dropout(options, p)]
    results = {p: snapshot(model, loss)} if p in checked else {}
    row["loss"] = float(loss.detach().double())
    del loss
    row["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    if be is not None:
        row["passline_graphs"] = [r.name for r in be.reports]
        row["passline_kernels"] = sum(r.kernels for r in be.reports)
        # binaries the first step's launches compiled themselves (0 where every static kernel was compiled ahead)
        row["passline_compiled_at_launch"] = sum(r.metrics.counters["kernels_compiled_at_launch"] for r in be.reports)
        row["passline_precompiled"] = sum(r.metrics.counters["kernels_precompiled"] for r in be.reports)
        row["passline_codegen"] = sorted({r.codegen for r in be.reports})
        row["passline_failures"] = [f"{k}: {e!r}" for k, e in be.failures]
    for q in checked:
        if q not in results:  # the same step again at dropout q (a compiled model compiles again), then back to p
            set_dropout(model, q)
            torch.manual_seed(STEP_SEED)
            loss = step()
            results[q] = snapshot(model, loss)
            del loss
            set_dropout(model, p)
    q = p if options is None else checked[0]
    row["check_dropout"] = q if p else None
    errs = errors(results[q], refs[q])
    row["errors"] = errs
    row["rel_err_vs_eager"] = max(errors(results[q], eager_results[q]).values()) if eager_results else 0.0
    if name == "eager":
        row["check"], row["passed"] = "baseline", True
        row["worst_err"] = max(errs.values())
    else:
        passed, worst, where = verdict(errs, errors(eager_results[q], refs[q]), dtype)
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
    return row, results


class DropoutMaskIn(nn.Dropout):
    """The reference's dropout: float64 values, the mask drawn in the model's dtype. Under one seed CUDA's fused
    dropout gives bfloat16 other masks than float64 (its elements a thread depend on the dtype: an eager step
    was 0.8 off a float64 one at p=0.1, every bound vacuous); the CPU's draw does not depend on it."""

    def __init__(self, p, dtype):
        super().__init__(p)
        self.dtype = dtype

    def forward(self, x):
        if not self.training or self.p == 0:
            return x  # eager's dropout draws nothing either
        keep = F.dropout(torch.ones_like(x, dtype=self.dtype), self.p, True) != 0  # the draw eager's step makes
        return x * keep / (1 - self.p)


def reference(master, dtype, inputs, device, p):
    """The float64 eager step on the model's dtype-rounded weights (and the same inputs), contiguous: the
    memory format changes no value, and float64 convolutions need not support channels_last. Dropout at p,
    from the checked steps' seed, its masks those of the model's dtype (DropoutMaskIn)."""
    model = copy.deepcopy(master).to(dtype=dtype).to(device=device, dtype=torch.float64)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Dropout):
                setattr(parent, name, DropoutMaskIn(p, dtype))
    ins = [x.double().contiguous() if x.is_floating_point() else x for x in inputs]
    torch.manual_seed(STEP_SEED)
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
    check = f"{r['check']} ({r['worst_err']:.1e}{', dropout off' if r.get('check_dropout') == 0 else ''})"
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
    ap.add_argument("--models", default="gpt2,llama,resnet",
                    help=f"comma-separated subset of {','.join(CONFIGS)} (default: the first three)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU: through Triton's interpreter, minutes)")
    ap.add_argument("--no-inductor", action="store_true", help="leave Inductor out (its C++ compile is slow on CPU)")
    ap.add_argument("--reduce-overhead", action="store_true",
                    help='also torch.compile(mode="reduce-overhead") and passline with cudagraphs=True, CUDA only')
    ap.add_argument("--passline-option", action="append", default=[], type=parse_option, metavar="KEY=VALUE",
                    help="passed to passline.backend(...) (repeatable); VALUE is a Python literal or a bare word")
    ap.add_argument("--vocab", type=int,
                    help="vocabulary of the GPT-2, LLaMA and BERT models (defaults 50304, 32000 and 30522)")
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
        p = dropout_p(master)
        refs = {q: reference(master, dtype, inputs, device, q)
                for q in {check_dropout(o, p) for o in contenders(args).values()}}
        eager_results, model_rows = None, []
        for cname, copts in contenders(args).items():
            print(f"[{m}] {cname} ...", file=sys.stderr, flush=True)
            try:
                row, results = run_contender(cname, copts, master, dtype, fmt, inputs, refs, eager_results, args,
                                             options)
                if cname == "eager":
                    eager_results = results
                del results
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
        del master, inputs, refs, eager_results
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
