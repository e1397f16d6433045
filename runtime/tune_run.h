/*
 * tune_run.h — the tuner, one implementation for its two fronts (issue 18 item 4): `flce tune`
 * (tools/cmd_tune.c: random data of the class, loss-and-grad calls, every GEMM role) and
 * FLCE_TUNE=1 (tune_first_use below: the caller's own inputs on its first call, forward calls,
 * the logits tile). Both take their candidates from tune_cands_make, time and check them with
 * tune_search, and write the winner with tune_store_winner. The timed calls go through
 * launch_call, the library's internal launch path, never through the public flce_* entry points.
 * Internal.
 */
#ifndef FLCE_TUNE_RUN_H
#define FLCE_TUNE_RUN_H

#include "context.h"
#include "tune.h"

#define TUNE_MAX_CAND 64      /* candidates per role at most (`flce tune --max-candidates`) */
#define TUNE_FIRST_USE_CAND 16 /* FLCE_TUNE=1's cap: it tunes inside a training job's first call */
#define TUNE_FIRST_USE_RUNS 3  /* FLCE_TUNE=1's timed calls per candidate */

/* The candidates of a problem class: per role (logits, dH, dW), the built-in tile first. */
typedef struct tune_cands {
    spec_tile tile[TUNE_ROLES][TUNE_MAX_CAND];
    int n[TUNE_ROLES];
    kernel_spec base[TUNE_ROLES]; /* the loss-and-grad plan's specs (options included) */
    int fused_dz;                 /* that plan's recompute pass uses logits_dz with the logits tile */
    kernel_spec logits_dz;
} tune_cands;

/* The candidate lists of p's class on sm, at most cap (≤ TUNE_MAX_CAND) per role: tune_candidates
 * of each role of the loss-and-grad plan (made offline: the built-in tiles, no tune table).
 * Only the class decides (dtype, hidden, vocab, arch): the problem's options and token count
 * change the base specs, not the lists. */
flce_status tune_cands_make(const flce_problem *p, int sm, int cap, tune_cands *c);

/* The lists FLCE_TUNE=1 works from for p on sm (its cap); it times c->tile[0] only. */
flce_status tune_first_use_cands(const flce_problem *p, int sm, tune_cands *c);

/* Relative L2 tolerance of the 16-bit gradients between tilings (the fp32 outputs: 1e-4). */
double tune_grad_tolerance(flce_dtype t);

/* One candidate's outcome, for the front's progress display. ms > 0: timed; else `why` says how it
 * failed ("failed: <message>") or disagreed ("rejected, its results disagree: <errors>"), or
 * that the front's skip hook refused it ("skipped: <reason>"). */
typedef void (*tune_report_fn)(void *arg, int role, const spec_tile *tile, double ms, const char *why);
/* A front's veto before a candidate runs: nonzero and a reason in why to skip it. */
typedef int (*tune_skip_fn)(void *arg, const spec_tile tiles[TUNE_ROLES], char *why, size_t cap);

/* A tuning session on the device: what is timed and where its outputs go. */
typedef struct tune_bench {
    flce_context *ctx;
    flce_problem p;        /* the problem of the timed calls */
    flce_op op;            /* FLCE_OP_FORWARD or FLCE_OP_LOSS_AND_GRAD */
    flce_tensors t;        /* device inputs and outputs: lse required; loss, grad_hidden and
                            * grad_weight checked when given (loss only for a reduced problem) */
    CUstream stream;
    int runs;              /* timed calls per candidate (1 to 32); the median is its time */
    int roles;             /* roles searched: 1 (logits) or TUNE_ROLES */
    tune_report_fn report; /* may be NULL */
    tune_skip_fn skip;     /* may be NULL */
    void *arg;             /* for report and skip */
} tune_bench;

/* Coordinate descent over the first b->roles roles: each role's candidates with the other roles at
 * their best so far (the sum of the counts, not the product). Every candidate is first run once
 * and its outputs checked against the first candidate's (the built-in tiles) — lse and the reduced
 * loss to 1e-4, dH and dW to tune_grad_tolerance — and only then timed. best[] gets the winner,
 * *best_ms its time, *builtin_ms the built-in tiles' time. FLCE_ERR_INTERNAL with a message when
 * the built-in tiles themselves fail (nothing to compare with) or no candidate could be timed;
 * FLCE_ERR_OUT_OF_MEMORY, or a driver error naming the call, for the session's own needs. */
flce_status tune_search(const tune_bench *b, const tune_cands *c, spec_tile best[TUNE_ROLES], double *best_ms,
                        double *builtin_ms);

/* Merges the winner of p's class (tokens = p->tokens) on (device, sm) into the table of the cache
 * directory, then drops the in-memory copy so the next plan reads it. *e gets the stored entry and
 * dir (cap ≥ CACHE_PATH_MAX) the directory. */
flce_status tune_store_winner(const flce_problem *p, const char *device, int sm, const spec_tile best[TUNE_ROLES],
                              double ms, tune_entry *e, char *dir, size_t cap);

/* With FLCE_TUNE=1 and a class not in the tune table: times the logits candidates with forward
 * passes over t's inputs on `stream` (synchronizing it), stores the winner. Always FLCE_OK: a
 * failure is logged and the call proceeds with the default tiles. Needs ctx not locked. */
flce_status tune_first_use(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                           void *stream);

#endif
