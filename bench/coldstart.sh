#!/usr/bin/env bash
# coldstart.sh — issue 16's cold-start numbers on one GPU machine: the first bf16 loss and
# gradients of $SHAPE (default 8192x4096x128256) in a fresh process, through the C API
# (bench/coldstart_first_call.c) and through the Python binding (bench/coldstart.py), in phases
#   cold        one process, empty flce cache directory and empty NVRTC cache (every kernel compiles)
#   warm        one more process on the directories cold filled (every kernel from flce's disk cache)
#   nvrtc-warm  an empty flce directory but cold's NVRTC cache: what a machine whose flce cache was
#               cleared (or whose flce version changed) but whose ~/.nv was kept gets
#   new-shape   each of $NEW_SHAPES on warm's directories (default: N/2 tokens, D/2 and V/2; since
#               ecf001b no kernel's source depends on N, D or V, only on flags: N/2 and D/2 load
#               warm's kernels, V/2 = 64128 compiles one, the logits kernel of a vocab that is not a
#               multiple of 256)
#   8-ranks     $RANKS processes started at once on new empty directories: each kernel must compile
#   8-ranks-new-shape  $RANKS processes at once on cold's directories, the last of $NEW_SHAPES (nothing
#               compiles: the driver's start-up and the module loads are what is left)
#               once (the compile lock), checked through the directory's counters (flce cache stats)
# plus, for reference, `flce warmup` of the shape on empty directories (no GPU work: NVRTC wall on
# this host's cores) and three NVRTC probes (bench/nvrtc_time.c: a process's first compile, the same
# source again in the process and in a new one, and with CUDA_CACHE_DISABLE=1).
#
# NVRTC 12.9+ has a compile cache of its own (its docs' "Caching" section); libnvrtc 13.0 opens the
# driver (libcuda.so.1) for it and uses, by its strings, the driver's compute cache (CUDA_CACHE_PATH,
# default ~/.nv/ComputeCache; CUDA_CACHE_DISABLE=1 turns it off), so it works only where there is a
# driver. flce's cache directory alone does not make a phase cold (the probes confirm or refute it). Every phase here gets its own CUDA_CACHE_PATH (fresh for cold, 8-ranks, the warmup
# and the probes), and each row says how much NVRTC left there (nvrtc_cache_kib). The same variable
# is the driver's PTX JIT cache: flce loads cubins (no JIT); the Python processes' torch may JIT
# there in setup_s, outside the first call. bench/NOTES.md, "Cold start: why one compile of a first
# call took ~1.3 s and flce warmup's ~0.07 s".
#
# Writes $OUT/coldstart-<device>-<date>.json (OUT defaults to bench/results; every process's own JSON
# line, its FLCE_LOG lines included, goes to coldstart-<device>-<date>.raw.jsonl beside it), a list of rows
# {shape, api, phase, first_call_s, date, commit, ...}: for 8-ranks first_call_s is the slowest
# rank's first call and total_wall_s the launch of all ranks to the last one's exit. Where the first
# call's time went, from the library's own FLCE_LOG=debug lines (timestamped by the measuring
# program as they arrive; the library is not changed), in the slowest process:
#   kernels            each kernel built: role, compiled | disk | waited (another process compiled
#                      it), its ms as the library logs it, done_s (since the call began)
#   compiled, from_disk, compile_sum_s (the compiles' own wall times added), compile_max_s
#   before_kernels_s   the call's start to the first kernel build: planning, kernel sources and
#                      their hashes, opening NVRTC (dlopen) the first time
#   kernels_wall_s     time during which at least one kernel was compiling or being read
#   after_kernels_s    the last kernel built to the call's end: module loads, workspace, launches,
#                      the GPU work and the synchronize
#   load_s, run_s      (C) after_kernels_s split at the library's "op ..." line: module loads and the
#                      workspace's cuMemAlloc, then launches + GPU work + flce_check
#   second_call_s      the same call again in the process (all loaded): the GPU work alone;
#                      first_run_extra_s = run_s - second_call_s (first launches)
#   first_call_cpu_s   the process's CPU time during the first call (all threads; the synchronize's
#                      spin included): real compiles cost CPU, cache hits hardly any
#   driver_init_s, flce_context_s, buffers_s (C; = init_s), import_s, setup_s, forward_return_s (Python)
# and the host: cores (nproc), cgroup_cpu_max (/sys/fs/cgroup/cpu.max), load_avg_before (1 min).
#
#   cmake --preset default && cmake --build --preset default && bash bench/coldstart.sh
#
# Needs no network. About 1-2 minutes on an H100 host (16 cores); every process is capped by timeout.
# APIS="c" or "python" runs one side only; NEW_SHAPES="NxDxV ..." (or "none"); PROBE=0 skips the
# NVRTC probes; FAST=1 adds the cold phases again with FLCE_NVRTC_FAST=1 (compile-time side of that
# A/B; its kernel-time side is `flce bench`, see bench/NOTES.md).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
OUT=${OUT:-$ROOT/bench/results}
SHAPE=${SHAPE:-8192x4096x128256}
RANKS=${RANKS:-8}
APIS=${APIS:-c python}
FAST=${FAST:-0}
PROBE=${PROBE:-1}
PROC_TIMEOUT=${PROC_TIMEOUT:-90}
FLCE=$BUILD/flce
IFS=x read -r N D V <<<"$SHAPE"
NEW_SHAPES=${NEW_SHAPES:-$((N / 2))x${D}x${V} ${N}x$((D / 2))x${V} ${N}x${D}x$((V / 2))}
[ "$NEW_SHAPES" = none ] && NEW_SHAPES=

if [ ! -x "$FLCE" ] || [ ! -f "$BUILD/libflce.so" ]; then
  echo "coldstart: no $FLCE / $BUILD/libflce.so: build first (cmake --preset default && cmake --build --preset default)" >&2
  exit 1
fi
mkdir -p "$OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/flce-coldstart.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Nothing from the caller's environment may change what is measured.
unset FLCE_CACHE_RO FLCE_TUNE FLCE_LOG FLCE_NVRTC_FAST FLCE_CACHE_STATS FLCE_CACHE_LOCK_TIMEOUT FLCE_CACHE_MAX_MIB \
  CUDA_CACHE_PATH CUDA_CACHE_DISABLE CUDA_CACHE_MAXSIZE
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
if ! ${CC:-cc} -O2 -std=c11 -D_DEFAULT_SOURCE -I"$ROOT/include" -I"$CUDA_INC" bench/coldstart_first_call.c \
     -L"$BUILD" -lflce -Wl,-rpath,"$BUILD" -ldl -lpthread -o "$work/first_call" 2>"$work/cc.log"; then
  cat "$work/cc.log" >&2
  echo "coldstart: could not build bench/coldstart_first_call.c" >&2
  exit 1
fi
if [ "$PROBE" = 1 ] && ! ${CC:-cc} -O2 -std=c11 -D_DEFAULT_SOURCE -I"$ROOT/include" -I"$ROOT/base" -I"$ROOT/runtime" \
     -I"$ROOT/generator" -I"$CUDA_INC" bench/nvrtc_time.c "$BUILD/libflce.a" -lpthread -ldl -lm \
     -o "$work/nvrtc_time" 2>"$work/cc-nvrtc.log"; then
  sed 's/^/    /' "$work/cc-nvrtc.log" | tail -5 >&2
  echo "coldstart: could not build bench/nvrtc_time.c against $BUILD/libflce.a: no NVRTC probes" >&2
  PROBE=0
fi

device=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
device=${device:-unknown}
slug=$(printf '%s' "$device" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')
date=$(date -u +%F)
# bench/stamp-commit.sh (or the device staging) leaves the commit in .device-commit / device-commit.txt.
# The stamp first: inside a git archive export of another checkout (a .dev/ folder), git describe
# names the outer checkout's commit (session 7's coldstart JSON said 8a4b3e1-dirty for 5ee047b).
commit=$(cat .device-commit 2>/dev/null || cat device-commit.txt 2>/dev/null || git describe --always --dirty 2>/dev/null || echo unknown)
json=$OUT/coldstart-$slug-$date.json
export CS_RAW=$OUT/coldstart-$slug-$date.raw.jsonl
: >"$CS_RAW"
echo "coldstart: $SHAPE bf16 on $device ($(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)), commit $commit -> $json"
rows=$work/rows.jsonl
: >"$rows"
export CS_DATE=$date CS_COMMIT=$commit CS_DEVICE=$device CS_CORES=$(nproc) CS_SHAPE=$SHAPE
CS_CPU_MAX=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || true)
export CS_CPU_MAX

now() { date +%s.%N; }
# start: the phase's start time in $t0 and the load average before it in $CS_LOAD (for its row).
start() { CS_LOAD=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || true); export CS_LOAD; t0=$(now); }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# run_one API SHAPE DIR NVCACHE OUTFILE [ENV=VAL...]: one fresh process's first call, flce's cache in
# DIR and NVRTC's (the driver's compute cache) in NVCACHE; its JSON line in OUTFILE.
run_one() {
  local api=$1 shape=$2 dir=$3 nv=$4 out=$5 n d v
  shift 5
  IFS=x read -r n d v <<<"$shape"
  mkdir -p "$nv"
  if [ "$api" = c ]; then
    env "$@" FLCE_LOG=debug FLCE_CACHE_DIR="$dir" CUDA_CACHE_PATH="$nv" \
      timeout "$PROC_TIMEOUT" "$work/first_call" "$n" "$d" "$v" >"$out" 2>"$out.err"
  else
    env "$@" FLCE_LOG=debug FLCE_CACHE_DIR="$dir" CUDA_CACHE_PATH="$nv" FLCE_LIBRARY="$BUILD/libflce.so" \
      PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
      timeout "$PROC_TIMEOUT" python3 bench/coldstart.py "$n" "$d" "$v" >"$out" 2>"$out.err"
  fi
  local rc=$?
  if [ ! -s "$out" ]; then
    echo "{\"first_call_s\": null, \"ok\": false, \"error\": \"exit $rc, no output (timeout $PROC_TIMEOUT s?)\"}" >"$out"
  fi
  grep -v '^flce: ' "$out.err" | tail -3 | sed "s/^/    [$api stderr] /" >&2
}

# The row builder: the processes' JSON lines, flce's directory counters and the NVRTC cache's size.
cat >"$work/row.py" <<'PY'
import json, os, re, sys

api, phase, shape, wall, extra, stats_file, nvdir, *results = sys.argv[1:]
stats = json.load(open(stats_file))
procs = []
for f in results:
    try:
        procs.append(json.loads(open(f).read().strip().splitlines()[-1]))
    except Exception as e:
        procs.append({"first_call_s": None, "ok": False, "error": "unreadable result: %s" % e})
firsts = [p.get("first_call_s") for p in procs]
ok = all(p.get("ok") for p in procs)
row = {"shape": shape, "api": api, "phase": phase,
       "first_call_s": max(firsts) if ok and None not in firsts else None,
       "date": os.environ["CS_DATE"], "commit": os.environ["CS_COMMIT"], "device": os.environ["CS_DEVICE"], "ok": ok}
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

# Where the slowest process's first call went, from its FLCE_LOG lines.
KERNEL = re.compile(r"^flce: info: kernel (\S+) .*: (compiled in|disk cache hit \()\s*([0-9.]+) ms(.*)$")
slow = max((p for p in procs if p.get("first_call_s") is not None), key=lambda p: p["first_call_s"], default=None)
if slow is not None:
    first = slow["first_call_s"]
    for k in ("first_call_cpu_s", "second_call_s", "driver_init_s", "flce_context_s", "buffers_s", "setup_s",
              "forward_return_s"):
        if slow.get(k) is not None:
            row[k] = slow[k]
    log = [(t, line) for t, line in slow.get("log", []) if -1e-3 <= t <= first + 1e-3]
    kernels, ops = [], []
    for t, line in log:
        m = KERNEL.match(line)
        if m:
            origin = "compiled" if m.group(2) == "compiled in" else \
                     "waited" if "after waiting" in m.group(4) else "disk"
            ms = float(m.group(3))
            kernels.append({"role": m.group(1), "origin": origin, "ms": round(ms, 1), "done_s": round(t, 4),
                            "start_s": t - ms / 1e3})
        elif line.startswith("flce: debug: op "):
            ops.append(t)
        elif line.startswith("flce: info: workspace grown to "):
            row["workspace_mib"] = float(line.split()[5])
    if kernels:
        compiled = [k for k in kernels if k["origin"] == "compiled"]
        row["compiled"] = len(compiled)
        row["from_disk"] = len(kernels) - len(compiled)
        row["compile_sum_s"] = round(sum(k["ms"] for k in compiled) / 1e3, 3)
        row["compile_max_s"] = round(max((k["ms"] for k in compiled), default=0) / 1e3, 3)
        start = max(0.0, min(k["start_s"] for k in kernels))
        end = max(k["done_s"] for k in kernels)
        spans = sorted((max(0.0, k["start_s"]), k["done_s"]) for k in kernels)
        busy, cur_a, cur_b = 0.0, None, None
        for a, b in spans:  # union of the kernels' intervals
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    busy += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        busy += cur_b - cur_a
        row["before_kernels_s"] = round(start, 4)
        row["kernels_wall_s"] = round(busy, 4)
        row["after_kernels_s"] = round(first - end, 4)
        after = [t for t in ops if t >= end - 1e-3]
        if api == "c" and after:
            row["load_s"] = round(after[0] - end, 4)
            row["run_s"] = round(first - after[0], 4)
            if slow.get("second_call_s") is not None:
                row["first_run_extra_s"] = round(row["run_s"] - slow["second_call_s"], 4)
        for k in kernels:
            del k["start_s"]
        row["kernels"] = kernels
    elif slow.get("log") is not None:
        row["kernels"] = []  # every kernel was already loaded (cannot happen in a fresh process)

# NVRTC's own cache (the driver's compute cache under CUDA_CACHE_PATH) after the phase.
size, files = 0, 0
for base, _, names in os.walk(nvdir):
    for name in names:
        try:
            size += os.path.getsize(os.path.join(base, name))
            files += 1
        except OSError:
            pass
row["nvrtc_cache_kib"] = round(size / 1024, 1)
row["nvrtc_cache_files"] = files
# The host while the phase ran: its cores (nproc), the cgroup's CPU quota, the load average before.
row["cores"] = int(os.environ["CS_CORES"])
if os.environ.get("CS_CPU_MAX"):
    row["cgroup_cpu_max"] = os.environ["CS_CPU_MAX"]
if os.environ.get("CS_LOAD"):
    row["load_avg_before"] = float(os.environ["CS_LOAD"])
row.update(json.loads(extra))
print(json.dumps(row))
# Every process's own line (its whole FLCE_LOG included) beside the rows, for what the fields miss.
with open(os.environ["CS_RAW"], "a") as f:
    f.write(json.dumps({"api": api, "phase": phase, "shape": shape, "procs": procs}) + "\n")
PY

# row API PHASE SHAPE DIR NVCACHE WALL_S EXTRA_JSON RESULT_FILE...: one row, printed in short.
row() {
  local api=$1 phase=$2 shape=$3 dir=$4 nv=$5 wall=$6 extra=$7
  shift 7
  "$FLCE" cache stats --json --dir "$dir" >"$work/stats.json" 2>/dev/null || echo '{}' >"$work/stats.json"
  python3 "$work/row.py" "$api" "$phase" "$shape" "$wall" "$extra" "$work/stats.json" "$nv" "$@" >>"$rows"
  tail -1 "$rows" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
f = lambda k: "-" if r.get(k) is None else r[k]
print("  %-6s %-10s %-18s first call %s s, cpu %s s  (before kernels %s, kernels %s, after %s; compiled %s, from disk %s, compile max %s s)  NVRTC cache %s KiB%s%s" % (
    r["api"], r["phase"], r["shape"], f("first_call_s"), f("first_call_cpu_s"), f("before_kernels_s"), f("kernels_wall_s"), f("after_kernels_s"),
    f("compiled"), f("from_disk"), f("compile_max_s"), f("nvrtc_cache_kib"),
    "  wall %s s" % r["total_wall_s"] if "total_wall_s" in r else "",
    "" if r["ok"] else "  FAILED: %s" % r.get("errors")))'
}

# run_ranks API SHAPE DIR NVCACHE TAG: $RANKS processes started at once (run_one each), timed from
# the launch of the first to the exit of the last ($t0, $t1); their outputs in the array files.
run_ranks() {
  local api=$1 shape=$2 dir=$3 nv=$4 tag=$5 r
  files=()
  start
  for r in $(seq 0 $((RANKS - 1))); do
    run_one "$api" "$shape" "$dir" "$nv" "$work/$api-$tag$r.json" &
    files+=("$work/$api-$tag$r.json")
  done
  wait
  t1=$(now)
}

t_script=$(now)
for api in $APIS; do
  # cold, then warm on the same directories, then an empty flce directory with cold's NVRTC cache
  dir=$work/$api-cold nv=$work/$api-nv-cold
  start; run_one "$api" "$SHAPE" "$dir" "$nv" "$work/$api-cold.json"; t1=$(now)
  row "$api" cold "$SHAPE" "$dir" "$nv" "$(elapsed "$t0" "$t1")" '{}' "$work/$api-cold.json"
  start; run_one "$api" "$SHAPE" "$dir" "$nv" "$work/$api-warm.json"; t1=$(now)
  row "$api" warm "$SHAPE" "$dir" "$nv" "$(elapsed "$t0" "$t1")" '{"note": "directory counters include the cold run"}' "$work/$api-warm.json"
  start; run_one "$api" "$SHAPE" "$work/$api-nvwarm" "$nv" "$work/$api-nvwarm.json"; t1=$(now)
  row "$api" nvrtc-warm "$SHAPE" "$work/$api-nvwarm" "$nv" "$(elapsed "$t0" "$t1")" \
    '{"note": "empty flce cache directory, the cold run NVRTC cache (CUDA_CACHE_PATH)"}' "$work/$api-nvwarm.json"
  # new shapes on warm's directories
  i=0
  for s in $NEW_SHAPES; do
    i=$((i + 1))
    IFS=x read -r n2 d2 v2 <<<"$s"
    changed=$(python3 -c 'import json,sys; a=sys.argv[1].split("x"); b=sys.argv[2].split("x"); print(json.dumps([k for k,x,y in zip(("tokens","hidden","vocab"),a,b) if x!=y]))' "$SHAPE" "$s")
    start; run_one "$api" "$s" "$dir" "$nv" "$work/$api-new$i.json"; t1=$(now)
    row "$api" new-shape "$s" "$dir" "$nv" "$(elapsed "$t0" "$t1")" \
      "{\"from_shape\": \"$SHAPE\", \"changed\": $changed, \"note\": \"after cold and warm of from_shape: its flce and NVRTC caches; directory counters include those runs\"}" \
      "$work/$api-new$i.json"
  done
  # RANKS processes at once on new empty directories
  dir=$work/$api-ranks nv=$work/$api-nv-ranks
  mkdir -p "$dir" "$nv"
  run_ranks "$api" "$SHAPE" "$dir" "$nv" rank
  entries=$("$FLCE" cache stats --json --dir "$dir" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["entries"] == s["compiles"] and s["compiles"] > 0)')
  row "$api" "$RANKS-ranks" "$SHAPE" "$dir" "$nv" "$(elapsed "$t0" "$t1")" \
    "{\"each_kernel_compiled_once\": $( [ "$entries" = True ] && echo true || echo false)}" "${files[@]}"
  # RANKS processes at once on a shape new to them whose kernels the cold run's directories hold
  # (issue 16's tier: "a new shape with the generic kernels already cached"): what is left of the
  # 8-rank wall when nothing compiles (driver start-up, module loads)
  if [ -n "$NEW_SHAPES" ]; then
    s=${NEW_SHAPES##* } dir=$work/$api-cold nv=$work/$api-nv-cold
    run_ranks "$api" "$s" "$dir" "$nv" nrank
    row "$api" "$RANKS-ranks-new-shape" "$s" "$dir" "$nv" "$(elapsed "$t0" "$t1")" \
      "{\"from_shape\": \"$SHAPE\", \"note\": \"cold's directories: the shape-free kernels and the generic twin cached\"}" "${files[@]}"
  fi
  if [ "$FAST" = 1 ]; then
    dir=$work/$api-cold-fast nv=$work/$api-nv-fast
    start; run_one "$api" "$SHAPE" "$dir" "$nv" "$work/$api-fast.json" FLCE_NVRTC_FAST=1; t1=$(now)
    row "$api" cold "$SHAPE" "$dir" "$nv" "$(elapsed "$t0" "$t1")" '{"options": "FLCE_NVRTC_FAST=1"}' "$work/$api-fast.json"
  fi
done

# flce warmup on empty directories: NVRTC wall for the shape's kernels on this host's cores.
dir=$work/cli-warmup nv=$work/cli-nv
mkdir -p "$nv"
start
FLCE_CACHE_DIR=$dir CUDA_CACHE_PATH=$nv timeout "$PROC_TIMEOUT" "$FLCE" warmup --shapes "$SHAPE" >"$work/warmup.log" 2>&1
rc=$?
t1=$(now)
wall=$(elapsed "$t0" "$t1")
echo "{\"first_call_s\": $wall, \"ok\": $( [ $rc = 0 ] && echo true || echo false)}" >"$work/warmup.json"
warm_kernels=$(python3 - "$work/warmup.log" <<'PY'
import json, re, sys
k = []
for line in open(sys.argv[1]):
    m = re.match(r"^\s+(compiled|cached)\s+\d+-byte cubin\s+([0-9.]+) ms\s+(\S+)", line)
    if m:
        k.append({"role": m.group(3), "origin": "compiled" if m.group(1) == "compiled" else "disk", "ms": float(m.group(2))})
c = [x["ms"] for x in k if x["origin"] == "compiled"]
print(json.dumps({"kernels": k, "compiled": len(c), "compile_sum_s": round(sum(c) / 1e3, 3),
                  "compile_max_s": round(max(c, default=0) / 1e3, 3)}))
PY
)
extra=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); e["note"]="flce warmup --shapes on empty flce and NVRTC caches: wall of the whole command (CUDA initialization included where there is a GPU), no GPU work"; print(json.dumps(e))' "$warm_kernels")
row cli flce-warmup "$SHAPE" "$dir" "$nv" "$wall" "$extra" "$work/warmup.json"
sed 's/^/    /' "$work/warmup.log" | grep -E "compiled|cached|warmup:" | head -8

# NVRTC probes (bench/nvrtc_time.c, the logits kernel of $SHAPE): a process's first NVRTC compile and
# the same source again in that process, then in a new process on the same CUDA_CACHE_PATH, then with
# CUDA_CACHE_DISABLE=1. Where NVRTC's cache is on, the repeats are cache hits.
if [ "$PROBE" = 1 ]; then
  nv=$work/probe-nv
  mkdir -p "$nv"
  for p in 1 2 3; do
    case $p in
      1) args=(--init --reps 2) envs=(CUDA_CACHE_PATH="$nv") what="first process: a tiny kernel twice, then logits twice" ;;
      2) args=(--reps 1) envs=(CUDA_CACHE_PATH="$nv") what="second process, same CUDA_CACHE_PATH: logits once" ;;
      3) args=(--reps 2) envs=(CUDA_CACHE_PATH="$work/probe-nv3" CUDA_CACHE_DISABLE=1) what="CUDA_CACHE_DISABLE=1: logits twice" ;;
    esac
    env "${envs[@]}" timeout "$PROC_TIMEOUT" "$work/nvrtc_time" --shape "$SHAPE" --only logits "${args[@]}" >"$work/probe$p.log" 2>&1
    python3 - "$p" "$what" "$work/probe$p.log" >>"$rows" <<'PY'
import json, os, re, sys
p, what, text = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
row = {"shape": os.environ["CS_SHAPE"], "api": "nvrtc", "phase": "probe-%s" % p, "first_call_s": None, "date": os.environ["CS_DATE"],
       "commit": os.environ["CS_COMMIT"], "device": os.environ["CS_DEVICE"], "ok": "total cpu" in text, "note": what}
m = re.search(r"load \(dlopen\) ([0-9.]+) ms", text)
if m: row["nvrtc_load_ms"] = float(m.group(1))
m = re.search(r"first compile of the process ([0-9.]+) ms wall \(([0-9.]+) cpu\), second ([0-9.]+) ms", text)
if m: row["tiny_first_ms"], row["tiny_first_cpu_ms"], row["tiny_second_ms"] = map(float, m.groups())
m = re.search(r"each rep \(wall/cpu ms\):(.*)", text)
reps = re.findall(r"([0-9.]+)/([0-9.]+)", m.group(1)) if m else re.findall(r"wall best\s+([0-9.]+) .*cpu best\s+([0-9.]+)", text)
row["logits_reps_ms"] = [[float(a), float(b)] for a, b in reps]  # [wall, cpu] per compile
row["libcuda_loaded"] = "libcuda.so.1 loaded" in text
row["cores"] = int(os.environ["CS_CORES"])
if not row["ok"]:
    row["errors"] = [text[-300:]]
print(json.dumps(row))
PY
    tail -1 "$rows" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("  nvrtc  %-10s logits compiles (wall/cpu ms) %s  libcuda loaded by NVRTC: %s  (%s)" % (r["phase"], r.get("logits_reps_ms"), r.get("libcuda_loaded"), r["note"]))'
  done
fi

python3 - "$rows" "$json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    json.dump(rows, f, indent=1)
    f.write("\n")
PY
echo "coldstart: $(wc -l <"$rows") rows in $json, each process's output in $CS_RAW ($(elapsed "$t_script" "$(now)") s)"
