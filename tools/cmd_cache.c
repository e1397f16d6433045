/*
 * cmd_cache.c — the `flce cache` subcommand (see cmd_cache.h): lists the entries of the on-disk
 * kernel cache, prints its totals, or removes its files. The directory is the one the library
 * uses (cache_dir: FLCE_CACHE_DIR, XDG_CACHE_HOME, HOME) unless --dir names another.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "cmd_cache.h"
#include "flce.h"

static const char cmd_cache_usage[] =
    "usage: flce cache ls|stats|clear [--dir DIR]\n"
    "  ls     one line per entry: file, bytes, ok/invalid, the key's first line\n"
    "  stats  directory, entries, total bytes, invalid entries, temporary files\n"
    "  clear  remove every cache entry and temporary file (nothing else)\n"
    "  --dir  use DIR instead of $FLCE_CACHE_DIR, $XDG_CACHE_HOME/flce, ~/.cache/flce\n";

static int cmd_cache_fail(void)
{
    fprintf(stderr, "flce cache: %s\n", flce_last_error());
    return 1;
}

static int cmd_cache_misuse(const char *why, const char *arg)
{
    if (why) fprintf(stderr, "flce cache: %s%s%s\n", why, arg ? ": " : "", arg ? arg : "");
    fputs(cmd_cache_usage, stderr);
    return 2;
}

static void cmd_cache_print_entry(void *user, const char *file_name, uint64_t bytes, int valid,
                                  const char *key_head)
{
    (void)user;
    printf("%s %12" PRIu64 " %s%s%s\n", file_name, bytes, valid ? "ok     " : "invalid",
           *key_head ? " " : "", key_head);
}

static int cmd_cache_ls(const char *dir)
{
    if (cache_list(dir, cmd_cache_print_entry, NULL) != FLCE_OK) return cmd_cache_fail();
    return 0;
}

static int cmd_cache_stats(const char *dir)
{
    cache_stats st;
    if (cache_stat(dir, &st) != FLCE_OK) return cmd_cache_fail();
    printf("directory:   %s\n", dir);
    printf("entries:     %" PRIu64 "\n", st.entries);
    printf("total bytes: %" PRIu64 " (%.2f MiB)\n", st.bytes, (double)st.bytes / (1024.0 * 1024.0));
    printf("invalid:     %" PRIu64 "\n", st.invalid);
    printf("temp files:  %" PRIu64 "\n", st.temp_files);
    return 0;
}

static int cmd_cache_clear(const char *dir)
{
    uint64_t removed = 0;
    flce_status status = cache_clear(dir, &removed);
    /* Say what was removed even when some file could not be: that part did happen. */
    printf("removed %" PRIu64 " file%s from %s\n", removed, removed == 1 ? "" : "s", dir);
    return status == FLCE_OK ? 0 : cmd_cache_fail();
}

int cmd_cache(int argc, char **argv)
{
    const char *sub = NULL;
    const char *dir_opt = NULL;
    char dir[CACHE_PATH_MAX];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(cmd_cache_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--dir")) {
            if (++i == argc) return cmd_cache_misuse("--dir needs a directory", NULL);
            dir_opt = argv[i];
        } else if (!strncmp(argv[i], "--dir=", 6)) {
            dir_opt = argv[i] + 6;
        } else if (argv[i][0] == '-' || sub) {
            return cmd_cache_misuse("unexpected argument", argv[i]);
        } else {
            sub = argv[i];
        }
    }
    if (!sub) return cmd_cache_misuse(NULL, NULL);
    if (strcmp(sub, "ls") && strcmp(sub, "stats") && strcmp(sub, "clear"))
        return cmd_cache_misuse("unknown subcommand", sub);
    if (dir_opt) {
        if (!*dir_opt) return cmd_cache_misuse("--dir needs a directory", NULL);
        if (snprintf(dir, sizeof dir, "%s", dir_opt) >= (int)sizeof dir)
            return cmd_cache_misuse("directory name too long", NULL);
    } else if (cache_dir(dir, sizeof dir) != FLCE_OK) {
        return cmd_cache_fail();
    }
    if (!strcmp(sub, "ls")) return cmd_cache_ls(dir);
    if (!strcmp(sub, "stats")) return cmd_cache_stats(dir);
    return cmd_cache_clear(dir);
}
