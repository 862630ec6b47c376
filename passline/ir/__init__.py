"""passline's loop-level IR: buffers, sympy index math, loop bodies and node kinds."""
from .body import (BINARY_OPS, TERNARY_OPS, UNARY_OPS, Cast, Constant, IndexValue, Indirect, Load, Op,
                   Value, loads, rebuild, substitute_index, walk)
from .index import (FloorDiv, IndirectSymbol, ModularIndexing, indirect_var, is_indirect, loop_var, loop_vars,
                    size_var, sympify)
from .nodes import (REDUCTION_TYPES, SCATTER_MODES, Buffer, Extern, FusedNode, Layout, MemoryDep, MixOrderNode,
                    Node, Pointwise, Reduction, Scatter, TensorArg)

__all__ = [
    "BINARY_OPS", "TERNARY_OPS", "UNARY_OPS", "Cast", "Constant", "IndexValue", "Indirect", "Load", "Op",
    "Value", "loads", "rebuild", "substitute_index", "walk", "FloorDiv", "ModularIndexing",
    "IndirectSymbol", "indirect_var", "is_indirect",
    "loop_var", "loop_vars", "size_var", "sympify", "REDUCTION_TYPES", "Buffer", "Extern",
    "Layout", "MemoryDep", "Node", "Pointwise", "Reduction", "TensorArg", "FusedNode", "MixOrderNode",
    "Scatter", "SCATTER_MODES",
]
