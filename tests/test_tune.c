/* test_tune.c — the autotune table (runtime/tune_table.c) and the dispatcher's use of it
 * (runtime/tune.c, plan_make_on): round trip, every kind of bad line ignored with a warning,
 * a valid line changing the plan's tiles, the env switches winning over it, concurrent writers,
 * and the candidate lists, the same for both fronts of the tuner (runtime/tune_run.h). No GPU. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "config.h"
#include "dev_switch.h"
#include "error.h"
#include "hash.h"
#include "tmpdir.h"
#include "tune_run.h"

#define DEVICE "NVIDIA H100 80GB HBM3"

static tune_entry sample_entry(int sm)
{
    tune_entry e;
    memset(&e, 0, sizeof e);
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 5000, p.hidden = 4096, p.vocab_shard = 32768;
    tune_key_make(&p, p.tokens, DEVICE, sm, &e.key);
    if (sm == 90) {
        e.tile[0] = (spec_tile){128, 128, 64, 5, 8, 1, MAINLOOP_WGMMA_TMA};
        e.tile[1] = (spec_tile){128, 128, 64, 3, 8, 1, MAINLOOP_WGMMA_CP_ASYNC};
        e.tile[2] = (spec_tile){128, 256, 64, 3, 8, 1, MAINLOOP_WGMMA_TMA};
    } else {
        e.tile[0] = (spec_tile){64, 128, 32, 3, 2, 2, MAINLOOP_MMA_SYNC};
        e.tile[1] = (spec_tile){128, 64, 64, 3, 2, 2, MAINLOOP_MMA_SYNC};
        e.tile[2] = (spec_tile){128, 128, 32, 4, 4, 2, MAINLOOP_MMA_SYNC};
    }
    e.ms = 12.5;
    return e;
}

/* What fn printed under FLCE_LOG=level (tests/capture.h). */
static const char *captured_at(const char *level, void (*fn)(void *), void *arg)
{
    return capture_stderr(level, fn, arg);
}

static const char *captured(void (*fn)(void *), void *arg) { return captured_at("warn", fn, arg); }

typedef struct parse_job {
    const char *text;
    tune_table t;
} parse_job;

static void parse_it(void *arg)
{
    parse_job *j = arg;
    memset(&j->t, 0, sizeof j->t);
    CHECK(tune_table_parse(j->text, strlen(j->text), "test", 0, &j->t) == FLCE_OK);
}

static char *table_text(const char *const *lines, int n)
{
    static char buf[1 << 16];
    snprintf(buf, sizeof buf, "%s\n", TUNE_TABLE_HEADER);
    for (int i = 0; i < n; i++) {
        strcat(buf, lines[i]);
        strcat(buf, "\n");
    }
    return buf;
}

static void round_trip_keeps_every_field(void)
{
    char dir[TEST_PATH_MAX], path[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tune");
    tune_entry a = sample_entry(90), b = sample_entry(80);
    CHECK(tune_table_store(dir, &a) == FLCE_OK);
    CHECK(tune_table_store(dir, &b) == FLCE_OK);
    join(path, dir, TUNE_TABLE_FILE);
    tune_table t = {0};
    CHECK(tune_table_load(path, 0, &t) == FLCE_OK);
    CHECKF(t.count == 2 && t.rejected == 0, "count %zu rejected %zu", t.count, t.rejected);
    const tune_entry *got = tune_table_find(&t, &a.key);
    CHECK(got && !memcmp(got->tile, a.tile, sizeof a.tile) && got->ms == a.ms);
    CHECK(got && !strcmp(got->key.device, "NVIDIA_H100_80GB_HBM3") && got->key.bucket == 4096);
    got = tune_table_find(&t, &b.key);
    CHECK(got && !memcmp(got->tile, b.tile, sizeof b.tile));
    tune_table_free(&t);
    remove_tree(dir);
}

/* issue 15: a Blackwell tile (tcgen05.mma fed by TMA) is stored as such and reads back as such,
 * not as the mma.sync tile of the same shape (which sm_100 validation accepts too); and every
 * main loop reads back as written, so that validation, not the text, decides what is used. */
static void blackwell_tile_round_trips_as_tcgen05(void)
{
    char dir[TEST_PATH_MAX], path[TEST_PATH_MAX], text[64];
    spec_tile bw = spec_tile_pick(100, FLCE_DTYPE_BF16, ROLE_LOGITS, (spec_knobs){1, 1}); /* FLCE_ENABLE_SM100=1 */
    CHECK(bw.loop == MAINLOOP_TCGEN05);
    tune_tile_text(&bw, text, sizeof text);
    CHECKF(strstr(text, "/tcgen05+tma") != NULL, "%s", text);
    /* The mma.sync tile of the same shape is a different tile, valid on sm_100 too. */
    spec_tile same_shape = bw;
    same_shape.loop = MAINLOOP_MMA_SYNC;
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = 100, s.dtype = FLCE_DTYPE_BF16, s.role = ROLE_LOGITS, s.hidden = 4096, s.vocab_shard = 32768;
    s.label_bits = 32, s.tile = same_shape;
    CHECK(spec_validate(&s) == FLCE_OK);
    err_clear();

    make_tmpdir_named(dir, "flce-tune");
    tune_entry e = sample_entry(100);
    for (int r = 0; r < TUNE_ROLES; r++) e.tile[r] = spec_default_tile(100, FLCE_DTYPE_BF16, (spec_role)r);
    e.tile[0] = bw;
    e.tile[2] = bw;
    CHECK(tune_table_store(dir, &e) == FLCE_OK);
    join(path, dir, TUNE_TABLE_FILE);
    tune_table t = {0};
    CHECK(tune_table_load(path, 0, &t) == FLCE_OK);
    const tune_entry *got = tune_table_find(&t, &e.key);
    CHECKF(got && t.rejected == 0, "found %d rejected %zu", got != NULL, t.rejected);
    CHECK(got && got->tile[0].loop == MAINLOOP_TCGEN05);
    CHECK(got && !memcmp(got->tile, e.tile, sizeof e.tile));
    tune_table_free(&t);
    remove_tree(dir);

    /* Every main loop parses back to the loop it was written from, under the token tables have
     * always held for it (the text of the tiles the tuner stored when the loop was three switches). */
    static const char *const kinds[SPEC_MAINLOOPS] = {"/mma", "/wgmma", "/wgmma+tma", "/tcgen05+tma"};
    for (int k = 0; k < SPEC_MAINLOOPS; k++) {
        spec_tile a = {128, 256, 64, 4, 8, 1, (spec_mainloop)k}, b;
        tune_tile_text(&a, text, sizeof text);
        CHECKF(strlen(text) > strlen(kinds[k]) && !strcmp(text + strlen(text) - strlen(kinds[k]), kinds[k]),
               "kind %d: %s", k, text);
        CHECKF(tune_tile_parse(text, strlen(text), &b) == 0 && !memcmp(&a, &b, sizeof a), "kind %d: %s", k, text);
    }
    /* The kinds of switch combinations that name no loop do not parse (nor does anything else). */
    static const char *bad[] = {"128x256x64/s4/w8x1/tcgen05+", "128x256x64/s4/w8x1/tma+tcgen05",
                                "128x256x64/s4/w8x1/tcgen05+tma+tma", "128x256x64/s4/w8x1/",
                                "128x256x64/s4/w8x1/mma+tma", "128x256x64/s4/w8x1/tcgen05",
                                "128x256x64/s4/w8x1/wgmma+tcgen05", "128x256x64/s4/w8x1/wgmma+tcgen05+tma"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        spec_tile b;
        CHECKF(tune_tile_parse(bad[i], strlen(bad[i]), &b) == -1, "%s parsed", bad[i]);
    }
}

/* A table line whose tile kind does not fit its arch (tcgen05 on sm_90, wgmma on sm_100, wgmma on
 * sm_80) is rejected with validation's words, never used. */
static void tile_kind_not_of_the_arch_is_rejected(void)
{
    spec_tile bw = spec_tile_pick(100, FLCE_DTYPE_BF16, ROLE_DH, (spec_knobs){1, 1}); /* FLCE_ENABLE_SM100=1 */
    tune_entry on90 = sample_entry(90), on100 = sample_entry(100), on80 = sample_entry(80);
    on90.tile[1] = bw;
    for (int r = 0; r < TUNE_ROLES; r++) on100.tile[r] = bw;
    on100.tile[2] = sample_entry(90).tile[2]; /* a wgmma tile */
    on80.tile[0].loop = MAINLOOP_WGMMA_CP_ASYNC;
    char l1[TUNE_LINE_MAX + 2], l2[TUNE_LINE_MAX + 2], l3[TUNE_LINE_MAX + 2];
    CHECK(tune_line_format(&on90, l1, sizeof l1) == FLCE_OK);
    CHECK(tune_line_format(&on100, l2, sizeof l2) == FLCE_OK);
    CHECK(tune_line_format(&on80, l3, sizeof l3) == FLCE_OK);
    const char *lines[] = {l1, l2, l3};
    parse_job j = {table_text(lines, 3)};
    const char *err = captured(parse_it, &j);
    CHECKF(j.t.count == 0 && j.t.rejected == 3, "count %zu rejected %zu\n%s", j.t.count, j.t.rejected, err);
    CHECKF(strstr(err, "line 2 ignored: dh tile rejected by spec validation: tile.loop=tcgen05+tma: needs sm_100a"),
           "%s", err);
    CHECKF(strstr(err, "line 3 ignored: dw tile rejected by spec validation: tile.loop=wgmma+tma: needs sm_90a"), "%s",
           err);
    CHECKF(strstr(err, "line 4 ignored: logits tile rejected by spec validation: tile.loop=wgmma: needs sm_90a, not sm_80"),
           "%s", err);
    tune_table_free(&j.t);
}

static void storing_a_class_again_replaces_its_line(void)
{
    char dir[TEST_PATH_MAX], path[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tune");
    tune_entry a = sample_entry(90);
    CHECK(tune_table_store(dir, &a) == FLCE_OK);
    a.tile[0].stages = 3, a.ms = 9;
    CHECK(tune_table_store(dir, &a) == FLCE_OK);
    join(path, dir, TUNE_TABLE_FILE);
    tune_table t = {0};
    CHECK(tune_table_load(path, 0, &t) == FLCE_OK);
    CHECK(t.count == 1 && t.entries[0].tile[0].stages == 3 && t.entries[0].ms == 9);
    tune_table_free(&t);
    remove_tree(dir);
}

static void duplicate_classes_last_valid_line_wins(void)
{
    char l1[TUNE_LINE_MAX + 2], l2[TUNE_LINE_MAX + 2], l3[TUNE_LINE_MAX + 2];
    tune_entry a = sample_entry(90);
    tune_line_format(&a, l1, sizeof l1);
    a.tile[0].bn = 256, a.tile[0].stages = 4;
    tune_line_format(&a, l2, sizeof l2);
    a.tile[0].bn = 192;
    tune_line_format(&a, l3, sizeof l3);
    /* The last line is corrupt (the second wins): its checksum's last hex digit changed to another
     * hex digit. Flipping a bit instead made 'a' and 'f' non-hex, a malformed line rather than a
     * checksum mismatch, whenever the generator's hash happened to end the sum with one. */
    char *last = &l3[strlen(l3) - 1];
    *last = *last == '0' ? '1' : '0';
    const char *lines[] = {l1, l2, l3};
    parse_job j = {table_text(lines, 3)};
    const char *err = captured(parse_it, &j);
    const tune_entry *got = tune_table_find(&j.t, &a.key);
    CHECK(got && got->tile[0].bn == 256);
    CHECKF(j.t.rejected == 1 && strstr(err, "line 4 ignored: checksum mismatch"), "stderr: %s", err);
    tune_table_free(&j.t);
}

/* Each bad line: rejected, exactly one warning naming its line, never in the table. */
static void bad_lines_are_ignored_with_one_warning_each(void)
{
    tune_entry a = sample_entry(90);
    char good[TUNE_LINE_MAX + 2], edited[TUNE_LINE_MAX + 2], stale_v[TUNE_LINE_MAX + 2];
    char stale_gen[TUNE_LINE_MAX + 2], bad_tile[TUNE_LINE_MAX + 2], huge[4 * TUNE_LINE_MAX];
    tune_line_format(&a, good, sizeof good);
    strcpy(edited, good);
    *strstr(edited, "s5/") = 's', strstr(edited, "s5/")[1] = '4'; /* stages 5 → 4, sum unchanged */
    /* A line an older flce wrote: rebuild with another version and a matching checksum. */
    strcpy(stale_v, good);
    char *v = strstr(stale_v, "flce=");
    memcpy(v + 5, "0.0.9", 5);
    *strstr(stale_v, " sum=") = '\0';
    snprintf(stale_v + strlen(stale_v), 40, " sum=%016llx",
             (unsigned long long)hash64(stale_v, strlen(stale_v), 0x7a11e5ab1e0f1ce5ull));
    strcpy(stale_gen, good);
    char *g = strstr(stale_gen, "gen=") + 4;
    g[0] = g[0] == '0' ? '1' : '0';
    *strstr(stale_gen, " sum=") = '\0';
    snprintf(stale_gen + strlen(stale_gen), 40, " sum=%016llx",
             (unsigned long long)hash64(stale_gen, strlen(stale_gen), 0x7a11e5ab1e0f1ce5ull));
    tune_entry w = sample_entry(80);
    w.tile[1] = (spec_tile){128, 256, 64, 4, 8, 1, MAINLOOP_WGMMA_TMA}; /* wgmma on sm_80: validation refuses */
    tune_line_format(&w, bad_tile, sizeof bad_tile);
    memset(huge, 'x', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    const char *lines[] = {edited, stale_v, stale_gen, bad_tile, huge, "garbage", "", "# comment",
                           "a b c d e f g h i j k l m n o", good};
    parse_job j = {table_text(lines, 10)};
    const char *err = captured(parse_it, &j);
    CHECKF(j.t.count == 1 && j.t.rejected == 7, "count %zu rejected %zu", j.t.count, j.t.rejected);
    CHECK(tune_table_find(&j.t, &a.key) && tune_table_find(&j.t, &a.key)->tile[0].stages == 5);
    CHECK(!tune_table_find(&j.t, &w.key));
    static const char *want[] = {"line 2 ignored: checksum mismatch", "line 3 ignored: stale",
                                 "line 4 ignored: stale", "line 5 ignored: dh tile rejected by spec validation",
                                 "line 6 ignored: longer than", "line 7 ignored: not 15",
                                 "line 10 ignored: malformed"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECKF(strstr(err, want[i]), "no \"%s\" in:\n%s", want[i], err);
    int warnings = 0;
    for (const char *p = err; (p = strstr(p, "flce: warn:")); p++) warnings++;
    CHECKF(warnings == 7, "%d warnings:\n%s", warnings, err);
    tune_table_free(&j.t);
}

static void wrong_header_or_torn_end_is_not_trusted(void)
{
    tune_entry a = sample_entry(90);
    char good[TUNE_LINE_MAX + 2], text[2 * TUNE_LINE_MAX];
    tune_line_format(&a, good, sizeof good);
    snprintf(text, sizeof text, "flce-tune-table 2\n%s\n", good);
    parse_job j = {text};
    const char *err = captured(parse_it, &j);
    CHECKF(j.t.count == 0 && strstr(err, "first line is not"), "stderr: %s", err);
    tune_table_free(&j.t);
    snprintf(text, sizeof text, "%s\n%s", TUNE_TABLE_HEADER, good); /* no final newline */
    j.text = text;
    err = captured(parse_it, &j);
    CHECKF(j.t.count == 0 && strstr(err, "torn write"), "stderr: %s", err);
    tune_table_free(&j.t);
    j.text = "";
    err = captured(parse_it, &j);
    CHECK(j.t.count == 0 && err[0] == '\0'); /* an empty table is no warning */
    tune_table_free(&j.t);
}

static void plan_for(const char *device, int sm, plan *pl)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 5000, p.hidden = 4096, p.vocab_shard = 32768;
    CHECK(plan_make_on(&p, FLCE_OP_LOSS_AND_GRAD, device, sm, 132, NULL, pl) == FLCE_OK);
}

static void a_valid_line_changes_the_dispatchers_tiles(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tune");
    config_set(CONFIG_CACHE_DIR, dir);
    tune_forget();
    plan before, after, offline, other_gpu, portable, no_tma;
    plan_for(DEVICE, 90, &before);
    tune_entry a = sample_entry(90);
    CHECK(tune_table_store(dir, &a) == FLCE_OK);
    tune_forget();
    plan_for(DEVICE, 90, &after);
    CHECK(!memcmp(&after.logits.tile, &a.tile[0], sizeof a.tile[0]));
    CHECK(!memcmp(&after.dh.tile, &a.tile[1], sizeof a.tile[0]));
    CHECK(!memcmp(&after.dw.tile, &a.tile[2], sizeof a.tile[0]));
    CHECK(memcmp(&before.logits.tile, &after.logits.tile, sizeof a.tile[0]) != 0);
    /* the vocab splits follow the tuned tile's BN: they cover the vocab, none is empty */
    CHECK((int64_t)after.splits * after.tiles_per_split * after.logits.tile.bn >= 32768);
    CHECK((int64_t)(after.splits - 1) * after.tiles_per_split * after.logits.tile.bn < 32768);
    plan_for(NULL, 90, &offline);
    CHECK(!memcmp(&offline.logits.tile, &before.logits.tile, sizeof a.tile[0]));
    plan_for("NVIDIA H200", 90, &other_gpu);
    CHECK(!memcmp(&other_gpu.logits.tile, &before.logits.tile, sizeof a.tile[0]));
    config_set(CONFIG_PORTABLE, "1");
    plan_for(DEVICE, 90, &portable);
    CHECK(portable.logits.tile.loop == MAINLOOP_MMA_SYNC);
    config_set(CONFIG_PORTABLE, NULL);
    dev_switch_set("tma", "0");
    plan_for(DEVICE, 90, &no_tma);
    CHECK(no_tma.logits.tile.loop == MAINLOOP_WGMMA_CP_ASYNC && no_tma.dw.tile.bn == 256);
    dev_switch_set("tma", NULL);
    /* forced tiles (the tuner's hook) win over everything, and clear */
    spec_tile forced[3] = {a.tile[2], a.tile[2], a.tile[2]};
    tune_force_tiles(forced);
    plan f;
    plan_for(DEVICE, 90, &f);
    CHECK(!memcmp(&f.dh.tile, &a.tile[2], sizeof a.tile[2]));
    tune_force_tiles(NULL);
    config_clear(CONFIG_CACHE_DIR);
    tune_forget();
    remove_tree(dir);
}

static void plan_two_classes(void *arg)
{
    (void)arg;
    plan pl;
    plan_for(DEVICE, 80, &pl);
    plan_for(DEVICE, 86, &pl);
}

static void dispatcher_logs_tuned_versus_default_tiles(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tune");
    config_set(CONFIG_CACHE_DIR, dir);
    tune_entry a = sample_entry(80);
    CHECK(tune_table_store(dir, &a) == FLCE_OK);
    tune_forget();
    const char *text = captured_at("info", plan_two_classes, NULL);
    CHECKF(strstr(text, "tuned tiles from ") && strstr(text, "tune-table.txt for NVIDIA_H100_80GB_HBM3 sm_80"),
           "log: %s", text);
    CHECKF(strstr(text, "default tiles (class not in the tune table) for NVIDIA_H100_80GB_HBM3 sm_86"),
           "log: %s", text);
    config_set(CONFIG_CACHE_DIR, NULL);
    tune_forget();
    remove_tree(dir);
}

/* 8 processes store 8 classes at once, 3 times each: every class lands, the file parses cleanly
 * and no temporary file is left behind. */
static void concurrent_writers_leave_a_valid_table(void)
{
    char dir[TEST_PATH_MAX], path[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tune");
    pid_t kids[8];
    for (int k = 0; k < 8; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            tune_entry e = sample_entry(80);
            e.key.hidden = 1024 * (k + 1);
            int bad = 0;
            for (int r = 0; r < 3; r++) {
                e.ms = r;
                bad |= tune_table_store(dir, &e) != FLCE_OK;
            }
            _exit(bad);
        }
    }
    for (int k = 0; k < 8; k++) {
        int status = 0;
        waitpid(kids[k], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    join(path, dir, TUNE_TABLE_FILE);
    tune_table t = {0};
    CHECK(tune_table_load(path, 0, &t) == FLCE_OK);
    CHECKF(t.count == 8 && t.rejected == 0, "count %zu rejected %zu", t.count, t.rejected);
    for (size_t i = 0; i < t.count; i++) CHECK(t.entries[i].ms == 2);
    tune_table_free(&t);
    DIR *d = opendir(dir);
    struct dirent *de;
    int temps = 0;
    while (d && (de = readdir(d))) temps += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK(temps == 0);
    remove_tree(dir);
}

static void unwritable_directory_is_an_io_error_with_the_path(void)
{
    tune_entry a = sample_entry(80);
    CHECK(tune_table_store("/proc/flce-no-such-dir", &a) == FLCE_ERR_IO);
    CHECKF(strstr(flce_last_error(), "/proc/flce-no-such-dir"), "%s", flce_last_error());
}

static void token_bucket_is_the_power_of_two_below(void)
{
    CHECK(tune_bucket(0) == 1 && tune_bucket(1) == 1 && tune_bucket(2) == 2 && tune_bucket(3) == 2);
    CHECK(tune_bucket(4096) == 4096 && tune_bucket(8191) == 4096 && tune_bucket(8192) == 8192);
}

static void candidates_validate_and_start_with_the_default(void)
{
    static const int sms[] = {80, 86, 89, 90, 100};
    spec_tile c[128];
    for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++)
        for (int dt = 0; dt < 3; dt++)
            for (int r = ROLE_LOGITS; r <= ROLE_DW; r++) {
                int n = tune_candidates(sms[i], (flce_dtype)dt, (spec_role)r, 4096, 32768, c, 128);
                spec_tile def = spec_default_tile(sms[i], (flce_dtype)dt, (spec_role)r);
                CHECKF(n >= 4 && !memcmp(&c[0], &def, sizeof def), "sm %d dtype %d role %d: %d", sms[i], dt, r, n);
                for (int k = 0; k < n; k++) {
                    kernel_spec s;
                    memset(&s, 0, sizeof s);
                    s.sm = sms[i], s.dtype = (flce_dtype)dt, s.role = (spec_role)r, s.hidden = 4096;
                    s.vocab_shard = 32768, s.label_bits = 32, s.tile = c[k];
                    CHECK(spec_validate(&s) == FLCE_OK);
                }
            }
    CHECK(tune_candidates(90, FLCE_DTYPE_BF16, ROLE_LOGITS, 4096, 32768, c, 128) == 10); /* BN 256 × 5 stages overflows shared memory */
}

/* `flce tune` lists tune_cands_make(its problem, arch, --max-candidates) and FLCE_TUNE=1 times
 * tune_first_use_cands(the caller's problem, arch)'s logits list: one list for one class, whatever
 * options, strategy or token count the caller's problem has; FLCE_TUNE=1's is the CLI's cut at its
 * cap, and every role's is tune_candidates' with the built-in tile first. */
static void both_tuner_fronts_share_one_candidate_list(void)
{
    static const int sms[] = {80, 90, 100};
    static const flce_dtype dts[] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F16, FLCE_DTYPE_F32};
    static tune_cands cli, cli16, first;
    for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            flce_problem p, q;
            flce_problem_init(&p);
            p.tokens = 8192, p.hidden = 4096, p.vocab_shard = 32768, p.dtype = dts[d];
            q = p; /* a caller's forward with every option */
            q.tokens = 3000, q.strategy = FLCE_STRATEGY_FORWARD, q.reduction = FLCE_REDUCTION_NONE;
            q.softcap = 30.f, q.temperature = 0.7f, q.label_smoothing = 0.1f, q.z_loss = 1e-4f;
            CHECK(tune_cands_make(&p, sms[i], TUNE_MAX_CAND, &cli) == FLCE_OK);
            CHECK(tune_cands_make(&p, sms[i], TUNE_FIRST_USE_CAND, &cli16) == FLCE_OK);
            CHECK(tune_first_use_cands(&q, sms[i], &first) == FLCE_OK);
            int n0 = cli.n[0] < TUNE_FIRST_USE_CAND ? cli.n[0] : TUNE_FIRST_USE_CAND;
            CHECKF(first.n[0] == n0 && !memcmp(first.tile[0], cli.tile[0], (size_t)n0 * sizeof(spec_tile)),
                   "sm %d dtype %d: FLCE_TUNE=1 lists %d logits tiles, the CLI %d", sms[i], (int)dts[d],
                   first.n[0], cli.n[0]);
            CHECK(!memcmp(first.tile, cli16.tile, sizeof first.tile) && !memcmp(first.n, cli16.n, sizeof first.n));
            for (int r = 0; r < TUNE_ROLES; r++) {
                spec_tile c[TUNE_MAX_CAND];
                int n = tune_candidates(sms[i], dts[d], cli.base[r].role, p.hidden, p.vocab_shard, c, TUNE_MAX_CAND);
                spec_tile def = spec_default_tile(sms[i], dts[d], cli.base[r].role);
                CHECKF(cli.n[r] == n && n >= 1 && !memcmp(cli.tile[r], c, (size_t)n * sizeof c[0]) &&
                           !memcmp(&cli.tile[r][0], &def, sizeof def),
                       "sm %d dtype %d role %d", sms[i], (int)dts[d], r);
            }
        }
}

int main(void)
{
    config_set(CONFIG_PORTABLE, NULL);
    config_set(CONFIG_DEV, NULL);
    RUN(round_trip_keeps_every_field);
    RUN(blackwell_tile_round_trips_as_tcgen05);
    RUN(tile_kind_not_of_the_arch_is_rejected);
    RUN(storing_a_class_again_replaces_its_line);
    RUN(duplicate_classes_last_valid_line_wins);
    RUN(bad_lines_are_ignored_with_one_warning_each);
    RUN(wrong_header_or_torn_end_is_not_trusted);
    RUN(a_valid_line_changes_the_dispatchers_tiles);
    RUN(dispatcher_logs_tuned_versus_default_tiles);
    RUN(concurrent_writers_leave_a_valid_table);
    RUN(unwritable_directory_is_an_io_error_with_the_path);
    RUN(token_bucket_is_the_power_of_two_below);
    RUN(candidates_validate_and_start_with_the_default);
    RUN(both_tuner_fronts_share_one_candidate_list);
    FINISH();
}
