// gemm_tcgen05.cu — the Blackwell main loop (sm_100a, FLCE_TCGEN05): tcgen05.mma into tensor
// memory, fed by the TMA pipeline and producer of gemm_wgmma_tma.cu; its barrier setup (pipe_init),
// the MMA warp (mma_tiles) and the consumers' mainloop. Pasted after gemm_wgmma_tma.cu, for
// tcgen05 specs only.
// ---- Blackwell: tcgen05.mma into tensor memory (sm_100a) ------------------------------------
// Same TMA stages, swizzled layouts and producer thread as gemm_wgmma_tma.cu; what changes is who
// multiplies. Warp 1 of the producer warpgroup allocates TMEM_COLS columns of tensor memory (two
// BN-column fp32 accumulators: D row i lives in TMEM lane i, column j in column j of the buffer)
// and one of its threads issues tcgen05.mma for the whole 128 × BN tile, 4 per stage (K = 16 each).
// Its tcgen05.commit returns a stage to the producer (empty[s], 1 arrival) once those MMAs have
// read it, and reports a finished accumulator on tmem_full[b]. The consumers copy the accumulator
// into the acc[0][j][e] fragment of the wgmma path with tcgen05.ld.16x256b (whose register r of
// lane l holds row l/4 + 8·(r/2 % 2), column 2·(l%4) + r%2 + 8·(r/4): the mma.sync C layout),
// release the buffer on tmem_empty[b] (all 256 consumer threads) and run the shared epilogues while
// warp 1 already accumulates the next tile into the other buffer. tcgen05.ld lets warp w reach
// only TMEM lanes 32·(w % 4) … +31, so consumer warp w (CTA warp w + 4) owns rows
// 16·tc_row_block(w) … +15.
static_assert(TMEM_COLS >= 2 * BN && TMEM_COLS <= 512, "two accumulators in tensor memory");
static_assert(BN % 64 == 0, "the epilogue loads 64 accumulator columns at a time");

__device__ __forceinline__ int tc_row_block(int warp) { return 2 * (warp % 4) + warp / 4; }
__device__ __forceinline__ unsigned tmem_full_bar(unsigned char *smem, int b) { return full_bar(smem, 2 * STAGES + b); }
__device__ __forceinline__ unsigned tmem_empty_bar(unsigned char *smem, int b) { return full_bar(smem, 2 * STAGES + 2 + b); }
// tcgen05.alloc writes the tensor-memory address (lane 0, first column) here.
__device__ __forceinline__ unsigned *tmem_slot(unsigned char *smem) { return (unsigned *)(smem + PIPE_BYTES + 8 * (2 * STAGES + 4)); }

__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }

// Shared memory descriptor of sm_100 (PTX ISA, "tcgen05 shared memory descriptor"): start, LBO and
// SBO >> 4 as on Hopper, plus the fixed version 0b001 at bits 46-48; base offset 0 (stages sit on
// 1024-byte boundaries), swizzle mode 2 = 128-byte at bits 61-63.
__device__ __forceinline__ unsigned long long umma_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 46) | (2ull << 61);
}

// Instruction descriptor of .kind::f16 (PTX ISA, "Instruction descriptor"): D f32 (bits 4-5 = 1),
// A and B f16 = 0 / bf16 = 1 (bits 7-9, 10-12), transpose = MN-major A (bit 15) and B (bit 16) as
// wgmma's imm-trans, N >> 3 (bits 17-22), M >> 4 (bits 24-28); dense, no negation, no shift.
constexpr unsigned AB_TYPE = FLCE_DTYPE == DTYPE_BF16 ? 1u : 0u;
constexpr unsigned IDESC = (1u << 4) | (AB_TYPE << 7) | (AB_TYPE << 10) | ((A_KMAJOR ? 0u : 1u) << 15) |
                           ((B_KMAJOR ? 0u : 1u) << 16) | ((unsigned)(BN >> 3) << 17) | ((unsigned)(BM >> 4) << 24);

// D[tmem] (+)= A[a] · B[b] for 128 × BN × 16, issued by one thread; accumulate = 0 overwrites D.
__device__ __forceinline__ void tc_mma(unsigned d, unsigned long long a, unsigned long long b, unsigned accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n"
                 ::"r"(d), "l"(a), "l"(b), "r"(IDESC), "r"(accumulate)
                 : "memory");
}
// One arrival on `bar` once every tcgen05.mma this thread issued so far has completed.
__device__ __forceinline__ void tc_commit(unsigned bar)
{
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Called by every thread before the role split: barriers (thread 0) and tensor memory (warp 1).
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), 1);
        for (int b = 0; b < 2; b++) mbar_init(tmem_full_bar(smem, b), 1), mbar_init(tmem_empty_bar(smem, b), THREADS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine
    }
    if (threadIdx.x / 32 == 1) { // warp-wide; one CTA per SM (launch bounds, shared memory), so no wait
        asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                     ::"r"(smem_addr(tmem_slot(smem))), "n"(TMEM_COLS) : "memory");
        asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
    }
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
}

// Warp 1 (all 32 threads; lane 0 issues): the MMAs of n_tiles output tiles in the producer's order,
// accumulator buffer t % 2 for the t-th, then the tensor memory goes back once the consumers have
// read the last accumulator (they release the buffers in order, so its release implies the rest).
// Not inlined: inside the kernel ptxas spilled 8 bytes of this loop (NVRTC 13.0); alone, none.
__device__ __noinline__ void mma_tiles(const flce_gemm_params &p, unsigned char *smem, long long n_tiles)
{
    const unsigned tmem = *(volatile unsigned *)tmem_slot(smem);
    const int ktiles = (int)((p.k + BK - 1) / BK);
    constexpr unsigned A_LBO = A_KMAJOR ? 16 : BK * 128, B_LBO = B_KMAJOR ? 16 : BK * 128;
    if (threadIdx.x % 32 == 0) {
        int it = 0;
        for (long long t = 0; t < n_tiles; t++) {
            const int buf = (int)(t & 1);
            mbar_wait(tmem_empty_bar(smem, buf), (unsigned)((t >> 1) & 1) ^ 1); // consumers read it
            tc_fence_after();
            const unsigned d = tmem + (unsigned)(buf * BN); // column offset in the low 16 bits
            for (int kt = 0; kt < ktiles; kt++, it++) {
                const int s = it % STAGES;
                mbar_wait(full_bar(smem, s), (it / STAGES) & 1);
                tc_fence_after();
                const unsigned a_base = smem_addr(smem + s * STAGE_BYTES), b_base = a_base + A_BYTES;
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    // K-major: 32 bytes further inside the swizzled row; MN-major: 16 k rows further
                    unsigned long long da = umma_desc(a_base + (A_KMAJOR ? kk * 32 : kk * 2048), A_LBO, 1024);
                    unsigned long long db = umma_desc(b_base + (B_KMAJOR ? kk * 32 : kk * 2048), B_LBO, 1024);
                    tc_mma(d, da, db, (kt | kk) != 0);
                }
                tc_commit(empty_bar(smem, s)); // the stage goes back once these MMAs have read it
            }
            if (ktiles > 0) tc_commit(tmem_full_bar(smem, buf));
            else mbar_arrive(tmem_full_bar(smem, buf)); // no MMA: the consumers write zeros
        }
    }
    __syncwarp();
    if (n_tiles > 0) mbar_wait(tmem_empty_bar(smem, (int)((n_tiles - 1) & 1)), (unsigned)(((n_tiles - 1) >> 1) & 1));
    tc_fence_after();
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(tmem), "n"(TMEM_COLS) : "memory");
}

// 64 accumulator columns (8 fragments j0 … j0+7) of this warp's 16 rows from tensor memory. The
// wait sits in the same asm statement, so no instruction can read a register before it has landed.
__device__ __forceinline__ void tmem_ld64(float (&d)[NI][4], int j0, unsigned taddr)
{
    asm volatile("tcgen05.ld.sync.aligned.16x256b.x8.b32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
                 "tcgen05.wait::ld.sync.aligned;\n"
                 : "=f"(d[j0][0]), "=f"(d[j0][1]), "=f"(d[j0][2]), "=f"(d[j0][3]),
                   "=f"(d[j0 + 1][0]), "=f"(d[j0 + 1][1]), "=f"(d[j0 + 1][2]), "=f"(d[j0 + 1][3]),
                   "=f"(d[j0 + 2][0]), "=f"(d[j0 + 2][1]), "=f"(d[j0 + 2][2]), "=f"(d[j0 + 2][3]),
                   "=f"(d[j0 + 3][0]), "=f"(d[j0 + 3][1]), "=f"(d[j0 + 3][2]), "=f"(d[j0 + 3][3]),
                   "=f"(d[j0 + 4][0]), "=f"(d[j0 + 4][1]), "=f"(d[j0 + 4][2]), "=f"(d[j0 + 4][3]),
                   "=f"(d[j0 + 5][0]), "=f"(d[j0 + 5][1]), "=f"(d[j0 + 5][2]), "=f"(d[j0 + 5][3]),
                   "=f"(d[j0 + 6][0]), "=f"(d[j0 + 6][1]), "=f"(d[j0 + 6][2]), "=f"(d[j0 + 6][3]),
                   "=f"(d[j0 + 7][0]), "=f"(d[j0 + 7][1]), "=f"(d[j0 + 7][2]), "=f"(d[j0 + 7][3])
                 : "r"(taddr)
                 : "memory");
}

// Consumer: acc = this warp's 16 rows of the next output tile (tile `it` of the CTA's sequence, in
// accumulator buffer it % 2); `it` counts tiles here, not k-tiles. wg is unused (kept for the call).
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p, int &it, int wg)
{
    (void)wg;
    const int buf = it & 1;
    mbar_wait(tmem_full_bar(smem, buf), (unsigned)(it >> 1) & 1);
    it++;
    tc_fence_after();
    const int warp = (int)(threadIdx.x - PRODUCER_THREADS) / 32;
    // TMEM address: lane (bits 31-16) = this warp's first row, column (bits 15-0) = the buffer's.
    const unsigned taddr = *(volatile unsigned *)tmem_slot(smem) + ((unsigned)(16 * tc_row_block(warp)) << 16) +
                           (unsigned)(buf * BN);
#pragma unroll
    for (int c = 0; c < NI / 8; c++) tmem_ld64(acc[0], 8 * c, taddr + 64 * c);
    if (p.k <= 0) // no MMA ran: the buffer holds stale values
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    tc_fence_before();
    mbar_arrive(tmem_empty_bar(smem, buf));
}
