/* config.c — the settings of config_table.h: the table, their parsers, their log line and the
 * library's one reader of its environment (config.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "log.h"

#define CONFIG_OFFSET_BOOL(field) offsetof(flce_config, field)
#define CONFIG_OFFSET_INT(field) offsetof(flce_config, field)
#define CONFIG_OFFSET_FAST(field) offsetof(flce_config, field)
#define CONFIG_OFFSET_TILE(field) offsetof(flce_config, tiles.field)
#define CONFIG_OFFSET_LEVEL(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_TEXT(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_NUM(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_EBOOL(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_LIB(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_SYS(field) CONFIG_NO_FIELD
#define CONFIG_OFFSET_SWITCHES(field) CONFIG_NO_FIELD
#define CONFIG_ROW(KIND, AUDIENCE, ID, field, name, lo, hi, def, values, default_text, effect) \
    {CONFIG_KIND_##KIND, CONFIG_AUDIENCE_##AUDIENCE, name, values, default_text, effect, lo, hi, def, \
     CONFIG_OFFSET_##KIND(field)},
static const config_setting config_table[] = {CONFIG_SETTINGS(CONFIG_ROW)};
_Static_assert(sizeof config_table / sizeof config_table[0] == CONFIG_COUNT, "one row per config_id");
_Static_assert(sizeof(config_nvrtc_fast) == sizeof(int), "FAST fields are stored as ints");

const config_setting *config_settings(void) { return config_table; }

static int config_is_process(const config_setting *s) { return s->offset != CONFIG_NO_FIELD; }

int config_is_dev_switch(const config_setting *s)
{
    return s->audience == CONFIG_AUDIENCE_DEV && config_is_process(s);
}

void config_dev_legacy_name(const config_setting *s, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "FLCE_%s", s->name);
    for (size_t i = 5; i < n && i < cap; i++)
        if (out[i] >= 'a' && out[i] <= 'z') out[i] = (char)(out[i] - 'a' + 'A');
}

static int *config_field(flce_config *c, const config_setting *s) { return (int *)((char *)c + s->offset); }
static int config_value(const flce_config *c, const config_setting *s) { return *(const int *)((const char *)c + s->offset); }

static const char *const config_fast_words[] = {"off", "min", "mid", "max"};

void config_setting_values(const config_setting *s, char *out, size_t cap)
{
    if (s->values) snprintf(out, cap, "%s", s->values);
    else if (s->kind == CONFIG_KIND_BOOL || s->kind == CONFIG_KIND_TILE || s->kind == CONFIG_KIND_EBOOL)
        snprintf(out, cap, "on/off");
    else if (s->kind == CONFIG_KIND_INT) snprintf(out, cap, "%d..%d", s->lo, s->hi);
    else snprintf(out, cap, "%s", "");
}

void config_setting_default(const config_setting *s, char *out, size_t cap)
{
    if (s->default_text) snprintf(out, cap, "%s", s->default_text);
    else if (s->kind == CONFIG_KIND_BOOL || s->kind == CONFIG_KIND_TILE || s->kind == CONFIG_KIND_EBOOL)
        snprintf(out, cap, "%s", s->def ? "on" : "off");
    else if (s->kind == CONFIG_KIND_INT || s->kind == CONFIG_KIND_NUM) snprintf(out, cap, "%d", s->def);
    else if (s->kind == CONFIG_KIND_FAST) snprintf(out, cap, "%s", config_fast_words[s->def]);
    else snprintf(out, cap, "%s", "");
}

/* ---- settings given as data (config_set) ----
 * A row given a value by config_set reads that value instead of its variable; one given NULL reads
 * as unset. Each given value is a copy that is never freed: config_env hands out the pointer, which
 * a thread may still hold when another config_set replaces the value (as a getenv pointer across a
 * setenv), so the copies stay on a list reachable from here (no leak report either). */
enum { CONFIG_FROM_ENV = 0, CONFIG_GIVEN, CONFIG_GIVEN_UNSET };
typedef struct config_copy {
    struct config_copy *next;
    char text[];
} config_copy;
static pthread_mutex_t config_given_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char config_given_how[CONFIG_COUNT];
static const char *config_given_text[CONFIG_COUNT];
static config_copy *config_copies;

/* Row id's source: CONFIG_FROM_ENV, or CONFIG_GIVEN with *text its value, or CONFIG_GIVEN_UNSET. */
static int config_given(config_id id, const char **text)
{
    pthread_mutex_lock(&config_given_lock);
    int how = config_given_how[id];
    *text = config_given_text[id];
    pthread_mutex_unlock(&config_given_lock);
    return how;
}

/* Row id's text now: its given value, else its variable's (NULL: unset). */
static const char *config_lookup(config_id id)
{
    const char *text;
    int how = config_given(id, &text);
    if (how == CONFIG_GIVEN) return text;
    if (how == CONFIG_GIVEN_UNSET) return NULL;
    return getenv(config_table[id].name);
}

const char *config_env(config_id id)
{
    if ((unsigned)id >= CONFIG_COUNT) return NULL;
    if (config_is_dev_switch(&config_table[id])) return NULL; /* a key of FLCE_DEV, not a variable */
    return config_lookup(id);
}

void config_defaults(flce_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < CONFIG_COUNT; i++)
        if (config_is_process(&config_table[i])) *config_field(c, &config_table[i]) = config_table[i].def;
}

/* 1 and *out set when s is one of the on/off words, else 0. */
static int bool_word(const char *s, int *out)
{
    static const char *const on[] = {"1", "on", "true", "yes"}, *const off[] = {"0", "off", "false", "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, on[i])) return *out = 1, 1;
        if (!strcasecmp(s, off[i])) return *out = 0, 1;
    }
    return 0;
}

int config_parse_bool(const char *name, const char *value, int def)
{
    int v;
    if (!value || !*value) return def;
    if (bool_word(value, &v)) return v;
    log_msg(LOG_WARN, "%s=%s: not 1/0, on/off, true/false or yes/no; the default (%s) is used", name, value,
            def ? "on" : "off");
    return def;
}

int config_parse_int(const char *name, const char *value, int lo, int hi, int def)
{
    if (!value || !*value) return def;
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (end != value && !*end && !errno && v >= lo && v <= hi) return (int)v;
    log_msg(LOG_WARN, "%s=%s: not an integer in %d..%d; the default (%d) is used", name, value, lo, hi, def);
    return def;
}

int config_env_bool(config_id id)
{
    const config_setting *s = &config_table[id];
    return config_parse_bool(s->name, config_lookup(id), s->def);
}

int config_log_level(void) { return log_parse_level(config_lookup(CONFIG_LOG)); }

/* base/ reads no environment (log.h): its FLCE_LOG reader, handed over when the library loads. */
__attribute__((constructor)) static void config_install_log_level(void) { log_set_level_source(config_log_level); }

/* FLCE_NVRTC_FAST: an on/off word (on: mid) or one of the levels min, mid, max. */
static int parse_nvrtc_fast(const char *name, const char *value)
{
    int on;
    if (!value || !*value) return CONFIG_NVRTC_FAST_OFF;
    if (bool_word(value, &on)) return on ? CONFIG_NVRTC_FAST_MID : CONFIG_NVRTC_FAST_OFF;
    for (int level = CONFIG_NVRTC_FAST_MIN; level <= CONFIG_NVRTC_FAST_MAX; level++)
        if (!strcasecmp(value, config_fast_words[level])) return level;
    log_msg(LOG_WARN, "%s=%s: not an on/off word, min, mid or max; the default (off) is used", name, value);
    return CONFIG_NVRTC_FAST_OFF;
}

/* One process row's value from its text (NULL or "": the default), named `name` in warnings. */
static void config_set_row(flce_config *c, const config_setting *s, const char *name, const char *v)
{
    switch (s->kind) {
    case CONFIG_KIND_BOOL:
    case CONFIG_KIND_TILE: *config_field(c, s) = config_parse_bool(name, v, s->def); break;
    case CONFIG_KIND_INT: *config_field(c, s) = config_parse_int(name, v, s->lo, s->hi, s->def); break;
    case CONFIG_KIND_FAST: *config_field(c, s) = parse_nvrtc_fast(name, v); break;
    default: break; /* read at each use (config_env) */
    }
}

/* A developer switch's retired variable (FLCE_TMA=0): still honoured for this release, so that a
 * script or a command copied from bench/NOTES.md measures what it says; but never in silence, since
 * the next release drops it. FLCE_DEV, read after, wins where both set a switch. */
static void config_dev_legacy(flce_config *c, const config_setting *s)
{
    char legacy[64];
    config_dev_legacy_name(s, legacy, sizeof legacy);
    const char *v = getenv(legacy);
    if (!v || !*v) return;
    log_msg(LOG_WARN, "%s=%s: a retired variable, read for this release only: write FLCE_DEV=%s=%s", legacy, v,
            s->name, v);
    config_set_row(c, s, legacy, v);
}

/* The developer switch whose key is the n bytes at key, or NULL. */
static const config_setting *config_dev_switch(const char *key, size_t n)
{
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &config_table[i];
        if (config_is_dev_switch(s) && strlen(s->name) == n && !strncmp(s->name, key, n)) return s;
    }
    return NULL;
}

/* One item of FLCE_DEV, "key=value" with surrounding blanks trimmed. Strict like the other
 * settings: a key that is no switch or a value that does not parse is a warning naming it, and the
 * switch (if any) keeps its default; an empty item (a trailing comma) is nothing. */
static void config_dev_item(flce_config *c, const char *item, size_t n)
{
    while (n && (*item == ' ' || *item == '\t')) item++, n--;
    while (n && (item[n - 1] == ' ' || item[n - 1] == '\t')) n--;
    if (!n) return;
    const char *eq = memchr(item, '=', n);
    if (!eq) {
        log_msg(LOG_WARN, "FLCE_DEV: '%.*s' is not key=value; ignored", (int)n, item);
        return;
    }
    const config_setting *s = config_dev_switch(item, (size_t)(eq - item));
    if (!s) {
        log_msg(LOG_WARN, "FLCE_DEV: '%.*s' is not a developer switch (README \"Developer switches\"); ignored",
                (int)(eq - item), item);
        return;
    }
    char value[64], name[64];
    size_t vn = n - (size_t)(eq + 1 - item);
    snprintf(value, sizeof value, "%.*s", (int)vn, eq + 1);
    snprintf(name, sizeof name, "FLCE_DEV %s", s->name);
    if (!vn || vn >= sizeof value) { /* "tma=": a value forgotten, not the default asked for */
        log_msg(LOG_WARN, "%s=%.*s: not a value; the default is used", name, (int)(vn < 64 ? vn : 64), eq + 1);
        config_set_row(c, s, name, NULL);
        return;
    }
    config_set_row(c, s, name, value);
}

/* FLCE_DEV: comma-separated key=value items, later ones winning. */
static void config_dev_parse(flce_config *c, const char *v)
{
    if (!v) return;
    for (const char *p = v;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        config_dev_item(c, p, n);
        if (!comma) break;
        p = comma + 1;
    }
}

/* The values derived from the ones read (whichever way they were given). */
static void config_normalize(flce_config *c)
{
    /* a 1-CTA cluster is no cluster: 0 and 1 both leave it off; -1 (unset): plan.c's rule */
    c->cluster = c->cluster == 2 ? 2 : c->cluster < 0 ? -1 : 0;
    /* a multiple of 256 keeps each slice's dZ 16-byte aligned for TMA (launch_grads.c run_dh) */
    c->dh_k_slice = c->dh_k_slice / 256 * 256;
    c->dh_bn = c->dh_bn / 64 * 64;
}

/* A developer switch given by config_set: its value wins over FLCE_DEV's item and its retired
 * variable; given NULL, its default. */
static void config_dev_given(flce_config *c, config_id id)
{
    const config_setting *s = &config_table[id];
    const char *text;
    char name[64];
    int how = config_given(id, &text);
    if (how == CONFIG_FROM_ENV) return;
    snprintf(name, sizeof name, "FLCE_DEV %s", s->name);
    config_set_row(c, s, name, how == CONFIG_GIVEN ? text : NULL);
}

void config_from_env(flce_config *c)
{
    config_defaults(c);
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &config_table[i];
        if (config_is_dev_switch(s)) config_dev_legacy(c, s);
        else if (config_is_process(s)) config_set_row(c, s, s->name, config_lookup((config_id)i));
    }
    config_dev_parse(c, config_lookup(CONFIG_DEV));
    for (int i = 0; i < CONFIG_COUNT; i++)
        if (config_is_dev_switch(&config_table[i])) config_dev_given(c, (config_id)i);
    config_normalize(c);
}

void config_log(const flce_config *c)
{
    flce_config d;
    config_defaults(&d);
    if (!log_enabled(LOG_INFO)) return;
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &config_table[i];
        if (!config_is_process(s)) { /* FLCE_DEV: its switches' lines below say what it set */
            int quiet = s->kind == CONFIG_KIND_SYS || s->kind == CONFIG_KIND_SWITCHES;
            const char *v = quiet ? NULL : config_lookup((config_id)i);
            if (v && *v) log_msg(LOG_INFO, "config: %s=%s (each use)", s->name, v);
            continue;
        }
        int v = config_value(c, s), is_default = v == config_value(&d, s);
        const char *tail = is_default ? " (default)" : "", *dev = config_is_dev_switch(s) ? "FLCE_DEV " : "";
        if (s->kind == CONFIG_KIND_INT) log_msg(LOG_INFO, "config: %s%s=%d%s", dev, s->name, v, tail);
        else if (s->kind == CONFIG_KIND_FAST) log_msg(LOG_INFO, "config: %s=%s%s", s->name, config_fast_words[v & 3], tail);
        else log_msg(LOG_INFO, "config: %s%s=%s%s", dev, s->name, v ? "on" : "off", tail);
    }
}

static flce_config config_current;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void config_init(void)
{
    config_from_env(&config_current);
    config_log(&config_current);
}

const flce_config *config_get(void)
{
    pthread_once(&config_once, config_init);
    return &config_current;
}

void config_reload(void)
{
    pthread_once(&config_once, config_init);
    config_from_env(&config_current);
}

void config_replace(const flce_config *c)
{
    pthread_once(&config_once, config_init);
    config_current = *c;
}

/* Records row id's source (how, with text copied when given) under the lock. */
static void config_record(config_id id, int how, const char *text)
{
    config_copy *copy = NULL;
    if (text) {
        size_t n = strlen(text) + 1;
        copy = malloc(sizeof *copy + n);
        if (!copy) abort(); /* a test's or a tool's few short values */
        memcpy(copy->text, text, n);
    }
    pthread_mutex_lock(&config_given_lock);
    if (copy) copy->next = config_copies, config_copies = copy;
    config_given_how[id] = (unsigned char)how;
    config_given_text[id] = copy ? copy->text : NULL;
    pthread_mutex_unlock(&config_given_lock);
}

/* A process row (or developer switch) takes a given value at once: only its field changes. FLCE_DEV
 * given, or a switch handed back to the environment: the switches are derived again as at start. */
static void config_apply(config_id id)
{
    const config_setting *s = &config_table[id];
    flce_config c = *config_get();
    const char *text;
    if (id == CONFIG_DEV || (config_is_dev_switch(s) && config_given(id, &text) == CONFIG_FROM_ENV)) {
        flce_config env;
        config_from_env(&env);
        for (int i = 0; i < CONFIG_COUNT; i++)
            if (config_is_dev_switch(&config_table[i]) && (id == CONFIG_DEV || i == (int)id))
                *config_field(&c, &config_table[i]) = config_value(&env, &config_table[i]);
    } else if (config_is_dev_switch(s)) config_dev_given(&c, id);
    else if (config_is_process(s)) config_set_row(&c, s, s->name, config_lookup(id));
    else return; /* read at each use: config_lookup sees it */
    config_normalize(&c);
    config_current = c;
}

void config_set(config_id id, const char *value)
{
    if ((unsigned)id >= CONFIG_COUNT) return;
    config_record(id, value ? CONFIG_GIVEN : CONFIG_GIVEN_UNSET, value);
    config_apply(id);
}

int config_set_name(const char *name, const char *value)
{
    for (int i = 0; i < CONFIG_COUNT; i++)
        if (!strcmp(config_table[i].name, name)) {
            config_set((config_id)i, value);
            return 0;
        }
    return -1;
}

void config_clear(config_id id)
{
    if ((unsigned)id >= CONFIG_COUNT) return;
    config_record(id, CONFIG_FROM_ENV, NULL);
    config_apply(id);
}

spec_tile spec_default_tile(int sm, flce_dtype dtype, spec_role role)
{
    return spec_tile_pick(sm, dtype, role, config_get()->tiles);
}
