/* fake_nccl.c — a stand-in libnccl for one-GPU tests of the collectives (FLCE_NCCL_LIBRARY names it):
 * the ranks of a communicator are threads of one process on one GPU, each with its own flce context
 * and stream. NCCL itself refuses two ranks on one device, so without this the tensor-parallel paths
 * could only be tested on machines of two GPUs or more.
 *
 * Each collective synchronizes the caller's stream, meets the other ranks at a barrier, moves the
 * bytes with the driver's copies on that stream (sums on the host, fp32, in rank order, so every rank
 * gets the same bits, as NCCL's do), and meets them again before it returns, so no rank reuses a
 * buffer another is still reading. Group calls are no-ops: every rank issues the same collectives in
 * the same order, so running them one by one cannot deadlock. The test makes the communicators with
 * fake_nccl_world (dlsym) from the same loaded file.
 *
 * Only what runtime/comm.c calls; NCCL's enums by value (nccl.h's ABI), the driver by dlopen. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t; /* ncclSuccess 0, ncclUnhandledCudaError 1, ncclSystemError 2, ncclInvalidArgument 4 */
typedef unsigned long long devptr;
typedef int (*memcpy_fn)(devptr, devptr, size_t, void *);
typedef int (*dtoh_fn)(void *, devptr, size_t, void *);
typedef int (*htod_fn)(devptr, const void *, size_t, void *);
typedef int (*sync_fn)(void *);

enum { MAX_RANKS = 16 };

typedef struct world {
    int n;
    pthread_barrier_t bar;
    const void *send[MAX_RANKS];
} world;

typedef struct fake_comm {
    world *w;
    int rank;
} fake_comm;

static struct {
    memcpy_fn copy;
    dtoh_fn dtoh;
    htod_fn htod;
    sync_fn sync;
    int loaded;
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    cu.copy = (memcpy_fn)dlsym(h, "cuMemcpyAsync");
    cu.dtoh = (dtoh_fn)dlsym(h, "cuMemcpyDtoHAsync_v2");
    cu.htod = (htod_fn)dlsym(h, "cuMemcpyHtoDAsync_v2");
    cu.sync = (sync_fn)dlsym(h, "cuStreamSynchronize");
    cu.loaded = cu.copy && cu.dtoh && cu.htod && cu.sync;
}

static int cu_ready(void)
{
    pthread_once(&cu_once, cu_load);
    return cu.loaded;
}

/* n communicators of one world, comms[r] for rank r; 0 on success. */
int fake_nccl_world(int n, void **comms)
{
    if (n < 1 || n > MAX_RANKS || !comms) return 4;
    world *w = calloc(1, sizeof *w);
    fake_comm *c = calloc((size_t)n, sizeof *c);
    if (!w || !c || pthread_barrier_init(&w->bar, NULL, (unsigned)n) != 0) {
        free(w), free(c);
        return 2;
    }
    w->n = n;
    for (int r = 0; r < n; r++) c[r].w = w, c[r].rank = r, comms[r] = &c[r];
    return 0;
}

ncclResult_t ncclGetVersion(int *v)
{
    *v = 22700; /* reads as "NCCL 2.27.0" in flce's logs */
    return 0;
}

const char *ncclGetErrorString(ncclResult_t r) { return r == 0 ? "no error" : "fake NCCL: a driver call failed"; }
const char *ncclGetLastError(void *comm)
{
    (void)comm;
    return "";
}

ncclResult_t ncclCommCount(const void *comm, int *count)
{
    *count = ((const fake_comm *)comm)->w->n;
    return 0;
}

ncclResult_t ncclCommUserRank(const void *comm, int *rank)
{
    *rank = ((const fake_comm *)comm)->rank;
    return 0;
}

ncclResult_t ncclGroupStart(void) { return 0; }
ncclResult_t ncclGroupEnd(void) { return 0; }

/* The first meeting: this rank's stream has produced `send`, which every rank can now see. */
static int meet(fake_comm *c, const void *send, void *stream)
{
    if (!cu_ready() || cu.sync(stream) != 0) return 1;
    c->w->send[c->rank] = send;
    pthread_barrier_wait(&c->w->bar);
    return 0;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int type, void *comm, void *stream)
{
    static const size_t size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2}; /* by ncclDataType_t */
    if (type < 0 || type > 9) return 4;
    fake_comm *c = comm;
    if (meet(c, send, stream)) return 1;
    const size_t bytes = count * size[type];
    int bad = 0;
    for (int r = 0; r < c->w->n; r++) {
        devptr dst = (devptr)(uintptr_t)recv + (devptr)r * bytes, src = (devptr)(uintptr_t)c->w->send[r];
        if (dst != src) bad |= cu.copy(dst, src, bytes, stream) != 0;
    }
    bad |= cu.sync(stream) != 0;
    pthread_barrier_wait(&c->w->bar);
    return bad ? 1 : 0;
}

static float from_half(uint16_t h, int bf16)
{
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    uint32_t u;
    if (e == 31) u = sign | 0x7f800000u | (m << 13);
    else if (e) u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) u = sign;
    else { /* subnormal: normalize */
        int s = 0;
        uint32_t mm = m;
        while (!(mm & 1024)) mm <<= 1, s++;
        u = sign | ((uint32_t)(113 - s) << 23) | ((mm & 1023) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_half(float f, int bf16)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (bf16) {
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;
    if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to inf */
    if (a < 0x33000001u) return sign;           /* below half the smallest subnormal */
    int e = (int)(a >> 23) - 127;
    uint32_t m = (a & 0x7fffff) | 0x800000;
    int shift = e < -14 ? 13 + (-14 - e) : 13;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    if (e < -14) return sign | (uint16_t)q;
    return sign | (uint16_t)((((uint32_t)(e + 15)) << 10) + (q - 1024));
}

/* The sum over ranks of count elements starting `skip` elements into every rank's send buffer, into
 * this rank's recv; fp32, bf16 or fp16 (summed in fp32, rounded once). */
static ncclResult_t sum_into(fake_comm *c, const void *send, void *recv, size_t skip, size_t count, int type,
                             int op, void *stream)
{
    if (op != 0 || (type != 7 && type != 9 && type != 6)) return 4; /* ncclSum of ncclFloat32, Bfloat16, Float16 */
    if (meet(c, send, stream)) return 1;
    const size_t es = type == 7 ? 4 : 2;
    float *acc = calloc(count ? count : 1, 4);
    void *tmp = malloc((count ? count : 1) * es);
    int bad = !acc || !tmp;
    for (int r = 0; r < c->w->n && !bad; r++) {
        bad |= cu.dtoh(tmp, (devptr)(uintptr_t)c->w->send[r] + skip * es, count * es, stream) != 0;
        bad |= cu.sync(stream) != 0;
        for (size_t i = 0; i < count && !bad; i++)
            acc[i] += es == 4 ? ((float *)tmp)[i] : from_half(((uint16_t *)tmp)[i], type == 9);
    }
    pthread_barrier_wait(&c->w->bar); /* every rank has read every send buffer: recv may be written */
    if (!bad) {
        if (es == 4) memcpy(tmp, acc, count * 4);
        else
            for (size_t i = 0; i < count; i++) ((uint16_t *)tmp)[i] = to_half(acc[i], type == 9);
        bad |= cu.htod((devptr)(uintptr_t)recv, tmp, count * es, stream) != 0;
        bad |= cu.sync(stream) != 0;
    }
    pthread_barrier_wait(&c->w->bar);
    free(acc), free(tmp);
    return bad ? 1 : 0;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, void *comm, void *stream)
{
    return sum_into(comm, send, recv, 0, count, type, op, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, void *comm,
                               void *stream)
{
    fake_comm *c = comm;
    return sum_into(c, send, recv, (size_t)c->rank * count, count, type, op, stream);
}
