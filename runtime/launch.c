/* launch.c — the kernel sequences of forward, loss-and-grad and backward (see launch.h):
 *   forward:    prepare → logits (statistics) → combine → reduce
 *   chunked:    prepare → per token chunk: logits (+Z, or compact fp16 p̃ for 16-bit training)
 *               → [combine] → dz → dH → dW → db → [reduce]; with row-scaled compact logits (plan.h
 *               qrows) qref → logits → combine → qscale → dH → dW, no dz pass
 *   recompute:  [forward] → per vocab chunk: logits writing dZ (or Z → dz, FLCE_FUSED_DZ=0)
 *               → dH (accumulated) → dW → db
 * With tensor parallelism (docs/DESIGN.md §2) every combine is preceded by tp_pack and ONE all-gather of
 * the per-row statistics, dH builds up in fp32 and is summed across ranks before it is rounded once
 * (by default an fp32 reduce-scatter, the cast and a 16-bit all-gather: reduce_dh_rows; under
 * sequence parallelism, which first all-gathers hidden states and labels, a reduce-scatter).
 * No host synchronization anywhere. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "launch.h"
#include "log.h"
#include "params.h"
#include "timeline.h"
#include "tma.h"

enum {
    K_PREPARE = 0, K_COMBINE = 1, K_DZ = 2, K_REDUCE = 3, K_DBIAS = 4, K_TP_PACK = 5, K_CAST = 6, K_QREF = 7,
    K_QSCALE = 8, K_QLIST_COUNT = 9, K_QLIST_FILL = 10, K_QDW = 11, K_QDH = 12
};

typedef struct kernels {
    CUfunction logits, logits_dz, dh, dw, row[CTX_MAX_KERNELS];
} kernels;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static unsigned long long addr(const void *p) { return (unsigned long long)(uintptr_t)p; }

/* Every kernel of the plan, the missing ones compiled together (ctx_kernels_many). */
enum { ROWOPS, LOGITS, LOGITS_DZ, DH, DW };

/* The specs a call of plan pl loads, and (slot) where each role's is in that list, or -1. */
static int plan_specs(const plan *pl, const kernel_spec *specs[5], int slot[5])
{
    int n = 0;
    for (int role = ROWOPS; role <= DW; role++) {
        slot[role] = -1;
        if (role == LOGITS_DZ && !pl->fused_dz) continue;
        if ((role == DH || role == DW) && pl->op == FLCE_OP_FORWARD) continue;
        slot[role] = n;
        specs[n++] = role == ROWOPS ? &pl->rowops : role == LOGITS ? &pl->logits : role == LOGITS_DZ ? &pl->logits_dz
                     : role == DH   ? &pl->dh : &pl->dw;
    }
    return n;
}

void launch_prebuild_kernels(flce_context *ctx, const plan *pl, int all)
{
    const kernel_spec *specs[5];
    int slot[5];
    int n = plan_specs(pl, specs, slot);
    ctx_prebuild(ctx, specs, n, all);
}

static flce_status get_kernels(flce_context *ctx, const plan *pl, kernels *k)
{
    const kernel_spec *specs[5];
    int slot[5];
    int n = plan_specs(pl, specs, slot);
    CUfunction fns[5][CTX_MAX_KERNELS];
    memset(k, 0, sizeof *k);
    TRY(ctx_kernels_many(ctx, specs, n, fns));
    memcpy(k->row, fns[slot[ROWOPS]], sizeof k->row);
    k->logits = fns[slot[LOGITS]][0];
    if (slot[LOGITS_DZ] >= 0) k->logits_dz = fns[slot[LOGITS_DZ]][0];
    if (slot[DH] >= 0) k->dh = fns[slot[DH]][0], k->dw = fns[slot[DW]][0];
    return FLCE_OK;
}

flce_status launch_prepare_kernels(flce_context *ctx, const plan *pl)
{
    kernels k;
    return get_kernels(ctx, pl, &k);
}

static flce_status launch(CUfunction fn, int64_t gx, int64_t gy, int threads, size_t smem,
                          CUstream stream, void *params, const char *what)
{
    if (gx < 1 || gy < 1) return FLCE_OK;
    if (gx > 0x7fffffff || gy > 65535)
        return err_set(FLCE_ERR_UNSUPPORTED, "%s: grid %lld x %lld exceeds the device's limits", what,
                       (long long)gx, (long long)gy);
    void *args[] = {params};
    int timed = timeline_enabled();
    if (timed) timeline_before(stream, what);
    CUresult r = drv.LaunchKernel(fn, (unsigned)gx, (unsigned)gy, 1, (unsigned)threads, 1, 1,
                                  (unsigned)smem, stream, args, NULL);
    if (timed) timeline_after(stream);
    if (r != CUDA_SUCCESS) return drv_error(r, what);
    return FLCE_OK;
}

/* A launch in clusters of `cluster` CTAs along x (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION):
 * the dH/dW kernels of spec cluster = 2; launch() for cluster <= 1. gx must be a multiple of it. */
static flce_status launch_cluster(CUfunction fn, int64_t gx, int64_t gy, int cluster, int threads, size_t smem,
                                  CUstream stream, void *params, const char *what)
{
    if (cluster <= 1) return launch(fn, gx, gy, threads, smem, stream, params, what);
    if (gx < 1 || gy < 1) return FLCE_OK;
    if (gx > 0x7fffffff || gy > 65535 || gx % cluster)
        return err_set(FLCE_ERR_UNSUPPORTED, "%s: grid %lld x %lld in clusters of %d: beyond the device's limits or "
                       "not a multiple of the cluster", what, (long long)gx, (long long)gy, cluster);
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = (unsigned)cluster, attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = (unsigned)gx, cfg.gridDimY = (unsigned)gy, cfg.gridDimZ = 1;
    cfg.blockDimX = (unsigned)threads, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.sharedMemBytes = (unsigned)smem, cfg.hStream = stream, cfg.attrs = &attr, cfg.numAttrs = 1;
    void *args[] = {params};
    int timed = timeline_enabled();
    if (timed) timeline_before(stream, what);
    CUresult r = drv.LaunchKernelEx(&cfg, fn, args, NULL);
    if (timed) timeline_after(stream);
    if (r != CUDA_SUCCESS) return drv_error(r, what);
    return FLCE_OK;
}

/* The CTA slots of a persistent dH/dW launch (tma_prepare_gemm's num_sms) or logits launch: the SMs, or for spec
 * cluster = 2 twice the clusters of 2 resident at once: cuOccupancyMaxActiveClusters, asked once
 * per function (an H100 SXM has 132 SMs; GPCs with an odd number of them leave one idle), or the
 * SMs rounded down to even when the driver does not say. Only the grid's size depends on it. */
static int resident_slots(const flce_context *ctx, const kernel_spec *s, CUfunction fn)
{
    enum { CACHED = 16 };
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        CUfunction fn;
        int slots;
    } cache[CACHED];
    static int next;
    int sms = ctx->num_sms, fallback = sms / 2 * 2;
    if (s->cluster <= 1) return sms;
    int slots = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < CACHED; i++)
        if (cache[i].fn == fn) slots = cache[i].slots;
    pthread_mutex_unlock(&lock);
    if (slots > 0) return slots;
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = (unsigned)s->cluster, attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = (unsigned)(s->cluster * (sms > 0 ? sms : 1)), cfg.gridDimY = 1, cfg.gridDimZ = 1;
    cfg.blockDimX = (unsigned)spec_threads(s), cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.sharedMemBytes = (unsigned)spec_smem_bytes(s), cfg.attrs = &attr, cfg.numAttrs = 1;
    int clusters = 0;
    if (drv.OccupancyMaxActiveClusters(&clusters, fn, &cfg) != CUDA_SUCCESS || clusters < 1 ||
        clusters * s->cluster > fallback)
        return fallback;
    slots = clusters * s->cluster;
    pthread_mutex_lock(&lock);
    cache[next].fn = fn, cache[next].slots = slots;
    next = (next + 1) % CACHED;
    pthread_mutex_unlock(&lock);
    return slots;
}

typedef struct run {
    const plan *pl;
    const flce_problem *p;
    const flce_tensors *t; /* the caller's tensors, or under SP their all-token stand-ins */
    flce_context *ctx;
    CUdeviceptr ws;
    CUstream stream;
    size_t es; /* bytes of one input-dtype element */
    kernels k;
    struct flce_row_params rp; /* fields common to every row kernel */
    CUstream forked[2];        /* the side and/or fill stream, while they have work the caller's
                                  stream must wait for */
    int n_forked;
} run;

static unsigned long long ws_at(const run *r, uint64_t off, int needed)
{
    return needed ? r->ws + off : 0;
}

static void init_row_params(run *r)
{
    const plan *pl = r->pl;
    const flce_tensors *t = r->t;
    struct flce_row_params *rp = &r->rp;
    int reduced = r->p->reduction != FLCE_REDUCTION_NONE;
    memset(rp, 0, sizeof *rp);
    rp->labels = addr(t->labels);
    rp->part_m = ws_at(r, pl->off_part_m, pl->off_part_m != 0);
    rp->part_s = ws_at(r, pl->off_part_s, pl->off_part_s != 0);
    rp->part_t = ws_at(r, pl->off_part_t, pl->off_part_t != 0);
    rp->part_zs = ws_at(r, pl->off_part_zs, pl->off_part_zs != 0);
    rp->part_arg = ws_at(r, pl->off_part_arg, pl->off_part_arg != 0);
    rp->target = ws_at(r, pl->off_target, pl->off_target != 0);
    rp->z = ws_at(r, pl->off_z, pl->off_z != 0);
    rp->dz = ws_at(r, pl->off_dz, pl->off_dz != 0);
    if (pl->compact) {
        rp->tile_max = r->ws + pl->off_tile_max;
        rp->tile_max_ld = pl->tile_max_ld, rp->tile_cols = pl->tile_cols;
    }
    if (pl->qrows) {
        rp->hidden = addr(t->hidden), rp->weight = addr(t->weight), rp->d = pl->d;
        rp->qref = r->ws + pl->off_qref, rp->qflags = r->ws + pl->off_qflags;
        rp->row_scale = r->ws + pl->off_row_scale, rp->qh = r->ws + pl->off_qh, rp->qlab = r->ws + pl->off_qlab;
        rp->qlist_start = r->ws + pl->off_qlist_start, rp->qlist_tok = r->ws + pl->off_qlist_tok;
        rp->qlist_blk = r->ws + pl->off_qlist_blk;
    }
    rp->lse = pl->need_lse ? r->ws + pl->off_lse : addr(t->lse);
    /* Per-token losses go to the workspace (reduced later), the caller's loss_per_token, and for
     * reduction none also the caller's loss. */
    if (pl->need_loss_rows) rp->loss_rows = r->ws + pl->off_loss_rows;
    else rp->loss_rows = reduced ? addr(t->loss_per_token) : addr(t->loss);
    if (t->loss_per_token && rp->loss_rows != addr(t->loss_per_token)) rp->loss_copy = addr(t->loss_per_token);
    /* Reduction none writes each token's z-loss part into the caller's z_loss_out, zeros when
     * z_loss is 0 (the Python suite found it left unwritten then); reduced, the reduce kernel
     * writes the sum, 0 without z-loss rows. */
    if (pl->need_zloss_rows) rp->zloss_rows = r->ws + pl->off_zloss_rows;
    else if (!reduced) rp->zloss_rows = addr(t->z_loss_out);
    rp->loss_out = reduced ? addr(t->loss) : 0;
    rp->zloss_out = reduced ? addr(t->z_loss_out) : 0;
    rp->logprob = addr(t->target_logprob);
    rp->entropy = addr(t->entropy);
    rp->argmax = addr(t->argmax);
    rp->grad_output = addr(t->grad_output);
    rp->grad_logprob = addr(t->grad_logprob);
    rp->grad_lse = addr(t->grad_lse);
    rp->grad_entropy = addr(t->grad_entropy);
    rp->grad_loss_rows = addr(t->grad_loss_per_token);
    rp->stats = r->ws + pl->off_stats;
    rp->class_weights = r->p->has_class_weights ? addr(t->class_weights) : 0;
    /* the caller's flag for this call, else the context's (reported by the next call) */
    rp->flag = t->error_flag ? addr(t->error_flag) : r->ctx->flag_dev;
    rp->dbias_acc = ws_at(r, pl->off_db_acc, pl->need_db_acc);
    rp->grad_bias = addr(t->grad_bias);
    rp->tokens = pl->n;
    rp->ldz = pl->ldz;
    rp->vocab_offset = r->p->vocab_offset;
    rp->vocab_total = r->p->vocab_total ? r->p->vocab_total : r->p->vocab_offset + r->p->vocab_shard;
    rp->ignore_index = r->p->ignore_index;
    rp->splits = pl->splits;
    rp->vocab_shard = r->p->vocab_shard;
    rp->tp_size = pl->tp;
    if (pl->collective && pl->op != FLCE_OP_BACKWARD) {
        rp->tp_send = r->ws + pl->off_tp_send;
        rp->tp_recv = r->ws + pl->off_tp_recv;
    }
}

/* A block of logits: rows [row0, row0 + rows) × shard columns [col0, col0 + cols). */
typedef struct block {
    int64_t row0, rows, col0, cols;
    int first, last; /* first and last step of an accumulation over blocks */
} block;

/* The fields every logits pass over block b shares. */
static void logits_params(const run *r, const block *b, struct flce_gemm_params *g)
{
    const plan *pl = r->pl;
    memset(g, 0, sizeof *g);
    g->a = addr(r->t->hidden) + (unsigned long long)(b->row0 * pl->d) * r->es;
    g->b = addr(r->t->weight) + (unsigned long long)(b->col0 * pl->d) * r->es;
    g->labels = addr(r->t->labels) + (unsigned long long)b->row0 * (unsigned long long)(r->p->label_bits / 8);
    g->bias = r->p->has_bias ? addr(r->t->bias) + (unsigned long long)b->col0 * r->es : 0;
    g->class_weights = r->rp.class_weights;
    g->m = b->rows, g->n = b->cols, g->k = pl->d;
    g->a_rows = b->rows, g->a_cols = pl->d, g->lda = pl->d;
    g->b_rows = b->cols, g->b_cols = pl->d, g->ldb = pl->d;
    g->ldo = pl->ldz;
    g->vocab_offset = r->p->vocab_offset + b->col0;
}

static flce_status launch_logits(run *r, const kernel_spec *spec, CUfunction fn, const block *b, int stats,
                                 struct flce_gemm_params *g, const char *what)
{
    const plan *pl = r->pl;
    /* A full_tiles kernel has no code for a partial vocab tile (gemm_logits.cu NO_PARTIAL_TILE). */
    if (spec->full_tiles && b->cols % spec->tile.bn != 0)
        return err_set(FLCE_ERR_INTERNAL, "%s: compiled for whole %d-column tiles, launched over %lld columns "
                       "(a planning bug)", what, spec->tile.bn, (long long)b->cols);
    int splits = pl->splits, tps = pl->tiles_per_split;
    if (!stats) plan_vocab_splits(pl, b->rows, b->cols, r->ctx->num_sms, &splits, &tps);
    g->splits = splits;
    g->tiles_per_split = tps;
    g->group_rows = pl->logits_group;
    int64_t gx = ceil_div(b->rows, spec->tile.bm), gy = splits;
    if (spec->cluster > 1) gx = ceil_div(gx, spec->cluster) * spec->cluster; /* pairs of row blocks */
    if (stats && pl->logits_persist) {
        /* more items than CTAs resident at once (the slots the driver gives this kernel's
         * clusters): persistent CTAs walk them in turn (templates/gemm_entry.cu) */
        int cl = spec->cluster > 1 ? spec->cluster : 1;
        int64_t units = gx / cl, resident = resident_slots(r->ctx, spec, fn) / cl;
        if (resident > 0 && units * gy > resident) {
            g->persist = (int)resident;
            gx = resident * cl, gy = 1;
        }
        log_msg(LOG_DEBUG, "logits: %lld item(s) of %d tile(s), %s", (long long)(units * splits), tps,
                g->persist ? "persistent" : "one per CTA");
    }
    TRY(tma_prepare_gemm(spec, g, r->ctx->num_sms, &gx, &gy));
    return launch_cluster(fn, gx, gy, spec->cluster, spec_threads(spec), spec_smem_bytes(spec), r->stream, g, what);
}

/* The statistics pass (stats = 1: partials and target for combine) and/or the Z store. */
static flce_status run_logits(run *r, const block *b, int stats, int store_z)
{
    struct flce_gemm_params g;
    logits_params(r, b, &g);
    g.out = store_z ? r->ws + r->pl->off_z : 0;
    if (store_z && r->pl->compact) g.tile_max = r->rp.tile_max, g.ld_tile_max = r->pl->tile_max_ld;
    if (store_z && r->pl->qrows) g.qref = r->rp.qref, g.qflags = r->rp.qflags;
    if (stats) {
        g.part_m = r->rp.part_m, g.part_s = r->rp.part_s, g.target = r->rp.target;
        g.part_t = r->rp.part_t, g.part_zs = r->rp.part_zs, g.part_arg = r->rp.part_arg;
    }
    return launch_logits(r, &r->pl->logits, r->k.logits, b, stats, &g, "logits kernel");
}

/* Recompute's gradient pass over block b: the logits again, turned into dZ in the epilogue (the
 * rows' lse is known), which replaces the Z store and the dz kernel. */
static flce_status run_logits_dz(run *r, const block *b)
{
    struct flce_gemm_params g;
    logits_params(r, b, &g);
    g.out = r->ws + r->pl->off_dz;
    g.lse = r->rp.lse + (unsigned long long)b->row0 * 4;
    g.grad_output = r->p->reduction == FLCE_REDUCTION_NONE && r->t->grad_output
                        ? addr(r->t->grad_output) + (unsigned long long)b->row0 * 4 : 0;
    g.stats = r->rp.stats;
    g.vocab_total = r->rp.vocab_total;
    g.ignore_index = r->rp.ignore_index;
    return launch_logits(r, &r->pl->logits_dz, r->k.logits_dz, b, 0, &g, "logits+dz kernel");
}

static void set_scale(const run *r, struct flce_gemm_params *g)
{
    if (r->p->reduction == FLCE_REDUCTION_NONE) return; /* g_i already in dZ */
    if (r->p->grad_outputs) { /* the scalar is folded into each row's dZ (rowops.cu loss_g) */
        if (r->p->dtype == FLCE_DTYPE_F16) g->scale_mode = 4;
        return;
    }
    g->scale_mode = r->p->reduction == FLCE_REDUCTION_MEAN ? 2 : 1;
    if (r->p->dtype == FLCE_DTYPE_F16) g->scale_mode |= 4; /* dZ stored × DZ_SCALE_F16 */
    g->scale_grad = addr(r->t->grad_output);
    g->scale_count = r->ws + r->pl->off_stats;
}

/* Where a gradient GEMM writes when its result builds up over several blocks: into the caller's
 * fp32 buffer (accumulate mode), in place (fp32 dtype), or through an fp32 workspace accumulator
 * whose last step writes the dtype — so 16-bit gradients are rounded once. `elem` is the element
 * offset of this block's output. */
static void set_output(const run *r, struct flce_gemm_params *g, unsigned long long final,
                       int caller_f32, unsigned long long acc, uint64_t elem, const block *b)
{
    if (caller_f32) {
        g->out = final + elem * 4, g->out_f32 = 1, g->addend = g->out;
    } else if (r->es == 4) {
        g->out = final + elem * 4, g->out_f32 = 1, g->addend = b->first ? 0 : g->out;
    } else if (!acc || (b->first && b->last)) {
        g->out = final + elem * r->es, g->out_f32 = 0, g->addend = 0;
    } else {
        unsigned long long a = acc + elem * 4;
        g->out = b->last ? final + elem * r->es : a;
        g->out_f32 = !b->last;
        g->addend = b->first ? 0 : a;
    }
}

/* A kernel compiled without some stores (spec plain_out, red_acc) must not be asked for them: the
 * plan and set_output must agree, and a mismatch would silently drop gradients. */
static flce_status check_grad_stores(const kernel_spec *s, const struct flce_gemm_params *g, const char *what)
{
    if ((s->plain_out && (g->addend || g->out_f32)) || (g->red_addend && !s->red_acc))
        return err_set(FLCE_ERR_INTERNAL, "%s kernel: compiled for %s stores but launched with %s (a planning bug)",
                       what, s->plain_out ? "complete 16-bit" : "no red.global",
                       g->red_addend ? "red.global" : "an fp32 addend or output");
    return FLCE_OK;
}

/* dH[rows] (+)= dZ · W[cols] over the vocab columns of s, a part of block b (whose dZ the
 * workspace holds from b->col0): A = dZ stored K-major, B = W stored [k = vocab][n = hidden]. */
static flce_status run_dh_part(run *r, const block *s, const block *b)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    int64_t off = s->col0 - b->col0; /* a multiple of PLAN_DH_K_SLICE: 16-byte aligned for TMA */
    g.a = r->ws + pl->off_dz + (unsigned long long)off * r->es;
    g.b = addr(r->t->weight) + (unsigned long long)(s->col0 * pl->d) * r->es;
    if (pl->need_dh_tp) { /* this rank's part of dH, fp32, summed across ranks at the end */
        g.out = r->ws + pl->off_dh_tp + (uint64_t)(s->row0 * pl->d) * 4;
        g.out_f32 = 1, g.addend = s->first ? 0 : g.out;
    } else {
        unsigned long long acc = ws_at(r, pl->off_dh_acc, pl->need_dh_acc);
        /* chunked: the accumulator holds this token chunk's rows only (plan.c), set_output indexes
         * by the absolute row */
        if (acc && !pl->recompute) acc -= (unsigned long long)(s->row0 * pl->d) * 4;
        set_output(r, &g, addr(r->t->grad_hidden), r->p->accumulate_grad_hidden, acc, (uint64_t)(s->row0 * pl->d), s);
    }
    g.m = s->rows, g.n = pl->d, g.k = s->cols;
    g.a_rows = s->rows, g.a_cols = pl->ldz - off, g.lda = pl->ldz;
    g.b_rows = s->cols, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    int64_t gx = ceil_div(pl->d, pl->dh.tile.bn), gy = ceil_div(s->rows, pl->dh.tile.bm);
    if (pl->dh_splits > 1) { /* one fp32 slab per split of k, [rows][d] each; sum_dh_splits adds them */
        g.out = r->ws + pl->off_dh_split, g.out_f32 = 1, g.addend = 0;
        g.k_splits = pl->dh_splits, g.k_split = pl->dh_split_k;
        g.out_split_stride = (unsigned long long)s->rows * (unsigned long long)pl->d * 4;
        gy *= pl->dh_splits; /* the units tma_prepare_gemm spreads over the persistent grid */
    }
    g.raster_rows = pl->raster_rows;
    g.red_addend = pl->red_acc && g.addend && g.addend == g.out && g.out_f32;
    TRY(check_grad_stores(&pl->dh, &g, "dH"));
    if (pl->qrows) { /* chunk rows, as the launch's; the labels' dz where they lie in its k range */
        g.row_scale = r->rp.row_scale;
        if (!pl->qdh) g.qlab = r->rp.qlab, g.qlab_k0 = off; /* else flce_qdh adds them after dH */
    }
    TRY(tma_prepare_gemm(&pl->dh, &g, resident_slots(r->ctx, &pl->dh, r->k.dh), &gx, &gy));
    return launch_cluster(r->k.dh, gx, gy, pl->dh.cluster, spec_threads(&pl->dh), spec_smem_bytes(&pl->dh), r->stream,
                          &g, "dH kernel");
}

static flce_status run_rows(run *r, int kernel, const block *b);

/* A labels' pass (K_QDH, K_QDW) of block b adding into dst (fp32 where f32, else the dtype; the
 * kernel's row 0), the row parameters as they were afterwards. */
static flce_status run_label_terms(run *r, int kernel, const block *b, unsigned long long dst, int f32)
{
    struct flce_row_params keep = r->rp;
    r->rp.cast_dst = dst;
    r->rp.cast_accumulate = f32;
    flce_status st = run_rows(r, kernel, b);
    r->rp = keep;
    return st;
}

/* r->stream waits for the work queued so far on s (graph-capturable: an event). */
static flce_status wait_for(run *r, CUstream s)
{
    CUresult res = drv.EventRecord(r->ctx->join, s);
    if (res == CUDA_SUCCESS) res = drv.StreamWaitEvent(r->stream, r->ctx->join, 0);
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "waiting for the second stream's dW launch");
}

/* plan qdh: the labels' exact dz_i·W_y into the dH rows of token chunk b at dst (its row 0; fp32
 * where f32, else the dtype), after its dH launches on the same stream, where they now lie: the
 * caller's buffer, (dh_splits) the first fp32 slab, or (TP) this rank's fp32 part of dH. A token
 * chunk completes its rows; under TP only the rank holding a row's label adds its term. */
static flce_status run_qdh(run *r, const block *b, unsigned long long dst, int f32)
{
    return run_label_terms(r, K_QDH, b, dst, f32);
}

/* The rows of block b in the caller's dH: fp32 (accumulate_grad_hidden) or the dtype. */
static unsigned long long dh_rows_at(const run *r, const block *b)
{
    return addr(r->t->grad_hidden) + (uint64_t)(b->row0 * r->pl->d) * (r->p->accumulate_grad_hidden ? 4 : r->es);
}

/* plan dh_splits: (plan qdh) the labels' terms into the first fp32 slab, then one flce_cast sums
 * the slabs in order into dH's rows of block b, stored in the dtype or added to the caller's fp32
 * buffer: one rounding, the same bits every run. */
static flce_status sum_dh_splits(run *r, const block *b)
{
    const plan *pl = r->pl;
    unsigned long long slabs = r->ws + pl->off_dh_split;
    long long count = (long long)b->rows * (long long)pl->d;
    if (pl->qdh) TRY(run_qdh(r, b, slabs, 1));
    struct flce_row_params keep = r->rp;
    block none = {0, 0, 0, 0, 1, 1};
    r->rp.cast_src = slabs, r->rp.cast_splits = pl->dh_splits, r->rp.cast_split_stride = count;
    r->rp.cast_count = count, r->rp.cast_scale = 0;
    r->rp.cast_dst = dh_rows_at(r, b), r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    flce_status st = run_rows(r, K_CAST, &none);
    r->rp = keep;
    return st;
}

/* dH of block b: one launch, or (plan dh_k_slice) one per slice of its vocab columns, each slice
 * a step of the fp32 accumulation (first and last as b's at its ends), or (plan dh_splits) one
 * launch into per-split slabs that sum_dh_splits adds up; then (plan qdh) the labels' terms. */
static flce_status run_dh(run *r, const block *b)
{
    int64_t slice = r->pl->dh_k_slice;
    if (r->pl->dh_splits > 1) {
        TRY(run_dh_part(r, b, b));
        return sum_dh_splits(r, b);
    }
    if (!slice || b->cols <= slice) {
        TRY(run_dh_part(r, b, b));
    } else {
        for (int64_t c = 0; c < b->cols; c += slice) {
            block s = *b;
            s.col0 = b->col0 + c, s.cols = b->cols - c < slice ? b->cols - c : slice;
            s.first = b->first && c == 0, s.last = b->last && c + s.cols == b->cols;
            TRY(run_dh_part(r, &s, b));
        }
    }
    if (!r->pl->qdh) return FLCE_OK;
    if (r->pl->need_dh_tp) /* TP: into this rank's fp32 part, before the ranks sum it */
        return run_qdh(r, b, r->ws + r->pl->off_dh_tp + (uint64_t)(b->row0 * r->pl->d) * 4, 1);
    return run_qdh(r, b, dh_rows_at(r, b), r->p->accumulate_grad_hidden);
}

/* dW's tile counter (plan dw_dynamic) zeroed on the caller's stream, before any launch that takes
 * tiles from it. */
static flce_status zero_tile_counter(run *r)
{
    CUresult res = drv.MemsetD32Async((CUdeviceptr)(r->ws + r->pl->off_tile_counter), 0, 2, r->stream);
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "zeroing dW's tile counter");
}

/* dW[cols] (+)= dZᵀ · H[rows]: A = dZ stored [k = token][m = vocab], B = H stored [k][n]. One
 * launch of persistent CTAs on r->stream; or, with `late` > 0 (tp_overlap, the tile
 * counter already zeroed: zero_tile_counter), two that share the counter: the first with `late`
 * fewer CTAs than the SMs, which stay free for NCCL's all-reduce on the side stream (dW's CTAs,
 * once resident, hold their SMs until the counter runs dry: TP v3 in bench/NOTES.md), and `late`
 * CTAs on the side stream behind the reduction, which take the tiles left when it ends. */
static flce_status run_dw_split(run *r, const block *b, int late)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    g.a = r->ws + pl->off_dz;
    /* row-scaled compact logits: B is s ⊙ H of the chunk's rows (flce_qscale) */
    g.b = pl->qrows ? r->rp.qh : addr(r->t->hidden) + (unsigned long long)(b->row0 * pl->d) * r->es;
    set_output(r, &g, addr(r->t->grad_weight), r->p->accumulate_grad_weight,
               ws_at(r, pl->off_dw_acc, pl->need_dw_acc), (uint64_t)(b->col0 * pl->d), b);
    g.m = b->cols, g.n = pl->d, g.k = b->rows;
    g.a_rows = b->rows, g.a_cols = pl->ldz, g.lda = pl->ldz;
    g.b_rows = b->rows, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    g.raster_rows = pl->raster_rows;
    g.red_addend = pl->red_acc && g.addend && g.addend == g.out && g.out_f32;
    TRY(check_grad_stores(&pl->dw, &g, "dW"));
    int dynamic = pl->dw_dynamic && b->rows > 0; /* tiles from a counter: see plan.h, dw_dynamic */
    if (dynamic) {
        g.tile_counter = r->ws + pl->off_tile_counter;
        if (!late) TRY(zero_tile_counter(r));
    }
    const int64_t tiles_x = ceil_div(pl->d, pl->dw.tile.bn), tiles_y = ceil_div(b->cols, pl->dw.tile.bm);
    int64_t slots = resident_slots(r->ctx, &pl->dw, r->k.dw), gx = tiles_x, gy = tiles_y;
    int split = dynamic && late > 0 && late < slots && tiles_x * tiles_y > slots - late;
    TRY(tma_prepare_gemm(&pl->dw, &g, split ? slots - late : slots, &gx, &gy));
    g.counter_base = gx, g.block0 = 0;
    TRY(launch_cluster(r->k.dw, gx, gy, pl->dw.cluster, spec_threads(&pl->dw), spec_smem_bytes(&pl->dw), r->stream,
                       &g, "dW kernel"));
    if (split) {
        struct flce_gemm_params g2 = g;
        int64_t gx2 = tiles_x, gy2 = tiles_y;
        TRY(tma_prepare_gemm(&pl->dw, &g2, late, &gx2, &gy2));
        g2.counter_base = gx, g2.block0 = gx;
        TRY(launch_cluster(r->k.dw, gx2, gy2, pl->dw.cluster, spec_threads(&pl->dw), spec_smem_bytes(&pl->dw),
                           r->ctx->side, &g2, "dW kernel (after the dH all-reduce)"));
    }
    if (!pl->qrows) return FLCE_OK;
    /* The labels' exact Σ dz·h into the rows dW wrote (rowops.cu flce_qdw), after both launches of
     * a split dW: the late one's tiles (side stream) are plain stores that would overwrite them
     * (TP at tp = 4 lost them: dW 2.9e-2 off, bench/NOTES.md session 14). */
    if (split) TRY(wait_for(r, r->ctx->side));
    return run_label_terms(r, K_QDW, b, g.out, g.out_f32);
}

static flce_status run_dw(run *r, const block *b) { return run_dw_split(r, b, 0); }

static flce_status run_rows(run *r, int kernel, const block *b)
{
    struct flce_row_params rp = r->rp;
    if (kernel == K_CAST) { /* the caller set cast_* in r->rp */
        int64_t blocks = ceil_div(ceil_div(rp.cast_count, 4), 256);
        if (blocks > 8 * (int64_t)r->ctx->num_sms) blocks = 8 * (int64_t)r->ctx->num_sms;
        return launch(r->k.row[K_CAST], blocks, 1, 256, 0, r->stream, &rp, "cast kernel");
    }
    rp.row0 = b->row0, rp.rows = b->rows;
    rp.col0 = b->col0, rp.cols = b->cols;
    rp.chunk_offset = r->p->vocab_offset + b->col0;
    rp.first = b->first, rp.last = b->last;
    switch (kernel) {
    case K_PREPARE:
        return launch(r->k.row[K_PREPARE], 1, 1, FLCE_ROW_CTA_THREADS, 0, r->stream, &rp, "prepare kernel");
    case K_COMBINE: /* FLCE_MERGE_LANES threads per row merge its vocab splits */
        return launch(r->k.row[K_COMBINE], ceil_div(b->rows * FLCE_MERGE_LANES, 256), 1, 256, 0, r->stream, &rp,
                      "combine kernel");
    case K_TP_PACK:
        return launch(r->k.row[K_TP_PACK], ceil_div(b->rows * FLCE_MERGE_LANES, 256), 1, 256, 0, r->stream, &rp,
                      "tp_pack kernel");
    case K_DZ:
        /* From compact logits 4 groups of 8 columns per thread (rowops.cu DZ_COMPACT_GROUPS,
         * DZ_COMPACT_COLS), else 4 columns. */
        return launch(r->k.row[K_DZ], b->rows,
                      r->pl->compact ? ceil_div(r->pl->ldz, 256 * 8 * 4) : ceil_div(r->pl->ldz / 4, 256), 256, 0,
                      r->stream, &rp, "dz kernel");
    case K_QREF: { /* groups of G warps per 4 rows (rowops.cu QREF_ROWS), 8 warps per CTA: G as
                    * small as keeps a CTA on every SM */
        int g = 1;
        while (g < 8 && ceil_div(b->rows, 32) * g < r->ctx->num_sms) g *= 2;
        rp.qref_warps = g;
        return launch(r->k.row[K_QREF], ceil_div(b->rows * g, 32), 1, 256, 0, r->stream, &rp, "qref kernel");
    }
    case K_QSCALE:
        return launch(r->k.row[K_QSCALE], b->rows, 1, 256, 0, r->stream, &rp, "qscale kernel");
    case K_QDH: /* a warp per row */
        return launch(r->k.row[K_QDH], ceil_div(b->rows, 8), 1, 256, 0, r->stream, &rp, "qdh kernel");
    case K_QLIST_COUNT: /* a CTA per 128 vocab rows (rowops.cu QLIST_BLOCK) */
    case K_QLIST_FILL:
    case K_QDW:
        return launch(r->k.row[kernel], ceil_div(b->cols, 128), 1, 256, 0, r->stream, &rp,
                      kernel == K_QLIST_COUNT ? "qlist count kernel" : kernel == K_QLIST_FILL ? "qlist fill kernel"
                                                                                          : "qdw kernel");
    case K_DBIAS:
        return launch(r->k.row[K_DBIAS], ceil_div(b->cols, 256), 1, 256, 0, r->stream, &rp,
                      "dbias kernel");
    default:
        return launch(r->k.row[K_REDUCE], 1, 1, FLCE_ROW_CTA_THREADS, 0, r->stream, &rp, "reduce kernel");
    }
}

/* dZ of one block and the gradient GEMMs that consume it. `rows_step` and `cols_step` carry the
 * accumulation state (first/last) of the outputs indexed by rows (dH) and by vocab columns (dW,
 * db): token chunks complete their dH rows at once and build dW up; vocab chunks the reverse. */
static flce_status overlap_dh(run *r, const block *rows_done);
static flce_status reduce_dh(run *r, const block *rows_done);

/* Whether dH's reduction across ranks goes beside dW after this row step (tp_overlap): after the
 * last vocab step of each token chunk; under SP once, after the last chunk (one reduce-scatter of
 * every row). */
static int reduce_beside_dw(const run *r, const block *rows_step)
{
    const plan *pl = r->pl;
    return pl->tp_overlap && rows_step->last && (!pl->sp || rows_step->row0 + rows_step->rows == pl->n);
}
static flce_status fork_to(run *r, CUstream s);
static flce_status side_fork(run *r);
static flce_status side_join(run *r);

/* FLCE_GRAD_STREAMS (plan.h, concurrent_grads): dH on the side stream (highest priority) and dW on
 * the fill stream (lowest), both behind one event after dZ; the caller's stream waits for both
 * before it goes on (the next chunk overwrites dZ). dH must get the SMs first: dW's persistent
 * CTAs, once resident, keep their SMs until its tile counter runs dry, and priority never
 * pre-empts them. With dH on the side stream and dW next in the caller's (v18), dW won: a kernel
 * next in its own stream starts the moment its predecessor ends, one behind an event a little
 * later. With dH next in the caller's stream and dW behind the event (v23) dH usually won, but not
 * always: 512×4096×128256 took 2.4 or 2.9 ms from run to run (H100, session 6). Behind the same
 * event, the block scheduler takes the higher priority's CTAs first, and dW's take the SMs dH
 * leaves.
 *
 * Under tp_overlap the dH rows' reduction follows dH on the side stream, and dW is split
 * (run_dw_split) so that NCCL's kernel finds SMs: its second launch follows the reduction. */
static flce_status run_dh_dw_at_once(run *r, const block *rows_step, const block *cols_step)
{
    int reduce = reduce_beside_dw(r, rows_step), late = reduce ? r->pl->tp_overlap_sms : 0;
    TRY(ctx_fill_stream(r->ctx));
    TRY(ctx_side_stream(r->ctx));
    if (late) TRY(zero_tile_counter(r)); /* before the forks: both dW launches come after it */
    TRY(fork_to(r, r->ctx->side));
    TRY(fork_to(r, r->ctx->fill));
    CUstream caller = r->stream;
    r->stream = r->ctx->side;
    flce_status st = run_dh(r, rows_step);
    if (st == FLCE_OK && reduce) st = reduce_dh(r, rows_step); /* (r->stream is the side stream) */
    r->stream = r->ctx->fill;
    if (st == FLCE_OK) st = run_dw_split(r, cols_step, late);
    r->stream = caller;
    flce_status joined = side_join(r);
    return st != FLCE_OK ? st : joined;
}

static flce_status run_grads(run *r, const block *rows_step, const block *cols_step)
{
    /* dZ: written by recompute's logits pass (fused_dz), the row-scaled logits themselves (qrows:
     * flce_qscale writes the labels' entries, dH and dW apply s_i), or the dz pass */
    if (r->pl->qrows) {
        TRY(run_rows(r, K_QSCALE, rows_step));
        if (r->t->grad_weight) { /* the chunk rows by label, for flce_qdw after dW */
            TRY(run_rows(r, K_QLIST_COUNT, rows_step));
            TRY(run_rows(r, K_QLIST_FILL, rows_step));
        }
    } else if (!r->pl->fused_dz) {
        TRY(run_rows(r, K_DZ, rows_step));
    }
    if (r->pl->concurrent_grads && r->t->grad_hidden && r->t->grad_weight) {
        TRY(run_dh_dw_at_once(r, rows_step, cols_step));
        if (r->p->has_bias && r->t->grad_bias) TRY(run_rows(r, K_DBIAS, cols_step));
        return FLCE_OK;
    }
    if (r->t->grad_hidden) TRY(run_dh(r, rows_step));
    if (r->t->grad_hidden && reduce_beside_dw(r, rows_step)) {
        /* dW beside the reduction (run_dw_split); the next chunk's dZ waits for both launches */
        int late = r->t->grad_weight && r->pl->dw_dynamic ? r->pl->tp_overlap_sms : 0;
        if (late) TRY(zero_tile_counter(r));
        TRY(overlap_dh(r, rows_step));
        if (r->t->grad_weight) TRY(run_dw_split(r, cols_step, late));
        if (late) TRY(side_join(r));
    } else if (r->t->grad_weight) {
        TRY(run_dw(r, cols_step));
    }
    if (r->p->has_bias && r->t->grad_bias) TRY(run_rows(r, K_DBIAS, cols_step));
    return FLCE_OK;
}

static block complete(block b)
{
    b.first = b.last = 1;
    return b;
}

/* The statistics of block b's rows, complete over the global vocab: with TP, this rank's records
 * go to every rank (one all-gather) before the combine merges them in rank order. */
static flce_status combine_rows(run *r, const block *b)
{
    const plan *pl = r->pl;
    if (pl->collective) {
        TRY(run_rows(r, K_TP_PACK, b));
        TRY(comm_all_gather(r->t->comm, (const void *)(uintptr_t)(r->ws + pl->off_tp_send),
                            (void *)(uintptr_t)(r->ws + pl->off_tp_recv), plan_tp_block_bytes(b->rows),
                            r->stream, "the statistics all-gather"));
    }
    return run_rows(r, K_COMBINE, b);
}

static flce_status run_forward(run *r)
{
    block all = {0, r->pl->n, 0, r->pl->v, 1, 1};
    TRY(run_logits(r, &all, 1, 0));
    return combine_rows(r, &all);
}

static flce_status run_chunked(run *r)
{
    const plan *pl = r->pl;
    int stats = pl->op == FLCE_OP_LOSS_AND_GRAD;
    for (int64_t c = 0; c < pl->n_chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, pl->v, c == 0, c == pl->n_chunks - 1};
        b.rows = pl->n - b.row0 < pl->chunk_rows ? pl->n - b.row0 : pl->chunk_rows;
        if (pl->qrows) TRY(run_rows(r, K_QREF, &b)); /* each row's reference for the compact store */
        TRY(run_logits(r, &b, stats, 1));
        if (stats) TRY(combine_rows(r, &b));
        block rows_done = complete(b);
        TRY(run_grads(r, &rows_done, &b));
    }
    return FLCE_OK;
}

/* Strategy SAVED (flce.h): run_chunked's one chunk cut between two calls. The forward's compact
 * logits, maxima, target logits and row references stay in the workspace (the caller keeps it),
 * with lse in the caller's buffer; the backward forms dZ from them with the upstream gradients it
 * is given. */
static flce_status run_tp_part(run *r, launch_part part, CUdeviceptr tp_buffer);

/* Under the split-phase TP forward (no communicator) its statistics half stores the logits too and
 * the finishing half combines the gathered statistics; the backward leaves dH as this rank's part. */
static flce_status run_saved(run *r, launch_part part, CUdeviceptr tp_buffer)
{
    const plan *pl = r->pl;
    if (!pl->saved || pl->n_chunks != 1)
        return err_set(FLCE_ERR_INTERNAL, "SAVED call planned with %lld token chunks (a planning bug)",
                       (long long)pl->n_chunks);
    block b = {0, pl->n, 0, pl->v, 1, 1};
    if (part == PART_TP_STATS || part == PART_TP_FINISH) return run_tp_part(r, part, tp_buffer);
    if (part == PART_SAVE) {
        if (pl->qrows) TRY(run_rows(r, K_QREF, &b));
        TRY(run_logits(r, &b, 1, 1));
        return combine_rows(r, &b);
    }
    block rows_done = complete(b);
    return run_grads(r, &rows_done, &b);
}

static flce_status run_recompute(run *r)
{
    const plan *pl = r->pl;
    if (pl->op == FLCE_OP_LOSS_AND_GRAD) TRY(run_forward(r));
    for (int64_t c = 0; c < pl->n_vchunks; c++) {
        block b = {0, pl->n, c * pl->chunk_cols, 0, c == 0, c == pl->n_vchunks - 1};
        b.cols = pl->v - b.col0 < pl->chunk_cols ? pl->v - b.col0 : pl->chunk_cols;
        TRY(pl->fused_dz ? run_logits_dz(r, &b) : run_logits(r, &b, 0, 1));
        block cols_done = complete(b);
        TRY(run_grads(r, &b, &cols_done));
    }
    return FLCE_OK;
}

/* dH rows [row0, row0 + rows) summed over the ranks and rounded once into the caller's grad_hidden
 * (or added to it in accumulate mode), on r->stream: under dh_gather16 an fp32 reduce-scatter, the
 * cast of this rank's slice and a 16-bit all-gather in grad_hidden; else the fp32 all-reduce then
 * the cast; or under FLCE_TP_DH_16BIT the cast of this rank's part then a 16-bit all-reduce. */
static flce_status reduce_dh_rows(run *r, int64_t row0, int64_t rows)
{
    const plan *pl = r->pl;
    uint64_t at = (uint64_t)row0 * (uint64_t)pl->d, count = (uint64_t)rows * (uint64_t)pl->d;
    float *buf = (float *)(uintptr_t)(r->ws + pl->off_dh_tp) + at;
    CUdeviceptr dst = addr(r->t->grad_hidden) + at * (r->p->accumulate_grad_hidden ? 4 : r->es);
    block none = {0, 0, 0, 0, 1, 1};
    r->rp.cast_src = addr(buf), r->rp.cast_dst = dst, r->rp.cast_count = (long long)count;
    r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    if (pl->dh_reduce_16bit) { /* round this rank's part once, then sum the 16-bit parts */
        r->rp.cast_accumulate = 0;
        TRY(run_rows(r, K_CAST, &none));
        return comm_all_reduce_16(r->t->comm, (void *)(uintptr_t)dst, count, r->p->dtype == FLCE_DTYPE_BF16,
                                  r->stream, "the dH all-reduce (16-bit)");
    }
    if (pl->dh_gather16 && count % (4 * (uint64_t)pl->tp) == 0) {
        /* each slice a multiple of 4 values: the cast's float4 loads and 8-byte stores stay aligned */
        uint64_t slice = count / (uint64_t)pl->tp, own = (uint64_t)pl->rank * slice;
        TRY(comm_reduce_scatter_f32(r->t->comm, buf, slice, pl->rank, r->stream, "the dH reduce-scatter"));
        r->rp.cast_src = addr(buf + own), r->rp.cast_dst = dst + own * r->es, r->rp.cast_count = (long long)slice;
        TRY(run_rows(r, K_CAST, &none));
        return comm_all_gather(r->t->comm, (const void *)(uintptr_t)(dst + own * r->es), (void *)(uintptr_t)dst,
                               slice * r->es, r->stream, "the dH all-gather");
    }
    TRY(comm_all_reduce_f32(r->t->comm, buf, count, r->stream, "the dH all-reduce"));
    return run_rows(r, K_CAST, &none);
}

/* SP: every row's dH summed over the ranks by an fp32 reduce-scatter to this rank's rows, then
 * rounded once into the caller's grad_hidden (or added to it in accumulate mode), on r->stream. */
static flce_status reduce_dh_sp(run *r)
{
    const plan *pl = r->pl;
    float *buf = (float *)(uintptr_t)(r->ws + pl->off_dh_tp);
    uint64_t local = (uint64_t)pl->n_local * (uint64_t)pl->d;
    TRY(comm_reduce_scatter_f32(r->t->comm, buf, local, pl->rank, r->stream, "the dH reduce-scatter"));
    buf += (uint64_t)pl->rank * local;
    r->rp.cast_src = addr(buf);
    r->rp.cast_dst = addr(r->t->grad_hidden);
    r->rp.cast_count = (long long)local;
    r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    block none = {0, 0, 0, 0, 1, 1};
    return run_rows(r, K_CAST, &none);
}

/* The dH rows of `rows_done` summed over the ranks (under SP: all rows, reduce-scattered), on
 * r->stream. */
static flce_status reduce_dh(run *r, const block *rows_done)
{
    return r->pl->sp ? reduce_dh_sp(r) : reduce_dh_rows(r, rows_done->row0, rows_done->rows);
}

/* FLCE_TP_OVERLAP (plan.h, tp_overlap): the dH rows of `rows_done` are final on this rank; their
 * reduction goes to the side stream, after everything the caller's stream holds so far, and the
 * caller's stream goes on with dW. launch_run joins the two before it returns. */
static flce_status overlap_dh(run *r, const block *rows_done)
{
    TRY(side_fork(r));
    CUstream caller = r->stream;
    r->stream = r->ctx->side;
    flce_status st = reduce_dh(r, rows_done);
    r->stream = caller;
    return st;
}

/* Stream s (the side or the fill stream) waits for everything the caller's stream holds so far. */
static flce_status fork_to(run *r, CUstream s)
{
    CUresult res = drv.EventRecord(r->ctx->fork, r->stream);
    if (res == CUDA_SUCCESS) res = drv.StreamWaitEvent(s, r->ctx->fork, 0);
    if (res != CUDA_SUCCESS) return drv_error(res, "handing work to a second stream");
    int known = 0;
    for (int i = 0; i < r->n_forked; i++) known |= r->forked[i] == s;
    if (!known) r->forked[r->n_forked++] = s;
    return FLCE_OK;
}

static flce_status side_fork(run *r)
{
    TRY(ctx_side_stream(r->ctx));
    return fork_to(r, r->ctx->side);
}

/* The caller's stream waits for the forked stream's work (also after a failure: a stream capture
 * must end joined). */
static flce_status side_join(run *r)
{
    CUresult res = CUDA_SUCCESS;
    for (int i = 0; i < r->n_forked; i++) { /* one event serves both: each wait takes its last record */
        CUresult e = drv.EventRecord(r->ctx->join, r->forked[i]);
        if (e == CUDA_SUCCESS) e = drv.StreamWaitEvent(r->stream, r->ctx->join, 0);
        if (res == CUDA_SUCCESS) res = e;
    }
    r->n_forked = 0;
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "joining the second stream");
}

/* dH summed over the ranks in fp32 (all-reduce; reduce-scatter to this rank's rows under SP),
 * then rounded once into the caller's grad_hidden (or added to it in accumulate mode); with
 * tp_overlap already done on the side stream, chunk by chunk. */
static flce_status finish_dh(run *r)
{
    const plan *pl = r->pl;
    if (!pl->need_dh_tp || !r->t->grad_hidden || pl->tp_overlap) return FLCE_OK;
    block all = {0, pl->n_local, 0, 0, 1, 1};
    return reduce_dh(r, &all);
}

/* Sequence parallelism: the per-token arrays that hold all tokens, by SP_* index. */
static void **sp_field(flce_tensors *t, int k, int none)
{
    switch (k) {
    case SP_LSE: return (void **)&t->lse;
    case SP_LOSS: return none ? (void **)&t->loss : NULL;
    case SP_LOSS_PER_TOKEN: return (void **)&t->loss_per_token;
    case SP_ZLOSS: return none ? (void **)&t->z_loss_out : NULL;
    case SP_LOGPROB: return (void **)&t->target_logprob;
    case SP_ENTROPY: return (void **)&t->entropy;
    default: return (void **)&t->argmax;
    }
}

/* SP: all-gathers the token-sharded inputs into the workspace and points `all` (a copy of the
 * caller's tensors) at them and at all-token stand-ins for the per-token outputs. */
static const float **sp_grad_field(flce_tensors *t, int k)
{
    return k == SP_GRAD_LOGPROB ? &t->grad_logprob : k == SP_GRAD_LSE ? &t->grad_lse
           : k == SP_GRAD_ENTROPY ? &t->grad_entropy : &t->grad_loss_per_token;
}

/* (SAVED: the forward's gathered hidden states and labels, its all-token outputs (lse, entropy)
 * stay in the workspace for the backward, which gathers only the upstream gradients; the forward
 * gathers none of these.) */
static flce_status sp_gather(run *r, const flce_tensors *caller, flce_tensors *all, launch_part part)
{
    const plan *pl = r->pl;
    uint64_t nl = (uint64_t)pl->n_local;
    int none = r->p->reduction == FLCE_REDUCTION_NONE;
    int inputs = part != PART_SAVED_GRADS, grads = part != PART_SAVE;
    *all = *caller;
    all->hidden = (const void *)(uintptr_t)(r->ws + pl->off_sp_hidden);
    all->labels = (const void *)(uintptr_t)(r->ws + pl->off_sp_labels);
    if (pl->off_sp_go && caller->grad_output) all->grad_output = (const float *)(uintptr_t)(r->ws + pl->off_sp_go);
    for (int k = 0; k < SP_OUTPUTS; k++) {
        void **f = sp_field(all, k, none);
        if (f && *f && pl->off_sp_out[k]) *f = (void *)(uintptr_t)(r->ws + pl->off_sp_out[k]);
    }
    for (int k = 0; k < SP_GRADS; k++) {
        const float **f = sp_grad_field(all, k);
        if (*f && pl->off_sp_grads[k]) *f = (const float *)(uintptr_t)(r->ws + pl->off_sp_grads[k]);
    }
    if (pl->off_sp_lse) all->lse = (float *)(uintptr_t)(r->ws + pl->off_sp_lse); /* backward's input */
    TRY(comm_group_start());
    flce_status st = FLCE_OK;
    if (inputs)
        st = comm_all_gather(caller->comm, caller->hidden, (void *)all->hidden,
                             nl * (uint64_t)pl->d * r->es, r->stream, "the hidden-state all-gather");
    if (st == FLCE_OK && inputs)
        st = comm_all_gather(caller->comm, caller->labels, (void *)all->labels,
                             nl * (uint64_t)(r->p->label_bits / 8), r->stream, "the label all-gather");
    if (st == FLCE_OK && grads && pl->off_sp_go && caller->grad_output)
        st = comm_all_gather(caller->comm, caller->grad_output, (void *)all->grad_output, nl * 4,
                             r->stream, "the grad_output all-gather");
    flce_tensors own = *caller; /* (the caller's pointers, read through sp_grad_field) */
    for (int k = 0; k < SP_GRADS && st == FLCE_OK && grads; k++) {
        const float *mine = *sp_grad_field(&own, k);
        if (mine && pl->off_sp_grads[k])
            st = comm_all_gather(caller->comm, mine, (void *)(uintptr_t)(r->ws + pl->off_sp_grads[k]), nl * 4,
                                 r->stream, "a per-token upstream gradient's all-gather");
    }
    if (st == FLCE_OK && pl->off_sp_lse)
        st = comm_all_gather(caller->comm, caller->lse, (void *)(uintptr_t)(r->ws + pl->off_sp_lse), nl * 4, r->stream, "the lse all-gather");
    flce_status end = comm_group_end();
    return st != FLCE_OK ? st : end;
}

/* SP: this rank's rows of every all-token output go back to the caller's arrays. */
static flce_status sp_scatter_outputs(run *r, const flce_tensors *caller)
{
    const plan *pl = r->pl;
    if (pl->op == FLCE_OP_BACKWARD) return FLCE_OK;
    int none = r->p->reduction == FLCE_REDUCTION_NONE;
    flce_tensors c = *caller;
    for (int k = 0; k < SP_OUTPUTS; k++) {
        void **f = sp_field(&c, k, none);
        if (!f || !*f || !pl->off_sp_out[k]) continue;
        uint64_t size = k == SP_ARGMAX ? 8 : 4, bytes = (uint64_t)pl->n_local * size;
        CUresult res = drv.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)*f,
                                           r->ws + pl->off_sp_out[k] + (uint64_t)pl->rank * bytes,
                                           (size_t)bytes, r->stream);
        if (res != CUDA_SUCCESS) return drv_error(res, "copying this rank's per-token outputs");
    }
    return FLCE_OK;
}

/* Split-phase TP forward: one half of it (launch.h). */
static flce_status run_tp_part(run *r, launch_part part, CUdeviceptr tp_buffer)
{
    block all = {0, r->pl->n, 0, r->pl->v, 1, 1};
    if (part == PART_TP_STATS) {
        TRY(run_logits(r, &all, 1, r->pl->saved)); /* SAVED: the logits stay for flce_backward */
        r->rp.tp_send = tp_buffer;
        return run_rows(r, K_TP_PACK, &all);
    }
    r->rp.tp_recv = tp_buffer;
    return run_rows(r, K_COMBINE, &all);
}

flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream, launch_part part,
                       CUdeviceptr tp_buffer)
{
    run r;
    flce_tensors all;
    memset(&r, 0, sizeof r);
    r.pl = pl, r.p = p, r.t = t, r.ctx = ctx, r.ws = ws, r.stream = stream;
    r.es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    TRY(get_kernels(ctx, pl, &r.k));
    if (pl->sp) {
        TRY(sp_gather(&r, t, &all, part));
        r.t = &all;
    }
    init_row_params(&r);
    block whole = {0, pl->n, 0, pl->v, 1, 1};
    TRY(run_rows(&r, K_PREPARE, &whole));
    if (pl->saved) {
        flce_status st = run_saved(&r, part, tp_buffer);
        flce_status joined = side_join(&r); /* (tp_overlap: dH's reduction beside dW) */
        TRY(st);
        TRY(joined);
        if (part == PART_TP_STATS) return FLCE_OK;
    } else if (part != PART_ALL) {
        TRY(run_tp_part(&r, part, tp_buffer));
        if (part == PART_TP_STATS) return FLCE_OK;
    } else if (pl->op == FLCE_OP_FORWARD) {
        TRY(run_forward(&r));
    } else {
        flce_status st = pl->recompute ? run_recompute(&r) : run_chunked(&r);
        flce_status joined = side_join(&r); /* the overlapped dH reductions (tp_overlap) */
        TRY(st);
        TRY(joined);
    }
    int reduced = p->reduction != FLCE_REDUCTION_NONE;
    if (pl->op != FLCE_OP_BACKWARD && part != PART_SAVED_GRADS && reduced && (r.t->loss || r.t->z_loss_out))
        TRY(run_rows(&r, K_REDUCE, &whole));
    if (part == PART_ALL || part == PART_SAVED_GRADS) TRY(finish_dh(&r));
    if (pl->sp && part != PART_SAVED_GRADS) TRY(sp_scatter_outputs(&r, t));
    return FLCE_OK;
}

flce_status launch_scale(flce_context *ctx, const plan *pl, const flce_tensors *t, CUstream stream)
{
    const kernel_spec *rowops = &pl->rowops;
    CUfunction fns[1][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, &rowops, 1, fns));
    size_t es = pl->logits.dtype == FLCE_DTYPE_F32 ? 4 : 2;
    const struct {
        const void *ptr;
        long long count;
        const char *what;
    } grads[] = {
        {t->grad_hidden, (long long)pl->n_local * pl->d, "scale kernel (grad_hidden)"},
        {t->grad_weight, (long long)pl->v * pl->d, "scale kernel (grad_weight)"},
        {t->grad_bias, (long long)pl->v, "scale kernel (grad_bias)"},
    };
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        if (!grads[i].ptr || grads[i].count < 1) continue;
        struct flce_row_params rp;
        memset(&rp, 0, sizeof rp);
        rp.cast_dst = addr(grads[i].ptr), rp.cast_count = grads[i].count;
        rp.cast_scale = addr(t->grad_output);
        /* A few resident CTAs per SM, grid-stride: when the scale is 1 each exits at once. */
        int64_t blocks = ceil_div(ceil_div(grads[i].count * (long long)es, 16), 256), cap = 8ll * ctx->num_sms;
        TRY(launch(fns[0][K_CAST], blocks < cap ? blocks : cap, 1, 256, 0, stream, &rp, grads[i].what));
    }
    return FLCE_OK;
}

/* FLCE_LOG=debug: what a call runs and, when AUTO chose, why (the cost model's two estimates).
 * Debug, not info: the Python binding asks flce_strategy_of on every step. */
void launch_log_plan(const plan *pl)
{
    if (pl->op == FLCE_OP_FORWARD) {
        log_msg(LOG_DEBUG, "forward: one pass over %lld tokens", (long long)pl->n);
        return;
    }
    char why[128] = "";
    if (pl->est_chunked_ms > 0 && pl->est_recompute_ms > 0)
        snprintf(why, sizeof why, "; AUTO's estimates: chunked %.1f ms, recompute %.1f ms",
                 pl->est_chunked_ms, pl->est_recompute_ms);
    if (pl->recompute)
        log_msg(LOG_DEBUG, "recompute: %lld vocab chunk(s) of %lld columns, workspace %.1f MiB%s",
                (long long)pl->n_vchunks, (long long)pl->chunk_cols, (double)pl->workspace_bytes / (1 << 20), why);
    else
        log_msg(LOG_DEBUG, "chunked%s: %lld token chunk(s) of %lld rows, workspace %.1f MiB%s",
                pl->qrows ? " (compact bf16 logits, row-scaled)" : pl->compact ? " (compact fp16 logits)" : "", (long long)pl->n_chunks, (long long)pl->chunk_rows,
                (double)pl->workspace_bytes / (1 << 20), why);
}

/* A plan that took more than the default 512 MiB of logits because the device has room (plan.h
 * mem_cap) but whose workspace could not be allocated (memory held by the caller's framework):
 * the lean plan instead, as with no device share at all, so the job goes on. Its token chunks
 * differ, so dW's bits may differ from a call that got the grown workspace. */
static flce_status launch_lean_plan(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                                    CUstream stream, plan *pl, CUdeviceptr *ws)
{
    log_msg(LOG_INFO, "%.1f MiB of workspace not available: falling back to the 512 MiB plan",
            (double)pl->workspace_bytes / (1 << 20));
    err_clear();
    TRY(plan_make_dev(p, op, ctx->name, ctx->sm, ctx->num_sms, 0, t, pl));
    TRY(launch_prepare_kernels(ctx, pl));
    return ctx_workspace(ctx, pl->workspace_bytes, stream, ws);
}

flce_status launch_call(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                        CUstream stream, launch_part part, CUdeviceptr tp_buffer)
{
    plan pl;
    TRY(plan_make_dev(p, op, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, t, &pl));
    if (t->workspace && t->workspace_bytes < pl.workspace_bytes)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.workspace_bytes=%llu: this call needs %llu (flce_workspace_size gives the "
                       "most any call of this problem needs)",
                       (unsigned long long)t->workspace_bytes,
                       (unsigned long long)pl.workspace_bytes);

    launch_prebuild_kernels(ctx, &pl, 0); /* FLCE_UNLOCKED_COMPILE: compiles before the lock */
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_take_flag(ctx);
    if (st == FLCE_OK) st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        CUdeviceptr ws = (CUdeviceptr)(uintptr_t)t->workspace;
        st = launch_prepare_kernels(ctx, &pl);
        if (st == FLCE_OK && !ws) st = ctx_workspace(ctx, pl.workspace_bytes, stream, &ws);
        if (st == FLCE_ERR_OUT_OF_MEMORY && pl.grown) st = launch_lean_plan(ctx, p, op, t, stream, &pl, &ws);
        if (st == FLCE_OK) {
            log_msg(LOG_DEBUG, "op %d: N=%lld D=%lld V=%lld, %d vocab splits", (int)op, (long long)pl.n,
                    (long long)pl.d, (long long)pl.v, pl.splits);
            launch_log_plan(&pl);
            st = launch_run(ctx, &pl, p, t, ws, stream, part, tp_buffer);
            if (!t->workspace) { /* (after a failed call too: some of its work may be queued) */
                flce_status done = ctx_workspace_done(ctx, stream);
                if (st == FLCE_OK) st = done;
            }
        }
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
