/*
 * fuzz_tune_table.c — libFuzzer target over the autotune table reader (runtime/tune_table.c):
 * the input bytes are a table file's text. tune_table_parse reads them in memory; then the bytes
 * become "tune-table.txt" of a private temporary directory, tune_table_load reads that, and
 * tune_table_store merges a fixed entry into it.
 *
 * Invariants (format in tune_table.h):
 *  - parse and load return FLCE_OK (or OUT_OF_MEMORY) and agree on the entries and rejections;
 *  - entries + rejected lines never exceed the input's lines;
 *  - every accepted entry is in range (arch supported, token bucket a power of two, known option
 *    bits, label width 32 or 64), its three tiles pass spec_validate for its class, and formatting
 *    it again gives a line that parses back to the same entry (nothing accepted is lost or bent);
 *  - after tune_table_store the file parses with no rejected line, holds the fixed entry, and one
 *    entry per distinct class that was accepted before (duplicates collapse, last wins).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "fuzz.h"
#include "tune_table.h"

static char fuzz_dir[CACHE_PATH_MAX];

static void remove_fuzz_dir(void)
{
    char path[CACHE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, TUNE_TABLE_FILE);
    unlink(path);
    snprintf(path, sizeof path, "%s/tune-table.lock", fuzz_dir);
    unlink(path);
    rmdir(fuzz_dir);
}

static const char *scratch_dir(void)
{
    if (fuzz_dir[0]) return fuzz_dir;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/flce-fuzz-tune.XXXXXX", tmp);
    FUZZ_REQUIRE(mkdtemp(fuzz_dir) != NULL, "mkdtemp %s: %s", fuzz_dir, strerror(errno));
    atexit(remove_fuzz_dir);
    return fuzz_dir;
}

static void check_entry(const tune_entry *e)
{
    FUZZ_REQUIRE(spec_arch_supported(e->key.sm), "accepted sm %d", e->key.sm);
    FUZZ_REQUIRE(e->key.bucket >= 1 && tune_bucket(e->key.bucket) == e->key.bucket, "bucket %lld",
                 (long long)e->key.bucket);
    FUZZ_REQUIRE(!(e->key.opts & ~(unsigned)TUNE_OPT_ALL), "opts %x", e->key.opts);
    FUZZ_REQUIRE(e->key.label_bits == 32 || e->key.label_bits == 64, "L=%d", e->key.label_bits);
    static const spec_role roles[TUNE_ROLES] = {ROLE_LOGITS, ROLE_DH, ROLE_DW};
    for (int r = 0; r < TUNE_ROLES; r++) {
        kernel_spec s;
        memset(&s, 0, sizeof s);
        s.sm = e->key.sm, s.dtype = e->key.dtype, s.hidden = e->key.hidden, s.vocab_shard = e->key.vocab;
        s.label_bits = e->key.label_bits, s.role = roles[r], s.tile = e->tile[r];
        FUZZ_REQUIRE(spec_validate(&s) == FLCE_OK, "accepted a tile spec_validate refuses: %s",
                     flce_last_error());
    }
    /* format → parse round trip */
    char text[TUNE_LINE_MAX + 64];
    int n = snprintf(text, sizeof text, "%s\n", TUNE_TABLE_HEADER);
    FUZZ_REQUIRE(tune_line_format(e, text + n, sizeof text - (size_t)n - 1) == FLCE_OK, "format: %s",
                 flce_last_error());
    strcat(text, "\n");
    tune_table again = {0};
    FUZZ_REQUIRE(tune_table_parse(text, strlen(text), "roundtrip", 1, &again) == FLCE_OK, "reparse");
    FUZZ_REQUIRE(again.count == 1 && again.rejected == 0, "round trip: %zu entries, %zu rejected",
                 again.count, again.rejected);
    const tune_entry *b = &again.entries[0];
    FUZZ_REQUIRE(tune_key_equal(&b->key, &e->key) && !memcmp(b->tile, e->tile, sizeof e->tile),
                 "round trip changed the entry");
    tune_table_free(&again);
}

static size_t count_lines(const uint8_t *data, size_t size)
{
    size_t n = 0;
    for (size_t i = 0; i < size; i++) n += data[i] == '\n';
    return n + (size && data[size - 1] != '\n');
}

static size_t distinct_classes(const tune_table *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->count; i++) n += tune_table_find(t, &t->entries[i].key) == &t->entries[i];
    return n;
}

static tune_entry fixed_entry(void)
{
    tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key.device, sizeof e.key.device, "fuzz-device");
    e.key.sm = 80, e.key.dtype = FLCE_DTYPE_BF16, e.key.hidden = 4096, e.key.vocab = 32768;
    e.key.bucket = 1024, e.key.label_bits = 32;
    for (int r = 0; r < TUNE_ROLES; r++) e.tile[r] = spec_default_tile(80, FLCE_DTYPE_BF16, ROLE_LOGITS);
    e.ms = 1;
    return e;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tune_table mem = {0}, file = {0}, merged = {0};
    err_clear();
    flce_status st = tune_table_parse((const char *)data, size, "fuzz", 1, &mem);
    if (st == FLCE_ERR_OUT_OF_MEMORY) return 0;
    fuzz_check_status(st, "tune_table_parse");
    FUZZ_REQUIRE(st == FLCE_OK, "parse: %s", flce_last_error());
    FUZZ_REQUIRE(mem.count + mem.rejected <= count_lines(data, size), "%zu entries + %zu rejected > %zu lines",
                 mem.count, mem.rejected, count_lines(data, size));
    for (size_t i = 0; i < mem.count; i++) check_entry(&mem.entries[i]);

    const char *dir = scratch_dir();
    char path[CACHE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, TUNE_TABLE_FILE);
    FILE *f = fopen(path, "wb");
    FUZZ_REQUIRE(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "writing %s", path);
    FUZZ_REQUIRE(tune_table_load(path, 1, &file) == FLCE_OK, "load: %s", flce_last_error());
    FUZZ_REQUIRE(file.count == mem.count && file.rejected == mem.rejected &&
                     (!mem.count || !memcmp(file.entries, mem.entries, mem.count * sizeof *mem.entries)),
                 "load and parse disagree");

    tune_entry e = fixed_entry();
    err_clear();
    FUZZ_REQUIRE(tune_table_store(dir, &e) == FLCE_OK, "store: %s", flce_last_error());
    FUZZ_REQUIRE(tune_table_load(path, 1, &merged) == FLCE_OK, "reload");
    int had_fixed = tune_table_find(&mem, &e.key) != NULL;
    FUZZ_REQUIRE(merged.rejected == 0 && tune_table_find(&merged, &e.key) &&
                     merged.count == distinct_classes(&mem) + !had_fixed,
                 "merge: %zu entries (%zu rejected) from %zu classes", merged.count, merged.rejected,
                 distinct_classes(&mem));
    tune_table_free(&mem);
    tune_table_free(&file);
    tune_table_free(&merged);
    return 0;
}
