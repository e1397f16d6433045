/*
 * cache_list.c — what `flce cache ls`, `stats` and `clear` (tools/cmd_cache.c) see of a
 * directory: every entry read and checked for the listing, counts of entries, temporary and lock
 * files, and removal of our files (and nothing else: the tune table shares the directory).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_consts.h"
#include "cache_internal.h"

/* list/cmd_cache print the key's first line; a cubin's summary line is far shorter than this. */
#define CACHE_KEY_HEAD_MAX 512

/* The key's first line, with control bytes shown as '?' so a terminal prints it safely. */
static void cache_key_head(const cache_entry *e, char *out, size_t cap)
{
    size_t n = 0;
    for (; n < e->key_len && n + 1 < cap && e->key[n] != '\n'; n++) {
        unsigned char c = e->key[n];
        out[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    out[n] = '\0';
}

typedef struct cache_list_ctx {
    cache_visit_fn visit;
    void *user;
} cache_list_ctx;

static flce_status cache_list_one(void *user, const char *dir, const char *name)
{
    cache_list_ctx *ctx = user;
    char path[CACHE_PATH_MAX];
    char head[CACHE_KEY_HEAD_MAX];
    struct stat st;
    cache_entry e;
    if (!cache_is_entry_name(name) || !cache_join(path, dir, name)) return FLCE_OK;
    if (stat(path, &st) != 0) return FLCE_OK; /* removed since readdir */
    cache_read_result r = cache_read_entry(path, NULL, 0, 0, &e);
    if (r == CACHE_READ_NOMEM)
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to check %s", e.size,
                       path);
    head[0] = '\0';
    if (r == CACHE_READ_VALID) cache_key_head(&e, head, sizeof head);
    free(e.buf);
    ctx->visit(ctx->user, name, (uint64_t)st.st_size, r == CACHE_READ_VALID, head);
    return FLCE_OK;
}

flce_status cache_list(const char *dir, cache_visit_fn visit, void *user)
{
    cache_list_ctx ctx = {visit, user};
    if (!visit) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_list: visit is NULL");
    return cache_scan(dir, cache_list_one, &ctx);
}

static void cache_stat_visit(void *user, const char *file_name, uint64_t bytes, int valid,
                             const char *key_head)
{
    cache_stats *s = user;
    (void)file_name;
    (void)key_head;
    if (valid) {
        s->entries++;
        s->bytes += bytes;
    } else {
        s->invalid++;
    }
}

static flce_status cache_count_temp(void *user, const char *dir, const char *name)
{
    (void)dir;
    if (cache_is_temp_name(name)) ((cache_stats *)user)->temp_files++;
    if (cache_is_lock_name(name)) ((cache_stats *)user)->lock_files++;
    return FLCE_OK;
}

flce_status cache_stat(const char *dir, cache_stats *out)
{
    if (!out) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_stat: out is NULL");
    memset(out, 0, sizeof *out);
    TRY(cache_list(dir, cache_stat_visit, out));
    return cache_scan(dir, cache_count_temp, out);
}

typedef struct cache_clear_ctx {
    uint64_t removed;
    flce_status status; /* first failure, reported after removing everything else */
} cache_clear_ctx;

static flce_status cache_clear_one(void *user, const char *dir, const char *name)
{
    cache_clear_ctx *ctx = user;
    char path[CACHE_PATH_MAX];
    size_t stats_len = strlen(CACHE_STATS_FILE);
    int stats = !strncmp(name, CACHE_STATS_FILE, stats_len) &&
                (!name[stats_len] || !strncmp(name + stats_len, CACHE_TEMP_INFIX, strlen(CACHE_TEMP_INFIX)));
    if (!cache_is_entry_name(name) && !cache_is_temp_name(name) && !cache_is_lock_name(name) && !stats)
        return FLCE_OK;
    if (!cache_join(path, dir, name)) return FLCE_OK;
    if (unlink(path) == 0) {
        ctx->removed++;
    } else if (errno != ENOENT && ctx->status == FLCE_OK) {
        ctx->status = err_set(FLCE_ERR_IO, "removing %s: %s", path, strerror(errno));
    }
    return FLCE_OK;
}

flce_status cache_clear(const char *dir, uint64_t *removed)
{
    cache_clear_ctx ctx = {0, FLCE_OK};
    flce_status status = cache_scan(dir, cache_clear_one, &ctx);
    if (removed) *removed = ctx.removed;
    return status != FLCE_OK ? status : ctx.status;
}
