#!/usr/bin/env bash
# portable_ab.sh — issue 19's device check of the portable mma.sync / FFMA kernels, within about 6
# minutes: build, the portable GPU suite and the portable tile shapes' compile test, `flce bench`
# with FLCE_PORTABLE=1 (bf16 at the Llama-3 and Gemma shapes, fp32 at a small one) and the
# ceilings (flce_mma_peak bf16, f32), everything logged under $OUT.
# With an older tree in prev/ (AB_TREE; e.g. `git archive 25ad189 | tar -x -C prev`, carried with
# the run), its bf16 bench at the first shape runs too, alternating with this tree's, so both sets
# of numbers come from the same GPU.
# Usage, from the repository root on the GPU machine: bash bench/portable_ab.sh
set -uo pipefail
. "$(dirname "$0")/device_lib.sh"
device_begin portable-out
LOG=$OUT/portable.log
START=$(date +%s)
BUDGET=${BUDGET:-350} # seconds for the whole script
left() { local l=$((BUDGET - ($(date +%s) - START))); echo $((l > 5 ? l : 5)); }
step() { echo "== $(date -u +%H:%M:%S) (+$(($(date +%s) - START)) s) $*" | tee -a "$LOG"; }
device_env "$OUT/env.txt" "script: bench/portable_ab.sh" > /dev/null
cat "$OUT/env.txt" >> "$LOG"

step "build"
device_build "$OUT/build.log" || { echo "build failed (build.log)" | tee -a "$LOG"; exit 1; }

step "ctest test_gpu_portable"
timeout "$(left)" ctest --test-dir build -R '^test_gpu_portable$' --output-on-failure > "$OUT/ctest-gpu-portable.log" 2>&1
echo "status $?" >> "$OUT/ctest-gpu-portable.log"
grep -E 'tests passed|tests failed|Failed|FAIL|\*\*\*|status' "$OUT/ctest-gpu-portable.log" | tail -20 | tee -a "$LOG"

# test_compile's portable case only: the whole test compiles every arch's specs on 2 threads (~6 min)
step "ctest test_compile (portable_tile_shapes_compile)"
FLCE_TEST_FILTER=portable timeout "$(left)" ctest --test-dir build -R '^test_compile$' --output-on-failure \
  > "$OUT/ctest-compile.log" 2>&1
echo "status $?" >> "$OUT/ctest-compile.log"
grep -E 'tests passed|tests failed|FAIL|^ok|status' "$OUT/ctest-compile.log" | tail -8 | tee -a "$LOG"

step "ceilings"
for t in bf16 f32; do timeout 60 ./build/flce_mma_peak $t 2>&1 | tee -a "$LOG"; done

bench() { # TREE DTYPE SHAPES TAG
  local tree=$1 dt=$2 shapes=$3 tag=$4
  (cd "$tree" && FLCE_PORTABLE=1 timeout "$(left)" ./build/flce bench --shapes "$shapes" --strategies auto,forward \
    --dtype "$dt" --logit-std 4 --iters 5 --json "$OUT/bench-$tag.json") > "$OUT/bench-$tag.md" 2> "$OUT/bench-$tag.log"
  echo "status $?" >> "$OUT/bench-$tag.log"
  grep -h '^|\|^###' "$OUT/bench-$tag.md" | tee -a "$LOG"
}

step "FLCE_PORTABLE=1 flce bench bf16"
bench . bf16 8192x4096x128256,8192x2304x256000 bf16
step "FLCE_PORTABLE=1 flce bench f32"
bench . f32 4096x2048x32000 f32

ab_tree=${AB_TREE:-prev}
if [ -d "$ab_tree" ] && [ "$(left)" -gt 150 ]; then
  step "A/B against $ab_tree (bf16, 8192x4096x128256; this tree again after it)"
  (cd "$ab_tree" && device_build "$OUT/build-prev.log") > /dev/null || echo "$ab_tree build failed" | tee -a "$LOG"
  [ -x "$ab_tree/build/flce" ] && bench "$ab_tree" bf16 8192x4096x128256 prev
  bench . bf16 8192x4096x128256 again
fi
step "done"
