#!/usr/bin/env bash
# session 11 d6: ncu (stall reasons, pipes, source-level SASS stalls) of dH/dW with the register dZ operand vs the default, 4096x2304x64000
set -u
cd "$(dirname "$0")"
R=/tmp/d6; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d6.tgz d6); }
cat device-commit.txt > $R/env.txt
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default >> $R/build.log 2>&1) || { tail -30 $R/build.log; pack; exit 1; }
S=4096x2304x64000
B="./build/flce bench --strategies auto --logit-std 4 --warmup 0 --iters 1 --sets 1 --shapes $S"
$B > /dev/null 2>&1; FLCE_DZ_OPERAND=1 $B > /dev/null 2>&1
for cfg in X=0 FLCE_DZ_OPERAND=1; do
  tag=$(echo $cfg | tr '=' '_')
  env $cfg FLCE_GRAD_STREAMS=0 timeout 200 ncu --set full --import-source yes -k 'regex:^flce_(dh|dw)$' -c 2 -o $R/$tag $B > $R/$tag.ncu.log 2>&1
  ncu -i $R/$tag.ncu-rep --page details > $R/$tag.details.txt 2>&1
  ncu -i $R/$tag.ncu-rep --page source --csv --print-source sass > $R/$tag.source.csv 2>&1
  grep -E "^  [a-z_]+|Duration|Issue Slots Busy|Warp Cycles Per Issued|Stall|Executed Ipc|pipe|Pipe" $R/$tag.details.txt | head -60
done
rm -f $R/*.ncu-rep
pack
