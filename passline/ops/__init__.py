"""torch-level operators that passline's FX-stage passes put into dynamo's graphs.

They depend on torch alone (nothing to their left in passline's data flow), are registered with
`torch.library` (a fake implementation for tracing and an autograd formula), and reach the aten graphs
aot_autograd makes as one op each, which lowering runs as an Extern call.
"""
from . import linear_cross_entropy  # noqa: F401  (registers passline::linear_cross_entropy)
