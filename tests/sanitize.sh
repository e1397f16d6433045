#!/usr/bin/env bash
# sanitize.sh — the CTest `sanitize` (labels gpu;sanitize, configuration Extra only: it is not part
# of the README's test run): compute-sanitizer's memcheck, racecheck, synccheck and initcheck over
# every kernel path, strategy and awkward shape in the case table below, each (tool × case) one
# run with --error-exitcode 1 and a timeout; one line per run (time, verdict), the failures listed
# at the end, exit 1 when any run failed. bench/device_ci.sh runs it as
# `ctest --test-dir build -C Extra -L sanitize`.
#
# Usage: sanitize.sh [--dry-run | --list] [--log FILE] FLCE_TOOL [GPU_PROBE]
#   (by hand: bash tests/sanitize.sh --log sanitize-h200.log build/flce build/tests/gpu_probe)
#   --log FILE (or SANITIZE_LOG=FILE): one log of the whole run besides the per-run logs: the
#   sanitizer's version, the device, the commit, and per case and tool one line with the verdict
#   and compute-sanitizer's own summary line ("ERROR SUMMARY: 0 errors", racecheck's "RACECHECK
#   SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"), then the totals (what issue 43 keeps as
#   bench/results/sanitize-<device>-<date>.log).
#   GPU_PROBE (tests/gpu_probe.c) decides as every GPU test does (tests/gpu_ready.h): exit 77
#   (skipped) without a usable GPU, a failure for a broken driver or, under FLCE_REQUIRE_GPU=n, for
#   fewer than n GPUs. No compute-sanitizer (COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin,
#   /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer): skipped, or a failure under
#   FLCE_REQUIRE_GPU >= 1.
#   --dry-run: no sanitizer, no GPU needed: each case's command once, to check that its arguments
#   parse (demo compiles its kernels for sm_90a under the case's environment; bench gets --list;
#   fuzz cases: the description check below, and the argument parse). --list: the runs, nothing run.
# Settings (environment):
#   SANITIZE_TOOLS    tools to run (default "memcheck racecheck synccheck initcheck")
#   SANITIZE_CASES    extended regex on the case names (default: every case); with SANITIZE_TOOLS,
#                     how to split the run over several device calls
#   SANITIZE_JOBS     runs at once on the one GPU (default 4; the GPU is time-shared, so the times
#                     printed include waiting for the others)
#   SANITIZE_TIMEOUT  seconds per run (default 300): racecheck on the mma.sync path is the slow one
#                     (1024 x 1024 x 8192 did not finish in 120 s on an H200, the wgmma path took 18)
#   SANITIZE_SEED     FLCE_SEED of the demo's and bench's random data (default 20261123). Fixed so
#                     that a failure reruns exactly, and because the N = 1 cases need their only
#                     token's label not ignored (under 20261123 it is not): the demo's and bench's
#                     relative-L2 check of dH is 0/0 for an all-ignored call.
#   SANITIZE_LOG_DIR  where each run's output goes, <case>.<tool>.log, and summary.txt: the lines
#                     printed (CTest shows them only for a failure) (default ./sanitize-logs)
#   SANITIZE_LOG      the one log of the run, as --log (default: none beside summary.txt)
#
# The cases: `flce demo` is the main one, but it can express only --dtype, --tokens, --hidden,
# --vocab, --budget-mib and --arch, and checks only a mean loss with int32 labels. So:
#   - strategies: the demo has no strategy flag, and AUTO takes recompute (fused dZ) at every size
#     small enough here, with the default budget or --budget-mib 1. The strategy cases are
#     `flce bench --strategies` (existing flags), which forces chunked (compact fp16 logits; +fp32z:
#     fp32 Z), recompute and forward, "-1MiB" for several token chunks (the fp32 dW accumulator) or
#     vocab chunks (the fp32 dH accumulator), and checks each against the fp64 reference.
#   - options (label smoothing, z-loss, softcap, temperature, bias, class weights), the optional
#     outputs (loss per token, target logprob, entropy, argmax, z-loss, grad bias), per-token and
#     scalar grad_output, vocab_offset > 0, int64 labels, reductions sum and none, the flce_backward
#     op, accumulate_grad_hidden/weight, and V = 1: not expressible through the demo (its --labels 64
#     is parsed but its label buffer is int32; --reduction none would write N losses into its
#     one-float buffer; its check assumes mean; with V = 1 dZ and the reference dH are exactly 0,
#     so its relative-L2 check is 0/0) nor through bench. They are cases of `flce fuzz --seed S
#     --case K` from the seed of the fuzz_gpu_smoke test (20261122, cases 0..23, which that test
#     runs unsanitized on every device run). A fuzz case's 4th column is the start of its
#     description (`flce fuzz --seed S --cases C --list`): when the fuzz generator changes what a
#     case number means, that run fails with "fuzz case changed" instead of silently testing
#     something else; pick the new case numbers from the list then.
#   - the variants the planner picks by default only past those small shapes (issue 43: the
#     report's racecheck hazard was at a shape no case here took): dW taking its tiles from a
#     counter beside dH (FLCE_DEV grad_streams; plan.h concurrent_grads, dw_dynamic; the tile slot of
#     templates/gemm_wgmma_tma.cu) in the chunked strategy with one and several token chunks (the
#     fp32 dW accumulator) and in recompute's vocab chunks; dH split over the vocab (plan_dh_splits:
#     few tokens, a long vocab); dW in 2-CTA clusters (short token chunks); the logits pass in
#     2-CTA clusters and persistent (its items outnumber the CTAs: most shapes past 256 tokens);
#     row-scaled compact logits (qrows: chunks of 1e8 logits or more by default; the small cases
#     force them with FLCE_DEV=qrows=1, with the labels' dH term after dH and in its epilogue). The
#     "gs-", "dh-splits-" and "qrows-" cases; what each runs as is in the table's comments, read
#     from the plans for a 132-SM Hopper part (H100 SXM, H200): `flce bench --list --shapes ...`
#     or FLCE_LOG=info show a plan. A GPU with another SM count can plan some of them otherwise.
#   - not covered: tensor and sequence parallelism (NCCL, 2+ GPUs: test_tp; dW's two launches
#     sharing the counter under FLCE_DEV tp_overlap are TP-only), the tcgen05 tile (sm_100,
#     FLCE_ENABLE_SM100; no Blackwell GPU here), tuned tiles (FLCE_TUNE), FLCE_NVRTC_FAST.
set -uo pipefail

mode=run
RUNLOG=${SANITIZE_LOG:-}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) mode=dry; shift ;;
    --list) mode=list; shift ;;
    --log) RUNLOG=${2:?--log needs a file}; shift 2 ;;
    --log=*) RUNLOG=${1#--log=}; shift ;;
    *) break ;;
  esac
done
FLCE=${1:?usage: sanitize.sh [--dry-run | --list] [--log FILE] FLCE_TOOL [GPU_PROBE]}
PROBE=${2:-}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
CASE_RE=${SANITIZE_CASES:-.}
JOBS=${SANITIZE_JOBS:-4}
TIMEOUT=${SANITIZE_TIMEOUT:-300}
SEED=${SANITIZE_SEED:-20261123}
LOGDIR=${SANITIZE_LOG_DIR:-$PWD/sanitize-logs}

# Shorthands of the table. Every case stays small (racecheck's slowdown on the mma.sync path).
DEMO="demo --tokens 256 --hidden 256 --vocab 4096"
# fp32 (FFMA) cases are smaller still: racecheck checks every one of the FFMA loop's shared loads,
# and at 256×256×4096 each case ran past 420 s (session 8, H100, 8 at once). 512 tokens × 1024
# columns still make two token chunks and two vocab chunks under a 1 MiB budget.
DEMO32="demo --tokens 256 --hidden 64 --vocab 1024 --dtype f32"
BENCH="bench --warmup 0 --iters 1 --sets 1 --logit-std 2"
ALL="chunked,chunked-1MiB,chunked+fp32z,chunked-1MiB+fp32z,recompute,recompute-1MiB,forward"
F32="chunked,chunked-1MiB,recompute,recompute-1MiB,forward" # fp32 always stores fp32 Z
ACC="chunked-1MiB,recompute-1MiB"                            # the fp32 dW and dH accumulators
FZ="fuzz --seed 20261122 --case"
# Paths: wgmma fed by TMA (the default on sm_90, 16-bit), the cp.async-fed wgmma loop
# (FLCE_DEV=tma=0), the portable mma.sync tile (FLCE_PORTABLE=1), fp32 inputs (FFMA).
CP=FLCE_DEV=tma=0
MMA=FLCE_PORTABLE=1
# The planner's larger variants (the header's list), as planned for 132 SMs and AUTO:
#  gs-report               issue 43's shape: chunked (compact fp16 logits, one token chunk), dW's 516
#                          tiles from the counter beside dH, dH split in 3 over the vocab, logits in
#                          2-CTA clusters and persistent
#  gs-report-static        the same with dW alone in the static tile order (FLCE_DEV=grad_streams=0)
#  gs-token-chunks         chunked in 3 token chunks: the counter's dW adds into the fp32 accumulator
#  gs-recompute-vchunks    recompute in vocab chunks, each chunk's dW from the counter beside dH.
#                          At 2304x512x33000 (16 MiB, 10 chunks) and gs-recompute-dh-splits at 1536
#                          tokens, racecheck ended in status 9 (compute-sanitizer 2025.3.1, H200,
#                          2026-11-28, twice): SIGKILL by the OOM killer, racecheck's own process at
#                          130 GB RSS on the 125 GiB host (run alone under /usr/bin/time -v), 0
#                          hazards up to then; memcheck, synccheck and initcheck passed on both. Both
#                          now take the smallest shapes `flce bench --list` shows with the same plan
#                          ("dW beside dH (tiles from a counter)"). At 768x256x33000 (8 MiB, 7 chunks)
#                          racecheck was still killed (2026-11-28, session 23; flce_logits alone
#                          took 87 GB), so vchunks is now one bench call (not the demo's 12) at
#                          256x256x12288 in 3 vocab chunks of 4096 (`flce bench --list`: recompute;
#                          dW beside dH, tiles from a counter)
#  gs-recompute-dh-splits  recompute, dH split in 4, dW from the counter beside it (1152 tokens: at
#                          1024 dW goes into clusters instead)
#  dh-splits-dw-cluster    chunked, dH split in 4, dW in 2-CTA clusters (logits without clusters)
#  dh-splits-recompute     recompute, dH split in 2, dW and logits in 2-CTA clusters
#  qrows-default           1.15e8 logits: row-scaled compact logits by default, dW from the counter,
#                          dH split in 3
#  qrows-small(-epilogue)  row-scaled logits forced at a small chunked shape, the labels' dH term
#                          after dH (flce_qdh) or in dH's epilogue (FLCE_DEV=qdh=0); dW in clusters
REPORT="demo --tokens 2304 --hidden 512 --vocab 33000"

# name | environment (- for none) | flce command and arguments | fuzz only: start of its description
CASES=$(cat <<EOF
demo-wgmma-tma            | -                          | $DEMO
demo-wgmma-cpasync        | $CP                        | $DEMO
demo-mma-sync             | $MMA                       | $DEMO
demo-f16                  | -                          | $DEMO --dtype f16
demo-f32-ffma             | -                          | $DEMO32
strat-wgmma-tma           | -                          | $BENCH --shapes 256x256x4096 --strategies $ALL
strat-wgmma-cpasync       | $CP                        | $BENCH --shapes 256x256x4096 --strategies $ALL
strat-mma-sync            | $MMA                       | $BENCH --shapes 256x256x4096 --strategies $ALL
strat-f16                 | -                          | $BENCH --shapes 256x256x4096 --strategies $ALL --dtype f16
strat-f32-ffma            | -                          | $BENCH --shapes 512x64x1024 --strategies $F32 --dtype f32
strat-unfused-dz-tma      | FLCE_DEV=fused_dz=0        | $BENCH --shapes 256x256x4096 --strategies recompute,recompute-1MiB
strat-unfused-dz-mma-sync | $MMA FLCE_DEV=fused_dz=0   | $BENCH --shapes 256x256x4096 --strategies recompute,recompute-1MiB
strat-cluster2            | FLCE_DEV=cluster=2         | $BENCH --shapes 256x256x4096 --strategies chunked,$ACC
strat-red-acc             | FLCE_DEV=red_acc=1         | $BENCH --shapes 256x256x4096 --strategies $ACC
strat-raster0             | FLCE_DEV=raster=0          | $BENCH --shapes 256x256x4096 --strategies $ACC
strat-saved               | -                          | $BENCH --shapes 256x256x4096,2304x512x33000 --strategies saved
strat-saved-f16           | -                          | $BENCH --shapes 256x256x4096 --strategies saved --dtype f16
n1-wgmma-tma              | -                          | $BENCH --shapes 1x256x4096 --strategies $F32
n1-wgmma-cpasync          | $CP                        | $BENCH --shapes 1x256x4096 --strategies $F32
n1-mma-sync               | $MMA                       | $BENCH --shapes 1x256x4096 --strategies $F32
n1-f32-ffma               | -                          | $BENCH --shapes 1x64x1024 --strategies $F32 --dtype f32
d8-wgmma-tma              | -                          | $BENCH --shapes 256x8x4096 --strategies $F32
d8-wgmma-cpasync          | $CP                        | $BENCH --shapes 256x8x4096 --strategies $F32
d8-mma-sync               | $MMA                       | $BENCH --shapes 256x8x4096 --strategies $F32
d8-f32-ffma               | -                          | $BENCH --shapes 256x8x1024 --strategies $F32 --dtype f32
v1000-wgmma-tma           | -                          | $BENCH --shapes 1024x256x1000 --strategies $F32
v1000-wgmma-cpasync       | $CP                        | $BENCH --shapes 1024x256x1000 --strategies $F32
v1000-mma-sync            | $MMA                       | $BENCH --shapes 1024x256x1000 --strategies $F32
v1000-f32-ffma            | -                          | $BENCH --shapes 512x64x1000 --strategies $F32 --dtype f32
v1-wgmma-tma              | -                          | $FZ 11 | N=6 D=4104 V=1 off=0 total=0 bf16 mean loss_and_grad/auto
v1-wgmma-cpasync          | $CP                        | $FZ 11 | N=6 D=4104 V=1 off=0 total=0 bf16 mean loss_and_grad/auto
v1-mma-sync               | $MMA                       | $FZ 11 | N=6 D=4104 V=1 off=0 total=0 bf16 mean loss_and_grad/auto
v1-chunked-weights        | -                          | $FZ 20 | N=6649 D=56 V=1 off=0 total=0 bf16 none loss_and_grad/chunked
offset-softcap-tma        | -                          | $FZ 2  | N=355 D=48 V=1969 off=1812 total=5247 bf16 none loss_and_grad/recompute
offset-softcap-cpasync    | $CP                        | $FZ 2  | N=355 D=48 V=1969 off=1812 total=5247 bf16 none loss_and_grad/recompute
offset-softcap-mma-sync   | $MMA                       | $FZ 2  | N=355 D=48 V=1969 off=1812 total=5247 bf16 none loss_and_grad/recompute
offset-f16-vchunks-tma    | -                          | $FZ 17 | N=2 D=312 V=7524 off=3936 total=0 fp16 mean loss_and_grad/recompute
offset-f16-vchunks-cpasync| $CP                        | $FZ 17 | N=2 D=312 V=7524 off=3936 total=0 fp16 mean loss_and_grad/recompute
offset-f16-vchunks-mma-sync| $MMA                      | $FZ 17 | N=2 D=312 V=7524 off=3936 total=0 fp16 mean loss_and_grad/recompute
offset-forward-f32        | -                          | $FZ 3  | N=261 D=568 V=387 off=1121 total=0 fp32 mean forward/auto
offset-f16-none-bias      | -                          | $FZ 23 | N=45 D=6568 V=2 off=338 total=0 fp16 none loss_and_grad/auto
chunked-f16-sum-zloss     | -                          | $FZ 0  | N=25 D=320 V=34 off=0 total=0 fp16 sum loss_and_grad/chunked
f16-softcap-acc-dh        | -                          | $FZ 8  | N=36 D=1288 V=16 off=0 total=0 fp16 sum loss_and_grad/auto
backward-chunked-bias     | -                          | $FZ 4  | N=517 D=3544 V=749 off=0 total=0 bf16 sum backward/chunked
backward-f32-bias         | -                          | $FZ 10 | N=61 D=24 V=426 off=0 total=0 fp32 mean backward/auto
f32-smoothing-bias        | -                          | $FZ 7  | N=3 D=24 V=5080 off=0 total=0 fp32 none loss_and_grad/recompute
forward-options           | -                          | $FZ 12 | N=13 D=712 V=44 off=0 total=0 bf16 none forward/forward
recompute-smoothing-bias  | -                          | $FZ 15 | N=204 D=16 V=8 off=0 total=0 bf16 sum loss_and_grad/recompute
class-weights-smoothing   | -                          | $FZ 21 | N=2 D=584 V=4746 off=0 total=0 bf16 none loss_and_grad/recompute
gs-report                 | -                          | $REPORT
gs-report-static          | FLCE_DEV=grad_streams=0    | $REPORT
gs-token-chunks           | -                          | $BENCH --shapes 1024x256x16384 --strategies chunked-16MiB
gs-recompute-vchunks      | -                          | $BENCH --shapes 256x256x12288 --strategies recompute-2MiB
gs-recompute-dh-splits    | -                          | demo --tokens 1152 --hidden 256 --vocab 33000
dh-splits-dw-cluster      | -                          | demo --tokens 256 --hidden 512 --vocab 33000
dh-splits-recompute       | -                          | demo --tokens 512 --hidden 256 --vocab 16384
qrows-default             | -                          | demo --tokens 2304 --hidden 512 --vocab 50000
qrows-small               | FLCE_DEV=qrows=1           | $BENCH --shapes 512x512x8192 --strategies chunked
qrows-small-epilogue      | FLCE_DEV=qrows=1,qdh=0     | $BENCH --shapes 512x512x8192 --strategies chunked
EOF
)

trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }

# The selected cases, as parallel arrays.
names=() envs=() cmds=() wants=()
while IFS= read -r line; do
  [ -n "$(trim "$line")" ] || continue
  IFS='|' read -r n e c w <<<"$line"
  n=$(trim "$n") e=$(trim "$e") c=$(trim "$c") w=$(trim "${w:-}")
  [ "$e" = - ] && e=""
  [[ $n =~ $CASE_RE ]] || continue
  names+=("$n") envs+=("$e") cmds+=("$c") wants+=("$w")
done <<<"$CASES"
[ "${#names[@]}" -gt 0 ] || { echo "sanitize: no case matches SANITIZE_CASES='$CASE_RE'"; exit 1; }

# What a passing run's output must say: the demo exits 0 without a GPU too (kernels compiled only).
must_say() {
  case $1 in
    demo\ *) echo 'flce demo: all checks passed' ;;
    fuzz\ *) echo '^ok +case [0-9]+ of seed' ;; # fz_one: "ok   case K of seed S: ..."
    *) echo '' ;;
  esac
}

# A fuzz case's description must still start as the table says (see the header).
fuzz_case_ok() { # cmd want
  local seed k line
  read -r _ _ seed _ k <<<"$1"
  line=$("$FLCE" fuzz --seed "$seed" --cases $((k + 1)) --list 2>&1 | sed -n "$((k + 1))p")
  [[ $line == "$k: $2"* ]] && return 0
  echo "fuzz case changed: seed $seed case $k is now '$line', the table expects '$k: $2...'"
  return 1
}

if [ "$mode" = list ]; then
  for tool in $TOOLS; do
    for i in "${!names[@]}"; do
      printf '%-28s %-10s %s%s\n' "${names[$i]}" "$tool" "${envs[$i]:+${envs[$i]} }" "${cmds[$i]}"
    done
  done
  exit 0
fi

if [ "$mode" = dry ]; then
  # Each case once, no sanitizer: do its arguments parse, does its plan exist?
  bad=0
  for i in "${!names[@]}"; do
    n=${names[$i]} c=${cmds[$i]} verdict=ok out="" rc=0
    case $c in
      bench\ *) out=$(env ${envs[$i]} FLCE_SEED="$SEED" "$FLCE" $c --list 2>&1); rc=$?
                [ "$rc" -eq 0 ] && grep -q '| error:' <<<"$out" && rc=1 ;;
      fuzz\ *)  out=$(fuzz_case_ok "$c" "${wants[$i]}") || verdict="FAIL ($out)"
                out=$(env ${envs[$i]} "$FLCE" $c 2>&1); rc=$?
                [ "$rc" -eq 3 ] && rc=0 ;; # 3, no GPU (tools/cmd_gen.h): parsed, then nothing to run on
      *)        out=$(env ${envs[$i]} FLCE_SEED="$SEED" "$FLCE" $c 2>&1); rc=$?
                [ "$rc" -eq 3 ] && rc=0 ;; # demo without a GPU: parsed and compiled, exit 0 (3 accepted too)
    esac
    [ "$rc" -eq 0 ] || verdict="FAIL (exit $rc)"
    [ "$verdict" = ok ] || { bad=1; printf '%s\n' "$out" | tail -5 | sed 's/^/    /'; }
    printf '%-28s %s\n' "$n" "$verdict"
  done
  exit "$bad"
fi

# ---- the sanitizer runs ------------------------------------------------------------------------

[ -n "$PROBE" ] || { echo "sanitize: usage: sanitize.sh FLCE_TOOL GPU_PROBE"; exit 1; }
"$PROBE"
rc=$?
[ "$rc" -eq 0 ] || exit "$rc" # 77: no GPU, skipped; 1: broken driver or FLCE_REQUIRE_GPU unmet

find_sanitizer() {
  local c
  for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
           "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
if ! CS=$(find_sanitizer); then
  why="no compute-sanitizer (COMPUTE_SANITIZER, PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer)"
  req=${FLCE_REQUIRE_GPU:-0}
  if [[ $req =~ ^[0-9]+$ ]] && [ "$req" -ge 1 ]; then
    echo "FAIL: $why; FLCE_REQUIRE_GPU=$req makes that a failure, not a skip"
    exit 1
  fi
  echo "$why: skipped"
  exit 77
fi
command -v timeout >/dev/null || { echo "sanitize: needs timeout (coreutils)"; exit 1; }
mkdir -p "$LOGDIR" || exit 1
SUMMARY=$LOGDIR/summary.txt
# say: a line on stdout, in summary.txt and in the run's log (one write each: the runs' lines do not
# interleave)
if [ -n "$RUNLOG" ]; then
  mkdir -p "$(dirname "$RUNLOG")" && : >"$RUNLOG" || { echo "sanitize: cannot write the log $RUNLOG"; exit 1; }
fi
say() {
  printf '%s\n' "$*" | tee -a "$SUMMARY"
  [ -z "$RUNLOG" ] || printf '%s\n' "$*" >>"$RUNLOG"
}
: >"$SUMMARY"
say "sanitize: $("$CS" --version 2>/dev/null | grep -m1 -i version)"
say "sanitize: device $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo '?'), $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$(dirname "$0")" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' (with uncommitted changes)')"
say "sanitize: ${#names[@]} case(s) x tools '$TOOLS', $JOBS at once, ${TIMEOUT}s each, FLCE_SEED=$SEED, logs in $LOGDIR${RUNLOG:+, this log in $RUNLOG}"

# run_one TOOL INDEX: one sanitized run; prints its line and leaves its verdict in a file.
run_one() {
  local tool=$1 i=$2 n=${names[$2]}
  local log=$LOGDIR/$n.$tool.log must t0 rc errs warns verdict line
  must=$(must_say "${cmds[$i]}")
  t0=$(date +%s)
  env ${envs[$i]} FLCE_SEED="$SEED" timeout -k 10 "$TIMEOUT" \
    "$CS" --tool "$tool" --error-exitcode 1 "$FLCE" ${cmds[$i]} >"$log" 2>&1
  rc=$?
  # "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)"
  errs=$(grep -aoE 'ERROR SUMMARY: [0-9]+ error|\([0-9]+ errors?, [0-9]+ warnings?\)' "$log" | tail -1 |
         grep -oE '[0-9]+ error' | grep -oE '[0-9]+')
  warns=$(grep -aoE '[0-9]+ warnings?\)' "$log" | tail -1 | grep -oE '^[0-9]+')
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict="FAIL (timed out after ${TIMEOUT}s)"
  elif [ -z "$errs" ]; then verdict="FAIL (exit $rc, no sanitizer summary)"
  elif [ "$errs" -gt 0 ]; then verdict="FAIL ($errs sanitizer error(s), exit $rc)"
  elif [ "$rc" -eq 9 ] && grep -aq "process didn't terminate successfully" "$log"; then
    # compute-sanitizer passes on the target's signal as its status: 9 is SIGKILL, which on these
    # machines is the kernel's OOM killer (racecheck of gs-recompute-vchunks grew to 130 GB RSS on a
    # 125 GiB host, /usr/bin/time -v, 2026-11-28): not the run's own check
    verdict="FAIL (exit 9: the target was killed by SIGKILL, most likely the host out of memory)"
  elif [ "$rc" -ne 0 ]; then verdict="FAIL (exit $rc with 0 sanitizer errors: the run's own check failed)"
  elif [ -n "$must" ] && ! grep -aqE "$must" "$log"; then verdict="FAIL (output lacks '$must')"
  else verdict=ok; [ "${warns:-0}" -gt 0 ] && verdict="ok ($warns racecheck warning(s))"
  fi
  # compute-sanitizer's own last summary line, as it printed it
  line=$(grep -aoE '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -1)
  say "$(printf '%-28s %-10s %5ss  %s | %s' "$n" "$tool" "$(( $(date +%s) - t0 ))" "$verdict" "${line:-no summary line}")"
  printf '%s\n' "$verdict" >"$LOGDIR/$n.$tool.verdict"
}

# Stop the runs under way when stopped ourselves (CTest's timeout): each job's children first.
stop_all() {
  local p
  for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
  exit 1
}
trap stop_all INT TERM

# A fuzz case whose number now means another case fails once here and is not run.
skip=()
for i in "${!names[@]}"; do
  skip[$i]=""
  [ -z "${wants[$i]}" ] && continue
  skip[$i]=$(fuzz_case_ok "${cmds[$i]}" "${wants[$i]}") && skip[$i]=""
done

t_start=$(date +%s)
# Tool-major: the first tool's runs compile the kernels into the cache for the others.
for tool in $TOOLS; do
  for i in "${!names[@]}"; do
    if [ -n "${skip[$i]}" ]; then
      printf 'FAIL (%s)\n' "${skip[$i]}" >"$LOGDIR/${names[$i]}.$tool.verdict"
      say "$(printf '%-28s %-10s %5ss  %s' "${names[$i]}" "$tool" 0 "FAIL (${skip[$i]})")"
      continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run_one "$tool" "$i" &
  done
done
wait

failed=() total=0
for tool in $TOOLS; do
  for i in "${!names[@]}"; do
    total=$((total + 1))
    v=$(cat "$LOGDIR/${names[$i]}.$tool.verdict" 2>/dev/null || echo "FAIL (no verdict)")
    [[ $v == ok* ]] || failed+=("$i $tool $v")
  done
done
echo
say "sanitize: $((total - ${#failed[@]})) of $total runs passed in $(( $(date +%s) - t_start ))s"
[ "${#failed[@]}" -eq 0 ] && exit 0
say "sanitize: FAILED runs (rerun one: SANITIZE_CASES='^name\$' SANITIZE_TOOLS=tool):"
for f in "${failed[@]}"; do
  read -r i tool v <<<"$f"
  say "$(printf '  %-28s %-10s %s' "${names[$i]}" "$tool" "$v")"
  printf '    %s%s --tool %s --error-exitcode 1 %s %s\n' "${envs[$i]:+${envs[$i]} }" "$CS" "$tool" "$FLCE" "${cmds[$i]}"
  log=$LOGDIR/${names[$i]}.$tool.log
  [ -f "$log" ] || continue
  # the sanitizer's own lines (a report's first line is not indented after the prefix), then the
  # last lines of the run's own output
  { grep -a -m 25 -E '^========= [^ ]' "$log"; grep -av '^=========' "$log" | tail -n 5; } | sed 's/^/    | /'
done
exit 1
