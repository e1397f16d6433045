#!/usr/bin/env bash
# device_py.sh — after bench/device_run.sh built the library: the Python binding's checks and a
# quick side-by-side benchmark (compare.py). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLCE_LIBRARY=$PWD/build/libflce.so
python3 python/check_layout.py 2>&1 | tail -3 | tee "$OUT/py-layout.log"
python3 python/test_binding.py 2>&1 | tee "$OUT/py-binding.log" | tail -8
python3 bench/compare.py "$@" 2>&1 | tee "$OUT/compare.log" | tail -40
