/* bench_data.c — random inputs, upload and the sampled fp64 reference shared by `flce demo` and
 * `flce bench` (bench_data.h says why sampled rows). */
#include "bench_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "error.h"

static void row_f64(const bench_data *d, const void *base, int64_t row, double *out)
{
    host_from_dtype(d->p.dtype, (const char *)base + (size_t)row * d->p.hidden * d->es, out,
                    (size_t)d->p.hidden);
}

/* Rows are filled in blocks, each from its own stream seeded by (seed, block): the data depend on
 * the seed only, not on how many threads fill them. */
enum { FILL_BLOCK_ROWS = 256 };

typedef struct fill_job {
    bench_data *d;
    uint64_t seed;
    double sw;
    int64_t h_blocks, w_blocks;
} fill_job;

static void fill_block(void *arg, int64_t b)
{
    fill_job *j = arg;
    const flce_problem *p = &j->d->p;
    int is_w = b >= j->h_blocks;
    int64_t blk = is_w ? b - j->h_blocks : b, rows = is_w ? p->vocab_shard : p->tokens;
    int64_t r0 = blk * FILL_BLOCK_ROWS, r1 = r0 + FILL_BLOCK_ROWS < rows ? r0 + FILL_BLOCK_ROWS : rows;
    double scale = is_w ? j->sw : 1.0, tmp[1024];
    char *base = is_w ? j->d->w : j->d->h;
    host_rng rng;
    host_rng_seed(&rng, j->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(b + 1)));
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k0 = 0; k0 < p->hidden; k0 += 1024) {
            int64_t m = p->hidden - k0 < 1024 ? p->hidden - k0 : 1024;
            for (int64_t k = 0; k < m; k++) tmp[k] = scale * host_rng_normal(&rng);
            host_to_dtype(p->dtype, tmp, base + ((size_t)r * p->hidden + (size_t)k0) * j->d->es, (size_t)m);
        }
}

int bench_data_fill(bench_data *d, uint64_t seed, double logit_std)
{
    const flce_problem *p = &d->p;
    size_t nh = (size_t)(p->tokens * p->hidden), nw = (size_t)(p->vocab_shard * p->hidden);
    d->es = host_dtype_size(p->dtype);
    d->h = malloc(nh * d->es), d->w = malloc(nw * d->es);
    d->labels = malloc((size_t)p->tokens * 4);
    if (!d->h || !d->w || !d->labels) return 0;
    /* Unit hidden states and weights of sd logit_std/sqrt(D): each logit is a sum of D products
     * of variance logit_std²/D. */
    fill_job j = {d, seed, logit_std / sqrt((double)p->hidden), (p->tokens + FILL_BLOCK_ROWS - 1) / FILL_BLOCK_ROWS,
                  (p->vocab_shard + FILL_BLOCK_ROWS - 1) / FILL_BLOCK_ROWS};
    host_parallel_for(j.h_blocks + j.w_blocks, 0, fill_block, &j);
    host_rng rng;
    host_rng_seed(&rng, seed);
    for (int64_t i = 0; i < p->tokens; i++)
        d->labels[i] = host_rng_uniform(&rng) < 0.05 ? (int32_t)p->ignore_index
                                                     : (int32_t)host_rng_below(&rng, p->vocab_shard);
    return 1;
}

uint64_t bench_data_input_bytes(const flce_problem *p)
{
    uint64_t es = host_dtype_size(p->dtype);
    return (uint64_t)(p->tokens + p->vocab_shard) * (uint64_t)p->hidden * es + (uint64_t)p->tokens * 4;
}

uint64_t bench_data_output_bytes(const flce_problem *p)
{
    /* dH, dW, lse, per-token losses and the 16-byte loss. */
    uint64_t es = host_dtype_size(p->dtype);
    return (uint64_t)(p->tokens + p->vocab_shard) * (uint64_t)p->hidden * es + (uint64_t)p->tokens * 8 + 16;
}

flce_status bench_data_poison_outputs(const bench_data *d)
{
    const flce_problem *p = &d->p;
    size_t nh = (size_t)(p->tokens * p->hidden) * d->es, nw = (size_t)(p->vocab_shard * p->hidden) * d->es;
    TRY(devmem_poison(d->d_dh, nh));
    TRY(devmem_poison(d->d_dw, nw));
    TRY(devmem_poison(d->d_lse, (size_t)p->tokens * 4));
    TRY(devmem_poison(d->d_loss_rows, (size_t)p->tokens * 4));
    return devmem_poison(d->d_loss, 16);
}

flce_status bench_data_upload(bench_data *d)
{
    const flce_problem *p = &d->p;
    size_t nh = (size_t)(p->tokens * p->hidden) * d->es, nw = (size_t)(p->vocab_shard * p->hidden) * d->es;
    TRY(devmem_alloc(&d->d_h, nh));
    TRY(devmem_alloc(&d->d_w, nw));
    TRY(devmem_alloc(&d->d_labels, (size_t)p->tokens * 4));
    TRY(devmem_alloc(&d->d_loss, 16));
    TRY(devmem_alloc(&d->d_lse, (size_t)p->tokens * 4));
    TRY(devmem_alloc(&d->d_loss_rows, (size_t)p->tokens * 4));
    TRY(devmem_alloc(&d->d_dh, nh));
    TRY(devmem_alloc(&d->d_dw, nw));
    TRY(devmem_upload(d->d_h, d->h, nh));
    TRY(devmem_upload(d->d_w, d->w, nw));
    TRY(devmem_upload(d->d_labels, d->labels, (size_t)p->tokens * 4));
    return bench_data_poison_outputs(d);
}

void bench_data_free(bench_data *d)
{
    free(d->h), free(d->w), free(d->labels);
    void *dev[] = {d->d_h, d->d_w, d->d_labels, d->d_loss, d->d_lse, d->d_dh, d->d_dw, d->d_loss_rows};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) devmem_free(dev[i]);
    memset(d, 0, sizeof *d);
}

typedef struct ref_tok_job {
    bench_ref *r;
    const bench_data *d;
    int failed;
} ref_tok_job;

/* One sampled token: its logits over the whole vocabulary in fp64, lse, loss and dH row. */
static void ref_token(void *arg, int64_t s)
{
    ref_tok_job *j = arg;
    const bench_data *d = j->d;
    bench_ref *r = j->r;
    const flce_problem *p = &d->p;
    int64_t D = p->hidden, V = p->vocab_shard, i = r->tok[s];
    double *h = malloc(sizeof(double) * (size_t)D), *w = malloc(sizeof(double) * (size_t)D);
    double *z = malloc(sizeof(double) * (size_t)V);
    if (!h || !w || !z) {
        j->failed = 1;
        free(h), free(w), free(z);
        return;
    }
    row_f64(d, d->h, i, h);
    double m = -INFINITY, se = 0;
    for (int64_t v = 0; v < V; v++) {
        row_f64(d, d->w, v, w);
        double t = 0;
        for (int64_t k = 0; k < D; k++) t += h[k] * w[k];
        z[v] = t;
        m = fmax(m, t);
    }
    for (int64_t v = 0; v < V; v++) se += exp(z[v] - m);
    r->lse[s] = m + log(se);
    int valid = d->labels[i] != p->ignore_index;
    r->loss[s] = valid ? r->lse[s] - z[d->labels[i]] : 0;
    double *acc = r->dh + s * D;
    for (int64_t v = 0; valid && v < V; v++) {
        double dz = r->g * (exp(z[v] - r->lse[s]) - (v == d->labels[i]));
        row_f64(d, d->w, v, w);
        for (int64_t k = 0; k < D; k++) acc[k] += dz * w[k];
    }
    free(h), free(w), free(z);
}

int bench_ref_tokens(bench_ref *r, const bench_data *d, host_rng *rng, int samples)
{
    const flce_problem *p = &d->p;
    int64_t n = p->tokens, D = p->hidden;
    memset(r, 0, sizeof *r);
    r->samples = samples;
    r->tok = malloc(sizeof(int64_t) * (size_t)samples), r->vrow = malloc(sizeof(int64_t) * (size_t)samples);
    r->lse = malloc(sizeof(double) * (size_t)samples), r->loss = malloc(sizeof(double) * (size_t)samples);
    r->dh = calloc((size_t)(samples * D), sizeof(double)), r->dw = calloc((size_t)(samples * D), sizeof(double));
    if (!r->tok || !r->vrow || !r->lse || !r->loss || !r->dh || !r->dw) {
        bench_ref_free(r);
        return 0;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += d->labels[i] != p->ignore_index;
    r->g = count ? 1.0 / (double)count : 0.0;
    for (int s = 0; s < samples; s++) r->tok[s] = host_rng_below(rng, n);
    ref_tok_job j = {r, d, 0};
    host_parallel_for(samples, 0, ref_token, &j);
    if (j.failed) bench_ref_free(r);
    return !j.failed;
}

void bench_ref_vocab(bench_ref *r, const bench_data *d, host_rng *rng, const float *gpu_lse)
{
    const flce_problem *p = &d->p;
    int64_t n = p->tokens, D = p->hidden, V = p->vocab_shard;
    int S = r->samples;
    double *h = malloc(sizeof(double) * (size_t)D), *w = malloc(sizeof(double) * (size_t)(S * D));
    if (!h || !w) {
        free(h), free(w);
        return;
    }
    for (int s = 0; s < S; s++) {
        r->vrow[s] = s == 0 ? 0 : s == 1 ? V - 1 : host_rng_below(rng, V);
        row_f64(d, d->w, r->vrow[s], w + s * D);
    }
    memset(r->dw, 0, sizeof(double) * (size_t)(S * D));
    /* Tokens outer: each hidden row is converted once; every row's sum still runs over the tokens
     * in order, so the result does not depend on S. */
    for (int64_t i = 0; i < n; i++) {
        if (d->labels[i] == p->ignore_index) continue;
        row_f64(d, d->h, i, h);
        for (int s = 0; s < S; s++) {
            double t = 0;
            for (int64_t k = 0; k < D; k++) t += h[k] * w[s * D + k];
            double dz = r->g * (exp(t - (double)gpu_lse[i]) - (r->vrow[s] == d->labels[i]));
            for (int64_t k = 0; k < D; k++) r->dw[s * D + k] += dz * h[k];
        }
    }
    r->have_dw = 1;
    free(h), free(w);
}

void bench_ref_free(bench_ref *r)
{
    free(r->tok), free(r->vrow), free(r->lse), free(r->loss), free(r->dh), free(r->dw);
    memset(r, 0, sizeof *r);
}

/* Rel L2 of sampled device rows (16-bit or fp32 gradients) against the reference rows. */
static double rows_rel_l2(const bench_data *d, flce_dtype dt, const void *dev, const int64_t *rows, const double *ref,
                          int samples)
{
    int64_t D = d->p.hidden;
    size_t row_bytes = (size_t)D * (dt == FLCE_DTYPE_F32 ? 4 : 2);
    void *grow = malloc(row_bytes);
    double *got = malloc(sizeof(double) * (size_t)D), num = 0, den = 0;
    if (!grow || !got) {
        free(grow), free(got);
        return NAN;
    }
    for (int s = 0; s < samples; s++) {
        devmem_download(grow, (const char *)dev + (size_t)rows[s] * row_bytes, row_bytes);
        host_from_dtype(dt, grow, got, (size_t)D);
        for (int64_t k = 0; k < D; k++) {
            double e = got[k] - ref[s * D + k];
            num += e * e, den += ref[s * D + k] * ref[s * D + k];
        }
    }
    free(grow), free(got);
    return sqrt(num / den);
}

void bench_ref_compare(const bench_ref *r, const bench_data *d, int want_grads, bench_errors *e)
{
    const flce_problem *p = &d->p;
    int64_t n = p->tokens;
    float *lse = malloc((size_t)n * 4), *loss_rows = malloc((size_t)n * 4);
    memset(e, 0, sizeof *e);
    e->dh = e->dw = NAN;
    if (!lse || !loss_rows) {
        free(lse), free(loss_rows);
        e->mean = e->lse = e->loss_row = NAN;
        return;
    }
    devmem_download(lse, d->d_lse, (size_t)n * 4);
    devmem_download(loss_rows, d->d_loss_rows, (size_t)n * 4);
    devmem_download(&e->loss, d->d_loss, 4);
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        if (d->labels[i] != p->ignore_index) sum += loss_rows[i];
    e->mean_rows = sum * r->g;
    e->mean = fabs(e->mean_rows - e->loss) / fmax(fabs(e->mean_rows), 1e-30);
    for (int s = 0; s < r->samples; s++) {
        int64_t i = r->tok[s];
        e->lse = fmax(e->lse, fabs(lse[i] - r->lse[s]) / fabs(r->lse[s]));
        e->loss_row = fmax(e->loss_row, fabs(loss_rows[i] - r->loss[s]) / fmax(fabs(r->loss[s]), 1e-6));
    }
    /* fmax drops a NaN argument: a NaN output must still show. */
    for (int s = 0; s < r->samples; s++) {
        if (isnan(lse[r->tok[s]])) e->lse = NAN;
        if (isnan(loss_rows[r->tok[s]])) e->loss_row = NAN;
    }
    if (want_grads) {
        e->dh = rows_rel_l2(d, d->p.dtype, d->d_dh, r->tok, r->dh, r->samples);
        if (r->have_dw) e->dw = rows_rel_l2(d, d->p.dtype, d->d_dw, r->vrow, r->dw, r->samples);
    }
    free(lse), free(loss_rows);
}

void bench_ref_compare_dw_f32(const bench_ref *r, const bench_data *d, const void *dw_f32, bench_errors *e)
{
    e->dw = r->have_dw ? rows_rel_l2(d, FLCE_DTYPE_F32, dw_f32, r->vrow, r->dw, r->samples) : NAN;
}
