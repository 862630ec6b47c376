"""benchmarks/models.py: its smoke run (tiny GPT-2, LLaMA and ResNet training steps, eager and passline
through Triton's interpreter) exits 0 with every check passing; its check's verdict; its option errors."""
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from modules import benchmark_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "models.py"



def test_smoke_run_passes_every_check(tmp_path):
    out = tmp_path / "models.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--no-inductor", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "| model | contender | check |" in proc.stdout and "checks: all passed" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    passline_rows = {r["model"]: r for r in rows if r["contender"] == "passline"}
    assert set(passline_rows) == {"gpt2", "llama", "resnet"}
    for model, r in passline_rows.items():
        assert r["passed"] and r["check"] == "ok", (model, r)
        assert r["passline_codegen"] == ["triton"], (model, r["passline_codegen"])  # the interpreter, not the oracle
        assert not r["passline_failures"] and r["passline_kernels"] > 0, (model, r)
        assert {k.rstrip("0123456789") for k in r["passline_graphs"]} == {"forward", "backward"}, r["passline_graphs"]


def test_verdict_is_relative_to_eager_error():
    mod = benchmark_script("models")
    eager = {"loss": 1e-3, "w": 5e-3, "b": 0.2}
    assert mod.verdict({"loss": 2e-3, "w": 1e-2, "b": 0.7}, eager, torch.bfloat16)[0]
    passed, worst, where = mod.verdict({"loss": 2e-3, "w": 3e-2, "b": 0.1}, eager, torch.bfloat16)
    assert not passed and where == "w"  # 3e-2 > max(1e-2, 4 * 5e-3)
    assert not mod.verdict({"loss": math.nan, "w": 0.0, "b": 0.0}, eager, torch.bfloat16)[0]
    assert not mod.verdict({"loss": 0.0, "w": math.inf, "b": 0.0}, eager, torch.bfloat16)[0]  # a missing gradient
    assert not mod.verdict({"loss": 2e-4, "w": 0.0}, {"loss": 0.0, "w": 0.0}, torch.float32)[0]  # floor 1e-4


@pytest.mark.parametrize("option, message", [("nonsense=1", "unknown passline option(s) nonsense"),
                                             ("kernel_variant=bogus", "kernel_variant must be one of"),
                                             ("fallback=eager", "always uses fallback='raise'")])
def test_bad_passline_option_is_a_clear_error(option, message, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main() sets it for --device cpu: undone after the test
    with pytest.raises(SystemExit) as exit_:
        benchmark_script("models").main(["--device", "cpu", "--keep-caches", "--passline-option", option])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_first_call_smoke_reports_every_stage(tmp_path):
    """benchmarks/first_call.py (where a first training step's time goes, on a machine without a GPU) runs:
    it patches passline's compile_aten, so a change of that signature broke it unnoticed once."""
    hashes = tmp_path / "hashes.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "first_call.py"), "--models", "gpt2", "--smoke",
           "--compile", "", "--hashes", str(hashes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| gpt2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[1]) == 2 and int(cells[2]) > 0  # a forward and a backward graph, kernels generated
    assert cells[3] == cells[4]  # every binary the first call launches is compiled before it (launches, jobs)
    assert all(float(c) >= 0 for c in cells[5:])  # every stage timed
    graphs = json.loads(hashes.read_text())["gpt2"]
    assert {g.rstrip("0123456789") for g in graphs} == {"forward", "backward"}, graphs
    assert all(g["kernels"] for g in graphs.values())


def test_first_calls_runs_cold_then_warm_in_fresh_processes(tmp_path):
    """benchmarks/first_calls.py: each first step in a process of its own, cold then warm on the same caches; it
    patches passline's backend entry and compile_aten to mark where the time goes, so a change of either
    signature must show here, not on a GPU lease. The warm run finds the graphs the cold one stored."""
    out = tmp_path / "first.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "first_calls.py"), "--device", "cpu", "--smoke", "--models",
           "gpt2", "--contenders", "passline:aot_cache=1", "--rounds", "1", "--steps", "1", "--out", str(out),
           "--no-warmup"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "| gpt2 | passline:aot_cache=1 |" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["state"] for r in runs] == ["cold", "warm"]
    for r in runs:
        marks = r["marks"]
        # timed from passline's import, as a user waits: the step alone is the part after torch.compile()
        assert 0 < marks["compile()"] <= marks["dynamo"] <= marks["aot"] <= marks["forward"] <= marks["backward"]
        assert r["first_call_s"] == marks["backward"]
        assert 0 < r["first_step_s"] <= r["first_call_s"] - marks["compile()"] + 1e-3
        assert [g["name"].rstrip("0123456789") for g in r["graphs"]] == ["forward", "backward"]
    cold, warm = runs
    assert all(g["passes"] > 0 for g in cold["graphs"])  # lowered and scheduled
    assert all(g["passes"] == 0 for g in warm["graphs"])  # the graph cache's: nothing scheduled again
    # aot_autograd's cache (backends/aot_cache.py, asked for): nothing traced again either
    assert [g["aot_cache_hit"] for g in cold["graphs"]] == [False, False]
    assert [g["aot_cache_hit"] for g in warm["graphs"]] == [True, True]


def test_first_calls_reads_a_contenders_settings_as_passlines_variables():
    """`passline:SETTING=VALUE[+...]`: each value read as its PASSLINE_* variable is (a flag's "0" is off, not a
    true string), `passline:processes` and `passline:threads` short for compile_in=...; an unknown setting or a
    bad value stops the script before any run, naming it."""
    fc = benchmark_script("first_calls")
    assert fc.contender_settings("passline") == {}
    assert fc.contender_settings("passline:processes") == {"compile_in": "processes"}
    assert fc.contender_settings("passline:threads") == {"compile_in": "threads"}
    assert fc.contender_settings("passline:autotune=0+compile_in=off") == {"autotune": False, "compile_in": "off"}
    with pytest.raises(SystemExit, match="a setting among"):
        fc.contender_settings("passline:turbo=1")
    with pytest.raises(SystemExit, match="PASSLINE_AUTOTUNE='maybe'"):
        fc.contender_settings("passline:autotune=maybe")
    with pytest.raises(SystemExit, match="unknown contender 'tvm'"):
        fc.main(["--contenders", "inductor,tvm"])
