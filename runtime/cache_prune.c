/*
 * cache_prune.c — the size cap ($FLCE_CACHE_MAX_MIB): the directory scans that stores trigger
 * (cache_after_store) and `flce cache prune` runs (cache_prune), least-recently-used eviction, and
 * the removal of stale temporary and lock files those scans also do. Each process remembers per
 * directory how much it saw and stored, so that it rescans only when the cap may be near.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache_counters.h"
#include "cache_consts.h"
#include "cache_internal.h"
#include "config.h"
#include "hash.h"
#include "log.h"

/* Automatic eviction goes down to this share of the cap, so it does not run at every store. */
#define CACHE_EVICT_TARGET_PERCENT 90
/* Directories whose scan state a process remembers (cache_after_store); past that it scans at
 * every store to the others. */
#define CACHE_SCAN_SLOTS 16

/* What one process knows about a directory's size since it last scanned it. */
typedef struct cache_scan_state {
    uint64_t id;           /* hash64 of the directory name */
    uint64_t bytes_seen;   /* entries' bytes after the last scan */
    uint64_t stored_since; /* bytes this process stored there since */
    unsigned stores_since;
} cache_scan_state;

static pthread_mutex_t cache_scan_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_scan_state cache_scans[CACHE_SCAN_SLOTS];
static size_t cache_scan_count;

/* ---- size cap, eviction, stale files ----------------------------------------------------- */

uint64_t cache_max_bytes(void)
{
    const char *v = config_env(CONFIG_CACHE_MAX_MIB);
    char *end;
    if (!v || !*v || *v == '-') return (uint64_t)CACHE_DEFAULT_MAX_MIB << 20;
    errno = 0;
    unsigned long long mib = strtoull(v, &end, 10);
    if (end == v || *end || errno) return (uint64_t)CACHE_DEFAULT_MAX_MIB << 20;
    if (mib > (UINT64_MAX >> 20)) mib = UINT64_MAX >> 20;
    return (uint64_t)mib << 20;
}

/* One entry file as a scan saw it. */
typedef struct cache_file {
    char name[CACHE_HEX_DIGITS + sizeof CACHE_SUFFIX];
    uint64_t bytes;
    struct timespec mtime;
    dev_t dev;
    ino_t ino;
} cache_file;

typedef struct cache_prune_ctx {
    cache_file *files;
    size_t n, cap;
    uint64_t total;
    int check; /* read and check every entry (cache_prune), or only stat them (stores) */
    cache_prune_result *r;
} cache_prune_ctx;

static flce_status cache_prune_one(void *user, const char *dir, const char *name)
{
    cache_prune_ctx *c = user;
    char path[CACHE_PATH_MAX];
    struct stat st;
    if (!cache_join(path, dir, name)) return FLCE_OK;
    if (cache_is_temp_name(name)) {
        /* A store renames its temp file within moments; one this old lost its writer. */
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            cache_age_s(st.st_mtime) > CACHE_STALE_SECONDS && unlink(path) == 0)
            c->r->temp_removed++;
        return FLCE_OK;
    }
    if (cache_is_lock_name(name)) {
        c->r->locks_removed += (uint64_t)cache_remove_stale_lock(path);
        return FLCE_OK;
    }
    if (!cache_is_entry_name(name) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return FLCE_OK;
    if (c->check) {
        cache_entry e;
        cache_read_result res = cache_read_entry(path, NULL, 0, 0, &e);
        free(e.buf);
        if (res == CACHE_READ_NOMEM)
            return err_set(FLCE_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to check %s", e.size,
                           path);
        if (res == CACHE_READ_INVALID) {
            log_msg(LOG_INFO, "cache entry %s is corrupt (%s); removed", path, e.why);
            cache_remove_if_same(path, &e);
            c->r->invalid_removed++;
            return FLCE_OK;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        cache_file *grown = realloc(c->files, cap * sizeof *grown);
        if (!grown) return err_set(FLCE_ERR_OUT_OF_MEMORY, "scanning %s: out of host memory", dir);
        c->files = grown;
        c->cap = cap;
    }
    cache_file *f = &c->files[c->n++];
    memcpy(f->name, name, sizeof f->name);
    f->bytes = (uint64_t)st.st_size;
    f->mtime = st.st_mtim;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    c->total += f->bytes;
    return FLCE_OK;
}

/* Least recently used first; the name breaks ties so the order is the same for everyone. */
static int cache_file_order(const void *pa, const void *pb)
{
    const cache_file *a = pa, *b = pb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
    if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Removes the least recently used entries until the rest take at most `target` bytes. `kept` (the
 * entry a store just wrote) stays; so does an entry used (mtime) or replaced (inode) since the
 * scan. */
static void cache_evict(const char *dir, cache_prune_ctx *c, uint64_t target, const char *kept)
{
    char path[CACHE_PATH_MAX];
    qsort(c->files, c->n, sizeof *c->files, cache_file_order);
    for (size_t i = 0; i < c->n && c->total > target; i++) {
        const cache_file *f = &c->files[i];
        struct stat st;
        if ((kept && !strcmp(f->name, kept)) || !cache_join(path, dir, f->name)) continue;
        if (lstat(path, &st) != 0) {
            c->total -= f->bytes; /* someone else removed it */
            c->r->entries--;
            continue;
        }
        if (st.st_dev != f->dev || st.st_ino != f->ino || st.st_mtim.tv_sec != f->mtime.tv_sec ||
            st.st_mtim.tv_nsec != f->mtime.tv_nsec)
            continue;
        if (unlink(path) != 0) continue;
        log_msg(LOG_DEBUG, "cache: evicted %s (%llu bytes)", path, (unsigned long long)f->bytes);
        c->total -= f->bytes;
        c->r->entries--;
        c->r->evicted++;
        c->r->evicted_bytes += f->bytes;
    }
}

/* Scans `dir`; over `trigger` bytes of entries (0: never), evicts down to `target`. */
static flce_status cache_prune_dir(const char *dir, uint64_t trigger, uint64_t target,
                                   const char *kept, int check, cache_prune_result *r)
{
    cache_prune_ctx c = {NULL, 0, 0, 0, check, r};
    memset(r, 0, sizeof *r);
    flce_status status = cache_scan(dir, cache_prune_one, &c);
    r->entries = c.n;
    if (status == FLCE_OK && trigger && c.total > trigger) cache_evict(dir, &c, target, kept);
    r->bytes = c.total;
    free(c.files);
    if (r->evicted) cache_count_evicted(r->evicted, r->evicted_bytes);
    return status;
}

flce_status cache_prune(const char *dir, uint64_t max_bytes, cache_prune_result *out)
{
    cache_prune_result r;
    if (!dir) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_prune: dir is NULL");
    flce_status status = cache_prune_dir(dir, max_bytes, max_bytes, NULL, 1, &r);
    if (out) *out = r;
    return status;
}

/* After a store: scan and evict when this process's view of the directory says it may be over
 * its cap (cache.h, "Size cap"). */
void cache_after_store(const char *dir, const char *kept, uint64_t bytes)
{
    uint64_t cap = cache_max_bytes();
    if (!cap) return;
    uint64_t id = hash64(dir, strlen(dir), 0);
    int scan = 1;
    pthread_mutex_lock(&cache_scan_lock);
    cache_scan_state *s = NULL;
    for (size_t i = 0; i < cache_scan_count && !s; i++)
        if (cache_scans[i].id == id) s = &cache_scans[i];
    if (s) {
        s->stored_since += bytes;
        s->stores_since++;
        scan = s->stores_since >= CACHE_SCAN_STORES ||
               s->bytes_seen >= cap || 4 * s->stored_since > cap - s->bytes_seen;
    }
    pthread_mutex_unlock(&cache_scan_lock);
    if (!scan) return;
    cache_prune_result r;
    if (cache_prune_dir(dir, cap, cap / 100 * CACHE_EVICT_TARGET_PERCENT, kept, 0, &r) != FLCE_OK) {
        err_clear(); /* the store itself worked; the next one scans again */
        return;
    }
    cache_stats_note_evicted(dir, r.evicted);
    if (r.evicted)
        log_msg(LOG_INFO,
                "cache: %s was over its cap of %llu MiB: removed %llu least recently used "
                "entries (%.1f MiB)",
                dir, (unsigned long long)(cap >> 20), (unsigned long long)r.evicted,
                (double)r.evicted_bytes / (1024.0 * 1024.0));
    if (r.temp_removed || r.locks_removed)
        log_msg(LOG_INFO, "cache: removed %llu stale temporary and %llu stale lock files in %s",
                (unsigned long long)r.temp_removed, (unsigned long long)r.locks_removed, dir);
    pthread_mutex_lock(&cache_scan_lock);
    s = NULL;
    for (size_t i = 0; i < cache_scan_count && !s; i++)
        if (cache_scans[i].id == id) s = &cache_scans[i];
    if (!s && cache_scan_count < CACHE_SCAN_SLOTS) {
        s = &cache_scans[cache_scan_count++];
        s->id = id;
    }
    if (s) {
        s->bytes_seen = r.bytes;
        s->stored_since = 0;
        s->stores_since = 0;
    }
    pthread_mutex_unlock(&cache_scan_lock);
}
