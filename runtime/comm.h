/*
 * comm.h — the NCCL side of flce. Today it reports which NCCL the library was built with (shown by
 * `flce info`); the vocab-parallel collectives of DESIGN.md §2 will live here.
 */
#ifndef FLCE_COMM_H
#define FLCE_COMM_H

#include <stddef.h>

/* "NCCL 2.27.7", or a sentence saying the build has none. */
const char *comm_nccl_version(char *out, size_t cap);

#endif
