"""What the forward saves for the backward (backends/partition.py): max-pool indices as window offsets."""
import pytest
import sympy
import torch
import torch.nn.functional as F

import passline
from passline.ir.index import FloorDiv
from passline.lowering.pooling import MAX_TAPS
from passline.passes.fuse import common_loops
from passline.testing import assert_matches_eager


def saved_by(fn, *inputs):
    """(dtype, shape) of every tensor the compiled forward of `fn` saves for its backward."""
    torch._dynamo.reset()
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    device = passline.settings.test_device
    if device:
        inputs = [x.detach().to(device).requires_grad_(x.requires_grad) for x in inputs]
        if isinstance(fn, torch.nn.Module):
            fn = fn.to(device)
    be = passline.backend(fallback="raise")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = torch.compile(fn, backend=be)(*inputs)
    out.sum().backward()
    return saved, be


POOLS = [  # (dims, kernel, stride, padding, dilation, ceil_mode, input spatial size)
    (2, 3, 2, 1, 1, False, (9, 9)),     # ResNet's stem
    (2, 2, 2, 0, 1, False, (8, 6)),
    (2, (3, 2), (1, 2), (1, 0), (2, 1), True, (11, 7)),  # dilation, uneven windows, ceil_mode
    (2, 12, 4, 5, 1, True, (19, 23)),   # 144-element windows: offsets need int16
    (2, (16, 8), 8, 0, 1, False, (32, 16)),  # 128 elements: offsets 0..127 still fit int8
    (3, 2, 2, 0, 1, False, (4, 6, 5)),
]


@pytest.mark.parametrize("dims,kernel,stride,padding,dilation,ceil_mode,size", POOLS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_max_pool_saves_window_offsets_and_trains_like_eager(dims, kernel, stride, padding, dilation, ceil_mode,
                                                             size, layout):
    pool = F.max_pool2d if dims == 2 else F.max_pool3d

    def fn(x):
        return pool(torch.relu(x) * 1.5, kernel, stride, padding, dilation, ceil_mode) + 1

    x = torch.randn(2, 3, *size)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)
    assert_matches_eager(fn, [x.requires_grad_()])
    # ties everywhere (relu's zeros, few distinct values): the backward's positions are the forward's
    assert_matches_eager(fn, [torch.randint(-2, 3, x.shape).float().requires_grad_()])

    saved, be = saved_by(fn, x.detach().clone().requires_grad_())
    out_shape = tuple(fn(x.detach()).shape)
    elements = torch.Size(kernel if isinstance(kernel, tuple) else (kernel,) * dims).numel()
    small = torch.int8 if elements <= 128 else torch.int16
    assert (small, out_shape) in saved
    assert not any(d == torch.int64 for d, _ in saved), saved
    # Forward: relu * 1.5 (stored: the backward's relu mask is made from it), then the pool, its offsets
    # and + 1 in one kernel; a window of more than MAX_TAPS taps is an extern pool, and its offsets one
    # kernel (fuse splits their per-row and per-column parts to common loops) with + 1. Backward: the
    # gather of lowering/pooling.py with the positions recomputed from the offsets inside it (inline_pointwise's
    # chains) and relu's backward, one kernel; after an extern pool, aten's backward, the positions and relu's
    # backward (a kernel each)
    lowered = elements <= MAX_TAPS
    assert [len(r.kernel_info) for r in be.reports] == [2, 1] if lowered else [3, 2]
    assert [r.externs for r in be.reports] == [0, 0] if lowered else [1, 1]


def test_max_pool_indices_a_user_asks_for_are_eagers():
    """return_indices=True: the indices the caller gets are still positions (only the saved copy is
    compacted)."""
    def fn(x):
        y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return y * 2, i

    assert_matches_eager(fn, [torch.randn(2, 3, 9, 9).requires_grad_()])


def test_resnet_stem_saves_no_int64_indices():
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(8),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
    stem = stem.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last).requires_grad_()
    assert_matches_eager(stem, [x])
    saved, _ = saved_by(stem, x.detach().clone().requires_grad_())
    assert (torch.int8, (2, 8, 8, 8)) in saved and not any(d == torch.int64 for d, _ in saved)


def test_common_loops():
    assert common_loops((2, 5, 20), (10, 5, 4)) == (2, 5, 5, 4)
    assert common_loops((6, 4), (24,)) == (6, 4)
    assert common_loops((6, 4), (4, 6)) is None  # 4 does not divide 6: no nest both merge from
    assert common_loops((6, 4), (5, 5)) is None
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert common_loops((s0, 5, 20), (5 * s0, 5, 4)) == (s0, 5, 5, 4)
    assert common_loops((s0, 4 * s1), (s0 * s1, 4)) == (s0, s1, 4)
    assert common_loops((s0, s1), (s1, s0)) is None  # s0 need not divide s1
    # a size function (a pool's output under dynamic shapes) is an integer of its own
    h, w = FloorDiv(s0, 2), FloorDiv(s1, 2)
    assert common_loops((3 * s1, h, w), (3 * s1 * h * w,)) == (3 * s1, h, w)
    assert common_loops((h, w), (w, h)) is None


def test_pointwise_groups_merged_differently_fuse_after_a_split():
    """A per-row operand keeps a channels_last node's (n, h) loops apart, a per-column one its (w, c):
    merge_loops leaves the two as (N, H, W*C) and (N*H, W, C). fuse splits both to (N, H, W, C)."""
    def fn(x, rows, cols):
        return ((x + rows) * 2 - cols) / 3

    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)
    rows, cols = torch.randn(5, 1), torch.randn(6)
    be = assert_matches_eager(lambda x, r, c: fn(x, r, c).exp() + fn(x, r, c).cos(), [x, rows, cols])
    assert len(be.reports[0].kernel_info) == 1


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_max_pool_offsets_under_dynamic_image_sizes(layout):
    """Symbolic spatial sizes: the conversions read them from size nodes (the pool's input and output in
    the forward, the pool backward's input and the offsets in the backward). One compile serves every
    size after the first two (duck sizing makes a square first image one symbol). Sizes of one parity:
    torch 2.11's meta of a strided pool guards on it (`div_rtn`), so an even size recompiles there."""
    def fn(x):
        return F.max_pool2d(torch.relu(x) * 1.5, 3, 2, 1, ceil_mode=True) + 1

    device = passline.settings.test_device or "cpu"
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    compiled = torch.compile(fn, backend=be, dynamic=True)
    for shape in [(2, 3, 9, 9), (2, 3, 11, 13), (3, 3, 17, 11), (2, 3, 7, 21)]:  # (a size 1 specializes)
        x = torch.randn(*shape, device=device)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        saved = []

        def pack(t, saved=saved):
            saved.append(t.dtype)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = compiled(ours)
        g = torch.randn_like(y)
        y.backward(g)
        fn(ref).backward(g)
        torch.testing.assert_close(y, fn(x))
        torch.testing.assert_close(ours.grad, ref.grad)
        assert torch.int8 in saved and torch.int64 not in saved, saved
    assert len(be.reports) == 4  # (9, 9), then one dynamic graph pair for every other size
    assert any(not str(s).isdigit() for n in be.reports[-1].graph.leaf_nodes() for s in getattr(n, "ranges", ()))


@pytest.mark.parametrize("shape,window", [((3, 4, 2, 2), (3, 2, 1)), ((3, 2, 16, 12), (12, 1, 0))])
def test_max_pool_offsets_where_tracing_pins_a_dynamic_size(shape, window):
    """An output size of 1 makes the pool's shape check narrow a symbolic input size to one value: the
    fake sizes are then SymInts with constant expressions, taken as the numbers they are (a `sym_size`
    node of them lowered to nothing and the graph failed to compile)."""
    def fn(x):
        return F.max_pool2d(x, *window)

    device = passline.settings.test_device or "cpu"
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    x = torch.randn(*shape, device=device)
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(fn, backend=be, dynamic=True)(ours)
    y.sum().backward()
    fn(ref).sum().backward()
    torch.testing.assert_close(y, fn(x))
    torch.testing.assert_close(ours.grad, ref.grad)
    assert len(be.reports) == 2
