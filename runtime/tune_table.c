/*
 * tune_table.c — reading, checking and atomically rewriting the autotune table (format and
 * guarantees in tune_table.h). tune.c keeps one parsed copy per process for the dispatcher.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cache.h"
#include "hash.h"
#include "log.h"
#include "tune_table.h"

#define TUNE_SUM_SEED 0x7a11e5ab1e0f1ce5ull
#define TUNE_FIELDS 15 /* tokens of a line, sum= included */

/* The embedded templates (build/templates_embedded.c): what the kernels are made of. */
extern const char *const tmpl_all[]; /* every embedded template file (generator/emit.h) */

int64_t tune_bucket(int64_t tokens)
{
    int64_t b = 1;
    while (b <= tokens / 2) b *= 2;
    return b;
}

void tune_device_token(const char *name, char out[TUNE_DEVICE_MAX])
{
    size_t n = 0;
    if (!name || !*name) name = "unknown";
    for (; name[n] && n + 1 < TUNE_DEVICE_MAX; n++) {
        char c = name[n];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        out[n] = ok ? c : '_';
    }
    out[n] = '\0';
}

void tune_key_make(const flce_problem *p, int64_t tokens, const char *device, int sm, tune_key *k)
{
    memset(k, 0, sizeof *k);
    tune_device_token(device, k->device);
    k->sm = sm;
    k->dtype = p->dtype;
    k->hidden = p->hidden;
    k->vocab = p->vocab_shard;
    k->bucket = tune_bucket(tokens);
    k->label_bits = p->label_bits;
    unsigned o = 0;
    if (p->has_bias) o |= TUNE_OPT_BIAS;
    if (p->has_class_weights) o |= TUNE_OPT_WEIGHTS;
    if (p->label_smoothing > 0) o |= TUNE_OPT_SMOOTHING;
    if (p->softcap > 0) o |= TUNE_OPT_SOFTCAP;
    if (p->temperature > 0 && p->temperature != 1.0f) o |= TUNE_OPT_TEMPERATURE;
    if (p->z_loss > 0) o |= TUNE_OPT_ZLOSS;
    k->opts = o;
}

int tune_key_equal(const tune_key *a, const tune_key *b)
{
    return !strcmp(a->device, b->device) && a->sm == b->sm && a->dtype == b->dtype &&
           a->hidden == b->hidden && a->vocab == b->vocab && a->bucket == b->bucket &&
           a->opts == b->opts && a->label_bits == b->label_bits;
}

uint64_t tune_generator_version(void)
{
    uint64_t h = hash64(TUNE_TABLE_HEADER, strlen(TUNE_TABLE_HEADER), 0);
    for (size_t i = 0; tmpl_all[i]; i++) h = hash64(tmpl_all[i], strlen(tmpl_all[i]), h);
    return h;
}

/* The main-loop kind of a tile is spec_mainloop_name's token, one per loop, so that a tile reads
 * back with the loop it was written from and spec_validate (not the text) decides whether it fits
 * the arch. Before issue 15 the text had no tcgen05: a Blackwell tile read back as the mma.sync tile
 * of the same shape, which sm_100 accepts. Tables written while the loop was three switches hold
 * these same four tokens for the four loops (the tuner stores validated tiles only); the tokens of
 * combinations that name no loop ("mma+tma", "tcgen05", "wgmma+tcgen05", ...) no longer parse. */
void tune_tile_text(const spec_tile *t, char *out, size_t cap)
{
    snprintf(out, cap, "%dx%dx%d/s%d/w%dx%d/%s", t->bm, t->bn, t->bk, t->stages, t->warps_m,
             t->warps_n, spec_mainloop_name(t->loop));
}

/* ---- strict little parsers over (text, length) ------------------------------------------ */

typedef struct tune_cursor {
    const char *p, *end;
} tune_cursor;

static int cur_lit(tune_cursor *c, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n)) return 0;
    c->p += n;
    return 1;
}

/* Decimal without sign, 1 to 15 digits (far beyond any real dimension, far below overflow). */
static int cur_int(tune_cursor *c, int64_t *v)
{
    int64_t x = 0;
    int digits = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 16) {
        x = x * 10 + (*c->p++ - '0');
        digits++;
    }
    if (digits == 0 || digits > 15) return 0;
    *v = x;
    return 1;
}

static int cur_small(tune_cursor *c, int *v)
{
    int64_t x;
    if (!cur_int(c, &x) || x > 100000) return 0;
    *v = (int)x;
    return 1;
}

static int hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* Exactly `digits` lowercase hex digits. */
static int cur_hex(tune_cursor *c, int digits, uint64_t *v)
{
    uint64_t x = 0;
    if (c->end - c->p < digits) return 0;
    for (int i = 0; i < digits; i++) {
        int d = hex_digit(c->p[i]);
        if (d < 0) return 0;
        x = (x << 4) | (uint64_t)d;
    }
    c->p += digits;
    *v = x;
    return 1;
}

int tune_tile_parse(const char *s, size_t len, spec_tile *t)
{
    tune_cursor c = {s, s + len};
    memset(t, 0, sizeof *t);
    if (!cur_small(&c, &t->bm) || !cur_lit(&c, "x") || !cur_small(&c, &t->bn) || !cur_lit(&c, "x") ||
        !cur_small(&c, &t->bk) || !cur_lit(&c, "/s") || !cur_small(&c, &t->stages) ||
        !cur_lit(&c, "/w") || !cur_small(&c, &t->warps_m) || !cur_lit(&c, "x") ||
        !cur_small(&c, &t->warps_n) || !cur_lit(&c, "/"))
        return -1;
    size_t rest = (size_t)(c.end - c.p);
    for (int k = 0; k < SPEC_MAINLOOPS; k++) {
        const char *kind = spec_mainloop_name((spec_mainloop)k);
        if (rest == strlen(kind) && !memcmp(c.p, kind, rest)) {
            t->loop = (spec_mainloop)k;
            return 0;
        }
    }
    return -1;
}

flce_status tune_line_format(const tune_entry *e, char *out, size_t cap)
{
    char tiles[TUNE_ROLES][64];
    for (int r = 0; r < TUNE_ROLES; r++) tune_tile_text(&e->tile[r], tiles[r], sizeof tiles[r]);
    char dev[TUNE_DEVICE_MAX];
    tune_device_token(e->key.device, dev);
    double ms = e->ms >= 0 && e->ms < 1e9 ? e->ms : 0; /* NaN and inf never reach the file */
    int n = snprintf(out, cap,
                     "%s sm_%d %s D=%lld V=%lld N=%lld opts=%x L=%d logits=%s dh=%s dw=%s ms=%.4f "
                     "flce=%s gen=%016llx",
                     dev, e->key.sm, spec_dtype_name(e->key.dtype), (long long)e->key.hidden,
                     (long long)e->key.vocab, (long long)e->key.bucket, e->key.opts,
                     e->key.label_bits, tiles[0], tiles[1], tiles[2], ms, FLCE_VERSION_STRING,
                     (unsigned long long)tune_generator_version());
    if (n < 0 || (size_t)n + 22 > cap || (size_t)n + 21 > TUNE_LINE_MAX)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tune table line for %s is %d bytes; at most %d fit",
                       dev, n + 21, TUNE_LINE_MAX);
    uint64_t sum = hash64(out, (size_t)n, TUNE_SUM_SEED);
    snprintf(out + n, cap - (size_t)n, " sum=%016llx", (unsigned long long)sum);
    return FLCE_OK;
}

/* ---- one line --------------------------------------------------------------------------- */

typedef struct tune_token {
    const char *p;
    size_t len;
} tune_token;

/* Splits at single spaces; 0 when there are not exactly TUNE_FIELDS non-empty tokens. */
static int split_fields(const char *line, size_t len, tune_token *tok)
{
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && line[i] != ' ') continue;
        if (i == start || n == TUNE_FIELDS) return 0;
        tok[n].p = line + start, tok[n].len = i - start;
        n++;
        start = i + 1;
    }
    return n == TUNE_FIELDS;
}

/* A token "<prefix><integer>". */
static int field_int(const tune_token *t, const char *prefix, int64_t *v)
{
    tune_cursor c = {t->p, t->p + t->len};
    return cur_lit(&c, prefix) && cur_int(&c, v) && c.p == c.end;
}

static int field_is(const tune_token *t, const char *prefix, const char *value)
{
    size_t a = strlen(prefix), b = strlen(value);
    return t->len == a + b && !memcmp(t->p, prefix, a) && !memcmp(t->p + a, value, b);
}

static int field_tile(const tune_token *t, const char *prefix, spec_tile *tile)
{
    size_t a = strlen(prefix);
    return t->len > a && !memcmp(t->p, prefix, a) && tune_tile_parse(t->p + a, t->len - a, tile) == 0;
}

static int parse_dtype_token(const tune_token *t, flce_dtype *d)
{
    for (int k = 0; k < 3; k++)
        if (t->len == strlen(spec_dtype_name((flce_dtype)k)) && !memcmp(t->p, spec_dtype_name((flce_dtype)k), t->len)) {
            *d = (flce_dtype)k;
            return 1;
        }
    return 0;
}

static int parse_device(const tune_token *t, char *out)
{
    char canon[TUNE_DEVICE_MAX];
    if (t->len >= TUNE_DEVICE_MAX) return 0;
    memcpy(out, t->p, t->len);
    out[t->len] = '\0';
    tune_device_token(out, canon);
    return !strcmp(canon, out); /* only bytes the writer could have written */
}

/* The winner's tiles must pass spec_validate for the class (the current validation, not the one
 * that wrote them). *why gets spec_validate's words. */
static int tiles_valid(const tune_entry *e, char *why, size_t cap)
{
    static const spec_role roles[TUNE_ROLES] = {ROLE_LOGITS, ROLE_DH, ROLE_DW};
    for (int r = 0; r < TUNE_ROLES; r++) {
        kernel_spec s;
        memset(&s, 0, sizeof s);
        s.sm = e->key.sm, s.dtype = e->key.dtype, s.hidden = e->key.hidden;
        s.vocab_shard = e->key.vocab, s.label_bits = e->key.label_bits, s.role = roles[r];
        s.tile = e->tile[r];
        if (spec_validate(&s) != FLCE_OK) {
            snprintf(why, cap, "%s tile rejected by spec validation: %s", spec_role_name(roles[r]),
                     err_message());
            err_clear(); /* a rejected line is not the caller's failure */
            return 0;
        }
    }
    return 1;
}

/* Parses one line (no newline) into *e; NULL when valid, else why it is rejected (written into
 * why[] when the reason needs values). */
static const char *parse_line(const char *line, size_t len, tune_entry *e, char *why, size_t cap)
{
    tune_token f[TUNE_FIELDS];
    memset(e, 0, sizeof *e);
    if (len > TUNE_LINE_MAX) return "longer than TUNE_LINE_MAX bytes";
    if (!split_fields(line, len, f)) return "not 15 space-separated fields";
    /* The checksum first: a torn or edited line says nothing trustworthy. */
    tune_cursor c = {f[14].p, f[14].p + f[14].len};
    uint64_t sum = 0;
    if (!cur_lit(&c, "sum=") || !cur_hex(&c, 16, &sum) || c.p != c.end) return "malformed sum= field";
    if (hash64(line, (size_t)(f[14].p - 1 - line), TUNE_SUM_SEED) != sum) return "checksum mismatch";
    int64_t sm = 0, d = 0, v = 0, nb = 0, lb = 0;
    uint64_t opts = 0, gen = 0;
    if (!parse_device(&f[0], e->key.device)) return "bad device name";
    if (!field_int(&f[1], "sm_", &sm) || !spec_arch_supported((int)sm)) return "unknown arch";
    if (!parse_dtype_token(&f[2], &e->key.dtype)) return "unknown dtype";
    if (!field_int(&f[3], "D=", &d) || !field_int(&f[4], "V=", &v) || !field_int(&f[5], "N=", &nb))
        return "malformed D=, V= or N=";
    if (nb < 1 || tune_bucket(nb) != nb) return "N= is not a power of two";
    c = (tune_cursor){f[6].p, f[6].p + f[6].len};
    if (!cur_lit(&c, "opts=") || c.end - c.p < 1 || c.end - c.p > 2 || !cur_hex(&c, (int)(c.end - c.p), &opts) ||
        (opts & ~(uint64_t)TUNE_OPT_ALL))
        return "malformed opts=";
    if (!field_int(&f[7], "L=", &lb) || (lb != 32 && lb != 64)) return "L= must be 32 or 64";
    if (!field_tile(&f[8], "logits=", &e->tile[0]) || !field_tile(&f[9], "dh=", &e->tile[1]) ||
        !field_tile(&f[10], "dw=", &e->tile[2]))
        return "malformed tile";
    if (f[11].len < 4 || memcmp(f[11].p, "ms=", 3)) return "malformed ms=";
    char msbuf[32];
    size_t ml = f[11].len - 3 < sizeof msbuf - 1 ? f[11].len - 3 : sizeof msbuf - 1;
    memcpy(msbuf, f[11].p + 3, ml);
    msbuf[ml] = '\0';
    char *end = NULL;
    e->ms = strtod(msbuf, &end);
    if (end != msbuf + ml || !(e->ms >= 0 && e->ms < 1e9)) return "malformed ms=";
    c = (tune_cursor){f[13].p, f[13].p + f[13].len};
    if (!cur_lit(&c, "gen=") || !cur_hex(&c, 16, &gen) || c.p != c.end) return "malformed gen=";
    if (f[12].len < 6 || memcmp(f[12].p, "flce=", 5)) return "malformed flce=";
    e->key.sm = (int)sm, e->key.hidden = d, e->key.vocab = v, e->key.bucket = nb;
    e->key.opts = (unsigned)opts, e->key.label_bits = (int)lb;
    if (!field_is(&f[12], "flce=", FLCE_VERSION_STRING) || gen != tune_generator_version()) {
        snprintf(why, cap, "stale (measured by flce %.*s, kernels gen=%016llx; this is flce %s, gen=%016llx)",
                 (int)(f[12].len - 5 < 32 ? f[12].len - 5 : 32), f[12].p + 5, (unsigned long long)gen,
                 FLCE_VERSION_STRING, (unsigned long long)tune_generator_version());
        return why;
    }
    if (!tiles_valid(e, why, cap)) return why;
    return NULL;
}

/* ---- a whole table ------------------------------------------------------------------------ */

static flce_status table_push(tune_table *t, const tune_entry *e)
{
    if (t->count == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        tune_entry *grown = realloc(t->entries, cap * sizeof *grown);
        if (!grown) return err_set(FLCE_ERR_OUT_OF_MEMORY, "tune table: %zu entries", cap);
        t->entries = grown, t->cap = cap;
    }
    t->entries[t->count++] = *e;
    return FLCE_OK;
}

static void reject(tune_table *t, const char *origin, int quiet, size_t lineno, const char *why)
{
    t->rejected++;
    log_level level = quiet ? LOG_DEBUG : LOG_WARN;
    if (t->rejected <= TUNE_WARN_LINES)
        log_msg(level, "tune table %s line %zu ignored: %s", origin, lineno, why);
    else if (t->rejected == TUNE_WARN_LINES + 1)
        log_msg(level, "tune table %s: more lines ignored; not warning about each", origin);
}

static int blank_or_comment(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
    return i == n || s[i] == '#';
}

flce_status tune_table_parse(const char *text, size_t len, const char *origin, int quiet,
                             tune_table *t)
{
    char why[512];
    size_t lineno = 0, pos = 0;
    int header = 0;
    if (!t || (!text && len)) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tune_table_parse: NULL");
    if (!origin) origin = "(memory)";
    t->rejected = 0;
    while (pos < len) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        lineno++;
        if (blank_or_comment(line, n)) continue;
        if (!header) {
            if (n == strlen(TUNE_TABLE_HEADER) && !memcmp(line, TUNE_TABLE_HEADER, n)) {
                header = 1;
                continue;
            }
            log_msg(quiet ? LOG_DEBUG : LOG_WARN,
                    "tune table %s ignored: its first line is not \"%s\" (another format version?)",
                    origin, TUNE_TABLE_HEADER);
            t->rejected++;
            return FLCE_OK;
        }
        if (!nl) { /* a writer always ends lines: this one was cut short */
            reject(t, origin, quiet, lineno, "no newline at the end (torn write)");
            break;
        }
        tune_entry e;
        const char *bad = parse_line(line, n, &e, why, sizeof why);
        if (bad) reject(t, origin, quiet, lineno, bad);
        else TRY(table_push(t, &e));
    }
    return FLCE_OK;
}

flce_status tune_table_load(const char *path, int quiet, tune_table *t)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)
            log_msg(quiet ? LOG_DEBUG : LOG_WARN, "tune table %s unreadable (%s); default tiles", path,
                    strerror(errno));
        return FLCE_OK;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t)TUNE_FILE_MAX) {
        log_msg(quiet ? LOG_DEBUG : LOG_WARN, "tune table %s ignored: not a regular file of at most %u bytes",
                path, TUNE_FILE_MAX);
        close(fd);
        return FLCE_OK;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "reading %s: %zu bytes", path, size);
    }
    /* Tables are replaced by rename, never rewritten in place: this inode holds one version. */
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    flce_status st2 = tune_table_parse(buf, got, path, quiet, t);
    free(buf);
    return st2;
}

const tune_entry *tune_table_find(const tune_table *t, const tune_key *k)
{
    for (size_t i = t ? t->count : 0; i-- > 0;) /* from the end: the last valid line wins */
        if (tune_key_equal(&t->entries[i].key, k)) return &t->entries[i];
    return NULL;
}

void tune_table_free(tune_table *t)
{
    if (!t) return;
    free(t->entries);
    memset(t, 0, sizeof *t);
}

flce_status tune_table_path(char *out, size_t cap)
{
    char dir[CACHE_PATH_MAX];
    TRY(cache_dir(dir, sizeof dir));
    int n = snprintf(out, cap, "%s/%s", dir, TUNE_TABLE_FILE);
    if (n < 0 || (size_t)n >= cap)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tune table path %s/%s: longer than %zu bytes", dir,
                       TUNE_TABLE_FILE, cap);
    return FLCE_OK;
}

/* ---- writing ------------------------------------------------------------------------------- */

static flce_status io_error(const char *what, const char *path)
{
    return err_set(FLCE_ERR_IO, "tune table: %s %s: %s", what, path, strerror(errno));
}

/* Writes header, the old entries not of e's class (last of each class only), then e. */
static int write_table(int fd, const tune_table *old, const tune_entry *e)
{
    char line[TUNE_LINE_MAX + 2];
    char head[256];
    snprintf(head, sizeof head,
             "%s\n# written by flce %s (flce tune); format: runtime/tune_table.h. Edited lines fail "
             "their checksum.\n", TUNE_TABLE_HEADER, FLCE_VERSION_STRING);
    if (atomic_file_write_all(fd, head, strlen(head)) != 0) return -1;
    for (size_t i = 0; i < old->count; i++) {
        const tune_entry *o = &old->entries[i];
        if (tune_key_equal(&o->key, &e->key) || tune_table_find(old, &o->key) != o) continue;
        if (tune_line_format(o, line, sizeof line - 1) != FLCE_OK) continue;
        strcat(line, "\n");
        if (atomic_file_write_all(fd, line, strlen(line)) != 0) return -1;
    }
    if (tune_line_format(e, line, sizeof line - 1) != FLCE_OK) return -1;
    strcat(line, "\n");
    return atomic_file_write_all(fd, line, strlen(line));
}

typedef struct tune_table_data {
    const tune_table *old;
    const tune_entry *e;
} tune_table_data;

/* atomic_file_writer.fill */
static int fill_table(int fd, void *arg)
{
    const tune_table_data *d = arg;
    return write_table(fd, d->old, d->e);
}

static flce_status store_locked(const char *dir, const char *path, const tune_entry *e)
{
    char tmp[CACHE_PATH_MAX];
    tune_table old = {0};
    TRY(tune_table_load(path, 1, &old));
    tune_table_data data = {&old, e};
    atomic_file_writer w = {fill_table, NULL, &data};
    atomic_file_stage stage = atomic_file_write(path, &w, tmp, sizeof tmp);
    int err = errno;
    tune_table_free(&old);
    errno = err;
    if (stage == ATOMIC_FILE_CREATE && !tmp[0])
        return err_set(FLCE_ERR_IO, "tune table: directory path %s too long", dir);
    if (stage == ATOMIC_FILE_CREATE) return io_error("creating", tmp);
    if (stage == ATOMIC_FILE_WRITE) return io_error("writing", tmp);
    if (stage == ATOMIC_FILE_RENAME) return io_error("renaming into place", tmp);
    return FLCE_OK;
}

flce_status tune_table_store(const char *dir, const tune_entry *e)
{
    char path[CACHE_PATH_MAX], lock[CACHE_PATH_MAX], line[TUNE_LINE_MAX + 2];
    if (!dir || !e) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tune_table_store: dir=%p e=%p", (const void *)dir, (const void *)e);
    TRY(tune_line_format(e, line, sizeof line));
    if (snprintf(path, sizeof path, "%s/%s", dir, TUNE_TABLE_FILE) >= (int)sizeof path ||
        snprintf(lock, sizeof lock, "%s/tune-table.lock", dir) >= (int)sizeof lock)
        return err_set(FLCE_ERR_IO, "tune table: directory path %s too long", dir);
    if (cache_make_dirs(dir) != 0) return io_error("creating directory", dir);
    /* The lock serializes read-merge-write so that two tuners of different classes both land; the
     * rename alone would only keep readers from seeing a partial file. */
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0) return io_error("opening lock", lock);
    while (flock(lfd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        flce_status st = io_error("locking", lock);
        close(lfd);
        return st;
    }
    flce_status st = store_locked(dir, path, e);
    close(lfd); /* releases the lock */
    if (st == FLCE_OK) log_msg(LOG_INFO, "tune table %s: stored %s", path, line);
    return st;
}
