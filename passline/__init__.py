"""passline: a declarative pass-pipeline framework for tensor-compiler scheduling.

    compiled = torch.compile(model, backend=passline.backend())
    passline.last_report().graph      # the scheduler graph that ran
"""
from .backends.dynamo import Backend, backend
from .pipeline import CompileReport, SchedulerGraph, VerificationError, last_report

__version__ = "0.1.0"

__all__ = ["backend", "Backend", "last_report", "CompileReport", "SchedulerGraph", "VerificationError",
           "__version__"]
