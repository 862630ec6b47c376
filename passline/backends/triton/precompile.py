"""Compiling a graph's kernels ahead of their first launch, in worker processes.

`triton.compile` needs no GPU, only the target (`GPUTarget("cuda", 90, 32)` for an H100/H200): what
needs one is the launch. So before a graph's first call the runner's precompile threads
(TritonRunner.precompile) hand each kernel whose configuration is known (static sizes, the rule's
configuration, a timed kernel's candidates) to a pool of worker processes (`Pool.compile`), which compile it
for the parent's target into Triton's on-disk cache (`$TRITON_CACHE_DIR`, default `~/.triton/cache`); the
thread then loads the binary from there and hands it to its kernel. The worker builds the same cache key as
the parent's launch, because it runs the same code path — the kernel's own `JITFunction.warmup` with the same
arguments — under a stand-in driver that answers the parent's target (`offline`). Nothing is compiled twice
(tests/test_precompile.py checks the key with Triton's compilation listener).

Why processes: Triton's compile holds the GIL for much of its time (the front end and the MLIR and LLVM passes
are driven from Python; ptxas, a subprocess, does not), so threads hardly overlap (docs/backends.md has the
figures). The workers are forked from one zygote (`_zygote`): a plain `python -c` subprocess, not a
multiprocessing child, so a user's script without an `if __name__ == "__main__"` guard is never re-run in it and
nothing forks a process that holds CUDA or locks. It imports Triton's compiler, adopts the parent's Triton key
and imports torch (Triton 3.6's argument specializer imports it at a process's first compile) once, then forks a
worker per request; a worker talks to the parent over a socket pair the parent passed through the zygote,
compiles a one-line kernel for the graph's target (`_warm_up`) and serves jobs as plain tuples (pointer arguments
as dtype names), each with the parent's environment. Eight workers
each booting by itself slowed the parent's whole first call while they booted; a fork shares the booted memory.
Where no zygote can run, each worker boots by itself (`_serve`; also with PASSLINE_NO_ZYGOTE=1). The pool is
started once per process: its zygote as dynamo hands over a graph of GPU tensors (`Pool.start_soon`, so that it
boots while the graph is traced), its workers once a graph misses the graph cache (a warm process that loads
every graph from the caches forks none), and reused.

Failures never reach the user's call: a job that fails, a worker that dies, a pool that cannot start —
each leaves that kernel to be compiled in the parent, as without the pool.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pickle
import queue
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import attrs


def use_torch_ptxas(environ=os.environ, torch_dir: Path | None = None) -> str | None:
    """The ptxas Triton assembles passline's kernels with: the one a CUDA build of torch ships (`torch/bin/ptxas`),
    set as TRITON_PTXAS_PATH where the user has not set the variable (an empty value counts as set, as Inductor
    counts it); the user's where set; None (Triton's own) where torch ships none (a CPU build). Inductor sets the
    same at its first compile, so before this a kernel's binary depended on whether Inductor had compiled in the
    process first: on an H200 (torch 2.11+cu130, Triton 3.6) cross-entropy's windowed bfloat16 backward at 10872 x
    12345 took 321 µs assembled by Triton's ptxas and 139 by torch's (12.8 against 13.0), the same PTX (128 masked
    2-byte stores a thread); the other kernels its band timed within 3% either way (docs/benchmarks.md, fifty-ninth
    session). (Triton 3.9 assembles sm_90 and newer with its own `ptxas-blackwell`, TRITON_PTXAS_BLACKWELL_PATH:
    there the variable changes what it changes for Inductor, older GPUs' binaries.)

    Called when this module is imported — in the parent before its first compile, its Triton key or its compile
    workers (which inherit the environment, and import this module before their warm-up compile), so every
    process caches one ptxas version in Triton's key (`get_ptxas_version`, cached a process). torch's directory is
    found without importing torch (a worker imports it later)."""
    if environ.get("TRITON_PTXAS_PATH") is not None:
        return environ["TRITON_PTXAS_PATH"] or None
    if torch_dir is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        torch_dir = Path(spec.origin).parent
    ptxas = torch_dir / "bin" / "ptxas"
    if not (ptxas.is_file() and os.access(ptxas, os.X_OK)):
        return None
    environ["TRITON_PTXAS_PATH"] = str(ptxas)
    return str(ptxas)


use_torch_ptxas()


@attrs.frozen
class Job:
    """One kernel to compile: its module file, its function, the arguments it is specialized on (a
    pointer as its dtype's name: `"bfloat16"`; integers as they are) and the keyword arguments of the
    launch (block constexprs, `num_warps`, ...), sorted."""

    path: str
    fn_name: str
    args: tuple
    kwargs: tuple

    def kwargs_key(self) -> tuple:
        return self.args, self.kwargs


class _DType:
    """A torch dtype as Triton's specialization reads it (`str(dtype)`), without importing torch."""

    __module__ = "torch"

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__

    def __eq__(self, other):
        return str(self) == str(other)

    def __hash__(self):
        return hash(str(self))


_DType.__name__ = _DType.__qualname__ = "dtype"  # what MockTensor.wrap_dtype looks for


class _OfflineDriver:
    """What `JITFunction.run(warmup=True)` asks of Triton's driver, answered without a GPU."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


class offline:
    """Within: Triton's active driver is a stand-in that answers `target` (compile only; no launch)."""

    def __init__(self, target):
        self.target = target

    def __enter__(self):
        from triton.runtime.driver import driver

        self.saved = driver._active
        driver.set_active(_OfflineDriver(self.target))

    def __exit__(self, *exc):
        from triton.runtime.driver import driver

        driver._active = self.saved


def cuda_options(**wanted) -> dict:
    """Those of the compile options `wanted` that this Triton's NVIDIA backend has (a field of its CUDAOptions:
    Triton refuses a launch's keyword it does not know); none without that backend. (Here, not in compat.py, which
    imports torch: a worker's warm-up asks too.)"""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
        return {}
    return {k: v for k, v in wanted.items() if k in CUDAOptions.__dataclass_fields__}


def _args(job: Job) -> list:
    from triton.runtime.jit import MockTensor

    return [MockTensor(_DType(a[1])) if isinstance(a, tuple) else a for a in job.args]


def import_kernel(path: Path, fn_name: str, around=None):
    """The jitted function `fn_name` of the kernel module at `path`, imported once a process under the name
    every process gives it (`passline_kernels.<file stem>`: Triton's cache key does not depend on it, but one
    name keeps the parent's and the workers' imports alike); `around()`, where given, is the context the
    import runs in (cache.load_kernel: the interpreter's environment), entered only when it imports."""
    name = f"passline_kernels.{path.stem}"
    if name not in sys.modules:
        # one import a module, whichever of the precompile threads asks first: two threads importing it at once
        # made two jitted functions, the second compiling again what the first had (a hit in Triton's disk cache)
        with _IMPORTING:
            if name not in sys.modules:
                with around() if around is not None else contextlib.nullcontext():
                    spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                sys.modules[name] = module
    return getattr(sys.modules[name], fn_name)


_IMPORTING = threading.Lock()


def compile_job(job: Job, target):
    """Compile `job` for `target` into Triton's cache, in this process, within `offline(target)`; the
    CompiledKernel."""
    fn = import_kernel(Path(job.path), job.fn_name)
    cached = fn.device_caches.get(0)  # the stand-in device is always 0: a binder for another target goes
    if cached is not None and target not in cached:
        fn.device_caches.pop(0, None)
    return fn.warmup(*_args(job), grid=(1,), **dict(job.kwargs))


def build_launcher(kernel) -> None:
    """Triton 3.6's launcher for `kernel` built into Triton's cache, where this Triton builds one per signature.

    Triton 3.6 launches a binary through a C module generated for its kernel's signature (the pointer and scalar
    arguments, the constants) and built with the host's C compiler when the binary is first loaded
    (`CudaLauncher.__init__`: `make_launcher`, then `compile_module_from_src`, which keeps the module in Triton's
    cache under the hash of its source). A cold first call loaded its binaries in the parent and built each new
    signature's module there: on an H200 host BERT-style's first call spent 5.6 s in 22 such builds (cProfile,
    sixty-second session). Built here, in the worker that compiled the kernel, by Triton's own `CudaLauncher` (the
    same source, so the same cache entry), the parent's load finds it. Triton 3.9 has one launcher for every
    signature and no `make_launcher`: nothing to build. Only a cache warm-up: anything that fails is left to the
    parent's load, as before (PASSLINE_LAUNCHERS_IN_PARENT=1 leaves every build there, to measure)."""
    if os.environ.get(_LAUNCHERS_IN_PARENT) == "1":
        return
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
        return
    if not hasattr(nvidia, "make_launcher") or kernel is None:
        return
    with contextlib.suppress(Exception):
        nvidia.CudaLauncher(kernel.src, kernel.metadata)


def _key_module():
    """(name, module) of the Triton module that defines `triton_key` (its place moved between versions), or
    (None, None) where this Triton has none."""
    for name in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "triton_key", None)):
            return name, module
    return None, None


def triton_key() -> str | None:
    """This process's Triton key (`triton_key()`, part of every cache key: a hash of Triton's compiler sources
    and of libtriton, some 500 MB read whole), computed once a process; None where this Triton has none."""
    try:
        _, module = _key_module()
        return module.triton_key() if module is not None else None
    except Exception:  # noqa: BLE001 - a Triton whose key cannot be computed: each process its own
        return None


def _hash_triton_key() -> str | None:
    """Triton's key hashed now from its files, not a value memoized (or adopted) in this process."""
    name, module = _key_module()
    if module is None:
        return None
    fn = _ORIGINAL.get(name, module.triton_key)
    return getattr(fn, "__wrapped__", fn)()  # lru_cache's own function: no memoized value


_REMEMBERED: dict = {}  # cache directory -> the key this process took from it (once a process)
_REMEMBERING = threading.Lock()  # several runners' builds at once (the chooser's candidates) hash it once
_ORIGINAL: dict = {}  # module name -> Triton's own triton_key, before `_adopt_triton_key` replaced it


def remembered_triton_key(directory: Path) -> str | None:
    """This process's Triton key, kept in `directory` (passline's cache) under a stamp of Triton's installed
    files (each file's path, size and modification time, links followed): where the stamp matches, the stored
    key is taken (`_adopt_triton_key`) instead of hashing libtriton again (0.52 s of a fresh process's first
    compile on the H200 host under cProfile, 0.33 s on this CPU; the stamp 13 ms); else it is hashed afresh
    (never a value this process memoized earlier, which an upgrade since would have made stale) and stored
    where the stamp did not change while it was hashed. A changed Triton has another stamp, so its key is
    hashed afresh. As Triton's own key, it describes the files on disk: a process that loaded a Triton before
    it was upgraded in place gets the new one's key either way. None where this Triton has no key."""
    directory = Path(directory)
    with _REMEMBERING:
        if directory not in _REMEMBERED:
            _REMEMBERED[directory] = _remember_triton_key(directory)
        return _REMEMBERED[directory]


def _remember_triton_key(directory: Path) -> str | None:
    """`remembered_triton_key`'s work, once a directory."""
    key = None
    with contextlib.suppress(Exception):
        import json

        stamp = _triton_stamp()
        path = directory / "triton_key.json"
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: written again below
            stored = {}
        key = stored.get(stamp) if isinstance(stored, dict) else None
        if key is not None:
            _adopt_triton_key(key)
        else:
            key = _hash_triton_key()
            if key is not None and _triton_stamp() == stamp:
                directory.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({stamp: key}))  # one Triton at a time: the last one's
                os.replace(tmp, path)
    return key


def _triton_stamp(root: Path | None = None) -> str:
    """A digest of every file of the installed Triton package (relative path, size, modification time),
    through directory links as `triton_key()` reads its backends (a development install links them in): what
    that key hashes is among them. `root`: another package directory (tests)."""
    import hashlib

    import triton

    root = Path(triton.__file__).parent if root is None else Path(root)
    h = hashlib.sha256(triton.__version__.encode())
    for d, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            st = os.stat(os.path.join(d, f))
            h.update(f"{os.path.relpath(os.path.join(d, f), root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _adopt_triton_key(key: str) -> None:
    """Answer `key` from Triton's `triton_key()` in this process instead of hashing libtriton (as Triton's own
    warm-up pool does its workers': triton/_compile_warmup_pool.py): 0.52 s of a fresh process's first
    compile on the H200 host (cProfile), 0.33 s on this CPU. Process-wide: every Triton compile here uses
    it, Inductor's and a user's own kernels' too, which is right only because the key is this Triton's (the
    callers check: same files, `remembered_triton_key`; same package and version, `_serve`)."""
    for name, module in list(sys.modules.items()):
        # (and torch's own import of it, which its caches' keys name: aot_cache.share_triton_key)
        ours = name == "triton" or name.startswith("triton.") or name == "torch._inductor.runtime.triton_compat"
        if ours and callable(getattr(module, "triton_key", None)):
            _ORIGINAL.setdefault(name, module.triton_key)
            module.triton_key = lambda: key


# the kernel a worker compiles as it boots (`_warm_up`)
_WARM = """import triton
import triton.language as tl


@triton.jit
def passline_warm_up(x):
    tl.store(x, tl.load(x) + 1)
"""


def _warm_up(target) -> None:
    """Compile a one-line kernel for `target` as the worker boots, so that what a fresh process pays before
    its first compile — Triton 3.6's argument specializer imports torch (5-6 s on the H200 host, whose torch
    has no compiled bytecode: 8 workers' first jobs took 5.5-6.1 s, the next 0.05), the backend's ptxas
    query, the kernel module imports — is paid while the parent still traces its graph, not by a graph's
    first job. (Once the kernel is in Triton's cache a boot finds it there: the compiler's own passes are
    not warmed.) Anything that fails here is left to that job."""
    import tempfile

    with contextlib.suppress(Exception), tempfile.TemporaryDirectory() as d:
        path = Path(d) / "passline_warm_up.py"
        path.write_text(_WARM)
        with offline(target):
            options = {**cuda_options(enable_fp_fusion=True), "num_warps": 1}  # as compat.COMPILE_OPTIONS
            compile_job(Job(str(path), "passline_warm_up", (("ptr", "float32"),), tuple(sorted(options.items()))),
                        target)


def target_of(device) -> tuple | None:
    """The compile target of a CUDA `device` as (backend, arch, warp size), what GPUTarget takes; None
    without a CUDA device there."""
    try:
        import torch

        if getattr(torch.version, "hip", None):  # ROCm: not a CUDA target (the workers warm up for sm_90)
            return None
        major, minor = torch.cuda.get_device_capability(device)
        return ("cuda", 10 * major + minor, 32)
    except Exception:  # noqa: BLE001 - no CUDA here: the workers warm up for sm_90
        return None


# -- the worker ------------------------------------------------------------------------------------------
def _boot() -> None:
    """What every worker needs before its first job, imported (and Triton's key adopted) once."""
    import triton
    import triton.compiler  # noqa: F401 - the compiler's modules, loaded while the parent is still tracing

    given = os.environ.get(_KEY_ENV, "").split("\n")
    if len(given) == 3 and given[:2] == [triton.__file__, triton.__version__]:
        _adopt_triton_key(given[2])  # the parent's Triton is this one: its key is this one's


def _serve(inp=None, out=None) -> None:
    """A worker's loop: (a job's fields, target) in on `inp`, (ok, seconds, error) out on `out`: stdin and the
    protocol pipe (stdout as the process started) for a worker of its own, a socket's two ends for one forked
    by the zygote (`_zygote`, which booted already)."""
    if out is None:
        out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)  # anything printed while compiling goes to stderr, never into the protocol
        inp = sys.stdin.buffer
        _boot()
    from triton.backends.compiler import GPUTarget

    backend, arch, warp = os.environ.get(_TARGET_ENV, "cuda,90,32").split(",")
    _warm_up(GPUTarget(backend, int(arch), int(warp)))
    while True:
        try:
            fields, target, env = pickle.load(inp)
        except EOFError:
            return
        if env != os.environ:  # the parent's variables as of this job (`_compile_env`)
            os.environ.clear()
            os.environ.update(env)
        job = Job(*fields)
        t0 = time.perf_counter()
        try:
            with offline(target):
                kernel = compile_job(job, target)
            if target.backend == "cuda":
                build_launcher(kernel)
            result = (True, time.perf_counter() - t0, None)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which compiles it itself later
            result = (False, time.perf_counter() - t0, f"{type(e).__name__}: {e}"[:500])
        pickle.dump(result, out)
        out.flush()


# A worker runs this file as a module of its own, not `passline.backends.triton.precompile`: importing the
# package imports torch (passline/__init__), which took a worker 2-5 s to start where Triton alone takes 0.2,
# and 8 workers started at once by a graph's first compile made it 15 s (GPT-2-style on an H200 host: the
# forward's 7 kernels, 2.4 s in threads). So nothing here imports passline or torch at module level, and jobs
# travel as plain tuples (a pickled Job would import its module by name).
_BOOT = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('passline_compile_worker', "
         "sys.argv[1]); m = importlib.util.module_from_spec(s); sys.modules[s.name] = m; "
         "s.loader.exec_module(m); m._serve()")


def _zygote() -> None:
    """The process the pool's workers are forked from: it boots once what each worker would boot on its own
    (Triton's compiler and its key; torch, which Triton 3.6 imports at a process's first compile), then forks a
    worker per request and answers its pid. A request is one end of a socket pair the parent made, passed over
    the control socket it started the zygote with (`_Zygote`): no path, no listening socket anyone else could
    reach. Eight workers each booting by itself kept eight cores busy for seconds while the parent traced its
    graph, and every phase of the first call ran slower beside them (GPT-2-style's aot_autograd phase 3.3 s
    against 2.7 on the H200 host); a fork shares the booted process's memory. The zygote runs no compile (no
    thread of LLVM's or MLIR's exists when it forks: a worker warms up after the fork, `_warm_up`); it leaves when
    the parent closes the control socket or dies, a worker when its socket's other end closes."""
    import signal
    import socket

    os.dup2(2, 1)  # anything printed goes to stderr
    ctl = socket.socket(fileno=int(os.environ.pop(_CONTROL_ENV)))
    _boot()
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401 - Triton 3.6's argument specializer imports it at a process's first compile
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # a worker that ends is reaped by the system, not waited for
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        pid = os.fork()
        if pid == 0:  # the worker: its own socket to the parent, not the control socket
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                ctl.close()
                sock = socket.socket(fileno=fds[0])
                _serve(sock.makefile("rb"), sock.makefile("wb"))
            except BaseException:  # noqa: BLE001 - the parent sees the connection end, and replaces the worker
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        ctl.sendall(f"{pid}\n".encode())


_ZYGOTE_BOOT = _BOOT.replace("m._serve()", "m._zygote()")


_KEY_ENV = "PASSLINE_TRITON_KEY"
_TARGET_ENV = "PASSLINE_COMPILE_TARGET"
_NO_ZYGOTE = "PASSLINE_NO_ZYGOTE"  # "1": every worker boots by itself (as before the zygote; for A/B runs)
_LAUNCHERS_IN_PARENT = "PASSLINE_LAUNCHERS_IN_PARENT"  # "1": no worker builds launchers (build_launcher; A/B runs)


def _worker_env(key: str | None, target: tuple | None) -> dict:
    """The environment a worker (or the zygote) starts in: the jobs' (`_compile_env`), with the parent's key and
    the target it warms up for."""
    env = _compile_env()
    env.pop(_KEY_ENV, None)  # never a value this process itself inherited
    env.pop(_TARGET_ENV, None)
    if key:  # with the parent's Triton package and version: a worker importing another ignores it
        import triton

        env[_KEY_ENV] = "\n".join((triton.__file__, triton.__version__, key))
    if target:  # what the worker warms up for (`_warm_up`)
        env[_TARGET_ENV] = ",".join(map(str, target))
    return env


BOOT_TIMEOUT = 300.0  # seconds the zygote may take to boot (import Triton and torch) and answer a request
COMPILE_TIMEOUT = 600.0  # seconds a worker may take over one job before it is killed (and the job compiled here)
_CONTROL_ENV = "PASSLINE_ZYGOTE_CONTROL"  # the zygote's end of its control socket (a file descriptor)


class _Zygote:
    """The pool's zygote process (`_zygote`): `fork()` -> (a socket to a new worker, its pid)."""

    def __init__(self, key: str | None, target: tuple | None):
        import socket

        self.ctl, theirs = socket.socketpair()
        try:
            env = _worker_env(key, target) | {_CONTROL_ENV: str(theirs.fileno())}
            self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE_BOOT, str(Path(__file__).resolve())],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env, pass_fds=(theirs.fileno(),))
        except Exception:
            self.ctl.close()
            raise
        finally:
            theirs.close()
        self.ctl.settimeout(BOOT_TIMEOUT)  # answered once the zygote has booted: one that does not is given up
        self.lock = threading.Lock()

    def fork(self):
        import socket

        mine, theirs = socket.socketpair()
        try:
            with self.lock:  # one request at a time: the answer read is this request's
                socket.send_fds(self.ctl, [b"f"], [theirs.fileno()])
                answer = b""
                while not answer.endswith(b"\n"):
                    part = self.ctl.recv(64)
                    if not part:
                        raise ConnectionError("the compile workers' zygote is gone")
                    answer += part
        except Exception:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine, int(answer)

    def close(self) -> None:
        """Gone at once: the zygote writes nothing (its workers, which may, leave when their sockets close)."""
        with contextlib.suppress(Exception):
            self.ctl.close()
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=1.0)


def _compile_env() -> dict:
    """The environment a worker compiles a job in: this process's now (less TRITON_INTERPRET), handed over with
    each job, so that a variable set since the worker started (a TRITON_CACHE_DIR set later, as Inductor does
    where none is; a Triton knob's variable) reaches its compile as it would reach one here."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


class _Worker:
    """A compile worker: forked by the pool's zygote (a socket to it), else a process of its own (its pipes).
    A job not answered within COMPILE_TIMEOUT is an error (the worker is then killed and replaced)."""

    def __init__(self, key: str | None = None, target: tuple | None = None, zygote: _Zygote | None = None):
        self.proc = self.conn = self.pidfd = None
        if zygote is not None:
            self.conn, self.pid = zygote.fork()
            with contextlib.suppress(Exception):  # to kill it later without naming a pid the system may reuse
                self.pidfd = os.pidfd_open(self.pid)
            self.conn.settimeout(COMPILE_TIMEOUT)
            self.to, self.back = self.conn.makefile("wb"), self.conn.makefile("rb")
        else:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(Path(__file__).resolve())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env=_worker_env(key, target))
            self.pid, self.to, self.back = self.proc.pid, self.proc.stdin, self.proc.stdout

    def compile(self, job: Job, target) -> tuple:
        pickle.dump((attrs.astuple(job, recurse=False), target, _compile_env()), self.to)
        self.to.flush()
        if self.proc is not None:  # a pipe has no timeout of its own
            poll = select.poll()
            poll.register(self.back.fileno(), select.POLLIN)
            if not poll.poll(COMPILE_TIMEOUT * 1000):
                raise TimeoutError(f"a compile worker took more than {COMPILE_TIMEOUT:.0f} s over one job")
        return pickle.load(self.back)

    def close(self, timeout: float = 5.0) -> None:
        """Told to stop (the end of its input), then waited for where it is this process's child."""
        try:
            self.to.close()
            if self.proc is not None:
                self.proc.wait(timeout=timeout)
            else:
                self.back.close()
                self.conn.close()
                if self.pidfd is not None:
                    os.close(self.pidfd)
        except Exception:  # noqa: BLE001 - a worker that will not stop is killed
            self.kill()

    def kill(self) -> None:
        """Killed where it can be named safely (a child of this process; a forked worker through its pidfd, never
        by a pid the system may have given another process since), and its end of the connection closed, so a
        worker that cannot be killed leaves when its job ends."""
        import signal

        with contextlib.suppress(Exception):
            if self.proc is not None:
                self.proc.kill()
            elif self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(Exception):
            if self.conn is not None:
                self.conn.close()
        with contextlib.suppress(Exception):
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


class Pool:
    """Worker processes that compile kernels; `run(jobs, target, done)` -> [ok per job]."""

    def __init__(self, workers: int):
        self.size = workers
        self.idle: queue.Queue = queue.Queue()
        self.started = 0
        self.lock = threading.Lock()
        self.key_lock = threading.Lock()
        self.key: str | None = None
        self.target: tuple | None = None  # (backend, arch, warp size) the workers warm up for (`_warm_up`)
        self.key_dir: Path | None = None  # passline's cache, where the key may be kept (`remembered_triton_key`)
        self.zygote: _Zygote | None | bool = None  # started at the first worker's start; False: none can be
        self.zygote_lock = threading.Lock()
        self.closed = False  # after `close` (at the process's exit): no job runs, each is the caller's to compile

    def triton_key(self) -> str | None:
        """The parent's Triton key, handed to every worker (`_adopt_triton_key`): from passline's cache where
        the caller named it (as `TritonRunner.precompile` takes it, so it is hashed once at most), else
        this process's; once, here."""
        with self.key_lock:
            if self.key is None:
                self.key = remembered_triton_key(self.key_dir) if self.key_dir is not None else triton_key()
            return self.key

    def start_soon(self, target: tuple | None = None, key_dir: Path | None = None,
                   workers: bool = True) -> threading.Thread:
        """`start()` in a thread of its own: the Triton key's hashing (hashlib lets go of the GIL) and the
        workers' starts overlap what the caller does next (dynamo's graph traced by aot_autograd). `target`:
        what the workers warm up for (`target_of`); `key_dir`: passline's cache (`triton_key`). `workers=False`:
        the zygote alone, the workers forked later (`start`) or as jobs come (`_take`): for a graph whose
        compiled form may be loaded from a cache, where nothing may be compiled at all."""
        self.target = self.target or target
        self.key_dir = self.key_dir or key_dir
        def start():
            with contextlib.suppress(Exception):  # a pool that cannot start: the first compile finds out
                self.start() if workers else self._zygote()
        thread = threading.Thread(target=start, name="passline-compile-pool", daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        """Start every worker now (each imports Triton's compiler and warms up), so that a graph's first
        compile finds them running (`start_soon` calls it as a graph misses the graph cache)."""
        while True:
            with self.lock:
                if self.started >= self.size:
                    return
                self.started += 1
            self.idle.put(self._new())

    def _new(self) -> _Worker:
        """A new worker, counted in `started` by the caller: forked by the zygote, else (no fork or Unix sockets
        here, or a zygote that failed) a process of its own. One that cannot start is not counted (a count
        without a worker would leave `_take` waiting for it forever) and the error is the caller's."""
        try:
            zygote = self._zygote()
            if zygote:
                try:
                    return _Worker(zygote=zygote)
                except Exception:  # noqa: BLE001 - the zygote died, did not boot in time or cannot fork (its
                    with self.zygote_lock:  # answers would no longer match the requests): workers of their own
                        if self.zygote is zygote:
                            self.zygote = False
                    zygote.close()
            return _Worker(self.triton_key(), self.target)
        except Exception:
            with self.lock:
                self.started -= 1
            raise

    def _zygote(self) -> _Zygote | None:
        """The pool's zygote, started at the first call (with the parent's key and the workers' target); None
        where this system cannot fork (or it failed before)."""
        import socket

        with self.zygote_lock:
            if self.zygote is None:
                self.zygote = False
                if hasattr(os, "fork") and hasattr(socket, "AF_UNIX") and os.environ.get(_NO_ZYGOTE) != "1":
                    with contextlib.suppress(Exception):
                        self.zygote = _Zygote(self.triton_key(), self.target)
            return self.zygote or None

    def _take(self) -> _Worker:
        while True:
            try:
                return self.idle.get_nowait()
            except queue.Empty:
                pass
            with self.lock:
                grow = self.started < self.size
                if grow:
                    self.started += 1
            if grow:
                return self._new()
            try:  # a worker coming back, or one whose start (start_soon's thread) failed: look again
                return self.idle.get(timeout=0.2)
            except queue.Empty:
                continue

    def _one(self, job: Job, target) -> bool:
        if self.closed:
            return False
        w = self._take()
        try:
            ok, _, _ = w.compile(job, target)
        except Exception:  # noqa: BLE001 - the worker died or hung (COMPILE_TIMEOUT): replaced at the next job
            w.kill()
            with self.lock:
                self.started -= 1
            return False
        if self.closed:  # closed meanwhile: this worker is not kept either
            w.close(timeout=0.0)
        else:
            self.idle.put(w)
        return ok

    def _aim(self, target) -> None:
        """Workers started from here on warm up for `target` (where none was named before)."""
        with contextlib.suppress(AttributeError, TypeError):
            self.target = self.target or _as_tuple(target)

    def compile(self, job: Job, target) -> bool:
        """Compile `job` for `target` on a worker (started, or waited for, as needed); whether it did."""
        self._aim(target)
        return self._one(job, target)

    def run(self, jobs: list, target, done=None) -> list:
        self._aim(target)
        results = [False] * len(jobs)
        with ThreadPoolExecutor(max_workers=min(self.size, len(jobs)) or 1) as ex:
            futures = {ex.submit(self._one, j, target): i for i, j in enumerate(jobs)}
            for f in as_completed(futures):
                results[futures[f]] = f.result()
                if done is not None:
                    done()
        return results

    def close(self) -> None:
        """Stop the idle workers: every one told at once, then waited for together (2 s at most, then killed:
        Triton writes its cache atomically), so a process exits without waiting on each in turn; the zygote at
        once (it writes nothing). A job asked for later runs nowhere (`compile` answers False)."""
        self.closed = True
        workers = []
        while True:
            try:
                workers.append(self.idle.get_nowait())
            except queue.Empty:
                break
        for w in workers:
            with contextlib.suppress(Exception):
                w.to.close()
        end = time.perf_counter() + 2.0
        for w in workers:
            w.close(timeout=max(0.0, end - time.perf_counter()))
        with self.zygote_lock:
            if self.zygote:
                self.zygote.close()
            self.zygote = False


_POOL: Pool | None = None
_POOL_MADE = threading.Lock()  # threads asking at once (the chooser's candidates' builds) get one pool


def pool(workers: int | None = None) -> Pool:
    """The process's pool of compile workers (started once, reused)."""
    global _POOL
    with _POOL_MADE:
        if _POOL is None:
            _POOL = Pool(workers or default_workers())
            atexit.register(_POOL.close)
        return _POOL


def default_workers() -> int:
    """One worker per core the process may use but one (the parent's, which plans the stages and loads the
    binaries), at most 32 (Inductor's bound, `compile_threads`). A worker is forked from the booted zygote, so
    it costs no boot. On the 16-core H200 host (forty-fifth session, cold first calls) 15 workers against 8:
    GPT-2-style's backward precompile (70 binaries) 2.5–3.1 s against 3.4–3.7, ResNet-style's (117) 2.9
    against 3.8, the forwards' 1.2 against 1.3 and 1.8 against 2.3; 8 workers were busy 4 at a time on
    average (the plan's later stages wait for earlier binaries), 15 about 6."""
    return max(1, min(32, _cores() - 1))


def default_threads() -> int:
    """The threads compiling a graph's kernels with compile_in="threads": one per core, at most 8 (Triton's
    compiler holds the GIL for much of its time, so more threads add waits, not compiles)."""
    return max(1, min(8, _cores()))


def _cores() -> int:
    """The cores this process may use: those it may run on, shared with the other ranks of this host where a
    launcher started several (torchrun's LOCAL_WORLD_SIZE) and left each the whole machine, so that eight
    ranks do not start 8 × 32 workers; a launcher that pinned each rank to cores of its own has shared them."""
    total = os.cpu_count() or 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = total
    try:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        ranks = 1
    if ranks > 1 and cores >= total:
        cores //= ranks
    return max(1, cores)


def _triton_cache_dir() -> str:
    """Where Triton keeps compiled binaries in this process (its knob, else its variable, else its default)."""
    with contextlib.suppress(Exception):
        from triton import knobs

        return str(knobs.cache.dir)
    return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


def _as_tuple(target) -> tuple:
    """A compile target as (backend, arch, warp size): a GPUTarget's fields, or such a tuple as it is."""
    return (target.backend, target.arch, target.warp_size) if hasattr(target, "arch") else tuple(target)


def _records(jobs: list, target, directory: Path) -> list:
    """Where `mark_compiled` records each of `jobs`: a job is its kernel file (named by the digest of what it was
    generated from) and its specialization; Triton's key, the target and Triton's cache directory, the same for
    every job, make the binary's place."""
    from .cache import digest

    directory = Path(directory)
    where = digest(_as_tuple(target), remembered_triton_key(directory), _triton_cache_dir())
    return [directory / "compiled" / f"j{digest(j, where)}" for j in jobs]


def not_compiled_yet(jobs: list, target, directory: Path) -> list:
    """The `jobs` no process recorded as compiled into this Triton cache for `target` (`mark_compiled`): what a
    second process hands the pool. Every binary of a graph compiled before is then loaded by the parent's
    threads from Triton's cache without the workers (whose boot a warm first call would otherwise wait for).
    A record whose binary went from Triton's cache since costs that binary's compile in the parent."""
    return [j for j, path in zip(jobs, _records(jobs, target, directory)) if not path.exists()]


def mark_compiled(jobs: list, target, directory: Path) -> None:
    """Record `jobs` as compiled into Triton's cache for `target` (empty files, in passline's cache)."""
    with contextlib.suppress(OSError):
        for path in _records(jobs, target, directory):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()


def compile_jobs(jobs: list, how: str = "pool", workers: int | None = None, target=None, done=None) -> list:
    """Compile `jobs` for `target` (default: sm_90) `how`: "serial", "threads" (in this process) or
    "pool" (worker processes); [ok per job]."""
    if target is None:
        from triton.backends.compiler import GPUTarget

        target = GPUTarget("cuda", 90, 32)
    if how == "pool":
        return pool(workers).run(jobs, target, done)

    def one(job):
        try:
            compile_job(job, target)
            return True
        except Exception:  # noqa: BLE001
            return False
        finally:
            if done is not None:
                done()
    with offline(target):  # one stand-in driver for every thread (the driver is global)
        if how == "serial":
            return [one(j) for j in jobs]
        with ThreadPoolExecutor(max_workers=workers or default_workers()) as ex:
            return list(ex.map(one, jobs))
