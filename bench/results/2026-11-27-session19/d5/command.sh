#!/bin/bash
# session 19 d5 (4 GPUs), the final kernels: test_tp CTests (tp 2 and 4); the C TP timing with the
# persistent logits pass on / off / on / off; tp_compare tp 4 (all providers, --timeline) and
# tp 2 (--timeline) for the TP JSON
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d5; rm -rf $R; mkdir -p $R
pack() { rm -f $R/nccl-*.log; (cd /tmp && tar czf $OUT/d5.tgz d5); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -8 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1
echo "status $?" >> $R/test_tp.log
grep -E "Test #|tests passed|check failed|FAIL|status" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
k=0
for setting in - FLCE_LOGITS_PERSIST=0 - FLCE_LOGITS_PERSIST=0; do
  k=$((k + 1)); [ "$setting" = - ] && setting=NONE=1
  env $setting FLCE_TEST_TP_TIME=8192,4096,128256 timeout 60 ./build/tests/test_tp > $R/tptime-$k.log 2>&1; echo "status $?" >> $R/tptime-$k.log
  grep -E '^time|status' $R/tptime-$k.log | sed "s/^/$setting: /"
done
L=$PWD/build/libflce.so
tpc() { # tp tag timeout args...
  local tp=$1 tag=$2 to=$3; shift 3
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/d5/nccl-$tag.%p.log FLCE_LIBRARY=$L timeout $to \
    torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag $tag "$@" > "$R/tpc-$tag.log" 2>&1
  echo "status $?" >> "$R/tpc-$tag.log"
  grep -h '^| [mf]\|status\|adds' "$R/tpc-$tag.log" | grep -v provider | cut -c1-190
  echo "t $(( $(date +%s) - t0 )) s"
}
tpc 4 s19 110 --timeline --providers megatron,flce-nccl,flce-split,flce-local
grep -h -A6 '^| rank | starts' $R/tp-timeline-*x4-*.md
grep -h 'flce_logits\|nccl:' $R/tp-timeline-*x4-*.md | head -6
tpc 2 s19 90 --timeline --providers megatron,flce-nccl,flce-local
grep -h -A4 '^| rank | starts' $R/tp-timeline-*x2-*.md
echo "t $(( $(date +%s) - t0 )) s"
true
