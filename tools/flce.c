/* flce.c — the `flce` command-line tool: demo (the main job), bench, fuzz, tune, gen, warmup, cache,
 * info; the exit status of each is TOOL_EXIT_* (cmd_gen.h). */
#include <stdio.h>
#include <string.h>

#include "cmd_cache.h"
#include "cmd_gen.h"
#include "devmem.h"

int cmd_bench(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_fuzz(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_warmup(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "flce %s — fused linear + cross-entropy on NVIDIA GPUs\n"
            "usage: flce <command> [options]     (flce <command> --help: what it does, its options)\n"
            "  demo     loss and gradients on random data, checked against fp64 and timed\n"
            "           (compiles its kernels only, without a GPU)\n"
            "  bench    time and check every strategy on the issue's shapes (--list: the plans, no GPU)\n"
            "  fuzz     random problems on the GPU against the fp64 reference (--seed S --case K reruns one)\n"
            "  tune     time the candidate tiles of a problem class on the GPU, store the winner\n"
            "           in the autotune table (--dry-run: list and compile them, no GPU)\n"
            "  gen      print the generated CUDA source of a problem's kernels (--compile to build them)\n"
            "  warmup   compile into the disk cache every kernel of an op on given shapes (no GPU needed)\n"
            "  cache    ls | stats | prune | clear the on-disk kernel cache\n"
            "  info     versions, GPU and cache directory\n"
            "  version  the version (also --version)\n"
            "\n"
            "Exit status, every command:\n"
            "  0  done (and every check passed)\n"
            "  1  failed: a check, a compile, a file (the message says which)\n"
            "  2  usage error: unknown option, bad value, invalid problem (the message names it)\n"
            "  3  no GPU: bench, fuzz and tune found no usable GPU (no driver, no device, or a driver\n"
            "     that fails to start); demo then compiles its kernels and exits 0, and bench --list,\n"
            "     fuzz --list and tune --dry-run need none\n"
            "\n"
            "Set FLCE_LOG=info to see each compile and cache hit.\n",
            flce_version());
}

static int cmd_info(void)
{
    static flce_library_info lib; /* 12 KiB of text: off the stack */
    printf("flce %s\n", flce_version());
    flce_library_info_init(&lib);
    if (flce_library_info_get(&lib) == FLCE_OK) {
        printf("%s\n%s\n", lib.nvrtc, lib.nccl);
        if (lib.tune_table[0]) printf("autotune table: %s\n", lib.tune_table);
    }
    int n = devmem_gpu_count();
    if (n < 1) {
        printf("GPU: none (%s)\n", flce_last_error()[0] ? flce_last_error() : "no CUDA device");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        flce_context *ctx = NULL;
        int sm = 0;
        if (flce_context_create(i, &ctx) == FLCE_OK && flce_context_arch(ctx, &sm) == FLCE_OK)
            printf("GPU %d: sm_%d\n", i, sm);
        else
            printf("GPU %d: %s\n", i, flce_last_error());
        flce_context_destroy(ctx);
    }
    return 0;
}

static void info_usage(FILE *f)
{
    fprintf(f, "usage: flce info\n"
               "Prints the versions of flce, NVRTC and NCCL and the files they were loaded from (or where\n"
               "they were looked for), the autotune table's path, and each GPU with its arch (or why\n"
               "there is none). No GPU needed.\n"
               "\n"
               "Options:\n"
               "  -h, --help        this text\n"
               "\n"
               "Example:\n"
               "  flce info\n"
               "\n"
               "Exit status: 0 (also without a GPU: the last line says why), 2 a usage error.\n");
}

static const struct option info_options[] = {
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int cmd_info_args(int argc, char **argv)
{
    tool_cli c;
    tool_cli_start(&c, "info", argc, argv, info_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        if (v == TOOL_NEXT_HELP) return info_usage(stdout), TOOL_EXIT_OK;
        if (v == TOOL_NEXT_BAD) return TOOL_EXIT_USAGE;
        return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
    }
    return cmd_info();
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "fuzz")) return cmd_fuzz(argc - 1, argv + 1);
    if (!strcmp(cmd, "tune")) return cmd_tune(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen")) return cmd_gen(argc - 1, argv + 1);
    if (!strcmp(cmd, "warmup")) return cmd_warmup(argc - 1, argv + 1);
    if (!strcmp(cmd, "cache")) return cmd_cache(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info_args(argc - 1, argv + 1);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("flce %s\n", flce_version());
        return TOOL_EXIT_OK;
    }
    fprintf(stderr, "flce: unknown command '%s'\nTry 'flce --help'.\n", cmd);
    return TOOL_EXIT_USAGE;
}
