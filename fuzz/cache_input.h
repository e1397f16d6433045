/*
 * cache_input.h — the fixed key that fuzz_cache_entry looks every input up under (besides the key
 * the entry claims and the empty key); make_corpus.c writes well-formed entries for it, so the
 * seeds reach the hit path of that lookup too.
 */
#ifndef FLCE_FUZZ_CACHE_INPUT_H
#define FLCE_FUZZ_CACHE_INPUT_H

/* Shaped like the runtime's keys (jit.c): a summary line, then the toolchain line. */
#define FUZZ_CACHE_FIXED_KEY                                                                       \
    "logits bf16 D=4096 V=32768 labels=i32 sm_90a tile=128x128x32 stages=4 warps=2x4\n"          \
    "flce fuzz | nvrtc fuzz | sm_90a | fuzz\n"

#endif
