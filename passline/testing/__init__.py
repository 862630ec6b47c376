"""Testing helpers for passline users: compare a compiled function with eager PyTorch.

    from passline.testing import assert_matches_eager
    assert_matches_eager(torch.nn.LayerNorm(64), [torch.randn(8, 64, requires_grad=True)])
    assert_matches_eager(lambda x: (x * x).exp(), [torch.randn(3, 7).t().requires_grad_()])  # and strides

and hypothesis strategies, `programs()` and `pipelines()`, to fuzz passes and pipelines (see
docs/testing.md).
"""
from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch.utils._pytree import tree_flatten

# the hypothesis strategies (public: fuzz your passes) are imported at their first use: the compile-time code
# that imports this module for `tolerance` (the accuracy guard, bisection) would otherwise import hypothesis
# with passline, ~0.06 s of every process's first call
_STRATEGIES = ("LAYOUTS", "Input", "TensorProgram", "pipelines", "programs")


def __getattr__(name: str):
    if name in _STRATEGIES:
        from . import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted([*globals(), *_STRATEGIES])

TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float64: dict(atol=1e-7, rtol=1e-7),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def tolerance(dtype: torch.dtype) -> dict:
    return TOLERANCES.get(dtype, dict(atol=0, rtol=0))


def _same_layout(x: torch.Tensor, device=None) -> torch.Tensor:
    """A copy of `x` (on `device`) with x's strides and storage offset, a leaf that requires grad iff x
    does. Tensor.clone() and .to() make non-dense tensors (a slice, an expanded view) contiguous, which
    would quietly test the contiguous layout instead of the one asked for: copy the whole storage."""
    grad, x = x.requires_grad, x.detach()  # (detach() drops requires_grad: read it first)
    n = x.untyped_storage().nbytes() // x.element_size()
    storage = x.as_strided((n,), (1,), 0).clone().to(device or x.device)
    return storage.as_strided(x.shape, x.stride(), x.storage_offset()).detach().requires_grad_(grad)


def _clone(xs):
    return [_same_layout(x) if isinstance(x, torch.Tensor) else x for x in xs]


def _flat(out) -> list:
    """An output's leaves in a fixed order: tensors, and the numbers, None and text a function may return, out of
    tuples, lists, dicts and namedtuples (torch's pytree). Tensors alone were kept once, so a function returning
    a dict or a scalar was compared on nothing and passed whatever the compiled code returned."""
    return tree_flatten(out)[0]


def _norm_error(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """The whole tensor's relative error: the norm of a - b over b's norm, over the elements where both are finite
    (where either is not, the element-wise check decides); None for a tensor that is not floating point, of one
    element, or of norm 0."""
    if not (a.is_floating_point() and b.is_floating_point()) or b.numel() < 2 or a.shape != b.shape:
        return None
    a, b = a.detach().double().to(b.device), b.detach().double()
    finite = torch.isfinite(a) & torch.isfinite(b)
    scale = b[finite].norm()
    return float((a[finite] - b[finite]).norm() / scale) if scale > 0 else None


def _assert_norm_close(a: torch.Tensor, b: torch.Tensor, what: str, exact_of) -> None:
    """`a` (passline's) against `b` (eager's) as whole tensors: the norm of their difference within the dtype's
    rtol of eager's norm. The element-wise check lets any error below its atol through, which is most of a
    tensor of small values (a softmax over 777 columns, whose values are ~1e-3: a float16 one 1% off everywhere
    passed a check of atol 2e-3). Where it misses, `a` still passes when it is about as close to the float64
    computation's (`exact_of()`) as eager's is, over the whole tensor: what cancels (a sum of x - mean(x)) is
    rounding noise in both."""
    rel = _norm_error(a, b)
    rtol = tolerance(b.dtype)["rtol"]
    if rel is None or rel <= rtol:
        return
    exact = exact_of() if exact_of is not None else None
    if exact is not None and exact.shape == b.shape:
        exact = exact.detach().double().to(b.device)
        a, b = a.detach().double().to(b.device), b.detach().double()
        finite = torch.isfinite(a) & torch.isfinite(b) & torch.isfinite(exact)
        mine, eager = (a[finite] - exact[finite]).norm(), (b[finite] - exact[finite]).norm()
        if mine <= rtol * exact[finite].norm() + 2 * eager:
            return
        detail = f"; from the float64 computation, the norm of the difference {mine:.3g} against eager's {eager:.3g}"
    else:
        detail = " (no float64 computation to judge by)"
    raise AssertionError(f"{what}: relative error over the whole tensor {rel:.3g} (the norm of the difference over "
                         f"eager's), past {rtol:g}{detail}")


def _assert_leaf_close(a, b, what: str, check_strides: bool, exact_of=None) -> None:
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{what}: {type(a).__name__}, eager's is a tensor"
        torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True, msg=lambda m: f"{what}: {m}")
        _assert_norm_close(a, b, what, exact_of)
        if check_strides:
            assert_same_strides(a, b, what)
    elif isinstance(b, (float, complex)):  # a float32 computation's .item(), .tolist(): float32's tolerance
        torch.testing.assert_close(a, b, **tolerance(torch.float32), equal_nan=True, msg=lambda m: f"{what}: {m}")
    elif isinstance(b, (int, bool, str, bytes, type(None))):
        assert a == b, f"{what}: {a!r}, eager's is {b!r}"
    else:
        raise TypeError(f"{what}: assert_matches_eager compares tensors, numbers, None and text (in tuples, lists, "
                        f"dicts, namedtuples), not a {type(b).__name__}")


def _to(x, device):
    return _same_layout(x, device) if isinstance(x, torch.Tensor) else x


def assert_same_strides(actual: torch.Tensor, expected: torch.Tensor, what: str = "tensor") -> None:
    """Strides must match on every dim of size > 1 (a size-1 dim's stride is never used to address an
    element, and PyTorch itself is free with it); a tensor with no element has no layout to match."""
    if expected.numel() == 0:
        return
    got = [s for s, n in zip(actual.stride(), actual.shape) if n > 1]
    want = [s for s, n in zip(expected.stride(), expected.shape) if n > 1]
    assert got == want, (f"{what}: strides {tuple(actual.stride())}, eager has {tuple(expected.stride())} "
                         f"(shape {tuple(expected.shape)}; compared on dims of size > 1)")


def loss_weights(outputs: Sequence[torch.Tensor], seed: int = 0) -> list:
    """One fixed random float32 weight tensor per output that requires grad (None for the others)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen).to(o.device)
            if isinstance(o, torch.Tensor) and o.requires_grad else None for o in outputs]


def train_step(fn: Callable, inputs: Sequence, weights=None):
    """What a user's training step does: run `fn`, reduce its outputs to a scalar loss and call
    loss.backward(), which accumulates `.grad` on the requires_grad leaves among `inputs`. The loss is
    sum((output * weight).sum()) over the outputs that require grad, in float32, with a fixed random
    weight per output (`weights`, default loss_weights(outputs)): every element of every output gets
    its own cotangent, so no element's gradient can hide behind a sum of ones. Returns
    (flat outputs, loss or None when no output requires grad)."""
    outs = _flat(fn(*inputs))
    weights = loss_weights(outs) if weights is None else weights
    terms = [(o.float() * w).sum() for o, w in zip(outs, weights) if w is not None]
    if not terms:
        return outs, None
    loss = torch.stack(terms).sum()
    loss.backward()
    return outs, loss


def assert_matches_eager(fn: Callable, inputs: Sequence, pipeline=None, codegen: str = "auto",
                         backward: bool | None = None, device: str | None = None, check_strides: bool = True,
                         dynamic: bool | None = None, **backend_options):
    """Compile `fn` with passline, run it and eager on copies of `inputs` (same strides and storage
    offsets), and compare outputs and, when any input requires grad, a training step: train_step()'s
    loss.backward() and the `.grad` it accumulates on each requires_grad input, with dtype-appropriate
    tolerances. `check_strides` (default) also requires each output's and each `.grad`'s strides to be
    eager's on dims of size > 1. `dynamic` is torch.compile's: True compiles with symbolic sizes (dynamo's
    size symbols, the kernels' sizes as arguments), as a model whose shapes vary would run.
    `pipeline=None` runs passline.DEFAULT_PIPELINE; "" runs no pass. `device` (default
    $PASSLINE_TEST_DEVICE, else where the inputs are) moves the inputs and an nn.Module there first.
    An `nn.Module` runs as two copies, eager's and the compiled one's, so that each parameter's `.grad` and
    each buffer (BatchNorm's running statistics) is compared too; in bfloat16, float16 and float32 a
    parameter's or an input's `.grad` outside the tolerance still passes when it is about as close as eager's
    to the same step in float64 (a weight's gradient sums over every row, a long-K matmul's input gradient
    over K: eager's own rounding is often past the tolerance — a float32 LayerNorm's bias gradient over 2048
    rows, 1.3e-4 from float64 in eager). Each floating-point output and `.grad` is also compared as a whole
    tensor (`_assert_norm_close`: the norm of the difference within rtol of eager's norm, or as close to float64's
    as eager's), which catches what the element-wise atol lets through in tensors of small values.
    Returns the passline backend, whose `reports` describe what was compiled."""
    import passline

    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs is a list of fn's arguments ([x], not x), got {type(inputs).__name__}")
    device = device or passline.settings.test_device
    if device:
        inputs = [_to(x, device) for x in inputs]
        if isinstance(fn, torch.nn.Module):
            fn = fn.to(device)
    torch._dynamo.reset()
    backend_options.setdefault("fallback", "raise")  # a test must see passline's errors
    be = passline.backend(pipeline=pipeline, codegen=codegen, **backend_options)
    wants_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
    train = backward if backward is not None else wants_grad
    ours_in, eager_in = _clone(inputs), _clone(inputs)
    # a module: a copy for each run, from the same state with no .grad (one module would accumulate both
    # runs' .grad, unchecked; the caller's keeps its own)
    module, given = isinstance(fn, torch.nn.Module), fn
    ours_fn, fn = (copy.deepcopy(fn), copy.deepcopy(fn)) if module else (fn, fn)
    compiled = torch.compile(ours_fn, backend=be, fullgraph=False, dynamic=dynamic)
    forms: dict = {}  # each run's output structure (train_step returns the leaves alone)

    def shaped(f, key):
        def run(*args):
            out = f(*args)
            forms[key] = tree_flatten(out)[1]
            return out
        return run

    if train:
        eager, eager_loss = train_step(shaped(fn, "eager"), eager_in)
        ours, ours_loss = train_step(shaped(compiled, "ours"), ours_in, loss_weights(eager))
        # a training check that silently trains nothing would pass whatever the backward does
        assert (ours_loss is None) == (eager_loss is None), \
            f"loss requires grad: {ours_loss is not None}, eager's: {eager_loss is not None}"
    else:
        ours, eager = _flat(shaped(compiled, "ours")(*ours_in)), _flat(shaped(fn, "eager")(*eager_in))
    assert forms["ours"] == forms["eager"], f"outputs shaped {forms['ours']}, eager's {forms['eager']}"
    assert len(ours) == len(eager), f"{len(ours)} outputs, eager has {len(eager)}"
    # the same step in float64 (from the state both runs began in), run once and only where a low-precision
    # output or gradient misses the tolerance
    oracle = _Float64Step(given, inputs, loss_weights(eager) if train else None)
    for k, (a, b) in enumerate(zip(ours, eager)):
        _assert_leaf_close(a, b, f"output {k}", check_strides, lambda k=k: oracle.output(k))
    for k, (a, b) in enumerate(zip(ours_in, eager_in)):  # what the function wrote into its inputs
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a.detach(), b.detach(), **tolerance(b.dtype), equal_nan=True,
                                       msg=lambda m, k=k: f"input {k} after the call: {m}")
    if train:
        for k, (a, b) in enumerate(zip(ours_in, eager_in)):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert (a.grad is None) == (b.grad is None), \
                    f"grad of input {k}: {'None' if a.grad is None else 'a tensor'}, eager's is {b.grad}"
                if b.grad is None:  # no output depends on this input, in either
                    continue
                _assert_grad_close(a.grad, b.grad, f"grad of input {k}", lambda k=k: oracle.input_grad(k))
                if check_strides:
                    # AccumulateGrad gives .grad the input's strides (or contiguous ones) whatever the
                    # backward returned, so this checks the layout a user's optimizer sees, not the
                    # backward's own output; that shows in the values above when its strides are wrong
                    assert_same_strides(a.grad, b.grad, f"grad of input {k}")
    if module:
        _assert_module_matches(ours_fn, fn, train, check_strides, oracle)
    return be


class _Float64Step:
    """The training step of `fn` (a module: a float64 copy of it) on float64 copies of `inputs`, with the same
    loss weights: the oracle a low-precision gradient is judged against when it misses the tolerance. Run at
    most once, at the first question; None for every gradient where the step cannot run in float64."""

    def __init__(self, fn, inputs: Sequence, weights):
        self.fn, self.inputs, self.weights = fn, inputs, weights  # weights None: the forward alone
        self.done, self.params, self.args, self.outputs = False, {}, [], []

    def _run(self) -> None:
        if self.done:
            return
        self.done = True
        twin = copy.deepcopy(self.fn).double() if isinstance(self.fn, torch.nn.Module) else self.fn
        args = [_same_layout(x).detach().double().requires_grad_(x.requires_grad)
                if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in self.inputs]
        try:
            if self.weights is None:
                with torch.no_grad():
                    self.outputs = _flat(twin(*args))
            else:
                self.outputs = train_step(twin, args, self.weights)[0]
        except Exception:  # noqa: BLE001 - a function that only runs in its own dtypes has no oracle
            return
        self.args = args
        self.params = {n: t.grad for n, t in twin.named_parameters()} if isinstance(twin, torch.nn.Module) else {}

    def output(self, k: int):
        self._run()
        out = self.outputs[k] if k < len(self.outputs) else None
        return out if isinstance(out, torch.Tensor) else None

    def input_grad(self, k: int):
        self._run()
        x = self.args[k] if k < len(self.args) else None
        return x.grad if isinstance(x, torch.Tensor) else None

    def param_grad(self, name: str):
        self._run()
        return self.params.get(name)


def _assert_grad_close(got: torch.Tensor, want: torch.Tensor, what: str, exact_of) -> None:
    """`got` (passline's gradient) against `want` (eager's) within the dtype's tolerance; in bfloat16, float16
    and float32, one outside it still passes when it is about as close as eager's to the float64 step's
    (`exact_of()`: a weight's gradient sums over every row, a long-K matmul's input gradient over K, and
    eager's own rounding is often past the tolerance: a float32 LayerNorm's bias gradient over 2048 rows was
    1.3e-4 from float64 in eager). Then the whole tensor's error (`_assert_norm_close`)."""
    try:
        torch.testing.assert_close(got, want, **tolerance(want.dtype), equal_nan=True, msg=lambda m: f"{what}: {m}")
    except AssertionError:
        if want.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise
        exact = exact_of()
        if exact is None or exact.shape != want.shape:
            raise
        _assert_near_float64(got, want, exact, what)
    _assert_norm_close(got, want, what, exact_of)


def _assert_near_float64(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """Element by element: within the tolerance of the float64 value, widened by twice eager's own distance from
    it there, or twice its typical (median) distance where eager's rounding happened to land close; where
    eager's is not finite, ours must be the same value."""
    tol = tolerance(want.dtype)
    exact, got, want = exact.to(want.device), got.double(), want.double()
    off = (want - exact).abs()
    finite = torch.isfinite(off)
    typical = off[finite].median() if finite.any() else off.new_zeros(())
    near = (got - exact).abs() <= tol["atol"] + tol["rtol"] * exact.abs() + 2 * torch.maximum(off, 2 * typical)
    same = (got == want) | (got.isnan() & want.isnan())
    ok = torch.where(torch.isfinite(want), near, same)
    assert bool(ok.all()), (f"{what}: {int((~ok).sum())} of {ok.numel()} elements farther from the float64 step "
                            f"than eager's rounding allows (first at {tuple(int(i) for i in (~ok).nonzero()[0])})")


def _assert_module_matches(ours: torch.nn.Module, eager: torch.nn.Module, train: bool, check_strides: bool,
                           oracle: _Float64Step | None) -> None:
    """The compiled copy's parameter gradients and buffers against eager's (see assert_matches_eager)."""
    theirs = dict(eager.named_parameters())
    for name, p in ours.named_parameters() if train else ():
        q = theirs[name]
        assert (p.grad is None) == (q.grad is None), \
            f"grad of parameter {name}: {'None' if p.grad is None else 'a tensor'}, eager's is {q.grad}"
        if q.grad is None:
            continue
        _assert_grad_close(p.grad, q.grad, f"grad of parameter {name}", lambda name=name: oracle.param_grad(name))
        if check_strides:
            assert_same_strides(p.grad, q.grad, f"grad of parameter {name}")
    theirs = dict(eager.named_buffers())
    for name, b in ours.named_buffers():
        torch.testing.assert_close(b, theirs[name], **tolerance(b.dtype), equal_nan=True,
                                   msg=lambda m, name=name: f"buffer {name}: {m}")
