/*
 * config.h — the library's settings from the environment, in one place: every variable is one row
 * of config_table.h (README "Environment variables" is generated from it). config_get() reads the
 * process settings once per process, with one on/off convention (1/0, on/off, true/false, yes/no,
 * any case; anything else: a warning under FLCE_LOG=warn and the default) and range-checked numbers,
 * and logs the effective settings once under FLCE_LOG=info. Planning and the generator take these
 * values as data (plan_build, spec_tile_pick), so they never read the environment themselves.
 *
 * The rows read at each use instead (FLCE_LOG, FLCE_CACHE_*, FLCE_FAULT: tests flip them between
 * cases) and the library paths (read when that library is first opened) go through config_env: this
 * file's config.c is the only one in the library that calls getenv. Tests and tools give settings
 * as data (config_set) rather than through setenv. A context's own settings
 * (flce_context_create_ex, flce_options) override some of them per context (context.h).
 * Internal: not part of include/flce.h.
 */
#ifndef FLCE_CONFIG_H
#define FLCE_CONFIG_H

#include <stddef.h>

#include "config_table.h"
#include "spec.h"

typedef enum config_nvrtc_fast {
    CONFIG_NVRTC_FAST_OFF = 0, /* full optimization (the default) */
    CONFIG_NVRTC_FAST_MIN,     /* --Ofast-compile=min */
    CONFIG_NVRTC_FAST_MID,     /* --Ofast-compile=mid (FLCE_NVRTC_FAST=1) */
    CONFIG_NVRTC_FAST_MAX      /* --Ofast-compile=max */
} config_nvrtc_fast;

/* The process settings: one int per BOOL, INT and FAST row of config_table.h (its effect text says
 * what the field does), and the TILE rows in `tiles`. */
#define CONFIG_FIELD(KIND, AUDIENCE, ID, field, ...) CONFIG_FIELD_##KIND(field)
#define CONFIG_FIELD_BOOL(field) int field;
#define CONFIG_FIELD_INT(field) int field;
#define CONFIG_FIELD_FAST(field) config_nvrtc_fast field; /* an int-sized enum (config.c stores through int *) */
#define CONFIG_FIELD_TILE(field)            /* in flce_config.tiles */
#define CONFIG_FIELD_LEVEL(field)
#define CONFIG_FIELD_TEXT(field)
#define CONFIG_FIELD_NUM(field)
#define CONFIG_FIELD_EBOOL(field)
#define CONFIG_FIELD_LIB(field)
#define CONFIG_FIELD_SYS(field)
#define CONFIG_FIELD_SWITCHES(field) /* FLCE_DEV: its switches are the DEV rows' fields */
typedef struct flce_config {
    spec_knobs tiles; /* FLCE_DEV tma (default on), FLCE_ENABLE_SM100 (default off) */
    CONFIG_SETTINGS(CONFIG_FIELD)
} flce_config;

/* Every row's id, in table order: config_env(CONFIG_CACHE_DIR). */
#define CONFIG_ENUM(KIND, AUDIENCE, ID, ...) CONFIG_##ID,
typedef enum config_id { CONFIG_SETTINGS(CONFIG_ENUM) CONFIG_COUNT } config_id;

typedef enum config_kind {
    CONFIG_KIND_BOOL, CONFIG_KIND_INT, CONFIG_KIND_TILE, CONFIG_KIND_FAST, /* once per process */
    CONFIG_KIND_LEVEL, CONFIG_KIND_TEXT, CONFIG_KIND_NUM, CONFIG_KIND_EBOOL, /* at each use */
    CONFIG_KIND_LIB,  /* once, when that library is first opened */
    CONFIG_KIND_SYS,  /* a system variable */
    CONFIG_KIND_SWITCHES /* FLCE_DEV: the DEV rows' keys and values, once per process */
} config_kind;

typedef enum config_audience {
    CONFIG_AUDIENCE_USER, CONFIG_AUDIENCE_DEV, CONFIG_AUDIENCE_TEST, CONFIG_AUDIENCE_SYSTEM
} config_audience;

/* One row of config_table.h. */
typedef struct config_setting {
    config_kind kind;
    config_audience audience;
    const char *name;         /* the variable; a developer switch's key in FLCE_DEV */
    const char *values;       /* NULL: derived (config_setting_values) */
    const char *default_text; /* NULL: derived (config_setting_default) */
    const char *effect;       /* Markdown */
    int lo, hi, def;
    size_t offset;            /* of its int in flce_config (BOOL, INT, TILE, FAST); else CONFIG_NO_FIELD */
} config_setting;
#define CONFIG_NO_FIELD ((size_t)-1)

/* The table, CONFIG_COUNT rows in config_id order. */
const config_setting *config_settings(void);
/* 1 for a developer switch: a DEV row with a field, set as `key=value` in FLCE_DEV. */
int config_is_dev_switch(const config_setting *s);
/* A developer switch's variable before FLCE_DEV ("tma": "FLCE_TMA"), still read for one release
 * with a warning naming its FLCE_DEV spelling. */
void config_dev_legacy_name(const config_setting *s, char *out, size_t cap);
/* The README's Values and Default words of a row (the table's, or derived from kind, range and
 * default). */
void config_setting_values(const config_setting *s, char *out, size_t cap);
void config_setting_default(const config_setting *s, char *out, size_t cap);

/* The process's settings, read from the environment on the first call (thread-safe). Never NULL;
 * the struct lives until exit and must not be written. */
const flce_config *config_get(void);

/* Every setting at its default, as with an empty environment. */
void config_defaults(flce_config *c);

/* Fills c from the environment now (warnings for values that do not parse, for keys of FLCE_DEV
 * that are no switch and for a switch's retired variable, FLCE_TMA=0, which still counts unless
 * FLCE_DEV sets that switch). */
void config_from_env(flce_config *c);

/* Re-reads the environment (and the values given by config_set) into the process's settings: for
 * the tests of the environment's parser (test_config), which setenv. Not safe while another thread
 * plans or compiles. */
void config_reload(void);
/* The same, from data instead of the environment: the process's settings become *c (the bench
 * tool's side-by-side rows, without setenv). Not safe while another thread plans or compiles. */
void config_replace(const flce_config *c);

/* Settings as data, for tests and tools that choose a setting without touching the environment:
 * row id reads `value` from now on instead of its variable, in the variable's words ("1", "warn",
 * a directory, FLCE_FAULT's "nvrtc:1"; a developer switch's row takes its FLCE_DEV value, over
 * FLCE_DEV's item); value NULL: id reads as unset (its default), whatever the environment holds.
 * config_clear(id): id reads its variable again. The value is copied. A row read at each use
 * (config_env) sees it at its next use, and these two are thread-safe for those rows; a process
 * row's field (config_get) changes at once, which, as config_reload, is not safe while another
 * thread plans or compiles. config_reload and config_from_env keep the given values. */
void config_set(config_id id, const char *value);
void config_clear(config_id id);
/* config_set on the row named name (its variable, a developer switch's FLCE_DEV key: "tma"), for
 * tools built against several versions of this file; -1 when no row has that name. */
int config_set_name(const char *name, const char *value);

/* The value of a row read at each use (LEVEL, TEXT, NUM, EBOOL), of a library path (LIB) or of a
 * system variable (SYS) now; NULL when unset (and for a developer switch, a key of FLCE_DEV: its
 * value is config_get()'s). The library's one reader of its environment. */
const char *config_env(config_id id);
/* An EBOOL row now: its on/off word, or its default (a warning for a value that does not parse). */
int config_env_bool(config_id id);
/* FLCE_LOG now, as a log_level (log.h); base/log.c is handed this reader when the library loads. */
int config_log_level(void);

/* The parsers every knob goes through. value NULL or "" gives def silently; a value that does not
 * parse gives def and a warning that names the variable. */
int config_parse_bool(const char *name, const char *value, int def);
int config_parse_int(const char *name, const char *value, int lo, int hi, int def);

/* One line per setting at FLCE_LOG=info: "config: FLCE_TUNE=off (default)", a developer switch
 * "config: FLCE_DEV tma=off"; the rows read at each use that are set: "config: FLCE_CACHE_DIR=/x
 * (each use)". */
void config_log(const flce_config *c);

#endif
