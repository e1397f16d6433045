#!/usr/bin/env bash
# device_run.sh — everything one device call does: build, every test (cpu and gpu), `flce demo`,
# logs under $OUT (default ./device-out). Usage: bash bench/device_run.sh [extra demo args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The device gets a copy of the tree without .git: bench/stamp-commit.sh writes .device-commit here.
  echo "commit: $(cat .device-commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
  nvcc --version | tail -1; cmake --version | head -1; gcc --version | head -1
} | tee "$OUT/env.txt"
step() { echo "== $1"; }
step build
(cmake --preset default && cmake --build --preset default) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
step tests
(cd build && ctest --output-on-failure -j4 --timeout 900 -L cpu) 2>&1 | tee "$OUT/ctest-cpu.log" | grep -vE '^\s+(made|hit) ' | tail -15
# GPU tests verbosely: their per-case error table is part of the record.
(cd build && ctest --output-on-failure --timeout 900 -L gpu -V -j2) 2>&1 | tee "$OUT/ctest-gpu.log" | grep -E '^[0-9]+: (ok|FAIL|  |[0-9]+ passed)|tests passed|Failed|Passed' | tail -80
step demo
./build/flce demo "$@" 2>&1 | tee "$OUT/demo.log"
