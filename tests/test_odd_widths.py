"""Odd sizes (docs/backends.md, *Odd widths: whole blocks and aligned loops*): a pointwise kernel over an element
count that is not a multiple of 16 runs its whole blocks under a constant mask, and a looped row kernel whose rows
do not start on 16-byte boundaries walks aligned chunks of the flat buffer where a program has one row. Both
branches of each run under the interpreter here, against eager; the sm_90 binaries are checked for vector loads."""
import re

import pytest
import torch
import torch.nn.functional as F
from test_dynamic_kernels import gpu_compile  # noqa: F401  (a fixture)

from passline.backends.triton import configs
from passline.testing import assert_matches_eager

ODD = 9001  # 15 rows in 16 start off a 16-element boundary, each at another offset from it

ROWS = {
    "layer_norm": lambda: (torch.nn.LayerNorm(ODD), [torch.randn(5, ODD, requires_grad=True)]),
    "rms_norm_bf16": lambda: (torch.nn.RMSNorm(ODD).bfloat16(),
                              [torch.randn(5, ODD, dtype=torch.bfloat16, requires_grad=True)]),
    "log_softmax": lambda: (lambda x: torch.log_softmax(x, -1), [torch.randn(5, ODD, requires_grad=True)]),
    "cross_entropy": lambda: (lambda x, t: F.cross_entropy(x, t),
                              [torch.randn(5, ODD, requires_grad=True), torch.randint(0, ODD, (5,))]),
    "argmax_ties": lambda: (lambda x: x.argmax(-1), [torch.randint(0, 3, (5, ODD)).float()]),
    # rows of the reduction's identity: the lanes before a row (masked, at negative indices) must lose every tie
    "argmax_no_true": lambda: (lambda m: m.to(torch.uint8).argmax(-1), [torch.zeros(5, ODD, dtype=torch.bool)]),
    "argmax_of_neg_inf": lambda: (lambda x: x.argmax(-1), [torch.full((5, ODD), float("-inf"))]),
    "argmin_of_inf": lambda: (lambda x: x.argmin(-1), [torch.full((5, ODD), float("inf"))]),
}


def _reductions(be) -> list:
    return [k for r in be.reports for k in r.kernel_info if k.kind == "reduction"]


@pytest.mark.parametrize("case", sorted(ROWS))
def test_odd_width_rows_run_the_aligned_loop_like_eager(monkeypatch, case):
    """Programs of one row (the interpreter's block shrunk to one chunk of 4096, looped forced): 5 rows of 9001,
    each with an inner chunk (the constant-True mask) and edge chunks (masked to the row) at its own offset from
    the 16-element boundary; forward and backward against eager, argmax's ties to the first index included."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 4096)
    torch.manual_seed(0)
    fn, inputs = ROWS[case]()
    be = assert_matches_eager(fn, inputs, codegen="triton", kernel_variant="looped")
    aligned = [k for k in _reductions(be) if "rflat" in k.source]
    assert aligned, [k.source for k in _reductions(be)]
    for k in aligned:  # a chunk at most half a row: whichever the row's offset, one lies inside it
        assert k.blocks["XBLOCK"] == 1 and 2 * k.blocks["RBLOCK"] <= ODD, (k.name, k.blocks)


def test_aligned_rows_keep_the_plain_loop():
    """Rows on 16-byte boundaries (1000 float32 or bfloat16 elements: 4000 and 2000 bytes) load vectors in the plain
    loop, which was the faster there: no aligned loop is written; several rows a program take the plain loop."""
    x = torch.randn(6, 1000, requires_grad=True)
    be = assert_matches_eager(torch.nn.LayerNorm(1000), [x], codegen="triton", kernel_variant="looped")
    assert not any("rflat" in k.source for k in _reductions(be))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_ragged_pointwise_kernel_runs_whole_blocks_unmasked(monkeypatch, dynamic):
    """A bias + GELU over 3 x 9001 = 27003 elements in blocks of 4096 (the interpreter's, shrunk): six whole blocks
    under the constant mask, the last one masked; with dynamic shapes the count is passed at run time, split alike
    (here at two sizes, one of them a multiple of 16)."""
    monkeypatch.setattr(configs, "INTERP_BLOCK", 4096)
    bias = torch.randn(ODD)

    def fn(x):
        return F.gelu(x + bias)

    for rows in ((3,) if not dynamic else (3, 16)):
        be = assert_matches_eager(fn, [torch.randn(rows, ODD, requires_grad=True)], codegen="triton",
                                  dynamic=dynamic)
        pointwise = [k for r in be.reports for k in r.kernel_info if k.kind == "pointwise"]
        assert pointwise and all("if xoffset <= " in k.source for k in pointwise), \
            [k.source for k in pointwise]


def _loads(ptx: str) -> dict:
    """16-byte vector loads and stores, cache hints or not (`ld.global.L1::evict_last.L2::cache_hint.v4.b32`)."""
    return {what: len(re.findall(rf"{what}\.global[\w.:]*\.v4", ptx)) for what in ("ld", "st")}


def test_odd_widths_load_vectors_on_sm90(gpu_compile):  # noqa: F811
    """Compiled for sm_90 with the rule's configuration: a bfloat16 LayerNorm over 8 rows of 20001 (looped, a row a
    program) and a bias + GELU over 7 x 20001 elements (an odd count) load and store 16-byte vectors; written the
    plain way, every element of both was a load of its own (no `.v4` in either binary)."""
    ln = torch.nn.LayerNorm(20001).to(torch.bfloat16)
    x = torch.randn(8, 20001, dtype=torch.bfloat16)
    (fwd,) = gpu_compile(ln, x, False, "layer_norm").values()
    assert _loads(fwd)["ld"] > 0 and _loads(fwd)["st"] > 0, _loads(fwd)
    bias = torch.randn(20001, dtype=torch.bfloat16)
    (pw,) = gpu_compile(lambda x: F.gelu(x + bias), torch.randn(7, 20001, dtype=torch.bfloat16), False,
                        "gelu").values()
    assert _loads(pw)["ld"] > 0 and _loads(pw)["st"] > 0, _loads(pw)
