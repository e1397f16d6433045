/* comm.c — NCCL (see comm.h). */
#include <stdio.h>

#include "comm.h"
#include "error.h"

#if FLCE_HAVE_NCCL
#include <nccl.h>

const char *comm_nccl_version(char *out, size_t cap)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) {
        snprintf(out, cap, "NCCL (version unknown)");
        return out;
    }
    /* Since 2.9 the code is major*10000 + minor*100 + patch. */
    snprintf(out, cap, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    return out;
}

static flce_status nccl_error(ncclResult_t r, ncclComm_t comm, const char *what)
{
    const char *last = comm ? ncclGetLastError(comm) : "";
    return err_set(FLCE_ERR_CUDA, "NCCL failed in %s: %s%s%s", what, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

flce_status comm_check(void *comm, int tp_rank, int tp_size)
{
    int count = 0, rank = 0;
    ncclResult_t r = ncclCommCount((ncclComm_t)comm, &count);
    if (r == ncclSuccess) r = ncclCommUserRank((ncclComm_t)comm, &rank);
    if (r != ncclSuccess) return nccl_error(r, (ncclComm_t)comm, "reading tensors.comm");
    if (count != tp_size || rank != tp_rank)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.comm: rank %d of %d ranks, but problem.tp_rank=%d, tp_size=%d",
                       rank, count, tp_rank, tp_size);
    return FLCE_OK;
}

flce_status comm_group_start(void)
{
    ncclResult_t r = ncclGroupStart();
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, NULL, "ncclGroupStart");
}

flce_status comm_group_end(void)
{
    ncclResult_t r = ncclGroupEnd();
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, NULL, "ncclGroupEnd");
}

flce_status comm_all_gather(void *comm, const void *send, void *recv, uint64_t bytes, void *stream,
                            const char *what)
{
    ncclResult_t r = ncclAllGather(send, recv, (size_t)bytes, ncclUint8, (ncclComm_t)comm,
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}

flce_status comm_all_reduce_f32(void *comm, float *buf, uint64_t count, void *stream, const char *what)
{
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, (ncclComm_t)comm,
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}

flce_status comm_reduce_scatter_f32(void *comm, float *buf, uint64_t count, int rank, void *stream,
                                    const char *what)
{
    /* NCCL's in-place form: the receive buffer is this rank's slice of the send buffer. */
    ncclResult_t r = ncclReduceScatter(buf, buf + (uint64_t)rank * count, (size_t)count, ncclFloat32,
                                       ncclSum, (ncclComm_t)comm, (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}
#else
const char *comm_nccl_version(char *out, size_t cap)
{
    snprintf(out, cap, "built without NCCL");
    return out;
}

static flce_status no_nccl(void)
{
    return err_set(FLCE_ERR_UNSUPPORTED, "tensors.comm: this flce was built without NCCL");
}

flce_status comm_check(void *comm, int tp_rank, int tp_size)
{
    (void)comm, (void)tp_rank, (void)tp_size;
    return no_nccl();
}
flce_status comm_group_start(void) { return no_nccl(); }
flce_status comm_group_end(void) { return no_nccl(); }
flce_status comm_all_gather(void *comm, const void *send, void *recv, uint64_t bytes, void *stream,
                            const char *what)
{
    (void)comm, (void)send, (void)recv, (void)bytes, (void)stream, (void)what;
    return no_nccl();
}
flce_status comm_all_reduce_f32(void *comm, float *buf, uint64_t count, void *stream, const char *what)
{
    (void)comm, (void)buf, (void)count, (void)stream, (void)what;
    return no_nccl();
}
flce_status comm_reduce_scatter_f32(void *comm, float *buf, uint64_t count, int rank, void *stream,
                                    const char *what)
{
    (void)comm, (void)buf, (void)count, (void)rank, (void)stream, (void)what;
    return no_nccl();
}
#endif
