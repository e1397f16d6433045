/* tma.c — encodes the TMA tensor maps of a Hopper or Blackwell GEMM launch (see tma.h). */
#include <stdint.h>

#include "driver.h"
#include "tma.h"

_Static_assert(sizeof(struct flce_tmap) == sizeof(CUtensorMap), "flce_tmap must be a CUtensorMap");
_Static_assert(_Alignof(struct flce_tmap) >= 64, "the copy engine wants 64-byte aligned maps");

/* A stored rows × cols matrix of 16-bit elements, row pitch ld, as boxes of box_cols × box_rows
 * landing in shared memory with the 128-byte swizzle wgmma's descriptors expect (box_cols = 64
 * elements = one 128-byte swizzle row). Out-of-bounds parts of a box arrive as zeros, which is
 * what the cp.async path's zero-filled edge chunks gave. */
static flce_status encode(struct flce_tmap *map, flce_dtype dtype, unsigned long long base,
                          long long rows, long long cols, long long ld, unsigned box_cols,
                          unsigned box_rows, const char *what)
{
    if (rows < 1 || cols < 1) return FLCE_OK; /* an empty operand: the launch has no blocks */
    if (rows > INT32_MAX || cols > INT32_MAX)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "%s: %lld x %lld elements: the TMA path addresses at most 2^31-1 per dimension",
                       what, rows, cols);
    if (base % 16 || (ld * 2) % 16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "%s: address 0x%llx with a row pitch of %lld bytes: TMA needs both 16-byte aligned",
                       what, base, ld * 2);
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t stride[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {box_cols, box_rows}, elem_stride[2] = {1, 1};
    CUtensorMapDataType type =
        dtype == FLCE_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUresult r = drv.TensorMapEncodeTiled((CUtensorMap *)map, type, 2, (void *)(uintptr_t)base, dim,
                                          stride, box, elem_stride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return drv_error(r, what);
    return FLCE_OK;
}

/* Operand layouts per role, as in spec.c and templates/gemm.cu: logits reads both operands K-major, dH reads
 * B = W as [k][n], dW reads A = dZ as [k][m] and B = H as [k][n]. */
flce_status tma_prepare_gemm(const kernel_spec *s, struct flce_gemm_params *g, int num_sms, int64_t *gx,
                             int64_t *gy)
{
    /* tcgen05 (sm_100a) loads the very same boxes into the same swizzled stages and walks the same
     * persistent dH/dW grid as the Hopper TMA path: only the MMA differs (templates/gemm_tcgen05.cu). */
    if (s->role == ROLE_ROWOPS || !spec_uses_tma(&s->tile)) return FLCE_OK;
    const unsigned bk = (unsigned)s->tile.bk;
    int a_kmajor = s->role != ROLE_DW, b_kmajor = s->role == ROLE_LOGITS;
    /* logits in a cluster: each CTA loads (and multicasts) BN/2 rows of B (templates/gemm_wgmma_tma.cu,
     * produce_logits) */
    const unsigned a_box = (unsigned)s->tile.bm;
    const unsigned b_box = (unsigned)s->tile.bn / (s->role == ROLE_LOGITS && s->cluster > 1 ? 2u : 1u);
    TRY(encode(&g->tmap_a, s->dtype, g->a, g->a_rows, g->a_cols, g->lda, a_kmajor ? bk : 64, a_kmajor ? a_box : bk,
               "tensor map of the GEMM's A operand"));
    TRY(encode(&g->tmap_b, s->dtype, g->b, g->b_rows, g->b_cols, g->ldb, b_kmajor ? bk : 64, b_kmajor ? b_box : bk,
               "tensor map of the GEMM's B operand"));
    if (s->role != ROLE_LOGITS && *gx > 0 && *gy > 0 && s->cluster > 1) {
        /* clusters of 2 walk pair tiles (two row blocks × one column tile, templates/gemm_entry.cu):
         * as many clusters as pairs, at most the num_sms / 2 that run at once */
        int64_t pairs = *gx * ((*gy + 1) / 2), slots = num_sms / 2;
        *gx = 2 * (slots > 0 && pairs > slots ? slots : pairs);
        *gy = 1;
    } else if (s->role != ROLE_LOGITS && *gx > 0 && *gy > 0) { /* the logits grid is the planner's splits */
        int64_t tiles = *gx * *gy;
        *gx = num_sms > 0 && tiles > num_sms ? num_sms : tiles;
        *gy = 1;
    }
    return FLCE_OK;
}
