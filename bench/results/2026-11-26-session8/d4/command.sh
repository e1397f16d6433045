#!/bin/bash
# session 8, multi-GPU call C: one chunk under TP, overlap on by default; on/off alternated
cd "$(dirname "$0")"
. bench/device_lib.sh
device_env $OUT/env.txt
t0=$(date +%s)
device_build "$OUT/build.log" || { echo build failed; exit 1; }
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
(cd build && ctest -R '^test_tp' --output-on-failure) > $OUT/test_tp.log 2>&1; grep -E "Test #|tests passed" $OUT/test_tp.log
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz * && mv /tmp/all.tgz all.tgz); }
pack
tpc() { # tp tag env...
  local tp=$1 tag=$2; shift 2
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log FLCE_LIBRARY=$L \
    timeout 150 torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$OUT" --tag "$tag" $PROV > "$OUT/tpc-$tp-$tag.log" 2>&1
  echo "status $?" >> "$OUT/tpc-$tp-$tag.log"
  rm -f /tmp/nccl.*.log
  grep -h '^| [mf]\|status' "$OUT/tpc-$tp-$tag.log" | grep -v provider
  echo "t $(( $(date +%s) - t0 )) s"
  pack
}
for tp in 2 4; do
  PROV="--providers megatron,flce-nccl,flce-split,flce-local" tpc $tp on X=1
  PROV="--providers flce-nccl" tpc $tp off FLCE_TP_OVERLAP=0
  PROV="--providers flce-nccl" tpc $tp on2 X=1
  PROV="--providers flce-nccl" tpc $tp off2 FLCE_TP_OVERLAP=0
  PROV="--providers flce-nccl" tpc $tp dh16 FLCE_TP_DH_16BIT=1
done
