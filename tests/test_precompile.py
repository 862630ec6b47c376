"""Compiling a graph's kernels ahead of the first launch in worker processes (backends/triton/precompile.py),
for an H100/H200 (sm_90) on this machine: Triton compiles without a GPU."""
import json
import os
import pathlib
import textwrap

import pytest
import torch

import passline
from passline.backends.triton import compat, precompile
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.precompile import Job, Pool, compile_job, offline
from passline.backends.triton.runner import TritonRunner, _spec
from passline.testing import assert_matches_eager


@pytest.fixture
def target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # workers compile for the GPU in any case
    return tmp_path / "triton"


def _runner(tmp_path, monkeypatch, fn, inputs):
    """A GPU runner (kernels generated for sm_90, not for the interpreter) for fn's forward graph, built on
    the CPU: nothing compiled while it is made."""
    be = passline.backend(codegen="reference", fallback="raise")
    torch._dynamo.reset()
    torch.compile(fn, backend=be)(*inputs)
    monkeypatch.setattr(TritonRunner, "precompile", lambda self: None)
    return TritonRunner(be.reports[0].graph, interpret=False, cache=KernelCache(tmp_path / "passline"))


def test_workers_compile_what_the_launch_finds(tmp_path, monkeypatch, target, triton_cache):
    # LayerNorm's forward: a reduction and pointwise work, float32 and bfloat16 pointers
    ln = torch.nn.LayerNorm(64).to(torch.bfloat16)
    runner = _runner(tmp_path, monkeypatch, lambda x: ln(x).float().exp(), [torch.randn(32, 64, dtype=torch.bfloat16)])
    jobs = runner.precompile_jobs()
    assert jobs and all(a[0] == "ptr" for j in jobs for a in j.args if isinstance(a, tuple))
    pool = Pool(2)
    try:
        ok = pool.run(jobs, target)
    finally:
        pool.close()
    if not any(ok):
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    assert all(ok)
    # the parent's launch path (JITFunction.run, here with warmup=True: no GPU to launch on) with real,
    # aligned tensors builds the same cache key: every compile is a cache hit, nothing is compiled twice.
    # In a fresh process, as the parent on a GPU machine: this one imported Triton for its interpreter
    assert _launch_hits(jobs, triton_cache) == [True] * len(jobs)


_LAUNCH = """
import json, sys
from pathlib import Path
import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from passline.backends.triton.cache import load_kernel
from passline.backends.triton.precompile import offline
seen = []
knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
with offline(GPUTarget("cuda", 90, 32)):
    for path, name, args, kwargs in json.loads(sys.stdin.read()):
        fn = load_kernel(Path(path), name, False)
        args = [torch.empty(16, dtype=getattr(torch, a[1])) if isinstance(a, list) else a for a in args]
        fn.run(*args, grid=(1,), warmup=True, **dict(kwargs))
print(json.dumps(seen))
"""


def _launch_hits(jobs, cache) -> list:
    import json
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(cache)}
    env["PYTHONPATH"] = str(Path(passline.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _LAUNCH], input=json.dumps([list(attrs_tuple(j)) for j in jobs]),
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def attrs_tuple_target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


def attrs_tuple(job):
    return job.path, job.fn_name, job.args, job.kwargs


# a kernel module of one function, `name`, that doubles n floats
_DOUBLE = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def {name}(p, n, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(p + i, tl.load(p + i, mask=i < n) * 2, mask=i < n)
    """)


def test_a_failing_job_or_a_dying_worker_is_reported_not_raised(tmp_path, target, triton_cache):
    good = tmp_path / "good.py"
    good.write_text(_DOUBLE.format(name="good"))
    dying = tmp_path / "dying.py"
    dying.write_text("import os\nos._exit(3)\n")  # the worker process dies while loading the kernel
    jobs = [Job(str(tmp_path / "missing.py"), "f", (), ()),
            Job(str(dying), "f", (), ()),
            Job(str(good), "good", (("ptr", "float32"), 100), (("XBLOCK", 128), ("num_warps", 4)))]
    pool = Pool(1)  # one worker: the good job runs after the others, on a replacement for the dead one
    try:
        ok = pool.run(jobs, target)
    finally:
        pool.close()
    assert ok[:2] == [False, False]
    if not ok[2]:
        with pytest.raises(Exception), offline(target):  # noqa: B017  # the good job fails only where Triton cannot compile
            compile_job(jobs[2], target)
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")


def test_a_worker_starts_without_torch_and_the_pool_can_start_early(tmp_path, target, triton_cache):
    # importing the passline package imports torch (2-5 s a worker; 8 at once took a GPT-2's first 7 kernels
    # 15 s on an H200 host): a worker runs precompile.py as a module of its own, which imports no torch (a
    # compile may: Triton 3.6's specializer does), and takes its jobs as plain tuples. Pool.start() boots every
    # worker at once (dynamo's first graph does it with compile_in="processes"); the jobs then run on them.
    import subprocess
    import sys

    kernel = tmp_path / "k.py"
    kernel.write_text(_DOUBLE.format(name="k"))
    jobs = [Job(str(kernel), "k", (("ptr", "float32"), 100), (("XBLOCK", xb), ("num_warps", 4))) for xb in (64, 128)]
    probe = precompile._BOOT.replace("m._serve()", (
        "import triton.compiler; booted = 'torch' in sys.modules\n"
        "from triton.backends.compiler import GPUTarget; t = GPUTarget('cuda', 90, 32); ok = True\n"
        "try:\n    with m.offline(t): m.compile_job(m.Job(*sys.argv[2:4], (('ptr', 'float32'), 100), "
        "(('XBLOCK', 64), ('num_warps', 4))), t)\nexcept Exception: ok = False\nprint(ok, booted)"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe, precompile.__file__, str(kernel), "k"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == "False", out.stdout + out.stderr[-2000:]
    pool = Pool(2)
    try:
        pool.start()
        assert pool.started == 2 and pool.idle.qsize() == 2
        booted = {w.pid for w in list(pool.idle.queue)}
        ok = pool.run(jobs, target)
        assert {w.pid for w in list(pool.idle.queue)} == booted  # the jobs ran on those workers
    finally:
        pool.close()
    later = Pool(1)  # as dynamo starts it: in a thread of its own, which returns at once
    try:
        later.start_soon(workers=False).join(timeout=120)  # the zygote alone (dynamo's handover)
        assert later.started == 0 and later.zygote is not None
        later.start_soon().join(timeout=120)  # the workers (a graph-cache miss)
        assert later.started == 1 and later.idle.qsize() == 1
    finally:
        later.close()
    if out.stdout.split()[0] == "False":
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    assert ok == [True, True]


def test_workers_take_the_parents_triton_key_and_warm_up_for_its_target(tmp_path, monkeypatch, target,
                                                                         triton_cache):
    # a worker computing Triton's key itself hashes libtriton before its first job (0.5 s on the H200 host):
    # the pool hands it the parent's, which it takes where it imports the same Triton (package and version).
    # A binary compiled under another key is filed where the parent's launch never looks: a worker handed a
    # wrong key is missed (it used the key it was given), one handed the parent's is found, and one handed a
    # key for another Triton ignores it (found). The workers warm up for the target `run` gives them.
    import json

    import triton

    kernel = tmp_path / "k.py"
    kernel.write_text(_DOUBLE.format(name="k"))
    jobs = [Job(str(kernel), "k", (("ptr", "float32"), 100), (("XBLOCK", xb), ("num_warps", 4)))
            for xb in (64, 128, 256)]
    ok = []
    for job, key, version in zip(jobs, ("not Triton's key", precompile.triton_key(), "not Triton's key"),
                                 (triton.__version__, triton.__version__, "0.0-another")):
        pool = Pool(1)
        pool.key = key
        try:
            with monkeypatch.context() as m:
                m.setattr(triton, "__version__", version)  # what the worker is told the parent's is
                ok += pool.run([job], attrs_tuple_target(80) if job is jobs[0] else target)
        finally:
            pool.close()
    if not any(ok):
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    assert ok == [True, True, True]
    assert _launch_hits(jobs, triton_cache) == [False, True, True]
    warmed = {json.loads(p.read_text())["target"]["arch"] for p in triton_cache.rglob("passline_warm_up.json")}
    assert warmed == {80, 90}


_KEY_PROBE = """
import importlib.util, json, sys
import triton.runtime.cache as tc
s = importlib.util.spec_from_file_location("probe_precompile", sys.argv[3])
P = importlib.util.module_from_spec(s); s.loader.exec_module(P)
real = tc.triton_key
if sys.argv[2] == "other":
    P._triton_stamp = lambda root=None: "another Triton"
key = P.remembered_triton_key(sys.argv[1])
print(json.dumps([key == real(), tc.triton_key is not real]))
"""


def test_the_triton_key_is_remembered_for_the_same_triton(tmp_path):
    # hashing libtriton took 0.5 s of a fresh process's first compile on the H200 host: a second process with
    # the same Triton files takes the key stored by the first (and Triton then answers it), equal to the one
    # Triton computes; a Triton whose files differ (another stamp) computes its own. (precompile.py alone:
    # the passline package would import torch, seconds a process)
    import json
    import subprocess
    import sys

    def probe(stamp: str) -> list:
        out = subprocess.run([sys.executable, "-c", _KEY_PROBE, str(tmp_path), stamp, precompile.__file__],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.splitlines()[-1])

    assert probe("same") == [True, False]  # the first process computes it and stores it
    assert (tmp_path / "triton_key.json").exists()
    assert probe("same") == [True, True]  # the second takes it: Triton's triton_key now answers it
    assert probe("other") == [True, False]  # another Triton's files: computed, not taken


def test_the_triton_stamp_follows_its_files_and_their_links(tmp_path):
    # what the remembered key is filed under: every file's path, size and modification time, through the
    # directory links a development install makes for its backends
    pkg, elsewhere = tmp_path / "triton", tmp_path / "third_party"
    (pkg / "compiler").mkdir(parents=True)
    (elsewhere / "nvidia").mkdir(parents=True)
    (pkg / "compiler" / "compiler.py").write_text("a = 1\n")
    (elsewhere / "nvidia" / "compiler.py").write_text("b = 1\n")
    (pkg / "backends").mkdir()
    (pkg / "backends" / "nvidia").symlink_to(elsewhere / "nvidia", target_is_directory=True)
    first = precompile._triton_stamp(pkg)
    assert precompile._triton_stamp(pkg) == first
    (elsewhere / "nvidia" / "compiler.py").write_text("b = 22\n")  # behind the link: another size
    second = precompile._triton_stamp(pkg)
    assert second != first
    os.utime(pkg / "compiler" / "compiler.py", ns=(0, 0))  # the same bytes, touched: another stamp
    assert precompile._triton_stamp(pkg) != second


def test_the_pool_takes_the_key_kept_in_passlines_cache(monkeypatch, tmp_path):
    # started by dynamo, the pool takes Triton's key as the runner's precompile does (from passline's cache),
    # so a process hashes libtriton once at most; without the cache named, this process's own key
    asked = []
    monkeypatch.setattr(precompile, "remembered_triton_key", lambda d: asked.append(d) or "kept")
    monkeypatch.setattr(precompile, "triton_key", lambda: "hashed")
    named, bare = Pool(1), Pool(1)
    named.key_dir = tmp_path
    assert (named.triton_key(), named.triton_key(), bare.triton_key()) == ("kept", "kept", "hashed")
    assert asked == [tmp_path]  # once


def test_a_failed_background_start_leaves_no_job_waiting(monkeypatch, target):
    # start_soon counts its workers before starting them; one that fails to start is uncounted, and a job
    # waiting for a worker then starts one itself rather than waiting forever
    import threading

    starts = []

    class Failing:
        def __init__(self, *args):
            starts.append(threading.current_thread().name)
            if len(starts) == 1:
                import time

                time.sleep(0.5)  # the job below is waiting by now
                raise OSError("cannot start a process")
            self.proc = None

        def compile(self, job, target):
            return True, 0.0, None

    monkeypatch.setattr(precompile, "_Worker", Failing)
    pool = Pool(1)
    pool.key = "k"
    pool.start_soon()
    done = []
    runner = threading.Thread(target=lambda: done.append(pool.run([Job("p", "f", (), ())], target)), daemon=True)
    runner.start()
    runner.join(timeout=20)
    assert done == [[True]] and len(starts) == 2 and pool.started == 1


def test_dynamo_starts_the_workers_for_a_gpu_graph_with_compile_in_processes(monkeypatch):
    # the dynamo backend boots the pool as a graph of CUDA tensors arrives (FakeTensors here: no GPU), with
    # compile_in="processes" only, not for the reference codegen nor autotune=True (nothing compiled ahead),
    # and a pool that cannot start is not the user's error
    from torch._subclasses.fake_tensor import FakeTensorMode

    from passline.backends.dynamo import _start_compile_workers

    started = []

    class Stub:
        def start_soon(self, target=None, key_dir=None, workers=True):  # Pool.start in a thread of its own
            started.append((target, key_dir, workers))
            if len(started) > 2:
                raise OSError("no processes left")
    monkeypatch.setattr(precompile, "pool", lambda workers=None: Stub())
    monkeypatch.setattr(precompile, "target_of", lambda device: ("target of", str(device)))
    with FakeTensorMode():
        gpu = [torch.empty(4, device="cuda")]
    cpu = [torch.empty(4)]
    with passline.settings(compile_in="processes"):
        on, ref, tuned = passline.backend(), passline.backend(codegen="reference"), passline.backend(autotune=True)
    with passline.settings(compile_in="threads"):
        threads = passline.backend()
    for be, inputs in ((on, cpu), (ref, gpu), (tuned, gpu), (threads, gpu)):
        _start_compile_workers(be, inputs)
    assert started == []
    _start_compile_workers(on, gpu, workers=False)
    _start_compile_workers(on, gpu)
    _start_compile_workers(on, gpu)  # raises inside: kept from the caller
    # what the workers warm up for (the graph device's target), and where their key is kept (passline's cache)
    where = (("target of", "cuda:0"), pathlib.Path(on.cache_dir))
    assert started == [(*where, False), (*where, True), (*where, True)]


def test_the_workers_start_at_a_graph_cache_miss_only(tmp_path, monkeypatch):
    # dynamo's handover boots the zygote alone; the workers are forked once a graph must be lowered and
    # scheduled: a process whose graphs all come from the graph cache forks none
    import passline.backends.dynamo as dynamo

    calls = []
    real = dynamo._start_compile_workers
    monkeypatch.setattr(dynamo, "_start_compile_workers",
                        lambda be, inputs, workers=True: (calls.append(workers), real(be, inputs, workers)))

    def f(x, w):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w).relu()

    def inputs():
        torch.manual_seed(0)
        return [torch.randn(8, 16, requires_grad=True), torch.randn(16, requires_grad=True)]

    with passline.settings(graph_cache=True, aot_cache=False):
        assert_matches_eager(f, inputs(), cache_dir=str(tmp_path))
        assert calls == [False, True, True]  # the handover; the forward's and the backward's misses
        calls.clear()
        hit = assert_matches_eager(f, inputs(), cache_dir=str(tmp_path))
    assert [r.metrics.counters.get("graph_cache_hits", 0) for r in hit.reports] == [1, 1]
    assert calls == [False]


@pytest.mark.parametrize("compile_in", ["processes", "threads"])
def test_precompile_never_fails_the_call(tmp_path, monkeypatch, compile_in):
    # whatever goes wrong (the pool cannot start; a thread's warmup finds no usable driver), the runner's
    # precompile returns and the kernels are left to their first launch
    runner = _runner(tmp_path, monkeypatch, lambda x: x.exp() + 1, [torch.randn(8, 8)])
    monkeypatch.undo()  # the real precompile
    assert runner.precompile_jobs()

    def broken(*a, **k):
        raise OSError("cannot start a process")

    monkeypatch.setattr(precompile, "compile_jobs", broken)
    from triton.runtime.driver import driver

    monkeypatch.setattr(driver, "_active", _FakeDriver())
    asked = []  # (and Triton's key is not adopted in this test process)
    monkeypatch.setattr(precompile, "remembered_triton_key", asked.append)
    with passline.settings(compile_in=compile_in):
        runner.precompile()
    assert runner.compile_seconds >= 0
    # the key from passline's cache (remembered there: asked again by the record of compiled jobs, not hashed)
    assert asked and set(asked) == {runner.cache.dir}


class _FakeDriver:
    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def test_workers_default_to_the_cores_but_the_parents_at_most_32(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for cores, workers, threads in ((1, 1, 1), (2, 1, 2), (16, 15, 8), (128, 32, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert (precompile.default_workers(), precompile.default_threads()) == (workers, threads)
    # ranks of one host (torchrun) share its cores, unless the launcher pinned each to its own
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert precompile.default_workers() == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))  # pinned: 16 of its own
    assert precompile.default_workers() == 15
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert precompile.default_workers() == 7


# -- the plan: what is compiled ahead is what the first call's launches use --------------------------------
class _NoLaunch:
    """A kernel's JITFunction whose launches (a binary not compiled ahead) do nothing: on the CPU nothing
    runs, and the test counts them (`kernels_compiled_at_launch`)."""

    def __init__(self, fn):
        self.fn = fn

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        return lambda *a, **k: None


def _first_call_plan(monkeypatch, tmp_path, fn, inputs, backward=True, calls=1, after_call=None):
    """Compile `fn` with GPU kernels for CPU tensors (as benchmarks/first_call.py does), with a stand-in
    for the GPU's compile: each planned binary gets a launcher that records its key, and a compiled kernel
    of 255 registers a thread (a mix-order split is placed from it as on a GPU: a few programs an SM).
    Then the first call (forward and backward; `calls` calls) runs those launchers. Returns (planned,
    launched: (kernel, key, grid, arguments) a launch, reports)."""
    from types import SimpleNamespace

    from passline.backends import dynamo as pdynamo
    from passline.backends.triton import runner as prunner

    planned, launched = [], []

    def build(p):
        if p is None:
            raise prunner._Unplanned

        def launch(grid0, stream, *args, _p=p):
            launched.append((_p.kernel, _p.key, grid0, args))

        p.kernel.install(p.key, launch, p.consts, p.nfull, p.variant)
        planned.append(p)
        return SimpleNamespace(n_regs=255, n_spills=0, metadata=SimpleNamespace(shared=0))

    def precompile(self):
        for step in self.steps:
            self._first_launches(step, build)

    real_fn = prunner.Kernel.fn
    monkeypatch.setattr(pdynamo, "_on_cpu", lambda graph: False)
    monkeypatch.setattr(TritonRunner, "precompile", precompile)
    monkeypatch.setattr(prunner.Kernel, "fn", lambda self, v: _NoLaunch(real_fn(self, v)))
    be = passline.backend(codegen="triton", fallback="raise", cache_dir=str(tmp_path / "passline"))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=be)
    for i in range(calls):
        out = compiled(*inputs)
        if backward:
            out.sum().backward()
        if after_call is not None:
            after_call(i)
    return planned, launched, be.reports


CASES = {  # (by rule: the tests below turn configs.uncertain's timed bands off, `_by_rule`)
    "layer_norm": (lambda: torch.nn.LayerNorm(200), lambda: [torch.randn(20000, 200, requires_grad=True)]),
    "softmax": (lambda: torch.nn.Softmax(-1), lambda: [torch.randn(64, 300, requires_grad=True)]),
    "gelu_mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)),
                 lambda: [torch.randn(16, 32, requires_grad=True)]),
    "cross_entropy": (lambda: (lambda x, t: torch.nn.functional.cross_entropy(x, t)),
                      lambda: [torch.randn(64, 1000, requires_grad=True), torch.randint(0, 1000, (64,))]),
}


def _by_rule(monkeypatch):
    """No timed band (configs.uncertain): every kernel launches its rule's configuration, so the first call
    launches each kernel once (a band's first launch also runs its candidates: test_precompile's band tests)."""
    from passline.backends.triton import runner as prunner

    monkeypatch.setattr(prunner, "uncertain", lambda *a, **kw: [])


@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_is_what_the_first_call_launches(tmp_path, monkeypatch, case):
    from passline.backends.triton.runner import MixKernel

    _by_rule(monkeypatch)
    make, inputs = CASES[case]
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), inputs())
    assert launched and [r.name.rstrip("0123456789") for r in reports] == ["forward", "backward"]
    # every launch found a binary planned ahead, under the key its launch computed
    for r in reports:
        assert r.metrics.counters["kernels_compiled_at_launch"] == 0, r.runner.source
        assert "0 at launch" in r.summary() and "by record" not in r.summary()
    reports[0].metrics.counters["binaries_loaded_by_record"] = 3  # as a warm process's precompile counts them
    assert "compiled ahead (3 loaded by record), 0 at launch" in reports[0].summary()
    keys = {(id(p.kernel), p.key) for p in planned}
    ran = {(id(k), key) for k, key, *_ in launched}
    assert ran <= keys
    # one binary a launch: what was planned and never launched is only a mix-order main kernel compiled at
    # the IR's split to read its registers (its launch takes the whole-wave split placed from them)
    extra = [p for p in planned if (id(p.kernel), p.key) not in ran]
    assert all(isinstance(p.kernel, MixKernel) and p.key.split == p.kernel.split for p in extra), extra
    launching = {id(k) for r in reports for k in _kernels(r.runner)}
    assert {i for i, _ in ran} == launching  # every kernel of both graphs, finishing kernels included
    if case == "layer_norm":
        mixes = [k for r in reports for k in _kernels(r.runner) if isinstance(k, MixKernel)]
        assert mixes, reports[-1].graph.format()
        fin = [k for r in reports for k in _kernels(r.runner) if k.info.kind == "mix_finish"]
        assert fin and all(any(i == id(k) for i, _ in ran) for k in fin)
        # the split placed from the registers (one whole wave), not the IR's, and its binary planned too
        (main_key,) = [key for k, key, *_ in launched if isinstance(k, MixKernel)]
        assert main_key.split != mixes[0].split and extra
    # the listing (no GPU: a mix-order split left at the IR's) has one job a launched binary
    assert len({p.job for p in planned if (id(p.kernel), p.key) in ran}) <= len(ran)


def _kernels(runner):
    for kind, _, data in runner.steps:
        if kind == "kernel":
            yield data[0]
        elif kind == "mix":
            yield data[0]
            yield data[2]


@pytest.mark.parametrize("case", ["layer_norm", "cross_entropy"])
def test_later_calls_replay_the_first_calls_launches(tmp_path, monkeypatch, case):
    """A launch settled on its first call (configuration chosen, binary loaded, nothing specialized per
    call) is replayed from `Kernel.ready` on the next: the same binaries, grids and arguments in the same
    order, without choosing again — mix-order steps (their split, finishing kernel) included."""
    from passline.backends.triton.runner import Kernel, MixStep

    chosen, marks = [], []
    for cls, name in ((Kernel, "config"), (MixStep, "_choose")):
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _real=real, **kw: chosen.append(self) or _real(self, *a, **kw))
    _by_rule(monkeypatch)
    make, inputs = CASES[case]
    _, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), inputs(), calls=3,
                                            after_call=lambda i: marks.append(len(chosen)))
    per_call = len(launched) // 3
    assert per_call and len(launched) == 3 * per_call

    def shape(launch):
        k, key, grid0, args = launch
        return id(k), key, grid0, [(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
    first, second, third = (launched[i * per_call:(i + 1) * per_call] for i in range(3))
    assert [shape(x) for x in second] == [shape(x) for x in first] == [shape(x) for x in third]
    kernels = [k for r in reports for k in _kernels(r.runner)]
    assert all(k.ready for k in kernels), [k.info.name for k in kernels if not k.ready]
    assert marks[0] > 0 and marks[2] == marks[0], marks  # nothing chosen again after the first call
    if case == "layer_norm":
        steps = [data for r in reports for kind, _, data in r.runner.steps if kind == "mix"]
        assert steps  # a mix-order step was among the replays


def _bare_kernel():
    from passline.backends.triton.runner import Kernel

    k = Kernel.__new__(Kernel)
    k.interpret, k.ready, k.binaries, k.checked, k.per_launch, k.last = False, {}, {}, set(), set(), None
    k.replay_sizes, k.windows, k.column_group = (), {}, 0
    return k


def test_a_launch_specialized_per_call_is_not_replayed():
    """An argument whose specialization may change between calls (an extern's result that may be a
    misaligned view) keeps the full launch path: a replay would reuse the first call's binary. The
    element counts are the replay's key, so their specialization never blocks it."""
    from passline.backends.triton.configs import Config, Variant

    k = _bare_kernel()
    cfg = Config(Variant.POINTWISE, xblock=1024, warps=4)
    buffers = (torch.empty(8), torch.empty(8))
    k.check = (1,)  # the second pointer
    k.binaries[(cfg, None, (True,))] = (lambda *a: None, ())
    k._settle(cfg, buffers, 4096, None, False)
    assert not k.ready
    k.check = (2,)  # the element count: 4096 is divisible by 16, not 1, fits 32 bits
    k.binaries[(cfg, None, ((True, False, False),))] = (lambda *a: None, ())
    k._settle(cfg, buffers, 4096, None, False)
    assert list(k.ready) == [(4096, None, False)] and k.ready[4096, None, False][1] == 4  # 4096 / 1024 programs


def test_run_time_size_arguments_key_the_replay():
    """A run-time size among a dynamic kernel's arguments (a row stride) is specialized per call too, but
    it is a number: its value joins the replay's key (every launch of such a kernel took the full path,
    ~30 µs of host each, and dynamic steps issued 0.1-0.2 ms slower than static ones)."""
    from passline.backends.triton.configs import Config, Variant

    k = _bare_kernel()
    cfg = Config(Variant.POINTWISE, xblock=1024, warps=4)
    k.check = (1, 2)  # a size argument and the element count
    for stride in (30000, 30001):
        k.binaries[(cfg, None, (_spec(stride), _spec(4096)))] = (lambda *a: None, ())
        k._settle(cfg, (torch.empty(8), stride), 4096, None, False)
    assert k.replay_sizes == (1,)
    assert set(k.ready) == {(4096, None, False, 30000), (4096, None, False, 30001)}


@pytest.mark.parametrize("width, fast", [(12345, (2048, 16)), (30000, (16384, 32))], ids=["8193-16384", "wider"])
def test_rows_no_rule_decides_are_timed_once_then_remembered(tmp_path, monkeypatch, width, fast):
    """Rows 8193-16384 wide, and wider ones, with a row per SM at least (configs.uncertain): with
    autotuning off, every candidate configuration is built ahead of the first call, the first launch times
    them and takes the fastest, and a later process finds that choice on disk: it builds only that binary
    and times nothing. Narrower rows whose rows start on 16-byte boundaries (the rule decides) are never timed
    (odd ones time configs._window_band: tests/test_odd_widths.py). Past 16384 the rule's own chunk
    is among the candidates (in the first band it never won: not timed)."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.configs import Config, Variant

    def cfg_of(key):
        return key if isinstance(key, Config) else key[0]

    fast = Config(Variant.LOOPED, 1, *fast)
    timed = []

    def bench(self, c, *args, **kwargs):
        timed.append(c)
        return 0.1 if c == fast else 0.3
    monkeypatch.setattr(prunner.Kernel, "_bench", bench)
    x = torch.randn(200, width, requires_grad=True)
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, torch.nn.Softmax(-1), [x])
    band = [k for r in reports for k in _kernels(r.runner) if k.uncertain(200, width)]
    assert len(band) == 2, [k.info.name for r in reports for k in _kernels(r.runner)]  # forward and backward
    for k in band:
        cands = k.uncertain(200, width)
        # wider: four chunks on 32 warps or fewer, 4096 on 16, the row held whole on 16 and 32, the rule's chunk;
        # rows off 16-byte boundaries (12345 floats) also the windowed block (configs._window_config) on its warps
        # and half of them
        assert len(cands) in ((6,) if width <= 16384 else (7, 8)) and fast in cands
        assert width <= 16384 or k._rule(200, width) in cands
        assert {cfg_of(p.key) for p in planned if p.kernel is k} == set(cands)  # all built ahead
        assert k.choices[k.bucket(200, width)] == fast and set(k.info.timings) and k.info.chosen == "looped"
        assert [cfg_of(key) for kk, key, *_ in launched if kk is k][-1] == fast  # the call ran the choice
        assert set(cands) <= set(timed)
    assert sum(r.metrics.counters["kernel_choices_timed"] for r in reports) == 2
    assert all(r.metrics.counters["kernels_compiled_at_launch"] == 0 for r in reports)

    timed.clear()  # a second process: the stored choice, built alone, nothing timed
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, torch.nn.Softmax(-1), [x])
    assert not timed
    assert {cfg_of(p.key) for p in planned if p.kernel.uncertain(200, width)} == {fast}
    assert sum(r.metrics.counters["kernel_choices_timed"] for r in reports) == 0

    # a later passline's band with one more candidate: the choice stored among fewer is not taken, the band
    # is timed again (the twenty-fifth session added chunks of 2048 on 8 warps, which a stored choice hid)
    extra = Config(Variant.LOOPED, 1, 1024, 4)
    band_of = prunner.uncertain
    monkeypatch.setattr(prunner, "uncertain", lambda *a, **kw: band_of(*a, **kw) and band_of(*a, **kw) + [extra])
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, torch.nn.Softmax(-1), [x])
    assert extra in timed and sum(r.metrics.counters["kernel_choices_timed"] for r in reports) == 2
    timed.clear()

    planned, _, _ = _first_call_plan(monkeypatch, tmp_path, torch.nn.Softmax(-1),
                                     [torch.randn(200, 8000, requires_grad=True)])
    assert not timed and planned and not any(p.kernel.uncertain(200, 8000) for p in planned)


def _gelu_bias(h, b):
    return torch.nn.functional.gelu(h + b)


def _rms_norm_bf16():
    from modules import RMSNorm

    return RMSNorm(64).to(torch.bfloat16)


# tall mix-order kernels no rule decides (configs.uncertain's mix band), bfloat16: the module, its inputs'
# (rows, width) and bias, the (rows a block, warps) the stand-in timing makes fastest
MIX_BAND = {  # (function, shape, a bias input, the candidate the stand-in times fastest: (rows, warps), its form)
    "rms_norm_backward": (_rms_norm_bf16, (20000, 64), False, (8, 1), "mix_order_acc2d"),
    # a pointwise row side: a narrow block of the tiled form (32 rows of 64 columns on 4 warps), planned and
    # timed as the whole-row forms are
    "bias_gradient": (lambda: _gelu_bias, (20000, 384), True, (32, 4), "mix_order_tiled"),
}


def test_the_leaders_are_timed_again_at_every_whole_wave_split():
    """MixKernel._fastest_split: each candidate timed at one whole wave; the leaders (within 10% of the
    fastest) again at the IR's split and at each of their whole-wave splits, a slower one not; the fastest
    of all those kept, here the first leader at four waves (RMSNorm's backward on an H200: 217 µs at four
    waves against 240 at one)."""
    from types import SimpleNamespace

    from passline.backends.triton.configs import Config, Variant
    from passline.backends.triton.runner import MixKernel

    k = MixKernel.__new__(MixKernel)  # the method alone: timings stood in
    k.split, k.info = 128, SimpleNamespace(timings={})
    a, b, slow = (Config(Variant.MIX_ORDER_ACC2D, xb, 64, 1, 4, 128) for xb in (8, 4, 2))
    first = [(1.00, a.with_split(500)), (1.05, b.with_split(480)), (2.00, slow.with_split(500))]
    waves = {a.with_split(0): [500, 250, 167, 125], b.with_split(0): [480, 240], slow.with_split(0): [500]}
    k._at_one_wave = lambda *args: (first, waves)
    benched = []

    def bench(c, *args, **kw):
        benched.append(c)
        return {(8, 125): 0.80, (8, 167): 0.85, (4, 240): 0.95}.get((c.xblock, c.split), 1.1)
    k._bench = bench
    best = k._fastest_split([a, b, slow], (), 2_000_000, 64, None, None)
    assert best == a.with_split(125)
    again = {(c.xblock, c.split) for c in benched}
    assert {(8, 128), (8, 250), (8, 167), (8, 125), (4, 128), (4, 240)} <= again
    assert not any(c.xblock == 2 for c in benched)  # not a leader: timed once, at one wave
    assert all(f"{c} +finish" in k.info.timings for c in benched)


@pytest.mark.parametrize("case", list(MIX_BAND))
def test_tall_mix_order_kernels_are_timed_over_waves_once_then_remembered(tmp_path, monkeypatch, case):
    """A tall mix-order kernel no rule decides (configs.uncertain: narrow rows reduced, a bias gradient's
    rows of 257-4096), autotuning off: every candidate is built ahead at the IR's split, its one to four
    whole waves found from that binary's registers and built there, with the finishing kernel for each;
    the first launch times each candidate at one wave followed by the finishing kernel, the leader again
    at its other splits, compiling nothing, and keeps the fastest;
    a later process builds only the stored choice and times nothing. Fewer rows keep the rule, and so do a
    kernel that writes a graph input and one whose split the pipeline fixed."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.runner import MixKernel

    make, (rows, width), bias, fast, form = MIX_BAND[case]

    def cfg_of(key):
        return key[0] if isinstance(key, tuple) else key

    timed = []

    def bench(self, c, args, xnumel, rnumel, stream, after=None, rep=prunner.SCREEN_MS):  # as do_bench's
        if not isinstance(self, MixKernel):
            return 0.2  # (the forward's row kernel, 64 wide, times a band of its own: any pick will do here)
        src = next(iter(self.info.variants.values()))
        ws = [a for (kind, name), a in zip(src.args, args) if kind == "buffer" and name.endswith("_ws")]
        assert ws and all(a.shape[0] >= -(-xnumel // c.split) for a in ws)  # a workspace row a program
        self.launch(c, stream, args, xnumel, rnumel)
        after(c)
        timed.append(c)
        return 0.1 if (c.xblock, c.warps) == fast else 0.3
    monkeypatch.setattr(prunner.Kernel, "_bench", bench)

    def inputs(n):
        x = torch.randn(n, width, dtype=torch.bfloat16, requires_grad=True)
        return [x, torch.randn(width, dtype=torch.bfloat16, requires_grad=True)] if bias else [x]

    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), inputs(rows), calls=3)
    (k,) = [k for r in reports for k in _kernels(r.runner) if isinstance(k, MixKernel)]
    cands = k.uncertain(rows, width)
    assert 3 <= len(cands) <= 6 and cands[0] == k._rule(rows, width) and all(c.split == k.split for c in cands)
    (fast_cfg,) = [c for c in cands if (c.xblock, c.warps) == fast]
    # built ahead: each candidate at the IR's split and at one to four whole waves (the stand-in's 255
    # registers a thread leave a few programs an SM), the finishing kernel for each count of programs
    waves = {c: k.placements[rows, c] for c in cands}
    assert set(k.placements) == {(rows, c) for c in cands} and all(w[0] != k.split for w in waves.values())
    every = {c.with_split(s) for c, w in waves.items() for s in w if c.xblock <= s}
    assert {cfg_of(p.key) for p in planned if p.kernel is k} == set(cands) | every
    programs = {-(-rows // c.split) for c in set(cands) | every}  # the finishing kernel's rows (its rnumel)
    assert {p.job.args[-1] for p in planned if p.kernel.info.kind == "mix_finish"} == programs
    # timed: every candidate at its one-wave split, then the leader (the one fast candidate) at the IR's
    # split and its other waves, the finishing kernel after each; the fastest kept
    first = {c.with_split(w[0]) for c, w in waves.items()}
    again = {fast_cfg} | {fast_cfg.with_split(s) for s in waves[fast_cfg] if fast_cfg.xblock <= s}
    assert set(timed) == first | again and len(set(timed)) > len(first)
    chosen = k.choices[k.bucket(rows, width)]
    assert chosen in again and k.info.chosen == form and chosen in k.timed
    # the first call ran the choice, and the two after it replayed it (timed once)
    assert [cfg_of(key) for kk, key, *_ in launched if kk is k][-3:] == [chosen] * 3
    # (the forward's row kernel, 64 wide, has a timed band of its own: counted in the forward's report)
    assert sum(r.metrics.counters["kernel_choices_timed"] for r in reports if k in _kernels(r.runner)) == 1
    assert not any("timing failed" in kk.info.timings for r in reports for kk in _kernels(r.runner))
    assert all(r.metrics.counters["kernels_compiled_at_launch"] == 0 for r in reports)  # finishes included
    assert k.saved_choice(rows, width) == chosen
    # a graph input written, or a split the pipeline fixed: the rule
    k.mutates = True
    assert k.uncertain(rows, width) == []
    k.mutates, k.tune_split = False, False
    assert k.uncertain(rows, width) == []

    timed.clear()  # a second process: the stored choice, built alone, nothing timed
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), inputs(rows))
    (k,) = [k for r in reports for k in _kernels(r.runner) if isinstance(k, MixKernel)]
    assert not timed and {cfg_of(p.key) for p in planned if p.kernel is k} == {chosen}
    assert [cfg_of(key) for kk, key, *_ in launched if kk is k] == [chosen]
    assert sum(r.metrics.counters["kernel_choices_timed"] for r in reports if k in _kernels(r.runner)) == 0
    assert all(r.metrics.counters["kernels_compiled_at_launch"] == 0 for r in reports)

    # fewer rows than 64 an SM (16 for a bias gradient): the rule's block, placed, nothing timed
    from passline.backends.triton.configs import MIX_BAND_ROWS_PER_SM, MIX_POINTWISE_BAND_ROWS_PER_SM
    few = (MIX_POINTWISE_BAND_ROWS_PER_SM if bias else MIX_BAND_ROWS_PER_SM) * k.device.sms - 1
    planned, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), inputs(few))
    (k,) = [k for r in reports for k in _kernels(r.runner) if isinstance(k, MixKernel)]
    assert not timed and not k.uncertain(few, width) and not k.placements
    assert {cfg_of(p.key).with_split(0) for p in planned if p.kernel is k} == {k._rule(few, width).with_split(0)}


def test_timing_launches_run_on_a_copy_of_storage_written_in_place():
    """A kernel may write an output over a buffer it reads (wrapper.alloc): its timing launches, which run
    before the call's own, get a private copy of that storage (same offsets, sizes and strides, still
    shared between the two arguments), so the call's data is as it was for the real launch; arguments
    over storages of their own are passed as they are."""
    from passline.backends.triton.runner import _private

    base = torch.arange(24.0)
    read, written = base[2:14].view(3, 4), base[2:14].view(3, 4).t()
    other = torch.ones(5)
    args = (read, other, written, 7)
    timed = _private(args)
    assert timed[1] is other and timed[3] == 7
    for a, b in ((timed[0], read), (timed[2], written)):
        assert a.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
        assert (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(), b.storage_offset())
        assert torch.equal(a, b)
    assert timed[0].untyped_storage().data_ptr() == timed[2].untyped_storage().data_ptr()
    timed[2].fill_(-1.0)  # what a timing launch writes
    assert torch.equal(base, torch.arange(24.0))  # ... never reaches the call's own data
    assert _private((read, other, 3)) == (read, other, 3)  # nothing shared: as they are


def test_a_timing_that_fails_leaves_the_rule_and_stores_nothing(tmp_path, monkeypatch):
    """Timing the candidates can fail (no memory for the private copy, or for do_bench's buffer): the
    launch then takes the rule's configuration, as with autotuning off before, and no choice is stored, so
    the user's call never fails for it."""
    from passline.backends.triton import runner as prunner

    def bench(self, c, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("no memory to time")
    monkeypatch.setattr(prunner.Kernel, "_bench", bench)
    x = torch.randn(200, 12345, requires_grad=True)
    _, _, reports = _first_call_plan(monkeypatch, tmp_path, torch.nn.Softmax(-1), [x])
    band = [k for r in reports for k in _kernels(r.runner) if k.uncertain(200, 12345)]
    assert band
    for k in band:
        assert k.choices[k.bucket(200, 12345)] == k._rule(200, 12345) and "timing failed" in k.info.timings
        assert k.saved_choice(200, 12345) is None


def test_a_mix_order_timing_that_fails_leaves_the_rule_placed(tmp_path, monkeypatch):
    """... a tall mix-order kernel's too: the rule's block at the one-wave split its binary gives (placed
    ahead), and nothing stored."""
    from passline.backends.triton import runner as prunner
    from passline.backends.triton.runner import MixKernel

    def bench(self, c, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("no memory to time")
    monkeypatch.setattr(prunner.Kernel, "_bench", bench)
    make, (rows, width), *_ = MIX_BAND["rms_norm_backward"]
    x = torch.randn(rows, width, dtype=torch.bfloat16, requires_grad=True)
    _, launched, reports = _first_call_plan(monkeypatch, tmp_path, make(), [x])
    (k,) = [k for r in reports for k in _kernels(r.runner) if isinstance(k, MixKernel)]
    rule = k._rule(rows, width)
    assert k.uncertain(rows, width) and "timing failed" in k.info.timings and k.saved_choice(rows, width) is None
    placed = k.choices[k.bucket(rows, width)]
    assert placed == rule.with_split(k.placements[rows, rule][0]) and placed.split != k.split
    assert [key for kk, key, *_ in launched if kk is k][-1] == placed
    assert all(r.metrics.counters["kernels_compiled_at_launch"] == 0 for r in reports)


def test_a_second_process_hands_the_pool_only_what_none_compiled(tmp_path, monkeypatch, target):
    """compile_in="processes": jobs recorded as compiled (into this Triton cache, for this target, by this
    Triton) are not handed to the workers again — a warm first call loads them in the parent's threads
    without waiting for the pool to boot; another target, Triton cache or Triton compiles them."""
    from triton.backends.compiler import GPUTarget

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(precompile, "remembered_triton_key", lambda d: "key-a")
    jobs = [Job(str(tmp_path / f"k{i}.py"), "kernel", (("ptr", "float32"), 1024), (("num_warps", 4),))
            for i in range(3)]
    cache = tmp_path / "passline"
    assert precompile.not_compiled_yet(jobs, target, cache) == jobs
    precompile.mark_compiled(jobs[:2], target, cache)  # the third failed in the pool: compiled at its launch
    assert precompile.not_compiled_yet(jobs, target, cache) == jobs[2:]
    assert precompile.not_compiled_yet(jobs, GPUTarget("cuda", 80, 32), cache) == jobs
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert precompile.not_compiled_yet(jobs, target, cache) == jobs
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(precompile, "remembered_triton_key", lambda d: "key-b")  # another Triton
    assert precompile.not_compiled_yet(jobs, target, cache) == jobs


# a process's precompile of LayerNorm's forward for sm_90, on this CPU (Triton's stand-in driver: compiles, cannot
# load): each binary handed to a stand-in loader; Triton's key a fixed string (not hashed, nor adopted process-wide
# as `remembered_triton_key` would); with "record only", a load through JITFunction.warmup fails the run
_RECORDED = """
import hashlib, json, sys
import torch, passline
from triton.backends.compiler import GPUTarget
from passline.backends.triton import compat, precompile
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.precompile import offline
from passline.backends.triton.runner import TritonRunner
real = TritonRunner.precompile
TritonRunner.precompile = lambda self: None
ln = torch.nn.LayerNorm(64)
be = passline.backend(codegen="reference", fallback="raise")
torch.compile(lambda x: ln(x).exp(), backend=be)(torch.randn(32, 64))
runner = TritonRunner(be.reports[0].graph, interpret=False, cache=KernelCache(sys.argv[1]))
loaded = []
precompile.remembered_triton_key = lambda directory: "this triton"
compat.load_binary = lambda compiled: loaded.append(compiled) or (lambda *args: None)
if sys.argv[2] == "record only":
    def no_warmup(*args, **kwargs):
        raise AssertionError("loaded through JITFunction.warmup")
    compat.compile_for_launch = no_warmup
with offline(GPUTarget("cuda", 90, 32)):
    real(runner)
def seen(c):
    s = c.src
    return repr((c.hash, c.name, hashlib.sha256(c.kernel).hexdigest(), c.metadata, s.name, sorted(s.signature.items()),
                 sorted(s.constants.items()), list(s.fn.arg_names)))
from passline.backends.triton.runner import Kernel
tails = sorted(repr((k.key, v[1])) for s in runner.steps if s[0] in ("kernel", "mix") for k in s[2]
               if isinstance(k, Kernel) for v in k.binaries.values())
imported = sorted(m for m in sys.modules if m.startswith("passline_kernels."))
print(json.dumps({"jobs": len(runner.precompile_jobs()), "counters": dict(runner.counters),
                  "loaded": sorted(map(seen, loaded)), "tails": tails, "imported": imported}))
"""


def _recorded_run(cache, triton_cache, how: str) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    env |= {"TRITON_CACHE_DIR": str(triton_cache), "PYTHONPATH": str(Path(passline.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", _RECORDED, str(cache), how], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # every compile asks for floating-point contraction itself (compat.COMPILE_OPTIONS): Triton 3.9 warns where a
    # compile leaves it to its default, which 3.10 turns off
    assert "TRITON_DEFAULT_FP_FUSION" not in out.stderr, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_binary_compiled_once_is_loaded_by_its_record_in_a_later_process(tmp_path, triton_cache):
    first = _recorded_run(tmp_path / "passline", triton_cache, "compile")
    if not first["loaded"]:
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    assert first["counters"]["kernels_precompiled"] == first["jobs"] == len(first["loaded"])
    assert first["counters"].get("binaries_loaded_by_record", 0) == 0
    assert len(list((tmp_path / "passline").glob("b*.json"))) == first["jobs"]
    # a later process: every binary from its record, none through JITFunction.warmup, the same binaries with
    # the same launch signature, constants and parameters
    second = _recorded_run(tmp_path / "passline", triton_cache, "record only")
    assert second["counters"]["binaries_loaded_by_record"] == second["counters"]["kernels_precompiled"] == first["jobs"]
    assert second["loaded"] == first["loaded"]
    # ... installed with the same constexprs after the signature, and no kernel module imported (Triton reads and
    # hashes a jitted function's source when its module is: a warm process needs none of them)
    assert second["tails"] == first["tails"] and len(first["tails"]) >= first["jobs"]
    assert first["imported"] and not second["imported"]
    # an entry gone from Triton's cache (evicted; another cache directory): loaded as without a record
    records = [json.loads(p.read_text()) for p in (tmp_path / "passline").glob("b*.json")]
    assert all(compat.load_recorded(r) is not None for r in records)
    for f in triton_cache.rglob("*.cubin"):
        f.unlink()
    assert all(compat.load_recorded(r) is None for r in records)
    assert compat.load_recorded(None) is None
    third = _recorded_run(tmp_path / "passline", triton_cache, "compile")
    assert third["counters"].get("binaries_loaded_by_record", 0) == 0 and third["loaded"] == first["loaded"]

def test_the_record_of_a_binary_is_keyed_by_every_setting_of_the_compile(monkeypatch, target):
    from triton import knobs

    stamp = compat.binary_stamp(target, "this triton")
    assert stamp is not None and stamp == compat.binary_stamp(target, "this triton")
    assert compat.binary_stamp(target, "another triton") != stamp
    assert compat.binary_stamp(attrs_tuple_target(80), "this triton") != stamp
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # a compile option's default
    assert compat.binary_stamp(target, "this triton") not in (None, stamp)
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    monkeypatch.setenv("TRITON_DEBUG", "1")  # not one of Triton's cache-invalidating variables, yet an option
    assert compat.binary_stamp(target, "this triton") not in (None, stamp)
    monkeypatch.delenv("TRITON_DEBUG")
    monkeypatch.setenv("DISABLE_PTXAS_OPT", "1")  # one of Triton's cache-invalidating variables without its prefix
    assert compat.binary_stamp(target, "this triton") not in (None, stamp)
    monkeypatch.delenv("DISABLE_PTXAS_OPT")
    assert compat.binary_stamp(target, "this triton") == stamp
    # a knob set from Python; a listener or hook that sees compiles: Triton's own path
    monkeypatch.setattr(knobs.nvidia, "ptxas_options", "-v")
    assert compat.binary_stamp(target, "this triton") not in (None, stamp)
    monkeypatch.undo()
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: None)
    assert compat.binary_stamp(target, "this triton") is None


_ROUTED = """
import json, sys
import torch, passline
from triton import knobs
from triton.backends.compiler import GPUTarget
from passline.backends.triton import compat, precompile
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.precompile import offline
from passline.backends.triton.runner import TritonRunner
real = TritonRunner.precompile
TritonRunner.precompile = lambda self: None
ln = torch.nn.LayerNorm(64)
be = passline.backend(codegen="reference", fallback="raise")
x = torch.randn(65536, 64, requires_grad=True)  # tall: its mix-order backward is timed (configs.uncertain)
torch.compile(lambda x: ln(x).exp().sum(), backend=be)(x).backward()
runner = TritonRunner(be.reports[-1].graph, interpret=False, cache=KernelCache(sys.argv[1]))
precompile.remembered_triton_key = lambda directory: "this triton"
compat.load_binary = lambda compiled: (lambda *args: None)
seen, by_worker = [], []
knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
pool = precompile.pool(2)
one = pool.compile
pool.compile = lambda job, target: by_worker.append(job) or one(job, target)
with passline.settings(compile_in="processes"), offline(GPUTarget("cuda", 90, 32)):
    real(runner)
print(json.dumps({"listed": len(runner.precompile_jobs()), "built": runner.counters["kernels_precompiled"],
                  "by_worker": len(set(by_worker)),
                  "hits": seen.count(True), "misses": seen.count(False)}))
"""


@pytest.mark.parametrize("workers", ["start", "cannot start"])
def test_with_compile_in_processes_every_binary_is_compiled_by_a_worker(tmp_path, triton_cache, workers):
    # each precompile thread hands its compile to a worker (forked by the pool's zygote) and finds the binary in
    # Triton's cache: the plan's later stages included (a timed mix-order kernel's candidates placed from their
    # first binaries' registers, the finishing kernels), which the pool never saw when it compiled the
    # `precompile_jobs` list alone (5 of the 13 binaries here)
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(triton_cache)}
    env["PYTHONPATH"] = str(Path(passline.__file__).resolve().parents[1])
    script = _ROUTED
    if workers == "cannot start":  # (fork failing for want of memory or processes): each compiled in its thread
        script = script.replace("pool.compile = lambda job, target: by_worker.append(job) or one(job, target)",
                                "def broken(job, target):\n    raise OSError(11, 'Resource temporarily unavailable')\n"
                                "pool.compile = broken")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "passline")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    if not got["built"]:
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    if workers == "start":
        assert got["by_worker"] == got["built"] > got["listed"] and got["misses"] == 0
    else:
        assert got["by_worker"] == got["hits"] == 0 and got["misses"] and got["built"] > got["listed"]


def test_a_worker_that_hangs_is_given_up_and_a_closed_pool_takes_no_job(tmp_path, monkeypatch, target):
    # a job whose worker does not answer within COMPILE_TIMEOUT is the caller's again (compiled in its thread),
    # the worker killed (never by a pid the system may have reused: its pidfd); after `close` (the process's
    # exit) a job runs nowhere, at once
    import time

    hangs = tmp_path / "hangs.py"
    hangs.write_text("import time\ntime.sleep(600)\n")  # the worker imports it to compile its kernel
    monkeypatch.setattr(precompile, "COMPILE_TIMEOUT", 3.0)
    pool = Pool(1)
    try:
        t0 = time.perf_counter()
        assert pool.compile(Job(str(hangs), "f", (), ()), target) is False
        assert time.perf_counter() - t0 < 120 and pool.started == 0
    finally:
        pool.close()
    t0 = time.perf_counter()
    assert pool.compile(Job(str(hangs), "f", (), ()), target) is False
    assert pool.run([Job("p", "f", (), ())], target) == [False]
    assert time.perf_counter() - t0 < 1.0


def test_a_worker_compiles_in_the_environment_of_its_job(tmp_path, monkeypatch, target):
    # workers are forked from a zygote started with the environment of its time; each job carries the caller's
    # (a TRITON_CACHE_DIR set later, as Inductor sets one where none is): the binary goes where the caller's
    # launch looks for it
    kernel = tmp_path / "k.py"
    kernel.write_text(_DOUBLE.format(name="k"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "first"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pool = Pool(1)
    try:
        pool.start()
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "later"))
        ok = pool.compile(Job(str(kernel), "k", (("ptr", "float32"), 100), (("XBLOCK", 64), ("num_warps", 4))), target)
    finally:
        pool.close()
    if not ok:
        pytest.skip("Triton cannot compile for CUDA here (no ptxas?)")
    assert list((tmp_path / "later").rglob("k.cubin")) and not list((tmp_path / "first").rglob("k.cubin"))


def test_threads_asking_at_once_get_one_pool_and_one_triton_key(monkeypatch, tmp_path):
    """The chooser builds several candidates' binaries from threads of their own (choosing._build_side_by_side):
    the first to ask for the compile pool or for Triton's key may be any of them. One pool is made, and the key
    is hashed once (an unlocked check-then-make gave four pools, each growing its own workers)."""
    import threading
    import time

    made, hashed = [], []

    class SlowPool:
        def __init__(self, workers):
            time.sleep(0.05)  # a window for the others to find no pool yet
            made.append(self)

        def close(self):
            pass

    def slow_hash():
        time.sleep(0.05)
        hashed.append(1)
        return "key"

    monkeypatch.setattr(precompile, "_POOL", None)
    monkeypatch.setattr(precompile, "Pool", SlowPool)
    monkeypatch.setattr(precompile, "_REMEMBERED", {})
    monkeypatch.setattr(precompile, "_hash_triton_key", slow_hash)
    got = []
    start = threading.Barrier(4)

    def ask():
        start.wait()
        got.append((precompile.pool(2), precompile.remembered_triton_key(tmp_path)))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(hashed) == 1
    assert got == [(made[0], "key")] * 4
    assert json.loads((tmp_path / "triton_key.json").read_text()) == {precompile._triton_stamp(): "key"}


def test_kernels_are_assembled_by_torchs_ptxas_where_torch_ships_one(tmp_path):
    """precompile.use_torch_ptxas: where a CUDA build of torch ships `bin/ptxas` (executable), Triton is pointed at it
    (TRITON_PTXAS_PATH), whether or not Inductor compiled in the process first (Inductor sets the same at its first
    compile, and a binary's speed depended on it: docs/benchmarks.md, fifty-ninth session); a path the user set is
    kept, an empty one too (as Inductor keeps it); a torch without one (a CPU build), or one not executable, leaves
    Triton's own."""
    from passline.backends.triton import precompile
    from passline.backends.triton.precompile import use_torch_ptxas

    (tmp_path / "bin").mkdir()
    ptxas = tmp_path / "bin" / "ptxas"
    env = {}
    assert use_torch_ptxas(env, tmp_path) is None and env == {}  # none shipped
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(0o644)
    assert use_torch_ptxas(env, tmp_path) is None and env == {}  # not executable
    ptxas.chmod(0o755)
    assert use_torch_ptxas(env, tmp_path) == str(ptxas) and env == {"TRITON_PTXAS_PATH": str(ptxas)}
    mine = {"TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}
    assert use_torch_ptxas(mine, tmp_path) == "/opt/cuda/bin/ptxas"
    assert mine == {"TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}
    empty = {"TRITON_PTXAS_PATH": ""}
    assert use_torch_ptxas(empty, tmp_path) is None and empty == {"TRITON_PTXAS_PATH": ""}
    # set when the compile module is imported: before any compile worker can start (they live in it, and each
    # imports it before its warm-up compile) and before compat's launch-time compiles (compat imports it)
    assert "use_torch_ptxas()" in {line.strip() for line in pathlib.Path(precompile.__file__).read_text().splitlines()}


def test_a_worker_builds_the_launcher_where_triton_builds_one_per_signature(monkeypatch):
    """precompile.build_launcher, which a worker runs after compiling a kernel for a GPU: where this Triton's NVIDIA
    driver generates and builds a launcher per kernel signature (Triton 3.6: `make_launcher`), Triton's own
    `CudaLauncher` is made for the compiled kernel, so that its module is in Triton's cache when the parent loads the
    binary; nothing where the driver has none (Triton 3.9), under PASSLINE_LAUNCHERS_IN_PARENT=1, or for no kernel;
    a build that fails is left to the parent, never raised."""
    from types import SimpleNamespace

    from triton.backends.nvidia import driver as nvidia

    built = []

    class Launcher:
        def __init__(self, src, metadata):
            if src == "bad":
                raise RuntimeError("gcc failed")
            built.append((src, metadata))

    monkeypatch.setattr(nvidia, "CudaLauncher", Launcher)
    monkeypatch.delenv("PASSLINE_LAUNCHERS_IN_PARENT", raising=False)
    kernel = SimpleNamespace(src="src", metadata="meta")
    monkeypatch.delattr(nvidia, "make_launcher", raising=False)
    precompile.build_launcher(kernel)
    assert built == []  # one launcher for every signature: nothing to build
    monkeypatch.setattr(nvidia, "make_launcher", lambda *a: "", raising=False)
    precompile.build_launcher(kernel)
    assert built == [("src", "meta")]
    precompile.build_launcher(None)
    precompile.build_launcher(SimpleNamespace(src="bad", metadata="meta"))
    monkeypatch.setenv("PASSLINE_LAUNCHERS_IN_PARENT", "1")
    precompile.build_launcher(kernel)
    assert built == [("src", "meta")]
