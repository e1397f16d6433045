#!/bin/bash
# session 19 d1 (4 GPUs): NCCL with fewer CTAs beside dW (NCCL_MAX_CTAS with FLCE_TP_OVERLAP_SMS to
# match) in the C TP timing, alternating with the default; then flce_qref with 2 rows a warp and 2
# CTAs an SM (a copy of the tree, sed) against the tree's, in-run per-kernel times on GPU 0.
cd "$(dirname "$0")"
export FLCE_CACHE_DIR=/tmp/flce-cache
mkdir -p $OUT/d1
rm -rf /tmp/qtree && mkdir /tmp/qtree && tar --exclude=./build -cf - . | tar -xf - -C /tmp/qtree
sed -i -e 's/__launch_bounds__(256, 1) flce_qref/__launch_bounds__(256, 2) flce_qref/' -e 's/#define QREF_ROWS 4/#define QREF_ROWS 2/' /tmp/qtree/templates/rowops.cu
grep -n "flce_qref\|define QREF_ROWS" /tmp/qtree/templates/rowops.cu > $OUT/d1/qtree.txt
(cd /tmp/qtree && cmake --preset default > /tmp/qbuild.log 2>&1 && cmake --build --preset default -j 32 >> /tmp/qbuild.log 2>&1; echo "qtree build $?" >> /tmp/qbuild.log) &
TPTIME_VARIANTS="- NCCL_MAX_CTAS=16+FLCE_TP_OVERLAP_SMS=16 NCCL_MAX_CTAS=8+FLCE_TP_OVERLAP_SMS=8 - NCCL_MAX_CTAS=16+FLCE_TP_OVERLAP_SMS=16 NCCL_MAX_CTAS=8+FLCE_TP_OVERLAP_SMS=8 NCCL_MAX_CTAS=12+FLCE_TP_OVERLAP_SMS=12 NCCL_MAX_CTAS=16 NCCL_MAX_CTAS=16+FLCE_TP_OVERLAP_SMS=24 FLCE_TP_OVERLAP=0 -" \
  OUT=$OUT/d1 bash bench/device_session.sh tptime --budget 330
wait
cp /tmp/qbuild.log $OUT/d1/qbuild.log
for i in 1 2; do for t in . /tmp/qtree; do
  n=$([ $t = . ] && echo base || echo r2)
  (cd $t && CUDA_VISIBLE_DEVICES=0 timeout 100 ./build/flce bench --shapes 8192x4096x32064,8192x4096x128256 --strategies chunked --logit-std 4 --iters 20 --timeline) > $OUT/d1/qref-$n-$i.md 2> $OUT/d1/qref-$n-$i.log
  echo "== $n $i" >> $OUT/d1/qref-summary.txt
  grep -h "qref\|qscale\|^|" $OUT/d1/qref-$n-$i.log $OUT/d1/qref-$n-$i.md | head -40 >> $OUT/d1/qref-summary.txt
done; done
true
