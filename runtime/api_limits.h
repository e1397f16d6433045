/* api_limits.h — the largest problem sizes the public calls accept (the CE call in api.c, the
 * distillation call in distill_api.c and the top-k call in topk_api.c): bounds that keep every
 * workspace size and pointer offset far from 64-bit overflow. One place, so the calls cannot drift
 * apart. */
#ifndef FLCE_API_LIMITS_H
#define FLCE_API_LIMITS_H

#include <stdint.h>

#define FLCE_MAX_TOKENS INT32_MAX   /* tokens of one call */
#define FLCE_MAX_HIDDEN (1 << 20)   /* hidden size D */
#define FLCE_MAX_VOCAB 8000000      /* vocab (shard) size V */
#define FLCE_MAX_TP 4096            /* tensor-parallel ranks (the all-gathers' buffers are tp_size blocks) */

#endif
