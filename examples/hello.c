/* hello.c — the smallest program against an installed flce (issue 17). Describes a problem,
 * checks it (no GPU needed), and asks a GPU, if there is one, how much workspace it takes.
 * Without a GPU (or driver) it says so in one line and still exits 0: everything before the
 * context ran on the CPU, which is what a check of an installation needs.
 *   cmake:       see CMakeLists.txt here (find_package(flce CONFIG REQUIRED))
 *   pkg-config:  the README's line, which tests/install_consume.cmake runs as written:
 *     cc hello.c $(pkg-config --cflags --libs flce) -Wl,-rpath,$(pkg-config --variable=libdir flce) -o hello
 *   (-Wl,-rpath: ./hello finds libflce.so.0 in the prefix without LD_LIBRARY_PATH) */
#include <flce.h>
#include <stdio.h>

int main(void)
{
    printf("flce %s (header %s)\n", flce_version(), FLCE_VERSION_STRING);

    flce_problem problem;
    flce_problem_init(&problem);
    problem.tokens = 4096, problem.hidden = 2048, problem.vocab_shard = 32000;
    problem.dtype = FLCE_DTYPE_BF16;
    if (flce_problem_validate(&problem) != FLCE_OK) {
        fprintf(stderr, "invalid problem: %s\n", flce_last_error());
        return 1;
    }
    printf("problem %lldx%lldx%lld: valid\n", (long long)problem.tokens, (long long)problem.hidden,
           (long long)problem.vocab_shard);

    /* A deliberately bad one: the message names the field and the value. */
    flce_problem bad = problem;
    bad.hidden = 1001;
    flce_status st = flce_problem_validate(&bad);
    printf("hidden=1001: %s: %s\n", flce_status_name(st), flce_last_error());
    if (st == FLCE_OK) return 1;

    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) {
        printf("no GPU, so no workspace size (the calls that run kernels need one): %s\n", flce_last_error());
        return 0;
    }
    uint64_t bytes = 0;
    if (flce_workspace_size(ctx, &problem, FLCE_OP_LOSS_AND_GRAD, &bytes) != FLCE_OK) {
        fprintf(stderr, "flce_workspace_size: %s\n", flce_last_error());
        flce_context_destroy(ctx);
        return 1;
    }
    printf("workspace for loss and gradients: %.1f MiB\n", bytes / 1048576.0);
    flce_context_destroy(ctx);
    return 0;
}
