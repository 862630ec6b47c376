"""Testing helpers for passline users: compare a compiled function with eager PyTorch.

    from passline.testing import assert_matches_eager
    assert_matches_eager(torch.nn.LayerNorm(64), [torch.randn(8, 64, requires_grad=True)])

and hypothesis strategies, `programs()` and `pipelines()`, to fuzz passes and pipelines (see
docs/testing.md).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .strategies import TensorProgram, pipelines, programs  # noqa: F401  (public: fuzz your passes)

TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float64: dict(atol=1e-7, rtol=1e-7),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def tolerance(dtype: torch.dtype) -> dict:
    return TOLERANCES.get(dtype, dict(atol=0, rtol=0))


def _clone(xs):
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in xs]


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device).requires_grad_(x.requires_grad)
    return x


def assert_matches_eager(fn: Callable, inputs: Sequence, pipeline=None, codegen: str = "auto",
                         backward: bool | None = None, device: str | None = None, **backend_options):
    """Compile `fn` with passline, run it and eager on copies of `inputs`, and compare outputs and
    (when any input requires grad) input gradients, with dtype-appropriate tolerances.
    `pipeline=None` runs passline.DEFAULT_PIPELINE; "" runs no pass. `device` (default
    $PASSLINE_TEST_DEVICE, else where the inputs are) moves the inputs and an nn.Module there first.
    Returns the passline backend, whose `reports` describe what was compiled."""
    import os

    import passline

    device = device or os.environ.get("PASSLINE_TEST_DEVICE")
    if device:
        inputs = [_to(x, device) for x in inputs]
        if isinstance(fn, torch.nn.Module):
            fn = fn.to(device)
    torch._dynamo.reset()
    backend_options.setdefault("fallback", "raise")  # a test must see passline's errors
    be = passline.backend(pipeline=pipeline, codegen=codegen, **backend_options)
    ours_in, eager_in = _clone(inputs), _clone(inputs)
    ours = _flat(torch.compile(fn, backend=be, fullgraph=False)(*ours_in))
    eager = _flat(fn(*eager_in))
    assert len(ours) == len(eager), f"{len(ours)} outputs, eager has {len(eager)}"
    for k, (a, b) in enumerate(zip(ours, eager)):
        torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True, msg=lambda m: f"output {k}: {m}")
    wants_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
    if backward if backward is not None else wants_grad:
        # a fixed random cotangent per output, so every output's gradient path is exercised
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(b.shape, generator=gen).to(b.dtype).to(b.device) for b in eager if b.requires_grad]
        torch.autograd.backward([a for a in ours if a.requires_grad], grads)
        torch.autograd.backward([b for b in eager if b.requires_grad], grads)
        for k, (a, b) in enumerate(zip(ours_in, eager_in)):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, **tolerance(b.dtype),
                                           msg=lambda m: f"grad of input {k}: {m}")
    return be
