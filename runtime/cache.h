/*
 * cache.h — the on-disk kernel cache (DESIGN.md §5). Keys are arbitrary byte strings (the runtime
 * builds them from the full source, NVRTC options, NVRTC version, arch and library version); values
 * are cubins. Called by jit.c (load/store) and by the `flce cache` tool (list/stats/clear).
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
 */
#ifndef FLCE_CACHE_H
#define FLCE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define CACHE_PATH_MAX 4096

/* The directory: $FLCE_CACHE_DIR, else $XDG_CACHE_HOME/flce, else $HOME/.cache/flce.
 * FLCE_ERR_IO when none of them is set (no HOME). */
flce_status cache_dir(char *out, size_t cap);
/* mkdir -p (the user's umask decides the mode). 0 when `dir` ends up an existing directory, else
 * -1 with errno of the step that failed. */
int cache_make_dirs(const char *dir);

/* Looks `key` up in `dir`. Hit: *blob is a malloc'd copy of the value (caller frees), *len its size.
 * Miss, collision, corrupt or truncated entry: *blob = NULL, *len = 0, FLCE_OK. */
flce_status cache_load(const char *dir, const void *key, size_t key_len, void **blob, size_t *len);

/* Stores `blob` under `key` atomically (see above). FLCE_OK also when the directory is unusable. */
flce_status cache_store(const char *dir, const void *key, size_t key_len, const void *blob,
                        size_t len);

typedef struct cache_stats {
    uint64_t entries;      /* valid entries */
    uint64_t bytes;        /* total bytes of valid entries' files */
    uint64_t invalid;      /* files that look like entries but fail their checks */
    uint64_t temp_files;   /* leftover temporary files of interrupted writers */
} cache_stats;

/* One callback per entry file found (valid or not). `key_head` is the first line of the stored key
 * (the runtime puts a one-line human-readable summary there), "" for invalid entries. */
typedef void (*cache_visit_fn)(void *user, const char *file_name, uint64_t bytes, int valid,
                               const char *key_head);

flce_status cache_list(const char *dir, cache_visit_fn visit, void *user);
flce_status cache_stat(const char *dir, cache_stats *out);
/* Removes every entry and temporary file of ours in `dir` (nothing else); *removed counts them. */
flce_status cache_clear(const char *dir, uint64_t *removed);

#endif
