// gemm_entry.cu — the kernels: flce_logits (a grid of row blocks × vocab splits) and flce_dh /
// flce_dw (a grid of output tiles, persistent on the TMA path). They map CTAs to tiles, split the
// TMA path's warpgroups into producer and consumers, and run a main loop and an epilogue per tile.
// Pasted last.
#if ROLE_IS_LOGITS
constexpr int LOGITS_GROUP = 8; // row blocks per group of items (logits_item), unless p.group_rows says
#if !FLCE_WGMMA
// The portable path's CTA over vocab tiles [t_begin, t_end) of its row block. Its main loop holds
// 128 accumulators and two sets of fragments per thread (64×64 warp tiles), which leaves no
// registers for the 8 rows per thread of state the wgmma paths keep across it (labels, running
// statistics, dZ factors: up to 56 more with every option). So each tile's epilogue recomputes the
// labels and dZ factors of its rows (a few loads that hit L1/L2) and folds its statistics into one
// running row_stats per row, held by the thread that stores the row's partials (fold_row_stats).
// A template on the pass's row state (row_state: dz_row or row_stats), so that only that pass's
// branches are compiled: the statistics' fold takes row_stats alone.
template <class State>
__device__ __forceinline__ void logits_portable(const flce_gemm_params &p, unsigned char *smem, long long m0,
                                                int split, long long t_begin, long long t_end)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    row_stats run[RUN_ROWS]; // rows m0 + threadIdx.x + i·THREADS (the statistics pass)
    if constexpr (!FLCE_FUSED_DZ) {
#pragma unroll
        for (int i = 0; i < RUN_ROWS; i++) run[i] = empty_stats();
    } else {
        (void)split;
    }
    float acc[MI][NI][4];
    for (long long vt = t_begin; vt < t_end; vt++) {
        mainloop(acc, smem, p, m0, vt * BN, wm, wn, lane);
        long long lab[MI][2];
        State rs[MI][2]; // dZ factors, or this tile's statistics
        rows_setup(p, m0, wm, lane, lab, rs);
        logits_epilogue(acc, p, m0, vt * BN, wm, wn, lane, lab, rs, smem);
        if constexpr (!FLCE_FUSED_DZ) {
            if (p.part_m) fold_row_stats(rs, run, smem, wm, wn, lane); // uniform: not in a gradient pass
        }
    }
    if constexpr (!FLCE_FUSED_DZ) {
        if (!p.part_m) return;
#pragma unroll
        for (int i = 0; i < RUN_ROWS; i++) {
            const int r = threadIdx.x + i * THREADS;
            if (r < BM && m0 + r < p.m) store_partials(p, m0 + r, split, run[i]);
        }
    }
}
#endif // !FLCE_WGMMA

// The persistent loop, compiled where it costs no spills: without the entropy and argmax
// statistics, whose registers it would push past the bound (runtime/plan.c plan_logits_persist);
// not on the Blackwell path (generator/emit.c keeps one branch of the block).
#if FLCE_TCGEN05
constexpr bool LOGITS_PERSIST_PATH = false;
#else
constexpr bool LOGITS_PERSIST_PATH = true;
#endif
constexpr bool LOGITS_PERSIST = LOGITS_PERSIST_PATH && FLCE_WGMMA && FLCE_TMA && !FLCE_FUSED_DZ && !OPT_ENTROPY &&
                                !OPT_ARGMAX && WARPS_N == 1;

// Item `lin` of a pass over `units` row-block units (a row block, or the 2 of a cluster) × `splits`
// vocab splits, renumbered in groups of LOGITS_GROUP row blocks × all splits: the items running at
// once share a few A blocks (which stay in L2) and each vocab tile of W is read by LOGITS_GROUP of
// them at about the same time. Items start in order (a grid's CTAs in launch order, blockIdx.x
// fastest; a persistent CTA's items in strides of the grid); taken as given, the items running at
// once would hold ~all row blocks (at 8192 tokens, 64 blocks of A, 1 MiB each at D = 4096: more
// than L2) and each would re-read its block for every vocab tile. A bijection.
__device__ __forceinline__ void logits_item(long long lin, long long units, long long splits, long long cl,
                                            int group_rows, long long &unit, int &split)
{
    const long long rows = group_rows > 0 ? group_rows : LOGITS_GROUP, group = rows / cl > 0 ? rows / cl : 1;
    const long long per_group = group * splits, g = lin / per_group, w = lin % per_group;
    const long long first = g * group, here = units - first < group ? units - first : group;
    unit = first + w % here;
    split = (int)(w / here);
}

// grid: (row-block units × CL, vocab splits), one item (a row block's split of tiles_per_split
// vocab tiles) per CTA; or with p.persist > 0 (runtime/launch.c, where the items outnumber the CTAs
// resident at once) p.persist units of CL CTAs along x, each walking items u, u + persist, … in
// turn with its pipeline running on: no CTA starts, fills its pipeline and drains it again per item
// (at the tp = 4 shard's 4032 items of 2 tiles, 31 rounds of that).
extern "C" __global__ void FLCE_KERNEL_BOUNDS flce_logits(FLCE_PARAM p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = tile_smem(smem_raw);
    // In 2-CTA clusters (FLCE_CLUSTER, the TMA path) the unit is the cluster: two adjacent row
    // blocks of one split (rank 1's may lie past the rows: loaded as zeros, multiplied, never
    // stored, since every store is of a row below p.m).
#if FLCE_CLUSTER
    constexpr long long CL = 2;
    const long long rank = cluster_ctarank();
#else
    constexpr long long CL = 1, rank = 0;
#endif
    const bool persist = LOGITS_PERSIST && p.persist > 0;
    const long long units = persist ? ((p.m + BM - 1) / BM + CL - 1) / CL : gridDim.x / CL;
    const long long splits = persist ? p.splits : gridDim.y, items = units * splits;
    const long long first_item = persist ? blockIdx.x / CL : (long long)blockIdx.y * units + blockIdx.x / CL;
    const long long stride = persist ? p.persist : items; // one item without persist
    const long long tiles = (p.n + BN - 1) / BN;
    long long unit, m0, t_begin, t_end;
    int split;
    // item l's row block and tiles
    auto item = [&](long long l) {
        logits_item(l, units, splits, CL, LOGITS_PERSIST ? p.group_rows : 0, unit, split); // (no spills there)
        m0 = (CL * unit + rank) * BM;
        t_begin = (long long)split * p.tiles_per_split;
        t_end = t_begin + p.tiles_per_split < tiles ? t_begin + p.tiles_per_split : tiles;
    };
    item(first_item);
#if !FLCE_WGMMA
    logits_portable<row_state>(p, smem, m0, split, t_begin, t_end);
#else
#if FLCE_TMA
    pipe_init(smem);
    if (threadIdx.x < PRODUCER_THREADS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        int it = 0;
        if (threadIdx.x == 0) {
            for (long long l = first_item; l < items; l += stride) {
                item(l);
                produce_logits(p, smem, m0, t_begin * BN, t_end - t_begin, it);
                if (!LOGITS_PERSIST) break;
            }
#if FLCE_CLUSTER
            drain_pair(smem, it);
#endif
        }
#if FLCE_TCGEN05
        if (threadIdx.x / 32 == 1) mma_tiles(p, smem, t_end - t_begin); // warp 1: MMAs, then dealloc
#endif
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
    int it = 0;
#endif
    const int warp = (threadIdx.x - PRODUCER_THREADS) / 32, lane = threadIdx.x % 32;
#if FLCE_TCGEN05
    const int wm = tc_row_block(warp), wn = 0;
#else
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
#endif

    float acc[MI][NI][4];
    long long lab[MI][2];
    row_state rs[MI][2]; // dZ factors, or the running statistics of the item's vocab tiles
    for (long long l = first_item; l < items; l += stride) {
        item(l);
        rows_setup(p, m0, wm, lane, lab, rs);
        float qc[MI * 2]; // FLCE_QROWS: each owned row's reference (the item keeps its row block)
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long row = m0 + wm * WTM + mi * 16 + lane / 4 + 8 * h;
                qc[mi * 2 + h] = FLCE_QROWS && row < p.m ? ((const float *)p.qref)[row] : 0.f;
            }
        for (long long vt = t_begin; vt < t_end; vt++) {
#if FLCE_TMA
            mainloop(acc, smem, p, it, wm / 4);
#else
            mainloop(acc, smem, p, m0, vt * BN, wm, wn, lane);
#endif
            logits_epilogue(acc, p, m0, vt * BN, wm, wn, lane, lab, rs, smem, qc);
        }
        store_item_stats(rs, p, m0, wm, lane, split);
        if (!LOGITS_PERSIST) break;
    }
    store_cta_stats(rs, p, m0, wm, wn, lane, split, smem);
#endif // !FLCE_WGMMA
}

#else // DH, DW
// Output tile t of the persistent walk: column tiles fastest over all rows, or (raster_rows = G)
// in groups of G row blocks × all column tiles, row blocks fastest inside a group, so the CTAs in
// flight share fewer B column tiles (a bijection either way).
__device__ __forceinline__ void tile_origin(const flce_gemm_params &p, long long t, long long tiles_m,
                                            long long tiles_n, long long &m0, long long &n0)
{
    if (p.raster_rows <= 0) {
        m0 = t / tiles_n * BM, n0 = t % tiles_n * BN;
        return;
    }
    const long long per = (long long)p.raster_rows * tiles_n, first = t / per * p.raster_rows, w = t % per;
    const long long rows_here = tiles_m - first < p.raster_rows ? tiles_m - first : p.raster_rows;
    m0 = (first + w % rows_here) * BM, n0 = w / rows_here * BN;
}

// Unit u of the persistent walk: with a split of k (params.h k_splits, dH), the output tile
// u % tiles over the k columns [kb, kb + kn) of split u / tiles, stored to that split's fp32 slab
// (out); without, tile u over all of k, stored to p.out.
__device__ __forceinline__ void unit_origin(const flce_gemm_params &p, long long u, long long tiles, long long tiles_m,
                                            long long tiles_n, long long &m0, long long &n0, long long &kb,
                                            long long &kn, unsigned long long &out)
{
    const long long s = p.k_splits > 1 ? u / tiles : 0;
    tile_origin(p, u - s * tiles, tiles_m, tiles_n, m0, n0);
    kb = s * p.k_split;
    kn = p.k_splits > 1 && p.k - kb > p.k_split ? p.k_split : p.k - kb;
    out = p.out + (unsigned long long)s * p.out_split_stride;
}

#if FLCE_CLUSTER
// 2-CTA clusters (FLCE_CLUSTER = 2, gemm_wgmma_tma.cu): the unit of the persistent walk is a pair
// tile, row blocks 2·pr and 2·pr + 1 of one BN-column tile (the cluster's CTA of rank r takes row
// block 2·pr + r), walked like tile_origin walks tiles: groups of ceil(raster_rows / 2) pair rows
// (the same row blocks per group) × all column tiles, pair rows fastest; column tiles fastest over
// all pair rows when raster_rows is 0. A bijection onto pair_rows × tiles_n.
__device__ __forceinline__ void pair_origin(const flce_gemm_params &p, long long q, long long pair_rows,
                                            long long tiles_n, long long &pr, long long &n0)
{
    if (p.raster_rows <= 0) {
        pr = q / tiles_n, n0 = q % tiles_n * BN;
        return;
    }
    const long long g = (p.raster_rows + 1) / 2, per = g * tiles_n, first = q / per * g, w = q % per;
    const long long rows_here = pair_rows - first < g ? pair_rows - first : g;
    pr = first + w % rows_here, n0 = w / rows_here * BN;
}

#endif
// grid: (column tiles, row tiles). On the TMA path a persistent grid instead (gridDim.y = 1, at
// most one CTA per SM, runtime/tma.c) walks the same tiles in the same order, column tiles
// fastest: tile t = blockIdx.x + i·gridDim.x. Its producer loads the next tile's first stages
// while the consumers run this tile's epilogue.
#if ROLE_IS_DH
#define FLCE_GRAD_ENTRY flce_dh
#else
#define FLCE_GRAD_ENTRY flce_dw
#endif
// Row-scaled compact logits with the label terms in dH's epilogue (FLCE_QDH=0; p.qlab set): it
// adds each row's label term times the label's row of W (gemm_grad.cu scale_rows); those rows are
// asked of L2 when the producer starts the tile, by its whole warp (rows lane, lane + 32, …: one
// round of loads; dH 12.76 against 12.90 ms without at 8192×4096×128256 on an H100, bench/NOTES.md
// v39). By default flce_qdh adds them after dH and this does nothing.
__device__ __forceinline__ void prefetch_labels(const flce_gemm_params &p, long long m0, long long n0, int lane)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) { // (row-scaled compact logits are bf16)
        const long long cols = p.n - n0 < BN ? p.n - n0 : BN; // n is a multiple of 8
        if (ROLE_IS_DH && p.row_scale && p.qlab) {
#pragma unroll
            for (int r = lane; r < BM; r += 32) {
                if (m0 + r >= p.m) break;
                const int y = ((const int *)p.qlab)[2 * (m0 + r) + 1];
                const long long yk = (long long)y - p.qlab_k0;
                if (y < 0 || yk < 0 || yk >= p.k) continue;
                const elem_t *row = (const elem_t *)p.b + yk * p.ldb + n0;
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"((unsigned)(cols * 2))
                             : "memory");
            }
        }
    } else {
        (void)p, (void)m0, (void)n0, (void)lane;
    }
}

extern "C" __global__ void FLCE_KERNEL_BOUNDS FLCE_GRAD_ENTRY(FLCE_PARAM p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = tile_smem(smem_raw);
#if FLCE_CLUSTER
    // Launched in clusters of 2 along x (runtime/launch.c), gridDim.x even and at most twice the
    // clusters that fit at once (runtime/tma.c): cluster c walks pair tiles c, c + clusters, …, so
    // both of its CTAs make the same number of passes, also where the row blocks are odd in number
    // (the last pair row's second tile is a dummy: its CTA loads the first tile's A rows to keep the
    // B multicast and both CTAs' barriers going, multiplies, and stores nothing).
    const long long tiles_n = (p.n + BN - 1) / BN, tiles_m = (p.m + BM - 1) / BM;
    const long long pair_rows = (tiles_m + 1) / 2, pairs = pair_rows * tiles_n;
    const long long cluster = cluster_index(), clusters = cluster_count();
    const unsigned rank = cluster_ctarank();
    int it = 0;
    pipe_init(smem);
    if (threadIdx.x < PRODUCER_THREADS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (long long q = cluster; q < pairs; q += clusters) {
                long long pr, n0;
                pair_origin(p, q, pair_rows, tiles_n, pr, n0);
                const long long rb = 2 * pr + rank; // this CTA's row block
                produce_pair(p, smem, (rb < tiles_m ? rb : 2 * pr) * BM, n0, rank, it);
            }
            drain_pair(smem, it); // this CTA stays until the peer is done arriving on its barriers
        }
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
    const int warp = (threadIdx.x - PRODUCER_THREADS) / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const float scale = grad_scale(p);
    float acc[MI][NI][4];
    for (long long q = cluster; q < pairs; q += clusters) {
        long long pr, n0;
        pair_origin(p, q, pair_rows, tiles_n, pr, n0);
        const long long rb = 2 * pr + rank;
        mainloop(acc, smem, p, it, wm / 4);
        if (rb < tiles_m) grad_epilogue(acc, p, rb * BM, n0, wm, wn, lane, scale, smem, p.out);
    }
    bulk_drain(lane);
#else
#if FLCE_TMA
    const long long tiles_n = (p.n + BN - 1) / BN, tiles_m = (p.m + BM - 1) / BM, tiles = tiles_n * tiles_m;
    // the static walk's units: the tiles, times the splits of k (never with the tile counter)
    const long long units = p.k_splits > 1 ? tiles * p.k_splits : tiles;
    int it = 0;
    pipe_init(smem);
    if (threadIdx.x < PRODUCER_THREADS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        // Warp 0: its lane 0 issues the loads; the whole warp walks the tiles with it for
        // prefetch_labels, one tile at a time (the __syncwarp waits for lane 0's produce).
        const int lane0 = threadIdx.x % 32;
#if FLCE_TCGEN05 // (none on the Blackwell path; generator/emit.c resolves only this form)
#else
        if (threadIdx.x < 32 && p.tile_counter) {
            // Dynamic order: this CTA's first tile is its number (below counter_base), the others
            // come from the counter (tiles counter_base, counter_base + 1, … in the order CTAs ask),
            // each computed by one CTA with the same k order as in the static walk: the same bits
            // either way, and with any number of launches sharing the counter (params.h).
            unsigned long long *counter = (unsigned long long *)p.tile_counter;
            const long long me = p.block0 + (long long)blockIdx.x;
            for (int i = 0;; i++) {
                long long t = 0;
                if (lane0 == 0) t = i == 0 && me < p.counter_base ? me : p.counter_base + (long long)atomicAdd(counter, 1ull);
                t = __shfl_sync(0xffffffffu, t, 0);
                long long *slot = tile_slot(smem); // tile i's number; each consumer thread reads it once
                if (t >= tiles) {
                    if (lane0 == 0) wait_tile_taken(smem, i), announce_end(smem, slot, it);
                    break;
                }
                long long m0, n0;
                tile_origin(p, t, tiles_m, tiles_n, m0, n0);
                prefetch_labels(p, m0, n0, lane0);
                if (lane0 == 0) {
                    wait_tile_taken(smem, i); // every consumer thread has read tile i - 1's number
                    produce(p, smem, m0, n0, 1, it, slot, t);
                }
                __syncwarp();
            }
        } else
#endif
        if (threadIdx.x < 32)
            for (long long u = blockIdx.x; u < units; u += gridDim.x) {
                long long m0, n0, kb, kn;
                unsigned long long out;
                unit_origin(p, u, tiles, tiles_m, tiles_n, m0, n0, kb, kn, out);
                prefetch_labels(p, m0, n0, lane0);
                if (lane0 == 0) {
                    produce(p, smem, m0, n0, 1, it, nullptr, 0, kb, kn);
                }
                __syncwarp();
            }
#if FLCE_TCGEN05
        if (threadIdx.x / 32 == 1) // warp 1: the MMAs of this CTA's tiles, then dealloc
            mma_tiles(p, smem, tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0);
#endif
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
#endif
    const int warp = (threadIdx.x - PRODUCER_THREADS) / 32, lane = threadIdx.x % 32;
#if FLCE_TCGEN05
    const int wm = tc_row_block(warp), wn = 0;
#else
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
#endif
    const float scale = grad_scale(p);
    float acc[MI][NI][4];
#if FLCE_TMA
#if FLCE_TCGEN05 // (none on the Blackwell path; generator/emit.c resolves only this form)
    const bool dynamic = false;
#else
    const bool dynamic = p.tile_counter != 0; // uniform: the producer's order, tile numbers from its slot
#endif
    // One call site for the main loop and one for the epilogue, whichever order the tiles come in:
    // each is inlined, and two copies of them (dynamic and static order) made this kernel 2x the
    // code and its NVRTC compile the longest of a call's first compiles (issue 16).
    for (int i = 0;; i++) {
        long long t = blockIdx.x + (long long)i * gridDim.x, m0 = 0, n0 = 0, kb = 0, kn = -1;
        unsigned long long out = p.out;
        if (!dynamic) {
            if (t >= units) break;
            unit_origin(p, t, tiles, tiles_m, tiles_n, m0, n0, kb, kn, out);
        }
#if FLCE_TCGEN05
        mainloop(acc, smem, p, it, wm / 4);
#else
        if (!mainloop(acc, smem, p, it, wm / 4, dynamic ? tile_slot(smem) : nullptr, &t, kn)) break;
#endif
        (void)kb;
        if (dynamic) tile_origin(p, t, tiles_m, tiles_n, m0, n0);
        grad_epilogue(acc, p, m0, n0, wm, wn, lane, scale, smem, out);
    }
    bulk_drain(lane);
#else
    const long long n0 = (long long)blockIdx.x * BN, m0 = (long long)blockIdx.y * BM;
    mainloop(acc, smem, p, m0, n0, wm, wn, lane);
    grad_epilogue(acc, p, m0, n0, wm, wn, lane, scale, smem, p.out);
#endif
#endif // FLCE_CLUSTER
}
#endif // ROLE_IS_LOGITS
