"""Hypothesis strategies for fuzzing passline: random tensor programs and random valid pipelines.

    from hypothesis import given
    from passline.testing import programs, pipelines, assert_matches_eager

    @given(programs(), pipelines())
    def test_my_pass(program, pipeline):
        assert_matches_eager(program, program.inputs, pipeline=pipeline)

A program is a small DAG of pointwise math, broadcasts, views (permute, slice, reshape, unsqueeze) and
reductions over random dims, on inputs of random shapes (size-1 dims included), random dtypes and
random layouts (transposed and sliced). It is written as a list of steps, so a failing example prints
as readable code.
"""
from __future__ import annotations

import attrs
import torch
from hypothesis import strategies as st

UNARY = {
    "neg": lambda x: -x, "abs": torch.abs, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "sin": torch.sin, "exp_tanh": lambda x: torch.exp(torch.tanh(x)), "square": lambda x: x * x,
    "scale": lambda x: x * 1.5 + 0.25,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "where_gt": lambda a, b: torch.where(a > b, a, b - 1),
}
REDUCE = {"sum": torch.sum, "amax": torch.amax, "mean": torch.mean}
INT_SAFE = {"neg", "abs", "square"}


@attrs.frozen
class Step:
    op: str  # unary/binary/reduce name, or a view: permute, slice, reshape, unsqueeze
    args: tuple  # value indices
    params: tuple = ()

    def __str__(self):
        return f"{self.op}({', '.join(f'v{a}' for a in self.args)}{''.join(', ' + repr(p) for p in self.params)})"


@attrs.frozen(eq=False)
class TensorProgram:
    """A random program: `program(*program.inputs)` runs it; `str(program)` shows it."""

    steps: tuple
    inputs: tuple
    outputs: tuple  # value indices returned

    def __call__(self, *xs):
        vals = list(xs)
        for s in self.steps:
            vals.append(_apply(s, [vals[a] for a in s.args]))
        return tuple(vals[i] for i in self.outputs)

    def __repr__(self):
        ins = ", ".join(f"v{k}: {str(x.dtype).replace('torch.', '')}{list(x.shape)}"
                        f"{'' if x.is_contiguous() else ' (strided)'}" for k, x in enumerate(self.inputs))
        body = "; ".join(f"v{len(self.inputs) + k} = {s}" for k, s in enumerate(self.steps))
        return f"TensorProgram({ins} -> {body} -> return {', '.join(f'v{o}' for o in self.outputs)})"


def _apply(step: Step, xs):
    op, p = step.op, step.params
    if op in UNARY:
        return UNARY[op](xs[0])
    if op in BINARY:
        return BINARY[op](xs[0], xs[1])
    if op in REDUCE:
        dims, keep = p
        if op == "mean" and not xs[0].is_floating_point():
            return torch.sum(xs[0], dims, keepdim=keep)
        return REDUCE[op](xs[0], dims, keepdim=keep)
    if op == "permute":
        return xs[0].permute(*p)
    if op == "slice":
        dim, start, step_ = p
        return xs[0].narrow(dim, start, xs[0].shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step_),)]
    if op == "reshape":
        return xs[0].reshape(p)
    if op == "unsqueeze":
        return xs[0].unsqueeze(p[0])
    raise ValueError(op)


@st.composite
def _tensor(draw, shape, dtype):
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def make(s):
        if dtype.is_floating_point:
            return torch.randn(s, generator=gen).to(dtype)
        return torch.randint(-4, 5, s, generator=gen).to(dtype)

    if layout == "transposed" and len(shape) >= 2:
        return make(tuple(reversed(shape))).permute(*reversed(range(len(shape))))
    if layout == "sliced" and shape:
        big = make(tuple(shape[:-1]) + (2 * shape[-1] + 1,))
        return big[..., 1::2]
    return make(tuple(shape))


@st.composite
def programs(draw, max_steps: int = 6, max_rank: int = 3, max_size: int = 6,
             dtypes=(torch.float32, torch.float32, torch.bfloat16, torch.int64)):
    """A TensorProgram with 1-2 inputs of one dtype and up to `max_steps` steps."""
    dtype = draw(st.sampled_from(dtypes))
    rank = draw(st.integers(1, max_rank))
    shape = [draw(st.integers(1, max_size)) for _ in range(rank)]
    n_in = draw(st.integers(1, 2))
    inputs = [draw(_tensor([1 if (k == 1 and draw(st.booleans())) else s for s in shape], dtype))
              for k in range(n_in)]
    shapes = [tuple(x.shape) for x in inputs]
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(shapes) - 1))
        s = shapes[i]
        kinds = ["unary", "binary", "reduce", "view"]
        kind = draw(st.sampled_from(kinds))
        if kind == "unary":
            names = sorted(UNARY if dtype.is_floating_point else INT_SAFE)
            step, out = Step(draw(st.sampled_from(names)), (i,)), s
        elif kind == "binary":
            partners = [j for j, t in enumerate(shapes) if _broadcastable(s, t)]
            j = draw(st.sampled_from(partners))
            names = sorted(BINARY if dtype.is_floating_point else set(BINARY) - {"where_gt"})
            step, out = Step(draw(st.sampled_from(names)), (i, j)), _broadcast(s, shapes[j])
        elif kind == "reduce" and s:
            dims = tuple(sorted(set(draw(st.lists(st.integers(0, len(s) - 1), min_size=1, max_size=len(s))))))
            keep = draw(st.booleans())
            name = draw(st.sampled_from(sorted(REDUCE)))
            step = Step(name, (i,), (dims, keep))
            out = tuple(1 if d in dims else n for d, n in enumerate(s)) if keep else \
                tuple(n for d, n in enumerate(s) if d not in dims)
        elif kind == "view" and s:
            view = draw(st.sampled_from(["permute", "slice", "reshape", "unsqueeze"]))
            if view == "permute":
                perm = tuple(draw(st.permutations(range(len(s)))))
                step, out = Step("permute", (i,), perm), tuple(s[p] for p in perm)
            elif view == "slice":
                dim = draw(st.integers(0, len(s) - 1))
                start = draw(st.integers(0, max(0, s[dim] - 1)))
                stride = draw(st.integers(1, 2))
                n = -(-(s[dim] - start) // stride)
                step, out = Step("slice", (i,), (dim, start, stride)), s[:dim] + (n,) + s[dim + 1:]
            elif view == "reshape":
                numel = 1
                for n in s:
                    numel *= n
                step, out = Step("reshape", (i,), (numel,)), (numel,)
            else:
                d = draw(st.integers(0, len(s)))
                step, out = Step("unsqueeze", (i,), (d,)), s[:d] + (1,) + s[d:]
        else:
            step, out = Step("neg", (i,)), s
        steps.append(step)
        shapes.append(out)
    outputs = (len(shapes) - 1,) + tuple(sorted(set(draw(st.lists(
        st.integers(len(inputs), len(shapes) - 1), max_size=1)))))
    return TensorProgram(tuple(steps), tuple(inputs), tuple(dict.fromkeys(outputs)))


def _broadcastable(a, b) -> bool:
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and x != 1 and y != 1:
            return False
    return True


def _broadcast(a, b) -> tuple:
    out = []
    for k in range(max(len(a), len(b))):
        x = a[len(a) - 1 - k] if k < len(a) else 1
        y = b[len(b) - 1 - k] if k < len(b) else 1
        out.append(max(x, y))
    return tuple(reversed(out))


@st.composite
def pipelines(draw, names=None, max_len: int = 5):
    """A random valid Pipeline of registered passes (optionally only `names`), with random option
    values and sometimes a repeat(...) group; invalid orders (unmet `requires`) are not drawn."""
    import passline
    from passline.pipeline.registry import PipelineError

    registry = passline.passes()
    pool = sorted(names or [n for n in registry if not n.startswith("t_")])
    calls = []
    for name in draw(st.lists(st.sampled_from(pool), min_size=0, max_size=max_len)):
        info = registry[name]
        opts = {}
        for o in info.options:
            if not draw(st.booleans()):
                continue
            if o.choices:
                opts[o.name] = draw(st.sampled_from(o.choices))
            elif o.type is bool:
                opts[o.name] = draw(st.booleans())
            elif o.type is int:
                opts[o.name] = draw(st.integers(0 if o.default == 0 else 1, max(2 * int(o.default), 4)))
            elif o.type is float:
                opts[o.name] = draw(st.floats(0, max(2 * float(o.default), 1.0)))
            else:
                opts[o.name] = o.default
        calls.append(passline.PassCall.make(name, opts))
    items = list(calls)
    if len(items) >= 2 and draw(st.booleans()):
        k = draw(st.integers(0, len(items) - 2))
        items[k:k + 2] = [passline.Repeat(tuple(items[k:k + 2]), draw(st.integers(1, 3)))]
    try:
        return passline.Pipeline(items)
    except PipelineError:
        from hypothesis import assume

        assume(False)
