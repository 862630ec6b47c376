"""benchmarks/sweep.py: its smoke run (two cases, two widths, every direction, through Triton's interpreter)
writes one CSV row per case, direction and shape with passline's checks passed; its summary's arithmetic."""
import csv
import math
import os
import pathlib
import subprocess
import sys

import pytest
from modules import benchmark_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sweep.py"



def test_smoke_run_writes_checked_rows(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--cases", "softmax,rms_norm",
           "--widths", "64,2x100", "--dtypes", "float32", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # 2 cases x 2 shapes x 3 directions; the sized width's rows derived from --smoke's target (2 KiB): 8 x 64
    keys = {(r["case"], r["shape"], r["direction"]) for r in rows}
    assert len(rows) == 12 and keys == {(c, s, d) for c in ("softmax", "rms_norm") for s in ("8x64", "2x100")
                                        for d in ("fwd", "fwd_train", "bwd")}
    assert {r["kind"] for r in rows if r["shape"] == "8x64"} == {"sized"}
    assert {r["kind"] for r in rows if r["shape"] == "2x100"} == {"given"}
    for r in rows:
        assert r["check"] == "ok" and not r["error"], r
        assert float(r["rel_err"]) <= 1e-4, r  # float32's floor (eager's own error is far below it)
        assert r["passline_codegen"] == "triton" and int(r["passline_kernels"]) >= 1, r  # the interpreter ran
        assert r["passline_choices_timed"] == r["passline_choices_refused"] == r["passline_choices_unchecked"] == "0", r
        assert float(r["passline_ms"]) > 0 and float(r["eager_ms"]) > 0 and float(r["compile_s_passline"]) > 0, r
        assert r["inductor_ms"] == "" and r["passline_over_inductor"] == "", r  # --device cpu: no Inductor
        nbytes = {"fwd": 2, "fwd_train": 2, "bwd": 3}[r["direction"]] * int(r["rows"]) * int(r["width"]) * 4
        if r["case"] == "rms_norm" and r["direction"] == "fwd_train":
            nbytes += int(r["rows"]) * 4  # its saved rstd, a float32 per row
        assert float(r["passline_gbs"]) == pytest.approx(nbytes / (float(r["passline_ms"]) * 1e-3) / 1e9, rel=1e-3)
    summary = (tmp_path / "sweep.md").read_text()
    assert "12 rows; passline checks: 12 ok, 0 mismatched, 0 failed." in summary
    # --resume: a second call keeps those 12 rows, runs only the width they lack, and sums up all of them
    proc = subprocess.run(cmd[:cmd.index("--widths") + 1] + ["64,2x100,2x50"] + cmd[cmd.index("--widths") + 2:]
                          + ["--resume"], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "resuming: 12 rows" in proc.stdout
    with open(tmp_path / "sweep.csv", newline="") as f:
        again = list(csv.DictReader(f))
    assert again[:12] == rows and {r["shape"] for r in again[12:]} == {"2x50"} and len(again) == 18
    assert "18 rows; passline checks: 18 ok, 0 mismatched, 0 failed." in (tmp_path / "sweep.md").read_text()


def test_shards_split_the_points_and_merge_them(tmp_path):
    """--shards 2: two processes, each every other point, each in OUT/shardK; OUT/sweep.csv holds every point
    once, checked, and OUT/sweep.md sums them all up."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--cases", "softmax,rms_norm",
           "--widths", "2x100", "--dtypes", "float32", "--directions", "fwd", "--shards", "2", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    shard_cases = []
    for k in (0, 1):
        with open(tmp_path / f"shard{k}" / "sweep.csv", newline="") as f:
            shard_cases.append([r["case"] for r in csv.DictReader(f)])
    assert shard_cases == [["softmax"], ["rms_norm"]]  # every other point
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["case"] for r in rows) == ["rms_norm", "softmax"]
    assert all(r["check"] == "ok" and r["shape"] == "2x100" for r in rows), rows
    assert "2 rows; passline checks: 2 ok, 0 mismatched, 0 failed." in (tmp_path / "sweep.md").read_text()


def test_points_and_summary():
    import torch

    mod = benchmark_script("sweep")
    pts = list(mod.points("1000,64x30000", torch.bfloat16, 256 * 2**20))
    assert pts == [(134218, 1000, "sized"), (64, 30000, "given")]  # 256 MiB / (1000 x 2 bytes), rounded
    assert [mod.shape_class(*s) for s in ((4096, 1024), (1000, 1000), (64, 30000))] == ["tall", "square", "wide"]
    assert mod.geomean([2.0, 0.5, None]) == pytest.approx(1.0) and math.isnan(mod.geomean([]))
    row = dict(case="softmax", direction="bwd", dtype="float32", shape="8x64", kind="sized", check="ok", error="",
               passline_ms=2.0, inductor_ms=1.0, passline_over_inductor=2.0, passline_pct_copy=40.0,
               compile_s_passline=3.0)
    fast = dict(row, case="rms_norm", passline_ms=0.5, passline_over_inductor=0.5, passline_pct_copy=90.0,
                compile_s_passline=1.0)
    text = mod.summary([row, fast], "# header", [])
    assert "All points: **1.000** (2 points)" in text  # sqrt(2.0 * 0.5)
    assert "| softmax | 2.000 | 2.000 |" in text and "By dtype: float32 1.000" in text
    assert "slower than 1.05x Inductor (1)" in text and "under 85% of copy bandwidth (1)" in text
    assert "passline: median 3.0, max 3.0, total 4" in text
    assert "timed a choice" not in text  # no point timed one
    timed = dict(fast, passline_choices_timed=2, passline_choices_refused=1)
    text = mod.summary([row, timed], "# header", [])
    assert "timed a choice at the first call: 1; where a timed choice disagreed with the rule's result and was " \
           "refused: 1\n- rms_norm bwd float32 8x64: 1 refused" in text
    assert "unchecked" not in text
    text = mod.summary([row, dict(timed, passline_choices_unchecked=1)], "# header", [])
    assert "left unchecked (the rule's configuration did not run): 1\n- rms_norm bwd float32 8x64: 1 unchecked" in text
    assert "No point has both times" in mod.summary([dict(row, passline_over_inductor=None)], "# h", [])
    # the bar by kernels: a step at 40% of copy whose kernels take a quarter of it move 160%, not behind; one whose
    # kernels take 0.8 of the step (50%) and more than Inductor's is listed, with both kernel shares (Inductor's
    # step 1.0 ms at 50%, its kernels 0.5 ms: 100%)
    host_bound = dict(row, passline_kernel_ms=0.5, inductor_kernel_ms=0.25, kernels_over_inductor=2.0)
    assert mod.kernel_pct_copy(host_bound) == pytest.approx(160.0)
    text = mod.summary([host_bound], "# h", [])
    assert "slower than Inductor: by step 1, by kernels 0\n\nNone by kernels." in text
    behind = dict(row, passline_kernel_ms=1.6, inductor_kernel_ms=0.5, kernels_over_inductor=3.2,
                  inductor_pct_copy=50.0)
    text = mod.summary([behind, fast], "# h", [])
    assert "by step 1, by kernels 1\n" in text and "| 40 | 50 / 100 | ok |" in text
    assert mod.kernel_pct_copy(dict(row, passline_kernel_ms=None)) is None


def test_bad_arguments_are_refused_before_running(capsys):
    mod = benchmark_script("sweep")
    for argv, message in ((["--widths", "64,wide"], "--widths '64,wide'"), (["--cases", "lay_norm"], "unknown case"),
                          (["--directions", "backward"], "unknown direction"), (["--rounds", "0"], "--rounds"),
                          (["--shards", "0"], "--shards")):
        with pytest.raises(SystemExit) as exit_:
            mod.parse(["--device", "cpu", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_plot_writes_one_svg_per_case(tmp_path):
    pytest.importorskip("matplotlib")  # the `bench` extra, not the test one
    mod = benchmark_script("sweep")
    path = tmp_path / "sweep.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=mod.COLUMNS)
        w.writeheader()
        for case in ("softmax", "layer_norm"):
            for d in mod.DIRECTIONS:
                for width, kind in ((64, "sized"), (4096, "sized"), (30000, "given")):
                    w.writerow(dict(case=case, direction=d, dtype="bfloat16", width=width, kind=kind,
                                    passline_pct_copy=50, inductor_pct_copy=""))  # a missing value is skipped
    written = mod.plot(str(path), str(tmp_path / "img"))
    assert sorted(p.name for p in written) == ["sweep_layer_norm.svg", "sweep_softmax.svg"]
    assert all(p.read_text().lstrip().startswith("<?xml") for p in written)


def test_rounds_interleave_contenders_and_a_failing_one_spares_the_others():
    mod = benchmark_script("sweep")
    order = []

    def call(label, d, fail=False):
        def run():
            order.append((label, d))
            if fail:
                raise RuntimeError(f"{label} broke")
        return run

    calls = {"eager": {"fwd": call("eager", "fwd")},
             "inductor": {"fwd": call("inductor", "fwd"), "bwd": call("inductor", "bwd")},
             "passline": {"fwd": call("passline", "fwd"), "bwd": call("passline", "bwd", fail=True)}}
    timed, errors = mod.time_rounds(calls, "cpu", 1, 3)
    # round r starts at the r-th contender: each leads once; passline's failure ends its rounds only
    assert [label for label, d in order if d == "fwd"][:3] == ["eager", "inductor", "passline"]
    assert order[5:8] == [("inductor", "fwd"), ("inductor", "bwd"), ("eager", "fwd")]  # round 2: inductor first
    assert set(timed) == {"eager", "inductor"} and list(errors) == ["passline"]
    assert [len(v) for v in timed["inductor"].values()] == [3, 3] and len(timed["eager"]["fwd"]) == 3
    assert sum(1 for label, _ in order if label == "passline") == 2  # one failing round, never again
