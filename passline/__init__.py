"""passline: a declarative pass-pipeline framework for tensor-compiler scheduling.

    compiled = torch.compile(model, backend=passline.backend())
    passline.last_report().graph      # the scheduler graph that ran
"""
import importlib

# Register the built-in passes first: below, the name `passline.passes` becomes the registry listing.
importlib.import_module(".passes", __name__)

from .backends.dynamo import DEFAULT_PIPELINE, Backend, backend  # noqa: E402
from .bisect import BisectReport, bisect, replay  # noqa: E402
from .config import Settings, settings  # noqa: E402
from .explain import explain  # noqa: E402
from .lowering.choices import register_choice, unregister_choice  # noqa: E402
from .pipeline import CompileReport, SchedulerGraph, VerificationError, last_report  # noqa: E402
from .pipeline.instruments import PassInstrument  # noqa: E402
from .pipeline.manager import PassContext, PassManager, PassResult  # noqa: E402
from .pipeline.registry import PassInfo, PipelineError, Registry, passes, register_pass, unregister_pass  # noqa: E402
from .pipeline.text import PassCall, Pipeline, Repeat, repeat  # noqa: E402

__version__ = "0.1.0"

__all__ = ["backend", "Backend", "last_report", "CompileReport", "SchedulerGraph", "VerificationError",
           "Settings", "settings", "PassContext", "PassInstrument", "PassManager", "PassResult", "PassInfo",
           "PipelineError", "Registry", "passes", "register_pass", "unregister_pass", "PassCall", "Pipeline", "Repeat",
           "repeat", "DEFAULT_PIPELINE", "bisect", "replay", "BisectReport", "explain", "register_choice",
           "unregister_choice", "__version__"]
