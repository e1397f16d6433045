/*
 * cache.h — the on-disk kernel cache (docs/DESIGN.md §5.4). Keys are arbitrary byte strings (the runtime
 * builds them from the full source, NVRTC options, NVRTC version, arch and library version); values
 * are cubins. Called by jit.c (load, lock, store) and by the `flce cache` tool (list, stats, prune,
 * clear).
 *
 * Guarantees:
 *  - Entry file name = 32 lowercase hex digits of a 128-bit hash of the key, plus ".cubin".
 *  - The key text is stored inside the entry and compared on load: a hash collision is a miss.
 *  - A checksum covers the whole entry; a truncated or corrupt entry is a miss (and is removed,
 *    so the next store replaces it).
 *  - Stores write a unique temporary file in the directory and rename() it into place, so
 *    concurrent writers (many ranks) never expose a partial entry.
 *  - A missing directory is created (mkdir -p). A directory that cannot be created or written makes
 *    the cache memory-only: cache_store returns FLCE_OK, logs one warning (log.h, level warn) per
 *    process for that directory, and writes nothing.
 *  - Compile lock (cache_lock_entry): processes that miss the same key at once compile it once; the
 *    others wait for the entry. The lock only saves work: whatever happens to it (a holder killed,
 *    hung or on a file system without flock), entries stay whole and every caller gets a cubin.
 *    A file system that refuses flock (ENOLCK, EOPNOTSUPP, ...) means compiling without the lock:
 *    one warning (log.h, level warn) per process for that directory, and no lock file left.
 *  - Size cap: a store that takes the directory's entries past $FLCE_CACHE_MAX_MIB (default 2048;
 *    0 = no cap) removes the least recently used entries (file mtime, which a hit refreshes when it
 *    is more than a minute old) down to 90 % of the cap. The check is a directory scan, made at a
 *    process's first store to a directory and then every CACHE_SCAN_STORES stores or sooner when
 *    its own stores could have used a quarter of the room the last scan saw, so the cap is soft.
 *    Scans also remove temporary files and unheld lock files older than CACHE_STALE_SECONDS.
 *  - Read-only layers: $FLCE_CACHE_RO=dir1:dir2 are searched, in order, after the directory given
 *    to cache_load misses (a prebuilt cache in a container image or on shared storage). Nothing
 *    in them is ever written, touched or removed.
 */
#ifndef FLCE_CACHE_H
#define FLCE_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache_consts.h"
#include "cache_counters.h"
#include "error.h"

/* CACHE_PATH_MAX, CACHE_DEFAULT_MAX_MIB, CACHE_STALE_SECONDS, CACHE_SCAN_STORES and the other
 * constants of the cache are cache_consts.h's. */

/* The directory: $FLCE_CACHE_DIR, else $XDG_CACHE_HOME/flce, else $HOME/.cache/flce.
 * FLCE_ERR_IO when none of them is set (no HOME). */
flce_status cache_dir(char *out, size_t cap);
/* mkdir -p (the user's umask decides the mode). 0 when `dir` ends up an existing directory, else
 * -1 with errno of the step that failed. */
int cache_make_dirs(const char *dir);
/* The directory the runtime uses: cache_dir, except that when FLCE_CACHE_DIR is unset and the
 * default directory (XDG_CACHE_HOME or HOME based) is missing, cannot be created or is not
 * writable, it is $TMPDIR/flce-<uid> (else /tmp/flce-<uid>), created 0700 and used only if it is
 * a directory of this user that others cannot write; one warning per process (log.h, warn) says
 * so. An explicit FLCE_CACHE_DIR is always used as given. The choice is remembered per process for
 * the values of those variables. */
flce_status cache_dir_writable(char *out, size_t cap);

/* Looks `key` up in `dir`, then in the read-only layers of $FLCE_CACHE_RO. Hit: *blob is a malloc'd
 * copy of the value (caller frees), *len its size. Miss, collision, corrupt or truncated entry:
 * *blob = NULL, *len = 0, FLCE_OK. A hit in `dir` refreshes the entry's mtime (its recency for the
 * cap) when that is more than a minute old. */
flce_status cache_load(const char *dir, const void *key, size_t key_len, void **blob, size_t *len);
/* cache_load with the read-only layers given ("dir1:dir2"; NULL or "": none) instead of
 * $FLCE_CACHE_RO: a context's own (flce_options.cache_ro). */
flce_status cache_load_ro(const char *dir, const char *ro_layers, const void *key, size_t key_len, void **blob,
                          size_t *len);

/* Stores `blob` under `key` atomically (see above), then keeps the directory under its cap (see
 * above). FLCE_OK also when the directory is unusable. */
flce_status cache_store(const char *dir, const void *key, size_t key_len, const void *blob,
                        size_t len);

/* The compile lock of one entry: "<32 hex>.lock" in the directory, held with flock(LOCK_EX). */
typedef struct cache_entry_lock {
    int fd;            /* -1 when not held */
    dev_t dev;         /* the lock file held, so unlock removes only that one */
    ino_t ino;
    double waited_ms;  /* time spent waiting for another holder */
    char path[CACHE_PATH_MAX];
} cache_entry_lock;

/* Takes the compile lock of `key`'s entry in `dir`, waiting while another process or thread holds
 * it (polling, up to $FLCE_CACHE_LOCK_TIMEOUT seconds, default CACHE_DEFAULT_LOCK_TIMEOUT_S; 0
 * turns locking off). Use: cache_load misses → cache_lock_entry → cache_load again (the holder
 * waited for has usually stored the entry) → compile → cache_store → cache_unlock_entry.
 * Returns 1 when held. Returns 0, holding nothing, when locking is off, the directory or lock file
 * cannot be created or opened (read-only directory), the file system refuses flock, or the wait
 * timed out: the caller compiles anyway. A lock whose file is older than the timeout (its holder
 * hung) is broken: removed, so later callers lock a new file. A holder that dies releases it at
 * once (flock), leaving its lock file unheld: the next caller takes it without waiting. Never
 * fails; *lk is always initialized. */
int cache_lock_entry(const char *dir, const void *key, size_t key_len, cache_entry_lock *lk);
/* Removes the lock file (if it is still the one held) and releases the lock. No-op when not held. */
void cache_unlock_entry(cache_entry_lock *lk);

typedef struct cache_stats {
    uint64_t entries;      /* valid entries */
    uint64_t bytes;        /* total bytes of valid entries' files */
    uint64_t invalid;      /* files that look like entries but fail their checks */
    uint64_t temp_files;   /* leftover temporary files of interrupted writers */
    uint64_t lock_files;   /* compile lock files (held now, or left by a killed holder) */
} cache_stats;

/* One callback per entry file found (valid or not). `key_head` is the first line of the stored key
 * (the runtime puts a one-line human-readable summary there), "" for invalid entries. */
typedef void (*cache_visit_fn)(void *user, const char *file_name, uint64_t bytes, int valid,
                               const char *key_head);

flce_status cache_list(const char *dir, cache_visit_fn visit, void *user);
flce_status cache_stat(const char *dir, cache_stats *out);
/* Removes every entry, temporary file and lock file of ours in `dir`, and its stats file (so the
 * persistent counters restart); nothing else. *removed counts them. */
flce_status cache_clear(const char *dir, uint64_t *removed);

/* $FLCE_CACHE_MAX_MIB in bytes (CACHE_DEFAULT_MAX_MIB when unset or not a number); 0 = no cap. */
uint64_t cache_max_bytes(void);

typedef struct cache_prune_result {
    uint64_t entries, bytes;         /* entries left and their bytes */
    uint64_t evicted, evicted_bytes; /* least recently used entries removed for the cap */
    uint64_t invalid_removed;        /* entries that failed their checks */
    uint64_t temp_removed;           /* temporary files older than CACHE_STALE_SECONDS */
    uint64_t locks_removed;          /* unheld lock files older than CACHE_STALE_SECONDS */
} cache_prune_result;

/* Removes stale temporary and lock files and invalid entries (every entry is read and checked),
 * then least recently used entries until the rest take at most `max_bytes` (0: no eviction).
 * An entry used or replaced while the prune runs is kept. */
flce_status cache_prune(const char *dir, uint64_t max_bytes, cache_prune_result *out);

/* The process counters (cache_counters_get, cache_note_compile) are cache_counters.h's. */

/* ---- persistent counters of a directory (`flce cache stats`) -----------------------------------
 * Every process that looks kernels up in a directory adds what it saw to "<dir>/stats.log": one
 * text line per process and flush, appended with O_APPEND (one write() of < 256 bytes, so lines of
 * processes flushing together do not interleave on a local file system), read back and summed by
 * cache_dir_counters_read. A process keeps its counts in memory and flushes them when it exits
 * normally (atexit), every CACHE_STATS_FLUSH_EVENTS lookups in a directory, and on
 * cache_stats_flush; a process killed loses what it had not flushed, and a forked child never
 * flushes its parent's counts. A flush that finds the file over CACHE_STATS_COMPACT_BYTES folds it
 * into one line (under flock; appenders hold it shared, so no line is lost). A directory that
 * cannot be written keeps no counts; nothing here ever fails a call. cache_clear removes the file
 * (the counters restart with the cache). $FLCE_CACHE_STATS=0 turns recording off. On a file system
 * without flock the lines are appended unlocked and the file is never compacted. */
/* CACHE_STATS_FILE, CACHE_STATS_FLUSH_EVENTS, CACHE_STATS_COMPACT_BYTES: cache_consts.h. */

typedef enum cache_outcome {
    CACHE_OUTCOME_HIT = 0,    /* found at the first look (this directory or a read-only layer) */
    CACHE_OUTCOME_WAITED = 1, /* missed, then loaded the entry another process or thread compiled */
    CACHE_OUTCOME_COMPILED = 2 /* missed and compiled here */
} cache_outcome;

typedef struct cache_dir_counters {
    uint64_t lookups;    /* kernels looked up (hits + misses) */
    uint64_t hits;       /* found at the first look */
    uint64_t misses;     /* not found at the first look (waited + compiled + failed compiles) */
    uint64_t waited;     /* misses served by another process's (or thread's) compile */
    uint64_t compiles;   /* misses compiled by the process that missed */
    double compile_ms;   /* the compiles' NVRTC time, summed (not wall: compiles overlap) */
    /* The CPU time of the threads that ran those compiles, summed. Beside compile_ms it tells the
     * two ways a compile's wall time misleads apart: wall well above CPU is a compile that waited
     * for a core (contention); CPU far below what a compile normally costs is NVRTC 12.9+'s own
     * cache (under CUDA_CACHE_PATH) serving it. Lines written before this field existed carry
     * none, so over a directory that old processes also used it covers only the newer compiles. */
    double compile_cpu_ms;
    double wait_ms;      /* time misses spent waiting for another process's compile lock */
    uint64_t evicted;    /* entries removed for the size cap by stores of these processes */
    uint64_t records;    /* lines merged (about one per process) */
} cache_dir_counters;

/* One kernel lookup of the JIT in `dir`: its outcome, the compile's NVRTC wall and thread CPU ms
 * (COMPILED; a negative one is not counted) and the time waited for another holder of the entry's
 * compile lock (any outcome). Never fails. */
void cache_stats_note(const char *dir, cache_outcome outcome, double compile_ms, double compile_cpu_ms,
                      double wait_ms);
/* Appends this process's unflushed counts of every directory to their stats files. */
void cache_stats_flush(void);
/* The sum of `dir`'s stats file plus this process's unflushed counts there. A missing file is all
 * zeros; FLCE_ERR_IO only when the file exists but cannot be read. */
flce_status cache_dir_counters_read(const char *dir, cache_dir_counters *out);

#endif
