/*
 * cache_load_store.c — the on-disk kernel cache of docs/DESIGN.md §5.4 (contract in cache.h): its
 * lookups and stores. jit.c calls cache_load before compiling, cache_lock_entry on a miss and
 * cache_store after; tools/cmd_cache.c calls list/stat/prune/clear.
 *
 * This file holds lookups and stores (the writable directory, then the read-only layers of
 * $FLCE_CACHE_RO); the entry format is cache_entry.c's, the directory cache_dir.c's, the compile
 * lock cache_lock.c's, the size cap cache_prune.c's, listing cache_list.c's, the process counters
 * cache_counters.c's and the persistent per-directory counters cache_stats.c's (cache_internal.h).
 * Like them it is named for what it holds: cache.h and cache_internal.h are the whole cache's
 * headers, not this file's, so the parts below it (entry, directory, lock, size cap), which
 * include them, depend on none of its code.
 *
 * Nothing here fails a compile short of running out of host memory: unusable directories and
 * failed writes become a warning (once per directory for the former) and FLCE_OK; bad entries
 * become misses; a lock that cannot be taken means compiling without it.
 *
 * Other files of ours in the directory: "<32 hex>.cubin.tmp.<pid>.<nonce>" (a store in progress,
 * or left by a killed writer) and "<32 hex>.lock" (a compile in progress; its holder removes it,
 * one killed leaves it, unheld), "stats.log" (the directory's persistent counters, appended by
 * every process that looked kernels up there; cache.h) and "stats.log.tmp.<pid>.<nonce>" (its
 * compaction in progress); both temporary names are base/atomic_file.h's. Anything else there
 * (the tune table) is never touched.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cache_consts.h"
#include "cache_counters.h"
#include "cache_internal.h"
#include "config.h"
#include "fault.h"
#include "log.h"

/* A hit refreshes the entry's mtime (its recency for the cap) when it is older than this; newer
 * ones are left alone so that ranks loading one kernel together do not all write its inode. */
#define CACHE_TOUCH_SECONDS 60

/* ---- load and store --------------------------------------------------------------------- */

/* Looks `key` up in one directory. `writable`: a corrupt entry is removed and a hit refreshes the
 * entry's recency; read-only layers get neither. */
static flce_status cache_load_from(const char *dir, const void *key, size_t key_len, int writable,
                                   void **blob, size_t *len)
{
    char path[CACHE_PATH_MAX];
    cache_entry e;
    if (!cache_entry_path(path, dir, key, key_len)) return FLCE_OK;
    switch (cache_read_entry(path, key, key_len, 1, &e)) {
    case CACHE_READ_VALID: break;
    case CACHE_READ_NOMEM:
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "cache_load: cannot allocate %zu bytes for %s",
                       e.size, path);
    case CACHE_READ_INVALID:
        if (!writable) {
            log_msg(LOG_WARN, "cache entry %s (read-only layer) is corrupt (%s); ignored", path,
                    e.why);
            return FLCE_OK;
        }
        log_msg(LOG_WARN, "cache entry %s is corrupt (%s); removed", path, e.why);
        cache_remove_if_same(path, &e);
        return FLCE_OK;
    case CACHE_READ_OTHER_KEY:
        log_msg(LOG_DEBUG, "cache entry %s holds another key (hash collision)", path);
        return FLCE_OK;
    case CACHE_READ_UNREADABLE: return FLCE_OK;
    }
    /* The least recently used entries go first when the directory is over its cap: a hit makes
     * this one recent. mtime, not atime (relatime and noatime make atime unreliable); a failure
     * (another user's file) only costs recency. */
    if (writable && cache_age_s(e.mtime) > CACHE_TOUCH_SECONDS) (void)utimensat(AT_FDCWD, path, NULL, 0);
    /* Hand back the value in the buffer already allocated: move it to the front and shrink. A
     * zero-length value still gets a non-NULL pointer, so a hit is never mistaken for a miss. */
    size_t n = (size_t)e.value_len;
    memmove(e.buf, e.value, n);
    void *shrunk = realloc(e.buf, n ? n : 1);
    *blob = shrunk ? shrunk : e.buf;
    *len = n;
    return FLCE_OK;
}

/* The read-only layers of `list` (colon-separated), in order, skipping `dir` itself. */
static flce_status cache_load_layers(const char *dir, const char *list, const void *key, size_t key_len,
                                     void **blob, size_t *len)
{
    char layer[CACHE_PATH_MAX];
    while (list && *list && !*blob) {
        size_t n = strcspn(list, ":");
        if (n > 0 && n < sizeof layer) {
            memcpy(layer, list, n);
            layer[n] = '\0';
            if (strcmp(layer, dir) != 0) TRY(cache_load_from(layer, key, key_len, 0, blob, len));
            if (*blob) log_msg(LOG_DEBUG, "cache: hit in read-only layer %s", layer);
        }
        list += n + (list[n] == ':');
    }
    return FLCE_OK;
}

flce_status cache_load(const char *dir, const void *key, size_t key_len, void **blob, size_t *len)
{
    return cache_load_ro(dir, config_env(CONFIG_CACHE_RO), key, key_len, blob, len);
}

flce_status cache_load_ro(const char *dir, const char *ro_layers, const void *key, size_t key_len, void **blob,
                          size_t *len)
{
    if (!blob || !len)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: blob and len must not be NULL");
    *blob = NULL;
    *len = 0;
    if (!dir || (!key && key_len))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: dir=%p key=%p key_len=%zu",
                       (const void *)dir, key, key_len);
    TRY(cache_load_from(dir, key, key_len, 1, blob, len));
    if (!*blob) TRY(cache_load_layers(dir, ro_layers, key, key_len, blob, len));
    cache_count_lookup(*blob != NULL, *len);
    return FLCE_OK;
}

typedef struct cache_entry_data {
    const void *key, *blob;
    size_t key_len, len;
} cache_entry_data;

/* atomic_file_writer.fill: cache_write_entry, or the disk-full fault of fault.h: a few bytes land,
 * then ENOSPC (or, for the stall variant, the writer blocks there until a test kills it). */
static int cache_fill_entry(int fd, void *arg)
{
    const cache_entry_data *d = arg;
    fault_action f = fault_fire(FAULT_CACHE_WRITE);
    if (f == FAULT_PASS) return cache_write_entry(fd, d->key, d->key_len, d->blob, d->len);
    (void)atomic_file_write_all(fd, CACHE_MAGIC, 4);
    while (f == FAULT_STALL) pause();
    errno = ENOSPC;
    return -1;
}

/* atomic_file_writer.before_rename: the rename fault of fault.h. */
static int cache_before_rename(void *arg)
{
    (void)arg;
    if (!fault_fire(FAULT_CACHE_RENAME)) return 0;
    errno = EACCES;
    return -1;
}


/* No fsync (atomic_file.h): after a crash a torn entry fails its checksum and is recompiled, which
 * is cheaper than an fsync per kernel on every rank's file system. */
flce_status cache_store(const char *dir, const void *key, size_t key_len, const void *blob,
                        size_t len)
{
    char path[CACHE_PATH_MAX];
    char tmp[CACHE_PATH_MAX];
    if (!dir || (!key && key_len) || (!blob && len))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "cache_store: dir=%p key=%p key_len=%zu blob=%p len=%zu", (const void *)dir,
                       key, key_len, blob, len);
    if (!cache_entry_path(path, dir, key, key_len)) {
        cache_warn_unusable(dir, "path too long", ENAMETOOLONG);
        return FLCE_OK;
    }
    if (cache_make_dirs(dir) != 0) {
        cache_warn_unusable(dir, "cannot create it", errno);
        return FLCE_OK;
    }
    cache_entry_data data = {key, blob, key_len, len};
    atomic_file_writer w = {cache_fill_entry, cache_before_rename, &data};
    atomic_file_stage stage = atomic_file_write(path, &w, tmp, sizeof tmp);
    if (stage == ATOMIC_FILE_CREATE) {
        cache_warn_unusable(dir, "cannot create a file in it", errno);
        return FLCE_OK;
    }
    if (stage != ATOMIC_FILE_DONE) {
        log_msg(LOG_WARN, "cache: writing %s failed (%s); kernel not cached", path,
                strerror(errno));
        return FLCE_OK;
    }
    uint64_t bytes = 32u + (uint64_t)key_len + (uint64_t)len;
    cache_count_store(bytes);
    cache_after_store(dir, path + strlen(path) - (CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX)), bytes);
    return FLCE_OK;
}
