/* comm.c — NCCL (see comm.h). */
#include <stdio.h>

#include "comm.h"

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
#else
const char *comm_nccl_version(char *out, size_t cap)
{
    snprintf(out, cap, "built without NCCL");
    return out;
}
#endif
