"""Settings, the IR's vocabulary, and rules the source keeps (issue 19): passes use the SchedulerGraph API
only, no meaning is read from a name's letters, the environment is read in one place."""
import os
import pathlib
import re

import pytest
import torch

import passline
from passline.config import Settings, current_settings, environment_variable
from passline.ir import VarKind, loop_vars, var_info, var_kind
from passline.ir.loops import Role, canon_var, is_canonical, role, transposed
from passline.lowering.tensor import view_var
from passline.testing.synthetic import chain_and_fanout

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "passline"
def _sources(under=PACKAGE):
    return sorted(under.rglob("*.py"))


# -- settings ---------------------------------------------------------------------------------------------
def test_settings_from_the_environment():
    s = Settings.from_environ({"PASSLINE_DUMP_DIR": "d", "PASSLINE_CHECK": "yes", "PASSLINE_AUTOTUNE": "0",
                               "PASSLINE_METRIC_TABLES": "graph_stats, pass_stats", "PASSLINE_FALLBACK": "raise",
                               "PASSLINE_CACHE_DIR": "/tmp/c", "PASSLINE_METRIC_DIR": "m",
                               "PASSLINE_TEST_DEVICE": "cuda"})
    assert (s.dump_dir, s.check, s.autotune, s.fallback, s.cache_dir, s.metric_dir, s.test_device) == \
        ("d", True, False, "raise", "/tmp/c", "m", "cuda")
    assert s.metric_tables == {"graph_stats", "pass_stats"}
    d = Settings.from_environ({})
    assert (d.dump_dir, d.check, d.autotune, d.fallback, d.metric_tables) == (None, False, False, "eager", set())
    assert Settings.from_environ({"PASSLINE_DUMP_DIR": ""}).dump_dir is None
    with pytest.raises(ValueError, match="PASSLINE_CHECK='maybe'"):
        Settings.from_environ({"PASSLINE_CHECK": "maybe"})
    with pytest.raises(ValueError, match="unknown metric table"):
        Settings.from_environ({"PASSLINE_METRIC_TABLES": "graph_stat"})
    assert d.graph_cache and not Settings.from_environ({"PASSLINE_GRAPH_CACHE": "0"}).graph_cache
    assert not passline.backend(graph_cache=False).graph_cache


def test_settings_scope_and_backend_overrides(tmp_path):
    before = current_settings()
    with passline.settings(dump_dir=str(tmp_path), fallback="raise") as s:
        assert passline.settings.dump_dir == str(tmp_path) == s.dump_dir
        be = passline.backend()
        with passline.settings(dump_dir=""):  # "" switches dumps off; None would keep the outer value
            assert passline.settings.dump_dir is None
        own = passline.backend(dump_dir=str(tmp_path / "own"), fallback="eager")
    assert current_settings() is before  # restored
    assert (be.dump_dir, be.fallback) == (str(tmp_path), "raise")  # taken when the backend was made
    assert (own.dump_dir, own.fallback) == (str(tmp_path / "own"), "eager")  # its own arguments win
    with pytest.raises(TypeError, match="no setting 'dumpdir'"):
        passline.settings(dumpdir="x")
    # a backend compiles under its settings: code on the compile path reads them
    seen = []

    @passline.register_pass("t_reads_settings", replace=True)
    def t_reads_settings(graph, ctx):
        seen.append(passline.settings.metric_dir)
        return graph

    try:
        be = passline.backend("t_reads_settings", codegen="reference", metric_dir=str(tmp_path / "m"))
        torch.compile(lambda x: x + 1, backend=be)(torch.randn(3))
        assert seen == [str(tmp_path / "m")]
    finally:
        passline.unregister_pass("t_reads_settings")


def test_environment_variable_is_restored_exactly(monkeypatch):
    for old in ("0", None, "1"):
        if old is None:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        else:
            monkeypatch.setenv("TRITON_INTERPRET", old)
        with environment_variable("TRITON_INTERPRET", "1"):
            assert os.environ["TRITON_INTERPRET"] == "1"
        assert os.environ.get("TRITON_INTERPRET") == old


# -- the IR's vocabulary ----------------------------------------------------------------------------------
def test_variable_kinds_are_recorded_not_read_from_names():
    i1 = loop_vars(VarKind.OUTER, 2)[1]
    assert str(i1) == "i1" and var_info(i1) == (VarKind.OUTER, 1)
    assert var_kind(loop_vars("r", 1)[0]) is VarKind.REDUCTION  # the prefix letter is accepted as a kind
    assert var_kind(view_var(0)) is VarKind.VIEW
    assert var_kind(passline.ir.size_var("s7")) is VarKind.SIZE
    o2, q2 = canon_var(VarKind.CANON_OUTER, 2), canon_var(VarKind.CANON_REDUCTION, 2)
    assert is_canonical(o2) and not is_canonical(i1)
    assert transposed(o2) == q2 and transposed(q2) == o2
    import sympy
    assert var_kind(sympy.Symbol("i0", integer=True)) is None  # other assumptions: not passline's variable
    assert VarKind.OUTER == "i" and f"{VarKind.REDUCTION}" == "r"  # str enums: old string comparisons hold


def test_roles_are_a_str_enum():
    g = chain_and_fanout(3)
    node = g.nodes()[0]
    assert role(node, node.ranges, ()) in (Role.INNER, None)
    assert Role.INNER == "inner" and {"inner": 1}[Role.INNER] == 1


# -- rules the source keeps -------------------------------------------------------------------------------
def test_passes_use_the_graph_api_only():
    offenders = [f"{p.name}:{k}" for p in _sources(PACKAGE / "passes")
                 for k, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.nx\b", line)]
    assert not offenders, f"passes reach into graph.nx: {offenders}"


def test_no_meaning_from_letters_and_one_members_helper():
    patterns = [r"hasattr\(\w+, \"members\"\)", r"\.name\[0\]", r"name\.startswith\(\(\"[a-z]\"",
                r"\[oq\]", r"__dict__"]
    offenders = [f"{p.relative_to(ROOT)}:{k}: {line.strip()}" for p in _sources()
                 for k, line in enumerate(p.read_text().splitlines(), 1)
                 if any(re.search(pat, line) for pat in patterns)]
    assert not offenders, "\n".join(offenders)


def test_the_environment_is_read_in_one_place():
    offenders = [f"{p.relative_to(ROOT)}:{k}" for p in _sources()
                 for k, line in enumerate(p.read_text().splitlines(), 1)
                 if "PASSLINE_" in line and re.search(r"environ|getenv", line) and p.name != "config.py"]
    assert not offenders, f"PASSLINE_* read outside passline/config.py: {offenders}"


# -- benchmarks -------------------------------------------------------------------------------------------
def test_every_benchmark_script_imports():
    """Every script in benchmarks/ imports on this machine (no GPU needed to import): most run only on a
    GPU, where a broken import costs a lease's minutes to find (norm_probe.py imported RMSNorm from a module
    that no longer defined it). One subprocess, so the scripts' imports and sys.path edits stay out of this
    one; `__main__` blocks do not run."""
    import subprocess
    import sys

    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    code = ("import importlib.util, sys\n"
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
            "for path in sys.argv[1:]:\n"
            "    spec = importlib.util.spec_from_file_location('bench_' + path.rsplit('/', 1)[-1][:-3], path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    done = subprocess.run([sys.executable, "-c", code, *map(str, scripts)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
