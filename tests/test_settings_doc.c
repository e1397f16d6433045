/* test_settings_doc.c — the README's settings tables come from runtime/config_table.h: this prints
 * them in Markdown and fails when README.md's generated section differs; and the library reads its
 * environment in one file (runtime/config.c). cpu.
 *
 *   test_settings_doc README.md SRCDIR   check (what CTest runs)
 *   test_settings_doc --print            the generated section on stdout
 *   test_settings_doc --write README.md  replace the section in place (after editing the table) */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "check.h"
#include "config.h"
#include "host.h"

#define BEGIN_MARK "<!-- settings: generated from runtime/config_table.h by tests/test_settings_doc.c"
#define END_MARK "<!-- settings: end -->"

/* A growing string. */
typedef struct text {
    char *s;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->n + (size_t)need + 1 > t->cap) {
        t->cap = 2 * (t->n + (size_t)need + 1);
        t->s = realloc(t->s, t->cap);
        if (!t->s) abort();
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n += (size_t)need;
}

/* When the row is read, in the README's words (the rows read once per process say nothing: the
 * section's introduction says it). */
static const char *when_read(const config_setting *s)
{
    switch (s->kind) {
    case CONFIG_KIND_LEVEL:
    case CONFIG_KIND_TEXT:
    case CONFIG_KIND_NUM:
    case CONFIG_KIND_EBOOL: return " *Each use.*";
    case CONFIG_KIND_LIB: return " Read once, when that library is first opened.";
    default: return "";
    }
}

/* The rows of audience a or b: variables, or (switches) the developer switches' keys in FLCE_DEV. */
static void table(text *t, config_audience a, config_audience b, int switches)
{
    const config_setting *rows = config_settings();
    put(t, "| %s | Values | Default | Effect |\n|---|---|---|---|\n", switches ? "Key in `FLCE_DEV`" : "Variable");
    for (int i = 0; i < CONFIG_COUNT; i++) {
        if (rows[i].audience != a && rows[i].audience != b) continue;
        if (config_is_dev_switch(&rows[i]) != switches) continue;
        char values[256], def[256];
        config_setting_values(&rows[i], values, sizeof values);
        config_setting_default(&rows[i], def, sizeof def);
        put(t, "| `%s` | %s | %s | %s%s |\n", rows[i].name, values, def, rows[i].effect, when_read(&rows[i]));
    }
}

/* The generated section, markers included. */
static void section(text *t)
{
    const config_setting *rows = config_settings();
    put(t, "%s: edit the table, then `test_settings_doc --write README.md` -->\n\n", BEGIN_MARK);
    put(t, "### Settings\n\n");
    table(t, CONFIG_AUDIENCE_USER, CONFIG_AUDIENCE_USER, 0);
    put(t, "\n### Developer switches\n\n");
    put(t, "Algorithm variants kept for side-by-side measurements (`bench/NOTES.md`) and the tests that run "
           "the other path; each default is the measured choice. Not settings for production: they may "
           "go when the variant that lost is removed.\n\n");
    put(t, "All of them are one variable, `FLCE_DEV`: comma-separated `key=value` items with the keys below "
           "(`FLCE_DEV=tma=0,grad_streams=off`; blanks around an item are ignored, a later item wins; on/off "
           "values take the settings' words). A key that is not below, or a value that does not parse, is a "
           "warning under `FLCE_LOG=warn` naming it, and the switch keeps its default. `FLCE_LOG=info` "
           "prints each switch (`config: FLCE_DEV tma=off`). Each switch had its own variable before "
           "2026-11-28 (`FLCE_TMA=0`, the key in capitals): these are still read in this release, each with "
           "a warning naming its `FLCE_DEV` spelling (`FLCE_DEV` wins where both set a switch), and go in "
           "the next.\n\n");
    table(t, CONFIG_AUDIENCE_DEV, CONFIG_AUDIENCE_TEST, 0);
    put(t, "\n");
    table(t, CONFIG_AUDIENCE_DEV, CONFIG_AUDIENCE_DEV, 1);
    put(t, "\n### System variables\n\nRead to derive defaults, never set by flce.\n\n");
    put(t, "| Variable | Used for |\n|---|---|\n");
    for (int i = 0; i < CONFIG_COUNT; i++)
        if (rows[i].kind == CONFIG_KIND_SYS) put(t, "| `%s` | %s |\n", rows[i].name, rows[i].effect);
    put(t, "\n%s\n", END_MARK);
}

/* The section's start and end (past the end marker's line) in readme, or 0. */
static int find_section(const char *readme, const char **begin, const char **end)
{
    *begin = strstr(readme, BEGIN_MARK);
    const char *e = *begin ? strstr(*begin, END_MARK) : NULL;
    if (!e) return 0;
    e += strlen(END_MARK);
    if (*e == '\n') e++;
    *end = e;
    return 1;
}

static int write_readme(const char *path)
{
    size_t len = 0;
    char *readme = host_read_file(path, &len);
    const char *b, *e;
    if (!readme || !find_section(readme, &b, &e)) {
        fprintf(stderr, "%s: no section between '%s' and '%s'\n", path, BEGIN_MARK, END_MARK);
        return 1;
    }
    text t = {0};
    section(&t);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(readme, 1, (size_t)(b - readme), f) == (size_t)(b - readme) &&
             fwrite(t.s, 1, t.n, f) == t.n && fwrite(e, 1, strlen(e), f) == strlen(e);
    ok = f && !fclose(f) && ok;
    free(readme), free(t.s);
    return ok ? 0 : 1;
}

static const char *readme_path, *source_dir;

static void readme_section_is_the_table(void)
{
    size_t len = 0;
    char *readme = host_read_file(readme_path, &len);
    const char *b = NULL, *e = NULL;
    CHECKF(readme && find_section(readme, &b, &e), "%s: no generated settings section", readme_path);
    if (!b) {
        free(readme);
        return;
    }
    text t = {0};
    section(&t);
    size_t have = (size_t)(e - b);
    int same = have == t.n && !memcmp(b, t.s, t.n);
    if (!same) { /* the first line that differs */
        size_t i = 0, line = 1, start = 0;
        while (i < have && i < t.n && b[i] == t.s[i])
            if (b[i++] == '\n') line++, start = i;
        fprintf(stderr, "README line %zu of the section differs from the table:\n  README: %.200s\n  table:  %.200s\n",
                line, b + start, t.s + start);
    }
    CHECKF(same, "README.md's settings section is not the table's: run `test_settings_doc --write %s`", readme_path);
    free(readme), free(t.s);
}

/* Every row says what it takes, its default and its effect; names are unique, our variables start
 * FLCE_ and the developer switches' keys are lowercase (never a template macro's spelling). */
static void every_row_is_complete(void)
{
    const config_setting *rows = config_settings();
    for (int i = 0; i < CONFIG_COUNT; i++) {
        char values[256], def[256];
        config_setting_values(&rows[i], values, sizeof values);
        config_setting_default(&rows[i], def, sizeof def);
        int sys = rows[i].kind == CONFIG_KIND_SYS;
        CHECKF(sys || (*values && *def), "%s: no values or default words", rows[i].name);
        CHECKF(rows[i].effect && *rows[i].effect, "%s: no effect", rows[i].name);
        CHECKF(sys == (rows[i].audience == CONFIG_AUDIENCE_SYSTEM), "%s: a system variable is SYS/SYSTEM", rows[i].name);
        if (config_is_dev_switch(&rows[i]))
            CHECKF(strspn(rows[i].name, "abcdefghijklmnopqrstuvwxyz0123456789_") == strlen(rows[i].name),
                   "%s: a developer switch's key is lowercase", rows[i].name);
        else
            CHECKF(sys != !strncmp(rows[i].name, "FLCE_", 5), "%s: ours start FLCE_, system ones do not", rows[i].name);
        for (int k = 0; k < i; k++) CHECKF(strcmp(rows[i].name, rows[k].name), "%s: two rows", rows[i].name);
    }
}

/* Counts "getenv(" in the C files of dir (relative to the source dir) other than `allowed`. */
static int stray_getenv(const char *dir, const char *allowed)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", source_dir, dir);
    DIR *d = opendir(path);
    CHECKF(d != NULL, "cannot list %s", path);
    if (!d) return 1;
    int stray = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 3 || (strcmp(e->d_name + n - 2, ".c") && strcmp(e->d_name + n - 2, ".h"))) continue;
        char file[4400], rel[4400];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
        if (allowed && !strcmp(rel, allowed)) continue;
        size_t len = 0;
        char *s = host_read_file(file, &len);
        if (s && strstr(s, "getenv(")) {
            fprintf(stderr, "%s calls getenv: read the environment through config_env (runtime/config.h)\n", rel);
            stray++;
        }
        free(s);
    }
    closedir(d);
    return stray;
}

static void the_library_reads_its_environment_in_config_c_alone(void)
{
    int stray = stray_getenv("include", NULL) + stray_getenv("base", NULL) + stray_getenv("generator", NULL) +
                stray_getenv("runtime", "runtime/config.c");
    CHECKF(stray == 0, "%d library file(s) call getenv outside runtime/config.c", stray);
}

/* Calls fn(rel, text) for each file of dir (relative to the source dir) whose name ends in one of
 * the suffixes (a "|"-separated list). */
static void each_file(const char *dir, const char *suffixes, void (*fn)(const char *rel, const char *text))
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", source_dir, dir);
    DIR *d = opendir(path);
    if (!d) return; /* a folder this checkout lacks */
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        int match = 0;
        for (const char *p = suffixes; *p;) {
            size_t k = strcspn(p, "|");
            match |= n > k && !strncmp(e->d_name + n - k, p, k);
            p += k + (p[k] == '|');
        }
        if (!match) continue;
        char file[4400], rel[4400];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *text = host_read_file(file, &len);
        if (text) fn(rel, text);
        free(text);
    }
    closedir(d);
}

static void from_env(void *arg) { config_from_env(arg); }

/* Each FLCE_DEV=... a test, script or tool sets holds only switches the library knows, with values
 * it takes (a misspelt key is only a warning, and a GPU test run on the default path cannot fail);
 * and none sets a switch's retired variable (FLCE_TMA=0, "FLCE_TMA"), which goes next release.
 * test_config.c writes bad items and retired variables on purpose (and this file names them);
 * kernel_diff_dump.c sets FLCE_TMA for trees older than FLCE_DEV. */
static void check_dev_settings(const char *rel, const char *text)
{
    if (!strcmp(rel, "tests/test_config.c") || !strcmp(rel, "tools/kernel_diff_dump.c") ||
        !strcmp(rel, "tests/test_settings_doc.c"))
        return;
    for (const char *p = text; (p = strstr(p, "FLCE_DEV="));) {
        p += strlen("FLCE_DEV=");
        char value[256];
        size_t n = strcspn(p, " \t\n\"'`);:|]}\\"); /* where a value ends in prose, code or CMake */
        while (n && p[n - 1] == '.') n--; /* the end of a sentence */
        snprintf(value, sizeof value, "%.*s", (int)(n < 255 ? n : 255), p);
        setenv("FLCE_DEV", value, 1); /* as a user's shell would: the environment's parser is what is checked */
        flce_config c;
        const char *warned = capture_stderr("warn", from_env, &c);
        CHECKF(!*warned, "%s: FLCE_DEV=%s: %s", rel, value, warned);
    }
    unsetenv("FLCE_DEV");
    const config_setting *rows = config_settings();
    for (int i = 0; i < CONFIG_COUNT; i++) {
        if (!config_is_dev_switch(&rows[i])) continue;
        char legacy[64], assign[80], quoted[80];
        config_dev_legacy_name(&rows[i], legacy, sizeof legacy);
        snprintf(assign, sizeof assign, "%s=", legacy);
        snprintf(quoted, sizeof quoted, "\"%s\"", legacy);
        CHECKF(!strstr(text, assign) && !strstr(text, quoted), "%s sets %s: write FLCE_DEV=%s=...", rel, legacy,
               rows[i].name);
    }
}

static void tests_scripts_and_tools_set_only_known_dev_switches(void)
{
    each_file("tests", ".c|.h|.sh|.txt|.cmake", check_dev_settings);
    each_file("tools", ".c|.h|.sh|.py", check_dev_settings);
    each_file("bench", ".c|.sh|.py", check_dev_settings);
    each_file("python", ".py|.sh", check_dev_settings);
    each_file("python/flce", ".py", check_dev_settings);
    each_file("fuzz", ".c|.h|.sh|.py", check_dev_settings);
    each_file("examples", ".c|.h|.sh|.py", check_dev_settings);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--print")) {
        text t = {0};
        section(&t);
        fwrite(t.s, 1, t.n, stdout);
        free(t.s);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--write")) return write_readme(argv[2]);
    if (argc != 3) {
        fprintf(stderr, "usage: test_settings_doc README.md SRCDIR | --print | --write README.md\n");
        return 2;
    }
    readme_path = argv[1], source_dir = argv[2];
    RUN(every_row_is_complete);
    RUN(readme_section_is_the_table);
    RUN(the_library_reads_its_environment_in_config_c_alone);
    RUN(tests_scripts_and_tools_set_only_known_dev_switches);
    FINISH();
}
