"""What differs between the Triton versions passline runs on (3.6 and 3.9 today), in one place.

A generated kernel is compiled once through `JITFunction.run` (which binds and specializes its arguments,
~11 µs a launch) and then launched through the compiled binary's own launcher (`CompiledKernel.run`,
~5 µs), which takes the grid, the stream, the function handle, the packed metadata, the launch hooks and
then every argument of the kernel's signature in order, constexprs included (the launcher skips them).
"""
from __future__ import annotations

import triton

try:  # triton >= 3.4: launch hooks live in knobs
    from triton import knobs as _knobs

    def _hooks():
        return _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
except ImportError:  # pragma: no cover - older Triton
    from triton.compiler.compiler import CompiledKernel as _CK

    def _hooks():
        return _CK.launch_enter_hook, _CK.launch_exit_hook


def binary_launcher(compiled):
    """`launch(grid0, stream, *args)` for a compiled kernel, or None where this Triton's CompiledKernel
    does not have the launcher this module knows (then the caller keeps using JITFunction.run)."""
    run = getattr(compiled, "run", None)  # a property: loads the binary on first access
    function = getattr(compiled, "function", None)
    meta = getattr(compiled, "packed_metadata", None)
    if run is None or function is None or meta is None:
        return None
    enter, leave = _hooks()
    if enter is not None or leave is not None:
        # a profiler's hooks want launch metadata: the JIT path computes it
        return None

    def launch(grid0, stream, *args):
        run(grid0, 1, 1, stream, function, meta, None, None, None, *args)

    return launch


def current_stream(device_index: int) -> int:
    """The raw CUDA stream handle Triton launches on for a device."""
    import torch

    return torch.cuda.current_stream(device_index).cuda_stream


VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
