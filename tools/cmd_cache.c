/*
 * cmd_cache.c — the `flce cache` subcommand (see cmd_cache.h): lists the entries of the on-disk
 * kernel cache, prints its totals, prunes it to its size cap, or removes its files. The directory
 * is the one the library uses (cache_dir_writable: FLCE_CACHE_DIR, XDG_CACHE_HOME, HOME, or the
 * private temp directory it falls back to) unless --dir names another.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_cache.h"
#include "cmd_gen.h" /* the command line: tool_cli, tool_misuse */
#include "flce.h"
#include "tool_api.h"

static const char cmd_cache_usage[] =
    "usage: flce cache ls|stats|prune|clear [options]\n"
    "Looks after the on-disk cache of compiled kernels (the autotune table in the same directory\n"
    "is left alone). No GPU needed.\n"
    "  ls     one line per entry: file, bytes, ok/invalid, the first line of its key\n"
    "  stats  directory, entries, total bytes, size cap, invalid entries, temporary and lock files,\n"
    "         and the counters every process that used the directory left in its stats.log:\n"
    "         kernel lookups, hits, misses, compiles and their NVRTC seconds (wall and CPU), waits\n"
    "         for another process's compile, evictions\n"
    "  prune  remove invalid entries, and temporary and lock files left by killed processes (older\n"
    "         than 10 minutes), then the least recently used entries until the rest fit the cap\n"
    "  clear  remove every cache entry, temporary and lock file, and the counters (nothing else)\n"
    "\n"
    "Options (default in brackets):\n"
    "  --dir DIR      the cache directory [$FLCE_CACHE_DIR, else $XDG_CACHE_HOME/flce, else\n"
    "                 ~/.cache/flce]\n"
    "  --max-mib N    prune's size cap in MiB, 0: no eviction [$FLCE_CACHE_MAX_MIB, else 2048]\n"
    "  --json         stats as one JSON object\n"
    "  -h, --help     this text\n"
    "\n"
    "Examples:\n"
    "  flce cache stats\n"
    "  flce cache prune --max-mib 512 --dir /shared/flce-cache\n"
    "\n"
    "Exit status: 0 done, 1 a file or directory could not be read or removed, 2 a usage error.\n";

static int cmd_cache_fail(void)
{
    fprintf(stderr, "flce cache: %s\n", flce_last_error());
    return 1;
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

/* dir as a JSON string body (quotes, backslashes and control bytes escaped). */
static void cmd_cache_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static int cmd_cache_stats(const char *dir, int json)
{
    cache_stats st;
    cache_dir_counters c;
    if (cache_stat(dir, &st) != FLCE_OK) return cmd_cache_fail();
    if (cache_dir_counters_read(dir, &c) != FLCE_OK) return cmd_cache_fail();
    uint64_t cap = cache_max_bytes();
    if (json) {
        printf("{\"directory\": ");
        cmd_cache_json_str(dir);
        printf(", \"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"cap_bytes\": %" PRIu64
               ", \"invalid\": %" PRIu64 ", \"temp_files\": %" PRIu64 ", \"lock_files\": %" PRIu64
               ", \"lookups\": %" PRIu64 ", \"hits\": %" PRIu64 ", \"misses\": %" PRIu64
               ", \"waited\": %" PRIu64 ", \"compiles\": %" PRIu64
               ", \"compile_s\": %.3f, \"compile_cpu_s\": %.3f, \"wait_s\": %.3f, \"evicted\": %" PRIu64
               ", \"records\": %" PRIu64 "}\n",
               st.entries, st.bytes, cap, st.invalid, st.temp_files, st.lock_files, c.lookups,
               c.hits, c.misses, c.waited, c.compiles, c.compile_ms / 1e3, c.compile_cpu_ms / 1e3,
               c.wait_ms / 1e3, c.evicted, c.records);
        return 0;
    }
    printf("directory:   %s\n", dir);
    printf("entries:     %" PRIu64 "\n", st.entries);
    printf("total bytes: %" PRIu64 " (%.2f MiB)\n", st.bytes, (double)st.bytes / (1024.0 * 1024.0));
    if (cap) printf("size cap:    %" PRIu64 " MiB (FLCE_CACHE_MAX_MIB; least recently used entries go first)\n", cap >> 20);
    else printf("size cap:    none (FLCE_CACHE_MAX_MIB=0)\n");
    printf("invalid:     %" PRIu64 "\n", st.invalid);
    printf("temp files:  %" PRIu64 "\n", st.temp_files);
    printf("lock files:  %" PRIu64 "\n", st.lock_files);
    /* What every process that used this directory recorded (cache.h, "persistent counters"). */
    printf("lookups:     %" PRIu64 " kernels looked up by %" PRIu64 " process flush%s (since the "
           "last clear)\n", c.lookups, c.records, c.records == 1 ? "" : "es");
    printf("hits:        %" PRIu64 "%s\n", c.hits, c.lookups ? "" : " (FLCE_CACHE_STATS=0 turns counting off)");
    printf("misses:      %" PRIu64 ": %" PRIu64 " compiled, %" PRIu64
           " loaded after another process's compile\n", c.misses, c.compiles, c.waited);
    printf("compiles:    %" PRIu64 ", %.2f s of NVRTC in all%s", c.compiles, c.compile_ms / 1e3,
           c.compiles ? "" : "\n");
    if (c.compiles) printf(" (%.2f s each on average)\n", c.compile_ms / 1e3 / (double)c.compiles);
    /* Wall well above CPU: the compiles waited for cores. CPU far below a normal compile's: NVRTC's
     * own cache (CUDA_CACHE_PATH) served them (cache.h, compile_cpu_ms). */
    printf("compile cpu: %.2f s of the compiling threads' CPU time in all (compiles recorded by flce "
           "versions before this counter add none)\n", c.compile_cpu_ms / 1e3);
    printf("waits:       %.2f s waiting for other processes' compiles\n", c.wait_ms / 1e3);
    printf("evicted:     %" PRIu64 " entries for the size cap\n", c.evicted);
    return 0;
}

static double cmd_cache_mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static int cmd_cache_prune(const char *dir, uint64_t max_bytes)
{
    cache_prune_result r;
    flce_status status = cache_prune(dir, max_bytes, &r);
    /* Say what was removed even when the scan stopped early: that part did happen. */
    printf("removed %" PRIu64 " least recently used entr%s (%.2f MiB), %" PRIu64 " invalid, %" PRIu64
           " stale temporary and %" PRIu64 " stale lock file%s\n",
           r.evicted, r.evicted == 1 ? "y" : "ies", cmd_cache_mib(r.evicted_bytes), r.invalid_removed,
           r.temp_removed, r.locks_removed, r.locks_removed == 1 ? "" : "s");
    if (max_bytes)
        printf("%s: %" PRIu64 " entries, %.2f MiB (cap %" PRIu64 " MiB)\n", dir, r.entries,
               cmd_cache_mib(r.bytes), max_bytes >> 20);
    else
        printf("%s: %" PRIu64 " entries, %.2f MiB (no cap)\n", dir, r.entries, cmd_cache_mib(r.bytes));
    return status == FLCE_OK ? 0 : cmd_cache_fail();
}

static int cmd_cache_clear(const char *dir)
{
    uint64_t removed = 0;
    flce_status status = cache_clear(dir, &removed);
    /* Say what was removed even when some file could not be: that part did happen. */
    printf("removed %" PRIu64 " file%s from %s\n", removed, removed == 1 ? "" : "s", dir);
    return status == FLCE_OK ? 0 : cmd_cache_fail();
}

static const struct option cmd_cache_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"dir", required_argument, NULL, 'd'},
    {"max-mib", required_argument, NULL, 'm'},
    {"json", no_argument, NULL, 'j'},
    {NULL, 0, NULL, 0},
};

int cmd_cache(int argc, char **argv)
{
    const char *sub = NULL;
    const char *dir_opt = NULL;
    const char *max_opt = NULL;
    int json = 0;
    char dir[CACHE_PATH_MAX];
    tool_cli c;
    tool_cli_start(&c, "cache", argc, argv, cmd_cache_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        switch (v) {
        case TOOL_NEXT_HELP: fputs(cmd_cache_usage, stdout); return TOOL_EXIT_OK;
        case TOOL_NEXT_BAD: return TOOL_EXIT_USAGE;
        case TOOL_NEXT_WORD:
            if (sub) return tool_misuse(c.cmd, "unexpected argument '%s' (after '%s')", c.arg, sub);
            sub = c.arg;
            break;
        case 'd': dir_opt = c.arg; break;
        case 'm': max_opt = c.arg; break;
        case 'j': json = 1; break;
        }
    }
    if (!sub) return tool_misuse(c.cmd, "a subcommand is needed: ls, stats, prune or clear");
    if (strcmp(sub, "ls") && strcmp(sub, "stats") && strcmp(sub, "prune") && strcmp(sub, "clear"))
        return tool_misuse(c.cmd, "unknown subcommand '%s' (ls, stats, prune or clear)", sub);
    if (json && strcmp(sub, "stats")) return tool_misuse(c.cmd, "--json is for stats");
    uint64_t max_bytes = cache_max_bytes();
    if (max_opt) {
        int64_t mib;
        if (strcmp(sub, "prune")) return tool_misuse(c.cmd, "--max-mib is prune's");
        if (!tool_int(c.cmd, "max-mib", max_opt, 0, INT64_MAX >> 20, &mib)) return TOOL_EXIT_USAGE;
        max_bytes = (uint64_t)mib << 20;
    }
    if (dir_opt) {
        if (!*dir_opt) return tool_misuse(c.cmd, "--dir needs a directory");
        if (snprintf(dir, sizeof dir, "%s", dir_opt) >= (int)sizeof dir)
            return tool_misuse(c.cmd, "--dir: the directory name is too long");
    } else if (cache_dir_writable(dir, sizeof dir) != FLCE_OK) {
        return cmd_cache_fail();
    }
    if (!strcmp(sub, "ls")) return cmd_cache_ls(dir);
    if (!strcmp(sub, "stats")) return cmd_cache_stats(dir, json);
    if (!strcmp(sub, "prune")) return cmd_cache_prune(dir, max_bytes);
    return cmd_cache_clear(dir);
}
