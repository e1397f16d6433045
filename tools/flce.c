/* flce.c — the `flce` command-line tool: demo (the main job), bench, fuzz, tune, gen, warmup, cache,
 * info. */
#include <stdio.h>
#include <string.h>

#include "cmd_cache.h"
#include "cmd_gen.h"
#include "comm.h"
#include "devmem.h"
#include "nvrtc_compile.h"
#include "tune_table.h"

int cmd_bench(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_fuzz(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_warmup(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "flce %s — fused linear + cross-entropy on NVIDIA GPUs\n"
            "usage: flce <command> [options]\n"
            "  demo    loss and gradients on random data, checked and timed (compiles only, without a GPU)\n"
            "  bench   time and check every strategy on the issue's shapes (--list: the plans, no GPU)\n"
            "  fuzz    random problems on the GPU against the fp64 reference (--seed S --case K reruns one)\n"
            "  tune    time the candidate tiles of a problem class on the GPU, store the winner\n"
            "          in the autotune table (--dry-run: list and compile them, no GPU)\n"
            "  gen     print the generated CUDA source of a problem's kernels (--compile to build them)\n"
            "  warmup  compile into the disk cache every kernel of an op on given shapes (no GPU needed)\n"
            "  cache   ls | stats | prune | clear the on-disk kernel cache\n"
            "  info    versions, GPU and cache directory\n"
            "Set FLCE_LOG=info to see each compile and cache hit.\n",
            flce_version());
}

static int cmd_info(void)
{
    char nccl[4096];
    printf("flce %s\n", flce_version());
    if (nvrtc_load_error()) printf("%s\n", nvrtc_load_error());
    else if (nvrtc_library_file()) printf("NVRTC %s (%s)\n", nvrtc_version_text(), nvrtc_library_file());
    else printf("NVRTC %s\n", nvrtc_version_text());
    printf("%s\n", comm_nccl_version(nccl, sizeof nccl));
    char table[4096];
    if (tune_table_path(table, sizeof table) == FLCE_OK) printf("autotune table: %s\n", table);
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

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "fuzz")) return cmd_fuzz(argc - 1, argv + 1);
    if (!strcmp(cmd, "tune")) return cmd_tune(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen")) return cmd_gen(argc - 1, argv + 1);
    if (!strcmp(cmd, "warmup")) return cmd_warmup(argc - 1, argv + 1);
    if (!strcmp(cmd, "cache")) return cmd_cache(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) {
        if (argc > 2 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"))) {
            printf("usage: flce info\nPrints the versions of flce, NVRTC and NCCL, the autotune table, the GPUs\n"
                   "and what each one is (or why there is none).\n");
            return 0;
        }
        if (argc > 2) {
            fprintf(stderr, "flce info: unexpected argument '%s'\n", argv[2]);
            return 2;
        }
        return cmd_info();
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("flce %s\n", flce_version());
        return 0;
    }
    fprintf(stderr, "flce: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
