"""What differs between the Triton versions passline runs on (3.6 and 3.9 today), in one place.

A generated kernel is compiled once through `JITFunction.run` (which binds and specializes its arguments,
~11 µs a launch) and then launched through the compiled binary's own launcher (`CompiledKernel.run`,
~5 µs), which takes the grid, the stream, the function handle, the packed metadata, the launch hooks and
then every argument of the kernel's signature in order, constexprs included (the launcher skips them).
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import threading

import torch
import triton

from .cache import digest
from .precompile import cuda_options, use_torch_ptxas

try:  # triton >= 3.4: launch hooks are chains in knobs (empty unless a profiler adds one)
    from triton import knobs as _knobs

    def hooks_active() -> bool:
        enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
        return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))
except ImportError:  # pragma: no cover - older Triton
    from triton.compiler.compiler import CompiledKernel as _CK

    def hooks_active() -> bool:
        return _CK.launch_enter_hook is not None or _CK.launch_exit_hook is not None


# The ptxas this process's kernels are assembled with where it is torch's (precompile.use_torch_ptxas, which set it
# when passline's compile module was imported, before any compile or compile worker), or the user's; None: Triton's.
PTXAS = use_torch_ptxas()

# Compile options of a kernel with device asserts (an indirect index checked at run time). Triton keeps
# `tl.device_assert` only with debug=True, which also checks every int32 add, sub and mul for overflow, an assert
# each (`sanitize_overflow`, on by default): a checked kernel with int32 offsets paid one per index operation.
# Where this Triton has the option, it is turned off: the index checks stay, the offsets stay 32-bit. None where
# it has not (the kernel then takes int64 offsets, which are never checked for overflow).
CHECKED_OPTIONS = cuda_options(sanitize_overflow=False) or None

# Compile options every kernel is compiled with: floating-point contraction (a multiply and an add fused into one
# FMA, one rounding) asked for, not left to Triton's default. Triton 3.9 warns at each process's first compile
# that its default turns to off in 3.10; eager's CUDA kernels contract (nvcc's default), and passline's kernels
# were written and checked with it on. Empty where this Triton has no such option.
COMPILE_OPTIONS = cuda_options(enable_fp_fusion=True)

# Whether tl.reshape takes can_reorder (deprecated in Triton 3.9, to be removed in 3.10): without it a reshape keeps
# its order, which the online softmax loop's groups then follow (kernel._online_step: right, with shuffles where a
# load was not vectorized).
RESHAPE_REORDERS = "can_reorder" in inspect.signature(triton.language.reshape).parameters

try:  # a kernel needing more shared memory (or registers) than the GPU has, raised when it is compiled
    from triton.runtime.errors import OutOfResources
except ImportError:  # pragma: no cover - older Triton
    from triton.runtime.autotuner import OutOfResources  # noqa: F401 - this module's name for it


def binary_launcher(compiled):
    """`launch(grid0, stream, *args)` for a compiled kernel, or None where this Triton's CompiledKernel
    does not have the launcher this module knows (then the caller keeps using JITFunction.run). While a
    profiler has launch hooks installed, launches go through CompiledKernel's own runner, which computes
    the launch metadata the hooks read."""
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        init()
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    meta = getattr(compiled, "packed_metadata", None)
    if run is None or function is None or meta is None:
        return None

    def launch(grid0, stream, *args):
        if hooks_active():
            compiled[(grid0, 1, 1)](*args, stream=stream)
        else:
            run(grid0, 1, 1, stream, function, meta, None, None, None, *args)

    return launch


def arg_names(compiled) -> list | None:
    """The parameter names of the function `compiled` was built from (a binary loaded by record keeps them in
    its record), or None where it does not say."""
    names = getattr(getattr(getattr(compiled, "src", None), "fn", None), "arg_names", None)
    return list(names) if isinstance(names, (list, tuple)) else None


def compile_for_launch(fn, args: list, kwargs: dict):
    """`fn` compiled, not launched, for arguments like `args` (a pointer as its torch dtype: aligned) and the
    launch's keyword arguments (constexprs, num_warps), for the current device: the CompiledKernel its
    launch with such arguments would compile (`JITFunction.warmup`, the same specialization and cache key)."""
    return fn.warmup(*args, grid=(1,), **kwargs)


# -- binaries loaded by record -----------------------------------------------------------------------------
# A warm process's first call loads every binary its graph launches from Triton's cache. Through
# `compile_for_launch` (JITFunction.warmup) each load imports the kernel's module (Triton reads its source
# back with `inspect`), specializes the arguments, hashes the function's source and its dependencies' ASTs for
# the cache key, and only then finds the binary: ~3 ms a kernel on this CPU and ~25 under cProfile on the H200
# host, where building the CompiledKernel from its cache entry takes 0.5. So after a binary is built, its cache
# entry is recorded (`binary_record`: Triton's hash of the key, and the signature and constants the launcher
# needs), under passline's own key for that very compile (`binary_stamp`, plus the kernel's source and
# arguments), and the next process builds the CompiledKernel straight from it (`load_recorded`).

_CACHE_ENV = ("TRITON_", "MLIR_", "LLVM_")  # Triton's knobs read their variables under these prefixes


def binary_stamp(target, key: str | None) -> str | None:
    """Everything Triton's cache key of a compile holds besides the kernel's source and arguments, for `target`
    and Triton key `key` (`precompile.remembered_triton_key`): Triton's version, the backend's hash (ptxas's
    version, the architecture), the cache-invalidating variables Triton names, every TRITON_/MLIR_/LLVM_
    variable (what sets the compile options' defaults: TRITON_DEBUG, TRITON_DEFAULT_FP_FUSION...), the default
    options' own hash, and each knob set from Python (a knob holds such a value in its instance dict). None — no
    binary loaded by record — where this Triton differs from what this module knows, or a hook, listener,
    override or dump would see or change a compile (a profiler's launch hooks, `always_compile`): those go
    through Triton's own path."""
    try:
        from triton.compiler.compiler import make_backend

        groups = {n: getattr(_knobs, n) for n in ("runtime", "compilation", "cache", "nvidia", "language")}
        hooks = [getattr(groups["runtime"], h, None) for h in (
            "jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook", "kernel_load_start_hook",
            "kernel_load_end_hook")]
        if any(getattr(h, "calls", h) for h in hooks) or groups["compilation"].listener is not None or hooks_active():
            return None
        c = groups["compilation"]
        if c.always_compile or c.override or c.dump_ir:
            return None
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_CACHE_ENV))
        knobs_set = sorted((n, sorted((k, repr(v)) for k, v in vars(g).items())) for n, g in groups.items())
        backend = make_backend(target)
        # Triton's own list of the variables its key holds (some without those prefixes: DISABLE_PTXAS_OPT,
        # DISABLE_MMA_V3...), and the compile options' defaults as this process would take them (PTXAS_OPTIONS
        # read into them at import, fp fusion, libdevice's path and contents): both parts of Triton's key
        from triton._C.libtriton import get_cache_invalidating_env_vars

        invalidating = sorted(get_cache_invalidating_env_vars().items())
        return digest(triton.__version__, key, backend.hash(), repr(target), env, knobs_set, invalidating,
                      backend.parse_options(dict(COMPILE_OPTIONS)).hash())
    except Exception:  # noqa: BLE001 - a Triton laid out otherwise: every binary through compile_for_launch
        return None


def binary_record(compiled) -> dict | None:
    """What `load_recorded` needs to build `compiled` again from Triton's cache, as JSON-able values: the
    cache entry (Triton's hash of the key, the kernel's name) and what the launcher reads of the source (its
    signature, constants and parameter names); None where `compiled` does not have them."""
    try:
        src = compiled.src
        record = {"hash": compiled.hash, "name": src.name[:150], "signature": dict(src.signature),
                  "constants": [[list(k), v] for k, v in src.constants.items()], "arg_names": list(src.fn.arg_names)}
        json.dumps(record)  # only plain values: a constant Triton keeps as an object is not recorded
        return record
    except Exception:  # noqa: BLE001 - not recorded: the next process loads it through compile_for_launch
        return None


class _RecordedFn:
    """What a CompiledKernel and its launcher read of the jitted function: its parameters' names (and no
    launch-metadata function: only an ASTSource's is ever called)."""

    launch_metadata = None

    def __init__(self, arg_names: list):
        self.arg_names = arg_names


class _RecordedSource:
    """What a CompiledKernel and its launcher read of the ASTSource it was compiled from (`binary_record`)."""

    def __init__(self, record: dict):
        self.name = record["name"]
        self.signature = record["signature"]
        self.constants = {tuple(k): v for k, v in record["constants"]}
        self.fn = _RecordedFn(record["arg_names"])


def load_recorded(record: dict | None):
    """The CompiledKernel `record` names, from Triton's cache as Triton's own cache hit builds it; None where
    there is no record or the entry is gone (evicted, another cache directory) or unreadable."""
    if not record:
        return None
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager

        group = get_cache_manager(record["hash"]).get_group(f"{record['name']}.json")
        if not group or f"{record['name']}.json" not in group:
            return None
        return CompiledKernel(_RecordedSource(record), group, record["hash"])
    except Exception:  # noqa: BLE001 - loaded through compile_for_launch instead
        return None


_LOADING: dict = {}  # a compiled kernel's signature -> the lock of the thread building its launcher
_LOADING_LOCK = threading.Lock()


def load_binary(compiled):
    """`binary_launcher(compiled)`, safe to call from several threads at once: the binary is loaded into
    the calling thread's current CUDA context (Triton's driver makes the device's primary context current
    where the thread has none: the one torch uses) and its launcher built. Triton 3.6 builds a C launcher
    per signature with gcc (`CudaLauncher` -> `compile_module_from_src`, a disk cache after): threads
    whose kernels share a signature build it one after the other, so the second finds the first's in the
    cache instead of running gcc again (3.9's launcher is generic: nothing built)."""
    src = getattr(compiled, "src", None)
    sig = getattr(src, "signature", None)
    key = repr(tuple(sig.values())) if isinstance(sig, dict) else None
    with _LOADING_LOCK:
        lock = _LOADING.setdefault(key, threading.Lock())
    with lock:
        return binary_launcher(compiled)


def allocator(device):
    """`empty(size, stride, dtype)` on `device`: dynamo's C++ allocation entry point where this torch
    has it (about 0.6 µs against 2 µs for torch.empty_strided's argument parsing; it allocates on the
    current device, so the generated call checks that first), else torch.empty_strided."""
    def slow(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    fast = getattr(guards, f"_empty_strided_{device.type}", None) if device.type in ("cuda", "cpu") else None
    return fast or slow, slow


def _alias_fallback(base, size, stride, offset: int):
    return torch.empty(0, dtype=base.dtype, device=base.device).set_(
        base.untyped_storage(), base.storage_offset() + offset, size, stride)


def alias(base, size, stride, offset: int):
    """A tensor over `base`'s memory with `size` and `stride`, `offset` elements past `base`'s own offset:
    no copy, and not an autograd view of `base` (no `_base`), so that a caller may keep it as its own (a
    gradient AccumulateGrad takes over). dynamo's C++ entry point where this torch has it (what
    Inductor's generated code calls: ~0.7 µs), else `set_` on an empty tensor (~1.7 µs)."""
    return _ALIAS(base, size, stride, offset)


def copies(tensors: tuple) -> list:
    """Fresh copies of `tensors` (strides kept, as `clone`), in one multi-tensor launch where this torch
    has `_foreach_copy_`: a replay hands back thirty small gradients a step (ResNet's BatchNorm weights
    and biases), a launch each as clones."""
    if len(tensors) == 1 or not hasattr(torch, "_foreach_copy_"):
        return [t.clone() for t in tensors]
    out = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(out, list(tensors))
    return out


def current_stream(device_index: int) -> int:
    """The raw CUDA stream handle Triton launches on for a device: torch's C entry point where this build
    has it (what Inductor's launchers call; `torch.cuda.current_stream` builds a Stream object per call, a
    few µs on every graph call), else the Stream's handle."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _counts(t) -> tuple:
    """References to tensor `t`: Python's to the object, C++'s to its TensorImpl, and to its storage."""
    return sys.getrefcount(t), t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _hop(o) -> int:
    return _refs(o)


def _refs(o) -> int:
    return sys.getrefcount(o)


def _storage_alone() -> int | None:
    """The storage count `_counts` gives for a tensor that nothing else shares storage with, on this torch
    (measured, not assumed); None where torch lacks the counts (nothing is overwritten then)."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():  # imported mid-compile: a plain tensor, not a fake one
            x = torch.empty(1)
        x._use_count()
        return torch._C._storage_Use_Count(x.untyped_storage()._cdata) if type(x) is torch.Tensor else None
    except (AttributeError, RuntimeError):
        return None


def sole(t) -> bool:
    """Whether one variable of the caller is all that holds tensor `t` and its storage — no other Python
    reference (a caller's list, the user), no other C++ one (autograd keeping a saved activation for
    another backward), no view sharing its storage — so that writing a result over it in place cannot be
    seen. Python's count is compared with a plain object's held by one variable and passed down as many
    frames, at the same moment: whatever else counts frames' references (a tracer, a debugger, dynamo
    while compiling) counts both alike."""
    if ALONE is None or _capturing():
        return False
    o = object()
    return _counts(t) == (_hop(o), 1, ALONE)


def _capturing() -> bool:
    """Whether a CUDA graph is being captured by anyone but passline's own cudagraphs.py: a capture replays
    this call's decision on later calls, whose inputs sit at the same addresses but may be held by someone,
    so nothing is taken over while capturing — unless the capture is one whose replays check, input by
    input, that what was held by the call alone at the capture still is (`checked_capture`)."""
    return (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
            and not _CHECKED_CAPTURE.on)


class _Flag(threading.local):
    on = False


_CHECKED_CAPTURE = _Flag()


class checked_capture:
    """Within: a CUDA graph capture whose replays check what the capture took over (cudagraphs.py)."""

    def __enter__(self):
        _CHECKED_CAPTURE.on = True

    def __exit__(self, *exc):
        _CHECKED_CAPTURE.on = False


ALONE = _storage_alone()
_ALIAS = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None) \
    or _alias_fallback
VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
# whether the interpreter takes a loop's bounds computed in the kernel (a mix-order program's share of its rows'
# class: kernel.KernelWriter._classes). Triton 3.6's converts them with int() on a one-element array, which
# NumPy 2.5 refuses ("only 0-dimensional arrays can be converted to Python scalars"); 3.9's squeezes them first
INTERPRETED_LOOP_BOUNDS = VERSION >= (3, 9)
