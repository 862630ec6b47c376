"""Registry, pipeline text, pass manager, instrumentation, dumps, metrics, cache keys and bisect."""
import csv
import importlib
import sys
import textwrap
from typing import Annotated, Literal

import attrs
import pytest
import torch
from modules import MIXED

import passline
from passline import Pipeline, PipelineError, register_pass, repeat
from passline.ir import Constant, Op, Pointwise
from passline.pipeline import registry
from passline.testing import assert_matches_eager


@pytest.fixture(autouse=True, scope="module")
def test_passes():
    @register_pass("t_opts", provides={"t_fact"}, replace=True)
    def t_opts(graph, ctx, *, max_nodes: Annotated[int, "a cap"] = 64, horizontal: bool = True,
               ratio: float = 0.5, mode: Literal["fast", "safe"] = "fast", tag: str = "x"):
        """A test pass with every kind of option."""
        return graph

    @register_pass("t_needs", requires={"t_fact"}, replace=True)
    def t_needs(graph, ctx):
        """Needs t_fact."""
        return graph

    @register_pass("t_class", replace=True)
    class TClass:
        """A class-based pass."""

        @attrs.define
        class Options:
            limit: int = attrs.field(default=3, metadata={"doc": "how many"})

        def run(self, graph, ctx, options):
            ctx.count("limit_seen", options.limit)
            return graph

    yield
    for name in ("t_opts", "t_needs", "t_class"):
        passline.unregister_pass(name)


# -- registry and text ----------------------------------------------------------------------------
def test_registry_lists_passes_with_options_and_docs():
    info = passline.passes()["t_opts"]
    assert info.summary == "A test pass with every kind of option."
    assert [(o.name, o.type, o.default) for o in info.options] == [
        ("max_nodes", int, 64), ("horizontal", bool, True), ("ratio", float, 0.5), ("mode", str, "fast"),
        ("tag", str, "x")]
    assert info.option("max_nodes").doc == "a cap" and info.option("mode").choices == ("fast", "safe")
    assert passline.passes()["t_class"].option("limit").doc == "how many"
    assert "dce" in passline.passes()


@pytest.mark.parametrize("text", [
    "dce",
    "t_opts(max_nodes=32, horizontal=false), t_needs",
    't_opts(ratio=0.25, mode=safe, tag="with space"), repeat(dce, t_class(limit=2); max_iter=4), dce',
    "repeat(dce, repeat(t_class; max_iter=2))",
    "",
])
def test_round_trip(text):
    p = Pipeline.parse(text)
    assert Pipeline.parse(str(p)) == p
    assert str(Pipeline.parse(str(p))) == str(p)


def test_python_form_equals_text():
    t_opts, t_class = passline.passes()["t_opts"], passline.passes()["t_class"]
    p = Pipeline(["dce", t_opts(max_nodes=32), repeat("dce", t_class(limit=2), max_iter=4), "t_needs"])
    assert p == Pipeline.parse("dce, t_opts(max_nodes=32), repeat(dce, t_class(limit=2); max_iter=4), t_needs")
    assert Pipeline.parse(str(p)) == p


def test_int_option_accepted_for_float_and_normalized():
    assert Pipeline.parse("t_opts(ratio=1)") == Pipeline.parse("t_opts(ratio=1.0)")


@pytest.mark.parametrize("text, message, column", [
    ("dce, t_optz", "unknown pass 't_optz'; did you mean 't_opts'", 5),
    ("t_opts(max_node=3)", "has no option 'max_node'; did you mean 'max_nodes'", 7),
    ("t_opts(max_nodes=1.5)", "option 'max_nodes' of pass 't_opts' takes int, got 1.5", 7),
    ("t_opts(horizontal=3)", "takes bool", 7),
    ("t_opts(mode=quick)", "takes str in ['fast', 'safe'], got 'quick'", 7),
    ("t_needs, t_opts", "pass 't_needs' requires 't_fact', which no earlier pass provides; 't_opts' provides it", 0),
    ("dce,", "expected a pass name, found the end", 4),
    ("dce(", "expected an option name", 4),
    ("dce dce", "expected ',' between passes", 4),
    ("repeat(dce; max_iter=0)", "max_iter must be a positive int", 12),
    ("t_opts(max_nodes=1, max_nodes=2)", "given twice", 20),
    ("dce $", "unexpected character '$'", 4),
])
def test_errors_name_the_problem_and_point_at_it(text, message, column):
    with pytest.raises(PipelineError) as e:
        Pipeline.parse(text)
    assert message in str(e.value)
    assert e.value.position == column
    assert str(e.value).splitlines()[-1] == " " * (2 + column) + "^"


def test_python_form_errors():
    with pytest.raises(PipelineError, match="did you mean 'max_nodes'"):
        passline.passes()["t_opts"](max_nodez=1)
    with pytest.raises(PipelineError, match="requires 't_fact'"):
        Pipeline(["t_needs"])


# -- pass manager ---------------------------------------------------------------------------------
def _graph():
    from passline.lowering import lower_graph
    from passline.pipeline import SchedulerGraph

    gm = torch.fx.symbolic_trace(lambda x: x)  # replaced below by an aten graph
    from torch._functorch.aot_autograd import aot_export_joint_simple  # noqa: F401

    def f(x):
        y = torch.ops.aten.mul.Tensor(x, 2.0)
        torch.ops.aten.add.Tensor(x, 1.0)  # dead
        return torch.ops.aten.exp.default(y)

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(torch.randn(4, 8))
    return SchedulerGraph.from_program(lower_graph(gm))


def test_manager_records_time_counts_and_checked_change():
    @register_pass("t_liar", replace=True)
    def t_liar(graph, ctx):
        return passline.PassResult(graph, changed=True, stats={"claimed": 1})

    try:
        pm = passline.PassManager("dce, t_liar, t_class(limit=5)")
        graph, records = pm.run(_graph())
        dce_rec, liar, cls = records
        assert (dce_rec.name, dce_rec.nodes_before, dce_rec.nodes_after, dce_rec.changed) == ("dce", 3, 2, True)
        assert dce_rec.stats == {"dce_removed": 1} and dce_rec.seconds > 0
        assert liar.claimed_changed is True and liar.changed is False and liar.stats == {"claimed": 1}
        assert cls.stats == {"limit_seen": 5} and cls.call == "t_class(limit=5)"
    finally:
        passline.unregister_pass("t_liar")


def test_fixed_point_repeat_runs_until_no_change_and_respects_cap():
    @register_pass("t_shrink", replace=True)
    def t_shrink(graph, ctx, *, keep: int = 0):
        """Remove one node per run until `keep` remain."""
        if len(graph) > keep:
            graph.remove_node(graph.nodes()[-1].name)
        return graph

    try:
        _, records = passline.PassManager("repeat(t_shrink)", verify=False).run(_graph())
        assert [r.changed for r in records] == [True, True, True, False]
        assert [r.iteration for r in records] == [1, 2, 3, 4]
        _, records = passline.PassManager("repeat(t_shrink; max_iter=2)", verify=False).run(_graph())
        assert len(records) == 2
    finally:
        passline.unregister_pass("t_shrink")


def test_verifier_names_the_pass_that_broke_the_graph():
    @register_pass("t_breaks", replace=True)
    def t_breaks(graph, ctx):
        """Drops a node something still reads."""
        graph.remove_node(graph.nodes()[0].name)
        return graph

    try:
        with pytest.raises(passline.VerificationError, match="after pass 't_breaks': reads buf0"):
            passline.PassManager("t_breaks").run(_graph())
        passline.PassManager("t_breaks", verify=False).run(_graph())  # switchable
    finally:
        passline.unregister_pass("t_breaks")


def test_instruments_see_every_pass():
    seen = []

    class Spy(passline.PassInstrument):
        def before_pass(self, call, graph):
            seen.append(("before", str(call), len(graph)))

        def after_pass(self, record, graph):
            seen.append(("after", record.name, record.changed))

    passline.PassManager("dce, t_class", instruments=[Spy()]).run(_graph())
    assert seen == [("before", "dce", 3), ("after", "dce", True), ("before", "t_class", 2),
                    ("after", "t_class", False)]


def test_instruments_nest_around_the_builtin_ones():
    seen = []

    class Tag(passline.PassInstrument):
        def __init__(self, name):
            self.name = name

        def enter_pipeline(self, graph, run):
            seen.append((self.name, "enter", run.graph_name))

        def before_pass(self, call, graph):
            seen.append((self.name, "before"))

        def after_pass(self, record, graph):
            # the built-in instruments (inside) have filled the record
            seen.append((self.name, "after", record.changed, record.seconds > 0, record.nodes_after))

        def exit_pipeline(self, graph, run):
            seen.append((self.name, "exit", len(run.records)))

    class OnlyAfter:  # not a PassInstrument: adapted, its missing hooks are no-ops
        def after_pass(self, record, graph):
            seen.append(("duck", "after"))

    passline.PassManager("dce", instruments=[Tag("a"), Tag("b"), OnlyAfter()]).run(_graph(), graph_name="g")
    assert seen == [("a", "enter", "g"), ("b", "enter", "g"), ("a", "before"), ("b", "before"),
                    ("duck", "after"), ("b", "after", True, True, 2), ("a", "after", True, True, 2),
                    ("b", "exit", 1), ("a", "exit", 1)]
    with pytest.raises(TypeError, match="not a pass instrument"):
        passline.PassManager("dce", instruments=[object()])


def test_private_registry_scopes_passes():
    mine = passline.Registry()
    with mine.active():
        @register_pass("t_private")
        def t_private(graph, ctx):
            """Only in my registry."""
            ctx.state["runs"] = ctx.state.get("runs", 0) + 1
            return graph

        manager = passline.PassManager("dce, t_private")  # sees the default registry's passes too
    assert "t_private" in mine and "t_private" not in passline.passes()
    with pytest.raises(PipelineError, match="unknown pass 't_private'"):
        Pipeline.parse("t_private")
    graph, records = manager.run(_graph())  # the manager runs under the registry it was made in
    assert [r.name for r in records] == ["dce", "t_private"]
    alone = passline.Registry(parent=None)
    assert "dce" not in alone and alone.passes() == {}


def test_report_passes_and_figures():
    be = assert_matches_eager(lambda x: (x * 2).exp() + 1, [torch.randn(4, 8)], pipeline="dce, t_class")
    r = be.reports[0]
    assert [p.name for p in r.passes] == ["dce", "t_class"]
    for p in r.passes:
        assert {"name", "seconds", "nodes_before", "nodes_after", "changed", "stats"} <= set(attrs.asdict(p))
    # three pointwise nodes over float32[4, 8]: each reads 128 bytes and writes 128 bytes
    assert r.kernels == 3 and r.bytes_accessed == 3 * (128 + 128)
    assert r.metrics.counters["generated_kernel_count"] == 3


def test_default_pipeline_is_used():
    assert str(passline.backend().pipeline) == str(Pipeline.parse(passline.DEFAULT_PIPELINE))


# -- dumps, metric tables, cache keys -------------------------------------------------------------
def test_dumps_for_changed_passes(tmp_path):
    be = passline.backend("dce, t_class", dump_dir=str(tmp_path))
    graph = _graph()
    be.manager.run(graph, graph_name="g")
    files = sorted(p.name for p in (tmp_path / "g").iterdir())
    assert files == ["000-input.dot", "000-input.txt", "001-dce.diff", "001-dce.dot", "001-dce.txt"]
    diff = (tmp_path / "g" / "001-dce.diff").read_text()
    assert "- buf1: removed (FX: add)" in diff
    assert "digraph" in (tmp_path / "g" / "001-dce.dot").read_text()


def test_dump_dir_from_settings(tmp_path):
    with passline.settings(dump_dir=str(tmp_path)):
        assert_matches_eager(lambda x: x.sin() * 2, [torch.randn(3)])
    assert list(tmp_path.glob("forward*/000-input.txt")) or list(tmp_path.glob("inference*/000-input.txt"))


def test_dumps_draw_mix_order_nodes(tmp_path):
    # a MixOrderNode has no ranges of its own: the .dot label once raised AttributeError mid-compile
    with passline.settings(dump_dir=str(tmp_path)):
        assert_matches_eager(torch.nn.LayerNorm(8), [torch.randn(16, 8, requires_grad=True)], codegen="reference",
                             pipeline=MIXED)  # (16 rows: mixed on a GPU target too)
    (dot,) = tmp_path.glob("backward*/*-mix_order_reduction.dot")
    assert "mix_order [16 | 8]" in dot.read_text()


def test_metric_tables(tmp_path):
    with passline.settings(metric_tables="graph_stats,kernel_metadata,pass_stats", metric_dir=str(tmp_path)):
        assert_matches_eager(lambda x: (x * 2).sum(1), [torch.randn(4, 8)], pipeline="dce")
    rows = list(csv.DictReader((tmp_path / "kernel_metadata.csv").open()))
    assert sorted((r["kind"], r["numel"], r["rnumel"]) for r in rows) == [("pointwise", "32", "1"),
                                                                          ("reduction", "4", "8")]
    stats = list(csv.DictReader((tmp_path / "graph_stats.csv").open()))
    assert len(stats) == 1 and int(stats[0]["kernels"]) == 2
    assert (tmp_path / "pass_stats.csv").exists()
    with pytest.raises(ValueError, match="unknown metric table 'graph_stat'"):
        passline.backend(metric_tables=["graph_stat"])


def test_cache_key_tracks_text_options_and_pass_source(tmp_path, monkeypatch):
    mod = tmp_path / "my_cache_pass.py"
    src = textwrap.dedent('''
        import passline

        @passline.register_pass("t_cached", replace=True)
        def t_cached(graph, ctx, *, n: int = 1):
            return graph  # VERSION 1
    ''')
    mod.write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("my_cache_pass")
    try:
        k1 = Pipeline.parse("dce, t_cached").cache_key()
        assert k1 == Pipeline.parse("dce, t_cached").cache_key()
        assert k1 != Pipeline.parse("dce, t_cached(n=2)").cache_key()
        assert k1 != Pipeline.parse("t_cached, dce").cache_key()
        mod.write_text(src.replace("VERSION 1", "VERSION 2"))
        importlib.reload(sys.modules["my_cache_pass"])
        assert Pipeline.parse("dce, t_cached").cache_key() != k1
    finally:
        passline.unregister_pass("t_cached")
        sys.modules.pop("my_cache_pass", None)


def test_entry_point_discovery(tmp_path, monkeypatch):
    dist = tmp_path / "thirdparty_passes-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-passes\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[passline.passes]\nmine = thirdparty_passes_mod\n")
    (tmp_path / "thirdparty_passes_mod.py").write_text(textwrap.dedent('''
        import passline

        @passline.register_pass("t_thirdparty", replace=True)
        def t_thirdparty(graph, ctx):
            """From a plugin."""
            return graph
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry.default_registry(), "_entry_points_pending", True)
    try:
        assert str(Pipeline.parse("dce, t_thirdparty")) == "dce, t_thirdparty"
    finally:
        passline.unregister_pass("t_thirdparty")


# -- bisect -----------------------------------------------------------------------------------------
def test_bisect_names_the_pass_and_the_decision(tmp_path):
    @register_pass("t_sign_flip", replace=True)
    def t_sign_flip(graph, ctx):
        """Rewrites each pointwise node harmlessly, except the 3rd, whose sign it flips."""
        for k, node in enumerate([n for n in graph.nodes() if isinstance(n, Pointwise)], 1):
            if not ctx.decide("rewrite", node):
                continue
            factor = -1.0 if k == 3 else 1.0
            body = Op("mul", (node.body, Constant(factor, node.body.dtype)), node.body.dtype)
            graph.replace_node(node.name, attrs.evolve(node, body=body))
        return graph

    try:
        fn = lambda x: ((x * 2 + 1).exp() - 3).tanh() * 0.5
        x = torch.randn(8, 4)
        with pytest.raises(AssertionError):
            assert_matches_eager(fn, [x], pipeline="dce, t_class, t_sign_flip, dce")
        report = passline.bisect(fn, [x], pipeline="dce, t_class, t_sign_flip, dce", save_dir=tmp_path)
        assert (report.pass_index, report.pass_name) == (3, "t_sign_flip")
        assert report.decision.index == 3 and report.decision.kind == "rewrite"
        assert report.minimal_pipeline == "dce, t_class, t_sign_flip"
        assert "t_sign_flip" in str(report) and "#3 rewrite" in str(report)
        replayed = passline.replay(report.reproducer)
        assert not replayed.matches
    finally:
        passline.unregister_pass("t_sign_flip")


def test_bisect_finds_a_pass_that_drops_a_needed_node():
    @register_pass("t_dropper", replace=True)
    def t_dropper(graph, ctx):
        for node in graph.nodes():
            if graph.consumers(node.name) and ctx.decide("drop", node):
                graph.remove_node(node.name)
                break
        return graph

    try:
        report = passline.bisect(lambda x: (x + 1) * 2, [torch.randn(3)], pipeline="dce, t_dropper")
        assert report.pass_name == "t_dropper" and report.decision.index == 1
    finally:
        passline.unregister_pass("t_dropper")


def test_bisect_reports_a_matching_pipeline():
    report = passline.bisect(lambda x: x * 2, [torch.randn(3)], pipeline="dce")
    assert report.matches and "nothing to bisect" in str(report)


def test_collector_is_paused_while_passes_run_and_restored_after_errors():
    import gc

    from passline.testing.synthetic import chain_and_fanout

    class Watch(passline.PassInstrument):
        def __init__(self, fail=False):
            self.enabled, self.fail = [], fail

        def before_pass(self, call, graph):
            self.enabled.append(gc.isenabled())
            if self.fail:
                raise RuntimeError("instrument failed")

    assert gc.isenabled()
    watch = Watch()
    passline.PassManager("dce, fuse", instruments=[watch]).run(chain_and_fanout(20))
    assert watch.enabled == [False, False] and gc.isenabled()
    with pytest.raises(RuntimeError, match="instrument failed"):
        passline.PassManager("dce", instruments=[Watch(fail=True)]).run(chain_and_fanout(20))
    assert gc.isenabled()
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        passline.PassManager("dce").run(chain_and_fanout(20))
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- the backend's arguments (an API campaign's finds, thirty-seventh session) ------------------------------------
def test_on_off_options_take_bools_or_the_environment_words():
    """`check="no"` was kept as a true string and turned the accuracy guard on: on/off options take a bool, 0/1 or
    the words the PASSLINE_* variables take, and anything else is an error naming the option."""
    be = passline.backend(check="no", autotune="off", graph_cache="0", verify="no", cudagraphs="false")
    assert (be.check, be.autotune, be.graph_cache, be.verify, be.cudagraphs) == (False, False, False, False, False)
    assert passline.backend(check="yes").check is True
    with pytest.raises(ValueError, match="check must be True or False"):
        passline.backend(check="maybe")
    with pytest.raises(ValueError, match="verify must be True or False"):
        passline.backend(verify="sometimes")


def test_backend_arguments_are_checked_with_a_suggestion(tmp_path):
    with pytest.raises(TypeError, match="no option 'dumpdir'; did you mean 'dump_dir'"):
        passline.backend(dumpdir=str(tmp_path))
    assert str(passline.backend(pipeline=["dce", "fuse(max_nodes=8)"]).pipeline) == "dce, fuse(max_nodes=8)"
    with pytest.raises(TypeError, match="pipeline must be text"):
        passline.backend(pipeline=123)
    home = passline.config.Settings(dump_dir="~/passline_dumps").dump_dir
    assert not home.startswith("~") and home.endswith("passline_dumps")  # a shell's ~, not a folder named ~


def test_the_named_backend_takes_torch_compiles_mode_and_options():
    """torch.compile(backend="passline", options=..., mode=...) reaches the entry point's backend: options are
    passline.backend's keywords, a mode what it stands for (reduce-overhead: CUDA graphs)."""
    from passline.backends import dynamo as pdynamo

    made = []
    real = pdynamo.Backend.__call__
    pdynamo.Backend.__call__ = lambda self, gm, ex: made.append(self) or real(self, gm, ex)
    try:
        for kwargs in (dict(options={"codegen": "reference"}), dict(mode="reduce-overhead")):
            torch._dynamo.reset()
            x = torch.randn(8)
            torch.testing.assert_close(torch.compile(lambda x: x.exp() + 1, backend=pdynamo.default_backend,
                                                     **kwargs)(x), x.exp() + 1)
    finally:
        pdynamo.Backend.__call__ = real
    assert made[0].codegen == "reference" and made[1].cudagraphs is True
    with pytest.raises(ValueError, match="unknown mode"):
        pdynamo.default_backend(None, [], mode="fastest")
    with pytest.raises(TypeError, match="did you mean 'codegen'"):
        pdynamo.default_backend(None, [], options={"code_gen": "reference"})


def test_a_pass_that_raises_is_named_in_the_fallbacks_warning():
    @register_pass("raises_on_purpose", replace=True)
    def raises_on_purpose(graph, ctx):
        """Raises."""
        raise RuntimeError("boom")

    try:
        torch._dynamo.reset()
        be = passline.backend(pipeline="dce, raises_on_purpose", codegen="reference")
        with pytest.warns(UserWarning, match=r"RuntimeError: boom \(in pass 'raises_on_purpose'"):
            torch.compile(lambda x: x.exp() + 1, backend=be)(torch.randn(4))
    finally:
        passline.unregister_pass("raises_on_purpose")


def test_assert_matches_eager_compares_every_output_and_what_is_written_into_inputs():
    """A dict or a number returned, and an input written in place, are compared too (a deliberately wrong pass
    passed through a function returning a dict or only writing its input)."""
    from passline.ir import Op, Pointwise
    from passline.testing import assert_matches_eager

    @register_pass("negates_first", replace=True)
    def negates_first(graph, ctx):
        """Negates the first floating pointwise node (wrong on purpose)."""
        for node in graph.nodes():
            if isinstance(node, Pointwise) and node.body.dtype.is_floating_point:
                graph.replace_node(node.name, attrs.evolve(node, body=Op("neg", (node.body,), node.body.dtype)))
                break
        return graph

    def in_place(x):
        x.mul_(2)

    x = torch.randn(4, 3)
    # a number a float32 computation returns is judged at float32's tolerance (a split sum's rounding passes)
    assert_matches_eager(lambda x: (x * 1.0001).sum(0).tolist(), [torch.randn(4096, 3)],
                         pipeline="split_reductions(splits=8)", codegen="reference")
    with pytest.raises(TypeError, match="compares tensors, numbers, None and text"):
        assert_matches_eager(lambda x: {1j: object()}, [x], pipeline="", codegen="reference")
    try:
        for fn in (lambda x: {"y": x.exp() + 1}, in_place, lambda x: (x.exp() + 1).sum().item()):
            assert_matches_eager(fn, [x.clone()], pipeline="", codegen="reference")  # right: passes
            with pytest.raises(AssertionError, match="output 0|input 0 after the call"):
                assert_matches_eager(fn, [x.clone()], pipeline="negates_first", codegen="reference")
    finally:
        passline.unregister_pass("negates_first")
    # the outputs' structure, in a training step too (train_step returns the leaves alone; it went unchecked)
    shaped = lambda x: {"a" if torch.compiler.is_compiling() else "b": x * 2}  # noqa: E731
    for grad in (False, True):
        with pytest.raises(AssertionError, match="outputs shaped"):
            assert_matches_eager(shaped, [x.clone().requires_grad_(grad)], pipeline="", codegen="reference")


def test_the_strategies_check_their_arguments():
    """`programs(max_numel=4)` drew inputs of 16 elements, `pipelines(names="dce")` raised KeyError 'c' (an API
    campaign's finds)."""
    from hypothesis import given, settings

    from passline.testing import pipelines, programs

    @settings(max_examples=25, deadline=None, database=None)
    @given(programs(max_numel=4, layouts="contiguous"))
    def small(p):
        assert all(x.numel() <= 4 for x in p.inputs)

    small()
    for names, message in ((["fusee"], "did you mean 'fuse'"), ("dce", "non-empty list"), ([], "non-empty list")):
        with pytest.raises(ValueError, match=message):
            pipelines(names=names).example()


def test_counts_and_sizes_given_negative_are_refused_when_parsed():
    """`split_reductions(splits=-1)` was accepted and raised inside the pass at compile time (under the default
    fallback: a warning and eager code); options declare their least value (registry.AtLeast), checked on parse."""
    for text, message in (("split_reductions(splits=-1)", "'splits' of pass 'split_reductions' takes int of at "
                                                          "least 0, got -1"),
                          ("fuse(max_nodes=0)", "'max_nodes' of pass 'fuse' takes int of at least 1"),
                          ("mix_order_reduction(sms=-1)", "'sms'"),
                          ("split_reductions(min_reduced=0)", "'min_reduced' of pass 'split_reductions' takes int of "
                                                              "at least 1")):
        with pytest.raises(PipelineError, match=message):
            Pipeline.parse(text)
    assert str(Pipeline.parse("fuse(max_nodes=1), split_reductions(splits=0)")) == \
        "fuse(max_nodes=1), split_reductions(splits=0)"

    @register_pass("negative_ok", replace=True)
    def negative_ok(graph, ctx, *, dim: Annotated[int, "a dim: negative counts from the end"] = -1):
        """No least value declared: any int."""
        return graph

    try:
        assert str(Pipeline.parse("negative_ok(dim=-2)")) == "negative_ok(dim=-2)"
    finally:
        passline.unregister_pass("negative_ok")


def test_listed_items_and_class_options_are_checked_when_parsed():
    """`mix_order_reduction(reduction_types=summ)` was accepted, and no column reduction was then ever mixed;
    a comma-separated option declares what it may list (registry.EachOf). An attrs `Options` class of a
    class-based pass reads the same annotations (its AtLeast was ignored)."""
    from passline.pipeline.registry import AtLeast, EachOf

    with pytest.raises(PipelineError, match="did you mean 'sum'"):
        Pipeline.parse("mix_order_reduction(reduction_types=summ)")
    with pytest.raises(PipelineError, match="comma-separated list of"):
        Pipeline.parse('mix_order_reduction(reduction_types="sum,argmax")')
    assert str(Pipeline.parse('mix_order_reduction(reduction_types="sum, max")')) == \
        'mix_order_reduction(reduction_types="sum, max")'

    @register_pass("t_class_bounded", replace=True)
    class Bounded:
        """A class-based pass with annotated options."""

        @attrs.define
        class Options:
            limit: Annotated[int, "how many", AtLeast(1)] = 3
            kinds: Annotated[str, "which, comma-separated", EachOf(("a", "b"))] = "a"

        def run(self, graph, ctx, options):
            return graph

    try:
        info = passline.passes()["t_class_bounded"]
        assert [(o.name, o.doc, o.least, o.items) for o in info.options] == \
            [("limit", "how many", 1, None), ("kinds", "which, comma-separated", None, ("a", "b"))]
        with pytest.raises(PipelineError, match="'limit' of pass 't_class_bounded' takes int of at least 1"):
            Pipeline.parse("t_class_bounded(limit=0)")
        with pytest.raises(PipelineError, match="did you mean 'b'"):
            Pipeline.parse("t_class_bounded(kinds=bb)")
        assert str(Pipeline.parse('t_class_bounded(limit=2, kinds="a,b")')) == 't_class_bounded(limit=2, kinds="a,b")'
    finally:
        passline.unregister_pass("t_class_bounded")
    with pytest.raises(TypeError, match="outside its EachOf"):
        @register_pass("t_bad_default", replace=True)
        def bad_default(graph, ctx, *, kinds: Annotated[str, "x", EachOf(("a",))] = "c"):
            return graph
