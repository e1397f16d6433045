/* launch_grads.h — the gradient passes of one block (launch_grads.c), for launch.c above it. */
#ifndef FLCE_LAUNCH_GRADS_H
#define FLCE_LAUNCH_GRADS_H

#include "launch_prim.h"

/* dZ of one block and the gradient GEMMs that consume it (rows_step: dH's accumulation state,
 * cols_step: dW's and db's). */
flce_status run_grads(run *r, const block *rows_step, const block *cols_step);

#endif
