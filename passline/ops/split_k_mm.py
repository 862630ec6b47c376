"""`passline::split_k_mm`: (M x K) @ (K x N) for a small output and a long K, as one Triton kernel.

An mm whose output has few tiles leaves most of a GPU idle: one program per output tile walks all of K.
Decompose-K (lowering/choices.py) cuts K into chunks and runs them as a batched matmul plus a sum: two
launches and a float32 tensor of partial products between them, which at these sizes (a few µs of work)
cost more than the work. Here the same split is one launch:

- one program per split and output tile; program (s, t) multiplies the s-th chunk of K for tile t with
  `tl.dot` (float32 accumulator) and stores its partial tile in a float32 workspace;
- it then adds 1 to the tile's arrival counter (an atomic with acquire-release semantics, after a barrier
  so that every thread's stores are ordered before it); the program that arrives last sums the tile's
  `splits` partials (read through L2, `.cg`), rounds once to the output's dtype, writes the tile and sets
  the counter back to 0, so the counters are ready for the next launch without a memset.

The counters are int32 buffers kept per device and stream (two launches on one stream never overlap; on
two streams they would share counts) and grown as needed; under CUDA-graph capture each launch gets fresh
zeroed counters (a captured memset) instead, since a buffer allocated in a graph's private pool must not
be kept. Partials are summed in a fixed order (split 0 first), so results do not depend on which program
arrives last.

The kernel runs where Triton can: CUDA tensors, or CPU tensors under `TRITON_INTERPRET=1`; elsewhere the
same chunked float32 sum in aten ops. Only float16 and bfloat16 (tensor-core inputs with a float32
accumulator, as aten's mm); 2-D inputs of any strides.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..config import environment_variable

Tensor = torch.Tensor

DTYPES = (torch.float16, torch.bfloat16)
BLOCK_K = 128  # K elements a tl.dot step reads (Inductor's longest mm BLOCK_K)
MAX_TILE = 64  # the widest output tile side: a 64 x 64 float32 accumulator is 32 registers a thread on 4 warps

_kernels: dict = {}  # interpret (bool) -> the jitted kernel
_counters: dict = {}  # (device, stream) -> int32 arrival counters, zero between launches (see the module doc)


def _split_k_body(a, b, out, partial, counter, M, N, K, sam, sak, sbk, sbn, som, son, K_PER, SPLITS,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Program (split, tile): the split's K chunk of the tile's product; the last to arrive sums them. The
    splits and their length are run-time arguments: one binary serves every K and split count."""
    split = tl.program_id(0) % SPLITS
    tile = tl.program_id(0) // SPLITS
    tiles_n = tl.cdiv(N, BLOCK_N)
    rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    start = split * K_PER
    for k in range(0, K_PER, BLOCK_K):
        ks = start + k + rk
        inside = (ks < K) & (k + rk < K_PER)  # a step may pass the chunk's end (the interpreter's one step)
        a_tile = tl.load(a + rm[:, None] * sam + ks[None, :] * sak, mask=(rm[:, None] < M) & inside[None, :],
                         other=0.0)
        b_tile = tl.load(b + ks[:, None] * sbk + rn[None, :] * sbn, mask=inside[:, None] & (rn[None, :] < N),
                         other=0.0)
        if UPCAST:  # Triton's interpreter multiplies bfloat16 tiles wrongly: float32 (exact products) instead
            a_tile, b_tile = a_tile.to(tl.float32), b_tile.to(tl.float32)
        acc += tl.dot(a_tile, b_tile)
    tile_elems = BLOCK_M * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tiles = tl.num_programs(0) // SPLITS
    tl.store(partial + (split * tiles + tile) * tile_elems + offs, acc)
    tl.debug_barrier()  # every thread's partial stored before the arrival below publishes it
    arrived = tl.atomic_add(counter + tile, 1, sem="acq_rel")
    if arrived == SPLITS - 1:  # the last of the tile's programs: the others' partials are visible
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, SPLITS):
            total += tl.load(partial + (s * tiles + tile) * tile_elems + offs, cache_modifier=".cg")
        if ROUND_BF16:  # the interpreter truncates float32 to bfloat16; a GPU (and aten) rounds to nearest even
            bits = total.to(tl.int32, bitcast=True)
            total = ((bits + (0x7FFF + ((bits >> 16) & 1))) & -65536).to(tl.float32, bitcast=True)
        tl.store(out + rm[:, None] * som + rn[None, :] * son, total.to(out.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
        tl.atomic_xchg(counter + tile, 0)


def _kernel(interpret: bool):
    """The kernel jitted for Triton's interpreter or for the GPU (Triton reads TRITON_INTERPRET when
    `triton.jit` runs)."""
    k = _kernels.get(interpret)
    if k is None:
        with environment_variable("TRITON_INTERPRET", "1" if interpret else None):
            k = _kernels[interpret] = triton.jit(_split_k_body)
    return k


def runs_triton(t: Tensor) -> bool:
    return t.device.type == "cuda" or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def tile(n: int) -> int:
    """An output tile's side for an output side of `n`: a power of two, 16 (tl.dot's least) to MAX_TILE."""
    return max(16, min(MAX_TILE, _pow2(n)))


def k_per_split(k: int, splits: int) -> int:
    """Each split's K elements: K over the splits rounded up to whole BLOCK_K steps."""
    per = -(-k // splits)
    return -(-per // BLOCK_K) * BLOCK_K


def _check(a: Tensor, b: Tensor, splits: int) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"split_k_mm: (M x K) @ (K x N) expected, got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in DTYPES:
        raise ValueError(f"split_k_mm: float16 or bfloat16 inputs of one dtype expected, got {a.dtype}, {b.dtype}")
    if splits < 1:
        raise ValueError(f"split_k_mm: splits must be at least 1, got {splits}")


def _counters_for(device: torch.device, tiles: int) -> Tensor:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(tiles, dtype=torch.int32, device=device)  # replayed with the graph: zero each time
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    have = _counters.get(key)
    if have is None or have.numel() < tiles:
        have = _counters[key] = torch.zeros(max(tiles, 64), dtype=torch.int32, device=device)
    return have


def split_k_mm(a: Tensor, b: Tensor, splits: int) -> Tensor:
    """a @ b with K in `splits` chunks summed in float32 (see the module doc). The op's body."""
    _check(a, b, splits)
    (m, k), n = a.shape, b.shape[1]
    out = a.new_empty((m, n))
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if not runs_triton(a):
        part = k_per_split(k, splits)
        acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
        for s in range(0, k, part):
            acc += a[:, s:s + part].float() @ b[s:s + part].float()
        return out.copy_(acc)
    interpret = a.device.type == "cpu"
    part = k_per_split(k, splits)
    splits = -(-k // part)  # every split holds some of K (the last may be short)
    bm, bn = tile(m), tile(n)
    tiles = -(-m // bm) * -(-n // bn)
    partial = torch.empty(splits * tiles * bm * bn, dtype=torch.float32, device=a.device)
    counter = _counters_for(a.device, tiles)
    args = (a, b, out, partial, counter, m, n, k, *a.stride(), *b.stride(), *out.stride(), part, splits)
    # under the interpreter one step holds a split's whole chunk (its cost grows with the steps)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_pow2(part) if interpret else BLOCK_K,
                UPCAST=interpret, ROUND_BF16=interpret and a.dtype == torch.bfloat16)
    kernel = _kernel(interpret)
    with environment_variable("TRITON_INTERPRET", "1" if interpret else None):
        if interpret:
            kernel[(splits * tiles,)](*args, **meta)
        else:
            with torch.cuda.device(a.device):
                kernel[(splits * tiles,)](*args, **meta, num_warps=4, num_stages=3)
    return out


# Registered as a plain library op, not `torch.library.custom_op`: that wrapper runs every call through
# dynamo's disable decorator and an autograd shim (tens of µs of host a call); this op only ever runs in
# graphs after autograd (a choice for aten.mm), so it needs neither.
_lib = torch.library.Library("passline", "FRAGMENT")
_lib.define("split_k_mm(Tensor a, Tensor b, int splits) -> Tensor")
_lib.impl("split_k_mm", split_k_mm, "CompositeExplicitAutograd")


@torch.library.register_fake("passline::split_k_mm", lib=_lib)
def _(a, b, splits):
    _check(a, b, splits)
    return a.new_empty((a.shape[0], b.shape[1]))
