/*
 * cache_consts.h — the constants of the disk cache, in a header of their own so that every file of
 * the cache (and cache.h, which includes it) can use them without depending on another's code.
 * The entry file layout they describe is in cache_internal.h; the guarantees they tune in cache.h.
 */
#ifndef FLCE_CACHE_CONSTS_H
#define FLCE_CACHE_CONSTS_H

#include "atomic_file.h"

#define CACHE_PATH_MAX 4096
#define CACHE_DEFAULT_MAX_MIB 2048
/* Temporary files of killed writers and lock files nobody holds are removed once this old. */
#define CACHE_STALE_SECONDS 600
/* A process rescans a directory for the cap at least every this many stores to it. */
#define CACHE_SCAN_STORES 32
/* How long a miss waits for another process's compile of the same key (FLCE_CACHE_LOCK_TIMEOUT). */
#define CACHE_DEFAULT_LOCK_TIMEOUT_S 120

/* The persistent counters of a directory (cache.h: "persistent counters"). */
#define CACHE_STATS_FILE "stats.log"
#define CACHE_STATS_FLUSH_EVENTS 64
#define CACHE_STATS_COMPACT_BYTES (64u * 1024u)

/* An entry file (cache_internal.h: the layout) and the names of the cache's files. */
#define CACHE_MAGIC "FLCE"
#define CACHE_FORMAT_VERSION 1u
#define CACHE_HEADER_BYTES 24u
#define CACHE_CHECKSUM_BYTES 8u
#define CACHE_CHECKSUM_SEED 0x5fd3a1c9e04b7263ull
#define CACHE_HEX_DIGITS 32
#define CACHE_SUFFIX ".cubin"
#define CACHE_TEMP_INFIX ATOMIC_FILE_TEMP_INFIX
#define CACHE_LOCK_SUFFIX ".lock"
/* Polling of a held lock (the compile lock, stats.log's): first pause, longest pause. */
#define CACHE_LOCK_POLL_MIN_MS 2.0
#define CACHE_LOCK_POLL_MAX_MS 50.0

#endif
