/*
 * cache_internal.h — what the files of the disk cache share among themselves; everything else
 * includes cache.h alone. The cache is split by concern:
 *   cache_load_store.c  lookups (writable directory, then read-only layers), stores
 *   cache_counters.c  the process counters (cache_counters.h)
 *   cache_entry.c  an entry file: name, layout (below), read and check, write
 *   cache_dir.c    the directory: choice, mkdir -p, scan, one-time warnings
 *   cache_lock.c   the compile lock, and the flock/clock helpers it shares with cache_stats.c
 *   cache_prune.c  the size cap: scans, eviction, stale temporary and lock files
 *   cache_list.c   list, stat and clear for `flce cache`
 *   cache_stats.c  the persistent per-directory counters (stats.log)
 *
 * Entry file "<32 hex>.cubin", all integers little-endian:
 *
 *   offset       size  field
 *   0            4     magic "FLCE"
 *   4            4     format version (CACHE_FORMAT_VERSION)
 *   8            8     key length K
 *   16           8     value length V
 *   24           K     key bytes
 *   24+K         V     value bytes (the cubin)
 *   24+K+V       8     checksum = hash64(value, hash64(key, hash64(header, CACHE_CHECKSUM_SEED)))
 *
 * The file size must be exactly 32+K+V. The checksum is chained through the seeds so a store can
 * write header, key and value from the caller's buffers without concatenating them first.
 */
#ifndef FLCE_CACHE_INTERNAL_H
#define FLCE_CACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "cache.h"
#include "cache_consts.h"

/* The entry format's constants (CACHE_MAGIC, CACHE_FORMAT_VERSION, ...), the names' suffixes and
 * the lock polling pauses are cache_consts.h's. */

/* ---- an entry file (cache_entry.c) ---------------------------------------------------------- */

typedef enum cache_read_result {
    CACHE_READ_VALID,      /* well-formed, checksum matches, and the key matches if one was given */
    CACHE_READ_OTHER_KEY,  /* a well-formed header whose key is not ours: a hash collision */
    CACHE_READ_INVALID,    /* fails a format check: safe to remove */
    CACHE_READ_UNREADABLE, /* missing, not a regular file, or an I/O error: leave it alone */
    CACHE_READ_NOMEM
} cache_read_result;

/* An entry read whole into memory; key and value point into buf. */
typedef struct cache_entry {
    unsigned char *buf;
    size_t size;
    const unsigned char *key;
    uint64_t key_len;
    const unsigned char *value;
    uint64_t value_len;
    dev_t dev; /* identity of the file read, so a bad entry is removed only if still in place */
    ino_t ino;
    time_t mtime;
    const char *why; /* reason for INVALID / UNREADABLE, for the log */
} cache_entry;

/* Exactly "<32 lowercase hex>.cubin". */
int cache_is_entry_name(const char *name);
/* "<32 lowercase hex>.cubin.tmp.<anything>". */
int cache_is_temp_name(const char *name);
/* "<32 lowercase hex>.lock". */
int cache_is_lock_name(const char *name);
/* "<dir>/<32 hex of hash128(key)><suffix>"; 0 when it does not fit in CACHE_PATH_MAX. */
int cache_key_path(char *out, const char *dir, const void *key, size_t key_len, const char *suffix);
int cache_entry_path(char *out, const char *dir, const void *key, size_t key_len);
/* Opens and checks the entry at `path`; on VALID the caller owns e->buf. `want` may be NULL
 * (list/stat: any key is fine). */
cache_read_result cache_read_entry(const char *path, const void *want, size_t want_len, int have_want,
                                   cache_entry *e);
/* Removes a bad entry unless a writer has already renamed a new file into its place. */
void cache_remove_if_same(const char *path, const cache_entry *e);
/* Writes the whole entry to fd; 0 on success, else -1 with errno. */
int cache_write_entry(int fd, const void *key, size_t key_len, const void *blob, size_t len);

/* ---- the directory (cache_dir.c) ------------------------------------------------------------ */

/* What a one-time warning is about, so that one directory can get one of each. */
typedef enum cache_warning { CACHE_WARN_UNUSABLE = 0, CACHE_WARN_NO_FLOCK = 1 } cache_warning;

/* 0 when "<dir>/<name>" does not fit in CACHE_PATH_MAX. */
int cache_join(char *out, const char *dir, const char *name);
/* True the first time this process sees `dir` for `what`; the caller then logs its one warning. */
int cache_first_warning(const char *dir, cache_warning what);
/* The one warning that `dir` is unusable and kernels stay in memory (`what` failed with `err`). */
void cache_warn_unusable(const char *dir, const char *what, int err);

typedef flce_status (*cache_name_fn)(void *user, const char *dir, const char *name);
/* Calls fn for each directory entry name. A missing directory holds nothing. */
flce_status cache_scan(const char *dir, cache_name_fn fn, void *user);

/* ---- locks and clocks (cache_lock.c) -------------------------------------------------------- */

/* flock(), or the no-locks fault of fault.h: ENOLCK, as NFS without lockd answers. */
int cache_flock(int fd, int op);
double cache_now_ms(void);
/* Seconds since `t` on the wall clock (negative when the file system's clock is ahead). */
double cache_age_s(time_t t);
void cache_sleep_ms(double ms);
int cache_same_file(const struct stat *a, const struct stat *b);
/* Removes a lock file nobody holds that is older than CACHE_STALE_SECONDS; 1 when removed. */
int cache_remove_stale_lock(const char *path);

/* ---- the size cap (cache_prune.c) ----------------------------------------------------------- */

/* After a store of `bytes` to `dir`: scan and evict when this process's view of the directory
 * says it may be over its cap. `kept` (the entry's file name) is never evicted. */
void cache_after_store(const char *dir, const char *kept, uint64_t bytes);

/* ---- counters (cache_counters.h, cache_stats.c) ------------------------------------------- */

/* Adds `evicted` entries removed for the cap by this process to dir's persistent counters. */
void cache_stats_note_evicted(const char *dir, uint64_t evicted);

#endif
