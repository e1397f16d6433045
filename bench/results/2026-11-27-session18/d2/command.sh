#!/bin/bash
# session 18 d2 (4 GPUs), final kernels: test_tp CTests (tp 2 and 4); tp_compare tp 4 (all
# providers, --timeline), tp 4 recompute under a 384 MiB budget, tp 2 (--timeline); then the
# 2000-case fuzz of both seeds (GPUs 1 and 2) beside one `flce bench --timeline` on GPU 0 (the
# single-GPU combine's time)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d2; rm -rf $R; mkdir -p $R
pack() { rm -f $R/nccl-*.log; (cd /tmp && tar czf $OUT/d2.tgz d2); }
trap pack EXIT
device_env $R/env.txt > /dev/null; head -8 $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && FLCE_REQUIRE_GPU=1 timeout 200 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1
echo "status $?" >> $R/test_tp.log
grep -E "Test #|tests passed|check failed|FAIL|status" $R/test_tp.log | head -12
echo "tests $(( $(date +%s) - t0 )) s"
L=$PWD/build/libflce.so
tpc() { # tp tag timeout args...
  local tp=$1 tag=$2 to=$3; shift 3
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/d2/nccl-$tag.%p.log FLCE_LIBRARY=$L timeout $to \
    torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$R" --tag $tag "$@" > "$R/tpc-$tag.log" 2>&1
  echo "status $?" >> "$R/tpc-$tag.log"
  grep -h '^| [mf]\|status\|adds' "$R/tpc-$tag.log" | grep -v provider | cut -c1-190
  echo "t $(( $(date +%s) - t0 )) s"
}
tpc 4 s18 100 --timeline --providers megatron,flce-nccl,flce-split,flce-local
grep -h -A6 '^| rank | starts' $R/tp-timeline-*x4-*.md
grep -h 'flce_tp_pack\|flce_combine\|nccl:' $R/tp-timeline-*x4-*.md | head -8
tpc 4 s18-rc384 60 --providers flce-nccl,flce-local --strategy recompute --memory-budget 384
tpc 2 s18 80 --timeline --providers megatron,flce-nccl,flce-local
grep -h -A4 '^| rank | starts' $R/tp-timeline-*x2-*.md
for g in 1 2; do
  seed=$([ $g = 1 ] && echo 20261122 || echo 20261127)
  (CUDA_VISIBLE_DEVICES=$g FLCE_CACHE_DIR=/tmp/flce-cache-fuzz$g timeout 210 ./build/flce fuzz --seed $seed --cases 2000 --jobs 16 --time-limit 190 > $R/fuzz-$seed.log 2>&1; echo "fuzz rc=$? at $(( $(date +%s) - t0 )) s" >> $R/fuzz-$seed.log) &
done
CUDA_VISIBLE_DEVICES=0 timeout 120 ./build/flce bench --shapes 8192x4096x128256,8192x4096x32064 --strategies auto --logit-std 4 --iters 10 --timeline > $R/bench-timeline.md 2> $R/bench-timeline.log
grep -h '^|' $R/bench-timeline.md | head -4; grep -h 'flce_combine\|flce_tp_pack' $R/bench-timeline.md $R/bench-timeline.log | head -6
wait
for f in $R/fuzz-*.log; do echo "== $f"; tail -c 400 $f | tr '\r' '\n' | tail -4; grep -a "FAIL" $f | cut -c1-300 | head -5; done
echo "t $(( $(date +%s) - t0 )) s"
