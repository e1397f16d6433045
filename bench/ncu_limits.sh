#!/usr/bin/env bash
# ncu_limits.sh — what limits each GEMM kernel, at a locked clock (ncu --clock-control base): flce's
# role kernels of one AUTO loss-and-grad call (logits with the compact epilogue, the dz pass, dH,
# dW; FLCE_DEV=grad_streams=0 so dH and dW run alone) and cuBLAS's kernels for the same three GEMMs
# (bench/role_gemms.py), at $SHAPE; with PORTABLE=1 also the mma.sync forward at $PORTABLE_SHAPE
# and the fp32 (FFMA) dH and dW at $F32_SHAPE (issue 19). Sections: speed of light, compute (pipe
# utilization), memory (L2/DRAM), warp stalls; one text report per kernel group under $OUT, and a
# summary of the lines that say where the time goes in $OUT/ncu-limits.md.
# Usage, on the GPU machine after the build: OUT=dir bash bench/ncu_limits.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/ncu-out}
mkdir -p "$OUT"
SHAPE=${SHAPE:-8192x4096x128256}
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats)
NCU=(ncu --clock-control base "${SECTIONS[@]}" --metrics sm__cycles_elapsed.avg.per_second)
BENCH=(./build/flce bench --strategies auto --logit-std 4 --warmup 0 --iters 1 --sets 1)
SUMMARY=$OUT/ncu-limits.md
keep='^  [a-zA-Z_]+|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|L2 Cache Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Stall|Registers Per|Achieved Occupancy|Block Limit Shared|Dynamic Shared|Grid Size|Waves Per SM|Max Bandwidth|Mem Pipes Busy|SM Busy|Shared Load|Shared Store|Bank'

profile() { # NAME then the command (after ncu's own options)
  local name=$1
  shift
  echo "== $name: $*" >&2
  timeout 240 "${NCU[@]}" "$@" > "$OUT/ncu-$name.txt" 2>&1
  echo "status $?" >> "$OUT/ncu-$name.txt"
  { echo "## $name"; echo '```'; grep -E "$keep" "$OUT/ncu-$name.txt" | grep -vE '^==PROF==|^  *-' | head -120; echo '```'; } >> "$SUMMARY"
}

: > "$SUMMARY"
# ncu replays every kernel it profiles: warm the kernel cache first so JIT compiles stay outside
"${BENCH[@]}" --shapes "$SHAPE" > /dev/null 2>&1
FLCE_DEV=grad_streams=0 profile "flce-$SHAPE" -k 'regex:^flce_(logits|dz|dh|dw)$' -c 4 \
  "${BENCH[@]}" --shapes "$SHAPE"
profile "cublas-$SHAPE" --profile-from-start off python3 bench/role_gemms.py "$SHAPE"
if [ "${PORTABLE:-0}" = 1 ]; then
  ps=${PORTABLE_SHAPE:-8192x2304x256000}
  FLCE_PORTABLE=1 ./build/flce bench --strategies forward --warmup 0 --iters 1 --sets 1 --shapes "$ps" > /dev/null 2>&1
  FLCE_PORTABLE=1 profile "portable-forward-$ps" -k 'regex:^flce_logits$' -c 1 \
    ./build/flce bench --strategies forward --warmup 0 --iters 1 --sets 1 --shapes "$ps"
  fs=${F32_SHAPE:-4096x2048x32000}
  "${BENCH[@]}" --dtype f32 --shapes "$fs" > /dev/null 2>&1
  FLCE_DEV=grad_streams=0 profile "f32-$fs" -k 'regex:^flce_(logits|dh|dw)$' -c 3 "${BENCH[@]}" --dtype f32 --shapes "$fs"
fi
echo "summary: $SUMMARY" >&2
