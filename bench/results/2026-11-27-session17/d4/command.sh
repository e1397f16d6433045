#!/bin/bash
# session 17 d4 (1 GPU): the three fuzz failures of seed 20261127 (d3) under knobs that switch off
# one feature each; the whole 2000-case run with --verbose beside them (which case ran long?)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d4; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d4.tgz d4); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -6 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
(FLCE_CACHE_DIR=/tmp/flce-cache-fuzz timeout 420 ./build/flce fuzz --seed 20261127 --cases 2000 --jobs 12 --time-limit 380 --verbose > $R/fuzz.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz.log) &
fz=$!
export FLCE_CACHE_DIR=/tmp/flce-cache
for k in 741 1232 1346; do
  for knob in NONE=1 FLCE_COMPACT=0 FLCE_CLUSTER=0 FLCE_BULK_RED=0 FLCE_LOGITS_CLUSTER=0 FLCE_TMA=0 FLCE_PORTABLE=1 FLCE_RED_ACC=0 FLCE_GRAD_STREAMS=0; do
    out=$(env $knob timeout 60 ./build/flce fuzz --seed 20261127 --case $k 2>&1)
    echo "== case $k $knob: $(echo "$out" | grep -c FAIL) fail"
    echo "$out" | grep -E "FAIL|over|worst" | sed 's/.*# N=/  # N=/' | cut -c1-700
  done
done 2>&1 | tee $R/bisect.log | head -150
echo "bisect at $(( $(date +%s) - t0 )) s"
wait $fz; tail -c 600 $R/fuzz.log; echo; grep -a "FAIL" $R/fuzz.log | cut -c1-400
python3 - $R/fuzz.log <<'PY'
import re,sys
s=open(sys.argv[1],errors='replace').read()
done=set(int(x) for x in re.findall(r'(?:ok  |FAIL) case (\d+)',s))
print("cases reported:",len(done),"missing:",sorted(set(range(2000))-done)[:20])
PY
echo "t $(( $(date +%s) - t0 )) s"
