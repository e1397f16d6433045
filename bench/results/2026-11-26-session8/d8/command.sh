#!/bin/bash
# session 8, call d8 (one H100): racecheck over the fp32 FFMA cases at their new shapes, then synccheck + initcheck over every case
cd "$(dirname "$0")"
. bench/device_lib.sh
device_env $OUT/env.txt > /dev/null
device_build $OUT/build.log || exit 1
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz * && mv /tmp/all.tgz all.tgz); }
export FLCE_REQUIRE_GPU=1
SANITIZE_LOG_DIR=$OUT/san1 SANITIZE_CASES='f32-ffma' SANITIZE_TOOLS='racecheck' SANITIZE_JOBS=5 SANITIZE_TIMEOUT=240 \
  timeout 250 bash tests/sanitize.sh build/flce build/tests/gpu_probe > $OUT/sanitize-ffma-racecheck.log 2>&1
echo "status $?" >> $OUT/sanitize-ffma-racecheck.log
grep -E "^[a-z0-9-]+ +racecheck|runs passed|status" $OUT/sanitize-ffma-racecheck.log
pack
SANITIZE_LOG_DIR=$OUT/san2 SANITIZE_TOOLS='synccheck initcheck' SANITIZE_JOBS=8 SANITIZE_TIMEOUT=120 \
  timeout 240 bash tests/sanitize.sh build/flce build/tests/gpu_probe > $OUT/sanitize-sync-init.log 2>&1
echo "status $?" >> $OUT/sanitize-sync-init.log
grep -E "runs passed|FAIL|status" $OUT/sanitize-sync-init.log | head -20
pack
