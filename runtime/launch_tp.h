/* launch_tp.h — tensor and sequence parallelism's part of a run (launch_tp.c), for launch_grads.c and
 * launch.c above it. */
#ifndef FLCE_LAUNCH_TP_H
#define FLCE_LAUNCH_TP_H

#include "launch_prim.h"

/* Stream s waits for everything the caller's stream holds so far; side_join makes the caller's
 * stream wait for every stream forked to. */
flce_status fork_to(run *r, CUstream s);
flce_status side_join(run *r);
/* dH rows of rows_done summed over the ranks on r->stream, or (overlap_dh) on the side stream. */
flce_status reduce_dh(run *r, const block *rows_done);
flce_status overlap_dh(run *r, const block *rows_done);
/* The end of a call's dH under TP: summed over the ranks and rounded once (unless overlapped). */
flce_status finish_dh(run *r);
/* SP: the token-sharded inputs gathered into the workspace (`all`), and this rank's outputs back. */
flce_status sp_gather(run *r, const flce_tensors *caller, flce_tensors *all, launch_part part);
flce_status sp_scatter_outputs(run *r, const flce_tensors *caller);

#endif
