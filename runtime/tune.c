/*
 * tune.c — the dispatcher's side of autotuning (tune.h): the per-process copy of the tune table,
 * the lookup plan.c makes for every plan, the tuner's forced tiles, and the candidate lists.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "config.h"
#include "log.h"
#include "tune.h"

/* The table as this process read it, keyed by its path (tests and tools switch FLCE_CACHE_DIR).
 * Read once, on the first plan that looks something up: plans are made on every call, so the
 * lookup must be a mutex and a short scan, never file I/O. */
static pthread_mutex_t tune_lock = PTHREAD_MUTEX_INITIALIZER;
static tune_table tune_cached;
static char tune_cached_path[CACHE_PATH_MAX];
static int tune_loaded;
static tune_key tune_last_logged; /* "tuned"/"default" is logged when the class changes */
static int tune_last_was_tuned = -1;

static _Thread_local int tune_is_forced;
static _Thread_local spec_tile tune_forced_tiles[TUNE_ROLES];

void tune_force_tiles(const spec_tile tiles[TUNE_ROLES])
{
    tune_is_forced = tiles != NULL;
    if (tiles) memcpy(tune_forced_tiles, tiles, sizeof tune_forced_tiles);
}

void tune_forget(void)
{
    pthread_mutex_lock(&tune_lock);
    tune_table_free(&tune_cached);
    tune_loaded = 0;
    tune_last_was_tuned = -1;
    pthread_mutex_unlock(&tune_lock);
}

/* Call with tune_lock held: makes tune_cached the table of the current cache directory. */
static void tune_load_locked(void)
{
    char path[CACHE_PATH_MAX];
    if (tune_table_path(path, sizeof path) != FLCE_OK) {
        err_clear(); /* no cache directory: no table, default tiles */
        path[0] = '\0';
    }
    if (tune_loaded && !strcmp(path, tune_cached_path)) return;
    tune_table_free(&tune_cached);
    snprintf(tune_cached_path, sizeof tune_cached_path, "%s", path);
    tune_loaded = 1;
    if (path[0] && tune_table_load(path, 0, &tune_cached) != FLCE_OK) {
        log_msg(LOG_WARN, "tune table %s: %s; default tiles", path, err_message());
        err_clear();
        tune_table_free(&tune_cached);
    }
}

/* Copies the winner of class k into *out; 1 when there is one. */
static int tune_lookup(const tune_key *k, tune_entry *out, char *path, size_t cap)
{
    pthread_mutex_lock(&tune_lock);
    tune_load_locked();
    const tune_entry *e = tune_table_find(&tune_cached, k);
    if (e) *out = *e;
    snprintf(path, cap, "%s", tune_cached_path);
    pthread_mutex_unlock(&tune_lock);
    return e != NULL;
}

int tune_have(const tune_key *k)
{
    tune_entry e;
    char path[CACHE_PATH_MAX];
    return tune_lookup(k, &e, path, sizeof path);
}

/* Logs the choice at info when the class (or the choice) differs from the last one logged, so a
 * training loop's calls do not print a line each. */
static void tune_log_choice(const tune_key *k, int tuned, const char *what)
{
    if (!log_enabled(LOG_INFO)) return;
    pthread_mutex_lock(&tune_lock);
    int fresh = tune_last_was_tuned != tuned || !tune_key_equal(&tune_last_logged, k);
    tune_last_logged = *k;
    tune_last_was_tuned = tuned;
    pthread_mutex_unlock(&tune_lock);
    if (fresh)
        log_msg(LOG_INFO, "%s for %s sm_%d D=%lld V=%lld N~%lld opts=%x", what, k->device, k->sm,
                (long long)k->hidden, (long long)k->vocab, (long long)k->bucket, k->opts);
}

/* 1 when every tile passes spec_validate in the plan's own specs (options included). */
static int tune_tiles_fit(const plan *pl, const spec_tile tiles[TUNE_ROLES], char *why, size_t cap)
{
    const kernel_spec *base[TUNE_ROLES] = {&pl->logits, &pl->dh, &pl->dw};
    for (int r = 0; r < TUNE_ROLES; r++) {
        kernel_spec s = *base[r];
        s.tile = tiles[r];
        if (spec_validate(&s) != FLCE_OK) {
            snprintf(why, cap, "%s: %s", spec_role_name(s.role), err_message());
            err_clear();
            return 0;
        }
    }
    return 1;
}

static void tune_set(plan *pl, const spec_tile tiles[TUNE_ROLES])
{
    pl->logits.tile = tiles[0];
    pl->dh.tile = tiles[1];
    pl->dw.tile = tiles[2];
    pl->tiles_tuned = 1;
}

void tune_apply(const flce_problem *p, const char *device, int sm, plan *pl)
{
    char why[512], path[CACHE_PATH_MAX], msg[CACHE_PATH_MAX + 64];
    if (tune_is_forced) { /* the tuner checked these against spec_validate already */
        tune_set(pl, tune_forced_tiles);
        return;
    }
    if (!device) return; /* offline plans (flce gen, cpu tests): the built-in heuristic */
    tune_key k;
    tune_key_make(p, pl->n, device, sm, &k);
    if (config_get()->portable || !config_get()->tiles.tma) {
        tune_log_choice(&k, 0, "default tiles (FLCE_PORTABLE or FLCE_DEV=tma=0 set: tune table not consulted)");
        return;
    }
    tune_entry e;
    if (!tune_lookup(&k, &e, path, sizeof path)) {
        tune_log_choice(&k, 0, "default tiles (class not in the tune table)");
        return;
    }
    if (!tune_tiles_fit(pl, e.tile, why, sizeof why)) {
        log_msg(LOG_WARN, "tune table %s: winner for this class rejected (%s); default tiles", path, why);
        return;
    }
    tune_set(pl, e.tile);
    snprintf(msg, sizeof msg, "tuned tiles from %s", path);
    tune_log_choice(&k, 1, msg);
}

int tune_on_first_use(void) { return config_get()->tune; }

/* ---- candidates -------------------------------------------------------------------------- */

static int tune_push(const kernel_spec *s, spec_tile t, spec_tile *out, int n, int cap)
{
    if (n >= cap) return n;
    kernel_spec c = *s;
    c.tile = t;
    if (spec_validate(&c) != FLCE_OK) {
        err_clear();
        return n;
    }
    for (int i = 0; i < n; i++)
        if (!memcmp(&out[i], &t, sizeof t)) return n;
    out[n] = t;
    return n + 1;
}

int tune_candidates(int sm, flce_dtype dtype, spec_role role, int64_t hidden, int64_t vocab,
                    spec_tile *out, int cap)
{
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = sm, s.dtype = dtype, s.role = role, s.hidden = hidden, s.vocab_shard = vocab;
    s.label_bits = 32;
    int n = tune_push(&s, spec_default_tile(sm, dtype, role), out, 0, cap);
    if (sm == 90 && dtype != FLCE_DTYPE_F32) {
        /* Hopper 16-bit: the wgmma shape is fixed (128 rows, BK 64, two consumer warpgroups);
         * what varies is the tile width, the pipeline depth and TMA versus cp.async loads. */
        static const int bns[] = {128, 256};
        for (int tma = 1; tma >= 0; tma--)
            for (int b = 0; b < 2; b++)
                for (int st = 3; st <= 5; st++)
                    n = tune_push(&s,
                                  (spec_tile){128, bns[b], 64, st, 8, 1,
                                              tma ? MAINLOOP_WGMMA_TMA : MAINLOOP_WGMMA_CP_ASYNC},
                                  out, n, cap);
        return n;
    }
    /* mma.sync: CTA shapes around the default 128×256 (64×64 warp tiles), 8 warps (or 4 for the
     * small tiles), three stage depths; spec_validate drops what overflows registers or shared
     * memory (BK 64 at 128×256 fits sm_80/90 only). */
    static const int shapes[][4] = {{128, 256, 2, 4}, {256, 128, 4, 2}, {128, 128, 2, 4},
                                    {128, 128, 4, 2}, {64, 256, 2, 4},  {64, 128, 2, 2},
                                    {128, 64, 2, 2}};
    int bk0 = dtype == FLCE_DTYPE_F32 ? 16 : 32;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bk = bk0; bk <= 2 * bk0; bk *= 2)
            for (int st = 3; st <= 5; st++)
                n = tune_push(&s, (spec_tile){shapes[i][0], shapes[i][1], bk, st, shapes[i][2],
                                              shapes[i][3], MAINLOOP_MMA_SYNC},
                              out, n, cap);
    return n;
}
