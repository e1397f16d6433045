// gemm_wgmma_cp_async.cu — the Hopper main loop fed by cp.async (sm_90a, FLCE_WGMMA with
// FLCE_TMA=0): every thread loads stages into the swizzled layouts of gemm_wgmma.cu, both
// warpgroups run the stage's wgmmas, CTA barriers between. Pasted after gemm_wgmma.cu, for those
// specs only.
// One stored tile into its swizzled shared layout. K-major: ROWS rows of 64 k. MN-major: 64 k rows
// of ROWS contiguous elements.
template <int ROWS, bool KMAJOR>
__device__ __forceinline__ void load_swizzled(unsigned char *dst, const elem_t *src, long long mn0,
                                              long long k0, long long n_rows, long long n_cols, long long ld)
{
    constexpr int CHUNKS = ROWS * BK / 8; // 16-byte chunks in the tile
    for (int i = threadIdx.x; i < CHUNKS; i += THREADS) {
        long long gr, gc;
        int off;
        if (KMAJOR) {
            int r = i / 8, c = i % 8;
            gr = mn0 + r, gc = k0 + c * 8;
            off = r * 128 + ((c ^ (r & 7)) << 4);
        } else {
            int r = i / (ROWS / 8), cc = i % (ROWS / 8), blk = cc / 8, c = cc % 8;
            gr = k0 + r, gc = mn0 + cc * 8;
            off = blk * (BK * 128) + r * 128 + ((c ^ (r & 7)) << 4);
        }
        bool ok = gr < n_rows && gc < n_cols;
        cp_async_16(dst + off, ok ? src + gr * ld + gc : src, ok);
    }
}

__device__ __forceinline__ void load_stage(unsigned char *stage, const flce_gemm_params &p, long long m0,
                                           long long n0, long long k0)
{
    load_swizzled<BM, A_KMAJOR>(stage, (const elem_t *)p.a, m0, k0, p.a_rows, p.a_cols, p.lda);
    load_swizzled<BN, B_KMAJOR>(stage + A_BYTES, (const elem_t *)p.b, n0, k0, p.b_rows, p.b_cols, p.ldb);
}

// acc = this warpgroup's 64 rows of the tile at (m0, n0) over the whole k extent, every thread
// loading the stages. Ends with a barrier so the caller may reuse shared memory.
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p,
                         long long m0, long long n0, int wm, int wn, int lane)
{
    (void)wn, (void)lane;
    const int wg = wm / 4;
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    const int ktiles = (int)((p.k + BK - 1) / BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_stage(smem + s * STAGE_BYTES, p, m0, n0, (long long)s * BK);
        cp_async_commit();
    }
    fence_acc(acc);
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async(); // cp.async wrote through the generic proxy; wgmma reads through the async one
        __syncthreads();     // stage kt landed for everyone
        compute_stage(acc, smem + (kt % STAGES) * STAGE_BYTES, wg);
        // Keep this k-tile's wgmmas in flight; the previous tile's must be done (in both
        // warpgroups, hence the barrier) before its stage is refilled.
        wgmma_wait<1>();
        __syncthreads();
        int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(smem + (next % STAGES) * STAGE_BYTES, p, m0, n0, (long long)next * BK);
        cp_async_commit();
    }
    wgmma_wait<0>();
    fence_acc(acc);
    cp_async_wait<0>();
    __syncthreads();
}
