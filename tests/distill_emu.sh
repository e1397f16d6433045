#!/bin/bash
# distill_emu.sh SOURCE_DIR [CXX] [CC] — templates/distill.cu's kernels run on the host through
# tests/distill_emu/shim.h against testing/ref.c ref_distill in fp64 (tests/distill_emu/emu.cpp):
# every divergence (JSD's ends too) with CE off/on, each reduction, T, labels NULL, one and several
# token chunks, a NaN teacher row, each also under tensor parallelism (the fp32 path's two reads with
# the exchanges between; 2 and 3 shards); and flce_topk_row against a sort, alone and under tensor
# parallelism (each shard's block, then flce_topk_merge; the header checks); JSD's log-ratios against
# the mixture on a grid out to ±inf. fp32 only (the 16-bit
# conversions are PTX). Exit 77 without a C++ compiler. The GPU tests of the same calls are
# test_distill_gpu and test_topk_gpu.
src=$1; cxx=${2:-c++}; cc=${3:-cc}
command -v "$cxx" > /dev/null || { echo "no C++ compiler ($cxx): skipped"; exit 77; }
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
"$cc" -O1 -c -I"$src/include" -I"$src/testing" "$src/testing/ref.c" -o "$dir/ref.o" || exit 1
fails=0 runs=0
# divergence beta T ce_weight labels reduction chunk nan_row
one() {
    local div=$1 beta=$2 T=$3 ce=$4 lab=$5 red=$6 chunk=$7 nan=${8:--1} eff=$1
    [ "$div" = 2 ] && [ "$beta" = 0.0 ] && eff=0 # Liger's ends, as emit_distill_source emits them
    [ "$div" = 2 ] && [ "$beta" = 1.0 ] && eff=1
    { printf '#define FLCE_GENERATED 1\n#define FLCE_DTYPE 0\n#define DISTILL_DIV %d\n#define DISTILL_LABELS %d\n' "$eff" "$lab"
      printf '#define FLCE_LABEL_BITS 32\n#define FLCE_REDUCTION %d\n' "$red"
      printf 'constexpr float DISTILL_BETA = %sf, INV_TEMP = 1.0f / %sf, CE_WEIGHT = %sf;\n' "$beta" "$T" "$ce"
      printf '#define DIVP %d\n#define BETAD %s\n#define NANROW %d\n' "$div" "$beta" "$nan"
      cat "$src/templates/params.h" "$src/templates/distill.cu"; } > "$dir/k.cu"
    runs=$((runs + 1))
    if ! "$cxx" -std=c++17 -O1 -w -I"$dir" -I"$src/tests/distill_emu" -I"$src/testing" -I"$src/include" \
         "$src/tests/distill_emu/emu.cpp" "$dir/ref.o" -o "$dir/emu" -lm; then
        echo "FAIL (build) $*"; fails=$((fails + 1)); return
    fi
    if out=$("$dir/emu" "$chunk"); then echo "ok   $* : $out"; else echo "FAIL $* : $out"; fails=$((fails + 1)); fi
    runs=$((runs + 1)) # the same under tensor parallelism (2 and 3 shards)
    if out=$("$dir/emu" "$chunk" tp); then echo "ok   tp $* : $(echo "$out" | tr '\n' ' ')"
    else echo "FAIL tp $* : $out"; fails=$((fails + 1)); fi
    if [ "$eff" = 2 ] && [ "$nan" = -1 ]; then # JSD's log-ratios against long double, to ±inf
        runs=$((runs + 1))
        if out=$("$dir/emu" jsdlogs); then echo "ok   jsdlogs $* : $out"
        else echo "FAIL jsdlogs $* : $out"; fails=$((fails + 1)); fi
    fi
    if [ "$eff" = 0 ] && [ "$nan" = -1 ]; then # the teacher as top-k: forward KL over its ids
        runs=$((runs + 1))
        if out=$("$dir/emu" topkkl); then echo "ok   topkkl $* : $(echo "$out" | tr '\n' ' ')"
        else echo "FAIL topkkl $* : $out"; fails=$((fails + 1)); fi
    fi
}
# every divergence with each of (CE at T = 1, labels), (T = 2, labels), (T = 1.5, no labels), the
# three reductions rotating over them so that each divergence meets each reduction and each
# configuration each reduction (9 builds, not 27: CI's time budget; the GPU test runs the full product)
for div in 0 1 2; do
    red=$div
    for cfg in "1.0 0.7 1" "2.0 0.0 1" "1.5 0.0 0"; do
        set -- $cfg
        one $div 0.3 "$1" "$2" "$3" $red 7
        red=$(( (red + 1) % 3 ))
    done
done
one 2 0.0 1.0 0.0 1 0 40   # JSD beta 0 = forward KL
one 2 1.0 2.0 0.0 0 1 40   # JSD beta 1 = reverse KL
one 1 0.3 1.0 0.5 1 2 1    # one token a chunk
one 2 0.7 0.5 0.0 1 0 40   # T < 1, one chunk
one 2 0.4 1.0 0.0 1 2 9 5  # NaN in token 5's teacher row
one 1 0.4 1.0 0.0 1 2 1 5
# flce_topk_row (the same module) against a sort of the same logits
runs=$((runs + 1))
if out=$("$dir/emu" topk); then echo "ok   topk: $(echo "$out" | tr '\n' ' ')"; else echo "FAIL topk: $out"; fails=$((fails + 1)); fi
# … and under tensor parallelism: 5 shard layouts against the fp64 sort of the whole vocab, the headers
runs=$((runs + 1))
if out=$("$dir/emu" topktp); then echo "ok   topktp: $(echo "$out" | tr '\n' ' ')"; else echo "FAIL topktp: $out"; fails=$((fails + 1)); fi
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" = 0 ]
