#!/bin/bash
# ab.sh (written in session 34, to run in the next session with the GPU): the patches of this folder
# applied (git am) against the tree before them (.whl/before.tgz: `git archive <main before git am> | gzip`),
# one H200 or H100, one call:
#   1. both trees built (flce; the new tree also test_distill_gpu and test_distill_tp);
#   2. test_distill_gpu and test_distill_tp (ranks as threads on one GPU, tests/fake_nccl.c) on the new
#      tree: every divergence on the fp32 path; reverse KL now reads its rows once from the student
#      pass's split sums (SPEC_OPT_XREF), under TP too;
#   3. step.py interleaved twice, before / after: reverse KL at 8192×4096×128256 (teacher 4096), default
#      budget, the rows' kernel and the student logits pass in the profile; forward KL at the same shape
#      (its kernels are meant to be unchanged: a control); reverse KL at memory_budget 1536 MiB (8 chunks:
#      NOTES session 34's item 1, what the one read does to the budgeted schedule).
# Then, in a second call, the README's test command with GPU tests required (f2.sh pattern).
set -u; mkdir -p $OUT; s=$(date +%s); here=bench/results/2026-11-30-session34
{ nvidia-smi -L; date -u; cat .device-commit; } > $OUT/env.txt 2>&1
rm -rf /tmp/tb /tmp/tn; mkdir -p /tmp/tb /tmp/tn
tar -xzf .whl/before.tgz -C /tmp/tb
tar --exclude=./build --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C /tmp/tn
for T in b n; do
  cp $here/step.py /tmp/t$T/
  TG=flce; [ $T = n ] && TG="flce test_distill_gpu test_distill_tp"
  (cd /tmp/t$T && cmake --preset default > /tmp/b$T.log 2>&1 && cmake --build --preset default --target $TG -j8 >> /tmp/b$T.log 2>&1; echo "build $T rc=$?") &
done
wait
echo "built $(( $(date +%s)-s )) s"
for t in test_distill_gpu test_distill_tp; do
  (cd /tmp/tn && FLCE_REQUIRE_GPU=1 FLCE_CACHE_DIR=/tmp/tn/build/cache timeout 240 ./build/tests/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"; grep -E "FAIL|passed|failed" $OUT/$t.log | head -12)
done
echo "tested $(( $(date +%s)-s )) s"
for round in 1 2; do
  for cfg in "8192 4096 4096 128256 0 reverse_kl" "8192 4096 4096 128256 0 forward_kl" "8192 4096 4096 128256 1536 reverse_kl"; do
    for T in b n; do
      (cd /tmp/t$T && FLCE_LIBRARY=$PWD/build/libflce.so FLCE_CACHE_DIR=$PWD/build/cache timeout 150 python3 step.py $cfg 2>&1 | grep -v -i warn | sed "s/^/$T /" | tee -a $OUT/ab.log)
    done
  done
  echo "round $round $(( $(date +%s)-s )) s"
done
echo "done $(( $(date +%s)-s )) s"
