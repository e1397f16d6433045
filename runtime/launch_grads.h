/* launch_grads.h — the gradient passes of one block (launch_grads.c), for launch.c above it. */
#ifndef FLCE_LAUNCH_GRADS_H
#define FLCE_LAUNCH_GRADS_H

#include "launch_prim.h"

/* dZ of one block and the gradient GEMMs that consume it (rows_step: dH's accumulation state,
 * cols_step: dW's and db's). */
flce_status run_grads(run *r, const block *rows_step, const block *cols_step);
/* run_grads after its dZ pass: dH, dW (and db) from the dZ at r->ws + r->pl->off_dz, which the
 * caller wrote (runtime/distill.c's row kernel). */
flce_status run_grad_gemms(run *r, const block *rows_step, const block *cols_step);

#endif
