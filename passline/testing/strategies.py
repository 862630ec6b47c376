"""Hypothesis strategies for fuzzing passline: random tensor programs and random valid pipelines.

    from hypothesis import given
    from passline.testing import programs, pipelines, assert_matches_eager

    @given(programs(), pipelines())
    def test_my_pass(program, pipeline):
        assert_matches_eager(program, program.inputs, pipeline=pipeline)

A program is a small DAG of pointwise math, broadcasts, views (permute, slice, reshape, unsqueeze),
concatenations (cat), constant pads and cuts along one dim (pad), reductions over random dims, softmaxes
along one (softmax, log_softmax: a row's max and sum of exponentials) and gathers along one at indices
computed from another value (take: `torch.gather`), on inputs of random shapes (size-1 dims included),
random dtypes and random memory layouts (LAYOUTS: contiguous, transposed, permuted, sliced, expanded, channels_last,
channels_last_3d). It is written as Input specs and a list of steps, so a failing example prints as
code that rebuilds it: `eval(repr(program))` with `from passline.testing import TensorProgram, Input`.
"""
from __future__ import annotations

import ast
import difflib
import re

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
SOFTMAX = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}  # floating point, along one dim
INT_SAFE = {"neg", "abs", "square"}


@attrs.frozen
class Step:
    op: str  # unary/binary/reduce name, a view (permute, slice, reshape, unsqueeze), or cat
    args: tuple  # value indices
    params: tuple = ()

    def __str__(self):
        return f"{self.op}({', '.join(f'v{a}' for a in self.args)}{''.join(', ' + repr(p) for p in self.params)})"

    @staticmethod
    def parse(text: str) -> "Step":
        """The inverse of str(): 'sum(v2, (0,), True)' (or 'v3 = sum(v2, (0,), True)') -> a Step.
        Arguments named v<k> are value indices, every other argument is a literal parameter."""
        rhs = text.split("=", 1)[1] if re.match(r"\s*v\d+\s*=[^=]", text) else text
        call = ast.parse(rhs.strip(), mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise ValueError(f"not a step: {text!r}")
        is_value = [isinstance(a, ast.Name) and re.fullmatch(r"v\d+", a.id) is not None for a in call.args]
        args = tuple(int(a.id[1:]) for a, v in zip(call.args, is_value) if v)
        params = tuple(ast.literal_eval(a) for a, v in zip(call.args, is_value) if not v)
        return Step(call.func.id, args, params)


# Input layouts, and the ranks each applies to (None: any rank >= 1). "contiguous" applies to every
# rank, including 0-D, so a restricted `layouts=` set always has something to fall back on.
LAYOUTS = {
    "contiguous": None,
    "transposed": lambda r: r >= 2,  # every dim reversed in memory (x.t() for 2-D)
    "permuted": lambda r: r >= 3,  # a random memory order of the dims
    "sliced": lambda r: r >= 1,  # a start/step slice of a larger tensor: storage_offset != 0
    "expanded": lambda r: r >= 1,  # stride-0 broadcast dims
    "channels_last": lambda r: r == 4,
    "channels_last_3d": lambda r: r == 5,
}
_DTYPES = {str(d).replace("torch.", ""): d for d in (torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                                      torch.int64, torch.int32, torch.bool)}


def _layout_fits(layout: str, rank: int) -> bool:
    fits = LAYOUTS[layout]
    return fits is None or fits(rank)


@attrs.frozen(repr=False)
class Input:
    """How to build one program input: shape, dtype, memory layout, values (a seed) and whether it is a
    requires_grad leaf. `make()` builds it; repr() is the constructor call, so programs print as code.

    Layout parameters: `order` (permuted: the dims from outermost to innermost in memory), `dim`,
    `start`, `step` (sliced: the slice of a larger tensor along `dim`; its last dim is also one wider
    than the input's, so rows are never packed), `dims` (expanded: the dims broadcast with stride 0).
    An expanded input never requires grad: its elements alias one another in memory, so a gradient
    "per element" is not something a user trains; programs broadcast grad-requiring values instead."""

    shape: tuple
    dtype: str
    layout: str = "contiguous"
    seed: int = 0
    requires_grad: bool = False
    order: tuple | None = None
    dim: int | None = None
    start: int | None = None
    step: int | None = None
    dims: tuple | None = None

    def __attrs_post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; known: {sorted(LAYOUTS)}")
        if not _layout_fits(self.layout, len(self.shape)):
            raise ValueError(f"layout {self.layout!r} does not apply to a {len(self.shape)}-D input")
        if self.requires_grad and (self.layout == "expanded" or not _DTYPES[self.dtype].is_floating_point):
            raise ValueError(f"a {self.layout} {self.dtype} input cannot require grad")

    def __repr__(self):
        extra = "".join(f", {f}={getattr(self, f)!r}" for f in ("order", "dim", "start", "step", "dims")
                        if getattr(self, f) is not None)
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Input({tuple(self.shape)!r}, {self.dtype!r}, {self.layout!r}, seed={self.seed}{extra}{grad})"

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))

    def make(self) -> torch.Tensor:
        dtype, shape = _DTYPES[self.dtype], tuple(self.shape)
        gen = torch.Generator().manual_seed(self.seed)

        def values(s):
            if dtype.is_floating_point:
                return torch.randn(s, generator=gen).to(dtype)
            return torch.randint(-4, 5, s, generator=gen).to(dtype)

        lay = self.layout
        if lay == "transposed":
            x = values(shape[::-1]).permute(*reversed(range(len(shape))))
        elif lay == "permuted":
            # storage holds the dims in `order`; permuting by the inverse order gives back `shape`
            inverse = sorted(range(len(shape)), key=lambda d: self.order[d])
            x = values(tuple(shape[d] for d in self.order)).permute(*inverse)
        elif lay == "sliced":
            d, start, step = self.dim, self.start, self.step
            big = list(shape)
            big[d] = start + step * (shape[d] - 1) + 1 + 1  # one spare element past the slice's end
            big[-1] += 1 if d != len(shape) - 1 else 0  # rows never packed, whatever dim is sliced
            x = values(tuple(big))
            x = x[(slice(None),) * d + (slice(start, start + step * shape[d], step),)][..., :shape[-1]]
        elif lay == "expanded":
            x = values(tuple(1 if d in self.dims else n for d, n in enumerate(shape))).expand(*shape)
        elif lay == "channels_last":
            x = values(shape).contiguous(memory_format=torch.channels_last)
        elif lay == "channels_last_3d":
            x = values(shape).contiguous(memory_format=torch.channels_last_3d)
        else:
            x = values(shape)
        assert tuple(x.shape) == shape, (self, x.shape)
        # detach: a leaf whose strides and storage offset are the layout's, not a view with a grad_fn
        return x.detach().requires_grad_(self.requires_grad)


@attrs.frozen(eq=False, repr=False)
class TensorProgram:
    """A random program: `program(*program.inputs)` runs it. repr() prints it as a
    `TensorProgram.build(...)` call that rebuilds it (inputs with their layouts and values)."""

    steps: tuple
    inputs: tuple
    outputs: tuple  # value indices returned
    specs: tuple | None = None  # the Input each of `inputs` was made from (None: tensors given directly)

    @staticmethod
    def build(inputs, steps, outputs) -> "TensorProgram":
        """inputs: Input specs; steps: Steps or their text ('v2 = tanh(v0)'); outputs: value indices."""
        steps = tuple(Step.parse(s) if isinstance(s, str) else s for s in steps)
        specs = tuple(inputs)
        return TensorProgram(steps, tuple(s.make() for s in specs), tuple(outputs), specs)

    def __call__(self, *xs):
        vals = list(xs)
        for s in self.steps:
            vals.append(_apply(s, [vals[a] for a in s.args]))
        return tuple(vals[i] for i in self.outputs)

    def __repr__(self):
        n = len(self.inputs)
        steps = "".join(f"\n        'v{n + k} = {s}'," for k, s in enumerate(self.steps))
        if self.specs is None:  # tensors given directly: describe them (not re-runnable)
            ins = "".join(f"\n        {_describe(x)}," for x in self.inputs)
        else:
            ins = "".join(f"\n        {spec!r},  # {_describe(x)}" for spec, x in zip(self.specs, self.inputs))
        return (f"TensorProgram.build(\n    inputs=[{ins}\n    ],\n    steps=[{steps}\n    ],\n"
                f"    outputs={tuple(self.outputs)!r})")

    def _repr_pretty_(self, p, cycle):  # hypothesis' printer: the code above, not the attrs fields
        p.text(repr(self))


def _describe(x: torch.Tensor) -> str:
    return (f"{str(x.dtype).replace('torch.', '')}{list(x.shape)} stride={tuple(x.stride())}"
            f"{f' offset={x.storage_offset()}' if x.storage_offset() else ''}")


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
    if op in SOFTMAX:
        return SOFTMAX[op](xs[0], p[0])
    if op == "take":
        return torch.gather(xs[0], p[0], take_index(xs[1], xs[0].shape[p[0]]))
    if op == "permute":
        return xs[0].permute(*p)
    if op == "slice":
        dim, start, step_ = p
        return xs[0].narrow(dim, start, xs[0].shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step_),)]
    if op == "reshape":
        return xs[0].reshape(p)
    if op == "unsqueeze":
        return xs[0].unsqueeze(p[0])
    if op == "cat":
        return torch.cat((xs[0], xs[1]), p[0])
    if op == "pad":
        return torch.constant_pad_nd(xs[0], p[0], p[1])
    raise ValueError(op)


def take_index(v: torch.Tensor, n: int) -> torch.Tensor:
    """`take`'s indices: int64 positions 0..n-1 computed from the values of `v` (any dtype), so that a gather's
    index is computed in the program (from an input, or from any integer value: a sum, an amax)."""
    if v.is_floating_point():
        v = (v.detach().float() * 7).abs().clamp(max=1e6)
    return v.abs().long() % n


def _genuine(layout: str, shape: tuple) -> bool:
    """Whether `layout` gives a `shape` tensor strides that differ from contiguous ones on dims of size
    > 1 (the only strides that address anything): a transposed (1, 5) tensor is a contiguous one."""
    big = sum(n > 1 for n in shape)
    if layout in ("transposed", "permuted"):
        return _layout_fits(layout, len(shape)) and big >= 2
    if layout == "expanded":
        return big >= 1
    return _layout_fits(layout, len(shape))


@st.composite
def _input(draw, shape, dtype, layouts, requires_grad: bool) -> Input:
    shape = tuple(shape)
    fitting = [lay for lay in layouts if _genuine(lay, shape)] or ["contiguous"]
    # the channels_last layouts are the ones users meet on 4-D/5-D tensors: drawn as often as the rest
    # together (else 1 in 6), still after contiguous, which hypothesis shrinks toward
    fitting += [lay for lay in fitting if lay.startswith("channels_last")] * (len(fitting) - 2)
    layout = draw(st.sampled_from(fitting))
    big = [d for d, n in enumerate(shape) if n > 1]
    extra = {}
    if layout == "permuted":  # dims of size > 1 out of their contiguous order
        extra["order"] = tuple(draw(st.permutations(range(len(shape))).filter(
            lambda o: [d for d in o if d in big] != big)))
    elif layout == "sliced":
        extra["dim"] = draw(st.sampled_from(big or list(range(len(shape)))))
        extra["start"] = draw(st.integers(1, 2))  # >= 1: a nonzero storage offset
        # with two dims of size > 1 the wider last dim already unpacks the rows; with one, only a step does
        extra["step"] = draw(st.integers(1 if len(big) >= 2 else 2, 3))
    elif layout == "expanded":
        extra["dims"] = tuple(sorted(set(draw(st.lists(st.sampled_from(big), min_size=1)))))
    name = str(dtype).replace("torch.", "")
    grad = requires_grad and dtype.is_floating_point and layout != "expanded"
    return Input(shape, name, layout, seed=draw(st.integers(0, 2**31 - 1)), requires_grad=grad, **extra)


@st.composite
def programs(draw, max_steps: int = 6, max_rank: int = 5, max_size: int = 6,
             dtypes=(torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.int64),
             layouts=tuple(LAYOUTS), requires_grad: bool = False, max_numel: int = 256):
    """A TensorProgram with 1-2 inputs of one dtype and up to `max_steps` steps.

    Inputs have rank 1..`max_rank` (higher ranks get smaller dims: at most `max_numel` elements) and a
    layout drawn from `layouts` (default: all of LAYOUTS; a layout is drawn only for ranks it applies
    to, so channels_last needs rank 4). `requires_grad=True` makes every floating-point input that is
    not expanded a requires_grad leaf, for training checks."""
    layouts = (layouts,) if isinstance(layouts, str) else tuple(layouts)  # programs(layouts="transposed") too
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        raise ValueError(f"unknown layouts {sorted(unknown)}; known: {sorted(LAYOUTS)}")
    if max_size < 1 or max_numel < 1:
        raise ValueError(f"max_size and max_numel are at least 1, got {max_size} and {max_numel}")
    dtype = draw(st.sampled_from(dtypes))
    # only ranks that some allowed layout applies to: layouts=["channels_last"] draws 4-D programs only
    ranks = [r for r in range(1, max_rank + 1) if any(_layout_fits(lay, r) for lay in layouts)] or [1]
    rank = draw(st.sampled_from(ranks))
    # each dim at most the rank-th root of max_numel, so that no input has more (and at most max_size)
    cap = max(1, min(max_size, int(max_numel ** (1 / rank) + 1e-9)))
    shape = [draw(st.integers(1, cap)) for _ in range(rank)]
    n_in = draw(st.integers(1, 2))
    specs = [draw(_input([1 if (k == 1 and draw(st.booleans())) else s for s in shape], dtype, layouts,
                         requires_grad)) for k in range(n_in)]
    inputs = [spec.make() for spec in specs]
    shapes = [tuple(x.shape) for x in inputs]
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(shapes) - 1))
        s = shapes[i]
        kinds = ["unary", "binary", "reduce", "view", "cat", "softmax", "take", "pad"]
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
        elif kind == "softmax" and s and dtype.is_floating_point:
            d = draw(st.integers(-len(s), len(s) - 1))
            step, out = Step(draw(st.sampled_from(sorted(SOFTMAX))), (i,), (d,)), s
        elif kind == "take" and s:
            # torch.gather(v_i, d, index from v_j): v_j of v_i's rank, no longer than v_i along the other dims.
            # A floating-point index source is an input: indices floored from computed values would move with
            # rounding within the tolerance (a bfloat16 softmax's 0.2857 x 7 on either side of 2), and pick
            # other elements; integer values are exact wherever they come from (a sum, an amax)
            d = draw(st.integers(0, len(s) - 1))
            sources = range(len(inputs)) if dtype.is_floating_point else range(len(shapes))
            partners = [j for j in sources if len(shapes[j]) == len(s)
                        and all(b <= a for k, (a, b) in enumerate(zip(s, shapes[j])) if k != d)]
            if partners:
                j = draw(st.sampled_from(partners))
                step, out = Step("take", (i, j), (d,)), shapes[j]
            else:  # no input of v_i's rank fits
                step, out = Step("neg", (i,)), s
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
        elif kind == "cat" and s:
            # with itself or a value of the same shape but along one dim (the cat dim)
            d = draw(st.integers(0, len(s) - 1))
            partners = [j for j, t in enumerate(shapes)
                        if len(t) == len(s) and all(a == b for k, (a, b) in enumerate(zip(s, t)) if k != d)]
            j = draw(st.sampled_from(partners))
            dim = draw(st.sampled_from([d, d - len(s)]))  # negative dims too
            step, out = Step("cat", (i, j), (dim,)), s[:d] + (s[d] + shapes[j][d],) + s[d + 1:]
        elif kind == "pad" and s:
            # constant_pad_nd along one dim, counted from the last: before and after, a negative count cuts
            d = draw(st.integers(0, len(s) - 1))
            lo = draw(st.integers(-1 if s[d] > 1 else 0, 2))
            hi = draw(st.integers(-1 if s[d] + lo > 1 else 0, 3).filter(lambda h, lo=lo: (lo, h) != (0, 0)))
            # (no all-zero pad: eager returns a clone keeping the input's strides, while torch's meta, with the
            # counts symbolic as dynamo makes a program's ints under dynamic=True, lays a new tensor out dense)
            value = draw(st.sampled_from([0, 1, -2] if not dtype.is_floating_point else [0.0, 1.5, -2.0]))
            pad = (0, 0) * (len(s) - 1 - d) + (lo, hi)
            step, out = Step("pad", (i,), (pad, value)), s[:d] + (s[d] + lo + hi,) + s[d + 1:]
        else:
            step, out = Step("neg", (i,)), s
        steps.append(step)
        shapes.append(out)
    outputs = (len(shapes) - 1,) + tuple(sorted(set(draw(st.lists(
        st.integers(len(inputs), len(shapes) - 1), max_size=1)))))
    return TensorProgram(tuple(steps), tuple(inputs), tuple(dict.fromkeys(outputs)), tuple(specs))


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
    """A random valid Pipeline of registered passes (optionally only `names`; by default the scheduler-stage
    passes: FX-stage ones rewrite dynamo's graphs, not the lowered programs these pipelines run on), with
    random option values and sometimes a repeat(...) group; invalid orders (unmet `requires`) are not drawn."""
    import passline
    from passline.pipeline.registry import PipelineError

    registry = passline.passes()
    if names is not None:
        if isinstance(names, str) or not names:
            raise ValueError(f"names is a non-empty list of pass names, got {names!r}")
        unknown = [n for n in names if n not in registry]
        if unknown:
            near = difflib.get_close_matches(unknown[0], list(registry), n=1)
            raise ValueError(f"no pass {unknown[0]!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    pool = sorted(names or [n for n, info in registry.items() if not n.startswith("t_") and info.stage == "scheduler"])
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
                low = max(0 if o.default == 0 else 1, int(o.least or 0))
                opts[o.name] = draw(st.integers(low, max(2 * int(o.default), 4, low)))
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
