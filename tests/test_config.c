/* test_config.c — the FLCE_* settings (runtime/config.c): one on/off convention, range-checked
 * numbers, defaults for anything else with a warning; the same values given as data (config_set);
 * and planning as a pure function of problem, device facts, settings and tune tiles (plan_build).
 * cpu. Reading the environment is what most of this tests, so it sets variables, unlike the other
 * tests, which give their settings as data. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "config.h"
#include "dev_env.h"
#include "emit.h"
#include "plan.h"

/* What config_parse_bool(name, value, def) printed to stderr under FLCE_LOG=warn (static). */
static const char *warned;
struct bool_call {
    const char *value;
    int def, got;
};
static void call_parse_bool(void *arg)
{
    struct bool_call *c = arg;
    c->got = config_parse_bool("FLCE_X", c->value, c->def);
}
static int parse_bool_capturing(const char *value, int def)
{
    struct bool_call c = {value, def, 0};
    warned = capture_stderr("warn", call_parse_bool, &c);
    return c.got;
}

static void every_on_off_word_parses_in_any_case(void)
{
    static const struct { const char *text; int want; } words[] = {
        {"1", 1}, {"on", 1}, {"ON", 1}, {"true", 1}, {"True", 1}, {"yes", 1}, {"YES", 1},
        {"0", 0}, {"off", 0}, {"Off", 0}, {"false", 0}, {"FALSE", 0}, {"no", 0}, {"No", 0},
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        for (int def = 0; def < 2; def++) {
            int got = parse_bool_capturing(words[i].text, def);
            CHECKF(got == words[i].want && !*warned, "%s (default %d): %d, warned '%s'", words[i].text, def, got,
                   warned);
        }
}

static void unset_or_empty_is_the_default_without_a_word(void)
{
    for (int def = 0; def < 2; def++) {
        CHECK(parse_bool_capturing(NULL, def) == def && !*warned);
        CHECK(parse_bool_capturing("", def) == def && !*warned);
    }
}

static void any_other_value_is_the_default_with_a_warning_naming_it(void)
{
    static const char *bad[] = {"2", "-1", "maybe", " 1", "1 ", "onn", "y", "enable"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int def = 0; def < 2; def++) {
            int got = parse_bool_capturing(bad[i], def);
            CHECKF(got == def, "%s: %d, default %d", bad[i], got, def);
            char want[64];
            snprintf(want, sizeof want, "FLCE_X=%s:", bad[i]);
            CHECKF(strstr(warned, want) && strstr(warned, def ? "default (on)" : "default (off)"), "%s", warned);
        }
}

static void integers_outside_their_range_are_the_default(void)
{
    CHECK(config_parse_int("FLCE_X", NULL, 0, 4096, 8) == 8);
    CHECK(config_parse_int("FLCE_X", "", 0, 4096, 8) == 8);
    CHECK(config_parse_int("FLCE_X", "0", 0, 4096, 8) == 0);
    CHECK(config_parse_int("FLCE_X", "16", 0, 4096, 8) == 16);
    CHECK(config_parse_int("FLCE_X", "4096", 0, 4096, 8) == 4096);
    static const char *bad[] = {"-3", "4097", "abc", "12x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(config_parse_int("FLCE_X", bad[i], 0, 4096, 8) == 8, "%s", bad[i]);
}

/* Unsets every process setting of config_table.h (the rows read once into flce_config): FLCE_DEV
 * and the developer switches' retired variables too. */
static void clear_knobs(void)
{
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &config_settings()[i];
        char legacy[64];
        if (config_is_dev_switch(s)) config_dev_legacy_name(s, legacy, sizeof legacy), unsetenv(legacy);
        else if (s->offset != CONFIG_NO_FIELD) unsetenv(s->name);
    }
    unsetenv("FLCE_DEV");
}

/* The defaults are today's behaviour: TMA, compact, fused dZ and prefetch on; raster groups of 8. */
static void an_empty_environment_gives_the_defaults(void)
{
    clear_knobs();
    flce_config d, e;
    config_defaults(&d);
    config_from_env(&e);
    CHECK(!memcmp(&d, &e, sizeof d));
    CHECK(!d.portable && d.tiles.tma && !d.tiles.enable_sm100 && d.compact && d.fused_dz);
    CHECK(d.red_acc && d.cluster == -1 && d.raster_rows == PLAN_RASTER_ROWS);
    CHECK(!d.tune && d.prefetch && d.tiered && !d.unlocked_compile && d.full_tiles && d.dh_k_slice == PLAN_DH_K_SLICE && d.nvrtc_fast == CONFIG_NVRTC_FAST_OFF && !d.tp_dh_16bit && d.tp_overlap);
    CHECK(d.grad_streams && d.tp_overlap_sms == 32 && d.qrows == -1);
    CHECK(d.logits_cluster == -1 && d.tp_dh_gather16);
}

static void every_knob_reads_its_variable(void)
{
    clear_knobs();
    setenv("FLCE_PORTABLE", "yes", 1), setenv("FLCE_ENABLE_SM100", "true", 1);
    setenv("FLCE_TUNE", "1", 1), setenv("FLCE_PREFETCH", "0", 1), setenv("FLCE_TIERED", "no", 1), setenv("FLCE_NVRTC_FAST", "max", 1);
    setenv("FLCE_DEV",
           "tma=off,compact=0,fused_dz=no,red_acc=off,cluster=2,raster=16,unlocked_compile=yes,full_tiles=off,"
           "dh_k_slice=1000,tp_dh_16bit=yes,tp_overlap=off,grad_streams=off,tp_overlap_sms=16,qrows=0,"
           "logits_cluster=0,tp_dh_gather16=off",
           1);
    flce_config c;
    config_from_env(&c);
    CHECK(c.portable && !c.tiles.tma && c.tiles.enable_sm100 && !c.compact && !c.fused_dz);
    CHECK(!c.red_acc && c.cluster == 2 && c.raster_rows == 16 && !c.tiered && !c.full_tiles && c.dh_k_slice == 768 && c.unlocked_compile);
    CHECK(c.tune && !c.prefetch && c.nvrtc_fast == CONFIG_NVRTC_FAST_MAX && c.tp_dh_16bit && !c.tp_overlap);
    CHECK(!c.grad_streams && c.tp_overlap_sms == 16 && c.qrows == 0);
    CHECK(c.logits_cluster == 0 && !c.tp_dh_gather16);
    clear_knobs();
}

static void cluster_and_nvrtc_fast_take_their_own_values(void)
{
    static const struct { const char *text; int want; } cluster[] = {
        {"0", 0}, {"1", 0}, {"2", 2}, {"-1", -1}, {"4", -1}, {"two", -1}};
    static const struct { const char *text; config_nvrtc_fast want; } fast[] = {
        {"0", CONFIG_NVRTC_FAST_OFF}, {"1", CONFIG_NVRTC_FAST_MID}, {"yes", CONFIG_NVRTC_FAST_MID},
        {"min", CONFIG_NVRTC_FAST_MIN}, {"mid", CONFIG_NVRTC_FAST_MID}, {"MAX", CONFIG_NVRTC_FAST_MAX},
        {"fastest", CONFIG_NVRTC_FAST_OFF}};
    flce_config c;
    clear_knobs();
    for (size_t i = 0; i < sizeof cluster / sizeof cluster[0]; i++) {
        dev_env_set("cluster", cluster[i].text);
        config_from_env(&c);
        CHECKF(c.cluster == cluster[i].want, "FLCE_DEV cluster=%s: %d", cluster[i].text, c.cluster);
    }
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
        setenv("FLCE_NVRTC_FAST", fast[i].text, 1);
        config_from_env(&c);
        CHECKF(c.nvrtc_fast == fast[i].want, "FLCE_NVRTC_FAST=%s: %d", fast[i].text, (int)c.nvrtc_fast);
    }
    clear_knobs();
}

/* Each process row of config_table.h reads its own variable (a developer switch: its key in
 * FLCE_DEV) into its own field and nothing else. */
static void every_table_row_reads_its_variable_into_its_field(void)
{
    const config_setting *rows = config_settings();
    int process_rows = 0;
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &rows[i];
        if (s->offset == CONFIG_NO_FIELD) continue;
        process_rows++;
        clear_knobs();
        int want = 0;
        char text[32];
        if (s->kind == CONFIG_KIND_FAST) want = CONFIG_NVRTC_FAST_MAX, snprintf(text, sizeof text, "max");
        else if (s->kind == CONFIG_KIND_INT) want = s->lo != s->def ? s->lo : s->hi, snprintf(text, sizeof text, "%d", want);
        else want = !s->def, snprintf(text, sizeof text, "%s", want ? "on" : "off");
        if (config_is_dev_switch(s)) dev_env_set(s->name, text);
        else setenv(s->name, text, 1);
        flce_config d, c;
        config_defaults(&d);
        config_from_env(&c);
        CHECKF(*(int *)((char *)&d + s->offset) == s->def, "%s: default %d in the struct, %d in the table", s->name,
               *(int *)((char *)&d + s->offset), s->def);
        *(int *)((char *)&d + s->offset) = want;
        CHECKF(!memcmp(&c, &d, sizeof c), "%s=%s: not (only) its field set to %d", s->name, text, want);
    }
    clear_knobs();
    CHECKF(process_rows == 31, "%d process settings (update this count with the table)", process_rows);
}

static void from_env(void *arg) { config_from_env(arg); }

/* config_from_env(c) under FLCE_LOG=warn; returns what it printed (capture_stderr's storage). */
static const char *from_env_capturing(flce_config *c) { return capture_stderr("warn", from_env, c); }

/* FLCE_DEV: every developer switch in one variable, as key=value items; blanks around an item and
 * an empty item are nothing, a later item wins; not a word of warning for any of it. */
static void dev_switches_are_items_of_one_variable(void)
{
    clear_knobs();
    setenv("FLCE_DEV", " tma=0 , grad_streams=off,raster=4,,raster=5,", 1);
    flce_config c, d;
    const char *out = from_env_capturing(&c);
    CHECKF(!c.tiles.tma && !c.grad_streams && c.raster_rows == 5 && !*out, "%s", out);
    config_defaults(&d);
    d.tiles.tma = 0, d.grad_streams = 0, d.raster_rows = 5;
    CHECK(!memcmp(&c, &d, sizeof c));
    CHECK(config_env(CONFIG_TMA) == NULL); /* a key, not a variable: its value is config_get()'s */
    clear_knobs();
}

/* Strict like every other setting: a key that is no switch (the template macro's spelling TMA
 * included), a value that does not parse or no value at all is a warning naming it, and the switch
 * keeps its default; the items beside it still count. */
static void a_bad_dev_item_is_a_warning_naming_it_and_the_default(void)
{
    static const struct {
        const char *dev, *warning;
    } bad[] = {
        {"tmaa=0", "FLCE_DEV: 'tmaa' is not a developer switch"},
        {"TMA=0", "FLCE_DEV: 'TMA' is not a developer switch"},
        {"tma=maybe", "FLCE_DEV tma=maybe: not 1/0, on/off, true/false or yes/no; the default (on) is used"},
        {"raster=-1", "FLCE_DEV raster=-1: not an integer in 0..4096; the default (8) is used"},
        {"tma", "FLCE_DEV: 'tma' is not key=value; ignored"},
        {"tma=", "FLCE_DEV tma=: not a value; the default is used"},
        {"tma=0,tma=maybe", "FLCE_DEV tma=maybe: not 1/0"},
    };
    flce_config c, d;
    config_defaults(&d);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clear_knobs();
        setenv("FLCE_DEV", bad[i].dev, 1);
        const char *out = from_env_capturing(&c);
        CHECKF(strstr(out, bad[i].warning) && !memcmp(&c, &d, sizeof c), "FLCE_DEV=%s: not the defaults, or warned '%s'",
               bad[i].dev, out);
    }
    setenv("FLCE_DEV", "compact=0,bogus=1,tma=maybe,grad_streams=0", 1);
    const char *out = from_env_capturing(&c);
    CHECKF(!c.compact && !c.grad_streams && c.tiles.tma && strstr(out, "'bogus'") && strstr(out, "tma=maybe"), "%s", out);
    clear_knobs();
}

/* A switch's variable before FLCE_DEV (FLCE_TMA=0) still counts for this release, never in
 * silence: a warning names its FLCE_DEV spelling; FLCE_DEV wins where both set the switch. */
static void a_retired_switch_variable_counts_with_a_warning_naming_its_new_spelling(void)
{
    clear_knobs();
    setenv("FLCE_TMA", "0", 1);
    flce_config c;
    const char *out = from_env_capturing(&c);
    CHECKF(!c.tiles.tma && strstr(out, "FLCE_TMA=0: a retired variable, read for this release only: write FLCE_DEV=tma=0"),
           "%s", out);
    setenv("FLCE_DEV", "tma=1", 1);
    out = from_env_capturing(&c);
    CHECKF(c.tiles.tma && strstr(out, "FLCE_TMA=0: a retired variable"), "%s", out);
    setenv("FLCE_DEV", "tma=maybe", 1); /* a bad FLCE_DEV value: the default, not the retired one's */
    config_from_env(&c);
    CHECK(c.tiles.tma);
    const config_setting *rows = config_settings();
    int switches = 0;
    for (int i = 0; i < CONFIG_COUNT; i++) {
        const config_setting *s = &rows[i];
        if (!config_is_dev_switch(s)) continue;
        switches++;
        clear_knobs();
        char legacy[64], text[32];
        config_dev_legacy_name(s, legacy, sizeof legacy);
        CHECKF(!strncmp(legacy, "FLCE_", 5) && !strcasecmp(legacy + 5, s->name) && strcmp(legacy + 5, s->name),
               "%s: retired as %s", s->name, legacy);
        int want = s->kind == CONFIG_KIND_INT ? (s->lo != s->def ? s->lo : s->hi) : !s->def;
        if (s->kind == CONFIG_KIND_INT) snprintf(text, sizeof text, "%d", want);
        else snprintf(text, sizeof text, "%s", want ? "on" : "off");
        setenv(legacy, text, 1);
        config_from_env(&c);
        CHECKF(*(int *)((char *)&c + s->offset) == want, "%s=%s: not read", legacy, text);
    }
    CHECKF(switches == 23, "%d developer switches (update this count with the table)", switches);
    clear_knobs();
}

static void log_config(void *arg) { config_log(arg); }

/* FLCE_LOG=info prints one line per process setting, and the rows read at each use that are set. */
static void the_log_line_names_every_setting(void)
{
    flce_config c;
    clear_knobs();
    setenv("FLCE_CACHE_RO", "/nonexistent-ro", 1);
    config_defaults(&c);
    c.compact = 0;
    const char *out = capture_stderr("info", log_config, &c);
    int lines = 0, each_use = 0; /* FLCE_CACHE_DIR, set by CTest, is a line of its own too */
    for (const char *p = out; (p = strstr(p, "flce: info: config: ")); p++) lines++;
    for (const char *p = out; (p = strstr(p, " (each use)\n")); p++) each_use++;
    int want = 0;
    for (int i = 0; i < CONFIG_COUNT; i++) want += config_settings()[i].offset != CONFIG_NO_FIELD;
    CHECKF(lines - each_use == want && each_use >= 1, "%d config lines, %d of them each use; want %d + 1 at least:\n%s",
           lines, each_use, want, out);
    CHECKF(strstr(out, "config: FLCE_DEV compact=off\n") && strstr(out, "config: FLCE_DEV tma=on (default)\n") &&
               strstr(out, "config: FLCE_NVRTC_FAST=off (default)\n") && strstr(out, "config: FLCE_DEV raster=8 (default)\n") &&
               strstr(out, "config: FLCE_CACHE_RO=/nonexistent-ro (each use)\n"),
           "%s", out);
    unsetenv("FLCE_CACHE_RO");
}

/* config_get reads the environment once; config_reload (the tests of its parser) again. */
static void the_process_settings_change_only_on_reload(void)
{
    clear_knobs();
    config_reload();
    CHECK(config_get()->compact == 1);
    dev_env_set("compact", "off");
    CHECK(config_get()->compact == 1);
    config_reload();
    CHECK(config_get()->compact == 0);
    dev_env_set("compact", NULL);
    config_reload();
    CHECK(config_get()->compact == 1);
}

/* config_replace: the process's settings from data (the bench tool's +fp32z rows), no environment. */
static void replace_sets_the_process_settings_as_data(void)
{
    clear_knobs();
    config_reload();
    flce_config c = *config_get();
    c.compact = 0, c.raster_rows = 3;
    config_replace(&c);
    CHECK(config_get()->compact == 0 && config_get()->raster_rows == 3 && !getenv("FLCE_DEV"));
    config_reload();
    CHECK(config_get()->compact == 1 && config_get()->raster_rows == PLAN_RASTER_ROWS);
}

/* Settings as data (config_set, what tests and tools use instead of setenv): a given value wins
 * over the variable, NULL reads as unset whatever the variable holds, config_clear reads the
 * variable again; a row read at each use sees it at its next use, a process row's field and a
 * developer switch change at once (over FLCE_DEV's item and the retired variable) and keep it
 * across config_reload. The variables set here are the environment each given value must win over. */
static void given_values_win_over_the_environment(void)
{
    clear_knobs();
    config_reload();
    setenv("FLCE_CACHE_RO", "/from-env", 1);
    CHECK(!strcmp(config_env(CONFIG_CACHE_RO), "/from-env"));
    config_set(CONFIG_CACHE_RO, "/given");
    CHECK(!strcmp(config_env(CONFIG_CACHE_RO), "/given"));
    config_set(CONFIG_CACHE_RO, NULL);
    CHECK(config_env(CONFIG_CACHE_RO) == NULL);
    config_clear(CONFIG_CACHE_RO);
    CHECK(!strcmp(config_env(CONFIG_CACHE_RO), "/from-env"));
    unsetenv("FLCE_CACHE_RO");
    config_set(CONFIG_CACHE_STATS, "off");
    CHECK(!config_env_bool(CONFIG_CACHE_STATS));
    config_clear(CONFIG_CACHE_STATS);
    CHECK(config_env_bool(CONFIG_CACHE_STATS));
    config_set(CONFIG_LOG, "debug");
    CHECK(config_log_level() == 3);
    config_set(CONFIG_LOG, NULL);
    CHECK(config_log_level() == 0);

    setenv("FLCE_TUNE", "1", 1);
    config_reload();
    CHECK(config_get()->tune == 1);
    config_set(CONFIG_TUNE, "off");
    CHECK(config_get()->tune == 0);
    config_reload();
    CHECK(config_get()->tune == 0);
    config_set(CONFIG_TUNE, NULL);
    CHECK(config_get()->tune == 0);
    config_clear(CONFIG_TUNE);
    CHECK(config_get()->tune == 1);
    config_set(CONFIG_NVRTC_FAST, "max");
    CHECK(config_get()->nvrtc_fast == CONFIG_NVRTC_FAST_MAX);
    config_clear(CONFIG_NVRTC_FAST);
    CHECK(config_get()->nvrtc_fast == CONFIG_NVRTC_FAST_OFF);

    setenv("FLCE_DEV", "compact=0,raster=4", 1);
    config_reload();
    CHECK(!config_get()->compact && config_get()->raster_rows == 4);
    config_set(CONFIG_COMPACT, "1");
    CHECK(config_get()->compact && config_get()->raster_rows == 4);
    config_reload();
    CHECK(config_get()->compact && config_get()->raster_rows == 4);
    config_set(CONFIG_COMPACT, NULL); /* its default, not FLCE_DEV's item */
    CHECK(config_get()->compact);
    config_clear(CONFIG_COMPACT);
    CHECK(!config_get()->compact && config_get()->raster_rows == 4);
    config_set(CONFIG_DEV, "raster=5");
    CHECK(config_get()->compact && config_get()->raster_rows == 5);
    config_clear(CONFIG_DEV);
    CHECK(!config_get()->compact && config_get()->raster_rows == 4);
    config_set(CONFIG_CLUSTER, "1"); /* derived as from the environment: a 1-CTA cluster is none */
    CHECK(config_get()->cluster == 0);
    config_clear(CONFIG_CLUSTER);
    CHECK(config_get()->cluster == -1);
    unsetenv("FLCE_DEV");
    setenv("FLCE_TMA", "0", 1);
    config_set(CONFIG_TMA, "1");
    flce_config c;
    from_env_capturing(&c);
    CHECK(c.tiles.tma);
    config_clear(CONFIG_TMA);
    unsetenv("FLCE_TMA");

    CHECK(config_set_name("tma", "0") == 0 && !config_get()->tiles.tma);
    CHECK(config_set_name("FLCE_PORTABLE", "yes") == 0 && config_get()->portable);
    CHECK(config_set_name("TMA", "0") == -1 && config_set_name("FLCE_TMA", "0") == -1 && config_get()->tiles.tma == 0);
    config_clear(CONFIG_TMA), config_clear(CONFIG_PORTABLE);
    CHECK(config_get()->tiles.tma && !config_get()->portable);
    clear_knobs();
    config_reload();
}

/* A row read at each use given from one thread while others read it: each read is one of the
 * values given, whole (the copies outlive their replacement). Run under the tsan preset too. */
enum { GIVEN_READS = 20000 };
static void *read_given(void *arg)
{
    int *bad = arg;
    for (int i = 0; i < GIVEN_READS; i++) {
        const char *v = config_env(CONFIG_CACHE_RO);
        *bad += !v || (strcmp(v, "/given-a") && strcmp(v, "/given-b"));
    }
    return NULL;
}

static void given_values_are_read_safely_by_other_threads(void)
{
    config_set(CONFIG_CACHE_RO, "/given-a");
    pthread_t t[2];
    int bad[2] = {0, 0};
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, read_given, &bad[i]) == 0);
    for (int i = 0; i < 2000; i++) config_set(CONFIG_CACHE_RO, i % 2 ? "/given-a" : "/given-b");
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECKF(!bad[0] && !bad[1], "%d and %d reads not a given value", bad[0], bad[1]);
    config_clear(CONFIG_CACHE_RO);
}

static flce_problem problem(int64_t n, int64_t d, int64_t v, flce_dtype t)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = t;
    return p;
}

/* Rank 1 of 2 of a bf16 problem whose vocab of v_total splits evenly. */
static flce_problem tp2_problem(int64_t n, int64_t d, int64_t v_total)
{
    flce_problem p = problem(n, d, v_total / 2, FLCE_DTYPE_BF16);
    p.vocab_total = v_total, p.vocab_offset = v_total / 2, p.tp_rank = 1, p.tp_size = 2;
    return p;
}

/* The Llama-3 shape (8192 × 4096 × 128256 bf16) planned for an H100 under cfg: one chunk by
 * default. */
static flce_problem llama_plan(const flce_config *cfg, plan *pl)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, cfg, NULL, NULL, pl) == FLCE_OK);
    CHECK(pl->n_chunks == 1);
    return p;
}

/* Same problem, device facts, settings and tiles: the same plan, byte for byte, whatever the
 * environment says meanwhile; and plan_make (offline) is plan_build under the process's settings. */
static void planning_is_a_pure_function_of_its_inputs(void)
{
    clear_knobs();
    config_reload();
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    flce_config cfg;
    config_defaults(&cfg);
    plan a, b, offline;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &a) == FLCE_OK);
    setenv("FLCE_DEV", "compact=0,tma=0,raster=3", 1);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &b) == FLCE_OK);
    clear_knobs();
    CHECK(!memcmp(&a, &b, sizeof a));
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &offline) == FLCE_OK);
    CHECK(!memcmp(&a, &offline, sizeof a));
    CHECK(a.compact && a.logits.tile.loop == MAINLOOP_WGMMA_TMA && a.raster_rows == PLAN_RASTER_ROWS);
}

static void each_setting_reaches_the_plan(void)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    flce_config cfg;
    plan pl;
    config_defaults(&cfg);
    cfg.compact = 0;
    p.strategy = FLCE_STRATEGY_CHUNKED;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.compact && !pl.logits.compact && pl.off_z != pl.off_dz);
    config_defaults(&cfg);
    cfg.fused_dz = 0;
    p.strategy = FLCE_STRATEGY_RECOMPUTE;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.recompute && !pl.fused_dz && pl.off_z != 0);
    p.strategy = FLCE_STRATEGY_AUTO;
    config_defaults(&cfg);
    cfg.portable = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.tile.loop == MAINLOOP_MMA_SYNC && pl.dh.tile.loop == MAINLOOP_MMA_SYNC &&
          pl.dw.tile.loop == MAINLOOP_MMA_SYNC);
    config_defaults(&cfg);
    cfg.tiles.tma = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.tile.loop == MAINLOOP_WGMMA_CP_ASYNC && pl.logits.tile.bn == 128 && pl.dw.tile.bn == 256);
    config_defaults(&cfg);
    cfg.tiles.enable_sm100 = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 100, 148, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.tile.loop == MAINLOOP_TCGEN05 && pl.dh.tile.loop == MAINLOOP_TCGEN05);
    config_defaults(&cfg);
    cfg.cluster = 2, cfg.red_acc = 1, cfg.raster_rows = 0, cfg.logits_cluster = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.cluster == 2 && pl.dh.cluster == 2 && pl.dw.cluster == 2 && pl.logits.cluster == 0);
    CHECK(pl.red_acc && pl.raster_rows == 0);
    /* clusters only on the wgmma TMA path */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 80, 108, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.cluster == 2 && pl.dh.cluster == 0 && pl.dw.cluster == 0);
}

/* Row-scaled compact logits (plan.h qrows, on by default) where dz is one factor per row times them
 * and every label lies in the shard: bf16 chunked on the wgmma TMA path with no bias, smoothing,
 * softcap, z-loss or TP; its arrays inside the workspace, s ⊙ H counted in the chunk's bytes. */
static void row_scaled_logits_only_where_dz_is_a_row_factor(void)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    flce_config cfg;
    plan pl, off;
    config_defaults(&cfg);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.compact && pl.qrows && pl.logits.qrows && spec_validate(&pl.logits) == FLCE_OK);
    CHECK(pl.off_qref && pl.off_qflags && pl.off_row_scale && pl.off_qh);
    CHECK(pl.off_qh + (uint64_t)pl.chunk_rows * 4096 * 2 <= pl.workspace_bytes);
    CHECK(pl.off_row_scale + (uint64_t)pl.chunk_rows * 4 <= pl.workspace_bytes);
    /* AUTO counts no dz pass: the chunked estimate drops by the 4 bytes per logit it moved */
    cfg.qrows = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &off) == FLCE_OK);
    CHECK(off.compact && !off.qrows && !off.logits.qrows && off.off_qh == 0);
    CHECK(pl.est_chunked_ms < off.est_chunked_ms);
    cfg.qrows = 1;
    /* by default only where a chunk holds PLAN_QROWS_MIN_LOGITS logits; FLCE_DEV=qrows=1 everywhere */
    flce_problem small = problem(512, 4096, 128256, FLCE_DTYPE_BF16);
    cfg.qrows = -1;
    CHECK(plan_build(&small, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.compact && !pl.qrows && !pl.logits.qrows && pl.off_qh == 0);
    cfg.qrows = 1;
    CHECK(plan_build(&small, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.compact && pl.qrows && pl.logits.qrows && pl.off_qh != 0);
    /* the budget still sets the chunk (its rows of logits): s ⊙ H and the row arrays come on top */
    p.memory_budget = 512ull << 20, p.strategy = FLCE_STRATEGY_CHUNKED;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    cfg.qrows = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &off) == FLCE_OK);
    CHECK(pl.qrows && pl.chunk_rows == 2048 && off.chunk_rows == 2048);
    CHECK(pl.workspace_bytes >= off.workspace_bytes + 2048ull * 4096 * 2);
    cfg.qrows = 1, p.memory_budget = 0, p.strategy = FLCE_STRATEGY_AUTO;
    struct {
        const char *what;
        flce_problem q;
        int sm;
    } no[8];
    for (int i = 0; i < 8; i++) no[i].q = p, no[i].sm = 90;
    no[0].what = "fp16", no[0].q.dtype = FLCE_DTYPE_F16;
    no[1].what = "bias", no[1].q.has_bias = 1;
    no[2].what = "smoothing", no[2].q.label_smoothing = 0.1f;
    no[3].what = "softcap", no[3].q.softcap = 30;
    no[4].what = "z-loss", no[4].q.z_loss = 1e-4f;
    no[5].what = "vocab shard", no[5].q.vocab_offset = 1000, no[5].q.vocab_total = 200000;
    no[6].what = "mma.sync", no[6].sm = 80;
    no[7].what = "TP with SP", no[7].q = tp2_problem(8192, 4096, 128256), no[7].q.sequence_parallel = 1;
    for (int i = 0; i < 8; i++) {
        CHECK(plan_build(&no[i].q, FLCE_OP_LOSS_AND_GRAD, no[i].sm, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
        CHECKF(!pl.qrows && !pl.logits.qrows && pl.off_qh == 0, "%s", no[i].what);
    }
    flce_problem tp = tp2_problem(8192, 4096, 128256); /* a TP shard that gathers its statistics */
    CHECK(plan_build(&tp, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.collective && pl.qrows && pl.logits.qrows && pl.off_qh != 0);
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.qrows && !pl.logits.qrows);
}

/* A tune entry's tiles are an input like the others: they replace the built-in tiles, and the
 * vocab splits follow their BN. */
/* FLCE_DEV tp_dh_16bit reaches only the plain TP all-reduce of a 16-bit dH: not one GPU, not SP (a
 * reduce-scatter), not a caller's fp32 dH accumulator, not fp32 inputs. */
static void the_16bit_dh_reduction_applies_to_the_plain_all_reduce_only(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    cfg.tp_dh_16bit = 1;
    flce_problem p = tp2_problem(512, 256, 8192);
    plan pl;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.collective && pl.need_dh_tp && pl.dh_reduce_16bit);
    config_defaults(&cfg);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_reduce_16bit); /* fp32 unless asked */
    cfg.tp_dh_16bit = 1;
    p.accumulate_grad_hidden = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_reduce_16bit);
    p.accumulate_grad_hidden = 0, p.sequence_parallel = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.sp && !pl.dh_reduce_16bit);
    p.sequence_parallel = 0, p.dtype = FLCE_DTYPE_F32;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_reduce_16bit);
    p.dtype = FLCE_DTYPE_BF16, p.tp_rank = 0, p.tp_size = 1, p.vocab_offset = 0, p.vocab_total = 4096;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.collective && !pl.dh_reduce_16bit);
}

/* FLCE_DEV tp_dh_gather16 (default on) takes the plain fp32 all-reduce's place only: not with
 * FLCE_DEV tp_dh_16bit, SP (already a reduce-scatter), a caller's fp32 dH accumulator, fp32 inputs or
 * one GPU. */
static void the_gathered_16bit_dh_replaces_the_plain_all_reduce_only(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    flce_problem p = tp2_problem(512, 256, 8192);
    plan pl;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.need_dh_tp && pl.dh_gather16 && !pl.dh_reduce_16bit);
    cfg.tp_dh_16bit = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_reduce_16bit && !pl.dh_gather16);
    config_defaults(&cfg);
    cfg.tp_dh_gather16 = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_gather16);
    config_defaults(&cfg);
    p.accumulate_grad_hidden = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_gather16);
    p.accumulate_grad_hidden = 0, p.sequence_parallel = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.sp && !pl.dh_gather16);
    p.sequence_parallel = 0, p.dtype = FLCE_DTYPE_F32;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh_gather16);
    p.dtype = FLCE_DTYPE_BF16, p.tp_rank = 0, p.tp_size = 1, p.vocab_offset = 0, p.vocab_total = 4096;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.collective && !pl.dh_gather16);
}

/* FLCE_DEV tp_overlap: the dH reduction beside dW where the plain all-reduce and the counter-fed dW
 * tiles exist (wgmma + TMA, no clusters), with the counter in the workspace; nowhere else. */
static void the_overlapped_dh_reduction_needs_an_all_reduce_and_the_tma_dw(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    cfg.tp_overlap = 1;
    flce_problem p = tp2_problem(8192, 4096, 128256);
    plan pl;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    /* one token chunk: one dH launch whose waves are full, so dW does not run beside it */
    CHECK(pl.n_chunks == 1 && pl.tp_overlap && pl.dw_dynamic && !pl.concurrent_grads);
    p.memory_budget = 256ull << 20; /* several chunks: the reduction follows dH beside dW */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks > 1 && pl.tp_overlap && pl.dw_dynamic && pl.concurrent_grads);
    CHECK(pl.off_tile_counter > 0 && pl.off_tile_counter + 8 <= pl.workspace_bytes && pl.off_tile_counter % 8 == 0);
    p.strategy = FLCE_STRATEGY_RECOMPUTE;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.recompute && pl.tp_overlap);
    p.strategy = FLCE_STRATEGY_AUTO;
    config_defaults(&cfg);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.tp_overlap && pl.tp_overlap_sms == 32); /* on by default */
    cfg.tp_overlap = 0; /* off: dW and dH still run at once (FLCE_DEV grad_streams), the reduction after */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.tp_overlap && pl.concurrent_grads && pl.dw_dynamic && pl.off_tile_counter > 0);
    cfg.tp_overlap = 1;
    cfg.cluster = 2;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.tp_overlap);
    cfg.cluster = 0, cfg.portable = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.tp_overlap);
    cfg.portable = 0;
    p.sequence_parallel = 1, p.tokens = 4096; /* SP: the reduce-scatter of all rows beside the last dW */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.sp && pl.tp_overlap && pl.dw_dynamic);
    p.sequence_parallel = 0;
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.tp_overlap);
    p.tp_rank = 0, p.tp_size = 1, p.vocab_offset = 0, p.vocab_shard = p.vocab_total;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.tp_overlap);
}

/* dH's tile narrows where its 256-wide tiles leave a wave part empty and a narrower one costs less
 * (plan_dh_width's model); FLCE_DEV dh_bn forces a width, tuned tiles and other paths keep theirs. */
static void dh_tiles_narrow_where_the_last_wave_would_idle(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = llama_plan(&cfg, &pl); /* 1024 tiles, 7.76 waves: kept */
    CHECK(pl.dh.tile.bn == 256 && pl.dw.tile.bn == 256);
    p = problem(8192, 2304, 256000, FLCE_DTYPE_BF16); /* 576 tiles, 4.36 waves → 768 of 192 */
    p.vocab_total = 256000;
    p.memory_budget = 8ull << 30; /* one token chunk, as an 80 GB device's default budget makes */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks == 1 && pl.dh.tile.bn == 192 && pl.dw.tile.bn == 256 && pl.logits.tile.bn == 256);
    CHECK(pl.dh.plain_out); /* 2304 = 12 × 192: whole tiles */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 144, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == 256); /* 576 tiles on 144 SMs: 4 full waves */
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == 256); /* no dH in a forward */
    p.memory_budget = 512ull << 20; /* 8 launches of 72 tiles: dW fills their tails, no narrowing */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks > 1 && pl.dh.tile.bn == 256 && pl.concurrent_grads);
    p = problem(512, 4096, 128256, FLCE_DTYPE_BF16); /* 64 tiles: one half-empty wave → 128 of 128 */
    p.vocab_total = 128256;
    cfg.dh_splits = 0; /* (by default split over k instead: dh_splits_where_tiles_leave_most_sms_idle) */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == 128 && !pl.concurrent_grads && pl.dh_splits == 0);
    cfg.dh_bn = 192;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == 192);
    config_defaults(&cfg);
    spec_tile tuned[3] = {spec_tile_pick(90, FLCE_DTYPE_BF16, ROLE_LOGITS, cfg.tiles),
                          spec_tile_pick(90, FLCE_DTYPE_BF16, ROLE_DH, cfg.tiles),
                          spec_tile_pick(90, FLCE_DTYPE_BF16, ROLE_DW, cfg.tiles)};
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, tuned, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == 256); /* a tuned table's tiles are measured: kept */
    cfg.portable = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.tile.bn == spec_tile_pick(89, FLCE_DTYPE_BF16, ROLE_DH, cfg.tiles).bn);
}

/* dH's one launch splits over k where its 256-wide tiles fill under half the SMs (plan_dh_splits):
 * S units per tile into fp32 slabs in the workspace, the count with the fewest waves per split;
 * never with token or vocab chunks, TP, clusters, or the label terms in dH's epilogue. */
static void dh_splits_where_tiles_leave_most_sms_idle(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl, off;
    flce_problem p = problem(512, 4096, 128256, FLCE_DTYPE_BF16); /* 64 tiles of 256 on 132 SMs */
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 2 && pl.dh.tile.bn == 256 && !pl.dh.plain_out && pl.dw.plain_out);
    CHECK(pl.dh_split_k % 64 == 0 && pl.dh_split_k * 2 >= 128256 && pl.dh_split_k < 128256);
    CHECK(pl.off_dh_split > 0 && !pl.concurrent_grads); /* 128 units: one full wave */
    cfg.dh_splits = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &off) == FLCE_OK);
    CHECK(off.dh_splits == 0 && off.off_dh_split == 0);
    CHECK(pl.workspace_bytes >= off.workspace_bytes + 2ull * 512 * 4096 * 4); /* the slabs */
    config_defaults(&cfg);
    p = problem(256, 4096, 128256, FLCE_DTYPE_BF16); /* 32 tiles: 4 splits make 128 units */
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 4 && (pl.dh_splits - 1) * pl.dh_split_k < 128256);
    p = problem(256, 4096, 20000, FLCE_DTYPE_BF16); /* splits of at least 8192 columns: 2 */
    p.vocab_total = 20000;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 2);
    p = problem(1024, 4096, 128256, FLCE_DTYPE_BF16); /* 128 tiles: one wave already */
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 0);
    p = problem(512, 4096, 128256, FLCE_DTYPE_BF16);
    p.vocab_total = 128256;
    p.memory_budget = 64ull << 20; /* two token or vocab chunks: two dH launches */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK((pl.n_chunks > 1 || pl.n_vchunks > 1) && pl.dh_splits == 0);
    p.memory_budget = 0;
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 0);
    cfg.dh_splits = 3; /* forced, where the rule would take 2 */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 3 && pl.dh_split_k * 3 >= 128256);
    cfg.cluster = 2;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 0);
    config_defaults(&cfg);
    cfg.qrows = 1, cfg.qdh = 0; /* the labels' terms in dH's epilogue need the whole k */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.qrows && pl.dh_splits == 0);
    cfg.qdh = 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.qrows && pl.dh_splits == 2);
    config_defaults(&cfg);
    p.tp_size = 2, p.tp_rank = 0, p.vocab_shard = 64128; /* TP: dH is summed across ranks in fp32 */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_splits == 0);
}

/* FLCE_DEV cluster unset: dW alone in 2-CTA clusters where its one token chunk is at most 1024 rows
 * (plan_dw_cluster); FLCE_DEV=cluster=0 none, 2 both; never with several chunks or TP. */
static void dw_clusters_where_its_token_chunk_is_short(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = problem(512, 4096, 128256, FLCE_DTYPE_BF16);
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 2 && pl.dh.cluster == 0 && pl.dh_splits == 2 && !pl.dw_dynamic);
    cfg.cluster = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 0 && pl.dh.cluster == 0);
    cfg.cluster = 2;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 2 && pl.dh.cluster == 2 && pl.dh_splits == 0);
    config_defaults(&cfg);
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 0);
    p.memory_budget = 64ull << 20; /* two chunks */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 0);
    p.memory_budget = 0;
    p = problem(2048, 4096, 128256, FLCE_DTYPE_BF16); /* a long k: no cluster */
    p.vocab_total = 128256;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 0);
    p = problem(512, 4096, 128256, FLCE_DTYPE_BF16);
    p.vocab_total = 128256, p.tp_size = 2, p.tp_rank = 1, p.vocab_offset = 64128, p.vocab_shard = 64128;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.cluster == 0);
}

/* FLCE_DEV logits_cluster unset: the logits pass (and recompute's logits+dZ pass, its copy) in 2-CTA
 * clusters where its launch has at least PLAN_LOGITS_CLUSTER_MIN_BLOCKS row blocks (all tokens
 * for the forward and recompute, one token chunk for chunked); 1 always, 0 never; only on the wgmma
 * TMA path; the kernel source names the cluster size and holds no `#if FLCE_CLUSTER`. */
static void logits_clusters_where_the_launch_has_row_blocks_to_pair(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 2 && pl.logits.tile.stages == 4);
    CHECK(spec_validate(&pl.logits) == FLCE_OK);
    char *src = NULL;
    CHECK(emit_source(&pl.logits, &src) == FLCE_OK && src && strstr(src, "#define FLCE_CLUSTER 2") &&
          !strstr(src, "#if FLCE_CLUSTER") && strstr(src, "produce_logits"));
    free(src);
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 2);
    p.strategy = FLCE_STRATEGY_RECOMPUTE;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.fused_dz && pl.logits.cluster == 2 && pl.logits_dz.cluster == 2);
    p.strategy = FLCE_STRATEGY_AUTO;
    p.tokens = 3 * 128; /* three row blocks: none */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 0);
    p.tokens = 3 * 128 + 1;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 2);
    cfg.logits_cluster = 1;
    p.tokens = 100;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 2);
    cfg.logits_cluster = 0;
    p.tokens = 8192;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 0);
    config_defaults(&cfg);
    cfg.tiles.tma = 0; /* the cp.async wgmma tile: no clusters */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 0);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 80, 108, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.logits.cluster == 0);
}

/* The statistics pass may run persistent CTAs (plan.h logits_persist) on the wgmma TMA path,
 * unless FLCE_DEV=logits_persist=0, the entropy or argmax statistics are asked for (that kernel has no
 * persistent loop), or the pass is another path; FLCE_DEV logits_splits forces its split count. */
static void logits_persist_where_the_kernel_has_the_loop(void)
{
    static const char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = t.weight = t.labels = &mark;
    t.loss = t.lse = (float *)(uintptr_t)&mark;
    t.grad_hidden = t.grad_weight = (void *)(uintptr_t)&mark;
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(pl.logits_persist && pl.splits == 39 && pl.tiles_per_split == 13);
    cfg.logits_splits = 2;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(pl.splits == 2 && pl.tiles_per_split == 251 && pl.logits_persist);
    cfg.logits_splits = 0, cfg.logits_persist = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(pl.splits == 39 && !pl.logits_persist);
    cfg.logits_persist = 1;
    t.argmax = (int64_t *)(uintptr_t)&mark;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(!pl.logits_persist);
    t.argmax = NULL;
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 80, 108, &cfg, NULL, &t, &pl) == FLCE_OK); /* sm_80: mma.sync */
    CHECK(!pl.logits_persist);
}

/* FLCE_DEV grad_streams (default on): dH and dW at once where both are asked for, dW can take its
 * tiles from the counter and dH leaves SMs idle (several launches, or one with over 10 % of its
 * last wave empty); the counter is in the workspace exactly then (or with the TP overlap). */
static void dh_and_dw_run_at_once_where_the_dw_tiles_can_be_counted(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = llama_plan(&cfg, &pl);
    /* one dH launch of 1024 tiles on 132 SMs: 7.76 waves, 3 % idle: dH alone */
    CHECK(!pl.concurrent_grads && !pl.dw_dynamic && pl.off_tile_counter == 0);
    p.memory_budget = 512ull << 20; /* 4 token chunks: 4 dH launches */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks == 4 && pl.concurrent_grads && pl.dw_dynamic);
    p = problem(512, 4096, 128256, FLCE_DTYPE_BF16); /* one dH launch of 64 tiles: half the SMs idle */
    p.vocab_total = 128256;
    cfg.dh_bn = 256; /* the width plan_dh_width would narrow to fill the wave */
    cfg.cluster = 0; /* (else dW runs in clusters here, without the counter: plan_dw_cluster) */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.concurrent_grads && pl.dw_dynamic && pl.off_tile_counter > 0 && !pl.tp_overlap);
    CHECK(pl.off_tile_counter + 8 <= pl.workspace_bytes);
    CHECK(plan_build(&p, FLCE_OP_BACKWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.concurrent_grads);
    CHECK(plan_build(&p, FLCE_OP_FORWARD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.concurrent_grads && !pl.dw_dynamic && pl.off_tile_counter == 0);
    /* a call asking for dH only (no dW to run beside it) */
    static const char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = t.weight = t.labels = &mark;
    t.loss = (float *)(uintptr_t)&mark, t.grad_hidden = (void *)(uintptr_t)&mark;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(!pl.concurrent_grads && pl.off_tile_counter == 0);
    t.grad_weight = (void *)(uintptr_t)&mark;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, &t, &pl) == FLCE_OK);
    CHECK(pl.concurrent_grads);
    cfg.grad_streams = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.concurrent_grads && !pl.dw_dynamic && pl.off_tile_counter == 0);
    config_defaults(&cfg);
    cfg.portable = 1; /* mma.sync dW: a grid of tiles, no counter */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.concurrent_grads);
    config_defaults(&cfg);
    cfg.cluster = 2;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.concurrent_grads);
}

/* dH/dW kernels hold only the stores their launches make (spec plain_out, red_acc): plain where
 * each gradient is written once as complete 16-bit tiles; the fp32/partial-tile stores where an
 * accumulator, a caller's fp32 buffer, fp32 inputs or a hidden size off the tile grid need them. */
static void gradient_kernels_hold_only_the_stores_they_make(void)
{
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    flce_problem p = llama_plan(&cfg, &pl);
    CHECK(pl.dh.plain_out && pl.dw.plain_out && !pl.dh.red_acc && !pl.dw.red_acc);
    CHECK(!pl.logits.plain_out && spec_validate(&pl.dh) == FLCE_OK && spec_validate(&pl.dw) == FLCE_OK);
    p.memory_budget = 512ull << 20; /* 4 chunks: dW through the fp32 accumulator */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks == 4 && pl.need_dw_acc && pl.dh.plain_out && !pl.dw.plain_out && pl.dw.red_acc);
    CHECK(!pl.dh.red_acc && spec_validate(&pl.dw) == FLCE_OK);
    /* by bulk reductions from shared memory (FLCE_DEV bulk_red, default): red_acc 1 and a second
     * staging buffer per warp; FLCE_DEV=bulk_red=0: red.global per thread (red_acc 2), no buffer */
    CHECK(pl.dw.red_acc == 1 && spec_bulk_red(&pl.dw));
    size_t bulk_smem = spec_smem_bytes(&pl.dw);
    char *src = NULL;
    CHECK(emit_source(&pl.dw, &src) == FLCE_OK && src && strstr(src, "#define FLCE_GRAD_BULK 1"));
    free(src), src = NULL;
    cfg.bulk_red = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dw.red_acc == 2 && !spec_bulk_red(&pl.dw) && spec_validate(&pl.dw) == FLCE_OK);
    CHECK(spec_smem_bytes(&pl.dw) + 2048u * 8 == bulk_smem);
    CHECK(emit_source(&pl.dw, &src) == FLCE_OK && src && strstr(src, "#define FLCE_GRAD_RED 1") &&
          !strstr(src, "#define FLCE_GRAD_BULK 1"));
    free(src);
    cfg.bulk_red = 1;
    cfg.red_acc = 0; /* FLCE_DEV=red_acc=0: load + add + store */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dw.red_acc && !pl.dh.red_acc && spec_validate(&pl.dw) == FLCE_OK);
    config_defaults(&cfg);
    p.memory_budget = 0, p.accumulate_grad_weight = 1; /* the caller's fp32 main_grad */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh.plain_out && !pl.dw.plain_out);
    p.accumulate_grad_weight = 0, p.strategy = FLCE_STRATEGY_RECOMPUTE; /* dH over vocab chunks in fp32 */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_vchunks > 1 && pl.need_dh_acc && !pl.dh.plain_out && pl.dw.plain_out);
    p = problem(8192, 4000, 128256, FLCE_DTYPE_BF16); /* D off the 256-column grid: a partial tile */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh.plain_out && !pl.dw.plain_out);
    p = problem(1024, 256, 4096, FLCE_DTYPE_F32);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh.plain_out && !pl.dw.plain_out);
    p = problem(1024, 256, 4096, FLCE_DTYPE_BF16);
    cfg.portable = 1; /* mma.sync: no staged store */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK);
    CHECK(!pl.dh.plain_out && !pl.dw.plain_out);
    /* the spec says no otherwise */
    config_defaults(&cfg);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK && pl.dh.plain_out);
    kernel_spec s = pl.dh;
    s.hidden = 200;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT);
    s = pl.dh, s.red_acc = 1;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT);
    s = pl.logits, s.plain_out = 1;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT);
}

static void tune_tiles_are_an_input(void)
{
    flce_problem p = problem(8192, 4096, 32768, FLCE_DTYPE_BF16);
    flce_config cfg;
    config_defaults(&cfg);
    spec_tile tuned[3];
    for (int r = 0; r < 3; r++) tuned[r] = spec_tile_pick(90, FLCE_DTYPE_BF16, (spec_role)r, cfg.tiles);
    tuned[0].bn = 128, tuned[1].stages = 3;
    plan pl, again;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, tuned, NULL, &pl) == FLCE_OK);
    CHECK(!memcmp(&pl.logits.tile, &tuned[0], sizeof tuned[0]) && !memcmp(&pl.dh.tile, &tuned[1], sizeof tuned[1]));
    CHECK((int64_t)pl.splits * pl.tiles_per_split * 128 >= 32768);
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, tuned, NULL, &again) == FLCE_OK);
    CHECK(!memcmp(&pl, &again, sizeof pl));
}

int main(void)
{
    RUN(every_on_off_word_parses_in_any_case);
    RUN(unset_or_empty_is_the_default_without_a_word);
    RUN(any_other_value_is_the_default_with_a_warning_naming_it);
    RUN(integers_outside_their_range_are_the_default);
    RUN(an_empty_environment_gives_the_defaults);
    RUN(every_knob_reads_its_variable);
    RUN(cluster_and_nvrtc_fast_take_their_own_values);
    RUN(every_table_row_reads_its_variable_into_its_field);
    RUN(dev_switches_are_items_of_one_variable);
    RUN(a_bad_dev_item_is_a_warning_naming_it_and_the_default);
    RUN(a_retired_switch_variable_counts_with_a_warning_naming_its_new_spelling);
    RUN(the_log_line_names_every_setting);
    RUN(the_process_settings_change_only_on_reload);
    RUN(replace_sets_the_process_settings_as_data);
    RUN(given_values_win_over_the_environment);
    RUN(given_values_are_read_safely_by_other_threads);
    RUN(planning_is_a_pure_function_of_its_inputs);
    RUN(each_setting_reaches_the_plan);
    RUN(row_scaled_logits_only_where_dz_is_a_row_factor);
    RUN(gradient_kernels_hold_only_the_stores_they_make);
    RUN(tune_tiles_are_an_input);
    RUN(the_16bit_dh_reduction_applies_to_the_plain_all_reduce_only);
    RUN(the_gathered_16bit_dh_replaces_the_plain_all_reduce_only);
    RUN(the_overlapped_dh_reduction_needs_an_all_reduce_and_the_tma_dw);
    RUN(dh_and_dw_run_at_once_where_the_dw_tiles_can_be_counted);
    RUN(dh_tiles_narrow_where_the_last_wave_would_idle);
    RUN(dh_splits_where_tiles_leave_most_sms_idle);
    RUN(dw_clusters_where_its_token_chunk_is_short);
    RUN(logits_clusters_where_the_launch_has_row_blocks_to_pair);
    RUN(logits_persist_where_the_kernel_has_the_loop);
    FINISH();
}
