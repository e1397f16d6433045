/*
 * fuzz_case.c — case generator, data, sampled fp64 reference and checker of `flce fuzz` (contract
 * in fuzz_case.h).
 *
 * Sizes are skewed small so that thousands of cases fit in one device call: the cost of a case
 * is its NVRTC compiles (about 4 modules per distinct kernel class) and the CPU reference, not the
 * GPU. Half the cases draw their kernel-specialized fields (dtype, D, V_r, option values, mode)
 * from a pool of FZ_POOL classes per seed, so the disk cache serves them; the other half are
 * classes of their own. Per case: N, data, ignore pattern, offsets, budget, upstream gradient.
 *
 * Shards of a bigger vocab (vocab_offset > 0 or vocab_total > V_r with tp_size 1): the library
 * computes the shard's own statistics (lse over its V_r columns, labels as global ids). The
 * reference is then the shard seen as a whole vocab, with local labels. Smoothing divides by the
 * global V and needs the other shards' logits, so such cases have no smoothing, and their labels
 * lie in the shard or are ignored (a label held by another rank is TP's business, not tp_size 1's).
 *
 * Error measure (fz_check): ‖got − ref‖₂ / max(‖ref‖₂, floor) over the sampled entries, where
 * floor is the size the entries would have without cancellation (1 + |lse| + |z_y| for per-token
 * values; 1 % of |g_i|·‖w‖ for gradients). A relative error over a whole vector, as docs/DESIGN.md §8.2
 * asks, that a tiny sample (one token whose loss is 1e-7) cannot turn into noise over noise, and
 * that a sample of zeros (all tokens ignored) checks absolutely. NaN or Inf anywhere fails.
 */
#include "fuzz_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "plan.h"
#include "ref.h"

#define FZ_POOL 48
/* Kernel classes of the pool stay cheap (V_r·D ≤ 2^22); one class in ten of their own may be wide. */
#define FZ_VD_POOL (1LL << 22)
#define FZ_VD_WIDE (1LL << 26)
/* Tokens × hidden of the data, per size tier (90 % / 8 % / 2 % of cases). */
static const int64_t fz_nd_cap[3] = {1LL << 21, 1LL << 24, 1LL << 27};
/* N·V_r·D up to which the whole fp64 reference runs (a few tens of ms). */
#define FZ_FULL_REF_WORK (1LL << 23)
#define FZ_SAMPLE_TOKENS 12
#define FZ_SAMPLE_VOCAB 10

const char *const fz_q_names[FZ_Q_COUNT] = {"loss", "lse", "loss_tok", "z_loss", "logprob",
                                             "entropy", "argmax", "dH", "dW", "db"};

static uint64_t fz_mix(uint64_t a, uint64_t b)
{
    uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int fz_coin(host_rng *r, double p) { return host_rng_uniform(r) < p; }

/* exp of a uniform draw in [log lo, log hi]: log-uniform, so small sizes dominate. */
static int64_t fz_log_uniform(host_rng *r, int64_t lo, int64_t hi)
{
    double x = exp(log((double)lo) + host_rng_uniform(r) * (log((double)hi) - log((double)lo)));
    int64_t v = (int64_t)llround(x);
    return v < lo ? lo : v > hi ? hi : v;
}

static int64_t fz_pick(host_rng *r, const int64_t *v, int n) { return v[host_rng_below(r, n)]; }

/* The fields kernels are specialized on. */
static void fz_class(host_rng *r, int pooled, fz_case *c)
{
    flce_problem *p = &c->p;
    static const int64_t d_edges[] = {8, 16, 24, 8192, 4096, 4104};
    static const int64_t v_edges[] = {1, 2, 3, 7, 127, 128, 129, 32000, 256000};
    p->dtype = (flce_dtype)host_rng_below(r, 3);
    p->hidden = fz_coin(r, 0.12) ? fz_pick(r, d_edges, 6) : 8 * fz_log_uniform(r, 1, FZ_MAX_HIDDEN / 8);
    p->vocab_shard = fz_coin(r, 0.12) ? fz_pick(r, v_edges, 9) : fz_log_uniform(r, 1, FZ_MAX_VOCAB);
    int64_t cap = pooled || !fz_coin(r, 0.1) ? FZ_VD_POOL : FZ_VD_WIDE;
    /* Halve one side at random until the class fits: both extremes (D = 8192, V = 256000) keep
     * appearing, each with a moderate other side. */
    while (p->hidden * p->vocab_shard > cap) {
        int shrink_d = p->vocab_shard == 1 || (p->hidden > 8 && fz_coin(r, 0.5));
        if (shrink_d) p->hidden = p->hidden / 16 * 8 > 8 ? p->hidden / 16 * 8 : 8;
        else p->vocab_shard = (p->vocab_shard + 1) / 2;
    }
    p->label_bits = fz_coin(r, 0.5) ? 32 : 64;
    p->reduction = (flce_reduction)host_rng_below(r, 3);
    p->label_smoothing = fz_coin(r, 0.3) ? (float)(0.3 * host_rng_uniform(r)) : 0.f;
    p->z_loss = fz_coin(r, 0.3) ? (float)pow(10.0, -5 + 3 * host_rng_uniform(r)) : 0.f;
    p->softcap = fz_coin(r, 0.25) ? (float)(2 + 48 * host_rng_uniform(r)) : 0.f;
    p->temperature = fz_coin(r, 0.3) ? (float)(0.5 + 1.5 * host_rng_uniform(r)) : 1.f;
    p->has_bias = fz_coin(r, 0.4);
    p->has_class_weights = fz_coin(r, 0.3);
    p->allow_tf32 = fz_coin(r, 0.2);
    double m = host_rng_uniform(r);
    c->mode = m < 0.25 ? FZ_FORWARD : m < 0.8 ? FZ_LOSS_AND_GRAD : FZ_BACKWARD;
    p->accumulate_grad_hidden = c->mode != FZ_FORWARD && fz_coin(r, 0.25);
    p->accumulate_grad_weight = c->mode != FZ_FORWARD && fz_coin(r, 0.25);
    unsigned o = 0;
    if (fz_coin(r, 0.5)) o |= TENSOR_ENTROPY;
    if (fz_coin(r, 0.5)) o |= TENSOR_ARGMAX;
    c->outputs = o;
}

/* Bytes of memory_budget the plan needs for one row (chunked) or 8 columns (recompute). */
static uint64_t fz_budget_need(const flce_problem *p)
{
    uint64_t per = 4 + (p->dtype == FLCE_DTYPE_F32 ? 0 : 2);
    uint64_t row = (uint64_t)((p->vocab_shard + 7) / 8 * 8) * per, cols = (uint64_t)p->tokens * per * 8;
    if (p->strategy == FLCE_STRATEGY_CHUNKED) return row;
    if (p->strategy == FLCE_STRATEGY_RECOMPUTE) return cols;
    return row > cols ? row : cols;
}

static void fz_shape_tokens(host_rng *r, fz_case *c)
{
    flce_problem *p = &c->p;
    static const int64_t n_edges[] = {1, 2, 127, 128, 129, FZ_MAX_TOKENS};
    p->tokens = fz_coin(r, 0.08) ? fz_pick(r, n_edges, 6) : fz_log_uniform(r, 1, FZ_MAX_TOKENS);
    double t = host_rng_uniform(r);
    int64_t cap = fz_nd_cap[t < 0.9 ? 0 : t < 0.98 ? 1 : 2];
    while (p->tokens * p->hidden > cap) p->tokens = (p->tokens + 1) / 2;
}

static void fz_vocab_place(host_rng *r, fz_case *c)
{
    flce_problem *p = &c->p;
    double t = host_rng_uniform(r);
    if (t < 0.17) { /* a later shard of a bigger vocab */
        p->vocab_offset = 1 + host_rng_below(r, 2 * p->vocab_shard + 1000);
        p->vocab_total = fz_coin(r, 0.5) ? 0 : p->vocab_offset + p->vocab_shard +
                                                 host_rng_below(r, p->vocab_shard + 100);
    } else if (t < 0.25) { /* the first shard */
        p->vocab_total = p->vocab_shard + 1 + host_rng_below(r, 3 * p->vocab_shard + 100);
    }
    if (p->vocab_offset || p->vocab_total) p->label_smoothing = 0.f;
    int64_t total = ref_vocab_size(p);
    t = host_rng_uniform(r);
    p->ignore_index = t < 0.5 ? -100 : t < 0.7 ? -1 : t < 0.85 ? p->vocab_offset + host_rng_below(r, p->vocab_shard)
                                                               : host_rng_below(r, total);
}

static void fz_outputs(host_rng *r, fz_case *c)
{
    unsigned o = c->outputs;
    if (fz_coin(r, 0.9)) o |= TENSOR_LOSS;
    if (fz_coin(r, 0.7)) o |= TENSOR_LSE;
    if (fz_coin(r, 0.5)) o |= TENSOR_LOSS_PER_TOKEN;
    if (c->p.z_loss > 0 && fz_coin(r, 0.5)) o |= TENSOR_Z_LOSS;
    if (fz_coin(r, 0.5)) o |= TENSOR_TARGET_LOGPROB;
    if (c->mode != FZ_FORWARD) {
        if (fz_coin(r, 0.85)) o |= TENSOR_GRAD_HIDDEN;
        if (fz_coin(r, 0.85)) o |= TENSOR_GRAD_WEIGHT;
        if (c->p.has_bias && fz_coin(r, 0.8)) o |= TENSOR_GRAD_BIAS;
        if (!(o & (TENSOR_GRAD_HIDDEN | TENSOR_GRAD_WEIGHT))) o |= fz_coin(r, 0.5) ? TENSOR_GRAD_HIDDEN : TENSOR_GRAD_WEIGHT;
    }
    /* A forward with nothing to compute is an argument error, not a case. */
    if (!(o & (TENSOR_LOSS | TENSOR_LSE | TENSOR_LOSS_PER_TOKEN | TENSOR_TARGET_LOGPROB | TENSOR_ENTROPY |
               TENSOR_ARGMAX | TENSOR_Z_LOSS)))
        o |= TENSOR_LOSS;
    /* Backward reads the lse its forward saved. */
    if (c->mode == FZ_BACKWARD) o |= TENSOR_LSE;
    /* Sampled cases: dW rows need every token's lse, and a reduced loss is checked through the
     * per-token losses (the reference cannot afford every row). */
    if (!c->full_ref) {
        o |= TENSOR_LSE;
        if ((o & TENSOR_LOSS) && c->p.reduction != FLCE_REDUCTION_NONE) o |= TENSOR_LOSS_PER_TOKEN;
    }
    c->outputs = o;
}

void fz_case_make(uint64_t seed, uint64_t index, fz_case *c)
{
    memset(c, 0, sizeof *c);
    c->seed = seed, c->index = index;
    flce_problem_init(&c->p);
    host_rng r;
    host_rng_seed(&r, fz_mix(seed, index));
    c->pool = fz_coin(&r, 0.5) ? (int64_t)host_rng_below(&r, FZ_POOL) : -1;
    if (c->pool >= 0) {
        host_rng pr;
        host_rng_seed(&pr, fz_mix(seed ^ 0xC1A55ull, (uint64_t)c->pool));
        fz_class(&pr, 1, c);
    } else {
        fz_class(&r, 0, c);
    }
    flce_problem *p = &c->p;
    fz_shape_tokens(&r, c);
    fz_vocab_place(&r, c);
    p->deterministic = fz_coin(&r, 0.5);
    if (c->mode != FZ_FORWARD) {
        double s = host_rng_uniform(&r);
        p->strategy = s < 0.3 ? FLCE_STRATEGY_AUTO : s < 0.65 ? FLCE_STRATEGY_CHUNKED : FLCE_STRATEGY_RECOMPUTE;
        if (fz_coin(&r, 0.5)) /* a small budget: many token chunks or vocab chunks */
            p->memory_budget = fz_budget_need(p) * (uint64_t)(1 + host_rng_below(&r, 16));
    } else if (fz_coin(&r, 0.5)) {
        p->strategy = FLCE_STRATEGY_FORWARD;
    }
    static const double sds[] = {0.5, 1.0, 2.0, 4.0};
    c->logit_sd = sds[host_rng_below(&r, 4)] * (0.8 + 0.4 * host_rng_uniform(&r));
    double t = host_rng_uniform(&r);
    c->ignore_frac = t < 0.3 ? 0 : t < 0.38 ? 1 : host_rng_uniform(&r);
    t = host_rng_uniform(&r);
    c->ignore_layout = t < 0.7 ? 0 : t < 0.85 ? 1 : 2;
    c->edge_labels = fz_coin(&r, 0.3);
    c->grad_output = fz_coin(&r, 0.5);
    c->full_ref = fz_case_work(c) <= (double)FZ_FULL_REF_WORK;
    fz_outputs(&r, c);
}

double fz_case_work(const fz_case *c)
{
    return (double)c->p.tokens * (double)c->p.vocab_shard * (double)c->p.hidden;
}

void fz_case_describe(const fz_case *c, char *out, size_t len)
{
    static const char *modes[] = {"forward", "loss_and_grad", "backward"};
    static const char *strat[] = {"auto", "forward", "chunked", "recompute"};
    static const char *red[] = {"mean", "sum", "none"};
    const flce_problem *p = &c->p;
    snprintf(out, len,
             "N=%lld D=%lld V=%lld off=%lld total=%lld %s %s %s/%s budget=%llu i%d ign=%lld(%.2f,%d) "
             "eps=%g zl=%g cap=%g T=%g bias=%d cw=%d acc=%d%d tf32=%d det=%d sd=%.2f go=%d out=0x%x %s pool=%lld",
             (long long)p->tokens, (long long)p->hidden, (long long)p->vocab_shard,
             (long long)p->vocab_offset, (long long)p->vocab_total, host_dtype_name(p->dtype),
             red[p->reduction], modes[c->mode], strat[p->strategy],
             (unsigned long long)p->memory_budget, p->label_bits, (long long)p->ignore_index,
             c->ignore_frac, c->ignore_layout, (double)p->label_smoothing, (double)p->z_loss,
             (double)p->softcap, (double)p->temperature, p->has_bias, p->has_class_weights,
             p->accumulate_grad_hidden, p->accumulate_grad_weight, p->allow_tf32, p->deterministic,
             c->logit_sd, c->grad_output, c->outputs, c->full_ref ? "full-ref" : "sampled",
             (long long)c->pool);
}

/* ---- data --------------------------------------------------------------------------------- */

void fz_data_free(fz_data *x)
{
    free(x->h), free(x->w), free(x->b), free(x->cw), free(x->go), free(x->labels);
    free(x->ref_labels), free(x->acc_h), free(x->acc_w), free(x->h_dt), free(x->w_dt), free(x->b_dt);
    memset(x, 0, sizeof *x);
}

static int fz_ignored_at(const fz_case *c, host_rng *r, int64_t i)
{
    int64_t block = (int64_t)llround(c->ignore_frac * (double)c->p.tokens);
    if (c->ignore_layout == 1) return i < block;
    if (c->ignore_layout == 2) return i >= c->p.tokens - block;
    return host_rng_uniform(r) < c->ignore_frac;
}

static void fz_make_labels(const fz_case *c, host_rng *r, fz_data *x)
{
    const flce_problem *p = &c->p;
    for (int64_t i = 0; i < x->n; i++) {
        int64_t local = host_rng_below(r, x->v);
        if (c->edge_labels && i == 0) local = 0;
        if (c->edge_labels && i == x->n - 1) local = x->v - 1;
        int ign = fz_ignored_at(c, r, i);
        int64_t global = p->vocab_offset + local;
        /* ignore_index may be a real vocab id (a padding token): such labels are ignored too */
        if (ign || global == p->ignore_index) {
            x->labels[i] = p->ignore_index;
            x->ref_labels[i] = -100;
        } else {
            x->labels[i] = global;
            x->ref_labels[i] = local;
        }
    }
}

static void fz_normals(host_rng *r, double *a, int64_t n, double sd)
{
    for (int64_t i = 0; i < n; i++) a[i] = sd * host_rng_normal(r);
}

static void *fz_to_dtype(flce_dtype t, const double *a, int64_t n)
{
    void *out = malloc((size_t)(n > 0 ? n : 1) * host_dtype_size(t));
    if (out) host_to_dtype(t, a, out, (size_t)n);
    return out;
}

int fz_data_make(const fz_case *c, fz_data *x)
{
    memset(x, 0, sizeof *x);
    const flce_problem *p = &c->p;
    host_rng r;
    host_rng_seed(&r, fz_mix(fz_mix(c->seed, c->index), 0xDA7Aull));
    x->n = p->tokens, x->d = p->hidden, x->v = p->vocab_shard;
    x->n_loss = p->reduction == FLCE_REDUCTION_NONE ? x->n : 1;
    int64_t total = ref_vocab_size(p), nd = x->n * x->d, vd = x->v * x->d;
    x->h = malloc(sizeof(double) * (size_t)nd), x->w = malloc(sizeof(double) * (size_t)vd);
    x->labels = malloc(sizeof(int64_t) * (size_t)x->n);
    x->ref_labels = malloc(sizeof(int64_t) * (size_t)x->n);
    if (!x->h || !x->w || !x->labels || !x->ref_labels) return -1;
    /* logits h·w of standard deviation logit_sd: unit hidden states, weights of sd logit_sd/√D */
    fz_normals(&r, x->h, nd, 1.0);
    fz_normals(&r, x->w, vd, c->logit_sd / sqrt((double)x->d));
    host_round_to_dtype(p->dtype, x->h, (size_t)nd);
    host_round_to_dtype(p->dtype, x->w, (size_t)vd);
    if (p->has_bias) {
        if (!(x->b = malloc(sizeof(double) * (size_t)x->v))) return -1;
        fz_normals(&r, x->b, x->v, 0.5);
        host_round_to_dtype(p->dtype, x->b, (size_t)x->v);
    }
    if (p->has_class_weights) {
        if (!(x->cw = malloc(sizeof(double) * (size_t)total))) return -1;
        /* fp32 on the device: keep values fp32 holds exactly */
        for (int64_t j = 0; j < total; j++) x->cw[j] = (float)(0.5 + 1.5 * host_rng_uniform(&r));
    }
    if (c->grad_output) {
        if (!(x->go = malloc(sizeof(double) * (size_t)x->n_loss))) return -1;
        for (int64_t i = 0; i < x->n_loss; i++) x->go[i] = (float)(0.5 + host_rng_uniform(&r));
    }
    fz_make_labels(c, &r, x);
    if (p->accumulate_grad_hidden && (c->outputs & TENSOR_GRAD_HIDDEN)) {
        if (!(x->acc_h = malloc(sizeof(float) * (size_t)nd))) return -1;
        for (int64_t i = 0; i < nd; i++) x->acc_h[i] = (float)(1e-2 * host_rng_normal(&r));
    }
    if (p->accumulate_grad_weight && (c->outputs & TENSOR_GRAD_WEIGHT)) {
        if (!(x->acc_w = malloc(sizeof(float) * (size_t)vd))) return -1;
        for (int64_t i = 0; i < vd; i++) x->acc_w[i] = (float)(1e-2 * host_rng_normal(&r));
    }
    x->h_dt = fz_to_dtype(p->dtype, x->h, nd);
    x->w_dt = fz_to_dtype(p->dtype, x->w, vd);
    if (p->has_bias) x->b_dt = fz_to_dtype(p->dtype, x->b, x->v);
    if (!x->h_dt || !x->w_dt || (p->has_bias && !x->b_dt)) return -1;
    return 0;
}

/* ---- sampling ----------------------------------------------------------------------------- */

void fz_sample_free(fz_sample *s)
{
    free(s->tok), free(s->voc);
    memset(s, 0, sizeof *s);
}

int fz_inputs_make(const fz_case *c, fz_data *x, fz_sample *s)
{
    memset(s, 0, sizeof *s);
    if (fz_data_make(c, x) == 0 && fz_sample_make(c, x, s) == 0) return 0;
    fz_sample_free(s);
    fz_data_free(x);
    return -1;
}

static int fz_has(const int64_t *a, int64_t n, int64_t v)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

static int fz_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int fz_sample_make(const fz_case *c, const fz_data *x, fz_sample *s)
{
    memset(s, 0, sizeof *s);
    int64_t nt = c->full_ref ? x->n : FZ_SAMPLE_TOKENS, nv = c->full_ref ? x->v : FZ_SAMPLE_VOCAB;
    s->tok = malloc(sizeof(int64_t) * (size_t)nt), s->voc = malloc(sizeof(int64_t) * (size_t)nv);
    if (!s->tok || !s->voc) return -1;
    if (c->full_ref) {
        for (int64_t i = 0; i < x->n; i++) s->tok[i] = i;
        for (int64_t j = 0; j < x->v; j++) s->voc[j] = j;
        s->n_tok = x->n, s->n_voc = x->v;
        return 0;
    }
    host_rng r;
    host_rng_seed(&r, fz_mix(fz_mix(c->seed, c->index), 0x5A3F0ull));
    /* Tokens: the first and the last, then random ones, valid ones preferred (they carry the
     * gradients) but ignored ones kept in when that is all there is. */
    s->tok[s->n_tok++] = 0;
    if (x->n > 1) s->tok[s->n_tok++] = x->n - 1;
    for (int tries = 0; s->n_tok < nt && s->n_tok < x->n && tries < 400; tries++) {
        int64_t i = host_rng_below(&r, x->n);
        if (fz_has(s->tok, s->n_tok, i) || (tries < 200 && x->ref_labels[i] < 0)) continue;
        s->tok[s->n_tok++] = i;
    }
    /* Vocab rows: 0, V−1, the labels of sampled tokens (the rows with the big gradients), random. */
    s->voc[s->n_voc++] = 0;
    if (x->v > 1) s->voc[s->n_voc++] = x->v - 1;
    for (int64_t k = 0; k < s->n_tok && s->n_voc < nv / 2; k++) {
        int64_t y = x->ref_labels[s->tok[k]];
        if (y >= 0 && !fz_has(s->voc, s->n_voc, y)) s->voc[s->n_voc++] = y;
    }
    for (int tries = 0; s->n_voc < nv && s->n_voc < x->v && tries < 400; tries++) {
        int64_t j = host_rng_below(&r, x->v);
        if (!fz_has(s->voc, s->n_voc, j)) s->voc[s->n_voc++] = j;
    }
    qsort(s->tok, (size_t)s->n_tok, sizeof *s->tok, fz_cmp_i64);
    qsort(s->voc, (size_t)s->n_voc, sizeof *s->voc, fz_cmp_i64);
    return 0;
}

/* ---- reference and comparison ------------------------------------------------------------- */

flce_problem fz_ref_problem(const fz_case *c)
{
    flce_problem q = c->p;
    q.vocab_offset = 0, q.vocab_total = 0, q.ignore_index = -100;
    return q;
}

static ref_extra fz_extra(const fz_case *c, const fz_data *x)
{
    ref_extra e = {x->cw ? x->cw + c->p.vocab_offset : NULL};
    return e;
}

double *fz_token_scales(const fz_case *c, const fz_data *x)
{
    double *g = malloc(sizeof(double) * (size_t)x->n);
    if (!g) return NULL;
    flce_problem q = fz_ref_problem(c);
    ref_extra e = fz_extra(c, x);
    ref_token_scales(&q, &e, x->n, x->v, x->ref_labels, x->go, g);
    return g;
}

/* z_ij of §1 for one token and one vocab row (shard-local j). */
static double fz_logit(const flce_problem *p, const fz_data *x, int64_t i, int64_t j)
{
    double u = 0;
    const double *h = x->h + i * x->d, *w = x->w + j * x->d;
    for (int64_t k = 0; k < x->d; k++) u += h[k] * w[k];
    if (p->has_bias) u += x->b[j];
    double z = u / (double)p->temperature;
    return p->softcap > 0 ? p->softcap * tanh(z / p->softcap) : z;
}

typedef struct fz_norms {
    double diff2, ref2, floor2, bound2; /* Σ(got−ref)², Σref², Σfloor², Σ(ref+init)² */
    double row_diff2, row_ref2, row_floor2, row_bound2; /* the same over the current row */
    double acc_k;                           /* accumulate mode: ‖got−ref‖ may reach acc_k·‖ref+init‖ */
    double worst_row;                       /* max over rows of the row's own relative error */
    int nonfinite;
    /* For the failure report: the worst row's place and sizes. ids maps a row to the vocab id or
     * token it stands for (NULL: the row's number); row_aux: what the caller notes of the current
     * row (dW, db: the token of its largest p_ij), kept as worst_aux for the worst row. */
    const int64_t *ids;
    int64_t rows, worst_k, row_aux, worst_aux;
    double worst_ref, worst_diff, worst_floor;
} fz_norms;

static void fz_add(fz_norms *a, double ref, double got, double floor);

/* An entry of a gradient accumulated into fp32 values `init`: the stored sum's own rounding. */
static void fz_add_acc(fz_norms *a, double ref, double got, double floor, double init)
{
    fz_add(a, ref, got, floor);
    a->bound2 += (ref + init) * (ref + init), a->row_bound2 += (ref + init) * (ref + init);
}

static void fz_add(fz_norms *a, double ref, double got, double floor)
{
    if (!isfinite(got)) a->nonfinite = 1;
    double e2 = (got - ref) * (got - ref);
    a->diff2 += e2, a->row_diff2 += e2;
    a->ref2 += ref * ref, a->row_ref2 += ref * ref;
    a->floor2 += floor * floor, a->row_floor2 += floor * floor;
}

/* Ends a row (one token's scalar, or one gradient row): a single row far off is not hidden by
 * many good ones in the vector's L2 (fz_finish holds each row to 10× the tolerance). */
static void fz_row_end(fz_norms *a)
{
    double scale = fmax(sqrt(a->row_ref2), sqrt(a->row_floor2));
    double diff = fmax(0, sqrt(a->row_diff2) - a->acc_k * sqrt(a->row_bound2));
    double e = scale > 0 ? diff / scale : diff;
    if (isnan(a->row_diff2)) e = NAN;
    if (!(e <= a->worst_row)) {
        a->worst_row = e; /* NaN sticks */
        a->worst_k = a->rows, a->worst_ref = sqrt(a->row_ref2), a->worst_diff = sqrt(a->row_diff2);
        a->worst_floor = sqrt(a->row_floor2), a->worst_aux = a->row_aux;
    }
    a->rows++;
    a->row_diff2 = a->row_ref2 = a->row_floor2 = a->row_bound2 = 0;
}

/* Error and (in r) tolerance of one quantity. In accumulate mode (acc_k > 0) the rounding of the
 * stored fp32 sums, which no kernel can avoid, is taken off the difference first. */
static void fz_finish(fz_result *r, int q, const fz_norms *a, double tol)
{
    double scale = fmax(sqrt(a->ref2), sqrt(a->floor2));
    if (!(scale > 0)) scale = 1; /* nothing but zeros: an absolute check */
    double diff = fmax(0, sqrt(a->diff2) - a->acc_k * sqrt(a->bound2));
    if (isnan(a->diff2)) diff = NAN;
    /* the vector's relative L2 (docs/DESIGN.md §8.2), or its worst row at a tenth of the weight */
    double err = fmax(diff / scale, a->worst_row / 10);
    if (a->nonfinite || isnan(err) || isnan(a->worst_row)) err = INFINITY;
    double t = tol;
    r->err[q] = err, r->tol[q] = t;
    if (!(err <= t)) {
        r->failed = 1;
        size_t used = strlen(r->detail);
        if (a->rows && used + 1 < sizeof r->detail)
            snprintf(r->detail + used, sizeof r->detail - used,
                     "%s: L2 %.3g, worst row %lld (id %lld) %.3g: |ref| %.3g |got-ref| %.3g floor %.3g; ",
                     fz_q_names[q], diff / scale, (long long)a->worst_k,
                     (long long)(a->ids ? a->ids[a->worst_k] : a->worst_k), a->worst_row, a->worst_ref,
                     a->worst_diff, a->worst_floor);
    }
}

/* Per-token reference values of one sampled token. */
typedef struct fz_row_ref {
    ref_row_out o;
    double mag; /* 1 + |lse| + |z_y| + λ·lse²: the size of the fp32 terms of loss_i */
} fz_row_ref;

static double fz_tol_grad(const flce_problem *p)
{
    if (p->dtype != FLCE_DTYPE_F32) return 4e-3;
    return p->allow_tf32 ? 2e-3 : 1e-4;
}

typedef struct fz_ctx {
    const fz_case *c;
    const fz_data *x;
    const fz_sample *s;
    const fz_got *g;
    flce_problem q;
    ref_extra e;
    double *gs;      /* g_i for every token */
    fz_row_ref *rows; /* one per sampled token */
    double *dz;      /* V_r scratch */
    fz_result *r;
    double acc_k;    /* accumulate mode's allowance (fz_norms.acc_k) */
    double p16sub;   /* absolute step of a stored p over its tile's maximum: 2^-39 where the plan
                      * keeps fp16 compact logits, else 0 (fz_gmax) */
    double *gmax;    /* with the whole reference: per token, the largest p of each 256 columns;
                      * NULL: bound by 1 */
    int64_t n_groups;
    double p16;      /* relative step of a stored p: one fp16 ulp (2^-11) where the plan keeps the
                      * compact logits (fp16 p̃), else 0 */
    double hs;       /* dW's operand s_i·h_i rounded to bf16 (half an ulp, 2^-9) where the plan keeps
                      * row-scaled logits (runtime/plan.h qrows), on every term but the label's, else 0 */
} fz_ctx;

/* Loss of reduction mean/sum from per-token values: Σ v_i (/ Σ_valid w_y for the mean). */
static double fz_reduce(const fz_ctx *k, const double *v, double *mag_out)
{
    double sum = 0, mag = 0, den = 0;
    for (int64_t i = 0; i < k->x->n; i++) {
        if (k->x->ref_labels[i] < 0) continue;
        sum += v[i];
        mag += fabs(v[i]) + 1 + (k->g->lse ? fabs(k->g->lse[i]) : 0);
        den += k->e.class_weight ? k->e.class_weight[k->x->ref_labels[i]] : 1;
    }
    double go = k->x->go ? k->x->go[0] : 1;
    if (k->q.reduction == FLCE_REDUCTION_MEAN) {
        sum = den > 0 ? sum / den : 0, mag = den > 0 ? mag / den : 0;
    }
    (void)go; /* the loss is reported before the upstream gradient */
    *mag_out = mag;
    return sum;
}

static void fz_check_rows(fz_ctx *k)
{
    const fz_got *g = k->g;
    fz_norms lse = {0}, lpt = {0}, lp = {0}, ent = {0}, zl = {0}, loss = {0};
    int bad_arg = 0;
    for (int64_t t = 0; t < k->s->n_tok; t++) {
        int64_t i = k->s->tok[t];
        const fz_row_ref *rr = &k->rows[t];
        const ref_row_out *o = &rr->o;
        double wy = o->valid && k->e.class_weight ? k->e.class_weight[k->x->ref_labels[i]] : 1;
        if (g->lse) fz_add(&lse, o->lse, g->lse[i], rr->mag), fz_row_end(&lse);
        if (g->lpt) fz_add(&lpt, o->loss, g->lpt[i], rr->mag), fz_row_end(&lpt);
        if (g->logprob) fz_add(&lp, o->target_logprob, g->logprob[i], rr->mag), fz_row_end(&lp);
        if (g->entropy) fz_add(&ent, o->entropy, g->entropy[i], rr->mag), fz_row_end(&ent);
        if (k->q.reduction == FLCE_REDUCTION_NONE && g->loss)
            fz_add(&loss, o->loss, g->loss[i], rr->mag), fz_row_end(&loss);
        if (k->q.reduction == FLCE_REDUCTION_NONE && g->zl)
            fz_add(&zl, o->z_loss_term * wy, g->zl[i], rr->mag), fz_row_end(&zl);
        if (g->argmax) {
            int64_t a = g->argmax[i] - k->c->p.vocab_offset;
            if (a != o->argmax) {
                double zb = fz_logit(&k->q, k->x, i, o->argmax);
                double za = a >= 0 && a < k->x->v ? fz_logit(&k->q, k->x, i, a) : -INFINITY;
                /* a tie in fp32: the GPU's pick must be as large as the true maximum */
                bad_arg += !(fabs(za - zb) <= 1e-4 * (1 + fabs(zb)));
            }
        }
    }
    if (g->lse) fz_finish(k->r, FZ_Q_LSE, &lse, 1e-5);
    if (g->lpt) fz_finish(k->r, FZ_Q_LPT, &lpt, 1e-5);
    if (g->logprob) fz_finish(k->r, FZ_Q_LOGPROB, &lp, 1e-5);
    if (g->entropy) fz_finish(k->r, FZ_Q_ENTROPY, &ent, 1e-4);
    if (k->q.reduction == FLCE_REDUCTION_NONE && g->loss) fz_finish(k->r, FZ_Q_LOSS, &loss, 1e-5);
    if (k->q.reduction == FLCE_REDUCTION_NONE && g->zl) fz_finish(k->r, FZ_Q_ZL, &zl, 1e-5);
    if (g->argmax) {
        k->r->err[FZ_Q_ARGMAX] = (double)bad_arg, k->r->tol[FZ_Q_ARGMAX] = 0;
        if (bad_arg) k->r->failed = 1;
    }
}

/* Reduced loss and z-loss (mean/sum). With the whole reference: from every row's reference. Else
 * the loss from the GPU's per-token losses (checked on the sampled rows) and the z-loss from the
 * GPU's lse (likewise): what this checks is the reduction. */
static void fz_check_reduced(fz_ctx *k, const double *all_loss, const double *all_zl)
{
    const fz_got *g = k->g;
    if (k->q.reduction == FLCE_REDUCTION_NONE) return;
    int64_t n = k->x->n;
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) return;
    if (g->loss && (all_loss || g->lpt)) {
        for (int64_t i = 0; i < n; i++) v[i] = all_loss ? all_loss[i] : g->lpt[i];
        double mag, ref = fz_reduce(k, v, &mag);
        fz_norms a = {0};
        fz_add(&a, ref, g->loss[0], mag);
        fz_finish(k->r, FZ_Q_LOSS, &a, 1e-5);
    }
    if (g->zl && (all_zl || g->lse)) {
        for (int64_t i = 0; i < n; i++) {
            int64_t y = k->x->ref_labels[i];
            double wy = y >= 0 && k->e.class_weight ? k->e.class_weight[y] : 1;
            v[i] = all_zl ? all_zl[i] : y >= 0 ? (double)k->q.z_loss * wy * g->lse[i] * g->lse[i] : 0;
        }
        double mag, ref = fz_reduce(k, v, &mag);
        fz_norms a = {0};
        fz_add(&a, ref, g->zl[0], mag);
        fz_finish(k->r, FZ_Q_ZL, &a, 1e-5);
    }
    free(v);
}

/* sqrt(a² + b²) for the allowances below (magnitudes far from overflow). Not hypot(): glibc 2.35
 * gave it a new symbol version, which the tool (in the Python wheel, flce/bin/flce) would then
 * need, raising the wheel's glibc floor from 2.34 to 2.35 (python/pyproject.toml's tag). */
static double fz_hypot(double a, double b)
{
    return sqrt(a * a + b * b);
}

/* Floor of a gradient entry Σ_t term_t: the size it would have without cancellation,
 * sqrt(Σ term²) (`mag2`), since rounding each term (dZ is stored in the dtype) errs relative to
 * the terms, not to their sum; and with fp16, an allowance `sub` for the absolute resolution of
 * its subnormals, which a dZ under 2^-14 (any p_ij < 6e-5: every large vocab) falls into. */
static double fz_floor(double mag2, double sub, double tol)
{
    double s = sub / tol;
    return sqrt(mag2 + s * s);
}

/* The kernels evaluate dz_ij = a·p_ij − (1−ε)·w_y·1[j=y] − (ε/V)·w_j in fp32 from fp32 z and lse:
 * its absolute error is a few units of fp32 roundoff of the pieces before they cancel (p itself
 * errs by u·(|z| + |lse|) through exp). Where the pieces cancel (tiny vocabs, where dz is exactly
 * 0 for V = 1; p_ij ≈ ε/V; p_iy ≈ 1) that error is not small relative to dz, and no fp32
 * implementation (PyTorch's included) does better. On the compact-logits path every p_ij but the
 * label's (which comes from the exact fp32 target logit) is read back from fp16 p̃: one more
 * rounding of p, 2^-12 of it, which under the same cancellation is not small relative to dz
 * either (fuzz case 1122 of seed 20261122: ε = 0.277, near-uniform logits, one token, its dW rows
 * with p_j ≈ ε/V; bench/NOTES.md). Returns that bound for one entry, before the slope and g_i. */
static double fz_dz_round_err(const fz_ctx *k, double z, double lse, double a, double wj, int is_label,
                             double wy, double gmax)
{
    double eps = k->q.label_smoothing, v = (double)k->x->v, p = exp(z - lse);
    double pieces = fabs(a) * p * (1 + fabs(z) + fabs(lse)) + eps * fabs(wj) / v +
                    (is_label ? (1 - eps) * fabs(wy) : 0);
    return 4 * 0x1p-24 * pieces + (is_label ? 0 : k->p16 * fabs(a) * p + k->p16sub * fabs(a) * gmax);
}

/* The compact logits keep p̃ = 2^15·p_ij / (the largest p of its row in a 256-column tile) in fp16
 * (templates/common.cuh), so below 2^-29 of that maximum p̃ is subnormal and its step absolute:
 * 2^-39 of the tile's largest p, and a p_ij under 2^-40 of it is stored as 0 (fuzz cases 741 and
 * 1232 of seed 20261127: one or two peaked tokens, dW and db rows with p_ij ≈ 1e-12..1e-13 of a
 * tile maximum ≈ 0.3, returned as 0 or a few steps; FLCE_DEV=compact=0 passes them; bench/NOTES.md
 * session 17). (Row-scaled compact logits store bf16, whose range has no such step.) The bound on
 * that maximum for token i and column j: with the whole reference (fz_ctx.gmax), the largest p in
 * any 256 columns around j (whatever the kernel's tile alignment); else 1. */
static double fz_gmax(const fz_ctx *k, int64_t i, int64_t j)
{
    if (!k->gmax) return 1;
    const double *g = k->gmax + i * k->n_groups;
    int64_t b = j / 256;
    double m = g[b];
    if (b > 0) m = fmax(m, g[b - 1]);
    if (b + 1 < k->n_groups) m = fmax(m, g[b + 1]);
    return m;
}

/* a_i of the dz formula and Σ_j w_j (class weights, or V). */
static double fz_wsum(const fz_ctx *k)
{
    double wsum = 0;
    for (int64_t j = 0; j < k->x->v; j++) wsum += k->e.class_weight ? k->e.class_weight[j] : 1;
    return wsum;
}

static double fz_slope(const flce_problem *q, double z)
{
    double slope = 1 / (double)q->temperature;
    return q->softcap > 0 ? slope * (1 - (z / q->softcap) * (z / q->softcap)) : slope;
}

/* fp16 gradient outputs (not accumulated in fp32) are themselves rounded to fp16, whose
 * subnormal spacing 2^-24 is an absolute floor on their resolution, whatever dZ's scale. */
static double fz_out_sub(const fz_ctx *k, int accumulated)
{
    return k->q.dtype == FLCE_DTYPE_F16 && !accumulated ? 2 * 0x1p-25 : 0;
}

/* A gradient returned in a 16-bit dtype is the exact value rounded once more on the way out: half
 * an ulp of the value, at most 2^-8 of it in bf16 and 2^-11 in fp16 (just above a power of two;
 * 2^-9 and 2^-12 just below the next), which no implementation avoids and which adds to the error
 * of 16-bit dZ. Entry floor² gains (that/tol)²: on a tiny problem dominated by a few terms the two
 * roundings alone reach the 4e-3 of docs/DESIGN.md §8.2 (seen: 4.04e-3 on 3 tokens, and db 4.295e-3 in case
 * 1346 of seed 20261127, a vector led by five label entries, each one bf16 dZ term; both matched
 * to four digits by an fp32 model of the kernels, tests/test_fuzz_gen.c). Until session 17 this
 * took 2^-9 / 2^-12, the half ulp at the top of a binade, not its largest relative size. */
static double fz_out_round2(const fz_ctx *k, int accumulated, double ref, double tol)
{
    if (accumulated || k->q.dtype == FLCE_DTYPE_F32) return 0;
    double u = (k->q.dtype == FLCE_DTYPE_BF16 ? 0x1p-8 : 0x1p-11) * ref / tol;
    return u * u;
}

/* fp16: 4 × half the subnormal spacing (2^-25), times the scale the GEMM epilogue applies after
 * the stored dZ (g/denominator/256 for mean and sum; 1 for none, where g_i is inside dZ). */
static double fz_subnormal(const fz_ctx *k)
{
    if (k->q.dtype != FLCE_DTYPE_F16) return 0;
    double s = 1;
    if (k->q.reduction != FLCE_REDUCTION_NONE) {
        s = 0;
        for (int64_t i = 0; i < k->x->n; i++) s = fmax(s, fabs(k->gs[i]));
        s /= 256; /* mean/sum store fp16 dZ × 256 (DZ_SCALE_F16, templates/common.cuh) */
    }
    return 4 * 0x1p-25 * s;
}

/* dH of the sampled tokens: g_i·Σ_j dz_ij·w_j from ref_row's dz. */
static void fz_check_dh(fz_ctx *k)
{
    if (!k->g->dh_rows) return;
    int64_t d = k->x->d;
    double tol = fz_tol_grad(&k->q), sub = fz_subnormal(k), *w2 = calloc((size_t)d, sizeof(double));
    double *acc = malloc(sizeof(double) * (size_t)d), *mag = malloc(sizeof(double) * (size_t)d);
    if (!acc || !mag || !w2) {
        free(acc), free(mag), free(w2);
        return;
    }
    for (int64_t j = 0; j < k->x->v; j++)
        for (int64_t c = 0; c < d; c++) w2[c] += k->x->w[j * d + c] * k->x->w[j * d + c];
    fz_norms a = {0};
    a.acc_k = k->acc_k, a.ids = k->s->tok;
    double *mag32 = malloc(sizeof(double) * (size_t)d), wsum = fz_wsum(k);
    const flce_problem *q = &k->q;
    for (int64_t t = 0; t < k->s->n_tok && mag32; t++) {
        int64_t i = k->s->tok[t], y = k->x->ref_labels[i];
        ref_row_out o;
        ref_row(&k->q, &k->e, d, k->x->v, k->x->h + i * d, k->x->w, k->x->b, k->x->ref_labels[i], &o, k->dz);
        memset(acc, 0, sizeof(double) * (size_t)d), memset(mag, 0, sizeof(double) * (size_t)d);
        memset(mag32, 0, sizeof(double) * (size_t)d);
        double wy = y >= 0 && k->e.class_weight ? k->e.class_weight[y] : 1;
        double ai = (1 - q->label_smoothing) * wy + q->label_smoothing / (double)k->x->v * wsum +
                    2 * q->z_loss * wy * o.lse;
        if (k->gs[i] != 0)
            for (int64_t j = 0; j < k->x->v; j++) {
                double f = k->gs[i] * k->dz[j], z = fz_logit(q, k->x, i, j);
                double wj = k->e.class_weight ? k->e.class_weight[j] : 1;
                double r = fz_dz_round_err(k, z, o.lse, ai, wj, j == y, wy, fz_gmax(k, i, j)) * fabs(fz_slope(q, z) * k->gs[i]);
                for (int64_t c = 0; c < d; c++) {
                    double term = f * k->x->w[j * d + c], rt = r * k->x->w[j * d + c];
                    acc[c] += term, mag[c] += term * term, mag32[c] += rt * rt;
                }
            }
        for (int64_t c = 0; c < d; c++) {
            double init = k->x->acc_h ? k->x->acc_h[i * d + c] : 0;
            double got = k->g->dh_rows[t * d + c] - init;
            double fl = k->gs[i] != 0 ? fz_floor(mag[c] + mag32[c] / (tol * tol) + fz_out_round2(k, k->x->acc_h != NULL, acc[c], tol), fz_hypot(sub * sqrt(w2[c]), fz_out_sub(k, k->x->acc_h != NULL)), tol) : 0;
            fz_add_acc(&a, acc[c], got, fl, init);
        }
        fz_row_end(&a);
    }
    fz_finish(k->r, FZ_Q_DH, &a, tol);
    free(acc), free(mag), free(w2), free(mag32);
}

/* A failed dW or db: its worst row's largest p_ij, and that p over the largest p of its token in the
 * row's 256-column tile (where compact logits store p̃ relative to it), in the report. */
static void fz_report_p(const fz_ctx *k, int q, const fz_norms *a, const double *lse)
{
    fz_result *r = k->r;
    size_t used = strlen(r->detail);
    if (r->err[q] <= r->tol[q] || !a->rows || a->worst_aux < 0 || used + 1 >= sizeof r->detail) return;
    int64_t i = a->worst_aux, j = a->ids[a->worst_k], j0 = j / 256 * 256;
    double p = exp(fz_logit(&k->q, k->x, i, j) - lse[i]), m = 0;
    for (int64_t jj = j0; jj < k->x->v && jj < j0 + 256; jj++) m = fmax(m, exp(fz_logit(&k->q, k->x, i, jj) - lse[i]));
    snprintf(r->detail + used, sizeof r->detail - used, "(max_i p_ij %.3g, over its 256-column tile's max %.3g); ",
             p, m > 0 ? p / m : -1);
}

/* dW and db rows of the sampled vocab rows from every token's dz_ij, with lse_i from `lse`
 * (the reference's, or the GPU's when the case is too big for every row's reference). */
static void fz_check_dw(fz_ctx *k, const double *lse)
{
    const fz_got *g = k->g;
    if (!g->dw_rows && !g->db_rows) return;
    const fz_data *x = k->x;
    const flce_problem *q = &k->q;
    int64_t d = x->d, v = x->v;
    double eps = q->label_smoothing, lam = q->z_loss, wsum = 0;
    for (int64_t j = 0; j < v; j++) wsum += k->e.class_weight ? k->e.class_weight[j] : 1;
    double tol = fz_tol_grad(q), sub = fz_subnormal(k), n_valid = 0;
    double *acc = malloc(sizeof(double) * (size_t)d), *mag = malloc(sizeof(double) * (size_t)d);
    double *h2 = calloc((size_t)d, sizeof(double)), *mag32 = malloc(sizeof(double) * (size_t)d);
    if (!acc || !mag || !h2 || !mag32) {
        free(acc), free(mag), free(h2), free(mag32);
        return;
    }
    for (int64_t i = 0; i < x->n; i++) {
        if (k->gs[i] == 0) continue;
        n_valid++;
        for (int64_t c = 0; c < d; c++) h2[c] += x->h[i * d + c] * x->h[i * d + c];
    }
    fz_norms aw = {0}, ab = {0};
    aw.acc_k = k->acc_k;
    aw.ids = ab.ids = k->s->voc;
    for (int64_t t = 0; t < k->s->n_voc; t++) {
        int64_t j = k->s->voc[t];
        double wj = k->e.class_weight ? k->e.class_weight[j] : 1, db = 0, db_mag = 0;
        memset(acc, 0, sizeof(double) * (size_t)d), memset(mag, 0, sizeof(double) * (size_t)d);
        memset(mag32, 0, sizeof(double) * (size_t)d);
        double db32 = 0, pmax = -1;
        int64_t imax = -1;
        for (int64_t i = 0; i < x->n; i++) {
            int64_t y = x->ref_labels[i];
            if (k->gs[i] == 0 || y < 0) continue;
            double wy = k->e.class_weight ? k->e.class_weight[y] : 1;
            double z = fz_logit(q, x, i, j), pij = exp(z - lse[i]);
            if (pij > pmax) pmax = pij, imax = i;
            double a = (1 - eps) * wy + eps / (double)v * wsum + 2 * lam * wy * lse[i];
            double dz = a * pij - eps * wj / (double)v - (j == y ? (1 - eps) * wy : 0);
            double f = fz_slope(q, z) * k->gs[i];
            double r = fz_dz_round_err(k, z, lse[i], a, wj, j == y, wy, fz_gmax(k, i, j)) * fabs(f);
            dz *= f;
            db += dz, db_mag += dz * dz, db32 += r * r;
            for (int64_t c = 0; c < d; c++) {
                double term = dz * x->h[i * d + c], rt = r * x->h[i * d + c], ht = j == y ? 0 : k->hs * term;
                acc[c] += term, mag[c] += term * term, mag32[c] += rt * rt + ht * ht;
            }
        }
        aw.row_aux = ab.row_aux = imax; /* for the report (fz_report_p) */
        if (g->dw_rows)
            for (int64_t c = 0; c < d; c++) {
                double init = x->acc_w ? x->acc_w[j * d + c] : 0;
                fz_add_acc(&aw, acc[c], g->dw_rows[t * d + c] - init, fz_floor(mag[c] + mag32[c] / (tol * tol) + fz_out_round2(k, x->acc_w != NULL, acc[c], tol), fz_hypot(sub * sqrt(h2[c]), fz_out_sub(k, x->acc_w != NULL)), tol), init);
            }
        fz_row_end(&aw);
        if (g->db_rows)
            fz_add(&ab, db, g->db_rows[t], fz_floor(db_mag + db32 / (tol * tol) + fz_out_round2(k, 0, db, tol), fz_hypot(sub * sqrt(n_valid), fz_out_sub(k, 0)), tol)), fz_row_end(&ab);
    }
    if (g->dw_rows) fz_finish(k->r, FZ_Q_DW, &aw, tol), fz_report_p(k, FZ_Q_DW, &aw, lse);
    if (g->db_rows) fz_finish(k->r, FZ_Q_DB, &ab, tol), fz_report_p(k, FZ_Q_DB, &ab, lse);
    free(acc), free(mag), free(h2), free(mag32);
}

void fz_got_drop_unasked(const fz_case *c, fz_got *g)
{
    unsigned out = c->outputs;
    if (!(out & TENSOR_LOSS)) free(g->loss), g->loss = NULL;
    if (!(out & TENSOR_LSE)) free(g->lse), g->lse = NULL;
    if (!(out & TENSOR_LOSS_PER_TOKEN)) free(g->lpt), g->lpt = NULL;
    if (!(out & TENSOR_Z_LOSS)) free(g->zl), g->zl = NULL;
    if (!(out & TENSOR_TARGET_LOGPROB)) free(g->logprob), g->logprob = NULL;
    if (!(out & TENSOR_ENTROPY)) free(g->entropy), g->entropy = NULL;
    if (!(out & TENSOR_ARGMAX)) free(g->argmax), g->argmax = NULL;
}

double fz_case_logit(const fz_case *c, const fz_data *x, int64_t i, int64_t j)
{
    flce_problem q = fz_ref_problem(c);
    return fz_logit(&q, x, i, j);
}

/* fz_ctx.gmax from every token's logits (the whole reference: small cases only). */
static int fz_group_max(fz_ctx *k, const double *lse)
{
    int64_t n = k->x->n, v = k->x->v;
    k->n_groups = (v + 255) / 256;
    k->gmax = calloc((size_t)(n * k->n_groups), sizeof(double));
    if (!k->gmax) return -1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < v; j++) {
            double p = exp(fz_logit(&k->q, k->x, i, j) - lse[i]);
            double *m = k->gmax + i * k->n_groups + j / 256;
            if (p > *m) *m = p;
        }
    return 0;
}

int fz_check(const fz_case *c, const fz_data *x, const fz_sample *s, const fz_got *g, fz_result *r)
{
    for (int q = 0; q < FZ_Q_COUNT; q++) r->err[q] = -1, r->tol[q] = 0;
    r->detail[0] = 0;
    r->failed = g->nonfinite != 0;
    fz_ctx k = {c, x, s, g, fz_ref_problem(c), fz_extra(c, x), NULL, NULL, NULL, r, 0};
    /* Accumulate mode rounds the caller's fp32 sums once per token chunk or vocab chunk that adds
     * into them (as the plan for an H100 cuts the problem): 4 ulps of the sum per sqrt(chunks). */
    plan pl;
    flce_op op = c->mode == FZ_FORWARD ? FLCE_OP_FORWARD : c->mode == FZ_BACKWARD ? FLCE_OP_BACKWARD
                                                                                 : FLCE_OP_LOSS_AND_GRAD;
    const int planned = plan_make(&c->p, op, 90, 132, NULL, &pl) == FLCE_OK;
    double chunks = planned ? (double)(pl.n_chunks > pl.n_vchunks ? pl.n_chunks : pl.n_vchunks) : 1e4;
    k.acc_k = 0x1p-22 * sqrt(chunks + 1);
    k.p16 = planned && op == FLCE_OP_LOSS_AND_GRAD && pl.compact ? (pl.qrows ? 0x1p-9 : 0x1p-11) : 0;
    k.hs = planned && op == FLCE_OP_LOSS_AND_GRAD && pl.qrows ? 0x1p-9 : 0;
    k.p16sub = k.p16 > 0 && !pl.qrows ? 0x1p-39 : 0;
    k.gs = fz_token_scales(c, x);
    k.rows = malloc(sizeof(fz_row_ref) * (size_t)(s->n_tok > 0 ? s->n_tok : 1));
    k.dz = malloc(sizeof(double) * (size_t)x->v);
    double *all_lse = NULL, *all_loss = NULL, *all_zl = NULL;
    int rc = 0;
    if (!k.gs || !k.rows || !k.dz) rc = -1;
    for (int64_t t = 0; rc == 0 && t < s->n_tok; t++) {
        int64_t i = s->tok[t];
        fz_row_ref *rr = &k.rows[t];
        ref_row(&k.q, &k.e, x->d, x->v, x->h + i * x->d, x->w, x->b, x->ref_labels[i], &rr->o, NULL);
        double zy = rr->o.valid ? rr->o.target_logprob + rr->o.lse : 0;
        rr->mag = 1 + fabs(rr->o.lse) + fabs(zy) + (double)k.q.z_loss * rr->o.lse * rr->o.lse;
    }
    if (rc == 0 && c->full_ref) {
        /* every row's reference: the reduced loss and the dW rows need them all */
        all_lse = malloc(sizeof(double) * (size_t)x->n), all_loss = malloc(sizeof(double) * (size_t)x->n);
        all_zl = malloc(sizeof(double) * (size_t)x->n);
        if (!all_lse || !all_loss || !all_zl) rc = -1;
        for (int64_t t = 0; rc == 0 && t < s->n_tok; t++) {
            int64_t i = s->tok[t], y = x->ref_labels[i];
            all_lse[i] = k.rows[t].o.lse, all_loss[i] = k.rows[t].o.loss;
            all_zl[i] = k.rows[t].o.z_loss_term * (y >= 0 && k.e.class_weight ? k.e.class_weight[y] : 1);
        }
        if (rc == 0 && k.p16sub > 0) rc = fz_group_max(&k, all_lse);
    }
    if (rc == 0) {
        fz_check_rows(&k);
        fz_check_reduced(&k, all_loss, all_zl);
        fz_check_dh(&k);
        double *lse_src = all_lse;
        double *glse = NULL;
        if (!lse_src && g->lse) {
            /* the GPU's lse, itself checked on the sampled rows above */
            glse = malloc(sizeof(double) * (size_t)x->n);
            if (glse) memcpy(glse, g->lse, sizeof(double) * (size_t)x->n);
            lse_src = glse;
        }
        if (lse_src) fz_check_dw(&k, lse_src);
        else if (g->dw_rows || g->db_rows) r->failed = 1; /* cannot happen: fz_outputs asks for lse */
        free(glse);
    }
    free(all_lse), free(all_loss), free(all_zl), free(k.gs), free(k.rows), free(k.dz), free(k.gmax);
    return rc;
}
