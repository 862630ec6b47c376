"""aot_autograd's cache for passline's graphs (backends/aot_cache.py): a later compile of the same captured graph
(another process, or this one after `torch._dynamo.reset()`) loads aot_autograd's result and the scheduled graphs
instead of tracing, partitioning, lowering and scheduling again, and trains as eager does; what passline's result
depends on makes another key; what cannot be rebuilt is not kept."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters

import passline
from passline.backends import aot_cache

pytestmark = pytest.mark.skipif(not aot_cache.available(), reason="this torch lacks aot_autograd's bundled cache")


@pytest.fixture(autouse=True)
def _caches(tmp_path, monkeypatch):
    """Empty caches of this test's own: aot_autograd's (under Inductor's directory) and passline's; the cache on
    (as by default, unless the environment turned it off)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with passline.settings(graph_cache=True, aot_cache=True, cache_dir=str(tmp_path / "passline")):
        yield


class Block(torch.nn.Module):
    """LayerNorm, a linear layer, GELU; BatchNorm's running statistics are written by the graph (a mutation)."""

    def __init__(self, d=32):
        super().__init__()
        self.norm, self.fc, self.bn = torch.nn.LayerNorm(d), torch.nn.Linear(d, d), torch.nn.BatchNorm1d(d)

    def forward(self, x):
        return self.bn(torch.nn.functional.gelu(self.fc(self.norm(x)))).square().mean()


def _step(model, x, **options):
    """One training step compiled by a new passline backend: (backend, loss, gradients, aot_autograd's counts)."""
    torch._dynamo.reset()
    counters.clear()
    be = passline.backend(fallback="raise", **options)
    loss = torch.compile(model, backend=be)(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    return be, loss.detach(), grads, dict(counters["aot_autograd"])


def _eager(model, x):
    loss = model(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    return loss.detach(), grads


def _hits(be) -> list:
    return [r.metrics.counters.get("aot_cache_hits", 0) for r in be.reports]


def _check(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_second_compile_loads_aot_autograds_result(monkeypatch):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    twin = Block()
    twin.load_state_dict(model.state_dict())
    first, *result, seen = _step(model, x)
    _check(result, _eager(twin, x))
    assert seen.get("autograd_cache_saved") == 1 and _hits(first) == [0, 0]

    # nothing is traced, partitioned, lowered or scheduled again: each would raise
    import torch._functorch._aot_autograd.graph_compile as graph_compile

    import passline.backends.dynamo as dynamo

    def refuse(*a, **k):
        raise AssertionError("traced or lowered again")

    monkeypatch.setattr(dynamo, "lower_graph", refuse)
    monkeypatch.setattr(graph_compile, "aot_stage2_compile", refuse)
    second, *result, seen = _step(model, x)
    assert seen.get("autograd_cache_hit") == 1 and _hits(second) == [1, 1]
    assert [r.graph.format() for r in second.reports] == [r.graph.format() for r in first.reports]
    assert [r.name for r in second.reports] == ["forward0", "backward1"]
    _check(result, _eager(twin, x))  # the loss, every gradient, and BatchNorm's running statistics below
    torch.testing.assert_close(model.bn.running_mean, twin.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, twin.bn.running_var)


def test_an_inference_graph_is_loaded_too():
    torch.manual_seed(0)
    f = torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.LayerNorm(24), torch.nn.ReLU())
    x = torch.randn(8, 24)
    with torch.no_grad():
        outs = []
        for _ in range(2):
            torch._dynamo.reset()
            be = passline.backend(fallback="raise")
            outs.append((torch.compile(f, backend=be)(x), _hits(be)))
        torch.testing.assert_close(outs[1][0], f(x))
    assert [hits for _, hits in outs] == [[0], [1]]


def test_on_by_default_and_off_without_the_graph_cache():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    assert passline.config.Settings().aot_cache and passline.config.Settings.from_environ({}).aot_cache
    assert not passline.config.Settings.from_environ({"PASSLINE_AOT_CACHE": "0"}).aot_cache
    _step(model, x)
    for options in ({"aot_cache": False}, {"graph_cache": False}):
        be, *_, seen = _step(model, x, **options)
        assert "autograd_cache_hit" not in seen and "autograd_cache_saved" not in seen and _hits(be) == [0, 0]


@pytest.mark.parametrize("change", ["pipeline", "codegen", "shape"])
def test_what_passlines_result_depends_on_makes_another_key(change):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    twin = Block()
    twin.load_state_dict(model.state_dict())
    _step(model, x)
    options = {}
    if change == "pipeline":
        options["pipeline"] = passline.DEFAULT_PIPELINE.replace("mix_order_reduction",
                                                                "mix_order_reduction(min_rows=9)")
    elif change == "codegen":
        options["codegen"] = "reference"
    else:
        x = torch.randn(17, 32, requires_grad=True)
    be, *result, seen = _step(model, x, **options)
    assert "autograd_cache_hit" not in seen and _hits(be) == [0, 0]
    _check(result, _eager(twin, x))


def test_a_graph_passline_ran_eagerly_is_not_kept(monkeypatch):
    """A graph the fallback ran as aten code is not saved: a later compile, which passline may get right, traces
    and compiles it again."""
    import passline.backends.dynamo as dynamo

    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    lower = dynamo.lower_graph

    def fail_backward(gm, example_inputs, *a, **k):
        if any(n.name.startswith("tangents") for n in gm.graph.nodes):
            raise NotImplementedError("a refusal, for the test")
        return lower(gm, example_inputs, *a, **k)

    monkeypatch.setattr(dynamo, "lower_graph", fail_backward)
    torch._dynamo.reset()
    counters.clear()
    be = passline.backend(fallback="eager")
    with pytest.warns(UserWarning, match="runs it eagerly"):
        torch.compile(model, backend=be)(x).backward()
    assert "autograd_cache_saved" not in counters["aot_autograd"] and len(be.failures) == 1
    monkeypatch.setattr(dynamo, "lower_graph", lower)
    again, *_, seen = _step(model, x)
    assert "autograd_cache_hit" not in seen and _hits(again) == [0, 0] and not again.failures


def test_a_scheduled_graph_gone_from_the_graph_cache_is_compiled_again(tmp_path):
    """aot_autograd's entry names a graph-cache entry; without it the load is a miss (no report of the half
    loaded), and the compile stores both again."""
    import shutil

    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    twin = Block()
    twin.load_state_dict(model.state_dict())
    first, *_ = _step(model, x)
    graphs = tmp_path / "passline" / "graphs"
    assert len(list(graphs.glob("*.pkl"))) == 2
    (graphs / f"{first.reports[1].graph_key}.pkl").unlink()  # the backward's: the forward loads, then this misses
    be, *result, seen = _step(model, x)
    assert seen.get("autograd_cache_miss") == 1 and seen.get("autograd_cache_saved") == 1
    assert [r.name for r in be.reports] == ["forward1", "backward2"] and _hits(be) == [0, 0]
    _check(result, _eager(twin, x))
    shutil.rmtree(tmp_path / "passline" / "graphs")
    be, *result, seen = _step(model, x)
    assert seen.get("autograd_cache_miss") == 1 and _hits(be) == [0, 0]


def test_a_loaded_backward_may_retain_its_graph():
    """The entry is written at an ordinary first backward; a later process whose first backward retains its
    graph loads it and trains (aot_autograd refuses that for a backward with donated buffers: passline's have
    none)."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    twin = Block()
    twin.load_state_dict(model.state_dict())
    _step(model, x)
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    loss = torch.compile(model, backend=be)(x)
    loss.backward(retain_graph=True)
    loss.backward()
    assert _hits(be) == [1, 1]
    want = twin(x)
    want.backward(retain_graph=True)
    want.backward()
    for a, b in zip([*model.parameters(), x], [*twin.parameters(), x]):
        if a is not x:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_are_traced_each_time():
    torch.manual_seed(0)
    f = torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.GELU())
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        be = passline.backend(fallback="raise")
        compiled = torch.compile(f, backend=be, dynamic=True)
        for rows in (8, 11):
            x = torch.randn(rows, 24, requires_grad=True)
            compiled(x).sum().backward()
        assert "autograd_cache_hit" not in counters["aot_autograd"] and _hits(be) == [0, 0]


def test_a_second_process_trains_from_the_cache(tmp_path):
    script = textwrap.dedent("""
        import torch, passline
        from torch._dynamo.utils import counters
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                    torch.nn.Linear(64, 8))
        x = torch.randn(16, 32, requires_grad=True)
        be = passline.backend(fallback="raise")
        torch.compile(model, backend=be)(x).logsumexp(1).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
        model.zero_grad(); x.grad = None
        model(x).logsumexp(1).sum().backward()
        ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in
                 zip(grads, [p.grad for p in model.parameters()] + [x.grad]))
        from passline.lowering import decompositions
        from torch._inductor import codecache
        from torch._inductor.codegen import common
        assert codecache.init_backend_registration is common.init_backend_registration  # as it was
        print(counters["aot_autograd"].get("autograd_cache_hit", 0),
              [r.metrics.counters.get("aot_cache_hits", 0) for r in be.reports], ok,
              decompositions._table.cache_info().currsize, common.init_backend_registration.cache_info().currsize)
    """)
    env = {**os.environ, "PASSLINE_CACHE_DIR": str(tmp_path / "p"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "i"),
           "TRITON_INTERPRET": "1", "PASSLINE_AOT_CACHE": "1"}
    env.pop("PASSLINE_GRAPH_CACHE", None)  # on by default
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    # (the last figures: whether passline's decomposition table was built, and Inductor's code generators registered
    # (an import of all of them, which torch's key asks for): a process that traces nothing does neither)
    assert [r.stdout.strip() for r in runs][1] == "1 [1, 1] True 0 0", [r.stderr[-800:] for r in runs]
    assert runs[0].stdout.strip().startswith("0 [0, 0] True 1 "), [r.stderr[-800:] for r in runs]


class Broken(torch.nn.Module):
    """Two captured graphs (a graph break between them), each with a forward and a backward."""

    def __init__(self, d=32):
        super().__init__()
        self.b = torch.nn.Linear(d, d)

    def forward(self, x):
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],)).relu()
        torch._dynamo.graph_break()
        return self.b(h).square().mean()


def test_a_hit_reports_as_a_compile_does_and_its_graphs_lower_again():
    """A loaded graph's report names it as a fresh compile would (backwards built at their first call, last graph
    first) and holds the aten graph with its nodes' traced values, so it can be lowered again (`passline draw`)."""
    from passline.lowering import lower_graph

    torch.manual_seed(0)
    model, x = Broken(), torch.randn(16, 32, requires_grad=True)
    twin = Broken()
    twin.load_state_dict(model.state_dict())
    first, *_ = _step(model, x)
    second, *result, seen = _step(model, x)
    assert seen.get("autograd_cache_hit") == 2 and _hits(second) == [1, 1, 1, 1]
    assert [r.name for r in second.reports] == [r.name for r in first.reports]
    assert [r.graph.format() for r in second.reports] == [r.graph.format() for r in first.reports]
    _check(result, _eager(twin, x))
    for r in second.reports:  # (read first: the traced values are made again at the first look at `gm`)
        assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in r.gm.graph.find_nodes(op="placeholder"))
        assert len(lower_graph(r.gm).nodes) > 0


def test_a_backward_whose_scheduled_graph_went_after_the_load_is_compiled_from_its_graph(tmp_path):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 32, requires_grad=True)
    twin = Block()
    twin.load_state_dict(model.state_dict())
    first, *_ = _step(model, x)
    torch._dynamo.reset()
    be = passline.backend(fallback="raise")
    loss = torch.compile(model, backend=be)(x)  # both graphs loaded: the backward's is built at its call
    (tmp_path / "passline" / "graphs" / f"{first.reports[1].graph_key}.pkl").unlink()
    loss.backward()
    assert _hits(be) == [1, 0] and be.reports[1].seconds["passes"] > 0
    want = twin(x)
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    want.backward()
    _check((loss.detach(), grads), (want.detach(), [p.grad for p in twin.parameters()] + [x.grad]))


def test_a_captured_graph_holding_a_tensor_is_not_kept():
    """torch's key names a tensor the captured graph holds (a `get_attr`) by its metadata only: such a graph is
    traced each time (passline does not offer it; torch 2.13 also bypasses this one itself), and another value
    gives another result."""
    class Scale(torch.nn.Module):
        def __init__(self, v):
            super().__init__()
            self.register_buffer("c", torch.full((4,), v))

        def forward(self, x):
            return (x * self.c,)  # (aot_autograd takes a tuple from a graph it did not get from dynamo)

    x = torch.randn(3, 4)
    for v in (2.0, 3.0):
        counters.clear()
        gm = torch.fx.symbolic_trace(Scale(v))
        assert gm.graph.find_nodes(op="get_attr")
        (out,) = passline.backend(fallback="raise")(gm, [x])(x)
        torch.testing.assert_close(out, x * v)
        assert not {"autograd_cache_saved", "autograd_cache_hit"} & set(counters["aot_autograd"])


def test_a_hits_graph_lowers_again_with_its_choices():
    """A graph aot_autograd's cache gives back is its code re-traced, with other node names (`mm` comes back as
    `mm_default`); `Replay` takes a report's choices in order, op by op, so lowering `report.gm` again (`passline
    draw`) makes the graph the compile made: here, decompose-K's bmm, not aten's mm (it drew aten's on a hit)."""
    from passline.lowering import lower_graph
    from passline.lowering.choices import Replay

    def fn(a, b):
        return (a @ b).relu()

    a, b = torch.randn(4, 1024, requires_grad=True), torch.randn(1024, 8)
    reports = []
    for _ in range(2):
        torch._dynamo.reset()
        be = passline.backend(fallback="raise", codegen="reference", choice_overrides={"mm": "decompose_k"})
        torch.compile(fn, backend=be)(a, b).sum().backward()
        reports.append(be.reports[0])
    first, hit = reports
    assert hit.metrics.counters.get("aot_cache_hits") == 1
    assert {n.name for n in first.gm.graph.nodes} != {n.name for n in hit.gm.graph.nodes}  # (why by order)
    for r in (first, hit):
        program = lower_graph(r.gm, chooser=Replay(r.choices))
        externs = [str(n.op) for n in program.nodes if hasattr(n, "op")]
        assert [c.chosen for c in program.choices] == ["decompose_k(chunks=8)"], program.choices
        assert "aten.bmm.default" in " ".join(externs) and "aten.mm.default" not in " ".join(externs), externs


class Solve(torch.nn.Module):
    """torch.linalg.solve, whose check of the factorization aot_autograd orders with an effect token."""

    def __init__(self, d=4):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        m = x.mT @ x + torch.eye(x.shape[-1])
        return torch.linalg.solve(m, self.fc(x).mT).tanh().sum()


def test_a_graph_ordering_effects_with_a_token_is_not_kept():
    # a loaded entry called such a graph without its token's slot (each input one place off); not saved, a later
    # compile traces it again and trains as eager
    torch.manual_seed(0)
    model, x = Solve(), torch.randn(6, 4, requires_grad=True)
    want = _eager(model, x)
    first, *got, seen = _step(model, x)
    _check(got, want)
    assert "autograd_cache_saved" not in seen and not first.failures
    again, *got, seen = _step(model, x)
    _check(got, want)
    assert "autograd_cache_hit" not in seen and _hits(again) == [0, 0]


def test_inductors_code_generators_are_unregistered_only_inside_passlines_calls():
    """torch's key registers all of Inductor's code generators (an import of them); inside passline's calls it does
    not, however they nest or overlap, and the registration is torch's own again after them."""
    from torch._inductor import codecache

    real = codecache.init_backend_registration
    with aot_cache._inductor_backends_unregistered():
        with aot_cache._inductor_backends_unregistered():
            assert codecache.init_backend_registration is not real
            assert codecache.init_backend_registration() is None
        assert codecache.init_backend_registration is not real
    assert codecache.init_backend_registration is real


def test_a_graph_traced_under_one_autocast_dtype_is_not_loaded_under_another(monkeypatch):
    """aot_autograd traces under the caller's autocast, which dynamo's graph does not show; torch 2.11's key held only
    whether autocast is on, so a float16 step could load the graphs a bfloat16 step stored. passline's part of the key
    holds each device's autocast dtype: checked here with torch's own part made blind to it, as 2.11's was."""
    from torch._functorch._aot_autograd import autograd_cache

    details = autograd_cache.AOTAutogradCacheDetails
    real_init = details.__init__

    def blind(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if isinstance(getattr(self, "autocast_state", None), dict):
            self.autocast_state = {device: "on" for device in self.autocast_state}  # on or off, no dtype
    monkeypatch.setattr(details, "__init__", blind)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(16, 32, requires_grad=True)
    for dtype in (torch.bfloat16, torch.float16):
        torch._dynamo.reset()
        counters.clear()
        be = passline.backend(fallback="raise")
        with torch.autocast("cpu", dtype=dtype):
            out = torch.compile(model, backend=be)(x)
            want = model(x)
        assert out.dtype == want.dtype == dtype
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        out.float().square().sum().backward()  # (the entry is written at the first backward)
        assert "autograd_cache_hit" not in counters["aot_autograd"] and _hits(be) == [0, 0]
    # and the same dtype again is a hit
    torch._dynamo.reset()
    counters.clear()
    be = passline.backend(fallback="raise")
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.compile(model, backend=be)(x).dtype == torch.float16
    assert counters["aot_autograd"].get("autograd_cache_hit") == 1


def test_the_key_is_the_same_whether_or_not_inductor_registered_its_backends(tmp_path):
    """Inductor's registration of its code generators (done by any Inductor compile in the process) adds a None per
    device to the custom passes torch's key reads: a process that had registered them stored entries a plain one then
    missed, and the other way round. Either order hits."""
    script = textwrap.dedent("""
        import sys, torch, passline
        from torch._dynamo.utils import counters
        if sys.argv[1] == "registered":  # as an Inductor compile earlier in the process would have
            from torch._inductor.codegen.common import init_backend_registration
            init_backend_registration()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        torch.compile(model, backend=passline.backend(fallback="raise"))(torch.randn(8, 16)).sum().backward()
        print(counters["aot_autograd"].get("autograd_cache_hit", 0))
    """)
    for order in (["registered", "plain"], ["plain", "registered"]):
        env = {**os.environ, "PASSLINE_CACHE_DIR": str(tmp_path / order[0] / "p"),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / order[0] / "i"), "TRITON_INTERPRET": "1",
               "PASSLINE_AOT_CACHE": "1", "PASSLINE_GRAPH_CACHE": "1"}
        runs = [subprocess.run([sys.executable, "-c", script, how], env=env, capture_output=True, text=True,
                               timeout=300) for how in order]
        assert [r.stdout.strip() for r in runs] == ["0", "1"], (order, [r.stderr[-800:] for r in runs])


def test_sdpas_switches_are_part_of_the_key():
    """Which implementation of scaled_dot_product_attention aot_autograd decomposes, and whether its math path keeps
    bfloat16 reductions, follow torch.backends.cuda's switches, which dynamo does not guard and torch's key does not
    hold: a graph traced with reduced-precision reductions allowed was loaded where they were not (three times eager's
    error). Each setting gets its own entry and matches eager."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    w = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.bfloat16) * 0.2)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q @ w, k, v)
    cuda = torch.backends.cuda
    saved = cuda.flash_sdp_enabled(), cuda.fp16_bf16_reduction_math_sdp_allowed()
    try:
        cuda.enable_flash_sdp(False)  # the math path, on the CPU too
        for allowed in (True, False):
            cuda.allow_fp16_bf16_reduction_math_sdp(allowed)
            torch._dynamo.reset()
            counters.clear()
            be = passline.backend(fallback="raise")
            out = torch.compile(attend, backend=be)(q, k, v)
            out.float().sum().backward()
            torch.testing.assert_close(out, attend(q, k, v), rtol=0, atol=1e-3)
            assert "autograd_cache_hit" not in counters["aot_autograd"]
    finally:
        cuda.enable_flash_sdp(saved[0])
        cuda.allow_fp16_bf16_reduction_math_sdp(saved[1])


def test_inputs_sharing_memory_are_traced_each_time():
    """torch's key holds each input's metadata but not which inputs share memory: an entry traced for distinct inputs,
    one written in place, was loaded for a view of the other, the write unseen (the forty-sixth session's campaign;
    Inductor's entries as wrong). Such a graph is not cached; the distinct one still is."""
    def f(a, b):
        a.mul_(2)
        return a + b
    torch.manual_seed(0)
    base = torch.randn(8, 32)
    for aliased in (False, True, False):
        torch._dynamo.reset()
        counters.clear()
        a = base.clone()
        b = a.view(8, 32) if aliased else base.clone()
        a2 = base.clone()
        b2 = a2.view(8, 32) if aliased else base.clone()
        out = torch.compile(f, backend=passline.backend(fallback="raise"))(a, b)
        torch.testing.assert_close(out, f(a2, b2), rtol=0, atol=0)
        seen = counters["aot_autograd"]
        if aliased:
            assert not any(k.startswith("autograd_cache") for k in seen), seen
        else:
            assert seen.get("autograd_cache_hit", 0) + seen.get("autograd_cache_saved", 0) == 1, seen


def test_a_graph_calling_a_librarys_op_is_traced_each_time():
    """torch's key names a library's op but not its code: aot_autograd traces its autograd formula into the backward,
    and an edited formula's gradients came from the old one. Graphs calling ops from outside torch and passline are
    not cached."""
    scale = [2.0]

    @torch.library.custom_op("passline_test_aot::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    twice.register_autograd(lambda ctx, g: g * scale[0])  # the library's gradient formula, edited below

    def f(x, w):
        return torch.ops.passline_test_aot.twice(x @ w).square().mean()
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    for s in (2.0, 3.0):
        scale[0] = s
        torch._dynamo.reset()
        counters.clear()
        torch.compile(f, backend=passline.backend(fallback="raise"))(x, w).backward()
        got, w.grad = w.grad, None
        f(x, w).backward()
        torch.testing.assert_close(got, w.grad, rtol=1e-5, atol=1e-6)
        w.grad = None
        assert not any(k.startswith("autograd_cache") for k in counters["aot_autograd"])


def test_a_python_number_passed_as_a_tensor_is_traced_each_time():
    """A Python float that changes between calls becomes, after the first recompile, an input dynamo passes as a
    0-d tensor; aot_autograd may still bake its value into the graphs (a clamp's bounds: a guard on the value, and
    a recompile at the next one), while torch's key names the input by its metadata alone: an entry traced at one
    value was loaded at another, its results wrong (the sixty-first session's campaign: a clamp, ELU's alpha across
    processes). Such graphs are not cached; each value's step matches eager, forward and backward."""
    def f(x, a):
        return x.clamp(-a, a) * 2
    compiled = torch.compile(f, backend=passline.backend(fallback="raise"))
    for a in (0.37, 1.11, 0.74, 1.85):
        x = torch.linspace(-2, 2, 9, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, want = compiled(x, a), f(x2, a)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x.grad, x2.grad)
