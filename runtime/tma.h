/*
 * tma.h — TMA tensor maps for the Hopper and Blackwell GEMM paths (spec tile.loop MAINLOOP_WGMMA_TMA or
 * MAINLOOP_TCGEN05; templates/gemm_wgmma_tma.cu, gemm_tcgen05.cu). A map holds the operand's address,
 * so launch.c encodes both maps of every such GEMM launch into its params (cuTensorMapEncodeTiled:
 * host work only, no device call, capturable in a graph).
 */
#ifndef FLCE_TMA_H
#define FLCE_TMA_H

#include "params.h"
#include "spec.h"

/* For a spec whose loop spec_uses_tma (wgmma or tcgen05), fills g->tmap_a and g->tmap_b from g's operand fields (a/b, *_rows,
 * *_cols, ld*) with the boxes gemm_wgmma_tma.cu's producer loads (tcgen05 shares it): K-major operands one box of 64 k × the tile's rows,
 * MN-major ones boxes of 64 × 64; and turns the (column tiles, row tiles) grid *gx × *gy of a dH/dW
 * launch into the persistent grid the kernel walks (min(tiles, num_sms) × 1; for spec cluster = 2
 * 2 × min(pair tiles, num_sms / 2) × 1, num_sms then being the CTA slots the launch's clusters
 * have: twice the clusters that fit at once). Does nothing for other specs. FLCE_ERR_INVALID_ARGUMENT when an operand is not 16-byte aligned,
 * FLCE_ERR_UNSUPPORTED past TMA's 32-bit coordinates. */
flce_status tma_prepare_gemm(const kernel_spec *s, struct flce_gemm_params *g, int num_sms, int64_t *gx,
                             int64_t *gy);

#endif
