/*
 * bench_data.h — the data and the sampled fp64 check shared by `flce demo` and `flce bench`:
 * random inputs of a chosen logit spread, their upload, and a reference of sampled rows that is
 * built once per data set and compared against any number of GPU runs (one per strategy in bench).
 *
 * Why sampled rows: the full fp64 reference of 8192 × 4096 × 128256 is 4·10¹² multiply-adds on the
 * CPU; a few tokens (lse, loss, dH rows: V·D each) and a few vocab rows (dW rows: N·D each, from
 * the GPU's lse of every token once the sampled lse matched) cost seconds and still see every
 * kernel role.
 */
#ifndef FLCE_BENCH_DATA_H
#define FLCE_BENCH_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"
#include "host.h"

typedef struct bench_data {
    flce_problem p;
    size_t es;
    void *h, *w;          /* host copies in the input dtype (owned; bench_data_free) */
    int32_t *labels;
    /* Device buffers (owned): inputs, and the outputs a training call writes. d_loss_rows holds
     * per-token losses (from a forward with reduction none in demo, loss_per_token in bench). */
    void *d_h, *d_w, *d_labels, *d_loss, *d_lse, *d_dh, *d_dw, *d_loss_rows;
} bench_data;

/* Host inputs for d->p: hidden unit-normal, weights of sd logit_std/sqrt(D) so the logits have a
 * standard deviation of about logit_std, labels uniform with ~5% ignore_index. 0 when out of memory. */
int bench_data_fill(bench_data *d, uint64_t seed, double logit_std);
/* Allocates the device inputs and outputs, uploads the inputs, poisons the outputs. */
flce_status bench_data_upload(bench_data *d);
/* Poisons the outputs (NaN), so a run that skips one shows. */
flce_status bench_data_poison_outputs(const bench_data *d);
/* Frees host and device memory (NULL members are fine). */
void bench_data_free(bench_data *d);
/* Bytes of one input set (H, W, labels) and of the outputs on the device. */
uint64_t bench_data_input_bytes(const flce_problem *p);
uint64_t bench_data_output_bytes(const flce_problem *p);

/* The fp64 reference of sampled rows. */
typedef struct bench_ref {
    int samples;
    int64_t *tok, *vrow;      /* sampled token indices, sampled vocab rows */
    double *lse, *loss;       /* per sampled token */
    double *dh;               /* samples × D */
    double *dw;               /* samples × D; valid once bench_ref_vocab ran */
    int have_dw;
    double g;                 /* 1 / valid tokens: the mean's scale */
} bench_ref;

/* Token side: draws `samples` tokens from rng and computes their lse, loss and dH rows. */
int bench_ref_tokens(bench_ref *r, const bench_data *d, host_rng *rng, int samples);
/* Vocab side: draws `samples` vocab rows (the first and last always) and computes their dW rows
 * from the fp64 logits of every token and `gpu_lse` (N floats). */
void bench_ref_vocab(bench_ref *r, const bench_data *d, host_rng *rng, const float *gpu_lse);
void bench_ref_free(bench_ref *r);

typedef struct bench_errors {
    float loss;             /* the GPU's mean loss */
    double mean_rows;       /* the mean of the GPU's per-token losses */
    double mean;            /* rel err of the two */
    double lse, loss_row;   /* max rel err over sampled tokens */
    double dh, dw;          /* rel L2 over sampled rows; NaN when not asked for */
} bench_errors;

/* Compares the device outputs of d against r. want_grads 0: loss and lse only (forward). */
void bench_ref_compare(const bench_ref *r, const bench_data *d, int want_grads, bench_errors *e);
/* e->dw from an fp32 dW (V × D) on the device instead of d->d_dw: accumulate_grad_weight's buffer,
 * zeroed before the call. */
void bench_ref_compare_dw_f32(const bench_ref *r, const bench_data *d, const void *dw_f32, bench_errors *e);

#endif
