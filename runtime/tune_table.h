/*
 * tune_table.h — the autotune table (docs/DESIGN.md §6.5, issue 6): a small versioned text file in the
 * kernel cache directory that maps a problem class to the tiles `flce tune` measured fastest.
 * tune.c reads it for the dispatcher; tools/cmd_tune.c and the FLCE_TUNE=1 path write it;
 * fuzz/fuzz_tune_table.c feeds tune_table_parse garbage.
 *
 * File "<cache dir>/tune-table.txt" (cache_dir: FLCE_CACHE_DIR, XDG_CACHE_HOME/flce, ~/.cache/flce):
 *
 *   flce-tune-table 1
 *   # comment lines start with '#'; blank lines are skipped
 *   <device> sm_<sm> <dtype> D=<d> V=<v> N=<bucket> opts=<hex> L=<32|64> logits=<tile> dh=<tile>
 *       dw=<tile> ms=<float> flce=<version> gen=<16 hex> sum=<16 hex>      (one line, one space)
 *
 *   device   the CUDA device name with every byte outside [A-Za-z0-9._-] written as '_'
 *   N        the token bucket: the largest power of two ≤ the call's token count (tune_bucket)
 *   opts     TUNE_OPT_* bits of the problem (not of the outputs asked for, so that
 *            flce_workspace_size and the call it sizes land in the same class)
 *   tile     <bm>x<bn>x<bk>/s<stages>/w<warps_m>x<warps_n>/<kind>, kind mma (mma.sync, cp.async),
 *            wgmma, wgmma+tma (Hopper) or tcgen05+tma (Blackwell); the other combinations of the
 *            three bits (mma+tma, tcgen05, wgmma+tcgen05[+tma]) parse too and fail spec_validate
 *   ms       the winner's measured time of one loss-and-grad call (information only)
 *   flce     the library version that measured it; gen a hash of the embedded kernel templates:
 *            either differing from this library's makes the line stale (kernels changed)
 *   sum      hash64 of the line's bytes before " sum=" (TUNE_SUM_SEED), lowercase hex: a torn or
 *            hand-edited line fails it
 *
 * Reading is tolerant of anything: a missing file is an empty table; a bad header ignores the file;
 * every rejected line (garbage, too long, bad checksum, stale, a tile that spec_validate refuses)
 * is logged once as a warning (the first TUNE_WARN_LINES per read, then a count) and never used.
 * Duplicate classes: the last valid line wins.
 */
#ifndef FLCE_TUNE_TABLE_H
#define FLCE_TUNE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

#define TUNE_TABLE_FILE "tune-table.txt"
#define TUNE_TABLE_HEADER "flce-tune-table 1"
#define TUNE_LINE_MAX 1024           /* longer lines are rejected (a real one is ~250 bytes) */
#define TUNE_FILE_MAX (16u << 20)    /* a larger file is ignored whole */
#define TUNE_DEVICE_MAX 64
#define TUNE_WARN_LINES 16

enum {
    TUNE_OPT_BIAS = 1u << 0,
    TUNE_OPT_WEIGHTS = 1u << 1,
    TUNE_OPT_SMOOTHING = 1u << 2,
    TUNE_OPT_SOFTCAP = 1u << 3,
    TUNE_OPT_TEMPERATURE = 1u << 4,
    TUNE_OPT_ZLOSS = 1u << 5,
    TUNE_OPT_ALL = (1u << 6) - 1
};

/* The roles a table line holds tiles for, in line order. */
enum { TUNE_ROLES = 3 };

typedef struct tune_key {
    char device[TUNE_DEVICE_MAX];
    int sm;
    flce_dtype dtype;
    int64_t hidden, vocab, bucket;
    unsigned opts;
    int label_bits;
} tune_key;

typedef struct tune_entry {
    tune_key key;
    spec_tile tile[TUNE_ROLES]; /* ROLE_LOGITS, ROLE_DH, ROLE_DW */
    double ms;
} tune_entry;

typedef struct tune_table {
    tune_entry *entries; /* malloc'd; tune_table_free releases */
    size_t count, cap;
    size_t rejected;     /* lines ignored by the last parse */
} tune_table;

/* Largest power of two ≤ tokens (1 for tokens < 1). */
int64_t tune_bucket(int64_t tokens);
/* Copies a device name in table form (see above); "unknown" for NULL or "". */
void tune_device_token(const char *name, char out[TUNE_DEVICE_MAX]);
/* The class of a problem on a device (tokens = the call's N, all ranks' under SP). */
void tune_key_make(const flce_problem *p, int64_t tokens, const char *device, int sm, tune_key *k);
int tune_key_equal(const tune_key *a, const tune_key *b);

/* Hash of the embedded templates: lines written by other kernels are stale. */
uint64_t tune_generator_version(void);

/* "<bm>x<bn>x<bk>/s<stages>/w<wm>x<wn>/<kind>" into out (cap ≥ 64). */
void tune_tile_text(const spec_tile *t, char *out, size_t cap);
/* Parses a tile token; 0 on success, -1 when malformed. */
int tune_tile_parse(const char *s, size_t len, spec_tile *t);

/* One line of the table for e, without the newline, checksum included. FLCE_ERR_INVALID_ARGUMENT
 * when it does not fit in cap. */
flce_status tune_line_format(const tune_entry *e, char *out, size_t cap);

/* Parses a whole table text (need not be NUL-terminated). `origin` names it in warnings; `quiet`
 * logs rejections at debug level instead of warn (the writer's merge re-reads quietly). Appends
 * valid lines to *t (initialize with {0}); FLCE_OK or FLCE_ERR_OUT_OF_MEMORY. */
flce_status tune_table_parse(const char *text, size_t len, const char *origin, int quiet,
                             tune_table *t);
/* Reads `path`; a missing file is an empty table. */
flce_status tune_table_load(const char *path, int quiet, tune_table *t);
/* The last valid entry of class k, or NULL. */
const tune_entry *tune_table_find(const tune_table *t, const tune_key *k);
void tune_table_free(tune_table *t);

/* "<dir>/tune-table.txt" of the kernel cache directory. */
flce_status tune_table_path(char *out, size_t cap);
/* Merges e into the table of `dir` (replacing its class) under an exclusive flock on
 * "<dir>/tune-table.lock", writing a temp file renamed into place (base/atomic_file.h): readers
 * never see a partial table and concurrent writers lose no class. Stale and invalid lines are
 * dropped on the way.
 * FLCE_ERR_IO with the path and errno's words when the directory cannot be written. */
flce_status tune_table_store(const char *dir, const tune_entry *e);

#endif
