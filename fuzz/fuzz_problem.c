/*
 * fuzz_problem.c — libFuzzer target over the problem → plan → spec → source path: the input
 * (layout in problem_input.h) becomes an flce_problem and a kernel_spec, which go through
 * flce_problem_validate, plan_make (runtime/plan.h), spec_validate and emit_source
 * (generator/emit.h).
 *
 * Invariants (a broken one aborts):
 *  - every call returns FLCE_OK or a known status with a non-empty message (never INTERNAL);
 *  - plan_make on a valid problem: chunk_rows in [1, N], chunks and vocab splits cover N and V,
 *    every workspace region is 256-aligned, inside workspace_bytes, with no 64-bit wrap, and no
 *    two regions overlap (except dZ written over Z for fp32, which is the design);
 *  - on a supported arch, each of the plan's four specs passes spec_validate (the dispatcher
 *    never picks a spec it would then reject);
 *  - emit_source agrees with spec_validate, and its source is non-empty and holds
 *    "#define FLCE_GENERATED 1".
 * ASan and UBSan (the libFuzzer build) add: no memory error, no signed overflow, no bad shift.
 */
#include <string.h>

#include "emit.h"
#include "fuzz.h"
#include "problem_input.h"

typedef struct region {
    const char *name;
    uint64_t off, bytes;
    int used, overflow;
} region;

/* a·b·c in 64 bits; *overflow set when the true product does not fit (the plan would then
 * report a wrapped workspace size and the kernels would write past the caller's buffer). */
static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c, int *overflow)
{
    uint64_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) {
        *overflow = 1;
        return 0;
    }
    return abc;
}

static void add_region(region *r, int *n, const char *name, uint64_t off, uint64_t a, uint64_t b,
                       uint64_t c, int used)
{
    region *x = &r[(*n)++];
    memset(x, 0, sizeof *x);
    x->name = name;
    x->off = off;
    x->used = used;
    x->bytes = mul3(a, b, c, &x->overflow);
}

/* The workspace layout plan.h promises, recomputed from the plan's own shape fields. */
static void check_layout(const flce_problem *p, const plan *pl)
{
    region r[9];
    int n = 0, grads = pl->op != FLCE_OP_FORWARD;
    uint64_t rows = (uint64_t)pl->chunk_rows, tokens = (uint64_t)pl->n;
    uint64_t splits = (uint64_t)pl->splits, ldz = (uint64_t)pl->ldz;
    add_region(r, &n, "count", pl->off_count, 16, 1, 1, 1);
    add_region(r, &n, "target", pl->off_target, rows, 4, 1, 1);
    add_region(r, &n, "part_m", pl->off_part_m, rows, splits, 4, 1);
    add_region(r, &n, "part_s", pl->off_part_s, rows, splits, 4, 1);
    add_region(r, &n, "loss_rows", pl->off_loss_rows, tokens, 4, 1, pl->need_loss_rows);
    add_region(r, &n, "lse", pl->off_lse, tokens, 4, 1, pl->need_lse);
    add_region(r, &n, "z", pl->off_z, rows, ldz, 4, grads);
    /* fp32: dZ overwrites Z in place (plan.c), so it is not a region of its own. */
    add_region(r, &n, "dz", pl->off_dz, rows, ldz, 2, grads && p->dtype != FLCE_DTYPE_F32);
    add_region(r, &n, "dw_acc", pl->off_dw_acc, (uint64_t)pl->v, (uint64_t)pl->d, 4,
               pl->need_dw_acc);
    for (int i = 0; i < n; i++) {
        if (!r[i].used) continue;
        FUZZ_REQUIRE(!r[i].overflow,
                     "region %s: size overflows 64 bits (N=%lld D=%lld V=%lld chunk=%lld); "
                     "workspace_bytes=%llu has wrapped",
                     r[i].name, (long long)pl->n, (long long)pl->d, (long long)pl->v,
                     (long long)pl->chunk_rows, (unsigned long long)pl->workspace_bytes);
        FUZZ_REQUIRE(r[i].off % 256 == 0, "region %s at %llu: not 256-aligned", r[i].name,
                     (unsigned long long)r[i].off);
        FUZZ_REQUIRE(r[i].off <= pl->workspace_bytes &&
                         r[i].bytes <= pl->workspace_bytes - r[i].off,
                     "region %s [%llu, +%llu) ends past workspace_bytes=%llu", r[i].name,
                     (unsigned long long)r[i].off, (unsigned long long)r[i].bytes,
                     (unsigned long long)pl->workspace_bytes);
        for (int j = 0; j < i; j++) {
            if (!r[j].used) continue;
            int apart = r[i].off + r[i].bytes <= r[j].off || r[j].off + r[j].bytes <= r[i].off;
            FUZZ_REQUIRE(apart, "regions %s [%llu, +%llu) and %s [%llu, +%llu) overlap",
                         r[i].name, (unsigned long long)r[i].off,
                         (unsigned long long)r[i].bytes, r[j].name,
                         (unsigned long long)r[j].off, (unsigned long long)r[j].bytes);
        }
    }
}

static void check_plan(const problem_case *c, const plan *pl)
{
    const flce_problem *p = &c->problem;
    FUZZ_REQUIRE(pl->n == p->tokens && pl->d == p->hidden && pl->v == p->vocab_shard,
                 "plan shape %lld×%lld×%lld differs from the problem", (long long)pl->n,
                 (long long)pl->d, (long long)pl->v);
    FUZZ_REQUIRE(pl->chunk_rows >= 1 && pl->chunk_rows <= pl->n, "chunk_rows=%lld with N=%lld",
                 (long long)pl->chunk_rows, (long long)pl->n);
    FUZZ_REQUIRE(pl->n_chunks == (pl->n - 1) / pl->chunk_rows + 1,
                 "n_chunks=%lld: %lld chunks of %lld rows do not cover N=%lld exactly",
                 (long long)pl->n_chunks, (long long)pl->n_chunks, (long long)pl->chunk_rows,
                 (long long)pl->n);
    FUZZ_REQUIRE(pl->ldz >= pl->v && pl->ldz % 8 == 0 && pl->ldz - pl->v < 8, "ldz=%lld for V=%lld",
                 (long long)pl->ldz, (long long)pl->v);
    int64_t bn = pl->logits.tile.bn > 0 ? pl->logits.tile.bn : 1;
    int64_t tiles = (pl->v - 1) / bn + 1;
    FUZZ_REQUIRE(pl->splits >= 1 && pl->tiles_per_split >= 1 &&
                     (int64_t)pl->splits * pl->tiles_per_split >= tiles &&
                     (int64_t)(pl->splits - 1) * pl->tiles_per_split < tiles,
                 "splits=%d × tiles_per_split=%d for %lld vocab tiles", pl->splits,
                 pl->tiles_per_split, (long long)tiles);
    check_layout(p, pl);
    if (!spec_arch_supported(c->sm)) return;
    const kernel_spec *specs[4] = {&pl->logits, &pl->dh, &pl->dw, &pl->rowops};
    for (int i = 0; i < 4; i++) {
        err_clear();
        flce_status st = spec_validate(specs[i]);
        FUZZ_REQUIRE(st == FLCE_OK, "the plan's %s spec fails validation: %s",
                     spec_role_name(specs[i]->role), err_message());
    }
}

/* flce_problem_validate sees exactly struct_size bytes (at least its first field), as a caller
 * compiled against another flce.h would pass, so ASan catches a read past what the caller has. */
static flce_status validate_as_caller(const flce_problem *p)
{
    size_t have = p->struct_size;
    if (have < sizeof p->struct_size) have = sizeof p->struct_size;
    if (have > sizeof *p + 64) have = sizeof *p + 64; /* a "newer" caller's extra fields */
    unsigned char *buf = calloc(1, have);
    if (!buf) return FLCE_OK; /* the fuzzer's own malloc limit: nothing to check */
    memcpy(buf, p, have < sizeof *p ? have : sizeof *p);
    err_clear();
    flce_status st = flce_problem_validate((const flce_problem *)(void *)buf);
    free(buf);
    return st;
}

static void check_spec(const kernel_spec *s)
{
    err_clear();
    flce_status valid = spec_validate(s);
    fuzz_check_status(valid, "spec_validate");
    static char sentinel;
    char *src = &sentinel; /* emit_source must set *src on every path */
    err_clear();
    flce_status st = emit_source(s, &src);
    fuzz_check_status(st, "emit_source");
    FUZZ_REQUIRE(st == valid, "emit_source returned %s but spec_validate %s", flce_status_name(st),
                 flce_status_name(valid));
    if (st != FLCE_OK) {
        FUZZ_REQUIRE(src == NULL, "emit_source failed but left *src set");
        return;
    }
    FUZZ_REQUIRE(src && src[0], "emit_source succeeded with an empty source");
    FUZZ_REQUIRE(strstr(src, "#define FLCE_GENERATED 1\n") != NULL,
                 "emitted source lacks #define FLCE_GENERATED 1");
    free(src);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    problem_case c;
    problem_case_decode(data, size, &c);
    flce_status st = validate_as_caller(&c.problem);
    fuzz_check_status(st, "flce_problem_validate");
    if (st == FLCE_OK) {
        flce_tensors storage;
        plan pl;
        err_clear();
        st = plan_make(&c.problem, c.op, c.sm, c.num_sms, problem_case_tensors(&c, &storage), &pl);
        fuzz_check_status(st, "plan_make");
        if (st == FLCE_OK) {
            check_plan(&c, &pl);
            problem_case_pick_spec(&c, &pl);
        }
    }
    check_spec(&c.spec);
    return 0;
}
