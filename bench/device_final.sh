#!/usr/bin/env bash
# device_final.sh — the whole tree checked in one call on a 2-GPU machine: build, every GPU test
# (both single-GPU suites, TP/SP, fault injection, concurrency incl. two devices, fuzz smoke), the
# TP benchmark, the demo, and `flce fuzz` (2,000 cases) in the time left. Logs under $OUT.
# Usage: bash bench/device_final.sh [fuzz-cases] [fuzz-seconds]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG=$OUT/final.log
start=$(date +%s)
step() { echo "== $1 ($(date +%T))" | tee -a "$LOG"; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(cat .device-commit 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  nproc
} | tee "$OUT/env.txt"
step build
(cmake --preset default && cmake --build --preset default -j "$(nproc)") > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
step "gpu tests"
(cd build && timeout 330 ctest --output-on-failure --timeout 320 -L gpu -V -j6) > "$OUT/ctest-gpu.log" 2>&1
grep -E '^[0-9]+: (FAIL|[0-9]+ passed|ok )|tests passed|Failed|Passed|Timeout|skipped' "$OUT/ctest-gpu.log" | tail -60 | tee -a "$LOG"
gpus=$(nvidia-smi -L | wc -l)
for tp in 2 4; do
  [ "$tp" -le "$gpus" ] || continue
  step "tp_compare tp=$tp"
  rm -f /tmp/nccl.*.log
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log FLCE_LIBRARY=$PWD/build/libflce.so \
    timeout 120 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$OUT" > "$OUT/tp_compare-$tp.log" 2>&1
  grep '^|' "$OUT/tp_compare-$tp.log" | tee -a "$LOG"
done
step demo
timeout 60 ./build/flce demo 2>&1 | tail -3 | tee -a "$LOG"
cases=${1:-2000}; secs=${2:-$(( ${BUDGET_S:-540} - ($(date +%s) - start) - 15 ))}
step "flce fuzz --seed 20261122 --cases $cases --jobs $(nproc) --time-limit $secs"
./build/flce fuzz --seed 20261122 --cases "$cases" --jobs "$(nproc)" --time-limit "$secs" > "$OUT/fuzz.log" 2>&1
grep -v '^ok ' "$OUT/fuzz.log" | tail -40 | tee -a "$LOG"
step done
