#!/usr/bin/env bash
# On the GPU machine: the end-to-end tests on CUDA tensors with codegen=triton (configurations by rule, to keep
# it quick), every timed candidate configuration checked (config_check.py), then the benchmark suite.
# Results go to $OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PASSLINE_CACHE_DIR=${PASSLINE_CACHE_DIR:-/tmp/passline-cache}
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  PASSLINE_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_models.py tests/test_passes.py tests/test_triton.py tests/test_lowering.py tests/test_layouts.py tests/test_dynamic.py tests/test_runtime_edge_cases.py tests/test_indexing.py \
    -k "${TEST_FILTER:-not scales and not cache and not auto_codegen and not index_width}" 2>&1 | tail -25 | tee "${OUT:-/tmp}/tests.txt"
fi
if [ "${SKIP_CONFIGS:-0}" != 1 ]; then  # every timed candidate of the row kernels against the real launch's
  python3 benchmarks/config_check.py 2>&1 | grep -v Warning | tee "${OUT:-/tmp}/configs.txt" | tail -8
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 benchmarks/gpu_suite.py "$@" 2>&1 | grep -v Warning | tee "${OUT:-/tmp}/bench.txt" | tail -60
fi
