/*
 * comm.h — the NCCL side of flce (docs/DESIGN.md §2): the few collectives of vocab-parallel loss, issued on
 * the caller's communicator and stream, with NCCL's own words in the message when one fails. A
 * build without NCCL answers FLCE_ERR_UNSUPPORTED.
 */
#ifndef FLCE_COMM_H
#define FLCE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"

/* "NCCL 2.27.7", or a sentence saying the build has none. */
const char *comm_nccl_version(char *out, size_t cap);

/* Checks that `comm` has tp_size ranks and that this caller is tp_rank in it (host only). */
flce_status comm_check(void *comm, int tp_rank, int tp_size);

/* Brackets several collectives so NCCL launches them together. */
flce_status comm_group_start(void);
flce_status comm_group_end(void);

/* recv[r·bytes ...] = rank r's send[0 .. bytes), for every rank r. */
flce_status comm_all_gather(void *comm, const void *send, void *recv, uint64_t bytes, void *stream,
                            const char *what);
/* In place: buf[0 .. count) = Σ over ranks, fp32. */
flce_status comm_all_reduce_f32(void *comm, float *buf, uint64_t count, void *stream, const char *what);
/* In place: buf[0 .. count) = Σ over ranks, in bf16 (bf16 = 1) or fp16 (NCCL adds in fp32 and
 * rounds each partial sum back; every rank ends with the same bits). */
flce_status comm_all_reduce_16(void *comm, void *buf, uint64_t count, int bf16, void *stream, const char *what);
/* In place: this rank's buf[rank·count .. +count) = Σ over ranks of that slice, fp32. */
flce_status comm_reduce_scatter_f32(void *comm, float *buf, uint64_t count, int rank, void *stream,
                                    const char *what);

#endif
