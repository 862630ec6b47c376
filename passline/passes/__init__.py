"""Built-in passes, one per module. Importing this package registers them."""
from . import (  # noqa: F401
    dce,
    fuse,
    fuse_linear_cross_entropy,
    inline_pointwise,
    memory_order,
    merge_loops,
    mix_order_reduction,
    one_hot_sums,
    pad_linear,
    peak_memory,
    recompute_columns,
    reorder_loops,
    sink_waits,
    split_reductions,
    tile_rows,
)
