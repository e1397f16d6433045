#!/usr/bin/env bash
# session 13 d9: the 2000-case default fuzz at the final commit
set -u
cd "$(dirname "$0")"
R=/tmp/d9; rm -rf $R; mkdir -p $R
trap '(cd /tmp && tar czf $OUT/d9.tgz d9)' EXIT
cat device-commit.txt > $R/env.txt; date -u >> $R/env.txt
[ -x build/flce ] || (cmake --preset default > $R/build.log 2>&1 && cmake --build --preset default -j16 >> $R/build.log 2>&1) || { tail -30 $R/build.log; exit 1; }
t0=$(date +%s); timeout 420 ./build/flce fuzz --seed 20261122 --cases 2000 --jobs 16 --time-limit 400 > $R/fuzz.log 2>&1; echo "fuzz 2000 rc=$? in $(( $(date +%s) - t0 )) s"
tr '\r' '\n' < $R/fuzz.log | grep -v "^flce fuzz: [0-9]*/2000" | tail -8
