#!/usr/bin/env bash
# coldstart.sh — issue 16's cold-start numbers on one GPU machine: the first bf16 loss and
# gradients of $SHAPE (default 8192x4096x128256) in a fresh process, through the C API
# (bench/coldstart_first_call.c) and through the Python binding (bench/coldstart.py), in phases
#   cold     one process, empty cache directory (every kernel compiles)
#   warm     one more process on the directory cold filled (every kernel from the disk cache)
#   8-ranks  $RANKS processes started at once on a new empty directory: each kernel must compile
#            once (the compile lock), checked through the directory's counters (flce cache stats)
# plus, for reference, `flce warmup` of the shape on an empty directory (no GPU work: NVRTC wall on
# this host's cores). Writes $OUT/coldstart-<device>-<date>.json (OUT defaults to bench/results), a
# list of rows {shape, api, phase, first_call_s, date, commit, ...}: for 8-ranks first_call_s is the
# slowest rank's first call and total_wall_s the launch of all ranks to the last one's exit.
#
#   cmake --preset default && cmake --build --preset default && bash bench/coldstart.sh
#
# Needs no network. About 1 minute on an H100 host (16 cores); every process is capped by timeout.
# APIS="c" or "python" runs one side only; FAST=1 adds the cold phases again with FLCE_NVRTC_FAST=1
# (compile-time side of that A/B; its kernel-time side is `flce bench`, see bench/NOTES.md).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
OUT=${OUT:-$ROOT/bench/results}
SHAPE=${SHAPE:-8192x4096x128256}
RANKS=${RANKS:-8}
APIS=${APIS:-c python}
FAST=${FAST:-0}
PROC_TIMEOUT=${PROC_TIMEOUT:-90}
FLCE=$BUILD/flce
IFS=x read -r N D V <<<"$SHAPE"

if [ ! -x "$FLCE" ] || [ ! -f "$BUILD/libflce.so" ]; then
  echo "coldstart: no $FLCE / $BUILD/libflce.so: build first (cmake --preset default && cmake --build --preset default)" >&2
  exit 1
fi
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/flce-coldstart.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Nothing from the caller's environment may change what is measured.
unset FLCE_CACHE_RO FLCE_TUNE FLCE_LOG FLCE_NVRTC_FAST FLCE_CACHE_STATS FLCE_CACHE_LOCK_TIMEOUT FLCE_CACHE_MAX_MIB
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
if ! ${CC:-cc} -O2 -std=c11 -D_DEFAULT_SOURCE -I"$ROOT/include" -I"$CUDA_INC" bench/coldstart_first_call.c \
     -L"$BUILD" -lflce -Wl,-rpath,"$BUILD" -ldl -o "$work/first_call" 2>"$work/cc.log"; then
  cat "$work/cc.log" >&2
  echo "coldstart: could not build bench/coldstart_first_call.c" >&2
  exit 1
fi

device=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
device=${device:-unknown}
slug=$(printf '%s' "$device" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')
date=$(date -u +%F)
# A device's copy of the tree has no .git: bench/stamp-commit.sh leaves the commit in .device-commit.
commit=$(git describe --always --dirty 2>/dev/null || cat .device-commit 2>/dev/null || echo unknown)
json=$OUT/coldstart-$slug-$date.json
echo "coldstart: $SHAPE bf16 on $device ($(nproc) cores), commit $commit -> $json"
rows=$work/rows.jsonl
: >"$rows"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# run_one API DIR OUTFILE [ENV=VAL...]: one fresh process's first call; its JSON line in OUTFILE.
run_one() {
  local api=$1 dir=$2 out=$3
  shift 3
  if [ "$api" = c ]; then
    env "$@" FLCE_CACHE_DIR="$dir" timeout "$PROC_TIMEOUT" "$work/first_call" "$N" "$D" "$V" >"$out" 2>"$out.err"
  else
    env "$@" FLCE_CACHE_DIR="$dir" FLCE_LIBRARY="$BUILD/libflce.so" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
      timeout "$PROC_TIMEOUT" python3 bench/coldstart.py "$N" "$D" "$V" >"$out" 2>"$out.err"
  fi
  local rc=$?
  if [ ! -s "$out" ]; then
    echo "{\"first_call_s\": null, \"ok\": false, \"error\": \"exit $rc, no output (timeout $PROC_TIMEOUT s?)\"}" >"$out"
  fi
  tail -3 "$out.err" | sed "s/^/    [$api stderr] /" >&2
}

# row API PHASE DIR WALL_S EXTRA_JSON RESULT_FILE...: one row from the processes' lines and the
# directory's counters.
row() {
  local api=$1 phase=$2 dir=$3 wall=$4 extra=$5
  shift 5
  "$FLCE" cache stats --json --dir "$dir" >"$work/stats.json" 2>/dev/null || echo '{}' >"$work/stats.json"
  python3 - "$api" "$phase" "$wall" "$extra" "$work/stats.json" "$@" >>"$rows" <<PY
import json, sys
api, phase, wall, extra, stats_file, *results = sys.argv[1:]
stats = json.load(open(stats_file))
procs = []
for f in results:
    try:
        procs.append(json.loads(open(f).read().strip().splitlines()[-1]))
    except Exception as e:
        procs.append({"first_call_s": None, "ok": False, "error": "unreadable result: %s" % e})
firsts = [p.get("first_call_s") for p in procs]
ok = all(p.get("ok") for p in procs)
row = {"shape": "$SHAPE", "api": api, "phase": phase,
       "first_call_s": max(firsts) if ok and None not in firsts else None,
       "date": "$date", "commit": "$commit", "device": "$device", "ok": ok}
if len(procs) > 1:
    row["ranks"] = len(procs)
    row["ranks_first_call_s"] = firsts
    row["total_wall_s"] = round(float(wall), 3)
for k in ("process_s", "import_s", "init_s"):
    vals = [p.get(k) for p in procs if p.get(k) is not None]
    if vals:
        row[k] = max(vals)
errors = [p.get("error") for p in procs if p.get("error")]
if errors:
    row["errors"] = errors[:3]
for k in ("entries", "lookups", "hits", "waited", "compiles", "compile_s"):
    row[k] = stats.get(k)
row.update(json.loads(extra))
print(json.dumps(row))
PY
  tail -1 "$rows" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("  %-6s %-8s first call %s s  compiles %s of %s entries%s%s" % (r["api"], r["phase"], r["first_call_s"], r.get("compiles"), r.get("entries"), "  wall %s s" % r["total_wall_s"] if "total_wall_s" in r else "", "" if r["ok"] else "  FAILED: %s" % r.get("errors")))'
}

t_script=$(now)
for api in $APIS; do
  # cold, then warm on the same directory
  dir=$work/$api-cold
  t0=$(now); run_one "$api" "$dir" "$work/$api-cold.json"; t1=$(now)
  row "$api" cold "$dir" "$(elapsed "$t0" "$t1")" '{}' "$work/$api-cold.json"
  t0=$(now); run_one "$api" "$dir" "$work/$api-warm.json"; t1=$(now)
  row "$api" warm "$dir" "$(elapsed "$t0" "$t1")" '{"note": "counters include the cold run"}' "$work/$api-warm.json"
  # RANKS processes at once on a new empty directory
  dir=$work/$api-ranks
  mkdir -p "$dir"
  files=()
  t0=$(now)
  for r in $(seq 0 $((RANKS - 1))); do
    run_one "$api" "$dir" "$work/$api-rank$r.json" &
    files+=("$work/$api-rank$r.json")
  done
  wait
  t1=$(now)
  entries=$("$FLCE" cache stats --json --dir "$dir" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["entries"] == s["compiles"] and s["compiles"] > 0)')
  row "$api" "$RANKS-ranks" "$dir" "$(elapsed "$t0" "$t1")" "{\"each_kernel_compiled_once\": $( [ "$entries" = True ] && echo true || echo false)}" "${files[@]}"
  if [ "$FAST" = 1 ]; then
    dir=$work/$api-cold-fast
    t0=$(now); run_one "$api" "$dir" "$work/$api-fast.json" FLCE_NVRTC_FAST=1; t1=$(now)
    row "$api" cold "$dir" "$(elapsed "$t0" "$t1")" '{"options": "FLCE_NVRTC_FAST=1"}' "$work/$api-fast.json"
  fi
done

# flce warmup on an empty directory: NVRTC wall for the shape's kernels on this host's cores.
dir=$work/cli-warmup
t0=$(now)
FLCE_CACHE_DIR=$dir timeout "$PROC_TIMEOUT" "$FLCE" warmup --shapes "$SHAPE" >"$work/warmup.log" 2>&1
rc=$?
t1=$(now)
wall=$(elapsed "$t0" "$t1")
echo "{\"first_call_s\": $wall, \"ok\": $( [ $rc = 0 ] && echo true || echo false)}" >"$work/warmup.json"
row cli flce-warmup "$dir" "$wall" '{"note": "flce warmup --shapes on an empty cache: wall of the whole command, no GPU work"}' "$work/warmup.json"
sed 's/^/    /' "$work/warmup.log" | grep -E "compiled|cached|warmup:" | head -8

python3 - "$rows" "$json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    json.dump(rows, f, indent=1)
    f.write("\n")
PY
echo "coldstart: $(wc -l <"$rows") rows in $json ($(elapsed "$t_script" "$(now)") s)"
