"""The `passline` command, run as a subprocess."""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = str(ROOT / "examples" / "models.py")


def run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "passline.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def test_passes_lists_the_registry():
    p = run("passes")
    assert p.returncode == 0, p.stderr
    for name in ("dce", "fuse", "reorder_loops", "mix_order_reduction"):
        assert name in p.stdout
    assert "max_nodes (int, default 64)" in p.stdout


def test_explain_shows_passes_kernels_and_refusals():
    p = run("explain", f"{MODELS}:transposed", "--shape", "16x24", "--pipeline", "dce, fuse")
    assert p.returncode == 0, p.stderr
    assert "fuse" in p.stdout and "kernels: 2" in p.stdout
    assert "loop order mismatch" in p.stdout
    p = run("explain", f"{MODELS}:MLP", "--graphs")  # inputs from example_inputs()
    assert p.returncode == 0, p.stderr
    assert "extern calls: 2" in p.stdout and "-- after" in p.stdout


def test_draw_writes_a_picture_or_dot(tmp_path):
    out = tmp_path / "graph.svg"
    p = run("draw", f"{MODELS}:LayerNorm32", "--shape", "64x32", "--backward", "--graph", "backward",
            "--out", str(out))
    assert p.returncode == 0, p.stderr
    written = out if out.exists() else out.with_suffix(".dot")
    text = written.read_text()
    assert ("<svg" in text) if written.suffix == ".svg" else text.startswith("digraph")
    assert "reduction" in text


def test_bisect_names_the_culprit(tmp_path):
    target = tmp_path / "buggy.py"
    target.write_text(textwrap.dedent('''
        import attrs, torch, passline
        from passline.ir import Op, Pointwise

        @passline.register_pass("cli_planted_bug", replace=True)
        def cli_planted_bug(graph, ctx):
            for k, node in enumerate([n for n in graph.nodes() if isinstance(n, Pointwise)], 1):
                if ctx.decide("rewrite", node) and k == 2:
                    graph.replace_node(node.name, attrs.evolve(node, body=Op("neg", (node.body,), node.body.dtype)))
            return graph

        def fn(x):
            return ((x * 2 + 1).exp() - 3).tanh()
    '''))
    p = run("bisect", f"{target}:fn", "--shape", "8x4", "--pipeline", "dce, cli_planted_bug",
            "--save-dir", str(tmp_path))
    assert p.returncode == 1, p.stderr  # a mismatch was found
    assert "cli_planted_bug" in p.stdout and "#2 rewrite" in p.stdout


def test_bad_arguments_get_a_clear_message(tmp_path):
    p = run("explain", "nosuchfile.py:fn", "--shape", "4")
    assert p.returncode == 2 and "no such file" in p.stderr
    p = run("explain", f"{MODELS}:nothing", "--shape", "4")
    assert p.returncode == 2 and "has no 'nothing'" in p.stderr
    p = run("explain", f"{MODELS}:layer_norm", "--shape", "4x4", "--pipeline", "dce, fusee")
    assert p.returncode == 2 and "did you mean 'fuse'" in p.stderr
    plain = tmp_path / "plain.py"
    plain.write_text("def fn(x):\n    return x * 2\n")
    p = run("explain", f"{plain}:fn")  # no --shape and no example_inputs() in the file
    assert p.returncode == 2 and "--shape" in p.stderr
    p = run("frobnicate")
    assert p.returncode == 2


def test_more_bad_arguments_get_one_line_not_a_traceback(tmp_path):
    """An API campaign's finds (thirty-seventh session): each gave a raw traceback (exit 1) or drew the wrong graph."""
    m = tmp_path / "m.py"
    m.write_text(textwrap.dedent("""
        import torch
        def f(x):
            return (x * 2).exp()
        def g(x, y):
            return x + y
        class NeedsArgs(torch.nn.Module):
            def __init__(self, n):
                super().__init__()
    """))
    cases = {("explain", f"{m}:f", "--shape", "4x-3"): "sizes are 0 or more",
             ("explain", f"{m}:g", "--shape", "4"): "cannot take 1 inputs",
             ("explain", f"{m}:torch", "--shape", "4"): "is a module",
             ("explain", f"{m}:NeedsArgs", "--shape", "4"): "cannot be made without arguments",
             ("draw", f"{m}:f", "--shape", "4x4", "--out", str(tmp_path / "nodir" / "g.dot")): "no such directory",
             ("draw", f"{m}:f", "--shape", "4x4", "--out", str(tmp_path / "g.dot"), "--graph", "backward"):
                 "no compiled graph is 'backward'"}
    for args, message in cases.items():
        p = run(*args)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "g.dot").exists()


def test_python_dash_m_passline_is_the_command():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "passline", "passes"], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0 and "fuse" in p.stdout
