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
 *  - AUTO never refuses a problem that forcing CHUNKED would plan;
 *  - emit_source agrees with spec_validate, and its source is non-empty and holds
 *    "#define FLCE_GENERATED 1", with float constants that are C++ literals (no inf, nan).
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

/* The workspace layout plan.h promises, with each region's size recomputed from the plan's own
 * shape fields and flags (plan.c's plan_layout is the model). */
static void check_layout(const flce_problem *p, const plan *pl)
{
    region r[32];
    int n = 0, grads = pl->op != FLCE_OP_FORWARD, stats = pl->op != FLCE_OP_BACKWARD;
    uint64_t rows = (uint64_t)pl->stat_rows, tokens = (uint64_t)pl->n, sp = (uint64_t)pl->splits;
    uint64_t block = (uint64_t)pl->chunk_rows, ldz = (uint64_t)pl->ldz;
    uint64_t v = (uint64_t)pl->v, d = (uint64_t)pl->d;
    unsigned o = pl->logits.opts;
    add_region(r, &n, "stats", pl->off_stats, 16, 1, 1, 1);
    add_region(r, &n, "target", pl->off_target, rows, 4, 1, stats);
    add_region(r, &n, "part_m", pl->off_part_m, rows, sp, 4, stats);
    add_region(r, &n, "part_s", pl->off_part_s, rows, sp, 4, stats);
    add_region(r, &n, "part_t", pl->off_part_t, rows, sp, 4, stats && (o & SPEC_OPT_ENTROPY));
    add_region(r, &n, "part_zs", pl->off_part_zs, rows, sp, 4, stats && (o & SPEC_OPT_ZSUM));
    add_region(r, &n, "part_arg", pl->off_part_arg, rows, sp, 8, stats && (o & SPEC_OPT_ARGMAX));
    add_region(r, &n, "loss_rows", pl->off_loss_rows, tokens, 4, 1, pl->need_loss_rows);
    add_region(r, &n, "zloss_rows", pl->off_zloss_rows, tokens, 4, 1, pl->need_zloss_rows);
    add_region(r, &n, "lse", pl->off_lse, tokens, 4, 1, pl->need_lse);
    /* Recompute with the dZ epilogue (fused_dz) has no Z; otherwise fp32's dZ overwrites Z in place
     * (plan.c), so it is not a region of its own. */
    /* Compact logits (chunked, 16-bit) are 2 bytes each and become dZ in place, beside one fp32
     * maximum per (row, tile_cols group). */
    add_region(r, &n, "z", pl->off_z, block, ldz, pl->compact ? 2 : 4, grads && !pl->fused_dz);
    add_region(r, &n, "dz", pl->off_dz, block, ldz, p->dtype == FLCE_DTYPE_F32 ? 4 : 2,
               grads && (pl->fused_dz || (p->dtype != FLCE_DTYPE_F32 && !pl->compact)));
    add_region(r, &n, "tile_max", pl->off_tile_max, block, (uint64_t)pl->tile_max_ld, 4, grads && pl->compact);
    add_region(r, &n, "dw_acc", pl->off_dw_acc, v, d, 4, grads && pl->need_dw_acc);
    add_region(r, &n, "dh_acc", pl->off_dh_acc, tokens, d, 4, grads && pl->need_dh_acc);
    add_region(r, &n, "db_acc", pl->off_db_acc, v, 4, 1, grads && pl->need_db_acc);
    /* tensor parallelism: the all-gather blocks and the fp32 dH summed across ranks */
    add_region(r, &n, "dh_tp", pl->off_dh_tp, tokens, d, 4, grads && pl->need_dh_tp);
    add_region(r, &n, "tp_send", pl->off_tp_send, pl->tp_block_bytes, 1, 1, pl->collective && stats);
    add_region(r, &n, "tp_recv", pl->off_tp_recv, pl->tp_block_bytes, (uint64_t)pl->tp, 1, pl->collective && stats);
    /* sequence parallelism: gathered inputs and all-token outputs */
    uint64_t es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    static const char *const sp_names[SP_OUTPUTS] = {"sp_lse", "sp_loss", "sp_loss_per_token",
                                                     "sp_zloss", "sp_logprob", "sp_entropy", "sp_argmax"};
    add_region(r, &n, "sp_hidden", pl->off_sp_hidden, tokens, d, es, pl->sp);
    add_region(r, &n, "sp_labels", pl->off_sp_labels, tokens, (uint64_t)p->label_bits / 8, 1, pl->sp);
    add_region(r, &n, "sp_go", pl->off_sp_go, tokens, 4, 1, pl->sp && pl->off_sp_go);
    add_region(r, &n, "sp_lse_in", pl->off_sp_lse, tokens, 4, 1, pl->sp && pl->off_sp_lse);
    for (int k = 0; k < SP_OUTPUTS; k++)
        add_region(r, &n, sp_names[k], pl->off_sp_out[k], tokens, k == SP_ARGMAX ? 8 : 4, 1,
                   pl->sp && pl->off_sp_out[k]);
    for (int i = 0; i < n; i++) {
        if (!r[i].used) continue;
        FUZZ_REQUIRE(!r[i].overflow,
                     "region %s: size overflows 64 bits (N=%lld D=%lld V=%lld chunk=%lldx%lld); "
                     "workspace_bytes=%llu has wrapped",
                     r[i].name, (long long)pl->n, (long long)pl->d, (long long)pl->v,
                     (long long)pl->chunk_rows, (long long)pl->chunk_cols,
                     (unsigned long long)pl->workspace_bytes);
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

/* `chunks` pieces of `size` cover [0, total) exactly: none empty, none wholly past the end. */
static int covers(int64_t total, int64_t size, int64_t chunks)
{
    return size >= 1 && size <= total && chunks == (total - 1) / size + 1;
}

static void check_plan(const problem_case *c, const plan *pl)
{
    const flce_problem *p = &c->problem;
    /* under sequence parallelism the plan covers every rank's tokens */
    int64_t n_all = p->tp_size > 1 && p->sequence_parallel ? p->tokens * p->tp_size : p->tokens;
    FUZZ_REQUIRE(pl->n == n_all && pl->n_local == p->tokens && pl->d == p->hidden && pl->v == p->vocab_shard,
                 "plan shape %lld×%lld×%lld differs from the problem", (long long)pl->n,
                 (long long)pl->d, (long long)pl->v);
    FUZZ_REQUIRE(!pl->collective || pl->op == FLCE_OP_BACKWARD ||
                     pl->tp_block_bytes == plan_tp_block_bytes(pl->stat_rows),
                 "TP block of %llu bytes for %lld rows", (unsigned long long)pl->tp_block_bytes,
                 (long long)pl->stat_rows);
    FUZZ_REQUIRE(covers(pl->n, pl->chunk_rows, pl->n_chunks),
                 "%lld token chunks of %lld rows for N=%lld", (long long)pl->n_chunks,
                 (long long)pl->chunk_rows, (long long)pl->n);
    FUZZ_REQUIRE(covers(pl->v, pl->chunk_cols, pl->n_vchunks),
                 "%lld vocab chunks of %lld columns for V=%lld", (long long)pl->n_vchunks,
                 (long long)pl->chunk_cols, (long long)pl->v);
    FUZZ_REQUIRE(pl->ldz >= pl->chunk_cols && pl->ldz % 8 == 0 && pl->ldz - pl->chunk_cols < 8,
                 "ldz=%lld for %lld columns", (long long)pl->ldz, (long long)pl->chunk_cols);
    FUZZ_REQUIRE(pl->stat_rows >= 0 && pl->stat_rows <= pl->n, "stat_rows=%lld for N=%lld",
                 (long long)pl->stat_rows, (long long)pl->n);
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

/* AUTO may prefer a strategy, but must not refuse a problem that a strategy it could pick plans:
 * when AUTO fails, CHUNKED fails too. */
static void check_auto_refusal(const problem_case *c, const flce_tensors *t)
{
    if (c->problem.strategy != FLCE_STRATEGY_AUTO || c->op == FLCE_OP_FORWARD) return;
    char why[512];
    snprintf(why, sizeof why, "%s", err_message());
    flce_problem chunked = c->problem;
    chunked.strategy = FLCE_STRATEGY_CHUNKED;
    plan pl;
    err_clear();
    flce_status st = plan_make(&chunked, c->op, c->sm, c->num_sms, t, &pl);
    FUZZ_REQUIRE(st != FLCE_OK, "AUTO refuses a problem that CHUNKED plans (%lld chunks of %lld "
                 "rows): %s", (long long)pl.n_chunks, (long long)pl.chunk_rows, why);
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

/* The float constants of the preamble are C++ literals NVRTC accepts: printf's "inf" and "nan"
 * are not (the NVRTC compile itself is spec_compile.c's job, on the corpus). */
static void check_constants(const char *src)
{
    const char *end = strstr(src, "\n\n"); /* the preamble ends at its blank line */
    for (const char *line = src; line && (!end || line < end); line = strchr(line, '\n')) {
        if (*line == '\n') line++;
        if (strncmp(line, "constexpr float", 15) != 0) continue;
        size_t len = strcspn(line, "\n");
        for (size_t i = 0; i + 3 <= len; i++)
            FUZZ_REQUIRE(strncmp(line + i, "inf", 3) != 0 && strncmp(line + i, "nan", 3) != 0,
                         "preamble constant is not a literal: %.*s", (int)len, line);
    }
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
    check_constants(src);
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
        problem_case_normalize(&c);
        err_clear();
        const flce_tensors *t = problem_case_tensors(&c, &storage);
        st = plan_make(&c.problem, c.op, c.sm, c.num_sms, t, &pl);
        fuzz_check_status(st, "plan_make");
        if (st == FLCE_OK) {
            check_plan(&c, &pl);
            problem_case_pick_spec(&c, &pl);
        } else {
            check_auto_refusal(&c, t);
        }
    }
    check_spec(&c.spec);
    return 0;
}
