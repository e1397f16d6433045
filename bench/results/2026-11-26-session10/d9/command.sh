#!/usr/bin/env bash
# session 10 d9: fuzz case 1122 under paths and knobs (which component loses dW precision with compact logits)
set -u
cd "$(dirname "$0")"
R=/tmp/d9; rm -rf $R; mkdir -p $R
export FLCE_CACHE_DIR=/tmp/flce-cache
pack() { (cd /tmp && tar czf $OUT/d9.tgz d9); }
(cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j 16 >> $R/build.log 2>&1) || { tail -20 $R/build.log; pack; exit 1; }
one() { local l=$1; shift; env "$@" timeout 60 ./build/flce fuzz --seed 20261122 --case 1122 > $R/case-$l.log 2>&1; echo "$l: $(grep -E '^ *(dH|dW|db) ' $R/case-$l.log | awk '{printf "%s %s  ", $1, $2}')"; }
one default X=1
one portable FLCE_PORTABLE=1
one tma0 FLCE_TMA=0
one fulltiles0 FLCE_FULL_TILES=0
one compact0 FLCE_COMPACT=0
one debug FLCE_LOG=debug
grep -iE "plan|strategy|chunk" $R/case-debug.log | head -12
pack
