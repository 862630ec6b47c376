"""The vocabulary of generated kernels, shared by the Triton backend and `passline.backend(kernel_variant=)`:
which form of a kernel (a variant). One launch configuration of a variant is a
`backends.triton.configs.Config`."""
from __future__ import annotations

from ..ir.index import StrEnum


class KernelVariant(StrEnum):
    """A form of generated kernel. A str enum: its values are the names reports and caches hold."""

    POINTWISE = "pointwise"
    PERSISTENT = "persistent"  # a reduction whose whole row fits one block
    LOOPED = "looped"  # a reduction looping over its row in RBLOCK steps
    MIX_ORDER = "mix_order"  # a mix-order reduction, column partial sums accumulated per row
    MIX_ORDER_ACC2D = "mix_order_acc2d"  # ... accumulated over a tile of rows
    # ... over a tile of rows of one block of columns, a program per (rows, column block): a pointwise row side
    # too wide for one block (MixOrderNode.tiled)
    MIX_ORDER_TILED = "mix_order_tiled"


REDUCTION_VARIANTS = (KernelVariant.PERSISTENT, KernelVariant.LOOPED)
MIX_FORMS = (KernelVariant.MIX_ORDER, KernelVariant.MIX_ORDER_ACC2D, KernelVariant.MIX_ORDER_TILED)
AUTO = "auto"  # kernel_variant="auto": the multi-kernel choice
FORCEABLE = (AUTO, *REDUCTION_VARIANTS, *MIX_FORMS)  # what passline.backend(kernel_variant=...) accepts
