"""The vocabulary of generated kernels, shared by the Triton backend and `passline.backend(kernel_variant=)`:
which form of a kernel (a variant), and one launch configuration to try (a candidate)."""
from __future__ import annotations

from typing import NamedTuple

from ..ir.index import StrEnum


class KernelVariant(StrEnum):
    """A form of generated kernel. A str enum: its values are the names reports and caches hold."""

    POINTWISE = "pointwise"
    PERSISTENT = "persistent"  # a reduction whose whole row fits one block
    LOOPED = "looped"  # a reduction looping over its row in RBLOCK steps
    MIX_ORDER = "mix_order"  # a mix-order reduction, column partial sums accumulated per row
    MIX_ORDER_ACC2D = "mix_order_acc2d"  # ... accumulated over a tile of rows


REDUCTION_VARIANTS = (KernelVariant.PERSISTENT, KernelVariant.LOOPED)
MIX_FORMS = (KernelVariant.MIX_ORDER, KernelVariant.MIX_ORDER_ACC2D)
AUTO = "auto"  # kernel_variant="auto": the multi-kernel choice
FORCEABLE = (AUTO, *REDUCTION_VARIANTS, *MIX_FORMS)  # what passline.backend(kernel_variant=...) accepts


class Candidate(NamedTuple):
    """One launch configuration of a kernel to try: a variant, its block sizes (XBLOCK, RBLOCK, and for a
    mix-order kernel SPLIT and STAGES) and the warps per program."""

    variant: KernelVariant
    blocks: dict
    num_warps: int

    def __str__(self):
        return f"{self.variant} {self.blocks} w{self.num_warps}"
