/* comm.c — NCCL (see comm.h). */
#include <stdio.h>

#include "comm.h"
#include "config.h"
#include "error.h"

#if FLCE_HAVE_NCCL
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "dynload.h"

/* NCCL is opened on the first collective (dynload.h): a machine without it loads libflce and runs
 * everything but tensor parallelism with its own communicator. Looked for on the library path, then
 * in the pip wheel (nvidia-nccl-cu13, nvidia-nccl-cu12) of the Python environments dynload.h lists,
 * then in the build's toolkit; FLCE_NCCL_LIBRARY names the file. */
static struct {
    ncclResult_t (*GetVersion)(int *);
    const char *(*GetLastError)(ncclComm_t);
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*CommCount)(const ncclComm_t, int *);
    ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                  cudaStream_t);
} nc;
static int nc_loaded;
static char nc_why[3072];
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void nc_load(void)
{
    static const char *const libs[] = {"libnccl.so.2", "libnccl.so", NULL};
    static const char *const syms[] = {"ncclGetVersion", "ncclGetLastError", "ncclGetErrorString",
                                       "ncclCommCount", "ncclCommUserRank", "ncclGroupStart",
                                       "ncclGroupEnd", "ncclAllGather", "ncclAllReduce", "ncclReduceScatter"};
    enum { N = sizeof syms / sizeof syms[0] };
    _Static_assert(sizeof nc == N * sizeof(void *), "one slot per symbol");
    static const char *const wheels[] = {"nvidia/nccl/lib/libnccl.so.2", NULL}; /* nvidia-nccl-cu13, -cu12 */
    char tried[2560];
    nc_loaded = dyn_load_table(libs, wheels, config_env(CONFIG_NCCL_LIBRARY), syms, N, &nc, tried, sizeof tried);
    if (!nc_loaded)
        snprintf(nc_why, sizeof nc_why,
                 "NCCL could not be loaded: %s. Install NCCL 2: pip install nvidia-nccl-cu13 (CUDA 13) or "
                 "nvidia-nccl-cu12 (CUDA 12) in a Python environment searched above, or libnccl.so.2 on the "
                 "library path (e.g. apt install libnccl2); or set FLCE_NCCL_LIBRARY to the file",
                 tried);
}

static flce_status nc_require(void)
{
    pthread_once(&nc_once, nc_load);
    if (nc_loaded) return FLCE_OK;
    return err_set(FLCE_ERR_UNSUPPORTED, "tensors.comm: %s", nc_why);
}

const char *comm_nccl_version(char *out, size_t cap)
{
    int v = 0;
    pthread_once(&nc_once, nc_load);
    if (!nc_loaded) {
        snprintf(out, cap, "%s", nc_why);
        return out;
    }
    if (nc.GetVersion(&v) != ncclSuccess) {
        snprintf(out, cap, "NCCL (version unknown)");
        return out;
    }
    /* Since 2.9 the code is major*10000 + minor*100 + patch. */
    const char *file = dyn_file_of(&nc);
    snprintf(out, cap, "NCCL %d.%d.%d%s%s%s", v / 10000, v / 100 % 100, v % 100, file ? " (" : "", file ? file : "",
             file ? ")" : "");
    return out;
}

static flce_status nccl_error(ncclResult_t r, ncclComm_t comm, const char *what)
{
    const char *last = comm ? nc.GetLastError(comm) : "";
    return err_set(FLCE_ERR_CUDA, "NCCL failed in %s: %s%s%s", what, nc.GetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

flce_status comm_check(void *comm, int tp_rank, int tp_size)
{
    int count = 0, rank = 0;
    TRY(nc_require());
    ncclResult_t r = nc.CommCount((ncclComm_t)comm, &count);
    if (r == ncclSuccess) r = nc.CommUserRank((ncclComm_t)comm, &rank);
    if (r != ncclSuccess) return nccl_error(r, (ncclComm_t)comm, "reading tensors.comm");
    if (count != tp_size || rank != tp_rank)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.comm: rank %d of %d ranks, but problem.tp_rank=%d, tp_size=%d",
                       rank, count, tp_rank, tp_size);
    return FLCE_OK;
}

flce_status comm_group_start(void)
{
    TRY(nc_require());
    ncclResult_t r = nc.GroupStart();
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, NULL, "ncclGroupStart");
}

flce_status comm_group_end(void)
{
    TRY(nc_require());
    ncclResult_t r = nc.GroupEnd();
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, NULL, "ncclGroupEnd");
}

flce_status comm_all_gather(void *comm, const void *send, void *recv, uint64_t bytes, void *stream,
                            const char *what)
{
    TRY(nc_require());
    ncclResult_t r = nc.AllGather(send, recv, (size_t)bytes, ncclUint8, (ncclComm_t)comm,
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}

flce_status comm_all_reduce_f32(void *comm, float *buf, uint64_t count, void *stream, const char *what)
{
    TRY(nc_require());
    ncclResult_t r = nc.AllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, (ncclComm_t)comm,
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}

flce_status comm_all_reduce_16(void *comm, void *buf, uint64_t count, int bf16, void *stream, const char *what)
{
    TRY(nc_require());
    ncclResult_t r = nc.AllReduce(buf, buf, (size_t)count, bf16 ? ncclBfloat16 : ncclFloat16, ncclSum,
                                   (ncclComm_t)comm, (cudaStream_t)stream);
    return r == ncclSuccess ? FLCE_OK : nccl_error(r, (ncclComm_t)comm, what);
}

flce_status comm_reduce_scatter_f32(void *comm, float *buf, uint64_t count, int rank, void *stream,
                                    const char *what)
{
    /* NCCL's in-place form: the receive buffer is this rank's slice of the send buffer. */
    TRY(nc_require());
    ncclResult_t r = nc.ReduceScatter(buf, buf + (uint64_t)rank * count, (size_t)count, ncclFloat32,
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
flce_status comm_all_reduce_16(void *comm, void *buf, uint64_t count, int bf16, void *stream, const char *what)
{
    (void)comm, (void)buf, (void)count, (void)bf16, (void)stream, (void)what;
    return no_nccl();
}
flce_status comm_reduce_scatter_f32(void *comm, float *buf, uint64_t count, int rank, void *stream,
                                    const char *what)
{
    (void)comm, (void)buf, (void)count, (void)rank, (void)stream, (void)what;
    return no_nccl();
}
#endif
