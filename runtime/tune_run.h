/*
 * tune_run.h — FLCE_TUNE=1 (tune_run.c): api.c lets the library tune a problem class on its first
 * call, outside graph capture. Internal.
 */
#ifndef FLCE_TUNE_RUN_H
#define FLCE_TUNE_RUN_H

#include "tune.h"

/* With FLCE_TUNE=1 and a class not in the tune table: times the logits candidates with forward
 * passes over t's inputs on `stream` (synchronizing it), stores the winner. Always FLCE_OK: a
 * failure is logged and the call proceeds with the default tiles. Needs ctx not locked. */
flce_status tune_first_use(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                           void *stream);

#endif
