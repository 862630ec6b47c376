"""Compiling a graph's kernels ahead of the first launch in worker processes (backends/triton/precompile.py),
for an H100/H200 (sm_90) on this machine: Triton compiles without a GPU."""
import os
import textwrap

import pytest
import torch

import passline
from passline.backends.triton import precompile
from passline.backends.triton.cache import KernelCache
from passline.backends.triton.precompile import Job, Pool, compile_job, offline
from passline.backends.triton.runner import TritonRunner


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
    monkeypatch.setattr(TritonRunner, "_precompile", lambda self: None)
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


def attrs_tuple(job):
    return job.path, job.fn_name, job.args, job.kwargs


def test_a_failing_job_or_a_dying_worker_is_reported_not_raised(tmp_path, target, triton_cache):
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def good(p, n, XBLOCK: tl.constexpr):
            i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
            tl.store(p + i, tl.load(p + i, mask=i < n) * 2, mask=i < n)
        """))
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


@pytest.mark.parametrize("compile_in", ["processes", "threads"])
def test_precompile_never_fails_the_call(tmp_path, monkeypatch, compile_in):
    # whatever goes wrong (the pool cannot start; a thread's warmup finds no usable driver), the runner's
    # _precompile returns and the kernels are left to their first launch
    runner = _runner(tmp_path, monkeypatch, lambda x: x.exp() + 1, [torch.randn(8, 8)])
    monkeypatch.undo()  # the real _precompile
    assert runner.precompile_jobs()

    def broken(*a, **k):
        raise OSError("cannot start a process")

    monkeypatch.setattr(precompile, "compile_jobs", broken)
    from triton.runtime.driver import driver

    monkeypatch.setattr(driver, "_active", _FakeDriver())
    with passline.settings(compile_in=compile_in):
        runner._precompile()
    assert runner.compile_seconds >= 0


class _FakeDriver:
    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def test_workers_default_to_the_cores_at_most_eight():
    assert 1 <= precompile.default_workers() <= min(8, os.cpu_count() or 1)
