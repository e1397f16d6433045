#!/usr/bin/env bash
# device_bench.sh — one device call for `flce bench` (issue 4): build, then every default shape and
# strategy at logit std 4 and 0.5; Markdown and JSON under $OUT (default ./device-out).
# Usage: bash bench/stamp-commit.sh (here), then on the device: bash bench/device_bench.sh [extra bench args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(cat .device-commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
  nvcc --version | tail -1; cmake --version | head -1; gcc --version | head -1
} | tee "$OUT/env.txt"
echo "== build"
(cmake --preset default && cmake --build --preset default -j16) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
./build/flce bench --list > "$OUT/bench-list.md"
echo "== bench (progress on stderr: bench.log)"
# Untimed so far: the host-side fp64 reference of the large shapes is the unknown cost; if a 600 s
# call runs out, split with --shapes or lower --samples.
./build/flce bench --logit-std 4,0.5 --json "$OUT/bench.json" "$@" 2> >(tee "$OUT/bench.log" >&2) | tee "$OUT/bench.md"
echo "status ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
