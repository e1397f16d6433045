/*
 * launch_prim.c — the launch path's ground floor (launch_prim.h): one kernel launch (plain or in
 * clusters), the resident CTA slots of a persistent launch, workspace addresses, a row kernel over a
 * block, and every kernel of a plan loaded (JIT) at once. Moved here from launch.c and
 * launch_call.c so that the files above call down only.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "launch_prim.h"
#include "log.h"
#include "timeline.h"
#include "tma.h"

flce_status launch(CUfunction fn, int64_t gx, int64_t gy, int threads, size_t smem,
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
flce_status launch_cluster(CUfunction fn, int64_t gx, int64_t gy, int cluster, int threads, size_t smem,
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
int resident_slots(const flce_context *ctx, const kernel_spec *s, CUfunction fn)
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

unsigned long long ws_at(const run *r, uint64_t off, int needed)
{
    return needed ? r->ws + off : 0;
}

flce_status run_rows(run *r, int kernel, const block *b)
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

flce_status get_kernels(flce_context *ctx, const plan *pl, kernels *k)
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

