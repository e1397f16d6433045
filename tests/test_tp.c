/* test_tp.c — tensor and sequence parallelism (docs/DESIGN.md §2) on 2 and 4 GPUs: one host thread per
 * rank with its own context, stream and NCCL communicator. For identical global data, the loss,
 * lse, per-token outputs and gradients (dW reassembled from the shards, dH) must match the fp64
 * reference and a single-GPU flce run within the single-GPU tolerances, and every rank must hold
 * the same bits of everything it computes redundantly. Uneven shards, ranks that hold no target,
 * all-ignored batches, every option, the split-phase API, and shard descriptions that disagree. And
 * the top-k log-probabilities with the communicator over uneven shards (both ranks the same bits).
 * Exits 77 (skipped) with fewer than 2 GPUs. */
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_data.h"
#include "check.h"
#include "error.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"
#include "spec.h"

/* OP_SAVED: strategy SAVED, flce_forward then flce_backward with the per-token outputs' upstream
 * gradients (tcase.gout); OP_SAVED_SPLIT: the same with the split-phase forward and dH summed by the
 * caller. */
enum { OP_LOSS_AND_GRAD, OP_FORWARD, OP_FWD_THEN_BWD, OP_SPLIT_PHASE, OP_SAVED, OP_SAVED_SPLIT };
enum { O_SMOOTH = 1, O_ZLOSS = 2, O_SOFTCAP = 4, O_TEMP = 8, O_WEIGHTS = 16, O_BIAS = 32, O_TOKENS = 64 };
enum { LAB_RANDOM, LAB_RANK0, LAB_IGNORED };

typedef struct tcase {
    const char *name;
    int64_t n, d, v;       /* global tokens, hidden, global vocab */
    flce_dtype dtype;
    flce_reduction red;
    int sp, op, opts, labels, label_bits;
    flce_strategy strategy;
    uint64_t budget;
    double sd;             /* logit standard deviation */
    int gout;              /* problem.grad_outputs (FLCE_GRAD_LOGPROB, LSE, ENTROPY) */
} tcase;

/* One case's global data, shared read-only by the rank threads. */
typedef struct gdata {
    double *h, *w, *b, *cw, *go;
    double *glp, *glse, *gh; /* upstream gradients of log-probs, lse and entropy (advantages: both signs) */
    int64_t *labels;
    int64_t cut[9];        /* shard r is [cut[r], cut[r+1]) */
} gdata;

typedef struct rank_io {
    const tcase *c;
    const gdata *g;
    int tp, rank;
    flce_context *ctx;
    ncclComm_t comm;
    int64_t rows;          /* tokens this rank sees results for */
    double *loss, *lse, *dh, *dw, *db, *lpt, *lp, *ent;
    int64_t *am;
    flce_status st;
    char msg[600];
} rank_io;

static host_rng rng;
static int n_gpus;
static flce_context *ctxs[8];

static int register_workspace(void)
{
    const char *e = getenv("FLCE_TEST_TP_REGISTER");
    return e && e[0] == '1';
}

static double tol_grad(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 1e-4 : 4e-3; }

static void fill_problem(const tcase *c, flce_problem *p)
{
    flce_problem_init(p);
    p->hidden = c->d, p->vocab_total = c->v, p->dtype = c->dtype, p->reduction = c->red;
    p->label_bits = c->label_bits ? c->label_bits : 32;
    p->label_smoothing = c->opts & O_SMOOTH ? 0.1f : 0.f;
    p->z_loss = c->opts & O_ZLOSS ? 1e-3f : 0.f;
    p->softcap = c->opts & O_SOFTCAP ? 15.f : 0.f;
    p->temperature = c->opts & O_TEMP ? 1.3f : 1.f;
    p->has_class_weights = !!(c->opts & O_WEIGHTS);
    p->has_bias = !!(c->opts & O_BIAS);
    p->strategy = c->strategy, p->memory_budget = c->budget;
}

static flce_status rank_run(rank_io *io)
{
    const tcase *c = io->c;
    const gdata *g = io->g;
    int64_t off = g->cut[io->rank], shard = g->cut[io->rank + 1] - off, d = c->d;
    int64_t row0 = c->sp ? io->rank * io->rows : 0, rows = io->rows;
    int none = c->red == FLCE_REDUCTION_NONE;
    flce_problem p;
    fill_problem(c, &p);
    p.tokens = rows, p.vocab_shard = shard, p.vocab_offset = off;
    p.tp_rank = io->rank, p.tp_size = io->tp, p.sequence_parallel = c->sp;
    int lb = p.label_bits / 8;
    TRY(devmem_use(io->rank));
    void *stream = NULL;
    TRY(devmem_stream_create(&stream));

    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = upload_dtype(c->dtype, g->h + row0 * d, rows * d);
    t.weight = upload_dtype(c->dtype, g->w + off * d, shard * d);
    void *labels = malloc((size_t)rows * (size_t)lb), *d_labels = NULL;
    for (int64_t i = 0; i < rows; i++) {
        if (lb == 4) ((int32_t *)labels)[i] = (int32_t)g->labels[row0 + i];
        else ((int64_t *)labels)[i] = g->labels[row0 + i];
    }
    devmem_alloc(&d_labels, (size_t)rows * (size_t)lb);
    devmem_upload(d_labels, labels, (size_t)rows * (size_t)lb);
    free(labels);
    t.labels = d_labels;
    t.bias = p.has_bias ? upload_dtype(c->dtype, g->b + off, shard) : NULL;
    t.class_weights = p.has_class_weights ? upload_f32(g->cw, c->v) : NULL;
    t.grad_output = none ? upload_f32(g->go + row0, rows) : upload_f32(g->go, 1);
    int grads = c->op != OP_FORWARD, split = c->op == OP_SPLIT_PHASE || c->op == OP_SAVED_SPLIT;
    int saved = c->op == OP_SAVED || c->op == OP_SAVED_SPLIT;
    if (saved) {
        p.strategy = FLCE_STRATEGY_SAVED;
        p.accumulate_grad_hidden = split; /* every call of SAVED takes the same problem */
    }
    if (c->gout) { /* OP_SAVED*, or OP_LOSS_AND_GRAD: the upstream gradients given with the call */
        p.grad_outputs = c->gout;
        if (c->gout & FLCE_GRAD_LOGPROB) t.grad_logprob = upload_f32(g->glp + row0, rows);
        if (c->gout & FLCE_GRAD_LSE) t.grad_lse = upload_f32(g->glse + row0, rows);
        if (c->gout & FLCE_GRAD_ENTROPY) t.grad_entropy = upload_f32(g->gh + row0, rows);
    }
    size_t es = host_dtype_size(c->dtype), dh_es = split ? 4 : es;
    float *loss = poisoned((size_t)rows * 4), *lse = poisoned((size_t)rows * 4);
    float *lpt = NULL, *lp = NULL, *ent = NULL;
    int64_t *am = NULL;
    if (c->opts & O_TOKENS) {
        lpt = poisoned((size_t)rows * 4), lp = poisoned((size_t)rows * 4), ent = poisoned((size_t)rows * 4);
        am = poisoned((size_t)rows * 8);
    }
    t.loss = loss, t.lse = lse, t.loss_per_token = lpt, t.target_logprob = lp, t.entropy = ent, t.argmax = am;
    if (grads) {
        /* split phase: dH is this rank's partial sum, accumulated into zeros in fp32 */
        t.grad_hidden = split ? upload_f32(NULL, rows * d) : poisoned((size_t)(rows * d) * dh_es);
        t.grad_weight = poisoned((size_t)(shard * d) * es);
        t.grad_bias = p.has_bias ? poisoned((size_t)shard * es) : NULL;
    }
    t.comm = split ? NULL : io->comm;

    /* FLCE_TEST_TP_REGISTER=1 (test_tp_register): every rank passes a workspace it registered with
     * the communicator (ncclCommRegister), so NCCL may run flce's collectives on it without its
     * staging copies; NCCL wants all ranks' buffers registered or none, which every rank doing
     * the same here gives. Deregistered before it is freed. */
    void *ws = NULL, *ws_handle = NULL;
    flce_status st = FLCE_OK;
    if (saved) { /* the workspace that holds the logits from the forward to the backward */
        uint64_t need = 0;
        st = flce_workspace_size(io->ctx, &p, FLCE_OP_FORWARD, &need);
        if (st == FLCE_OK) st = devmem_alloc(&ws, need);
        if (st == FLCE_OK && !split && register_workspace() &&
            ncclCommRegister(io->comm, ws, (size_t)need, &ws_handle) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclCommRegister failed");
        t.workspace = ws, t.workspace_bytes = need;
    } else if (!split && register_workspace()) {
        uint64_t need = 0, each = 0;
        flce_op ops[3] = {FLCE_OP_FORWARD, FLCE_OP_LOSS_AND_GRAD, FLCE_OP_BACKWARD};
        for (int k = 0; k < 3 && st == FLCE_OK; k++) {
            flce_problem q = p;
            if (k == 0) q.strategy = FLCE_STRATEGY_AUTO;
            st = flce_workspace_size(io->ctx, &q, ops[k], &each);
            if (each > need) need = each;
        }
        if (st == FLCE_OK) st = devmem_alloc(&ws, need);
        if (st == FLCE_OK && ncclCommRegister(io->comm, ws, (size_t)need, &ws_handle) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclCommRegister failed");
        t.workspace = ws, t.workspace_bytes = need;
    }
    if (st != FLCE_OK) {
        /* no registered workspace: io->msg or flce_last_error says why */
    } else if (c->op == OP_SAVED) { /* both calls name the same outputs (flce.h "Saved logits") */
        flce_tensors f = t; /* the upstream gradients exist only after the forward */
        f.grad_output = NULL, f.grad_logprob = f.grad_lse = f.grad_entropy = NULL;
        st = flce_forward(io->ctx, &p, &f, stream);
        if (st == FLCE_OK) st = flce_backward(io->ctx, &p, &t, stream);
    } else if (c->op == OP_SAVED_SPLIT) {
        uint64_t bytes = 0;
        void *stats = NULL, *gathered = NULL;
        st = flce_tp_stats_bytes(&p, &bytes);
        if (st == FLCE_OK) st = devmem_alloc(&stats, bytes);
        if (st == FLCE_OK) st = devmem_alloc(&gathered, bytes * (uint64_t)io->tp);
        if (st == FLCE_OK) st = flce_forward_stats(io->ctx, &p, &t, stats, stream);
        if (st == FLCE_OK && ncclAllGather(stats, gathered, bytes, ncclUint8, io->comm, stream) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclAllGather failed");
        if (st == FLCE_OK) st = flce_forward_finish(io->ctx, &p, &t, gathered, stream);
        if (st == FLCE_OK) st = flce_backward(io->ctx, &p, &t, stream);
        if (st == FLCE_OK && ncclAllReduce(t.grad_hidden, t.grad_hidden, (size_t)(rows * d), ncclFloat32,
                                           ncclSum, io->comm, stream) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclAllReduce failed");
        if (st == FLCE_OK) st = devmem_stream_sync(stream);
        devmem_free(stats), devmem_free(gathered);
    } else if (c->op == OP_LOSS_AND_GRAD) {
        st = flce_loss_and_grad(io->ctx, &p, &t, stream);
    } else if (c->op == OP_FORWARD) {
        p.strategy = FLCE_STRATEGY_AUTO;
        st = flce_forward(io->ctx, &p, &t, stream);
    } else if (c->op == OP_FWD_THEN_BWD) {
        flce_problem pf = p;
        pf.strategy = FLCE_STRATEGY_AUTO;
        flce_tensors f = t;
        f.grad_hidden = f.grad_weight = f.grad_bias = NULL;
        st = flce_forward(io->ctx, &pf, &f, stream);
        flce_tensors bw = t;
        bw.loss = bw.loss_per_token = bw.target_logprob = bw.entropy = NULL, bw.argmax = NULL;
        if (st == FLCE_OK) st = flce_backward(io->ctx, &p, &bw, stream);
    } else {
        uint64_t bytes = 0;
        void *stats = NULL, *gathered = NULL;
        flce_problem pf = p;
        pf.strategy = FLCE_STRATEGY_AUTO;
        st = flce_tp_stats_bytes(&pf, &bytes);
        if (st == FLCE_OK) st = devmem_alloc(&stats, bytes);
        if (st == FLCE_OK) st = devmem_alloc(&gathered, bytes * (uint64_t)io->tp);
        flce_tensors f = t;
        f.grad_hidden = f.grad_weight = f.grad_bias = NULL;
        if (st == FLCE_OK) st = flce_forward_stats(io->ctx, &pf, &f, stats, stream);
        if (st == FLCE_OK && ncclAllGather(stats, gathered, bytes, ncclUint8, io->comm, stream) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclAllGather failed");
        if (st == FLCE_OK) st = flce_forward_finish(io->ctx, &pf, &f, gathered, stream);
        flce_tensors bw = t;
        bw.loss = bw.loss_per_token = bw.target_logprob = bw.entropy = NULL, bw.argmax = NULL;
        p.accumulate_grad_hidden = 1;
        if (st == FLCE_OK) st = flce_backward(io->ctx, &p, &bw, stream);
        if (st == FLCE_OK && ncclAllReduce(t.grad_hidden, t.grad_hidden, (size_t)(rows * d), ncclFloat32,
                                           ncclSum, io->comm, stream) != ncclSuccess)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclAllReduce failed");
        if (st == FLCE_OK) st = devmem_stream_sync(stream);
        devmem_free(stats), devmem_free(gathered);
    }
    if (st == FLCE_OK) st = flce_check(io->ctx, stream);
    if (ws_handle) {
        devmem_stream_sync(stream);
        if (ncclCommDeregister(io->comm, ws_handle) != ncclSuccess && st == FLCE_OK)
            st = FLCE_ERR_CUDA, snprintf(io->msg, sizeof io->msg, "test's ncclCommDeregister failed");
    }
    devmem_free(ws);
    if (st != FLCE_OK && !io->msg[0]) snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    if (st == FLCE_OK) {
        down_f32(loss, io->loss, none ? rows : 1);
        down_f32(lse, io->lse, rows);
        if (c->opts & O_TOKENS) {
            down_f32(lpt, io->lpt, rows), down_f32(lp, io->lp, rows), down_f32(ent, io->ent, rows);
            devmem_download(io->am, am, (size_t)rows * 8);
        }
        if (grads) {
            if (p.accumulate_grad_hidden) down_f32(t.grad_hidden, io->dh, rows * d);
            else download_f64(c->dtype, t.grad_hidden, io->dh, (size_t)(rows * d));
            download_f64(c->dtype, t.grad_weight, io->dw, (size_t)(shard * d));
            if (p.has_bias) download_f64(c->dtype, t.grad_bias, io->db, (size_t)(shard));
        }
    }
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(d_labels);
    devmem_free((void *)t.bias), devmem_free((void *)t.class_weights), devmem_free((void *)t.grad_output);
    devmem_free(loss), devmem_free(lse), devmem_free(lpt), devmem_free(lp), devmem_free(ent), devmem_free(am);
    devmem_free(t.grad_hidden), devmem_free(t.grad_weight), devmem_free(t.grad_bias);
    devmem_free((void *)t.grad_logprob), devmem_free((void *)t.grad_lse), devmem_free((void *)t.grad_entropy);
    devmem_stream_destroy(stream);
    return st;
}

static void *rank_main(void *arg)
{
    rank_io *io = arg;
    io->st = rank_run(io);
    return NULL;
}

/* Global data: uneven shard cuts (none empty), labels per the case's placement. */
static void make_data(const tcase *c, int tp, gdata *g)
{
    int64_t n = c->n, d = c->d, v = c->v;
    g->h = dalloc(n * d), g->w = dalloc(v * d), g->b = dalloc(v), g->cw = dalloc(v), g->go = dalloc(n);
    g->glp = dalloc(n), g->glse = dalloc(n), g->gh = dalloc(n);
    g->labels = malloc(sizeof(int64_t) * (size_t)n);
    double sw = c->sd / sqrt((double)d);
    for (int64_t i = 0; i < n * d; i++) g->h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) g->w[i] = sw * host_rng_normal(&rng);
    for (int64_t j = 0; j < v; j++) g->b[j] = 0.5 * host_rng_normal(&rng), g->cw[j] = 0.5 + 1.5 * host_rng_uniform(&rng);
    for (int64_t i = 0; i < n; i++) g->go[i] = 0.5 + host_rng_uniform(&rng);
    for (int64_t i = 0; i < n; i++)
        g->glp[i] = host_rng_normal(&rng), g->glse[i] = 0.1 * host_rng_normal(&rng), g->gh[i] = 0.1 * host_rng_normal(&rng);
    host_round_to_dtype(c->dtype, g->h, (size_t)(n * d));
    host_round_to_dtype(c->dtype, g->w, (size_t)(v * d));
    host_round_to_dtype(c->dtype, g->b, (size_t)v);
    /* uneven: rank r's share grows with r, so shards differ in size (and in tile remainders) */
    int64_t weight_sum = 0;
    for (int r = 0; r < tp; r++) weight_sum += 3 + r;
    g->cut[0] = 0;
    for (int r = 0; r < tp; r++) g->cut[r + 1] = g->cut[r] + v * (3 + r) / weight_sum;
    g->cut[tp] = v;
    for (int64_t i = 0; i < n; i++) {
        if (c->labels == LAB_IGNORED || host_rng_uniform(&rng) < 0.1) g->labels[i] = -100;
        else if (c->labels == LAB_RANK0) g->labels[i] = host_rng_below(&rng, g->cut[1]);
        else g->labels[i] = host_rng_below(&rng, v);
    }
    if (c->labels == LAB_RANDOM && n >= 2) g->labels[0] = 0, g->labels[n - 1] = v - 1;
}

static void free_data(gdata *g)
{
    free(g->h), free(g->w), free(g->b), free(g->cw), free(g->go), free(g->labels);
    free(g->glp), free(g->glse), free(g->gh);
}

static int same_bits(const double *a, const double *b, int64_t n)
{
    return memcmp(a, b, sizeof(double) * (size_t)n) == 0;
}

/* Single-GPU flce on device 0 with the whole vocab: loss (1 or n), dH and dW, for the side-by-side. */
static flce_status single_gpu(const tcase *c, const gdata *g, double *loss, double *dh, double *dw)
{
    flce_problem p;
    fill_problem(c, &p);
    p.tokens = c->n, p.vocab_shard = c->v, p.vocab_total = c->v;
    p.label_bits = 32; /* uploaded as int32 below, whatever the TP run used */
    TRY(devmem_use(0));
    flce_tensors t;
    flce_tensors_init(&t);
    int32_t *l32 = malloc(sizeof(int32_t) * (size_t)c->n);
    for (int64_t i = 0; i < c->n; i++) l32[i] = (int32_t)g->labels[i];
    void *labels = NULL;
    devmem_alloc(&labels, (size_t)c->n * 4);
    devmem_upload(labels, l32, (size_t)c->n * 4);
    free(l32);
    int none = c->red == FLCE_REDUCTION_NONE;
    size_t es = host_dtype_size(c->dtype);
    t.hidden = upload_dtype(c->dtype, g->h, c->n * c->d), t.weight = upload_dtype(c->dtype, g->w, c->v * c->d);
    t.labels = labels;
    t.bias = p.has_bias ? upload_dtype(c->dtype, g->b, c->v) : NULL;
    t.class_weights = p.has_class_weights ? upload_f32(g->cw, c->v) : NULL;
    t.grad_output = upload_f32(g->go, none ? c->n : 1);
    t.loss = poisoned((size_t)c->n * 4);
    t.grad_hidden = poisoned((size_t)(c->n * c->d) * es), t.grad_weight = poisoned((size_t)(c->v * c->d) * es);
    flce_status st = flce_loss_and_grad(ctxs[0], &p, &t, NULL);
    if (st == FLCE_OK) st = flce_check(ctxs[0], NULL);
    if (st == FLCE_OK) {
        down_f32(t.loss, loss, none ? c->n : 1);
        download_f64(c->dtype, t.grad_hidden, dh, (size_t)(c->n * c->d));
        download_f64(c->dtype, t.grad_weight, dw, (size_t)(c->v * c->d));
    }
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(labels);
    devmem_free((void *)t.bias), devmem_free((void *)t.class_weights), devmem_free((void *)t.grad_output);
    devmem_free(t.loss), devmem_free(t.grad_hidden), devmem_free(t.grad_weight);
    return st;
}

static void run_ranks(rank_io *io, int tp)
{
    pthread_t th[8];
    for (int r = 0; r < tp; r++) pthread_create(&th[r], NULL, rank_main, &io[r]);
    for (int r = 0; r < tp; r++) pthread_join(th[r], NULL);
}

static void check_case(const tcase *c, int tp, ncclComm_t *comms)
{
    char name[200];
    snprintf(name, sizeof name, "tp=%d %s%s %s", tp, c->sp ? "SP " : "", spec_dtype_name(c->dtype), c->name);
    int64_t n = c->n, d = c->d, v = c->v, rows = c->sp ? n / tp : n;
    int none = c->red == FLCE_REDUCTION_NONE, grads = c->op != OP_FORWARD;
    gdata g;
    make_data(c, tp, &g);
    rank_io io[8];
    memset(io, 0, sizeof io);
    for (int r = 0; r < tp; r++) {
        io[r] = (rank_io){c, &g, tp, r, ctxs[r], comms[r], rows};
        io[r].loss = dalloc(rows), io[r].lse = dalloc(rows), io[r].dh = dalloc(rows * d);
        io[r].dw = dalloc(v * d), io[r].db = dalloc(v);
        io[r].lpt = dalloc(rows), io[r].lp = dalloc(rows), io[r].ent = dalloc(rows);
        io[r].am = calloc((size_t)rows, sizeof(int64_t));
    }
    run_ranks(io, tp);
    int ok = 1;
    for (int r = 0; r < tp; r++) {
        CHECKF(io[r].st == FLCE_OK, "%s: rank %d: %s: %s", name, r, flce_status_name(io[r].st), io[r].msg);
        ok &= io[r].st == FLCE_OK;
    }
    if (ok) {
        /* assemble the global view: SP ranks hold consecutive token rows, shards consecutive vocab rows */
        double *lse = dalloc(n), *loss = dalloc(n), *dh = dalloc(n * d), *dw = dalloc(v * d), *db = dalloc(v);
        double *lpt = dalloc(n), *lp = dalloc(n), *ent = dalloc(n);
        int64_t *am = calloc((size_t)n, sizeof(int64_t));
        int same = 1;
        for (int r = 0; r < tp; r++) {
            int64_t at = c->sp ? r * rows : 0;
            if (!c->sp && r > 0) /* plain TP: every rank computed the same rows; demand the same bits */
                same &= same_bits(io[r].lse, io[0].lse, n) && same_bits(io[r].loss, io[0].loss, none ? n : 1) &&
                        (!grads || same_bits(io[r].dh, io[0].dh, n * d)) &&
                        (!(c->opts & O_TOKENS) || (same_bits(io[r].ent, io[0].ent, n) &&
                                                   memcmp(io[r].am, io[0].am, (size_t)n * 8) == 0));
            if (c->sp && !none && r > 0) same &= same_bits(io[r].loss, io[0].loss, 1);
            memcpy(lse + at, io[r].lse, sizeof(double) * (size_t)rows);
            memcpy(loss + at, io[r].loss, sizeof(double) * (size_t)(none ? rows : 1));
            memcpy(dh + at * d, io[r].dh, sizeof(double) * (size_t)(rows * d));
            memcpy(lpt + at, io[r].lpt, sizeof(double) * (size_t)rows);
            memcpy(lp + at, io[r].lp, sizeof(double) * (size_t)rows);
            memcpy(ent + at, io[r].ent, sizeof(double) * (size_t)rows);
            memcpy(am + at, io[r].am, sizeof(int64_t) * (size_t)rows);
            int64_t off = g.cut[r], shard = g.cut[r + 1] - off;
            memcpy(dw + off * d, io[r].dw, sizeof(double) * (size_t)(shard * d));
            memcpy(db + off, io[r].db, sizeof(double) * (size_t)shard);
        }
        CHECKF(same, "%s: ranks disagree on values every rank computes (must be bitwise equal)", name);

        flce_problem p;
        fill_problem(c, &p);
        p.tokens = n, p.vocab_shard = v;
        ref_extra x = {p.has_class_weights ? g.cw : NULL};
        double *rl = dalloc(n), *rlse = dalloc(n), *rdh = dalloc(n * d), *rdw = dalloc(v * d), *rdb = dalloc(v);
        const double *bias = p.has_bias ? g.b : NULL;
        ref_loss_and_grad(&p, &x, n, d, v, g.h, g.w, bias, g.labels, g.go, rl, rlse, rdh, rdw, rdb);
        if (c->gout) /* OP_SAVED*: the per-token outputs' terms on top of the loss's */
            ref_add_output_grads(&p, &x, n, d, v, g.h, g.w, bias, g.labels, c->gout & FLCE_GRAD_LOGPROB ? g.glp : NULL,
                                 c->gout & FLCE_GRAD_LSE ? g.glse : NULL, c->gout & FLCE_GRAD_ENTROPY ? g.gh : NULL,
                                 rdh, rdw, rdb);
        int64_t nl = none ? n : 1;
        double tg = tol_grad(c->dtype);
        double e_loss = ref_rel_l2(rl, loss, (size_t)nl), e_lse = ref_rel_l2(rlse, lse, (size_t)n);
        double e_dh = grads ? ref_rel_l2(rdh, dh, (size_t)(n * d)) : 0;
        double e_dw = grads ? ref_rel_l2(rdw, dw, (size_t)(v * d)) : 0;
        double e_db = grads && bias ? ref_rel_l2(rdb, db, (size_t)v) : 0;
        CHECKF(e_loss <= 1e-5 && e_lse <= 1e-5, "%s: loss %.2e lse %.2e (loss %g vs %g)", name, e_loss,
               e_lse, loss[0], rl[0]);
        CHECKF(e_dh <= tg && e_dw <= tg && e_db <= tg, "%s: dH %.2e dW %.2e db %.2e (tol %.0e)", name,
               e_dh, e_dw, e_db, tg);
        double e_tok = 0;
        if ((c->opts & O_TOKENS) && c->op != OP_FWD_THEN_BWD) {
            double *rlpt = dalloc(n), *rlp = dalloc(n), *rent = dalloc(n);
            int bad_arg = 0;
            for (int64_t i = 0; i < n; i++) {
                ref_row_out o;
                ref_row(&p, &x, d, v, g.h + i * d, g.w, bias, g.labels[i], &o, NULL);
                rlpt[i] = o.loss, rlp[i] = o.target_logprob, rent[i] = o.entropy;
                bad_arg += am[i] != o.argmax; /* random data: exact ties are vanishingly rare */
            }
            e_tok = fmax(fmax(ref_rel_l2(rlpt, lpt, (size_t)n), ref_rel_l2(rlp, lp, (size_t)n)),
                         ref_rel_l2(rent, ent, (size_t)n));
            CHECKF(e_tok <= 1e-4, "%s: per-token outputs rel err %.2e", name, e_tok);
            CHECKF(bad_arg <= n / 200, "%s: %d argmax mismatches of %lld", name, bad_arg, (long long)n);
            free(rlpt), free(rlp), free(rent);
        }
        /* the same data through single-GPU flce: TP must land as close as the reference tolerance */
        double s_loss = 0, s_dh = 0, s_dw = 0;
        if (c->op == OP_LOSS_AND_GRAD && !c->gout) {
            double *sl = dalloc(n), *sdh = dalloc(n * d), *sdw = dalloc(v * d);
            flce_status st = single_gpu(c, &g, sl, sdh, sdw);
            CHECKF(st == FLCE_OK, "%s: single-GPU run: %s", name, flce_last_error());
            if (st == FLCE_OK) {
                s_loss = ref_rel_l2(sl, loss, (size_t)nl);
                s_dh = ref_rel_l2(sdh, dh, (size_t)(n * d)), s_dw = ref_rel_l2(sdw, dw, (size_t)(v * d));
                CHECKF(s_loss <= 1e-5 && s_dh <= tg && s_dw <= tg, "%s: vs single GPU: loss %.2e dH %.2e dW %.2e",
                       name, s_loss, s_dh, s_dw);
            }
            free(sl), free(sdh), free(sdw);
        }
        printf("  %-58s loss %.1e lse %.1e dH %.1e dW %.1e db %.1e tok %.1e | vs 1 GPU: loss %.1e dH %.1e dW %.1e\n",
               name, e_loss, e_lse, e_dh, e_dw, e_db, e_tok, s_loss, s_dh, s_dw);
        free(rl), free(rlse), free(rdh), free(rdw), free(rdb);
        free(lse), free(loss), free(dh), free(dw), free(db), free(lpt), free(lp), free(ent), free(am);
    }
    for (int r = 0; r < tp; r++) {
        free(io[r].loss), free(io[r].lse), free(io[r].dh), free(io[r].dw), free(io[r].db);
        free(io[r].lpt), free(io[r].lp), free(io[r].ent), free(io[r].am);
    }
    free_data(&g);
}

static const tcase cases[] = {
    /* name                                n    d    v     dtype            reduction            sp op                opts                      labels       lb strategy                 budget     sd */
    {"mean, chunked",                      384, 128, 3001, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 0, OP_LOSS_AND_GRAD, 0,                        LAB_RANDOM,  32, FLCE_STRATEGY_AUTO,      0,         4},
    {"sum, many chunks",                   512, 64,  2050, FLCE_DTYPE_F16,  FLCE_REDUCTION_SUM,  0, OP_LOSS_AND_GRAD, 0,                        LAB_RANDOM,  64, FLCE_STRATEGY_CHUNKED,   1 << 20,   0.5},
    {"none + grad_output, recompute",      300, 96,  2503, FLCE_DTYPE_F32,  FLCE_REDUCTION_NONE, 0, OP_LOSS_AND_GRAD, O_TOKENS,                 LAB_RANDOM,  32, FLCE_STRATEGY_RECOMPUTE, 1 << 20,   4},
    {"every option",                       256, 64,  1999, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 0, OP_LOSS_AND_GRAD, 127,                      LAB_RANDOM,  32, FLCE_STRATEGY_AUTO,      0,         4},
    {"every option, f32, many chunks",     300, 48,  1501, FLCE_DTYPE_F32,  FLCE_REDUCTION_SUM,  0, OP_LOSS_AND_GRAD, 127,                      LAB_RANDOM,  32, FLCE_STRATEGY_CHUNKED,   1 << 19,   2},
    {"targets only on rank 0",             256, 64,  2000, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 0, OP_LOSS_AND_GRAD, O_SMOOTH | O_TOKENS,      LAB_RANK0,   32, FLCE_STRATEGY_AUTO,      0,         4},
    {"all ignored",                        128, 32,  1000, FLCE_DTYPE_F16,  FLCE_REDUCTION_MEAN, 0, OP_LOSS_AND_GRAD, O_ZLOSS,                  LAB_IGNORED, 32, FLCE_STRATEGY_AUTO,      0,         2},
    {"forward only, outputs",              333, 64,  3001, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 0, OP_FORWARD,       O_TOKENS | O_SOFTCAP,     LAB_RANDOM,  32, FLCE_STRATEGY_AUTO,      0,         4},
    {"forward, then backward (recompute)", 256, 64,  2001, FLCE_DTYPE_F16,  FLCE_REDUCTION_NONE, 0, OP_FWD_THEN_BWD,  O_BIAS | O_WEIGHTS,       LAB_RANDOM,  32, FLCE_STRATEGY_RECOMPUTE, 1 << 20,   4},
    {"split phase (caller's collectives)", 256, 64,  2001, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 0, OP_SPLIT_PHASE,   O_SMOOTH | O_ZLOSS,       LAB_RANDOM,  32, FLCE_STRATEGY_AUTO,      0,         4},
    {"mean, many chunks",                  512, 64,  2050, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 1, OP_LOSS_AND_GRAD, 0,                        LAB_RANDOM,  32, FLCE_STRATEGY_CHUNKED,   1 << 20,   4},
    {"none + grad_output, outputs",        384, 64,  1777, FLCE_DTYPE_F32,  FLCE_REDUCTION_NONE, 1, OP_LOSS_AND_GRAD, O_TOKENS | O_WEIGHTS,     LAB_RANDOM,  64, FLCE_STRATEGY_AUTO,      0,         2},
    {"every option, recompute",            256, 64,  2001, FLCE_DTYPE_F16,  FLCE_REDUCTION_SUM,  1, OP_LOSS_AND_GRAD, 127,                      LAB_RANDOM,  32, FLCE_STRATEGY_RECOMPUTE, 1 << 20,   4},
    {"forward, then backward",             256, 64,  2001, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 1, OP_FWD_THEN_BWD,  O_SMOOTH,                 LAB_RANDOM,  32, FLCE_STRATEGY_AUTO,      0,         4},
    {"all ignored",                        128, 32,  1000, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 1, OP_LOSS_AND_GRAD, 0,                        LAB_IGNORED, 32, FLCE_STRATEGY_AUTO,      0,         2},
    /* issue 45: the saved logits and the per-token outputs' gradients under TP (RL) */
    {"saved: log-probs, lse, entropy",     384, 128, 3001, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 0, OP_SAVED,         O_TOKENS,                 LAB_RANDOM,  32, FLCE_STRATEGY_SAVED,     0,         4, FLCE_GRAD_LOGPROB | FLCE_GRAD_LSE | FLCE_GRAD_ENTROPY},
    {"saved: bias, weights, smoothing",    256, 64,  1999, FLCE_DTYPE_BF16, FLCE_REDUCTION_SUM,  0, OP_SAVED,         O_TOKENS | O_BIAS | O_WEIGHTS | O_SMOOTH, LAB_RANDOM, 32, FLCE_STRATEGY_SAVED, 0, 2, FLCE_GRAD_LOGPROB},
    {"saved, split phase: temperature",    256, 64,  2001, FLCE_DTYPE_F16,  FLCE_REDUCTION_NONE, 0, OP_SAVED_SPLIT,   O_TOKENS | O_TEMP,        LAB_RANDOM,  32, FLCE_STRATEGY_SAVED,     0,         4, FLCE_GRAD_LOGPROB | FLCE_GRAD_ENTROPY},
    {"saved: mean + log-probs + entropy",  512, 64,  2050, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 1, OP_SAVED,         O_TOKENS,                 LAB_RANDOM,  64, FLCE_STRATEGY_SAVED,     0,         4, FLCE_GRAD_LOGPROB | FLCE_GRAD_ENTROPY},
    {"chunked: none, log-probs + entropy", 512, 64,  2050, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 1, OP_LOSS_AND_GRAD, O_TOKENS,                 LAB_RANDOM,  32, FLCE_STRATEGY_CHUNKED,   1 << 20,   4, FLCE_GRAD_LOGPROB | FLCE_GRAD_ENTROPY},
    {"saved: none, lse, softcap",          256, 64,  2001, FLCE_DTYPE_F16,  FLCE_REDUCTION_NONE, 1, OP_SAVED,         O_TOKENS | O_SOFTCAP,     LAB_RANDOM,  32, FLCE_STRATEGY_SAVED,     0,         4, FLCE_GRAD_LSE | FLCE_GRAD_LOGPROB},
};

static ncclComm_t comms2[8], comms4[8];

typedef struct init_job {
    ncclUniqueId id;
    int tp, rank;
    ncclComm_t *out;
    ncclResult_t r;
} init_job;

static void *init_main(void *arg)
{
    init_job *j = arg;
    devmem_use(j->rank);
    j->r = ncclCommInitRank(&j->out[j->rank], j->tp, j->id, j->rank);
    return NULL;
}

static int make_comms(int tp, ncclComm_t *out)
{
    init_job jobs[8];
    pthread_t th[8];
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return -1;
    for (int r = 0; r < tp; r++) {
        jobs[r] = (init_job){id, tp, r, out, ncclSuccess};
        pthread_create(&th[r], NULL, init_main, &jobs[r]);
    }
    int bad = 0;
    for (int r = 0; r < tp; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].r != ncclSuccess) {
            printf("ncclCommInitRank(rank %d of %d): %s\n", r, tp, ncclGetErrorString(jobs[r].r));
            bad = 1;
        }
    }
    return bad ? -1 : 0;
}

static void every_case_matches_on_2_gpus(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 2, comms2);
}

static void every_case_matches_on_4_gpus(void)
{
    if (!gpu_enough(n_gpus, 4)) return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 4, comms4);
}

/* Shard descriptions that disagree: every rank's next check names the problem. */
typedef struct bad_io {
    int rank, tp, how;
    ncclComm_t comm;
    flce_status call, check;
    char msg[600];
} bad_io;

enum { BAD_OVERLAP, BAD_TOTAL, BAD_RANK };

static void *bad_main(void *arg)
{
    bad_io *io = arg;
    int64_t n = 64, d = 32, v = 1000, shard = v / io->tp, off = io->rank * shard;
    if (io->rank == io->tp - 1) shard = v - off;
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_total = v, p.dtype = FLCE_DTYPE_F32;
    p.tp_size = io->tp, p.tp_rank = io->rank;
    if (io->how == BAD_OVERLAP && io->rank == 1) off -= 5; /* overlaps rank 0, leaves a gap after */
    if (io->how == BAD_TOTAL && io->rank == io->tp - 1) p.vocab_total = v + 16;
    if (io->how == BAD_RANK) p.tp_rank = (io->rank + 1) % io->tp; /* every rank fails before NCCL */
    p.vocab_shard = shard, p.vocab_offset = off;
    devmem_use(io->rank);
    double *h = dalloc(n * d), *w = dalloc(shard * d);
    for (int64_t i = 0; i < n * d; i++) h[i] = 0.1 * (double)(i % 7);
    for (int64_t i = 0; i < shard * d; i++) w[i] = 0.01 * (double)(i % 5);
    int32_t labels[64];
    for (int i = 0; i < 64; i++) labels[i] = i * 13 % (int)v;
    void *dl = NULL;
    devmem_alloc(&dl, sizeof labels);
    devmem_upload(dl, labels, sizeof labels);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = upload_f32(h, n * d), t.weight = upload_f32(w, shard * d), t.labels = dl;
    t.loss = poisoned(4), t.comm = io->comm;
    io->call = flce_forward(ctxs[io->rank], &p, &t, NULL);
    snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    io->check = flce_check(ctxs[io->rank], NULL);
    if (io->call == FLCE_OK) snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(dl), devmem_free(t.loss);
    free(h), free(w);
    return NULL;
}

static void disagreeing_shards_are_reported(void)
{
    const char *want[] = {"overlap or leave gaps", "vocab_total differs", "tensors.comm: rank"};
    for (int how = 0; how < 3; how++) {
        bad_io io[2];
        pthread_t th[2];
        for (int r = 0; r < 2; r++) {
            io[r] = (bad_io){r, 2, how, comms2[r], FLCE_OK, FLCE_OK, ""};
            pthread_create(&th[r], NULL, bad_main, &io[r]);
        }
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < 2; r++) {
            flce_status got = how == BAD_RANK ? io[r].call : io[r].check;
            printf("  %-22s rank %d: %s: %s\n", want[how], r, flce_status_name(got), io[r].msg);
            CHECKF(got == FLCE_ERR_INVALID_ARGUMENT && strstr(io[r].msg, want[how]),
                   "rank %d: expected INVALID_ARGUMENT naming '%s', got %s '%s'", r, want[how],
                   flce_status_name(got), io[r].msg);
        }
    }
}

/* ---- top-k log-probabilities with the communicator (flce_topk_logprobs, tensors.comm) ------------ */
typedef struct topk_io {
    int rank, k;
    const double *h, *w;
    int64_t n, d, cut[3];
    float temperature;
    int64_t *idx; /* host: the rank's outputs */
    float *lp, *lse;
    flce_status st;
    char msg[600];
} topk_io;

static void *topk_main(void *arg)
{
    topk_io *io = arg;
    const int64_t off = io->cut[io->rank], shard = io->cut[io->rank + 1] - off, n = io->n, d = io->d;
    const int k = io->k;
    devmem_use(io->rank);
    flce_topk_problem p;
    flce_topk_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab = shard, p.vocab_offset = off, p.vocab_total = io->cut[2];
    p.tp_rank = io->rank, p.tp_size = 2, p.k = k, p.dtype = FLCE_DTYPE_BF16, p.temperature = io->temperature;
    flce_topk_tensors t;
    flce_topk_tensors_init(&t);
    t.hidden = upload_dtype(p.dtype, io->h, n * d), t.weight = upload_dtype(p.dtype, io->w + off * d, shard * d);
    t.indices = poisoned((size_t)(n * k) * 8), t.logprobs = poisoned((size_t)(n * k) * 4), t.lse = poisoned((size_t)n * 4);
    t.comm = comms2[io->rank];
    void *stream = NULL;
    io->st = devmem_stream_create(&stream);
    if (io->st == FLCE_OK) io->st = flce_topk_logprobs(ctxs[io->rank], &p, &t, stream);
    if (io->st == FLCE_OK) io->st = flce_check(ctxs[io->rank], stream);
    snprintf(io->msg, sizeof io->msg, "%s", flce_last_error());
    if (io->st == FLCE_OK) {
        devmem_download(io->idx, t.indices, (size_t)(n * k) * 8);
        devmem_download(io->lp, t.logprobs, (size_t)(n * k) * 4);
        devmem_download(io->lse, t.lse, (size_t)n * 4);
    }
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight);
    devmem_free(t.indices), devmem_free(t.logprobs), devmem_free(t.lse);
    devmem_stream_destroy(stream);
    return NULL;
}

/* Token i's k outputs against its fp64 logits z (v of them): distinct global ids, logits in order
 * (within the GPU pass's fp32 error), none left out larger than the k-th, log-probs and lse within
 * 1e-5. The count of wrong values. */
static int topk_check_token(const double *z, int64_t v, int k, const int64_t *idx, const float *lp, float lse,
                            char *taken)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; j++) m = fmax(m, z[j]);
    for (int64_t j = 0; j < v; j++) s += exp(z[j] - m);
    const double l = m + log(s);
    int bad = !(fabs(lse - l) <= 1e-5 * (1 + fabs(l)));
    memset(taken, 0, (size_t)v);
    for (int q = 0; q < k; q++) {
        const int64_t j = idx[q];
        if (j < 0 || j >= v || taken[j]) return bad + 1;
        taken[j] = 1;
        const double tol = 1e-5 * (1 + fabs(z[j]));
        bad += q > 0 && z[j] > z[idx[q - 1]] + tol;
        bad += !(fabs(lp[q] - (z[j] - l)) <= 1e-5);
    }
    const double kth = z[idx[k - 1]];
    for (int64_t j = 0; j < v; j++) bad += !taken[j] && z[j] > kth + 1e-5 * (1 + fabs(kth));
    return bad;
}

/* flce_topk_logprobs over uneven shards with the communicator: one all-gather inside the call, ids
 * global, both ranks' outputs bitwise the same and right against fp64 of the whole vocab. */
static void topk_with_the_communicator_on_2_gpus(void)
{
    const int64_t n = 256, d = 64, v = 3001;
    const int k = 64;
    double *h = dalloc(n * d), *w = dalloc(v * d), *z = dalloc(v);
    for (int64_t i = 0; i < n * d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) w[i] = 2.0 / sqrt((double)d) * host_rng_normal(&rng);
    host_round_to_dtype(FLCE_DTYPE_BF16, h, (size_t)(n * d)), host_round_to_dtype(FLCE_DTYPE_BF16, w, (size_t)(v * d));
    topk_io io[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        io[r] = (topk_io){r, k, h, w, n, d, {0, 1300, v}, 0.8f, malloc(sizeof(int64_t) * (size_t)(n * k)),
                          malloc(sizeof(float) * (size_t)(n * k)), malloc(sizeof(float) * (size_t)n), FLCE_OK, ""};
        pthread_create(&th[r], NULL, topk_main, &io[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) CHECKF(io[r].st == FLCE_OK, "rank %d: %s: %s", r, flce_status_name(io[r].st), io[r].msg);
    if (io[0].st == FLCE_OK && io[1].st == FLCE_OK) {
        CHECK(!memcmp(io[0].idx, io[1].idx, sizeof(int64_t) * (size_t)(n * k)) &&
              !memcmp(io[0].lp, io[1].lp, sizeof(float) * (size_t)(n * k)) &&
              !memcmp(io[0].lse, io[1].lse, sizeof(float) * (size_t)n));
        char *taken = malloc((size_t)v);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            for (int64_t j = 0; j < v; j++) {
                double a = 0;
                for (int64_t q = 0; q < d; q++) a += h[i * d + q] * w[j * d + q];
                z[j] = a / 0.8f;
            }
            bad += topk_check_token(z, v, k, io[0].idx + i * k, io[0].lp + i * k, io[0].lse[i], taken);
        }
        CHECKF(bad == 0, "%d wrong against fp64", bad);
        free(taken);
    }
    for (int r = 0; r < 2; r++) free(io[r].idx), free(io[r].lp), free(io[r].lse);
    free(h), free(w), free(z);
}

/* FLCE_TEST_TP_TIME=N,D,V (bench/device_session.sh's tptime stage): no checks; flce_loss_and_grad
 * timed at that global shape (bf16, logit std 4, labels over the whole vocab) on 2 and 4 GPUs,
 * without and with sequence parallelism (N/tp tokens per rank): 3 warm-up steps, then 20 steps
 * queued on each rank's stream after a barrier, each rank's host time over them; the slowest
 * rank's ms per step. Environment knobs (FLCE_DEV tp_overlap…) apply as in any call. */
typedef struct time_io {
    int tp, rank, sp;
    int64_t n, d, v;
    ncclComm_t comm;
    pthread_barrier_t *bar;
    double ms;
    flce_status st;
} time_io;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static flce_status time_rank(time_io *io, bench_data *bd, void **stream)
{
    int64_t shard = io->v / io->tp, off = io->rank * shard;
    if (io->rank == io->tp - 1) shard = io->v - off;
    TRY(devmem_use(io->rank));
    flce_problem *p = &bd->p;
    flce_problem_init(p);
    p->tokens = io->sp ? io->n / io->tp : io->n, p->hidden = io->d, p->dtype = FLCE_DTYPE_BF16;
    p->vocab_shard = shard, p->vocab_offset = off, p->vocab_total = io->v;
    p->tp_rank = io->rank, p->tp_size = io->tp, p->sequence_parallel = io->sp;
    if (!bench_data_fill(bd, 1234 + (uint64_t)io->rank, 4.0)) return FLCE_ERR_OUT_OF_MEMORY;
    host_rng r;
    host_rng_seed(&r, 99 + (uint64_t)(io->sp ? io->rank : 0)); /* without SP every rank has the same labels */
    for (int64_t i = 0; i < p->tokens; i++)
        if (bd->labels[i] != (int32_t)p->ignore_index) bd->labels[i] = (int32_t)host_rng_below(&r, (uint64_t)io->v);
    TRY(bench_data_upload(bd));
    TRY(devmem_stream_create(stream));
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = bd->d_h, t.weight = bd->d_w, t.labels = bd->d_labels, t.loss = bd->d_loss, t.lse = bd->d_lse;
    t.grad_hidden = bd->d_dh, t.grad_weight = bd->d_dw, t.comm = io->comm;
    for (int k = 0; k < 3; k++) TRY(flce_loss_and_grad(ctxs[io->rank], p, &t, *stream));
    TRY(devmem_stream_sync(*stream));
    pthread_barrier_wait(io->bar);
    double t0 = now_ms();
    for (int k = 0; k < 20; k++) TRY(flce_loss_and_grad(ctxs[io->rank], p, &t, *stream));
    TRY(devmem_stream_sync(*stream));
    io->ms = (now_ms() - t0) / 20;
    return flce_check(ctxs[io->rank], *stream);
}

static void *time_main(void *arg)
{
    time_io *io = arg;
    bench_data bd;
    memset(&bd, 0, sizeof bd);
    void *stream = NULL;
    io->st = time_rank(io, &bd, &stream);
    if (io->st != FLCE_OK) printf("rank %d: %s\n", io->rank, flce_last_error());
    pthread_barrier_wait(io->bar); /* every rank's steps done before any frees its buffers */
    if (stream) devmem_stream_destroy(stream);
    bench_data_free(&bd);
    return NULL;
}

static int time_steps(const char *shape)
{
    long long n, d, v;
    if (sscanf(shape, "%lld,%lld,%lld", &n, &d, &v) != 3 || n < 8 || d < 8 || v < 8) {
        printf("FAIL: FLCE_TEST_TP_TIME=%s: expected N,D,V\n", shape);
        return 1;
    }
    int bad = 0;
    for (int tp = 2; tp <= 4 && tp <= n_gpus; tp += 2) {
        for (int sp = 0; sp < 2; sp++) {
            time_io io[4];
            pthread_t th[4];
            pthread_barrier_t bar;
            pthread_barrier_init(&bar, NULL, (unsigned)tp);
            for (int r = 0; r < tp; r++) {
                io[r] = (time_io){tp, r, sp, n, d, v, tp == 2 ? comms2[r] : comms4[r], &bar, 0, FLCE_OK};
                pthread_create(&th[r], NULL, time_main, &io[r]);
            }
            double worst = 0;
            for (int r = 0; r < tp; r++) {
                pthread_join(th[r], NULL);
                bad |= io[r].st != FLCE_OK;
                if (io[r].ms > worst) worst = io[r].ms;
            }
            pthread_barrier_destroy(&bar);
            printf("time %lldx%lldx%lld tp=%d sp=%d: %.3f ms per step (slowest rank; ranks", n, d, v, tp, sp, worst);
            for (int r = 0; r < tp; r++) printf(" %.3f", io[r].ms);
            printf(")\n");
        }
    }
    return bad;
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(2, &rc)) return rc; /* tensor parallelism needs at least 2 */
    n_gpus = devmem_gpu_count();
    if (n_gpus > 8) n_gpus = 8;
    uint64_t seed = host_fresh_seed();
    printf("seed %llu (FLCE_SEED=%llu reproduces), %d GPUs\n", (unsigned long long)seed,
           (unsigned long long)seed, n_gpus);
    host_rng_seed(&rng, seed);
    for (int r = 0; r < n_gpus; r++)
        if (flce_context_create(r, &ctxs[r]) != FLCE_OK) {
            printf("FAIL: context %d: %s\n", r, flce_last_error());
            return 1;
        }
    if (make_comms(2, comms2) != 0 || (n_gpus >= 4 && make_comms(4, comms4) != 0)) {
        printf("FAIL: NCCL communicators\n");
        return 1;
    }
    const char *timed = getenv("FLCE_TEST_TP_TIME");
    if (timed && *timed) {
        int bad = time_steps(timed);
        for (int r = 0; r < 2; r++) ncclCommDestroy(comms2[r]);
        for (int r = 0; r < 4 && n_gpus >= 4; r++) ncclCommDestroy(comms4[r]);
        for (int r = 0; r < n_gpus; r++) flce_context_destroy(ctxs[r]);
        return bad;
    }
    RUN(every_case_matches_on_2_gpus);
    RUN(every_case_matches_on_4_gpus);
    RUN(disagreeing_shards_are_reported);
    RUN(topk_with_the_communicator_on_2_gpus);
    for (int r = 0; r < 2; r++) ncclCommDestroy(comms2[r]);
    for (int r = 0; r < 4 && n_gpus >= 4; r++) ncclCommDestroy(comms4[r]);
    for (int r = 0; r < n_gpus; r++) flce_context_destroy(ctxs[r]);
    FINISH();
}
