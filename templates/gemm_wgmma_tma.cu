// gemm_wgmma_tma.cu — the Hopper main loop fed by TMA (sm_90a, FLCE_WGMMA and FLCE_TMA): the
// mbarrier pipeline, the producer warpgroup's TMA loads, and the consumer warpgroups' wgmmas. The
// Blackwell path keeps the pipeline and the producer and brings its own barrier setup and main
// loop. Pasted after gemm_wgmma.cu.
#if FLCE_WGMMA && FLCE_TMA
// ---- TMA + mbarrier pipeline, warp-specialized -----------------------------------------------
// Warpgroup 0 is the producer: one of its threads issues, per stage, the TMA copies of the A and B
// tiles into the swizzled layouts of gemm_wgmma.cu (the tensor maps use the 128-byte swizzle, and
// the stages sit on 1024-byte boundaries) and arms the stage's "full" barrier with the bytes to expect.
// Warpgroups 1 and 2 are the consumers: the 64-row halves of the cp.async path, same fragments, so
// the epilogues are shared. Each stage has two mbarriers:
//   full[s]   1 arrival (the producer's arrive.expect_tx) + STAGE_BYTES of completed copies;
//   empty[s]  one arrival per consumer warpgroup, once the wgmmas that read the stage are done.
// The u-th use of stage s (u = it / STAGES, `it` counting k-tiles over all of the CTA's tiles)
// waits for parity u & 1 of full[s]; the producer waits for parity (u & 1) ^ 1 of empty[s], which a
// fresh barrier reports complete, so the first STAGES loads go out at once. The producer runs
// ahead across output tiles too: the next tile's first stages load during this tile's epilogue.
// No CTA-wide barrier after the role split: the producer warpgroup has returned.
constexpr int CONSUMER_WGS = THREADS / 128;
constexpr int PIPE_BYTES = STAGES * STAGE_BYTES; // the 2·STAGES barriers follow the stages
// Registers per thread after the split: 128·40 + 256·232 = 64512 of the SM's 65536.
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(THREADS == 256, "TMA path: two consumer warpgroups");

__device__ __forceinline__ unsigned full_bar(unsigned char *smem, int s) { return smem_addr(smem + PIPE_BYTES) + 8 * s; }
__device__ __forceinline__ unsigned empty_bar(unsigned char *smem, int s)
{
    return smem_addr(smem + PIPE_BYTES) + 8 * (STAGES + s);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Spins until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// One box of the tensor map at element coordinates (x = innermost, y) into shared memory; the
// copy's bytes complete on `bar`. Out-of-bounds parts of the box arrive as zeros.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const flce_tmap *map, int x, int y, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

#if FLCE_TCGEN05
// (tcgen05: its pipe_init also allocates tensor memory, gemm_tcgen05.cu)
#else
// Called by every thread before the role split.
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), CONSUMER_WGS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine
    }
    __syncthreads();
}

#endif // FLCE_TCGEN05
// One operand's tile of a stage: K-major one box of 64 k × ROWS, MN-major ROWS/64 boxes of 64 × 64 k.
template <int ROWS, bool KMAJOR>
__device__ __forceinline__ void tma_operand(unsigned char *dst, const flce_tmap *map, int mn0, int k0, unsigned bar)
{
    if (KMAJOR) {
        tma_load_2d(smem_addr(dst), map, k0, mn0, bar);
    } else {
#pragma unroll
        for (int b = 0; b < ROWS / 64; b++) tma_load_2d(smem_addr(dst + b * (BK * 128)), map, mn0 + 64 * b, k0, bar);
    }
}

// Producer (one thread): every k-tile of n_tiles output tiles (m0, n0 + i·BN), in the consumers'
// order; `it` carries the pipeline position from call to call.
__device__ void produce(const flce_gemm_params &p, unsigned char *smem, long long m0, long long n0, long long n_tiles,
                        int &it)
{
    const int ktiles = (int)((p.k + BK - 1) / BK);
    for (long long t = 0; t < n_tiles; t++)
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1);
            const unsigned full = full_bar(smem, s);
            mbar_arrive_expect_tx(full, STAGE_BYTES);
            unsigned char *stage = smem + s * STAGE_BYTES;
            tma_operand<BM, A_KMAJOR>(stage, &p.tmap_a, (int)m0, kt * BK, full);
            tma_operand<BN, B_KMAJOR>(stage + A_BYTES, &p.tmap_b, (int)(n0 + t * BN), kt * BK, full);
        }
}

#if FLCE_TCGEN05
// (tcgen05: warp 1 issues the MMAs, the consumers' mainloop reads tensor memory, gemm_tcgen05.cu)
#else
// Consumer warpgroup wg: acc = this warpgroup's 64 rows of the next output tile. `it` carries the
// pipeline position from tile to tile.
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p, int &it, int wg)
{
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    fence_acc(acc);
    const int ktiles = (int)((p.k + BK - 1) / BK);
    const bool signals = threadIdx.x % 128 == 0; // one arrival per warpgroup
    for (int kt = 0; kt < ktiles; kt++, it++) {
        const int s = it % STAGES;
        mbar_wait(full_bar(smem, s), (it / STAGES) & 1);
        compute_stage(acc, smem + s * STAGE_BYTES, wg);
        // This k-tile's wgmmas stay in flight; the previous one's are done, so its stage goes back.
        wgmma_wait<1>();
        if (kt > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_acc(acc);
    if (ktiles > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
}
#endif // FLCE_TCGEN05
#endif // FLCE_WGMMA && FLCE_TMA
