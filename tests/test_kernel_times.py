"""benchmarks/kernel_times.py on the CPU: a case's training step compiled and run through Triton's interpreter,
each passline kernel listed with the configuration it launched with, the gradients as eager's."""
import argparse
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_cpu_run_lists_each_kernel_with_its_configuration(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "kt.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernel_times.py"), "gelu_epilogue:64x300:float32",
           "--device", "cpu", "--json", str(out), "--pipeline", "unfused=dce"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (result,) = json.loads(out.read_text())
    assert result["case"] == "gelu_epilogue:64x300:float32"
    assert list(result["contenders"]) == ["passline", "passline unfused"]  # no GPU: no Inductor, no autotuning
    # --pipeline's contender: the same step, every node its own kernel (dce only: no fusion)
    unfused = result["contenders"]["passline unfused"]
    assert unfused["rel_err"] <= 1e-5 and len(unfused["kernels"]) > len(result["contenders"]["passline"]["kernels"])
    run = result["contenders"]["passline"]
    assert run["rel_err"] <= 1e-5 and run["total_us"] is None
    # the GELU epilogue's backward: the bias gradient's mix-order kernel and its finishing kernel, each with the
    # variant and blocks it launched with; the forward's pointwise kernel
    configs = {k["kernel"]: k["config"] for k in run["kernels"]}
    assert any(c.startswith("mix_order") and "SPLIT" in c for c in configs.values()), configs
    assert any(name.endswith("_finish") for name in configs), configs
    assert all(c and k["us"] is None for k, c in zip(run["kernels"], configs.values()))


def test_case_text_is_checked():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kernel_times

    assert kernel_times.parse_case("rms_norm:8192x2304:float32") == ("rms_norm", 8192, 2304, torch.float32)
    with pytest.raises(argparse.ArgumentTypeError, match="CASE:ROWSxWIDTH:DTYPE"):
        kernel_times.parse_case("rms_norm:8192:float32")
    assert kernel_times.pipeline_option("p8=dce, fuse(max_nodes=8)") == "p8=dce, fuse(max_nodes=8)"
    for bad in ("dce, fuse(max_nodes=8)", "p8=", "dce"):  # no label: the pipeline's text cut at its first '='
        with pytest.raises(argparse.ArgumentTypeError, match="LABEL=PIPELINE"):
            kernel_times.pipeline_option(bad)
