#!/bin/bash
# session 18 d3 (4 GPUs): test_tp CTests (tp 2 and 4; SP now reduces dH beside dW); then
# FLCE_TEST_TP_TIME=8192,4096,128256 test_tp (loss_and_grad timed with and without SP, tp 2 and 4)
# with FLCE_TP_OVERLAP on, off, on
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d3; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d3.tgz d3); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -8 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && FLCE_REQUIRE_GPU=1 timeout 220 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1
echo "status $?" >> $R/test_tp.log
grep -E "Test #|tests passed|check failed|FAIL|status" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
for ovl in 1 0 1 0; do
  FLCE_TP_OVERLAP=$ovl FLCE_TEST_TP_TIME=8192,4096,128256 timeout 100 ./build/tests/test_tp > $R/time-ovl$ovl-$(date +%s).log 2>&1
  echo "FLCE_TP_OVERLAP=$ovl rc=$?"; grep -h "^time\|rank\|FAIL" $R/time-ovl$ovl-*.log | tail -4
  echo "t $(( $(date +%s) - t0 )) s"
  [ $(( $(date +%s) - t0 )) -gt 430 ] && break
done
