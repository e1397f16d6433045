/*
 * cache_counters.h — what this process's cache calls did (since it started; all directories
 * together): cache_counters_get for the JIT and the `flce` tool, and the counting calls of the
 * cache's own files. cache.h includes it; cache_counters.c keeps the counts under one mutex.
 */
#ifndef FLCE_CACHE_COUNTERS_H
#define FLCE_CACHE_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

/* What this process's cache calls did (since it started; all directories together). */
typedef struct cache_counters {
    uint64_t hits, misses;      /* cache_load calls that found the entry / did not */
    uint64_t hit_bytes;         /* values returned by hits */
    uint64_t stores, store_bytes; /* entries written (renamed into place) and their file bytes */
    uint64_t evicted, evicted_bytes; /* entries removed for the cap by stores and prunes */
    uint64_t lock_waits;        /* cache_lock_entry calls that found the lock held */
    double lock_wait_ms;        /* time they waited */
    uint64_t compiles;          /* compiles the JIT reported (cache_note_compile) */
    double compile_ms;          /* their wall time */
    double compile_cpu_ms;      /* the compiling threads' CPU time in them */
} cache_counters;
void cache_counters_get(cache_counters *out);
/* The JIT reports each compile that followed a miss, for the counters: its wall ms and the CPU ms
 * of the thread that ran it (negative: not measured, counted as 0). */
void cache_note_compile(double ms, double cpu_ms);

/* ---- for the cache's own files ------------------------------------------------------------- */

/* A cache_load: `hit` with a value of `bytes`, or a miss (cache_load_store.c). */
void cache_count_lookup(int hit, size_t bytes);
/* An entry of `bytes` file bytes renamed into place (cache_load_store.c). */
void cache_count_store(uint64_t bytes);
/* A wait of `ms` for another holder's compile lock (cache_lock.c). */
void cache_count_lock_wait(double ms);
/* Entries evicted for the cap (cache_prune.c). */
void cache_count_evicted(uint64_t evicted, uint64_t bytes);

#endif
