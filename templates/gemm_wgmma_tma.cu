// gemm_wgmma_tma.cu — the Hopper main loop fed by TMA (sm_90a, FLCE_WGMMA and FLCE_TMA): the
// mbarrier pipeline, the producer warpgroup's TMA loads, and the consumer warpgroups' wgmmas. The
// Blackwell path keeps the pipeline and the producer and brings its own barrier setup and main
// loop. Pasted after gemm_wgmma.cu for the TMA specs (Hopper and Blackwell) only.
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
#if FLCE_CLUSTER
// ---- 2-CTA clusters (dH/dW, FLCE_CLUSTER = 2): one B tile for two CTAs, by TMA multicast --------
// The two CTAs of a cluster work on vertically adjacent output tiles, row blocks 2i and 2i + 1 of
// the same BN columns (gemm_entry.cu, pair_origin), so at every k they need the same B tile (W for
// dH, H for dW; MN-major, BN/64 boxes of 64 × 64 k). The CTA of rank r loads the boxes b with
// b % 2 == r with .multicast::cluster to both CTAs: the copy engine writes each box at the same
// offset in both CTAs' shared memory and completes its bytes on the full barrier at the same offset
// in each. A is loaded by each CTA for itself. So each CTA's full[s] still expects STAGE_BYTES per
// use (its A, its half of B, the peer's half) from one arrival, its own producer's expect_tx; the
// peer's bytes may land before that arrival (the tx-count goes below zero for a while; the phase
// cannot complete without the arrival).
// Either producer writes into both CTAs, so a stage is free again only when the consumers of BOTH
// CTAs are done with it: empty[s] counts CLUSTER_CTAS × CONSUMER_WGS arrivals, each consumer
// warpgroup arriving on its own CTA's barrier and (mapa + a remote arrive) on the peer's; so a
// producer that sees its own empty[s] complete knows both CTAs' copies of stage s are free. Both
// CTAs walk the same tiles' k-tiles in the same order (a row block past the matrix is a dummy tile:
// loaded, multiplied, not stored), so their pipeline positions `it` agree at every step and the
// u-th use of stage s is the same k-tile in both.
// A cluster barrier after the barrier init, before any copy or remote arrive can reach the peer. At
// the end the producer thread outlives the peer's last remote arrivals on this CTA's barriers
// (drain_pair), which keeps this CTA's shared memory; everything else aimed at it (the peer's
// multicast copies) completes on full barriers its consumers waited for.
// Logits CTAs pair two adjacent row blocks of one vocab split; B (W, K-major) is one box of BN/2
// rows per CTA, multicast (produce_logits).
static_assert(FLCE_CLUSTER == 2 && (ROLE_IS_LOGITS ? B_KMAJOR : !B_KMAJOR), "clusters: pairs of CTAs, dH/dW's B MN-major");
constexpr int CLUSTER_CTAS = FLCE_CLUSTER;
__device__ __forceinline__ unsigned cluster_ctarank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_index()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_count()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
// Every thread of the cluster, with release/acquire at cluster scope.
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrives on the mbarrier at the same shared-memory offset as `bar` in the cluster's CTA `rank`.
// Default semantics (release, CTA scope), as CUTLASS's ClusterBarrier::arrive(cta_id) uses: what it
// orders is the completion of this warpgroup's wgmma reads of the stage (wgmma.wait_group, before
// it) against the peer producer's next TMA write, and the arrival cannot happen before them. At
// cluster scope ptxas puts MEMBAR.ALL.GPU in front of every such arrival (seen in the SASS), on the
// consumers' k-tile path; the producers' waits likewise stay at CTA scope (acquire.cluster adds an
// L1 invalidation, CCTL.IVALL, after each).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank)
{
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(rank)
                 : "memory");
}
// tma_load_2d into the same offset `dst` of every CTA in `mask`, completing on `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const flce_tmap *map, int x, int y, unsigned bar,
                                                      unsigned short mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar), "h"(mask)
                 : "memory");
}
// A consumer warpgroup is done with stage s: its own CTA's producer and the peer's may refill it.
__device__ __forceinline__ void release_stage(unsigned char *smem, int s)
{
    const unsigned bar = empty_bar(smem, s);
    mbar_arrive(bar);
    mbar_arrive_cluster(bar, cluster_ctarank() ^ 1);
}
#endif // FLCE_CLUSTER

// Dynamic tile order (p.tile_counter, dH/dW): the producer thread picks each tile and tells the
// consumers which one through a shared-memory slot after the pipeline's barriers; -1: no tile is
// left. Tile i of the CTA (i = 0, 1, ...), whose first k-tile is at pipeline position P(i), is
//  - written by the producer thread (produce, announce_end) after its wait on empty[P(i) % STAGES]
//    and before its arrival on full[P(i) % STAGES]: that arrival releases the write, the consumers'
//    wait on the barrier in mainloop acquires it;
//  - read once by every consumer thread, into a register, before any wgmma of the tile, each of
//    them then arriving on the slot's own mbarrier, tile_taken (THREADS arrivals complete its
//    phase i: all have read tile i's number);
//  - overwritten with tile i + 1's number only after the producer's wait for phase i.
// So each reading thread orders its read before the next write by its own arrival on a barrier the
// writer waits on: a release/acquire pair of the PTX memory model, thread to thread, which is also
// what compute-sanitizer's racecheck follows. (Until issue 43: a ring of STAGES + 1 slots, one
// reused STAGES + 1 tiles later behind the empty barriers, on which one thread per consumer
// warpgroup arrives. The other threads' reads reached that arrival only through the warpgroup's
// wgmma, each thread's read feeding a branch before it issues the tile's first wgmma, whose
// completion the arriving thread waits for: sound by how a warpgroup runs wgmma, not by the memory
// model, and racecheck reported every consumer warp's reads against the producer's next write:
// at 2304x512x33000 on an H200, 11 reports, 7144 WAR hazards with --racecheck-report hazard; a
// warpgroup barrier between the reads and the arrival left them as they were; none with this slot.
// test_dw_race, which a tile computed twice or left out fails, passed with this slot and with the
// ring plus that barrier; it was not run on the ring alone.)
// The producer runs up to one tile ahead of the consumers' reads of the slot: tile i + 1's number
// waits for their reads of tile i's, made as they start tile i, and tile i + 1's loads go on during
// tile i. Where a tile has more than STAGES k-tiles (dW: over 256 tokens) that wait is already
// satisfied, the producer's empty wait for the tile's last k-tile having needed the consumers past
// its first; shorter tiles keep one tile of loads ahead rather than STAGES k-tiles.
// The slot and its barrier take 16 of the 8·(STAGES + 1) bytes the generator leaves after the
// pipeline's barriers for them (generator/spec.c smem_bytes, STAGING_OFFSET below).
static_assert(16 <= 8 * (STAGES + 1), "the tile slot and its barrier fit the generator's room for them");
__device__ __forceinline__ unsigned tile_taken_bar(unsigned char *smem) { return smem_addr(smem + PIPE_BYTES + 16 * STAGES); }
__device__ __forceinline__ long long *tile_slot(unsigned char *smem)
{
    return (long long *)(smem + PIPE_BYTES + 16 * STAGES + 8);
}
// Producer thread, before it writes tile i's number (or -1) into the slot: every consumer thread has
// read tile i - 1's (phase i - 1 of tile_taken completed; it cannot be further on, since phase i needs
// tile i's number). Nothing to wait for before the first tile.
__device__ __forceinline__ void wait_tile_taken(unsigned char *smem, int i)
{
    if (i > 0) mbar_wait(tile_taken_bar(smem), (unsigned)(i - 1) & 1);
}

#if FLCE_TCGEN05
// (tcgen05: its pipe_init also allocates tensor memory, gemm_tcgen05.cu)
#else
#if FLCE_CLUSTER
// Called by every thread of both CTAs before the role split: each empty[s] waits for the consumer
// warpgroups of both CTAs, and the cluster barrier puts both CTAs' barriers in place before either
// CTA's copies or remote arrivals can reach them.
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++)
            mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), CLUSTER_CTAS * CONSUMER_WGS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine and the peer
    }
    cluster_sync();
}
#else
// Called by every thread before the role split.
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), CONSUMER_WGS);
        if constexpr (!ROLE_IS_LOGITS) // the dynamic tile order's slot (dH, dW): every consumer thread reads it
            mbar_init(tile_taken_bar(smem), THREADS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine
    }
    __syncthreads();
}
#endif // FLCE_CLUSTER

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
// order; `it` carries the pipeline position from call to call. With `slot`, the tile's number
// `tile` goes into it with the first k-tile (dynamic tile order, one tile per call). kn ≥ 0: only
// the kn columns of k from kb (a split of dH's k, params.h k_splits); else all of k.
__device__ void produce(const flce_gemm_params &p, unsigned char *smem, long long m0, long long n0, long long n_tiles,
                        int &it, long long *slot = nullptr, long long tile = 0, long long kb = 0, long long kn = -1)
{
    const int ktiles = (int)(((kn < 0 ? p.k : kn) + BK - 1) / BK);
    for (long long t = 0; t < n_tiles; t++)
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            const int k = (int)kb + kt * BK;
            mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1);
            if (slot && kt == 0) *(volatile long long *)slot = tile;
            const unsigned full = full_bar(smem, s);
            mbar_arrive_expect_tx(full, STAGE_BYTES);
            unsigned char *stage = smem + s * STAGE_BYTES;
            tma_operand<BM, A_KMAJOR>(stage, &p.tmap_a, (int)m0, k, full);
            tma_operand<BN, B_KMAJOR>(stage + A_BYTES, &p.tmap_b, (int)(n0 + t * BN), k, full);
        }
}
// Dynamic tile order: no tile is left; the consumers learn it at pipeline position `it` (a plain
// arrival completes the full barrier's phase with no bytes) and stop.
__device__ void announce_end(unsigned char *smem, long long *slot, int it)
{
    const int s = it % STAGES;
    mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1);
    *(volatile long long *)slot = -1;
    mbar_arrive(full_bar(smem, s));
}
#if FLCE_CLUSTER
// Producer (one thread) of a CTA in a cluster: every k-tile of one output tile, A at row m0 for
// this CTA alone, and this CTA's half of the B boxes at column n0 for both CTAs (the peer issues
// the other half for the same n0 and k-tile at the same `it`).
__device__ void produce_pair(const flce_gemm_params &p, unsigned char *smem, long long m0, long long n0, unsigned rank,
                             int &it)
{
    const int ktiles = (int)((p.k + BK - 1) / BK);
    for (int kt = 0; kt < ktiles; kt++, it++) {
        const int s = it % STAGES;
        mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1); // free in both CTAs
        const unsigned full = full_bar(smem, s);
        mbar_arrive_expect_tx(full, STAGE_BYTES); // A + all of B, half of it from the peer
        unsigned char *stage = smem + s * STAGE_BYTES;
        tma_operand<BM, A_KMAJOR>(stage, &p.tmap_a, (int)m0, kt * BK, full);
#pragma unroll
        for (int b = 0; b < BN / 64; b++)
            if (b % CLUSTER_CTAS == (int)rank)
                tma_load_2d_multicast(smem_addr(stage + A_BYTES + b * (BK * 128)), &p.tmap_b, (int)(n0 + 64 * b), kt * BK,
                                      full, (unsigned short)((1u << CLUSTER_CTAS) - 1));
    }
}
// The producer thread after its last produce_pair: waits, as if to load STAGES more k-tiles, until
// the consumers of both CTAs have released every stage, so that this CTA (whose consumers may have
// exited) stays until the peer's last remote arrivals on its empty barriers have landed (CUTLASS's
// load_tail, DeepGEMM's final round of empty waits). Stages never used pass at once.
__device__ void drain_pair(unsigned char *smem, int it)
{
    for (int i = it; i < it + STAGES; i++) mbar_wait(empty_bar(smem, i % STAGES), ((i / STAGES) & 1) ^ 1);
}
#endif // FLCE_CLUSTER
// The logits producer (one thread): for each of n_tiles vocab tiles at n0 + t·BN, the k-tiles of A
// (the CTA's row block at m0) with the tile's B. In a 2-CTA cluster B is this CTA's BN/2 rows,
// multicast to both CTAs: the peer loads the other half at the same `it` (both CTAs walk the same
// tiles of one split).
__device__ void produce_logits(const flce_gemm_params &p, unsigned char *smem, long long m0, long long n0,
                               long long n_tiles, int &it)
{
    const int ktiles = (int)((p.k + BK - 1) / BK);
#if FLCE_CLUSTER
    const unsigned rank = cluster_ctarank();
#endif
    for (long long t = 0; t < n_tiles; t++)
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1);
            const unsigned full = full_bar(smem, s);
            mbar_arrive_expect_tx(full, STAGE_BYTES);
            unsigned char *stage = smem + s * STAGE_BYTES;
            tma_load_2d(smem_addr(stage), &p.tmap_a, kt * BK, (int)m0, full);
#if FLCE_CLUSTER
            tma_load_2d_multicast(smem_addr(stage + A_BYTES + rank * (BN / 2) * 128), &p.tmap_b, kt * BK,
                                  (int)(n0 + t * BN + rank * (BN / 2)), full, (unsigned short)3);
#else
            tma_load_2d(smem_addr(stage + A_BYTES), &p.tmap_b, kt * BK, (int)(n0 + t * BN), full);
#endif
        }
}


#if FLCE_TCGEN05
// (tcgen05: warp 1 issues the MMAs, the consumers' mainloop reads tensor memory, gemm_tcgen05.cu)
#else
// Consumer warpgroup wg: acc = this warpgroup's 64 rows of the next output tile. `it` carries the
// pipeline position from tile to tile. With `slot` (dynamic tile order), *tile = the number the
// producer put there with the first k-tile; false (nothing computed) when it says no tile is left.
// kn ≥ 0: the tile's k-tiles cover kn columns (a split of k, as produce's), else all of k.
__device__ bool mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p, int &it, int wg,
                         const long long *slot = nullptr, long long *tile = nullptr, long long kn = -1)
{
    if (slot) { // before any wgmma of this tile (the loop's first wait then passes at once)
        mbar_wait(full_bar(smem, it % STAGES), (it / STAGES) & 1);
        *tile = *(const volatile long long *)slot;
        // dH, dW: this thread is done with the slot (tile_slot)
        if constexpr (!ROLE_IS_LOGITS) mbar_arrive(tile_taken_bar(smem));
        if (*tile < 0) return false;
    }
    const int ktiles = (int)(((kn < 0 ? p.k : kn) + BK - 1) / BK);
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    fence_acc(acc);
    const bool signals = threadIdx.x % 128 == 0; // one arrival per warpgroup
    for (int kt = 0; kt < ktiles; kt++, it++) {
        const int s = it % STAGES;
        mbar_wait(full_bar(smem, s), (it / STAGES) & 1);
        compute_stage(acc, smem + s * STAGE_BYTES, wg);
        // This k-tile's wgmmas stay in flight; the previous one's are done, so its stage goes back.
        wgmma_wait<1>();
#if FLCE_CLUSTER
        if (kt > 0 && signals) release_stage(smem, (it - 1) % STAGES); // in both CTAs
#else
        if (kt > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
#endif
    }
    wgmma_wait<0>();
    fence_acc(acc);
#if FLCE_CLUSTER
    if (ktiles > 0 && signals) release_stage(smem, (it - 1) % STAGES);
#else
    if (ktiles > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
#endif
    return true;
}
#endif // FLCE_TCGEN05

// ---- 16-bit tiles stored through shared memory (STAGED_STORE) --------------------------------
// Straight from the accumulator fragments a warp store writes 16 bytes in each of 8 rows, half a
// sector each. stmatrix puts a warp's 16 × 64 block in a 2 KiB buffer of its own, and each lane
// writes 16 bytes back out, so one store instruction covers four whole 128-byte rows (v19: the
// compact logits pass's stores went from 17 M instructions and 136 M sectors to 4.7 M and 70 M).
// Used by the compact logits epilogue and the dH/dW epilogue's 16-bit output where STAGED_STORE
// (gemm.cu: not on the Blackwell path, which pastes this file too but never calls them).
// One 2 KiB buffer per warp (two with FLCE_GRAD_BULK or FLCE_Z_STAGED: bulk_red_rows, staged_rows_out);
// the generator's spec_smem_bytes adds them
constexpr int STAGING_BYTES = (FLCE_GRAD_BULK || FLCE_Z_STAGED ? 2 : 1) * 16 * 64 * 2;
// The staging buffers follow the barriers and the tile slot, on a 128-byte boundary (the
// generator's spec_smem_bytes counts the same).
constexpr int STAGING_OFFSET = PIPE_BYTES + (16 * STAGES + 8 * (STAGES + 1) + 127) / 128 * 128;
__device__ __forceinline__ unsigned staging_addr(unsigned char *smem, int warp)
{
    return smem_addr(smem) + STAGING_OFFSET + warp * STAGING_BYTES;
}
// Rows of the buffer are 128 bytes; 16-byte chunk c of row r sits at chunk c ^ (r & 7), so the
// 8 rows of one stmatrix matrix and the 8 lanes reading one row each hit distinct banks.
__device__ __forceinline__ unsigned staging_at(unsigned buf, int row, int chunk)
{
    return buf + row * 128 + ((chunk ^ (row & 7)) << 4);
}
// A warp's 16 rows × WTN columns of packed 16-bit pairs (word (ni, h) in pk[ni][h], the fragment
// layout: row g + 8h, columns ni·8 + 2t…) to rows row0…, columns col0… of out (row stride ld, a
// multiple of 8 elements), rows below `rows` and columns below `cols` (a multiple of 8) only.
// Every lane of the warp calls it.
__device__ __forceinline__ void staged_store(const unsigned (&pk)[NI][2], unsigned short *out, long long ld,
                                             long long rows, long long cols, unsigned buf, long long row0,
                                             long long col0, int lane)
{
    static_assert(!STAGED_STORE || (WARPS_N == 1 && WTM == 16 && MI == 1 && NI % 8 == 0),
                  "staged store: one warp tile of 16 rows");
#pragma unroll
    for (int q = 0; q < NI / 8; q++) { // 64 columns at a time
#pragma unroll
        for (int pi = 0; pi < 4; pi++) {
            const int ni = q * 8 + 2 * pi, k = lane >> 3, r = (k & 1) * 8 + (lane & 7);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                         ::"r"(staging_at(buf, r, 2 * pi + (k >> 1))), "r"(pk[ni][0]), "r"(pk[ni][1]),
                         "r"(pk[ni + 1][0]), "r"(pk[ni + 1][1])
                         : "memory");
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i * 4 + (lane >> 3), c = lane & 7;
            unsigned v0, v1, v2, v3;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                         : "r"(staging_at(buf, r, c))
                         : "memory");
            const long long col = col0 + q * 64 + c * 8;
            if (row0 + r < rows && col < cols) st_global_16(out + (row0 + r) * ld + col, v0, v1, v2, v3);
        }
        __syncwarp(); // the buffer is rewritten by the next 64 columns
    }
}

// ---- fp32 tiles out through shared memory (FLCE_GRAD_BULK, FLCE_Z_STAGED) ----------------------
// A warp's 16 rows × WTN fp32 columns (acc's fragment layout) go out 32 columns at a time through
// one of the warp's two 2 KiB buffers (staging_addr: 128-byte rows), to rows row0…, columns col0…
// of out (row stride ld), rows below `rows` and columns below `cols` (a multiple of 4) only. Direct
// 8-byte stores or reductions from the fragments touch 8 rows per instruction and kept the
// consumers waiting on the LSU (bench/NOTES.md session 15 for dW, session 30 for Z). Both need out
// and ld·4 16-byte aligned (bulk_out_ok); every lane of the warp calls them.

// Columns 32q… of a warp's 16 fp32 rows (acc's fragments, times scale) into the 2 KiB buffer at
// buf, row r at buf + 128r
__device__ __forceinline__ void stage_fp32_rows(const float (&acc)[MI][NI][4], int q, float scale, unsigned buf,
                                                int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(buf + (g + 8 * h) * 128 + (i * 8 + 2 * t) * 4),
                         "f"(acc[0][q * 4 + i][2 * h] * scale), "f"(acc[0][q * 4 + i][2 * h + 1] * scale)
                         : "memory");
}

// The plain logits pass's Z: each lane reads 16 bytes of 4 rows back and stores them, one
// st.global.v4 covering 4 whole rows. Z by bulk copies, one TMA operation per 128-byte row, was
// ~1 ms a reverse KL or JSD step slower than these stores (bench/NOTES.md session 31, q1).
__device__ __forceinline__ void staged_rows_out(const float (&acc)[MI][NI][4], float *out, long long ld,
                                                long long rows, long long cols, long long row0, long long col0,
                                                unsigned buf0, int lane)
{
    static_assert(!FLCE_Z_STAGED || (WARPS_N == 1 && WTM == 16 && MI == 1 && NI % 4 == 0),
                  "staged fp32 rows: one warp tile of 16 rows");
#pragma unroll
    for (int q = 0; q < NI / 4; q++) {
        // (rewritten two rounds on: after the next round's __syncwarp, which follows these reads)
        const unsigned buf = buf0 + (q & 1) * 2048;
        stage_fp32_rows(acc, q, 1.f, buf, lane);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i * 4 + (lane >> 3), c = lane & 7;
            float v0, v1, v2, v3;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v0), "=f"(v1), "=f"(v2), "=f"(v3)
                         : "r"(buf + r * 128 + c * 16)
                         : "memory");
            const long long col = col0 + q * 32 + c * 4;
            if (row0 + r < rows && col < cols)
                asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + (row0 + r) * ld + col),
                             "f"(v0), "f"(v1), "f"(v2), "f"(v3)
                             : "memory");
        }
    }
}

// A 16-bit output built up in place (params.h addend_dtype: a distillation's dWs added chunk by chunk
// into the caller's dW): out += acc·scale, rounded once, 32 columns at a time through one of the warp's
// two 2 KiB buffers as staged_rows_out, each lane then reading 4 fp32 values of a row back, loading
// those 4 outputs (8 bytes: the lanes of a row cover 64 contiguous bytes) and storing their sums. From
// the fragments each load and store touched 8 rows, half a sector each (bench/NOTES.md session 33).
// Needs out 8-byte aligned and ld a multiple of 4; every lane of the warp calls it.
__device__ __forceinline__ void staged_add_rows(const float (&acc)[MI][NI][4], unsigned short *out, long long ld,
                                                long long rows, long long cols, long long row0, long long col0,
                                                float scale, unsigned buf0, int lane)
{
    static_assert(!FLCE_GRAD_BULK || (WARPS_N == 1 && WTM == 16 && MI == 1 && NI % 4 == 0),
                  "staged 16-bit sums: one warp tile of 16 rows");
#pragma unroll
    for (int q = 0; q < NI / 4; q++) {
        // (rewritten two rounds on: after the next round's __syncwarp, which follows these reads)
        const unsigned buf = buf0 + (q & 1) * 2048;
        stage_fp32_rows(acc, q, scale, buf, lane);
        __syncwarp();
        float v[4][4];
        unsigned old[4][2];
        bool in[4];
#pragma unroll
        for (int i = 0; i < 4; i++) { // the 4 loads first, so that their latencies overlap
            const int r = i * 4 + (lane >> 3), c = lane & 7;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v[i][0]), "=f"(v[i][1]), "=f"(v[i][2]), "=f"(v[i][3])
                         : "r"(buf + r * 128 + c * 16)
                         : "memory");
            const long long col = col0 + q * 32 + c * 4;
            in[i] = row0 + r < rows && col < cols;
            old[i][0] = old[i][1] = 0;
            if (in[i])
                asm volatile("ld.global.v2.b32 {%0, %1}, [%2];\n"
                             : "=r"(old[i][0]), "=r"(old[i][1])
                             : "l"(out + (row0 + r) * ld + col));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (!in[i]) continue;
            const int r = i * 4 + (lane >> 3), c = lane & 7;
            const long long col = col0 + q * 32 + c * 4;
            unsigned lo = pack2_elem(v[i][0] + to_f32((elem_t)(old[i][0] & 0xffffu)),
                                     v[i][1] + to_f32((elem_t)(old[i][0] >> 16)));
            unsigned hi = pack2_elem(v[i][2] + to_f32((elem_t)(old[i][1] & 0xffffu)),
                                     v[i][3] + to_f32((elem_t)(old[i][1] >> 16)));
            asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(out + (row0 + r) * ld + col), "r"(lo), "r"(hi)
                         : "memory");
        }
    }
}

// dW into fp32 accumulators (times scale): 16 lanes each hand one row's 128 bytes to the TMA unit
// as a bulk reduction (cp.reduce.async.bulk … add.f32); the warp goes on while they drain, a buffer
// is rewritten once the bulk reads of two rounds before are done (wait_group.read 1), and
// bulk_drain waits for all before the warp leaves.
__device__ __forceinline__ void bulk_red_rows(const float (&acc)[MI][NI][4], float *out, long long ld, long long rows,
                                              long long cols, long long row0, long long col0, float scale,
                                              unsigned buf0, int lane)
{
    static_assert(!FLCE_GRAD_BULK || (WARPS_N == 1 && WTM == 16 && MI == 1 && NI % 4 == 0),
                  "bulk reductions: one warp tile of 16 rows");
    const long long row = row0 + lane; // lanes 0-15: the row each hands over
    float *out_row = out + row * ld;
#pragma unroll
    for (int q = 0; q < NI / 4; q++) { // 32 columns at a time
        const unsigned buf = buf0 + (q & 1) * 2048;
        if (lane < 16) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
        __syncwarp();
        stage_fp32_rows(acc, q, scale, buf, lane);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // the writes, seen by the TMA unit
        __syncwarp();
        if (lane < 16) {
            const long long col = col0 + q * 32;
            if (row < rows && col < cols) {
                const unsigned bytes = (unsigned)((cols - col < 32 ? cols - col : 32) * 4);
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                             ::"l"(out_row + col), "r"(buf + lane * 128), "r"(bytes)
                             : "memory");
            }
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
}
