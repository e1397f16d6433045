/* test_distill_tp.c — flce_distill_loss_and_grad (and flce_topk_logprobs with tensors.comm) under
 * tensor parallelism (problem.tp_size > 1) on ONE GPU: the ranks are threads, each with its own context and stream, and their collectives go through
 * tests/fake_nccl.c (loaded as NCCL through FLCE_NCCL_LIBRARY; NCCL itself refuses two ranks on one
 * device). For identical global data, every rank's loss and divergence must match testing/ref.c
 * ref_distill in fp64 within test_distill_gpu's tolerances, bit for bit across ranks; dHs (summed
 * over the ranks by the call) likewise; dWs reassembled from the shards. Uneven shards, 2 and 3
 * ranks, several token chunks, ignored tokens, every reduction, fp16 and bf16, T != 1, the CE term,
 * the teacher as top-k, the fp32-logits path (reverse KL, JSD with beta > 0, fp32 inputs); and ranks
 * whose shards leave a gap are reported by flce_check. Exit 77 without a GPU. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devmem.h"
#include "flce.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"

static host_rng rng;
static int (*make_world)(int n, void **comms);

typedef struct tcase {
    const char *name;
    int64_t n, ds, dt, v;
    int tp;
    int64_t cut[4];        /* shard r is [cut[r], cut[r + 1]) */
    flce_dtype dtype;
    flce_reduction red;
    float temperature;
    uint64_t budget;       /* 0: one chunk */
    int ignored_every, grad_output, no_labels;
    int gap;               /* rank 1 claims one column more at its start: the shards overlap */
    int k;                 /* > 0: the teacher as top-k (rank_io.ids, lps) */
    float ce_weight;
    flce_divergence div;   /* (0: forward KL) reverse KL, JSD with beta > 0 and fp32 take the fp32-logits path */
    float beta;
} tcase;

typedef struct rank_io {
    const tcase *c;
    int rank;
    void *comm;
    const double *hs, *ws, *ht, *wt, *go;
    const int32_t *labels;
    const int64_t *ids;   /* the top-k teacher's N × k global ids and log-probs */
    const double *lps;
    double *loss, *div, *dh, *dw; /* this rank's results (dw: its shard's rows) */
    flce_status st, chk;
    char msg[512];
} rank_io;

/* A rank thread's own context on device 0 (the ranks share the GPU); msg says why on failure. */
static flce_status rank_context(flce_context **ctx, char *msg, size_t cap)
{
    flce_status st = devmem_use(0);
    if (st == FLCE_OK) st = flce_context_create(0, ctx);
    if (st != FLCE_OK) snprintf(msg, cap, "context: %s", flce_last_error());
    return st;
}

static void *rank_main(void *arg)
{
    rank_io *io = arg;
    const tcase *c = io->c;
    const int64_t n = c->n, ds = c->ds, dt = c->dt, r0 = c->cut[io->rank] + (c->gap && io->rank == 1 ? -1 : 0);
    const int64_t vr = c->cut[io->rank + 1] - r0, n_loss = c->red == FLCE_REDUCTION_NONE ? n : 1;
    const size_t es = host_dtype_size(c->dtype);
    flce_context *ctx = NULL;
    if ((io->st = rank_context(&ctx, io->msg, sizeof io->msg)) != FLCE_OK) return NULL;
    flce_distill_problem p;
    flce_distill_problem_init(&p);
    p.tokens = n, p.hidden_student = ds, p.hidden_teacher = dt, p.vocab = vr, p.dtype = c->dtype;
    p.temperature = c->temperature, p.reduction = c->red, p.memory_budget = c->budget, p.ce_weight = c->ce_weight;
    p.vocab_offset = r0, p.vocab_total = c->v, p.tp_rank = io->rank, p.tp_size = c->tp;
    p.divergence = c->div, p.beta = c->beta;
    flce_distill_tensors t;
    flce_distill_tensors_init(&t);
    t.student_hidden = upload_dtype(c->dtype, io->hs, n * ds);
    t.student_weight = upload_dtype(c->dtype, io->ws + r0 * ds, vr * ds);
    void *dids = NULL;
    if (c->k) {
        p.teacher_topk = c->k, p.hidden_teacher = 0;
        if (devmem_alloc(&dids, (size_t)(n * c->k) * 8) == FLCE_OK) devmem_upload(dids, io->ids, (size_t)(n * c->k) * 8);
        t.teacher_topk_indices = dids, t.teacher_topk_logprobs = upload_f32(io->lps, n * c->k);
    } else {
        t.teacher_hidden = upload_dtype(c->dtype, io->ht, n * dt);
        t.teacher_weight = upload_dtype(c->dtype, io->wt + r0 * dt, vr * dt);
    }
    void *dlab = NULL;
    if (!c->no_labels && devmem_alloc(&dlab, (size_t)n * 4) == FLCE_OK) devmem_upload(dlab, io->labels, (size_t)n * 4);
    t.labels = dlab;
    t.grad_output = c->grad_output ? upload_f32(io->go, n_loss) : NULL;
    t.loss = poisoned((size_t)n_loss * 4), t.divergence = poisoned((size_t)n * 4);
    t.grad_student_hidden = poisoned((size_t)(n * ds) * es), t.grad_student_weight = poisoned((size_t)(vr * ds) * es);
    t.comm = c->tp > 1 ? io->comm : NULL;
    io->st = flce_distill_loss_and_grad(ctx, &p, &t, NULL);
    if (io->st != FLCE_OK) snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    io->chk = flce_check(ctx, NULL);
    if (io->chk != FLCE_OK && io->st == FLCE_OK) snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    down_f32(t.loss, io->loss, n_loss), down_f32(t.divergence, io->div, n);
    download_f64(c->dtype, t.grad_student_hidden, io->dh, (size_t)(n * ds));
    download_f64(c->dtype, t.grad_student_weight, io->dw, (size_t)(vr * ds));
    devmem_free((void *)t.student_hidden), devmem_free((void *)t.student_weight);
    devmem_free((void *)t.teacher_hidden), devmem_free((void *)t.teacher_weight), devmem_free(dlab);
    devmem_free(dids), devmem_free((void *)t.teacher_topk_logprobs);
    devmem_free((void *)t.grad_output), devmem_free(t.loss), devmem_free(t.divergence);
    devmem_free(t.grad_student_hidden), devmem_free(t.grad_student_weight);
    flce_context_destroy(ctx);
    return NULL;
}

static void fill(double *x, int64_t count, double scale, flce_dtype t)
{
    for (int64_t i = 0; i < count; i++) x[i] = scale * host_rng_normal(&rng);
    host_round_to_dtype(t, x, (size_t)count);
}

/* Runs case c's ranks (threads) on the data in proto (its c, rank, comm and outputs are filled here). */
static void run_ranks(const tcase *c, const rank_io *proto, rank_io *io)
{
    const int64_t n = c->n, ds = c->ds, n_loss = c->red == FLCE_REDUCTION_NONE ? n : 1;
    void *comms[4] = {0};
    if (c->tp > 1) CHECK(make_world(c->tp, comms) == 0);
    pthread_t th[4];
    for (int r = 0; r < c->tp; r++) {
        io[r] = *proto;
        io[r].c = c, io[r].rank = r, io[r].comm = comms[r];
        io[r].loss = dalloc(n_loss), io[r].div = dalloc(n), io[r].dh = dalloc(n * ds);
        io[r].dw = dalloc((c->cut[r + 1] - c->cut[r] + 1) * ds);
        CHECK(pthread_create(&th[r], NULL, rank_main, &io[r]) == 0);
    }
    for (int r = 0; r < c->tp; r++) pthread_join(th[r], NULL);
}

static void run_case(const tcase *c)
{
    const int64_t n = c->n, ds = c->ds, dt = c->dt, v = c->v, n_loss = c->red == FLCE_REDUCTION_NONE ? n : 1;
    double *hs = dalloc(n * ds), *ws = dalloc(v * ds), *ht = dalloc(n * dt), *wt = dalloc(v * dt);
    fill(hs, n * ds, 1.0, c->dtype), fill(ws, v * ds, 1.5 / sqrt((double)ds), c->dtype);
    fill(ht, n * dt, 1.0, c->dtype), fill(wt, v * dt, 2.0 / sqrt((double)dt), c->dtype);
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *labels32 = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        labels[i] = c->ignored_every && i % c->ignored_every == 0 ? -100 : host_rng_below(&rng, v);
        labels32[i] = (int32_t)labels[i];
    }
    double *go = dalloc(n_loss);
    for (int64_t i = 0; i < n_loss; i++) go[i] = c->grad_output ? 0.5 + host_rng_uniform(&rng) : 1.0;
    ref_distill_problem rp = {(ref_divergence)c->div, c->beta, c->temperature, c->ce_weight, -100, c->red};
    const int64_t *rlab = c->no_labels ? NULL : labels;
    double *rl = dalloc(n_loss), *rdh = dalloc(n * ds), *rdw = dalloc(v * ds), *rdiv = dalloc(n);
    CHECKF(ref_distill(&rp, n, ds, dt, v, hs, ws, ht, wt, rlab, c->grad_output ? go : NULL, rl, rdh, rdw) == 0,
           "%s: reference failed", c->name);
    ref_distill_divergences(&rp, c->n, c->ds, c->dt, c->v, hs, ws, ht, wt, rlab, rdiv);

    rank_io proto, io[4];
    memset(&proto, 0, sizeof proto);
    proto.hs = hs, proto.ws = ws, proto.ht = ht, proto.wt = wt, proto.go = go, proto.labels = labels32;
    run_ranks(c, &proto, io);
    if (c->gap) { /* shards that overlap: flce_check reports it on every rank */
        for (int r = 0; r < c->tp; r++)
            CHECKF(io[r].st == FLCE_OK && io[r].chk == FLCE_ERR_INVALID_ARGUMENT &&
                   strstr(io[r].msg, "overlap or leave gaps"), "%s: rank %d: %s / %s: %s", c->name, r,
                   flce_status_name(io[r].st), flce_status_name(io[r].chk), io[r].msg);
    } else {
        for (int r = 0; r < c->tp; r++) {
            CHECKF(io[r].st == FLCE_OK && io[r].chk == FLCE_OK, "%s: rank %d: %s", c->name, r, io[r].msg);
            const double e_loss = ref_rel_l2(rl, io[r].loss, (size_t)n_loss), e_div = ref_rel_l2(rdiv, io[r].div, (size_t)n);
            const double e_dh = ref_rel_l2(rdh, io[r].dh, (size_t)(n * ds));
            const int64_t rows = c->cut[r + 1] - c->cut[r];
            const double e_dw = ref_rel_l2(rdw + c->cut[r] * ds, io[r].dw, (size_t)(rows * ds));
            CHECKF(e_loss <= 1e-4 && e_div <= 1e-4, "%s: rank %d: loss %.2e (%g vs %g) divergence %.2e", c->name, r,
                   e_loss, io[r].loss[0], rl[0], e_div);
            CHECKF(e_dh <= 4e-3 && e_dw <= 4e-3, "%s: rank %d: dHs %.2e dWs %.2e", c->name, r, e_dh, e_dw);
            /* what every rank computes redundantly is the same bits */
            CHECKF(!memcmp(io[r].loss, io[0].loss, sizeof(double) * (size_t)n_loss) &&
                   !memcmp(io[r].div, io[0].div, sizeof(double) * (size_t)n) &&
                   !memcmp(io[r].dh, io[0].dh, sizeof(double) * (size_t)(n * ds)),
                   "%s: rank %d's loss, divergence or dHs differ from rank 0's", c->name, r);
            if (r == 0) printf("  %s: loss %.2e divergence %.2e dHs %.2e dWs(rank 0) %.2e\n", c->name, e_loss, e_div, e_dh, e_dw);
        }
    }
    for (int r = 0; r < c->tp; r++) free(io[r].loss), free(io[r].div), free(io[r].dh), free(io[r].dw);
    free(hs), free(ws), free(ht), free(wt), free(labels), free(labels32), free(go);
    free(rl), free(rdh), free(rdw), free(rdiv);
}

static void shards_match_the_reference(void)
{
    static const tcase cases[] = {
        {"bf16 2 ranks mean", 256, 64, 128, 1000, 2, {0, 400, 1000}, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 1.0f, 0, 5, 0, 0, 0},
        {"fp16 2 ranks sum T=2 chunks", 300, 128, 64, 1500, 2, {0, 1024, 1500}, FLCE_DTYPE_F16, FLCE_REDUCTION_SUM, 2.0f,
         420000, 7, 1, 0, 0},
        {"bf16 3 ranks none chunks", 200, 64, 64, 1200, 3, {0, 256, 776, 1200}, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE,
         1.5f, 1200 * 2 * 4 * 2, 0, 1, 0, 0},
        {"bf16 3 ranks no labels", 130, 64, 128, 2000, 3, {0, 640, 1328, 2000}, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN,
         1.0f, 0, 0, 0, 1, 0},
        {"bf16 2 ranks CE 0.7 chunks", 300, 64, 128, 1200, 2, {0, 520, 1200}, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN,
         1.0f, 300000, 6, 1, 0, 0, 0, 0.7f},
        {"fp16 3 ranks CE 0.3 none", 150, 64, 64, 900, 3, {0, 300, 611, 900}, FLCE_DTYPE_F16, FLCE_REDUCTION_NONE,
         1.0f, 0, 4, 1, 0, 0, 0, 0.3f},
        /* the fp32-logits path: two reads of each shard's rows with the sums' all-reduce between */
        {"bf16 2 ranks reverse KL CE 0.5 chunks", 300, 64, 128, 1200, 2, {0, 520, 1200}, FLCE_DTYPE_BF16,
         FLCE_REDUCTION_MEAN, 1.0f, 1200000, 6, 1, 0, 0, 0, 0.5f, FLCE_DIVERGENCE_REVERSE_KL},
        {"fp16 3 ranks JSD 0.5 none T=2", 200, 64, 64, 1100, 3, {0, 256, 700, 1100}, FLCE_DTYPE_F16,
         FLCE_REDUCTION_NONE, 2.0f, 0, 5, 1, 0, 0, 0, 0.f, FLCE_DIVERGENCE_JSD, 0.5f},
        {"bf16 2 ranks JSD 0.3 no labels chunks", 260, 128, 64, 1500, 2, {0, 1000, 1500}, FLCE_DTYPE_BF16,
         FLCE_REDUCTION_MEAN, 1.0f, 1500000, 0, 0, 1, 0, 0, 0.f, FLCE_DIVERGENCE_JSD, 0.3f},
        {"fp32 2 ranks forward KL sum CE 0.2", 200, 64, 64, 1000, 2, {0, 600, 1000}, FLCE_DTYPE_F32,
         FLCE_REDUCTION_SUM, 1.0f, 0, 7, 1, 0, 0, 0, 0.2f},
        {"fp32 3 ranks reverse KL none chunks", 200, 64, 64, 900, 3, {0, 300, 640, 900}, FLCE_DTYPE_F32,
         FLCE_REDUCTION_NONE, 1.5f, 700000, 4, 1, 0, 0, 0, 0.f, FLCE_DIVERGENCE_REVERSE_KL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) run_case(&cases[k]);
}

/* The teacher as top-k (global ids) with the CE term: the shards' call against the one-GPU call on the
 * whole weights (itself checked against fp64 by test_distill_gpu); a token whose ids repeat is NaN on
 * every rank. */
static void topk_teacher_case(flce_dtype dtype) /* bf16: the compact path; fp32: the fp32 path's two reads */
{
    const int64_t n = 160, ds = 64, v = 1000, k = 16;
    const tcase one = {"top-k one GPU", 160, 64, 0, 1000, 1, {0, 1000}, dtype, FLCE_REDUCTION_MEAN,
                       1.0f, 0, 5, 0, 0, 0, 16, 0.4f};
    const tcase two = {"top-k 2 ranks", 160, 64, 0, 1000, 2, {0, 424, 1000}, dtype,
                       FLCE_REDUCTION_MEAN, 1.0f, 0, 5, 0, 0, 0, 16, 0.4f};
    double *hs = dalloc(n * ds), *ws = dalloc(v * ds), *lps = dalloc(n * k);
    fill(hs, n * ds, 1.0, FLCE_DTYPE_BF16), fill(ws, v * ds, 1.5 / sqrt((double)ds), FLCE_DTYPE_BF16);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n * k));
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        /* distinct ids; token i % 4 == 1 all in rank 0's shard, == 2 all in rank 1's, else anywhere */
        const int64_t lo = i % 4 == 1 ? 0 : i % 4 == 2 ? 424 : 0, span = i % 4 == 1 ? 424 : i % 4 == 2 ? 576 : v;
        double s = 0;
        for (int64_t q = 0; q < k; q++) {
            int64_t id;
            int dup;
            do {
                id = lo + (int64_t)host_rng_below(&rng, (uint64_t)span), dup = 0;
                for (int64_t u = 0; u < q; u++) dup |= ids[i * k + u] == id;
            } while (dup);
            ids[i * k + q] = id, lps[i * k + q] = exp(2.0 * host_rng_normal(&rng)), s += lps[i * k + q] / 0.9;
        }
        for (int64_t q = 0; q < k; q++) lps[i * k + q] = log(lps[i * k + q] / s); /* Σ p = 0.9 */
        labels[i] = i % 5 == 0 ? -100 : (int32_t)host_rng_below(&rng, v);
    }
    ids[3 * k + 5] = ids[3 * k + 2]; /* token 3: a repeated id */
    rank_io proto;
    memset(&proto, 0, sizeof proto);
    proto.hs = hs, proto.ws = ws, proto.labels = labels, proto.ids = ids, proto.lps = lps;
    rank_io a[4], b[4];
    run_ranks(&one, &proto, a);
    run_ranks(&two, &proto, b);
    CHECKF(a[0].st == FLCE_OK && a[0].chk == FLCE_OK, "one GPU: %s", a[0].msg);
    for (int r = 0; r < 2; r++) {
        CHECKF(b[r].st == FLCE_OK && b[r].chk == FLCE_OK, "rank %d: %s", r, b[r].msg);
        CHECKF(isnan(b[r].div[3]) && isnan(a[0].div[3]) && isnan(b[r].dh[3 * ds]), "rank %d: token 3 not NaN", r);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            if (i != 3) bad += !(fabs(b[r].div[i] - a[0].div[i]) <= 2e-5 * (1 + fabs(a[0].div[i])));
        CHECKF(bad == 0, "rank %d: %d divergences differ from the one-GPU call's", r, bad);
        double *dh1 = dalloc(n * ds), *dh2 = dalloc(n * ds);
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) /* (token 3's NaN row is out of the mean's sum: not compared) */
            if (i != 3)
                for (int64_t l = 0; l < ds; l++) dh1[m] = a[0].dh[i * ds + l], dh2[m] = b[r].dh[i * ds + l], m++;
        const int64_t rows = two.cut[r + 1] - two.cut[r];
        const double e_dh = ref_rel_l2(dh1, dh2, (size_t)m);
        printf("  top-k %s rank %d: dHs against one GPU %.2e (token 3 NaN on both)\n", host_dtype_name(dtype), r, e_dh);
        CHECKF(e_dh <= 8e-3, "rank %d: dHs %.2e against the one-GPU call", r, e_dh);
        CHECKF(isnan(b[r].loss[0]) && isnan(a[0].loss[0]) && rows > 0, "rank %d: the mean loss holds token 3's NaN", r);
        free(dh1), free(dh2);
    }
    for (int r = 0; r < 2; r++) free(b[r].loss), free(b[r].div), free(b[r].dh), free(b[r].dw);
    free(a[0].loss), free(a[0].div), free(a[0].dh), free(a[0].dw);
    free(hs), free(ws), free(lps), free(ids), free(labels);
}

static void topk_teacher_shards_match_one_gpu(void)
{
    topk_teacher_case(FLCE_DTYPE_BF16);
    topk_teacher_case(FLCE_DTYPE_F32);
}

/* flce_topk_logprobs with tensors.comm (runtime/topk.c's own all-gather) over 2 uneven shards: every
 * rank's ids, log-probs and lse the same bits, and equal to the one-GPU call's ids, log-probs within
 * 1e-5 (the merge ranks fp32 candidates; the one-GPU call the same values). */
typedef struct topk_io {
    int rank, tp;
    void *comm;
    int64_t n, d, v, k, r0, vr;
    const double *h, *w;
    int64_t *ids;
    double *lp, *lse;
    flce_status st;
    char msg[256];
} topk_io;

static void *topk_rank(void *arg)
{
    topk_io *io = arg;
    flce_context *ctx = NULL;
    if ((io->st = rank_context(&ctx, io->msg, sizeof io->msg)) != FLCE_OK) return NULL;
    flce_topk_problem p;
    flce_topk_problem_init(&p);
    p.tokens = io->n, p.hidden = io->d, p.vocab = io->vr, p.k = (int32_t)io->k, p.temperature = 1.25f;
    p.vocab_offset = io->r0, p.vocab_total = io->v, p.tp_rank = io->rank, p.tp_size = io->tp;
    flce_topk_tensors t;
    flce_topk_tensors_init(&t);
    t.hidden = upload_dtype(FLCE_DTYPE_BF16, io->h, io->n * io->d);
    t.weight = upload_dtype(FLCE_DTYPE_BF16, io->w + io->r0 * io->d, io->vr * io->d);
    t.indices = poisoned((size_t)(io->n * io->k) * 8), t.logprobs = poisoned((size_t)(io->n * io->k) * 4);
    t.lse = poisoned((size_t)io->n * 4);
    t.comm = io->tp > 1 ? io->comm : NULL;
    io->st = flce_topk_logprobs(ctx, &p, &t, NULL);
    if (io->st == FLCE_OK) io->st = flce_check(ctx, NULL);
    if (io->st != FLCE_OK) snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    devmem_download(io->ids, t.indices, (size_t)(io->n * io->k) * 8);
    down_f32(t.logprobs, io->lp, io->n * io->k), down_f32(t.lse, io->lse, io->n);
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(t.indices), devmem_free(t.logprobs);
    devmem_free(t.lse);
    flce_context_destroy(ctx);
    return NULL;
}

static void topk_logprobs_with_the_communicator(void)
{
    const int64_t n = 96, d = 128, v = 3000, k = 24, cut = 1317;
    double *h = dalloc(n * d), *w = dalloc(v * d);
    fill(h, n * d, 1.0, FLCE_DTYPE_BF16), fill(w, v * d, 3.0 / sqrt((double)d), FLCE_DTYPE_BF16);
    void *comms[2] = {0};
    CHECK(make_world(2, comms) == 0);
    topk_io io[3];
    for (int r = 0; r < 3; r++) { /* io[0], io[1]: the ranks; io[2]: the one-GPU call */
        const int tp = r < 2 ? 2 : 1;
        io[r] = (topk_io){r < 2 ? r : 0, tp, r < 2 ? comms[r] : NULL, n, d, v, k, r == 1 ? cut : 0,
                          r == 0 ? cut : r == 1 ? v - cut : v, h, w, malloc(sizeof(int64_t) * (size_t)(n * k)),
                          dalloc(n * k), dalloc(n), FLCE_OK, ""};
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++) CHECK(pthread_create(&th[r], NULL, topk_rank, &io[r]) == 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    topk_rank(&io[2]);
    for (int r = 0; r < 3; r++) CHECKF(io[r].st == FLCE_OK, "%s: %s", r < 2 ? "rank" : "one GPU", io[r].msg);
    CHECK(!memcmp(io[0].ids, io[1].ids, sizeof(int64_t) * (size_t)(n * k)) &&
          !memcmp(io[0].lp, io[1].lp, sizeof(double) * (size_t)(n * k)) &&
          !memcmp(io[0].lse, io[1].lse, sizeof(double) * (size_t)n));
    int64_t ids_differ = 0;
    double worst = 0;
    for (int64_t e = 0; e < n * k; e++) {
        ids_differ += io[0].ids[e] != io[2].ids[e];
        worst = fmax(worst, fabs(io[0].lp[e] - io[2].lp[e]));
    }
    printf("  top-k with comm: %lld ids differ from the one-GPU call's, log-probs within %.1e\n", (long long)ids_differ,
           worst);
    CHECKF(ids_differ == 0 && worst <= 1e-5, "%lld ids differ, log-probs %.2e", (long long)ids_differ, worst);
    for (int r = 0; r < 3; r++) free(io[r].ids), free(io[r].lp), free(io[r].lse);
    free(h), free(w);
}

static void overlapping_shards_are_reported(void)
{
    static const tcase c = {"overlap", 64, 64, 64, 800, 2, {0, 400, 800}, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 1.0f,
                            0, 0, 0, 0, 1};
    run_case(&c);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    void *fake = dlopen(FAKE_NCCL, RTLD_NOW | RTLD_GLOBAL);
    make_world = fake ? (int (*)(int, void **))dlsym(fake, "fake_nccl_world") : NULL;
    if (!make_world) {
        printf("FAIL: %s: %s\n", FAKE_NCCL, dlerror());
        return 1;
    }
    /* flce opens NCCL on its first collective: this same file (dlopen returns the loaded one) */
    setenv("FLCE_NCCL_LIBRARY", FAKE_NCCL, 1);
    uint64_t seed = host_fresh_seed();
    printf("seed %llu (FLCE_SEED=%llu reproduces)\n", (unsigned long long)seed, (unsigned long long)seed);
    host_rng_seed(&rng, seed);
    RUN(shards_match_the_reference);
    RUN(topk_teacher_shards_match_one_gpu);
    RUN(topk_logprobs_with_the_communicator);
    RUN(overlapping_shards_are_reported);
    FINISH();
}
