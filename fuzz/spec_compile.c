/*
 * spec_compile.c — the CTest fuzz_specs_from_corpus_compile: the fuzz_problem target checks that
 * every input yields a valid spec with a plausible source or a status in words, but compiling in
 * the fuzzer is far too slow. This closes the loop on the committed corpus: for the first
 * MAX_SPECS distinct specs that validate (entries in name order), the emitted source must compile with
 * NVRTC, through jit_build and the disk cache (FLCE_CACHE_DIR), like test_compile. No GPU needed.
 *
 *     fuzz_spec_compile <fuzz_problem corpus dir>
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corpus_file.h"
#include "jit.h"
#include "plan.h"
#include "problem_input.h"

/* About 0.1–0.6 s per NVRTC compile on one core: a dozen keep the test near 5 s cold, and a warm
 * cache makes it instant. */
#define MAX_SPECS 12

/* The spec fuzz_problem would emit for this input; 1 when it validates. */
static int corpus_spec(const char *path, kernel_spec *out)
{
    size_t size = 0;
    uint8_t *data = read_file(path, &size);
    if (!data) return 0;
    problem_case c;
    problem_case_decode(data, size, &c);
    free(data);
    if (flce_problem_validate(&c.problem) == FLCE_OK) {
        flce_tensors storage;
        plan pl;
        problem_case_normalize(&c);
        if (plan_make(&c.problem, c.op, c.sm, c.num_sms, problem_case_tensors(&c, &storage), &pl) ==
            FLCE_OK)
            problem_case_pick_spec(&c, &pl);
    }
    *out = c.spec;
    return spec_validate(&c.spec) == FLCE_OK;
}

/* Field by field (padding differs between copies): entries that differ only in fields a spec
 * ignores would compile the same source twice. */
static int spec_same(const kernel_spec *a, const kernel_spec *b)
{
    return a->sm == b->sm && a->dtype == b->dtype && a->hidden == b->hidden &&
           a->vocab_shard == b->vocab_shard && a->role == b->role && a->label_bits == b->label_bits &&
           a->reduction == b->reduction && a->tile.bm == b->tile.bm && a->tile.bn == b->tile.bn &&
           a->tile.bk == b->tile.bk && a->tile.stages == b->tile.stages &&
           a->tile.warps_m == b->tile.warps_m && a->tile.warps_n == b->tile.warps_n &&
           a->tile.loop == b->tile.loop &&
           a->opts == b->opts && a->softcap == b->softcap && a->temperature == b->temperature &&
           a->smoothing == b->smoothing && a->z_loss == b->z_loss;
}

/* crash_ entries reproduce validate/plan bugs (one divides by zero inside plan_make): they are
 * the replay's business, not sources to compile. */
static int skip_name(const struct dirent *de)
{
    return de->d_name[0] != '.' && strncmp(de->d_name, "crash_", 6) != 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <fuzz_problem corpus dir>\n", argv[0]);
        return 2;
    }
    struct dirent **names = NULL;
    int n = scandir(argv[1], &names, skip_name, alphasort);
    if (n < 0) {
        perror(argv[1]);
        return 1;
    }
    int passed = 0, failed = 0, done = 0;
    kernel_spec seen[MAX_SPECS];
    for (int i = 0; i < n; i++) {
        char path[4096], summary[256];
        kernel_spec s;
        int fresh = done < MAX_SPECS &&
                    snprintf(path, sizeof path, "%s/%s", argv[1], names[i]->d_name) <
                        (int)sizeof path &&
                    corpus_spec(path, &s);
        for (int j = 0; fresh && j < done; j++) fresh = !spec_same(&s, &seen[j]);
        if (fresh) {
            seen[done++] = s;
            spec_summary(&s, summary, sizeof summary);
            jit_result jr;
            if (jit_build(&s, &jr) == FLCE_OK) {
                passed++;
                printf("ok   %s: %s %zu-byte cubin in %.0f ms  %s\n", names[i]->d_name,
                       jr.origin == JIT_DISK_HIT ? "cached" : "compiled", jr.len, jr.ms, summary);
                free(jr.cubin);
            } else {
                failed++;
                printf("FAIL %s: %s\n%s\n", names[i]->d_name, summary, flce_last_error());
            }
            fflush(stdout);
        }
        free(names[i]);
    }
    free(names);
    if (passed + failed == 0) {
        printf("no entry of %s has a spec that validates\n", argv[1]);
        failed = 1;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
