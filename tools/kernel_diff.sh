#!/usr/bin/env bash
# kernel_diff.sh — do two builds generate the same kernels? For refactors of templates/ and
# generator/ that must not change what runs on the GPU, checked without one (CPU only: NVRTC, nvcc
# and ptxas need no device).
#
#   tools/kernel_diff.sh BEFORE_BUILD AFTER_BUILD [JOBS]
#
# Both builds get tools/kernel_diff_dump.c compiled against their libflce.a (with the headers of
# their own source tree; each tree's own kernel_diff_dump.c where it has one, so that a change of
# the spec's layout, which the dumper fills, can be compared with its base), which writes the generated source of a fixed matrix of specs — sm_80
# mma.sync and FFMA, sm_90a wgmma + TMA, wgmma + cp.async (FLCE_DEV=tma=0) and the portable tile,
# sm_100a tcgen05 (FLCE_ENABLE_SM100=1) and mma.sync; logits (Z store, compact p̃, fused dZ with
# mean and none, each without and with all options), dh, dw; other tile shapes; rowops — and the
# cubin nvrtc_compile builds from each. Then, spec by spec:
#   src    the two sources after the C preprocessor (comments, directives, blank lines gone,
#          whitespace collapsed): identical, the same lines moved, lines dropped, or lines added
#   ptx    nvcc -ptx (compute_80 / compute_90a / compute_100a), the leading comment lines cut
#   ptxas  ptxas -v on that PTX for the real arch: registers, spills, stack, shared memory
#   cubin  the NVRTC cubins byte for byte. NVRTC does not always give the same cubin for the same
#          source (seen on fp32 FFMA logits kernels), so where they differ each side is compiled 3
#          more times: "rerun" when the two sides then share a cubin, "nondet" when they share none
#          but a side varied by itself (the PTX comparison stands for those), else DIFFERS
# Exits 0 only when ptx and ptxas are identical for every spec and no cubin differs beyond that.
# KERNEL_DIFF_NO_CUBIN=1 skips the NVRTC cubins (cubin=skipped): on a machine of few cores they take
# most of the time (~188 full compiles a side), and ptx and ptxas decide the exit status anyway.
# KERNEL_DIFF_CHANGED_ONLY=1 compiles only the specs whose generated text differs between the two
# builds; one byte-identical on both sides is reported "same text" (the compilers get the same
# input), counted as identical: for a chain of small steps, each against the previous step's build.
# KERNEL_DIFF_CHANGED_ONLY=cpp also skips a spec whose two texts are the same after the host's C
# preprocessor (cpp -P, blank lines dropped, nothing else changed), reported "same after cpp":
# for edits that only remove lines the preprocessor drops anyway. Not where a conditional reads a
# predefined macro other than __cplusplus (NVRTC's predefined macros differ from the host's).
# KERNEL_DIFF_SPECS=REGEX compares only the specs whose name (NNN_role_kind_smNN) matches the
# extended regular expression: a quick look at a few kinds between the full runs.
# KERNEL_DIFF_PTX_CACHE=DIR keeps each nvcc -ptx / ptxas -v result under DIR by the hash of its
# source and arch, and reuses it: nvcc is deterministic for one source, so the same text gives the
# same PTX, and a chain of runs against one base build compiles the base's sources once.
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
fi
before_build=$(cd "$1" && pwd) after_build=$(cd "$2" && pwd) jobs=${3:-2}
work=$(mktemp -d "${TMPDIR:-/tmp}/kernel_diff.XXXXXX")
here=$(cd "$(dirname "$0")" && pwd)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda=$(cd "$(dirname "$nvcc")/.." && pwd)
export PATH="$cuda/bin:$PATH"

cache_value() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"; }

build_dumper() { # build dir, output binary
    local src nccl dumper
    src=$(cache_value "$1" flce_SOURCE_DIR)
    nccl=$(cache_value "$1" FLCE_NCCL_LIBRARY)
    [ -f "$1/libflce.a" ] || { echo "kernel_diff: $1/libflce.a missing (build it first)" >&2; return 1; }
    case $nccl in */libnccl*) ;; *) nccl= ;; esac
    # each tree builds its own dumper (the spec's fields differ between trees); one older than the
    # dumper uses this tree's. base/ (absent before 2026-11-23, harmless then): tool_api.h's headers
    # include atomic_file.h and error.h from it; without it "error.h" found glibc's file of that name
    dumper="$src/tools/kernel_diff_dump.c"
    [ -f "$dumper" ] || dumper="$here/kernel_diff_dump.c"
    cc -std=c11 -O1 -D_DEFAULT_SOURCE -I"$src/include" -I"$src/base" -I"$src/generator" -I"$src/runtime" -I"$cuda/include" \
        "$dumper" "$1/libflce.a" -L"$cuda/lib64" -L"$cuda/lib" -lnvrtc ${nccl:+"$nccl"} \
        -ldl -lpthread -lm -Wl,-rpath,"$cuda/lib64" -Wl,-rpath,"$cuda/lib" -o "$2"
}

build_dumper "$before_build" "$work/dump_before" && build_dumper "$after_build" "$work/dump_after" || exit 2
mkdir -p "$work/before" "$work/after" "$work/redo"
echo "kernel_diff: dumping sources and NVRTC cubins of both builds into $work"
no_cubin=${KERNEL_DIFF_NO_CUBIN:+--no-cubin}
export no_cubin
"$work/dump_before" "$work/before" $no_cubin > "$work/dump_before.log" 2>&1 &
pid=$!
"$work/dump_after" "$work/after" $no_cubin > "$work/dump_after.log" 2>&1 || { cat "$work/dump_after.log" >&2; exit 2; }
wait $pid || { cat "$work/dump_before.log" >&2; exit 2; }
if ! cmp -s "$work/before/index.txt" "$work/after/index.txt"; then
    echo "kernel_diff: the two builds made different spec lists" >&2
    diff "$work/before/index.txt" "$work/after/index.txt" | head >&2
    exit 2
fi
export work

one() {
    local name=$1 sm virt real side src ptx ptxas cubin regs spill
    sm=${name##*_sm}
    case $sm in
        80) virt=compute_80 real=sm_80 ;;
        90) virt=compute_90a real=sm_90a ;;
        100) virt=compute_100a real=sm_100a ;;
        *) echo "$name: unknown arch $sm"; return ;;
    esac
    if [ -n "${KERNEL_DIFF_CHANGED_ONLY:-}" ] && cmp -s "$work/before/$name.cu" "$work/after/$name.cu"; then
        printf '%-40s src=%-10s ptx=%-9s ptxas=%-9s cubin=%-9s (same text)\n' "$name" identical identical identical skipped
        return
    fi
    if [ "${KERNEL_DIFF_CHANGED_ONLY:-}" = cpp ] &&
        ! grep -hE '^[[:space:]]*#[[:space:]]*(el)?if.*__[A-Za-z]' "$work/before/$name.cu" "$work/after/$name.cu" |
            grep -qv '__cplusplus' &&
        cpp -P -x c++ "$work/before/$name.cu" 2> /dev/null | grep -v '^[[:space:]]*$' > "$work/cmp/$name.cpp_before" &&
        cpp -P -x c++ "$work/after/$name.cu" 2> /dev/null | grep -v '^[[:space:]]*$' > "$work/cmp/$name.cpp_after" &&
        [ -s "$work/cmp/$name.cpp_before" ] && cmp -s "$work/cmp/$name.cpp_before" "$work/cmp/$name.cpp_after"; then
        printf '%-40s src=%-10s ptx=%-9s ptxas=%-9s cubin=%-9s (same after cpp)\n' "$name" identical identical \
            identical skipped
        return
    fi
    for side in before after; do
        local f="$work/$side/$name" o="$work/cmp/$name.$side" key=""
        cpp -P -x c++ "$f.cu" 2> /dev/null | sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' -e 's/ $//' | grep -v '^$' > "$o.i"
        sort "$o.i" > "$o.sorted"
        if [ -n "${KERNEL_DIFF_PTX_CACHE:-}" ]; then
            key="$KERNEL_DIFF_PTX_CACHE/$( (cat "$f.cu"; echo "$virt $real") | md5sum | cut -c1-32)"
            if [ -s "$key.ptx" ] && [ -s "$key.ptxas" ]; then
                cp "$key.ptx" "$o.ptx" && cp "$key.ptxas" "$o.ptxas" && continue
            fi
        fi
        nvcc -std=c++17 -gencode=arch=$virt,code=$virt -ptx "$f.cu" -o "$o.ptx.raw" 2> "$o.nvcc.log" ||
            { echo "$name: nvcc failed ($side)"; return; }
        awk 'started || /^\.version/ { started = 1 } started' "$o.ptx.raw" > "$o.ptx"
        ptxas -arch=$real -v "$o.ptx" -o /dev/null 2>&1 |
            grep -E 'Compiling entry|Function properties|stack frame|Used [0-9]+ registers|bytes (gmem|smem|cmem)' |
            sed 's/, *Compile time.*//' > "$o.ptxas"
        if [ -n "$key" ] && [ -s "$o.ptxas" ]; then # written whole, then renamed: parallel jobs may share a key
            cp "$o.ptx" "$key.ptx.$$" && mv "$key.ptx.$$" "$key.ptx"
            cp "$o.ptxas" "$key.ptxas.$$" && mv "$key.ptxas.$$" "$key.ptxas"
        fi
    done
    local b="$work/cmp/$name.before" a="$work/cmp/$name.after"
    comm -23 "$b.sorted" "$a.sorted" > "$work/cmp/$name.only_before"
    comm -13 "$b.sorted" "$a.sorted" > "$work/cmp/$name.only_after"
    if cmp -s "$b.i" "$a.i"; then src=identical
    elif [ ! -s "$work/cmp/$name.only_before" ] && [ ! -s "$work/cmp/$name.only_after" ]; then src=moved
    elif [ ! -s "$work/cmp/$name.only_after" ]; then src="dropped$(wc -l < "$work/cmp/$name.only_before")"
    else src="ADDED$(wc -l < "$work/cmp/$name.only_after")"; fi
    cmp -s "$b.ptx" "$a.ptx" && ptx=identical || ptx=DIFFERS
    cmp -s "$b.ptxas" "$a.ptxas" && ptxas=identical || ptxas=DIFFERS
    [ -s "$b.ptxas" ] || ptxas=EMPTY
    if [ -n "$no_cubin" ]; then cubin=skipped
    elif cmp -s "$work/before/$name.cubin" "$work/after/$name.cubin"; then cubin=identical
    else # NVRTC again, 3 times a side: any cubin in common?
        local i hb ha
        for side in before after; do
            md5sum < "$work/$side/$name.cubin" | cut -d' ' -f1 > "$work/cmp/$name.$side.md5"
            for i in 1 2 3; do
                mkdir -p "$work/redo/$name.$side.$i"
                "$work/dump_$side" "$work/redo/$name.$side.$i" --only "$((10#${name%%_*}))" > /dev/null 2>&1
                md5sum < "$work/redo/$name.$side.$i/$name.cubin" | cut -d' ' -f1 >> "$work/cmp/$name.$side.md5"
            done
        done
        hb=$(sort -u "$work/cmp/$name.before.md5") ha=$(sort -u "$work/cmp/$name.after.md5")
        if [ -n "$(comm -12 <(echo "$hb") <(echo "$ha"))" ]; then cubin=rerun
        elif [ "$(echo "$hb" | wc -l)" -gt 1 ] || [ "$(echo "$ha" | wc -l)" -gt 1 ]; then cubin=nondet
        else cubin=DIFFERS; fi
    fi
    regs=$(grep -o 'Used [0-9]* registers' "$a.ptxas" | awk '{print $2}' | paste -sd/)
    spill=$(grep -o '[0-9]* bytes spill stores' "$a.ptxas" | awk '{s += $1} END {print s + 0}')
    printf '%-40s src=%-10s ptx=%-9s ptxas=%-9s cubin=%-9s regs=%s spill=%s\n' "$name" "$src" "$ptx" "$ptxas" \
        "$cubin" "$regs" "$spill"
}
export -f one
mkdir -p "$work/cmp"
echo "kernel_diff: comparing $(grep -c . "$work/before/index.txt") specs${KERNEL_DIFF_SPECS:+ (those matching $KERNEL_DIFF_SPECS)} ($jobs jobs)"
if [ -n "${KERNEL_DIFF_PTX_CACHE:-}" ]; then
    mkdir -p "$KERNEL_DIFF_PTX_CACHE" && KERNEL_DIFF_PTX_CACHE=$(cd "$KERNEL_DIFF_PTX_CACHE" && pwd) || exit 2
    export KERNEL_DIFF_PTX_CACHE
fi
ls "$work/before" | sed -n 's/\.cu$//p' | sort | grep -E "${KERNEL_DIFF_SPECS:-.}" | xargs -P "$jobs" -I{} bash -c 'one {}' | sort > "$work/report.txt"
cat "$work/report.txt"
total=$(grep -c . "$work/report.txt")
good=$(grep -c 'ptx=identical *ptxas=identical *cubin=\(identical\|rerun\|nondet\|skipped\)' "$work/report.txt")
echo "---"
echo "specs: $total; PTX and ptxas -v identical and no cubin DIFFERS: $good (cubins identical:" \
     "$(grep -c 'cubin=identical' "$work/report.txt"), identical on a rerun: $(grep -c 'cubin=rerun' "$work/report.txt")," \
     "nondet: $(grep -c 'cubin=nondet' "$work/report.txt"), skipped: $(grep -c 'cubin=skipped' "$work/report.txt"))"
echo "sources after the preprocessor: $(grep -c 'src=identical' "$work/report.txt") identical," \
     "$(grep -c 'src=moved' "$work/report.txt") with lines moved, $(grep -c 'src=dropped' "$work/report.txt") with lines" \
     "dropped (none added), $(grep -c 'src=ADDED' "$work/report.txt") with lines added"
if grep -q 'src=dropped' "$work/report.txt"; then
    echo "distinct sets of dropped lines (count, first spec; the lines are in $work/cmp/<spec>.only_before):"
    for f in "$work"/cmp/*.only_before; do [ -s "$f" ] && echo "$(md5sum < "$f" | cut -c1-12) $(basename "$f" .only_before)"; done |
        sort | awk '{n[$1]++; if (!($1 in first)) first[$1] = $2} END {for (k in n) print "  " n[k], first[k]}'
fi
echo "details: $work"
[ "$good" -eq "$total" ] && [ "$total" -gt 0 ]
