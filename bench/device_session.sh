#!/usr/bin/env bash
# device_session.sh — one device call doing the stages named on the command line, in order, each
# under its own time limit, logs under $OUT (default ./device-out). Every device job is a list of
# these stages (bench/device_ci.sh is the README's commands and the GPU extras):
#   fuzz     `flce fuzz --seed S --cases 2000` for each S in $FUZZ_SEEDS (default 20261122 and
#            20261127; FUZZ_SECONDS each), the differential fuzzer (issue 7)
#   tune     for each --tune-shapes shape: `flce bench` with the built-in tiles (cold cache, then warm),
#            `flce tune`, `flce bench` again with the table (FLCE_LOG=info names the tiles) (issue 6)
#   bench    `flce bench` over --bench-shapes at logit std 4 and 0.5 (issue 4)
#   compare  bench/compare.py over --compare-shapes (flce vs cuBLAS floors, torch eager, torch.compile)
#   gpu      the GPU CTests (both single-GPU suites, fault, concurrency, fuzz smoke; test_tp with 2+ GPUs)
#   demo     `flce demo` (every strategy of one shape against the fp64 reference of sampled rows)
#   hazards  test_gpu's recipe and accumulate cases twice more (the ones that caught races before)
#   detcost  what problem.deterministic costs (flce_det_cost, issue 7)
#   tp       with 2 or more GPUs: the test_tp CTests (plain, overlap, qrows, register), then
#            bench/tp_compare.py under torchrun at tp = 2 and 4 (as many as there are GPUs; NCCL's
#            collectives logged, --timeline), then flce-nccl beside flce-local once per variant in
#            $TP2_VARIANTS / $TP4_VARIANTS or else $TP_VARIANTS (default "novl"): novl FLCE_DEV=tp_overlap=0, sms16 / sms48
#            FLCE_DEV tp_overlap_sms, dh16 FLCE_DEV=tp_dh_16bit=1, mbN --memory-budget N (MiB), rcN the same
#            with --strategy recompute, ar
#            FLCE_DEV=tp_dh_gather16=0 (dH's fp32 all-reduce), noq FLCE_DEV=qrows=0, reg
#            flce-nccl-reg; multicast (NVLS) off (issues 5, 20)
#   tptime   with 2 or more GPUs: `FLCE_TEST_TP_TIME=$TPTIME_SHAPE test_tp` (default 8192,4096,128256:
#            loss_and_grad with and without SP at tp = 2 and 4, 20 queued steps, the slowest rank)
#            once per setting in $TPTIME_VARIANTS (space-separated NAME=value, several joined by
#            "+" as NCCL_MAX_CTAS=16+FLCE_DEV=tp_overlap_sms=16, "-" for none;
#            default "- FLCE_DEV=tp_overlap=0 - FLCE_DEV=tp_overlap=0")
#   profile  per-kernel durations (ncu, clocks and caches left alone) of one loss-and-grad call per
#            strategy in $PROFILE_STRATEGIES at $PROFILE_SHAPE (bench/ncu_summary.py tables)
#   timeline `flce bench --timeline` (each kernel's in-run time, each run's time and input set) for
#            each of $TIMELINE_STRATEGIES at $TIMELINE_SHAPE, SM clock and power sampled beside it
#   detail   ncu's speed-of-light, memory and warp-stall sections for one launch each of flce_logits
#            (the forward pass), flce_dh and flce_dw in a recompute call at $PROFILE_SHAPE
#   ab       `flce bench` of this tree and of prev/ (an older tree carried beside it) alternately,
#            twice, over --bench-shapes (BENCH_ARGS as for bench); with AB_ENV=NAME=value, this
#            tree with that setting stands in for prev/ (AB_ENV=FLCE_DEV=tma=0: TMA vs cp.async)
#   python   the binding's layout check, python/test_binding.py and test_hf.py against PyTorch (from
#            the tree), then the package pip-installed with the library inside (--target, offline)
#            and python/test_installed.py against that installed copy (torch.compile models, issue 17)
#   pyinstalled  only the python stage's last part (pip install, test_installed.py)
#   sanitize the CTest sanitize: compute-sanitizer over every path (SANITIZE_* as tests/sanitize.sh)
#   coldstart bench/coldstart.sh (issue 16's JSON, breakdown and NVRTC-cache probes)
#   portable the mma.sync ceiling (flce_mma_peak) and `flce bench` with FLCE_PORTABLE=1 (the Ampere
#            path on this GPU, issue 6)
# Only a few files come back from a device call: session.log has the summary, everything else is in
# $OUT/logs.tgz.
# Usage: bash bench/stamp-commit.sh (here), then on the device:
#   bash bench/device_session.sh fuzz tune [--tune-shapes 8192x4096x128256] [--budget 560]
# The whole tree on a 2- or 4-GPU machine: bash bench/device_session.sh gpu tp demo fuzz
set -uo pipefail
. "$(dirname "$0")/device_lib.sh"
device_begin device-out
TOP=$OUT
OUT=$TOP/logs
mkdir -p "$OUT"
export FLCE_CACHE_DIR=${FLCE_CACHE_DIR:-/tmp/flce-cache} PYTHONUNBUFFERED=1
# Multicast (NVLS) stays off on these shared machines (device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
budget=560
tune_shapes=8192x4096x128256
bench_shapes=8192x4096x128256,8192x2304x256000,4096x2048x32000,32768x4096x128256,512x4096x128256
compare_shapes=$bench_shapes
stages=()
while [ $# -gt 0 ]; do
  case $1 in
    --budget) budget=$2; shift 2 ;;
    --tune-shapes) tune_shapes=$2; shift 2 ;;
    --bench-shapes) bench_shapes=$2; shift 2 ;;
    --compare-shapes) compare_shapes=$2; shift 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
LOG=$TOP/session.log
left() { echo $(( budget - ($(date +%s) - start) )); }
step() { echo "== $1 ($(date +%T), $(left) s left)" | tee -a "$LOG"; }
device_env "$OUT/env.txt" "stages: ${stages[*]}"
step build
device_build "$OUT/build.log" || exit 1

for stage in "${stages[@]}"; do
  case $stage in
  fuzz)
    secs=${FUZZ_SECONDS:-300}
    for seed in ${FUZZ_SEEDS:-20261122 20261127}; do
      step "flce fuzz --seed $seed --cases 2000 --jobs $(nproc) --time-limit $secs"
      ./build/flce fuzz --seed "$seed" --cases 2000 --jobs "$(nproc)" --time-limit "$secs" > "$OUT/fuzz-$seed.log" 2>&1
      echo "status $?" >> "$OUT/fuzz-$seed.log"
      grep -av '^ok ' "$OUT/fuzz-$seed.log" | tr '\r' '\n' | grep -v '^flce fuzz: [0-9]*/' | tail -30 | tee -a "$LOG"
    done
    ;;
  tune)
    for s in ${tune_shapes//,/ }; do
      IFS=x read -r n d v <<< "$s"
      dir=/tmp/flce-tune-$s; rm -rf "$dir"
      b=(./build/flce bench --shapes "$s" --strategies auto,forward --logit-std 4 --iters 10)
      step "tune $s: heuristic tiles, cold cache"
      FLCE_CACHE_DIR=$dir FLCE_LOG=info "${b[@]}" > "$OUT/tune-$s-heuristic-cold.md" 2> "$OUT/tune-$s-heuristic-cold.log"
      step "tune $s: heuristic tiles, warm cache"
      FLCE_CACHE_DIR=$dir FLCE_LOG=info "${b[@]}" > "$OUT/tune-$s-heuristic.md" 2> "$OUT/tune-$s-heuristic.log"
      grep -h '^|' "$OUT/tune-$s-heuristic.md" | tee -a "$LOG"
      step "flce tune --tokens $n --hidden $d --vocab $v"
      FLCE_CACHE_DIR=$dir timeout "$(left)" ./build/flce tune --tokens "$n" --hidden "$d" --vocab "$v" --runs 7 \
        > "$OUT/tune-$s.txt" 2> "$OUT/tune-$s-progress.log"
      echo "status $?" >> "$OUT/tune-$s.txt"
      tail -6 "$OUT/tune-$s.txt" | tee -a "$LOG"
      step "tune $s: tuned tiles (table), warm cache"
      FLCE_CACHE_DIR=$dir FLCE_LOG=info "${b[@]}" > "$OUT/tune-$s-tuned.md" 2> "$OUT/tune-$s-tuned.log"
      grep -h '^|' "$OUT/tune-$s-tuned.md" | tee -a "$LOG"
      grep -h -m3 -E 'tuned tiles|default tiles' "$OUT/tune-$s-tuned.log" "$OUT/tune-$s-heuristic.log" | tee -a "$LOG"
      cp "$dir/tune-table.txt" "$OUT/tune-table-$s.txt" 2>/dev/null
    done
    ;;
  bench)
    step "flce bench --shapes $bench_shapes"
    timeout "$(left)" ./build/flce bench --shapes "$bench_shapes" --logit-std ${BENCH_STDS:-4,0.5} ${BENCH_ARGS:-} --json "$OUT/bench.json" \
      > "$OUT/bench.md" 2> "$OUT/bench.log"
    echo "status $?" >> "$OUT/bench.log"
    grep -h '^|\|^###' "$OUT/bench.md" | tee -a "$LOG"
    ;;
  compare)
    step "compare.py --shapes $compare_shapes"
    FLCE_LIBRARY=$PWD/build/libflce.so timeout "$(left)" python3 bench/compare.py --shapes "$compare_shapes" \
      --out-dir "$OUT" ${COMPARE_ARGS:-} > "$OUT/compare.log" 2>&1
    echo "status $?" >> "$OUT/compare.log"
    grep -h '^|\|^#' "$OUT/compare.log" | tee -a "$LOG"
    ;;
  gpu)
    step "gpu tests"
    (cd build && timeout "$(left)" ctest --output-on-failure -L gpu -j4) > "$OUT/ctest-gpu.log" 2>&1
    tail -15 "$OUT/ctest-gpu.log" | tee -a "$LOG"
    ;;
  demo)
    step "flce demo"
    timeout "$(left)" ./build/flce demo > "$OUT/demo.log" 2>&1
    echo "status $?" >> "$OUT/demo.log"
    tail -4 "$OUT/demo.log" | tee -a "$LOG"
    ;;
  hazards)
    for i in 1 2; do for f in recipe accumulate; do
      step "hazards $i: FLCE_TEST_FILTER=$f test_gpu"
      FLCE_TEST_FILTER=$f timeout "$(left)" ./build/tests/test_gpu > "$OUT/hazards-$f-$i.log" 2>&1
      grep -E 'FAIL|passed' "$OUT/hazards-$f-$i.log" | tail -3 | sed "s/^/$f#$i /" | tee -a "$LOG"
    done; done
    ;;
  detcost)
    step "flce_det_cost"
    timeout "$(left)" ./build/flce_det_cost > "$OUT/det-cost.log" 2>&1
    tail -8 "$OUT/det-cost.log" | tee -a "$LOG"
    ;;
  tp)
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$gpus" -lt 2 ]; then step "tp: skipped, $gpus GPU"; continue; fi
    step "the test_tp CTests"
    (cd build && FLCE_REQUIRE_GPU=1 timeout "$(left)" ctest -R '^test_tp' --output-on-failure) > "$OUT/test_tp.log" 2>&1
    echo "status $?" >> "$OUT/test_tp.log"
    grep -E 'Test #|tests passed|check failed|status' "$OUT/test_tp.log" | tail -20 | tee -a "$LOG"
    for tp in 2 4; do
      [ "$tp" -le "$gpus" ] || continue
      step "tp_compare tp=$tp"
      rm -f /tmp/nccl.*.log
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log FLCE_LIBRARY=$PWD/build/libflce.so \
        timeout "$(left)" torchrun --nproc_per_node=$tp bench/tp_compare.py --out "$OUT" --timeline ${TP_ARGS:-} \
        > "$OUT/tp_compare-$tp.log" 2>&1
      cat /tmp/nccl.*.log 2>/dev/null | head -c 2000000 > "$OUT/nccl-coll-$tp.log"
      grep '^|\|^Tensor par' "$OUT/tp_compare-$tp.log" | tee -a "$LOG"
      vv=TP${tp}_VARIANTS
      for variant in ${!vv:-${TP_VARIANTS:-novl}}; do
        env=() args=(--providers flce-nccl,flce-local)
        case $variant in
          novl) env=(FLCE_DEV=tp_overlap=0) ;;
          sms16) env=(FLCE_DEV=tp_overlap_sms=16) ;;
          sms48) env=(FLCE_DEV=tp_overlap_sms=48) ;;
          dh16) env=(FLCE_DEV=tp_dh_16bit=1) args=(--providers flce-nccl) ;;
          mb[0-9]*) args+=(--memory-budget "${variant#mb}") ;;
          rc[0-9]*) args+=(--strategy recompute --memory-budget "${variant#rc}") ;;
          ar) env=(FLCE_DEV=tp_dh_gather16=0) ;;
          noq) env=(FLCE_DEV=qrows=0) ;;
          reg) args=(--providers flce-nccl-reg,flce-nccl) ;;
          *) step "tp variant $variant: unknown, skipped"; continue ;;
        esac
        step "tp_compare tp=$tp, $variant ${env[*]:-} ${args[*]}"
        env ${env[@]+"${env[@]}"} FLCE_LIBRARY=$PWD/build/libflce.so timeout "$(left)" torchrun --nproc_per_node=$tp \
          bench/tp_compare.py --out "$OUT" --tag "$variant" "${args[@]}" ${TP_ARGS:-} > "$OUT/tp_compare-$tp-$variant.log" 2>&1
        grep '^| flce\|^Tensor par' "$OUT/tp_compare-$tp-$variant.log" | tee -a "$LOG"
      done
    done
    ;;
  tptime)
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$gpus" -lt 2 ]; then step "tptime: skipped, $gpus GPU"; continue; fi
    k=0
    for setting in ${TPTIME_VARIANTS:-- FLCE_DEV=tp_overlap=0 - FLCE_DEV=tp_overlap=0}; do
      k=$((k + 1))
      step "tptime $k: ${setting} FLCE_TEST_TP_TIME=${TPTIME_SHAPE:-8192,4096,128256} test_tp"
      [ "$setting" = - ] && setting=NONE=1
      env ${setting//+/ } FLCE_TEST_TP_TIME=${TPTIME_SHAPE:-8192,4096,128256} timeout "$(left)" ./build/tests/test_tp \
        > "$OUT/tptime-$k.log" 2>&1
      echo "status $?" >> "$OUT/tptime-$k.log"
      grep -E '^time|status|FAIL|^rank' "$OUT/tptime-$k.log" | sed "s/^/$setting: /" | tee -a "$LOG"
    done
    ;;
  profile)
    ps=${PROFILE_SHAPE:-8192x4096x128256}
    for st in ${PROFILE_STRATEGIES:-recompute chunked}; do
      step "ncu: one $st call at $ps"
      ./build/flce bench --shapes "$ps" --strategies "$st" --logit-std 4 --warmup 1 --iters 1 --sets 1 >/dev/null 2>&1 # compile first
      timeout "$(left)" ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
        --kernel-name regex:flce_ --launch-skip 0 ./build/flce bench --shapes "$ps" --strategies "$st" --logit-std 4 \
        --warmup 0 --iters 1 --sets 1 > "$OUT/ncu-$st.csv" 2> "$OUT/ncu-$st.log"
      python3 bench/ncu_summary.py "$OUT/ncu-$st.csv" | tee -a "$LOG"
    done
    ;;
  timeline)
    # Each kernel's time inside a real run (flce bench --timeline: CUDA events between launches;
    # nsys does not run on these machines and ncu replays kernels alone at idle clocks), each run's
    # time with its input set, and the SM clock and power sampled beside it.
    ts=${TIMELINE_SHAPE:-8192x4096x128256}
    for st in ${TIMELINE_STRATEGIES:-chunked}; do
      step "timeline: flce bench --strategies $st at $ts"
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$OUT/clocks-$st.csv" 2>&1 &
      smi=$!
      timeout "$(left)" ./build/flce bench --shapes "$ts" --strategies "$st" --logit-std 4 --iters ${TIMELINE_ITERS:-20} \
        --timeline > "$OUT/timeline-$st.md" 2> "$OUT/timeline-$st.log"
      kill $smi 2>/dev/null
      grep -h '^|' "$OUT/timeline-$st.md" | tail -1 | tee -a "$LOG"
      grep -h '^timeline' "$OUT/timeline-$st.log" | tee -a "$LOG"
      awk -F', ' 'NR>1 && $2+0>0 {c+=$2; p+=$3; n++} END {if (n) printf "mean SM clock %.0f MHz, power %.0f W over %d samples\n", c/n, p/n, n}' \
        "$OUT/clocks-$st.csv" | tee -a "$LOG"
    done
    ;;
  detail)
    ps=${PROFILE_SHAPE:-8192x4096x128256}
    ./build/flce bench --shapes "$ps" --strategies recompute --logit-std 4 --warmup 1 --iters 1 --sets 1 >/dev/null 2>&1
    for k in logits dh dw; do
      step "ncu sections: flce_$k at $ps"
      timeout "$(left)" ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy -k "flce_$k" -c 1 ./build/flce bench --shapes "$ps" \
        --strategies recompute --logit-std 4 --warmup 0 --iters 1 --sets 1 > "$OUT/ncu-detail-$k.txt" 2>&1
      grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|Stall|Warp Cycles Per Issued|Achieved Occupancy|Issue Slot' \
        "$OUT/ncu-detail-$k.txt" | head -24 | tee -a "$LOG"
    done
    ;;
  ab)
    # AB_ENV="NAME=value": this tree without and with that environment setting instead of prev/
    # AB_TREE: the older tree's folder (default prev; inside a .dev/ export use another name, e.g.
    # abtree: the export's own .gitignore lists /prev/, so the device tool leaves it behind).
    ab_tree=${AB_TREE:-prev}
    if [ -z "${AB_ENV:-}" ]; then
      [ -d "$ab_tree" ] || { echo "ab: no $ab_tree/ beside this tree" | tee -a "$LOG"; continue; }
      step "build $ab_tree/ ($(cd "$ab_tree" && device_commit))"
      (cd "$ab_tree" && device_build "$OUT/build-prev.log") > /dev/null || echo "$ab_tree build failed" | tee -a "$LOG"
    fi
    for i in 1 2; do for side in new old; do
      tree=.; envs=()
      if [ "$side" = old ]; then if [ -n "${AB_ENV:-}" ]; then envs=("$AB_ENV"); else tree=$ab_tree; fi; fi
      step "ab $i: $side ($tree ${envs[*]}) flce bench --shapes $bench_shapes"
      (cd $tree && env "${envs[@]}" timeout "$(left)" ./build/flce bench --shapes "$bench_shapes" --logit-std 4 ${BENCH_ARGS:-}) \
        > "$OUT/ab-$i-$side.md" 2>&1
      grep -h '^|' "$OUT/ab-$i-$side.md" | sed "s/^/$side /" | tee -a "$LOG"
    done; done
    ;;
  python|pyinstalled)
    if [ "$stage" = python ]; then
    step "python binding: check_layout.py, test_binding.py, test_hf.py"
    FLCE_LIBRARY=$PWD/build/libflce.so timeout "$(left)" python3 python/check_layout.py > "$OUT/py-layout.log" 2>&1
    tail -2 "$OUT/py-layout.log" | tee -a "$LOG"
    for py in test_binding test_hf; do
      FLCE_LIBRARY=$PWD/build/libflce.so timeout "$(left)" python3 python/$py.py > "$OUT/py-$py.log" 2>&1
      echo "status $?" >> "$OUT/py-$py.log"
      grep -E 'FAIL|passed|failed|status' "$OUT/py-$py.log" | tail -8 | sed "s/^/$py: /" | tee -a "$LOG"
    done
    fi
    # issues 17 and 41: the package as users get it: the README's one command, `pip install ./python`
    # (scikit-build-core builds the library and the tool through CMake; offline, as
    # tests/python_package.sh does) into a scratch target, then test_installed.py with FLCE_LIBRARY
    # unset and only the target on PYTHONPATH (it checks flce comes from there). The machine needs
    # scikit-build-core installed (pip install scikit-build-core) for the offline build.
    step "python package: pip install ./python --target, test_installed.py"
    pysite=/tmp/flce-pip-site
    rm -rf "$pysite"
    python3 -m pip install --no-deps --no-build-isolation --no-index --target "$pysite" ./python \
      > "$OUT/py-installed.log" 2>&1
    echo "pip status $?" >> "$OUT/py-installed.log"
    env -u FLCE_LIBRARY PYTHONPATH="$pysite" timeout "$(left)" python3 python/test_installed.py --target "$pysite" \
      >> "$OUT/py-installed.log" 2>&1
    echo "status $?" >> "$OUT/py-installed.log"
    grep -E '^  flce |FAIL|passed|failed|skipped|^(pip )?status' "$OUT/py-installed.log" | tail -8 | sed "s/^/installed: /" | tee -a "$LOG"
    ;;
  sanitize)
    # issue 15: compute-sanitizer's four tools over every path (tests/sanitize.sh through CTest);
    # SANITIZE_TOOLS / SANITIZE_CASES / SANITIZE_JOBS split it over calls; per-run lines in summary.txt
    step "sanitize (ctest -C Extra -L sanitize)"
    SANITIZE_LOG_DIR=$OUT/sanitize timeout "$(left)" ctest --test-dir build -C Extra -L sanitize --output-on-failure \
      --no-tests=error > "$OUT/sanitize.log" 2>&1
    echo "status $?" >> "$OUT/sanitize.log"
    { grep -E 'FAIL|fail' "$OUT/sanitize/summary.txt" 2>/dev/null | head -20; grep -c ' ok' "$OUT/sanitize/summary.txt" 2>/dev/null;
      grep -E 'tests passed|status' "$OUT/sanitize.log"; } | sed 's/^/sanitize: /' | tee -a "$LOG"
    ;;
  coldstart)
    step "bench/coldstart.sh (issue 16)"
    OUT=$OUT timeout "$(left)" bash bench/coldstart.sh > "$OUT/coldstart.log" 2>&1
    echo "status $?" >> "$OUT/coldstart.log"
    grep -E '^  (c|python|cli|probe)' "$OUT/coldstart.log" | head -30 | tee -a "$LOG"
    ;;
  portable)
    step "mma.sync ceiling"
    for t in bf16 f16; do ./build/flce_mma_peak $t 2>&1 | tee -a "$LOG"; done
    step "FLCE_PORTABLE=1 flce bench --shapes ${PORTABLE_SHAPES:=8192x4096x128256,4096x2048x32000}"
    FLCE_PORTABLE=1 timeout "$(left)" ./build/flce bench --shapes "$PORTABLE_SHAPES" --strategies auto,forward \
      --logit-std 4 --iters 5 --json "$OUT/bench-portable.json" > "$OUT/bench-portable.md" 2> "$OUT/bench-portable.log"
    echo "status $?" >> "$OUT/bench-portable.log"
    grep -h '^|\|^###' "$OUT/bench-portable.md" | tee -a "$LOG"
    ;;
  *) echo "unknown stage $stage" | tee -a "$LOG" ;;
  esac
done
step done
tar czf "$TOP/logs.tgz" -C "$TOP" logs && rm -rf "$OUT"
