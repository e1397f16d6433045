#!/bin/bash
# Issue 7's device run in one call: build, the new GPU tests (fault injection, concurrency, fuzz
# smoke), the cost of problem.deterministic, and `flce fuzz` (>= 2,000 cases, 16 workers).
# Logs go to $OUT (the device tool) or ./fuzz-out.  Usage: bench/fuzz_device.sh [CASES] [SECONDS]
set -o pipefail
out=${OUT:-fuzz-out}; mkdir -p "$out"
cases=${1:-2000}; limit=${2:-330}
{ date -u; echo "commit $(cat .device-commit 2>/dev/null || git rev-parse --short HEAD)"; nvidia-smi -L; nproc; } | tee "$out/env.txt"
cmake --preset default >/dev/null && cmake --build build -j "$(nproc)" 2>&1 | tail -1 || exit 1
export FLCE_CACHE_DIR=/tmp/flce-fuzz-cache
(cd build && ctest -R 'test_fault_gpu|test_concurrency|fuzz_gpu_smoke' --timeout 180 -V) 2>&1 | tee "$out/ctest-new-gpu.log" | grep -E '^[0-9]+: (ok|FAIL|  |    |no GPU|seed)|Test +#|tests passed|skipped'
./build/flce_det_cost 2>&1 | tee "$out/det-cost.log"
echo "command: build/flce fuzz --seed 20261122 --cases $cases --jobs 16 --time-limit $limit"
./build/flce fuzz --seed 20261122 --cases "$cases" --jobs 16 --time-limit "$limit" 2>&1 | tee "$out/fuzz.log" | grep -v '^ok '
