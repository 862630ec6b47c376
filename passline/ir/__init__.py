"""passline's loop-level IR: buffers, sympy index math, loop bodies and node kinds."""
from .body import (
                   BINARY_OPS,
                   TERNARY_OPS,
                   UNARY_OPS,
                   Cast,
                   Constant,
                   IndexValue,
                   Load,
                   Op,
                   Value,
                   loads,
                   rebuild,
                   substitute_index,
                   walk,
)
from .index import FloorDiv, ModularIndexing, VarKind, loop_var, loop_vars, size_var, sympify, var, var_info, var_kind
from .nodes import (
                   REDUCTION_TYPES,
                   Buffer,
                   Extern,
                   FusedNode,
                   Layout,
                   MemoryDep,
                   MixOrderNode,
                   Node,
                   Pointwise,
                   Reduction,
                   TensorArg,
                   comm_kind,
                   members,
)

__all__ = [
    "BINARY_OPS", "TERNARY_OPS", "UNARY_OPS", "Cast", "Constant", "IndexValue", "Load", "Op",
    "Value", "loads", "rebuild", "substitute_index", "walk", "FloorDiv", "ModularIndexing",
    "loop_var", "loop_vars", "size_var", "sympify", "var", "var_info", "var_kind", "VarKind",
    "REDUCTION_TYPES", "Buffer", "Extern", "Layout", "MemoryDep", "Node", "Pointwise", "Reduction",
    "TensorArg", "FusedNode", "MixOrderNode", "members", "comm_kind",
]
