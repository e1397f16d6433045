#!/usr/bin/env bash
# device_tp.sh — one device call on a multi-GPU machine: build, the TP/SP tests (and optionally the
# single-GPU suite, to catch regressions in shared kernels), logs under $OUT.
# Usage: bash bench/device_tp.sh [gpu-suite-filter|none]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
# Multicast (NVLS) stays off on these shared machines (device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(cat .device-commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  nvidia-smi topo -m 2>&1 | head -8
} | tee "$OUT/env.txt"
echo "== build"
(cmake --preset default && cmake --build --preset default -j 16) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "== test_tp"
[ "${TP_TEST:-1}" = 1 ] && (cd build && time ./tests/test_tp) 2>&1 | tee "$OUT/test_tp.log" | tail -80
if [ "${TP_BENCH:-1}" = 1 ]; then
  n=$(nvidia-smi -L | wc -l)
  for tp in 2 4; do
    [ "$tp" -le "$n" ] || continue
    echo "== tp_compare tp=$tp"
    rm -f /tmp/nccl.*.log
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log FLCE_LIBRARY=$PWD/build/libflce.so \
      timeout 300 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$OUT" ${TP_ARGS:-} 2>&1 | tee "$OUT/tp_compare-$tp.log"
    cat /tmp/nccl.*.log 2>/dev/null | head -c 2000000 > "$OUT/nccl-coll-$tp.log"
  done
fi
filter=${1:-}
if [ "$filter" != none ]; then
  echo "== test_gpu ${filter}"
  (cd build && FLCE_TEST_FILTER=$filter ./tests/test_gpu) > "$OUT/test_gpu.log" 2>&1
  grep -E "^(ok|FAIL)|passed|check failed" "$OUT/test_gpu.log" | tail -30
fi
