// gemm.cu — the tiled GEMMs of flce, specialized by the generator for one role:
//
//   LOGITS  Z = H·Wᵀ over one token chunk. The epilogue folds each row's logits into a running
//           (max m, Σ exp(z − m)) over this CTA's vocab split, records z of the row's label, and
//           stores Z in fp32 when the strategy needs it:  part_m, part_s [row][split], target[row].
//           FLCE_FUSED_DZ (the recompute pass, lse already known): writes dZ instead, nothing else.
//   DH      dH = dZ·W   (A = dZ stored K-major, B = W stored [k = vocab][n = hidden])
//   DW      dW = dZᵀ·H  (A = dZ stored [k = token][m = vocab], B = H stored [k = token][n = hidden])
//           DH/DW store out = acc (+ addend), in fp32 or the input dtype.
//
// C[m × n] = A[m × k] · B[n × k]ᵀ with BM × BN tiles, warps arranged WARPS_M × WARPS_N, each
// owning a (BM/WARPS_M) × (BN/WARPS_N) block of 16×8 mma tiles. Every main loop leaves its
// accumulators in that mma.sync fragment layout (acc[MI][NI][4]), so one set of epilogues serves
// all of them.
//
// This file holds what every path shares: the defaults for compiling alone, the thread counts,
// launch bounds and warp tile. The rest of the GEMM is in the pieces listed at its end: CMakeLists.txt
// embeds this file and them, in that order, as one text (tmpl_gemm_cu), which the generator pastes
// after its preamble, params.h and common.cuh.
#ifndef FLCE_GENERATED
// Defaults so this file compiles alone: nvcc -arch=sm_80 -c gemm.cu -I. (the generator writes its own)
#define FLCE_DTYPE 2
#define FLCE_LABEL_BITS 32
#define FLCE_REDUCTION 0
#define ROLE_IS_LOGITS 1
#define ROLE_IS_DH 0
#define ROLE_IS_DW 0
#define OPT_BIAS 0
#define OPT_WEIGHTS 0
#define OPT_ZSUM 0
#define OPT_ENTROPY 0
#define OPT_ARGMAX 0
#define FLCE_WGMMA 0 // 1: the Hopper main loop (needs the generator's wgmma_tile for BN)
#define FLCE_TMA 0   // 1 (with FLCE_WGMMA): TMA loads, mbarriers, a producer warpgroup
#define FLCE_FUSED_DZ 0 // 1 (logits): the epilogue writes dZ instead of statistics or Z
constexpr float SOFTCAP = 0.f, INV_TEMP = 1.f, SMOOTHING = 0.f, ZLOSS = 0.f;
constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, WARPS_M = 2, WARPS_N = 4;
constexpr bool A_KMAJOR = true, B_KMAJOR = true;
constexpr long long VOCAB = 32768; // rows of this shard
#include "params.h"
#include "common.cuh"
#endif

#ifndef FLCE_TMA
#define FLCE_TMA 0
#endif
#ifndef FLCE_FUSED_DZ
#define FLCE_FUSED_DZ 0
#endif
#ifndef FLCE_COMPACT
#define FLCE_COMPACT 0 // 1 (logits): Z is stored as fp16 p̃ plus per-(row, warp tile) maxima (common.cuh)
#endif

constexpr int THREADS = WARPS_M * WARPS_N * 32;        // the threads that compute and run the epilogue
constexpr int PRODUCER_THREADS = FLCE_TMA ? 128 : 0;   // TMA: one warpgroup in front that only loads
constexpr int CTA_THREADS = THREADS + PRODUCER_THREADS;
#if FLCE_TMA
// setmaxnreg takes effect only under a register cap at entry: 1 CTA of 384 threads (168 registers).
#define FLCE_KERNEL_BOUNDS __launch_bounds__(CTA_THREADS, 1)
#define FLCE_PARAM const __grid_constant__ flce_gemm_params // the tensor maps are read in place
#else
#define FLCE_KERNEL_BOUNDS __launch_bounds__(THREADS)
#define FLCE_PARAM const flce_gemm_params
#endif
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; // warp tile
constexpr int MI = WTM / 16, NI = WTN / 8;             // mma tiles per warp

#ifndef FLCE_GENERATED
// Compiled alone, the pieces follow here, in the order CMakeLists.txt lists them (keep the two alike).
#include "gemm_wgmma.cu"          // Hopper: 128-byte-swizzled shared tiles, one stage of wgmma
#include "gemm_wgmma_tma.cu"      // Hopper main loop: TMA + mbarrier pipeline, producer warpgroup
#if FLCE_TCGEN05
#include "gemm_tcgen05.cu"        // Blackwell main loop: tcgen05.mma into tensor memory
#endif
#include "gemm_wgmma_cp_async.cu" // Hopper main loop fed by cp.async
#include "gemm_mma_sync.cu"       // the portable main loop: mma.sync (or FFMA for fp32), cp.async
#include "gemm_logits.cu"         // LOGITS epilogues: statistics, compact p̃, fused dZ
#include "gemm_grad.cu"           // DH/DW epilogue
#include "gemm_entry.cu"          // the kernels: flce_logits, flce_dh / flce_dw
#endif
