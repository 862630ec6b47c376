#!/usr/bin/env bash
# On the GPU machine: norm_probe for the bf16 norm rows (sources and logs to $OUT).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PASSLINE_CACHE_DIR=${PASSLINE_CACHE_DIR:-/tmp/passline-probe} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/probe}; mkdir -p "$OUT/src"
for spec in ${PROBES:-layer_norm:576000x384 layer_norm:32768x4096 rms_norm:576000x384}; do
  python3 benchmarks/norm_probe.py --norm "${spec%%:*}" --shape "${spec##*:}" --dtype "${DTYPE:-bfloat16}" \
    --splits "${SPLITS:-0}" --out "$OUT/src" 2>&1 | grep -v Warning | tee -a "$OUT/probe.txt"
done
cd "$OUT" && tar czf src.tgz src && rm -rf src
