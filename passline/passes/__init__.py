"""Built-in passes, one per module. Importing this package registers them."""
from . import dce, fuse, inline_pointwise, memory_order, mix_order_reduction, reorder_loops, sink_waits  # noqa: F401
