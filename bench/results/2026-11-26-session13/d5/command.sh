#!/usr/bin/env bash
# session 13 d5: the 4096x2048x32000 std-0.5 outlier of d4 (bimodal dH/dW streams?) and qrows at 512 tokens
set -u
cd "$(dirname "$0")"
R=/tmp/d5; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache-d5
pack() { (cd /tmp && tar czf $OUT/d5.tgz d5); }
trap pack EXIT
cat device-commit.txt > $R/env.txt; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
for i in 1 2 3; do for cfg in "FLCE_GRAD_STREAMS=1" "FLCE_GRAD_STREAMS=0"; do for std in 0.5 4; do s=4096x2048x32000
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std $std --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$std-$tag-$i.log 2>&1
  echo "$s std $std [$cfg] $i: $(grep -E "^\| $std \| auto" $R/$s-$std-$tag-$i.log | cut -d'|' -f4-6) | $(grep -E 'timeline auto: runs' $R/$s-$std-$tag-$i.log | cut -c40-) | $(grep -E 'timeline auto: (logits|dz|dH|dW)' $R/$s-$std-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done; done
for i in 1 2; do for cfg in "FLCE_QROWS=0" "FLCE_QROWS=1"; do s=512x4096x128256
  tag=$(echo "$cfg" | tr ' =' '__')
  env $cfg timeout 60 ./build/flce bench --logit-std 4 --iters 20 --timeline --strategies auto --shapes $s > $R/$s-$tag-$i.log 2>&1
  echo "$s [$cfg] $i: $(grep -E '^\| 4 \| auto' $R/$s-$tag-$i.log | cut -d'|' -f4-6,12-14) | $(grep -E 'timeline auto: (logits|dz|dH|dW|qref|qscale|qlist|qdw|qdh)' $R/$s-$tag-$i.log | awk '{printf "%s %s  ", $3, $(NF-1)}')"
done; done
for k in 1 2; do
FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 150 python3 bench/compare.py --shapes 4096x2048x32000,512x4096x128256 --stds 0.5,4 --providers flce-default,flce-chunked,torch-compile --iters 10 --out $R/cmp$k --tag r$k > $R/compare$k.log 2>&1; echo "compare $k rc=$?"
grep -h -A8 '^### Summary' $R/cmp$k/*.md | grep -E "^\| (flce|torch)"
done
