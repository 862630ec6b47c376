"""Built-in passes, one per module. Importing this package registers them."""
from . import (  # noqa: F401
    dce,
    fuse,
    inline_pointwise,
    memory_order,
    mix_order_reduction,
    reorder_loops,
    sink_waits,
    split_reductions,
)
