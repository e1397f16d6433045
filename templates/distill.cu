// distill.cu — the row kernels of the distillation call (issue 44 item 1, runtime/distill.c). The
// GEMMs are the CE path's tuned ones (runtime/distill.c runs them: each model's logits at the
// temperature, z/T, stored in fp32 with the per-(row, vocab split) max and Σ exp(z/T − max) of the
// statistics epilogue; then dH and dW from the dZs these kernels write). On one token chunk's
// logits of the student (zs) and the teacher (zt), rows × V at row stride ld:
//   flce_distill_count   the count of valid tokens (the mean's denominator), one CTA, fixed order
//   flce_distill_row     one CTA per row: both log-normalizers from the splits' statistics, D_i,
//                        loss_i, and dZs (the gradient w.r.t. the raw logits) in the dtype at dz
//                        (row stride ld; for fp32 dz may be zs: in place). Forward KL reads each
//                        row once; reverse KL and JSD twice (their dZ needs the row's sum first)
//   flce_distill_reduce  loss = Σ_i loss_i (· 1/count for the mean), one CTA, fixed order
// With q = softmax(zs/T) (student), p = softmax(zt/T) (teacher), log-probabilities formed from the
// logits (never log of an underflowed probability), and 0·anything = 0 where a weight is 0:
//   forward KL  D = Σ p (log p − log q)               dz = (q − p)/T
//   reverse KL  D = Σ q (log q − log p)               dz = q (log q − log p − D)/T
//   JSD(β)      D = β KL(p‖m) + (1−β) KL(q‖m),        dz = (1−β) q (log q − log m − KL(q‖m))/T,
//               m = β p + (1−β) q, log m = logaddexp(log β + log p, log(1−β) + log q)
//               (β = 0 and 1 are the KLs: the generator passes DISTILL_DIV 0 or 1 then)
//   CE (T = 1)  loss += w·(lse(zs) − zs_y)               dz += w·(q − 1[j = y])
//   dZs_ij = g_i · dz_j,  g_i = grad_output (1 value; · 1/count for the mean) or grad_output_i (none)
// A token is valid when there are no labels, or its label is not ignore_index and lies in [0, V);
// an invalid one gets D_i = loss_i = 0 and a zero dZs row, and its teacher row is never read. A label
// outside [0, V) that is not ignore_index also raises the context's flag (flce_count), as the CE
// call's labels do: the next call or flce_check reports FLCE_ERR_BAD_LABEL, never a silent mask.
// Everything is per row in fp32: a NaN in one token's row stays in that row (and in the sums over
// rows: the mean/sum loss, dWs), as testing/ref.c ref_distill does. The reference it is checked
// against is ref_distill_row (tests/test_distill.c).
#ifndef FLCE_GENERATED
#define FLCE_DTYPE 2        // 0 f32, 1 f16, 2 bf16
#define DISTILL_DIV 0       // 0 forward KL, 1 reverse KL, 2 JSD
#define DISTILL_LABELS 1    // labels given
#define FLCE_LABEL_BITS 32
#define FLCE_REDUCTION 0    // 0 mean, 1 sum, 2 none
constexpr float DISTILL_BETA = 0.5f, INV_TEMP = 1.f, CE_WEIGHT = 0.f;
#endif

#define DISTILL_NEG_INF __int_as_float(0xff800000) // −inf without <math.h> (NVRTC)

constexpr int DISTILL_THREADS = 256; // one CTA per row; 8 warps keep a 128k-wide row's loads in flight

struct flce_distill_params {
    const float *zs;          // rows × ld: the student's fp32 logits at T (zs/T)
    const float *zt;          // rows × ld: the teacher's fp32 logits at T (zt/T)
    void *dz;                 // rows × ld: dZs out in the dtype (fp32: may be zs, written in place)
    const float *part_ms, *part_ss; // rows × splits_s: the student's per-split max and Σ exp(· − max)
    const float *part_mt, *part_st; // rows × splits_t: the teacher's
    const void *labels;       // tokens labels (int32 or int64), NULL without labels
    const float *grad_output; // 1 value (mean, sum) or tokens (none); NULL = 1
    float *divergence;        // tokens: D_i out (may be NULL)
    float *loss_rows;         // tokens: loss_i out (workspace; reduce reads it)
    float *loss;              // 1 value (mean, sum) or tokens (none); may be NULL
    float *count;             // 1 value: the count of valid tokens (count writes, row/reduce read)
    long long row0;           // the chunk's first token
    long long rows;           // tokens in the chunk
    long long tokens;         // N
    long long vocab;          // V
    long long ignore_index;
    long long ld;             // row stride of zs, zt and dz (elements)
    int splits_s, splits_t;   // vocab splits of the two logits passes
    int *flag;                // the context's device flag: [0] = 1 on a label outside [0, V); may be NULL
    // The compact forward-KL path (flce_distill_lse, flce_distill_row_compact; 16-bit): zs and dz
    // are then the student's fp16 p̃ = exp(zs/T − m)·2^15 and dZs in its place, zt unused.
    const unsigned short *pt; // rows × ld: the teacher's fp16 p̃
    const float *tile_ms, *tile_mt; // rows × ld_tile: the two passes' m per column group
    const float *part_xs;     // rows × splits_s: Σ p̂_j·zs_j/T, the student pass's soft-target sums
    const float *target_s;    // rows: the student's label logit (the CE term)
    float *lse_t;             // rows: the teacher's lse at T (flce_distill_lse writes it)
    long long ld_tile;        // row stride of tile_ms and tile_mt
    int tile_cols;            // columns per group
    // The teacher as top-k (flce_distill_row_topk; problem.teacher_topk): tokens × topk ids and
    // log-probabilities, the fp32 path's student logits in zs
    const long long *tk_idx;
    const float *tk_lp;
    int topk;
    // The top-k teacher's compact path: each row's ids sorted with their probabilities, the
    // student pass's sparse target (flce_distill_topk_sort writes, rows × DISTILL_TOPK_MAX)
    int *sp_ids;
    float *sp_p;
    long long vocab_total;    // labels lie in [0, vocab_total): V, or the global vocab under TP
    // Tensor parallelism (the compact path; flce_distill_tp_*): NULL without it
    float *lse_s_rows;        // rows: the student's global lse (tp_merge writes, the row kernel reads)
    float *x_rows;            // rows: the global soft-target sum x_i
    float *tp_aw;             // rows × 2: this shard's (Σ p̂ log p̂, Σ p̂), summed over the ranks
    void *tp_send;            // this rank's block of the all-gather (DISTILL_TP_* words)
    const void *tp_recv;      // every rank's block, rank order
    long long vocab_offset;   // this shard's first global id
    int tp_size;
    int tp_sums;              // the fp32 path's first read under TP: flce_distill_row writes the shard's sums
};

__device__ __forceinline__ long long distill_label(const flce_distill_params &p, long long i)
{
#if FLCE_LABEL_BITS == 64
    return ((const long long *)p.labels)[i];
#else
    return ((const int *)p.labels)[i];
#endif
}

__device__ __forceinline__ bool distill_valid(const flce_distill_params &p, long long i)
{
    if constexpr (DISTILL_LABELS) {
        const long long y = distill_label(p, i);
        return y != p.ignore_index && y >= 0 && y < p.vocab_total;
    }
    return true;
}

// Sum over the CTA in a fixed order (warp shuffles, then warp 0 over the warps' sums): every thread
// gets the total. `scratch` holds DISTILL_THREADS/32 floats.
__device__ __forceinline__ float distill_block_sum(float v, float *scratch)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); // scratch may still be read by a previous call
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < DISTILL_THREADS / 32; w++) s += scratch[w];
    return s;
}

// Online (max, Σ exp(x − max)) pairs: merging keeps the sum exact to fp32 rounding whatever the
// order, and a NaN anywhere makes the pair NaN (fmaxf would drop it, so it is carried by hand).
struct distill_ms {
    float m, s;
};

__device__ __forceinline__ distill_ms distill_ms_add(distill_ms a, float x)
{
    if (x != x) return {x, x};
    if (x == DISTILL_NEG_INF) return a; // exp(−inf − (−inf)) would be NaN
    if (x <= a.m) return {a.m, a.s + __expf(x - a.m)};
    return {x, a.s * __expf(a.m - x) + 1.f};
}

__device__ __forceinline__ distill_ms distill_ms_merge(distill_ms a, distill_ms b)
{
    if (a.m != a.m || b.m != b.m) return {a.m + b.m, a.s + b.s}; // NaN in, NaN out
    if (b.s == 0.f) return a;
    if (a.s == 0.f) return b;
    float m = fmaxf(a.m, b.m);
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ distill_ms distill_block_ms(distill_ms v, float *scratch_m, float *scratch_s)
{
    for (int o = 16; o > 0; o >>= 1) {
        distill_ms w = {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = distill_ms_merge(v, w);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch_m[threadIdx.x >> 5] = v.m, scratch_s[threadIdx.x >> 5] = v.s;
    __syncthreads();
    distill_ms r = {DISTILL_NEG_INF, 0.f};
    for (int w = 0; w < DISTILL_THREADS / 32; w++) r = distill_ms_merge(r, {scratch_m[w], scratch_s[w]});
    return r;
}

// a·(la − lb), 0 where a is 0 (so that −inf − −inf or a NaN log of a zero weight does not count)
__device__ __forceinline__ float distill_xlog(float a, float la, float lb) { return a == 0.f ? 0.f : a * (la - lb); }

#if DISTILL_DIV == 2
// JSD's two log-ratios against the mixture, lp − log m and lq − log m (m = βp + (1−β)q), from the
// difference δ = lq − lp alone: with δ ≤ 0, lp − log m = −log(β + (1−β)e^δ), and lq − log m is that
// plus δ; with δ > 0 the same with the roles swapped. One exp of −|δ| and one log of a number in
// [min(β, 1−β), 1]: the hardware approximations (ex2, lg2), ~1e-6 absolute here, where forming
// log m ≈ −12 first and subtracting lost as much to rounding and took a software log1p per column
// (the fp32 path's JSD row kernel ran 1.7× as long as reverse KL's, bench/NOTES.md session 30).
// A side whose probability is 0 gets −inf; a NaN of either stays (δ NaN).
__device__ __forceinline__ void distill_jsd_logs(float lp, float lq, float &lpm, float &lqm)
{
    const float dl = lq - lp;
    const bool qlow = dl <= 0.f;
    const float e = __expf(-fabsf(dl));
    const float l = -__logf(qlow ? DISTILL_BETA + (1.f - DISTILL_BETA) * e : (1.f - DISTILL_BETA) + DISTILL_BETA * e);
    lpm = qlow ? l : l - dl;
    lqm = qlow ? l + dl : l;
}
// a·l, 0 where the weight a is 0 (whatever l is)
__device__ __forceinline__ float distill_wlog(float a, float l) { return a == 0.f ? 0.f : a * l; }
#endif

// g_i of the header for a valid token
__device__ __forceinline__ float distill_scale(const flce_distill_params &p, long long i)
{
#if FLCE_REDUCTION == 2
    return p.grad_output ? p.grad_output[i] : 1.f;
#else
    float g = p.grad_output ? p.grad_output[0] : 1.f;
#if FLCE_REDUCTION == 0
    g = *p.count > 0.f ? g / *p.count : 0.f;
#endif
    (void)i;
    return g;
#endif
}

#if FLCE_DTYPE != 0 // (PTX conversions: the host emulation, tests/distill_emu, is fp32)
// v in the 16-bit dtype's bits, rounded once
__device__ __forceinline__ unsigned short distill_to16(float v)
{
    unsigned short h;
    if constexpr (FLCE_DTYPE == 1) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
#endif

// dZs in the dtype (16-bit: rounded once from fp32), as the dH/dW GEMMs read it
__device__ __forceinline__ void distill_store(void *p, long long i, float v)
{
#if FLCE_DTYPE == 0
    ((float *)p)[i] = v;
#else
    ((unsigned short *)p)[i] = distill_to16(v);
#endif
}

// A row's outputs, by thread 0: D_i, loss_i for the reduce, and loss_i itself under reduction none
__device__ __forceinline__ void distill_row_out(const flce_distill_params &p, long long i, float d, float loss)
{
    if (threadIdx.x == 0) {
        if (p.divergence) p.divergence[i] = d;
        p.loss_rows[i] = loss;
        if constexpr (FLCE_REDUCTION == 2) {
            if (p.loss) p.loss[i] = loss;
        }
    }
}

// A row of dZs (in the dtype, row stride ld) zero from column j0 to ld: the padding dH's loads read
// (times the weight's absent rows, TMA's zeros) must be a number, not whatever the workspace held;
// from 0, a masked token's whole row
__device__ __forceinline__ void distill_zero_row(void *dz, long long j0, long long ld)
{
    for (long long j = j0 + threadIdx.x; j < ld; j += DISTILL_THREADS) distill_store(dz, j, 0.f);
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_count(const flce_distill_params p)
{
    __shared__ float scratch[DISTILL_THREADS / 32];
    float c = 0.f;
    for (long long i = threadIdx.x; i < p.tokens; i += DISTILL_THREADS) {
        const bool valid = distill_valid(p, i);
        c += valid ? 1.f : 0.f;
        // same value from every writer: no atomic needed
        if constexpr (DISTILL_LABELS)
            if (!valid && p.flag && distill_label(p, i) != p.ignore_index) *(volatile int *)p.flag = 1;
    }
    c = distill_block_sum(c, scratch);
    if (threadIdx.x == 0) *p.count = c;
}

// The log-normalizer of one row from its splits' (max, Σ exp) pairs, every thread the same value
__device__ __forceinline__ float distill_lse(const float *part_m, const float *part_s, int splits, float *scratch_a,
                                             float *scratch_b)
{
    distill_ms a = {DISTILL_NEG_INF, 0.f};
    for (int k = threadIdx.x; k < splits; k += DISTILL_THREADS) a = distill_ms_merge(a, {part_m[k], part_s[k]});
    a = distill_block_ms(a, scratch_a, scratch_b);
    return a.m + logf(a.s);
}

// The start of a row on the fp32 logits paths (flce_distill_row, flce_distill_row_topk): its
// pointers; a masked token's dZs row zeroed and its outputs 0, or under TP's first read (tp_sums)
// its row sums 0 (false: the kernel returns); else the
// row's padding zeroed, the student's lse at T from its splits, and the CE term at temperature 1
// (CE_WEIGHT != 0 only with T = 1: zs is the raw logit, lse_s its normalizer), whose zs[y] is read
// here, before any thread of the row may overwrite zs (dz may be zs: fp32)
struct distill_row_start {
    const float *zs;
    void *dz;
    float lse_s, loss;
    long long y;
};

__device__ __forceinline__ bool distill_row_begin(const flce_distill_params &p, float *scratch_a, float *scratch_b,
                                                  distill_row_start &s)
{
    const long long r = blockIdx.x, i = p.row0 + r;
    s.zs = p.zs + r * p.ld;
    s.dz = (char *)p.dz + r * p.ld * (FLCE_DTYPE == 0 ? 4 : 2);
    if (!distill_valid(p, i)) {
        if (!p.tp_sums) { // (TP's first read writes only its sums, 0 here: the second writes the row)
            distill_zero_row(s.dz, 0, p.ld);
            distill_row_out(p, i, 0.f, 0.f);
        } else if (p.tp_size > 1 && threadIdx.x == 0) {
            p.tp_aw[2 * r] = 0.f, p.tp_aw[2 * r + 1] = 0.f;
        }
        return false;
    }
    if (!p.tp_sums) distill_zero_row(s.dz, p.vocab, p.ld);
    s.loss = 0.f, s.y = -1;
    if (p.tp_size > 1) { // TP: the global lse and the label's logit from whichever shard holds it (tp_merge)
        s.lse_s = p.lse_s_rows[r];
        if constexpr (DISTILL_LABELS) {
            s.y = distill_label(p, i) - p.vocab_offset; // the label's column in this shard, if any
            if (CE_WEIGHT != 0.f) s.loss = CE_WEIGHT * (s.lse_s - p.target_s[r]);
        }
        return true;
    }
    s.lse_s = distill_lse(p.part_ms + r * p.splits_s, p.part_ss + r * p.splits_s, p.splits_s, scratch_a, scratch_b);
    if constexpr (DISTILL_LABELS) {
        s.y = distill_label(p, i);
        if (CE_WEIGHT != 0.f) s.loss = CE_WEIGHT * (s.lse_s - s.zs[s.y]);
    }
    return true;
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_row(const flce_distill_params p)
{
    __shared__ float scratch_a[DISTILL_THREADS / 32], scratch_b[DISTILL_THREADS / 32];
    const long long r = blockIdx.x, i = p.row0 + r, v = p.vocab;
    const bool tp = p.tp_size > 1; // (the same for the whole grid: the block sums below stay uniform)
    distill_row_start s;
    if (!distill_row_begin(p, scratch_a, scratch_b, s)) return;
    const float *zs = s.zs, *zt = p.zt + r * p.ld;
    void *dz = s.dz;
    // 1. both log-normalizers at temperature T: the logits passes' statistics (lse_s: begin), or under
    // TP the ranks' merged ones (flce_distill_tp_merge)
    const float lse_s = s.lse_s;
    const float lse_t = tp ? p.lse_t[r]
                           : distill_lse(p.part_mt + r * p.splits_t, p.part_st + r * p.splits_t, p.splits_t, scratch_a,
                                         scratch_b);
    float loss = s.loss;
    const long long y = s.y; // −1 without labels (CE_WEIGHT is 0 then: emit_distill_source)
    __syncthreads();
    const float g = distill_scale(p, i);
    float d = 0.f;
#if DISTILL_DIV == 0
    if (tp && p.tp_sums) { // TP, first read: the shard's part of D, which the ranks add
        for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
            const float lq = zs[j] - lse_s, lp = zt[j] - lse_t;
            d += distill_xlog(__expf(lp), lp, lq);
        }
        d = distill_block_sum(d, scratch_a);
        if (threadIdx.x == 0) p.tp_aw[2 * r] = d, p.tp_aw[2 * r + 1] = 0.f;
        return;
    }
    // 2. forward KL: D and dZs in one pass (its dZ needs no row sum)
    for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
        const float lq = zs[j] - lse_s, lp = zt[j] - lse_t, q = __expf(lq), pj = __expf(lp);
        d += distill_xlog(pj, lp, lq);
        float dzj = (q - pj) * INV_TEMP;
        if (CE_WEIGHT != 0.f) dzj += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
        distill_store(dz, j, g * dzj);
    }
    d = tp ? p.tp_aw[2 * r] : distill_block_sum(d, scratch_a); // (TP: every shard's, summed)
#else
    // 2. the divergence (and JSD's KL(q‖m), which its gradient needs); under TP the first read
    // (tp_sums) writes the shard's parts, and the second takes the ranks' sums of them
    float kq = 0.f;
    if (!tp || p.tp_sums) {
        for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
            const float lq = zs[j] - lse_s, lp = zt[j] - lse_t;
#if DISTILL_DIV == 1
            d += distill_xlog(__expf(lq), lq, lp);
#else
            float lpm, lqm;
            distill_jsd_logs(lp, lq, lpm, lqm);
            d += DISTILL_BETA * distill_wlog(__expf(lp), lpm);
            kq += distill_wlog(__expf(lq), lqm);
#endif
        }
        d = distill_block_sum(d, scratch_a);
#if DISTILL_DIV == 2
        kq = distill_block_sum(kq, scratch_b);
#endif
        if (tp) {
            if (threadIdx.x == 0) p.tp_aw[2 * r] = d, p.tp_aw[2 * r + 1] = kq;
            return;
        }
    } else {
        d = p.tp_aw[2 * r], kq = p.tp_aw[2 * r + 1];
    }
#if DISTILL_DIV == 2
    d += (1.f - DISTILL_BETA) * kq;
#endif
    // 3. dZs
    for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
        const float lq = zs[j] - lse_s, q = __expf(lq), lp = zt[j] - lse_t;
#if DISTILL_DIV == 1
        float dzj = q == 0.f ? 0.f : q * (lq - lp - d) * INV_TEMP;
#else
        float lpm, lqm;
        distill_jsd_logs(lp, lq, lpm, lqm);
        (void)lpm;
        float dzj = q == 0.f ? 0.f : (1.f - DISTILL_BETA) * q * (lqm - kq) * INV_TEMP;
#endif
        if (CE_WEIGHT != 0.f) dzj += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
        distill_store(dz, j, g * dzj);
    }
#endif
    distill_row_out(p, i, d, loss + d);
}

// The teacher as top-k (problem.teacher_topk = k): each token's k (id, log p) pairs K given, no
// teacher GEMM; the student's fp32 logits at T as on the fp32 path. Forward KL over K:
//   D_i = Σ_{j∈K} p_j (log p_j − log q_j),   dZs_ij = g_i·(q_j·P_K − p_j·1[j∈K])/T (+ CE),  P_K = Σ_K p
// Ids out of [0, V) or repeated within a token make its D, loss and dZs row NaN (a wrong gradient
// would otherwise be silent). The k entries' log q are read before the row's dZs overwrite zs (fp32).
// Under TP (the fp32 path's two reads, flce_distill_row): ids are global, each shard sums D over the
// ids it holds (first read), P_K is every id's (the list is every rank's), the second read takes D.
constexpr int DISTILL_TOPK_MAX = 64;

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_row_topk(const flce_distill_params p)
{
    __shared__ float scratch_a[DISTILL_THREADS / 32], scratch_b[DISTILL_THREADS / 32];
    __shared__ long long kid[DISTILL_TOPK_MAX];
    __shared__ float kp[DISTILL_TOPK_MAX], klq[DISTILL_TOPK_MAX];
    const long long r = blockIdx.x, i = p.row0 + r, v = p.vocab;
    distill_row_start s;
    if (!distill_row_begin(p, scratch_a, scratch_b, s)) return;
    const float *zs = s.zs, lse_s = s.lse_s;
    void *dz = s.dz;
    float loss = s.loss;
    const long long y = s.y; // −1 without labels (CE_WEIGHT is 0 then: emit_distill_source)
    const int k = p.topk, t = (int)threadIdx.x;
    const bool tp = p.tp_size > 1; // (ids global: this shard's columns are [vocab_offset, + v))
    float dpart = 0.f, ppart = 0.f, badpart = 0.f;
    if (t < k) {
        const long long id = p.tk_idx[i * k + t], col = id - (tp ? p.vocab_offset : 0);
        const float lp = p.tk_lp[i * k + t];
        bool ok = id >= 0 && id < p.vocab_total;
        for (int u = 0; u < k; u++) ok = ok && (u == t || p.tk_idx[i * k + u] != id);
        const bool mine = ok && col >= 0 && col < v;
        const float lq = mine ? zs[col] - lse_s : 0.f, pj = __expf(lp);
        kid[t] = mine ? col : -1, kp[t] = pj, klq[t] = lq;
        dpart = mine ? distill_xlog(pj, lp, lq) : 0.f, ppart = pj, badpart = ok ? 0.f : 1.f;
    }
    float d = distill_block_sum(dpart, scratch_a); // (its barriers also publish kid, kp, klq)
    const float pk = distill_block_sum(ppart, scratch_b);
    const float bad = distill_block_sum(badpart, scratch_a);
    const float nan = __int_as_float(0x7fc00000);
    if (tp) { // the shard's part of D (first read), or every shard's (second)
        if (p.tp_sums) {
            if (threadIdx.x == 0) p.tp_aw[2 * r] = d, p.tp_aw[2 * r + 1] = 0.f;
            return;
        }
        d = p.tp_aw[2 * r];
    }
    if (bad != 0.f) d = nan;
    const float g = bad != 0.f ? nan : distill_scale(p, i);
    // every column as if outside K, then the k ids (each written once: the ids are distinct)
    for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
        const float q = __expf(zs[j] - lse_s);
        float dzj = q * pk * INV_TEMP;
        if (CE_WEIGHT != 0.f) dzj += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
        distill_store(dz, j, g * dzj);
    }
    __syncthreads();
    if (t < k && kid[t] >= 0) {
        const long long j = kid[t];
        const float q = __expf(klq[t]);
        float dzj = (q * pk - kp[t]) * INV_TEMP;
        if (CE_WEIGHT != 0.f) dzj += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
        distill_store(dz, j, g * dzj);
    }
    distill_row_out(p, i, d, loss + d);
}

// The compact forward-KL path (runtime/distill.c, 16-bit inputs): the teacher's logits pass stores
// fp16 p̃_t with its group maxima and (max, Σ exp) per split; flce_distill_lse merges those into
// lse_t; the student's pass (SPEC_OPT_SOFT) stores p̃_s and sums x_i = Σ_j p̂_j·zs_j/T against the
// teacher's probabilities as stored, p̂_j = p̃_t·2^-15·exp(m_t − lse_t); then, per row,
//   D_i = (Σ p̂ log p̂ − x_i − (Σ p̂ − 1))/Σ p̂ + lse_s   (Σ p (log p − log q), every p the stored p̂,
//         normalized: below)
//   dZs = g·(q − p̂)/T (+ CE),  q = p̃_s·2^-15·exp(m_s − lse_s),  written over p̃_s.
// Weighting all three sums by the same p̂ leaves fp16's rounding of p̃_t (2^-11 relative) only in
// the log-ratio term, not times the logits' size; a p̃_t that underflowed is a p below 2^-39 of its
// group's maximum, whose p·log p adds nothing. Nothing here takes a log of the student's p̃.
extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_lse(const flce_distill_params p)
{
    const long long r = (long long)blockIdx.x * DISTILL_THREADS + threadIdx.x;
    if (r >= p.rows) return;
    distill_ms a = {DISTILL_NEG_INF, 0.f};
    for (int k = 0; k < p.splits_t; k++)
        a = distill_ms_merge(a, {p.part_mt[r * p.splits_t + k], p.part_st[r * p.splits_t + k]});
    p.lse_t[r] = a.m + logf(a.s);
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_row_compact(const flce_distill_params p)
{
#if FLCE_DTYPE == 0
    (void)p; // fp32 inputs take the fp32 path (flce_distill_row)
#else
    __shared__ float scratch_a[DISTILL_THREADS / 32], scratch_b[DISTILL_THREADS / 32];
    const long long r = blockIdx.x, i = p.row0 + r, v = p.vocab;
    const unsigned short *ps = (const unsigned short *)p.zs + r * p.ld, *pt = p.pt + r * p.ld;
    unsigned short *dz = (unsigned short *)p.dz + r * p.ld; // may be ps: each thread reads its 8 first
    const float *tms = p.tile_ms + r * p.ld_tile, *tmt = p.tile_mt + r * p.ld_tile;
    const bool valid = distill_valid(p, i);
    float lse_s = 0.f, lse_t = 0.f, x = 0.f, loss = 0.f, g = 0.f;
    long long y = -1;
    if (valid) {
        if (p.tp_aw) { // TP: both lse's global (flce_distill_tp_merge), x not needed here
            lse_s = p.lse_s_rows[r];
        } else {
            lse_s = distill_lse(p.part_ms + r * p.splits_s, p.part_ss + r * p.splits_s, p.splits_s, scratch_a,
                                scratch_b);
            float xs = 0.f;
            for (int k = threadIdx.x; k < p.splits_s; k += DISTILL_THREADS) xs += p.part_xs[r * p.splits_s + k];
            x = distill_block_sum(xs, scratch_a);
        }
        lse_t = p.lse_t[r];
        g = distill_scale(p, i);
        if constexpr (DISTILL_LABELS) {
            // (TP: target_s is the label's logit from whichever shard holds it, flce_distill_tp_merge)
            y = distill_label(p, i) - p.vocab_offset; // the label's column in this shard (TP), if any
            if (CE_WEIGHT != 0.f) loss = CE_WEIGHT * (lse_s - p.target_s[r]);
        }
    }
    // 8 columns (16 bytes) per step; a group is a multiple of 8 columns wide, ld a multiple of 8
    float a = 0.f, w = 0.f;
    for (long long j0 = 8 * (long long)threadIdx.x; j0 < p.ld; j0 += 8 * DISTILL_THREADS) {
        uint4 out = {0u, 0u, 0u, 0u};
        if (valid) {
            const uint4 qs = *(const uint4 *)(ps + j0), qt = *(const uint4 *)(pt + j0);
            const long long grp = j0 / p.tile_cols;
            // 2^-15·exp(m − lse): the group's factor from p̃ to a probability (log2 units for p̂'s log)
            const float ls = (tms[grp] - lse_s) * 1.4426950408889634f - 15.f;
            const float lt = (tmt[grp] - lse_t) * 1.4426950408889634f - 15.f;
            const float fs = exp2f(ls), ft = exp2f(lt);
            const unsigned ws_[4] = {qs.x, qs.y, qs.z, qs.w}, wt_[4] = {qt.x, qt.y, qt.z, qt.w};
            unsigned o[4];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const long long j = j0 + e;
                float d = 0.f;
                if (j < v) {
                    float hs, ht;
                    asm("cvt.f32.f16 %0, %1;" : "=f"(hs) : "h"((unsigned short)(ws_[e / 2] >> (16 * (e % 2)))));
                    asm("cvt.f32.f16 %0, %1;" : "=f"(ht) : "h"((unsigned short)(wt_[e / 2] >> (16 * (e % 2)))));
                    const float q = hs * fs, pj = ht * ft;
                    if (ht > 0.f) {
                        float l2; // lg2.approx: within 2^-22 of log2, far below p̃'s fp16 step
                        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l2) : "f"(ht));
                        a += pj * ((l2 + lt) * 0.6931471805599453f);
                    }
                    w += pj;
                    d = (q - pj) * INV_TEMP;
                    if (CE_WEIGHT != 0.f) d += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
                    d *= g;
                }
                const unsigned short h = distill_to16(d);
                if (e % 2 == 0) o[e / 2] = h;
                else o[e / 2] |= (unsigned)h << 16;
            }
            out = make_uint4(o[0], o[1], o[2], o[3]);
        }
        *(uint4 *)(dz + j0) = out; // an invalid token's row, and the padding to ld, are zeros
    }
    if (!valid) {
        if (p.tp_aw) {
            if (threadIdx.x == 0) p.tp_aw[2 * r] = 0.f, p.tp_aw[2 * r + 1] = 0.f;
        } else {
            distill_row_out(p, i, 0.f, 0.f);
        }
        return;
    }
    a = distill_block_sum(a, scratch_a);
    w = distill_block_sum(w, scratch_b);
    if (p.tp_aw) { // TP: this shard's sums, which the ranks add before flce_distill_tp_out forms D
        if (threadIdx.x == 0) p.tp_aw[2 * r] = a, p.tp_aw[2 * r + 1] = w;
        return;
    }
    // Σ p̂ − 1 is fp16's rounding of the teacher's weights (Σ p = 1): taken out, and the rest
    // normalized by Σ p̂, D's error is Σ p ε (r_j − D), r the log-ratio, instead of Σ p ε (r_j + 1)
    // (a float64 simulation of python/test_distill.py's data: 4.7e-5 → 2.1e-5 relative)
    const float d = (a - x - (w - 1.f)) / w + lse_s;
    distill_row_out(p, i, d, loss + d);
#endif
}

// The teacher as top-k on 16-bit inputs (runtime/distill.c plan_topk_compact): the student's CE
// pass alone, with the compact store (fp16 p̃_s and group maxima, as flce_distill_row_compact reads
// them) and the sparse target (SPEC_OPT_SPARSE): its epilogue sums x_i = Σ_K p_j·zs_j/T over the
// exact fp32 logits at the ids, from the lists flce_distill_topk_sort makes. Then per row
//   D_i = Σ_K p log p − x_i + P_K·lse_s     (= Σ_K p (log p − log q), P_K = Σ_K p)
//   dZs = g·(P_K·q − p·1[K])/T (+ CE),  q from p̃_s (the CE path's own gradient), over p̃_s.
// A repeated or out-of-range id makes the token's D, loss and dZs row NaN, as flce_distill_row_topk.

// Each row's k (id, p = exp(log-prob)) pairs sorted by id into DISTILL_TOPK_MAX slots (ranks by
// counting; equal ids by position), ids clamped to [−1, 2^31 − 1] (monotone: the order stays, and a
// bad id lies in no column), the slots after k (all of a masked token's) ids past every column with
// weight 0
extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_topk_sort(const flce_distill_params p)
{
    __shared__ long long kid[DISTILL_TOPK_MAX];
    const long long r = blockIdx.x, i = p.row0 + r;
    const int k = p.topk, t = (int)threadIdx.x;
    const bool valid = distill_valid(p, i);
    if (valid && t < k) kid[t] = p.tk_idx[i * k + t];
    __syncthreads();
    if (t >= DISTILL_TOPK_MAX) return;
    int *ids = p.sp_ids + r * DISTILL_TOPK_MAX;
    float *w = p.sp_p + r * DISTILL_TOPK_MAX;
    if (valid && t < k) {
        // TP: the shard's ids, local; the others (weight 0) sorted last as padding (p.vocab_offset 0
        // and every id in range without TP: the order and clamp as before)
        const long long lo = p.vocab_offset, hi = p.vocab_offset + p.vocab;
        const bool here = p.tp_size <= 1 || (kid[t] >= lo && kid[t] < hi);
        const long long id = here ? kid[t] - lo : 0x7fffffffLL;
        int rank = 0;
        for (int u = 0; u < k; u++) {
            const long long o = p.tp_size <= 1 || (kid[u] >= lo && kid[u] < hi) ? kid[u] - lo : 0x7fffffffLL;
            rank += o < id || (o == id && u < t);
        }
        ids[rank] = (int)(id < -1 ? -1 : id > 0x7fffffffLL ? 0x7fffffffLL : id);
        w[rank] = here ? __expf(p.tk_lp[i * k + t]) : 0.f;
    } else if (!valid || t >= k) {
        ids[t] = 0x7fffffff, w[t] = 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_row_topk_compact(const flce_distill_params p)
{
#if FLCE_DTYPE == 0
    (void)p; // fp32 inputs take the fp32 path (flce_distill_row_topk)
#else
    __shared__ float scratch_a[DISTILL_THREADS / 32], scratch_b[DISTILL_THREADS / 32];
    __shared__ long long kid[DISTILL_TOPK_MAX];
    __shared__ float kp[DISTILL_TOPK_MAX], kq[DISTILL_TOPK_MAX];
    const long long r = blockIdx.x, i = p.row0 + r, v = p.vocab;
    const unsigned short *ps = (const unsigned short *)p.zs + r * p.ld;
    unsigned short *dz = (unsigned short *)p.dz + r * p.ld; // is ps: each thread reads its 8 first
    const float *tms = p.tile_ms + r * p.ld_tile;
    if (!distill_valid(p, i)) {
        for (long long j0 = 8 * (long long)threadIdx.x; j0 < p.ld; j0 += 8 * DISTILL_THREADS)
            *(uint4 *)(dz + j0) = make_uint4(0u, 0u, 0u, 0u);
        distill_row_out(p, i, 0.f, 0.f);
        return;
    }
    // TP: lse_s and x over every shard (flce_distill_tp_merge); D then needs nothing more of the others
    const float lse_s = p.lse_s_rows ? p.lse_s_rows[r]
                                     : distill_lse(p.part_ms + r * p.splits_s, p.part_ss + r * p.splits_s, p.splits_s,
                                                   scratch_a, scratch_b);
    float loss = 0.f;
    long long y = -1;
    if constexpr (DISTILL_LABELS) {
        y = distill_label(p, i) - p.vocab_offset; // the label's column in this shard (TP), if any
        if (CE_WEIGHT != 0.f) loss = CE_WEIGHT * (lse_s - p.target_s[r]);
    }
    float xs = 0.f;
    if (p.x_rows) xs = threadIdx.x == 0 ? p.x_rows[r] : 0.f;
    else
        for (int s = threadIdx.x; s < p.splits_s; s += DISTILL_THREADS) xs += p.part_xs[r * p.splits_s + s];
    const float x = distill_block_sum(xs, scratch_a);
    const int k = p.topk, t = (int)threadIdx.x;
    if (t < k) kid[t] = p.tk_idx[i * k + t];
    __syncthreads();
    bool ok = false;
    float apart = 0.f, ppart = 0.f;
    long long local = -1; // the id's column in this shard (TP: ids are global), or −1
    if (t < k) {
        const long long id = kid[t];
        ok = id >= 0 && id < p.vocab_total;
        for (int u = 0; u < k; u++) ok = ok && (u == t || kid[u] != id);
        const float lp = p.tk_lp[i * k + t], pj = __expf(lp);
        float q = 0.f; // the student's probability at the id, from p̃ before the row is overwritten
        if (ok && id - p.vocab_offset >= 0 && id - p.vocab_offset < v) {
            local = id - p.vocab_offset;
            float h;
            asm("cvt.f32.f16 %0, %1;" : "=f"(h) : "h"(ps[local]));
            q = h * exp2f((tms[local / p.tile_cols] - lse_s) * 1.4426950408889634f - 15.f);
        }
        kp[t] = pj, kq[t] = q;
        apart = distill_xlog(pj, lp, 0.f), ppart = pj;
    }
    const float bad = distill_block_sum(t < k && !ok ? 1.f : 0.f, scratch_a); // (its barriers: kid, kp, kq)
    if (t < k) kid[t] = local; // (read only below, after the row's barriers)
    const float a = distill_block_sum(apart, scratch_b);
    const float pk = distill_block_sum(ppart, scratch_a);
    const float nan = __int_as_float(0x7fc00000);
    const float d = bad != 0.f ? nan : a - x + pk * lse_s;
    const float g = bad != 0.f ? nan : distill_scale(p, i);
    // every column as if outside K (q from p̃_s), 8 columns (16 bytes) per step as
    // flce_distill_row_compact; then the k ids over them
    for (long long j0 = 8 * (long long)threadIdx.x; j0 < p.ld; j0 += 8 * DISTILL_THREADS) {
        const uint4 qs = *(const uint4 *)(ps + j0);
        const float fs = exp2f((tms[j0 / p.tile_cols] - lse_s) * 1.4426950408889634f - 15.f);
        const unsigned ws_[4] = {qs.x, qs.y, qs.z, qs.w};
        unsigned o[4];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const long long j = j0 + e;
            float dv = 0.f;
            if (j < v) {
                float hs;
                asm("cvt.f32.f16 %0, %1;" : "=f"(hs) : "h"((unsigned short)(ws_[e / 2] >> (16 * (e % 2)))));
                const float q = hs * fs;
                dv = q * pk * INV_TEMP;
                if (CE_WEIGHT != 0.f) dv += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
                dv *= g;
            }
            const unsigned short hv = distill_to16(dv);
            if (e % 2 == 0) o[e / 2] = hv;
            else o[e / 2] |= (unsigned)hv << 16;
        }
        *(uint4 *)(dz + j0) = make_uint4(o[0], o[1], o[2], o[3]); // and the padding to ld: zeros
    }
    __syncthreads();
    if (t < k && kid[t] >= 0) {
        const long long j = kid[t];
        const float q = kq[t];
        float dzj = (q * pk - kp[t]) * INV_TEMP;
        if (CE_WEIGHT != 0.f) dzj += CE_WEIGHT * (q - (j == y ? 1.f : 0.f));
        distill_store(dz, j, g * dzj);
    }
    distill_row_out(p, i, d, loss + d);
#endif
}

// ---- tensor parallelism (runtime/distill.c run_compact, run_all) --------------------------------------
// (The teacher as top-k: its ids are global; each rank's sort keeps its shard's, its pass sums x_r over
// them, the merge adds the x_r and merges lse_s; the row kernel then forms D itself, since Σ_K p log p
// and Σ_K p come from the given lists: no second collective.)
// Each rank holds a shard S_r of both weights' rows. Its passes give the shard's lse_s^r, lse_t^r
// and x_r = Σ_{S_r} p̂^r·zs/T, p̂^r the teacher's probabilities normalized on the shard alone (the
// student pass reads lse_t^r). Per token chunk:
//   flce_distill_tp_pack   a thread per row: (lse_s^r, lse_t^r, x_r, z_y or 0) after an 8-word header
//                          (int64 vocab_offset, shard size, vocab_total, tokens), written by thread 0
//                          (z_y: the CE term's label logit, from the shard that holds the label)
//   (all-gather over the ranks)
//   flce_distill_tp_merge  a thread per row, every rank the same bits (rank order, fp64): lse =
//                          log Σ_r exp(lse^r) for both models, x = Σ_r exp(lse_t^r − lse_t)·x_r; the
//                          headers checked (the CE path's flag bits: the next call reports them)
//   flce_distill_row_compact with tp_aw: dZs from the global lse's, and the shard's (a, w) =
//                          (Σ p̂ log p̂, Σ p̂), which an fp32 all-reduce sums
//   flce_distill_tp_out    a thread per row: D_i = (a − x − (w − 1))/w + lse_s, its outputs
// The fp32-logits path (reverse KL, JSD with β > 0, fp32 inputs; runtime/distill.c run_all) uses the
// same pack, all-gather and merge (x_r = 0: no soft-target sums; lse_t^r from flce_distill_lse), then
// reads each row twice: flce_distill_row with tp_sums writes the shard's parts of the divergence's
// row sums (D's, and JSD's KL(q‖m)), an fp32 all-reduce adds them, and flce_distill_row again forms
// dZs and the outputs from the global sums (forward KL too: its dZ needs none, but D is a sum over
// every shard).
constexpr int DISTILL_TP_RECORD = 4; // 32-bit words a row, after the header of FLCE_TP_HEADER words (params.h)

// Checks that the tp_size gathered blocks' headers (int64 vocab_offset, shard, vocab_total, tokens; a
// block every `words` 32-bit words) describe one vocab cut into consecutive shards in rank order, with
// this rank's vocab_total and token count (the CE path's tp_check_headers, rowops.cu); raises flag[1]'s
// FLCE_FLAG_TP_* bits otherwise, which the next call or flce_check reports. One thread, tp_size reads.
__device__ void distill_tp_check_headers(const float *gathered, long long words, int tp_size, long long vocab_total,
                                         long long tokens, int *flag)
{
    const long long *h0 = (const long long *)gathered;
    long long next = 0;
    int bad = 0;
    for (int r = 0; r < tp_size; r++) {
        const long long *h = (const long long *)(gathered + r * words);
        if (h[0] != next) bad |= FLCE_FLAG_TP_SHARDS;
        if (h[2] != h0[2] || h[2] != vocab_total) bad |= FLCE_FLAG_TP_TOTAL;
        if (h[3] != h0[3] || h[3] != tokens) bad |= FLCE_FLAG_TP_TOKENS;
        next = h[0] + h[1];
    }
    if (next != h0[2]) bad |= FLCE_FLAG_TP_SHARDS;
    if (bad && flag) ((volatile int *)flag)[1] |= bad;
}

__device__ __forceinline__ long long distill_tp_block_words(const flce_distill_params &p)
{
    return FLCE_TP_HEADER + p.rows * DISTILL_TP_RECORD;
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_tp_pack(const flce_distill_params p)
{
    const long long r = (long long)blockIdx.x * DISTILL_THREADS + threadIdx.x;
    if (r == 0) {
        long long *h = (long long *)p.tp_send;
        h[0] = p.vocab_offset, h[1] = p.vocab, h[2] = p.vocab_total, h[3] = p.tokens;
    }
    if (r >= p.rows) return;
    distill_ms a = {DISTILL_NEG_INF, 0.f};
    float x = 0.f;
    for (int k = 0; k < p.splits_s; k++) {
        a = distill_ms_merge(a, {p.part_ms[r * p.splits_s + k], p.part_ss[r * p.splits_s + k]});
        if (p.part_xs) x += p.part_xs[r * p.splits_s + k]; // (the fp32 path has no soft-target sums)
    }
    float target = 0.f; // the CE term's label logit where this shard holds the label (the pass wrote it)
    if constexpr (DISTILL_LABELS) {
        const long long y = distill_label(p, p.row0 + r) - p.vocab_offset;
        if (CE_WEIGHT != 0.f && y >= 0 && y < p.vocab) target = p.target_s[r];
    }
    float *rec = (float *)p.tp_send + FLCE_TP_HEADER + r * DISTILL_TP_RECORD;
    rec[0] = a.m + logf(a.s), rec[1] = p.lse_t ? p.lse_t[r] : 0.f, rec[2] = x, rec[3] = target; // (top-k: no lse_t)
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_tp_merge(const flce_distill_params p)
{
    const long long r = (long long)blockIdx.x * DISTILL_THREADS + threadIdx.x, words = distill_tp_block_words(p);
    if (r == 0) distill_tp_check_headers((const float *)p.tp_recv, words, p.tp_size, p.vocab_total, p.tokens, p.flag);
    if (r >= p.rows) return;
    const double neg_inf = (double)DISTILL_NEG_INF;
    double ms = neg_inf, mt = neg_inf, nan = 0.0;
    for (int k = 0; k < p.tp_size; k++) {
        const float *rec = (const float *)p.tp_recv + k * words + FLCE_TP_HEADER + r * DISTILL_TP_RECORD;
        const double ls = rec[0], lt = rec[1];
        if (ls != ls || lt != lt || rec[2] != rec[2]) nan = (double)__int_as_float(0x7fc00000); // fmax drops NaN
        ms = fmax(ms, ls), mt = fmax(mt, lt);
    }
    double ss = 0.0, st = 0.0;
    for (int k = 0; k < p.tp_size; k++) {
        const float *rec = (const float *)p.tp_recv + k * words + FLCE_TP_HEADER + r * DISTILL_TP_RECORD;
        ss += exp((double)rec[0] - ms), st += exp((double)rec[1] - mt);
    }
    const double lse_s = ms + log(ss) + nan, lse_t = mt + log(st) + nan;
    double x = 0.0; // (a top-k teacher's p is given: the shards' sums add as they are)
    for (int k = 0; k < p.tp_size; k++) {
        const float *rec = (const float *)p.tp_recv + k * words + FLCE_TP_HEADER + r * DISTILL_TP_RECORD;
        x += (p.topk ? 1.0 : exp((double)rec[1] - lse_t)) * (double)rec[2];
    }
    p.lse_s_rows[r] = (float)lse_s, p.x_rows[r] = (float)(x + nan);
    if (!p.topk) p.lse_t[r] = (float)lse_t;
    if (CE_WEIGHT != 0.f) { // the label's logit: one shard's, the others 0 (exact)
        float target = 0.f;
        for (int k = 0; k < p.tp_size; k++)
            target += ((const float *)p.tp_recv)[k * words + FLCE_TP_HEADER + r * DISTILL_TP_RECORD + 3];
        ((float *)p.target_s)[r] = target;
    }
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_tp_out(const flce_distill_params p)
{
    const long long r = (long long)blockIdx.x * DISTILL_THREADS + threadIdx.x, i = p.row0 + r;
    if (r >= p.rows) return;
    float d = 0.f, loss = 0.f;
    if (distill_valid(p, i)) {
        const float a = p.tp_aw[2 * r], w = p.tp_aw[2 * r + 1];
        d = (a - p.x_rows[r] - (w - 1.f)) / w + p.lse_s_rows[r];
        if (CE_WEIGHT != 0.f) loss = CE_WEIGHT * (p.lse_s_rows[r] - p.target_s[r]); // (T = 1: lse_s is CE's)
    }
    if (p.divergence) p.divergence[i] = d;
    p.loss_rows[i] = loss + d;
    if constexpr (FLCE_REDUCTION == 2) {
        if (p.loss) p.loss[i] = loss + d;
    }
}

// (reduction none: flce_distill_row wrote each loss_i; the runtime does not launch this one)
extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_distill_reduce(const flce_distill_params p)
{
#if FLCE_REDUCTION == 2
    (void)p;
#else
    __shared__ float scratch[DISTILL_THREADS / 32];
    float s = 0.f;
    for (long long i = threadIdx.x; i < p.tokens; i += DISTILL_THREADS) s += p.loss_rows[i];
    s = distill_block_sum(s, scratch);
#if FLCE_REDUCTION == 0
    s = *p.count > 0.f ? s / *p.count : 0.f;
#endif
    if (threadIdx.x == 0 && p.loss) *p.loss = s;
#endif
}

// ---- top-k log-probabilities (flce_topk_logprobs, runtime/topk.c) -----------------------------------
// One CTA per row of a token chunk's fp32 logits at T (z/T, as the CE logits pass stores them with
// its per-split statistics): the k largest, exact, ordered by logit (ties: the lower index first),
// with log p = z/T − lse, on an order-preserving key. Two reads of the row: each thread's largest
// key over its columns, whose k-th largest (over the CTA's 256) is a lower bound of the row's k-th
// largest (k distinct columns hold a key at or above it); then every column at or above that bound
// into shared memory (about −256·ln(1 − k/256) of them for a row of distinct values: 74 at k = 64),
// ranked there by counting. Where more than TOPK_CAND pass (rows of many equal logits), the radix
// selection over the whole row instead (4 rounds of an 8-bit digit histogram find the k-th largest
// key, one pass in index order takes the keys above it and the lowest-indexed equal ones). Then the
// k logits again in fp64 from the inputs (topk_row_out). A NaN logit (positive) ranks above +inf, as
// torch.topk puts NaN first; the row's lse is then NaN.
// Under tensor (vocab) parallelism (p.block set) the row kernel writes, instead of the outputs, this
// rank's block: the CE path's header of FLCE_TP_HEADER words (params.h: int64 vocab_offset, shard
// vocab, vocab_total, tokens), then per token topk_record_words(k) words: the shard's corrected lse
// (fp32), 0, the k logits (fp32 of the fp64 ones) and their int32 global ids, ordered by (logit
// descending, lower id first), the order flce_topk_merge reads them in.
constexpr int TOPK_MAX = 64;

struct flce_topk_params {
    const float *z;                // rows × ld: the chunk's logits at T
    const float *part_m, *part_s;  // rows × splits: the logits pass's max and Σ exp(· − max)
    const float *part_t;           // rows × splits: its Σ exp(· − max)·z/T (the entropy statistic)
    long long *indices;            // tokens × k out
    float *logprobs;               // tokens × k out
    float *lse;                    // tokens out (lse of z/T), or NULL
    long long row0, vocab, ld;
    int splits, k;
    const void *hidden, *weight;   // the inputs (tokens × dim, vocab × dim, the dtype): the k logits again
    long long dim;
    float temperature;             // T: the k logits are (h·w) / T in fp64
    // tensor parallelism
    float *block;                  // flce_topk_row: this rank's block instead of the outputs; else NULL
    const float *gathered;         // flce_topk_merge: tp_size blocks in rank order
    int *flag;                     // the context's flags: [1] gathers FLCE_FLAG_TP_* (params.h)
    long long vocab_offset, vocab_total, tokens;
    int tp_size;
};

// Words of one token's record in a block, and of a whole block.
__device__ __forceinline__ long long topk_record_words(int k) { return 2 + 2 * (long long)k; }
__device__ __forceinline__ long long topk_block_words(const flce_topk_params &p)
{
    return FLCE_TP_HEADER + p.tokens * topk_record_words(p.k);
}

// Where token i's record starts in a block (words): [0] lse, [1] 0, [2, 2 + k) logits, k int32 ids.
__device__ __forceinline__ long long topk_record_at(const flce_topk_params &p, long long i)
{
    return FLCE_TP_HEADER + i * topk_record_words(p.k);
}


// Larger float, larger key: the sign bit set for ≥ +0 (and +NaN), every bit flipped below.
__device__ __forceinline__ unsigned topk_key(float x)
{
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The exclusive prefix sum of one int per thread in thread order; *total the CTA's sum.
__device__ __forceinline__ int topk_scan(int v, int *scratch, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); // the previous call's readers are done with scratch
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < DISTILL_THREADS / 32; w++) {
        const int s = scratch[w];
        if (w < warp) before += s;
        all += s;
    }
    *total = all;
    return before + x - v;
}

// A 16-bit element in fp32 (exact)
__device__ __forceinline__ float topk_widen(unsigned short x)
{
#if FLCE_DTYPE == 1
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#else
    return __uint_as_float((unsigned)x << 16);
#endif
}

// An input element in fp32
__device__ __forceinline__ float topk_in(const void *base, long long at)
{
    if constexpr (FLCE_DTYPE == 0) return ((const float *)base)[at];
    else return topk_widen(((const unsigned short *)base)[at]);
}

// Candidate m ranks before candidate t: the larger key; on equal keys the larger fp64 logit (by_fp64:
// the outputs; a block carries fp32 logits, which the merge orders by id alone), then the lower id.
// A NaN fp64 logit compares neither way, so equal keys fall through to the ids.
__device__ __forceinline__ bool topk_before(unsigned km, double xm, long long im, unsigned kt, double xt,
                                            long long it, bool by_fp64)
{
    if (km != kt) return km > kt;
    if (by_fp64 && (xm > xt || xm < xt)) return xm > xt;
    return im < it;
}

// Under TP, by thread 0: token i's record's lse and pad word, and (token 0) the block's header.
__device__ __forceinline__ void topk_block_row(const flce_topk_params &p, long long i, float lse)
{
    if (i == 0) {
        long long *hdr = (long long *)p.block;
        hdr[0] = p.vocab_offset, hdr[1] = p.vocab, hdr[2] = p.vocab_total, hdr[3] = p.tokens;
    }
    float *rec = p.block + topk_record_at(p, i);
    rec[0] = lse, rec[1] = 0.f;
}

// The row's k taken (ids and the logits pass's z/T, in rank order) made exact and written: each
// logit again from the inputs in fp64 (products of 16-bit or fp32 values are exact in it; the logits
// pass's fp32 sum over D errs by ~1e-5 at D = 4096, which a log-prob carries whole), the row's lse
// corrected, the k ranked again by the exact logits (ties: the lower index). A logit the pass made
// ±inf or NaN is kept as it is.
// The lse's correction, over the pass's p'_j = exp(z'_j − lse') (Σ p' = 1): the k columns' own
// differences, Σ_K exp(z_j − lse') − p'_j; and the other columns' share of the pass's bias. On 16-bit
// inputs the wgmma sums run toward zero, z' = z·(1 − ε) with ε ≈ 4e-6 the same for a row's columns
// (bench/NOTES.md session 31, q2): left alone it put 1.4e-5 into every log-prob at logit std 4. The
// k pairs estimate it, ε̂ = −Σ_K (z'_j − z_j)·z_j / Σ_K z_j² (least squares through 0), and the other
// columns then add ε̂·Σ_{j∉K} p'_j z'_j = ε̂·(E_p'[z'] − Σ_K p'_j z'_j), E_p'[z'] the entropy statistic
// `ez` (not finite: the term is left out). Where the pass is not biased (fp32 inputs) ε̂ is noise of the
// pass's rounding and the term as small. Under TP each shard corrects its own lse so: the merge of
// the shards' lse is then the corrected one.
__device__ void topk_row_out(const flce_topk_params &p, long long i, const long long *sel_idx, const float *sel_z,
                             float lse, float ez)
{
    __shared__ double ex[TOPK_MAX];
    __shared__ double lse_x;
    const int t = (int)threadIdx.x, lane = t & 31;
    for (int u = t >> 5; u < p.k; u += DISTILL_THREADS / 32) {
        const long long id = sel_idx[u];
        double acc = 0.0;
        long long l0 = 0; // the columns a 16-byte load of both rows has covered
#if FLCE_DTYPE != 0
        const unsigned short *a = (const unsigned short *)p.hidden + i * p.dim,
                             *b = (const unsigned short *)p.weight + id * p.dim;
        if ((((unsigned long long)a | (unsigned long long)b) & 15) == 0) {
            l0 = p.dim / 8 * 8;
            for (long long l = 8 * lane; l < l0; l += 8 * 32) {
                const uint4 x = *(const uint4 *)(a + l), y = *(const uint4 *)(b + l);
                const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc = fma((double)topk_widen((unsigned short)(xs[e / 2] >> (16 * (e % 2)))),
                              (double)topk_widen((unsigned short)(ys[e / 2] >> (16 * (e % 2)))), acc);
            }
        }
#endif
        for (long long l = l0 + lane; l < p.dim; l += 32)
            acc = fma((double)topk_in(p.hidden, i * p.dim + l), (double)topk_in(p.weight, id * p.dim + l), acc);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) ex[u] = isfinite(sel_z[u]) ? acc / (double)p.temperature : (double)sel_z[u];
    }
    __syncthreads();
    if (t == 0) {
        double s = 1.0, zz = 0.0, dz = 0.0, pz = 0.0;
        for (int u = 0; u < p.k; u++)
            if (isfinite(sel_z[u]) && isfinite(ex[u])) {
                const double zp = (double)sel_z[u], pu = exp(zp - (double)lse);
                s += exp(ex[u] - (double)lse) - pu;
                zz += ex[u] * ex[u], dz += (zp - ex[u]) * ex[u], pz += pu * zp;
            }
        const double bias = zz > 0.0 ? -dz / zz * ((double)ez - pz) : 0.0;
        if (isfinite(bias)) s += bias;
        lse_x = (double)lse + log(s);
        if (p.block) topk_block_row(p, i, (float)lse_x);
        else if (p.lse) p.lse[i] = (float)lse_x;
    }
    __syncthreads();
    if (t < p.k) {
        const bool by_fp64 = p.block == nullptr;
        const unsigned key = topk_key((float)ex[t]);
        const long long idx = sel_idx[t];
        int rank = 0;
        for (int m = 0; m < p.k; m++)
            rank += topk_before(topk_key((float)ex[m]), ex[m], sel_idx[m], key, ex[t], idx, by_fp64);
        if (p.block) {
            float *rec = p.block + topk_record_at(p, i);
            rec[2 + rank] = (float)ex[t];
            ((int *)rec)[2 + p.k + rank] = (int)(idx + p.vocab_offset);
        } else {
            p.indices[i * p.k + rank] = idx;
            p.logprobs[i * p.k + rank] = (float)(ex[t] - lse_x);
        }
    }
}

// The radix selection over the whole row (the fallback of flce_topk_row): the k taken into sel_*.
__device__ void topk_row_radix(const flce_topk_params &p, const float *z, long long *sel_idx, float *sel_z)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned sel[2]; // the round's digit, and how many keys of that digit are still wanted
    __shared__ int scan_scratch[DISTILL_THREADS / 32];
    __shared__ unsigned cand_key[TOPK_MAX];
    __shared__ long long cand_idx[TOPK_MAX];
    __shared__ float cand_z[TOPK_MAX];
    const long long v = p.vocab;
    // 1. the k-th largest key, 8 bits a round from the top
    unsigned prefix = 0u, mask = 0u;
    int want = p.k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += DISTILL_THREADS) hist[b] = 0u;
        __syncthreads();
        for (long long j = threadIdx.x; j < v; j += DISTILL_THREADS) {
            const unsigned key = topk_key(z[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned above = 0u;
            int b = 255;
            for (; b > 0; b--) {
                if (above + hist[b] >= (unsigned)want) break;
                above += hist[b];
            }
            sel[0] = (unsigned)b, sel[1] = (unsigned)want - above;
        }
        __syncthreads();
        prefix |= sel[0] << shift, mask |= 255u << shift, want = (int)sel[1];
        __syncthreads(); // hist and sel are rewritten by the next round
    }
    // 2. in index order: every key above the k-th, and the first `want` equal to it
    const int greater = p.k - want;
    int gt_before = 0, eq_before = 0;
    for (long long base = 0; base < v; base += DISTILL_THREADS) {
        const long long j = base + threadIdx.x;
        const float zj = j < v ? z[j] : 0.f;
        const unsigned key = j < v ? topk_key(zj) : 0u;
        const int gt = j < v && key > prefix, eq = j < v && key == prefix;
        int gt_total = 0, eq_total = 0;
        const int gt_at = topk_scan(gt, scan_scratch, &gt_total);
        const int eq_at = topk_scan(eq, scan_scratch, &eq_total);
        int slot = -1;
        if (gt) slot = gt_before + gt_at;
        else if (eq && eq_before + eq_at < want) slot = greater + eq_before + eq_at;
        if (slot >= 0) cand_key[slot] = key, cand_idx[slot] = j, cand_z[slot] = zj;
        gt_before += gt_total, eq_before += eq_total; // the same in every thread: the exit is uniform
        if (gt_before >= greater && eq_before >= want) break;
    }
    __syncthreads();
    // 3. ranked by (logit descending, index ascending)
    if ((int)threadIdx.x < p.k) {
        const unsigned key = cand_key[threadIdx.x];
        const long long idx = cand_idx[threadIdx.x];
        int rank = 0;
        for (int m = 0; m < p.k; m++) rank += cand_key[m] > key || (cand_key[m] == key && cand_idx[m] < idx);
        sel_idx[rank] = idx, sel_z[rank] = cand_z[threadIdx.x];
    }
    __syncthreads();
}

// Columns a row may pass to the ranking in shared memory before the radix selection takes over.
constexpr int TOPK_CAND = 512;

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_topk_row(const flce_topk_params p)
{
    __shared__ float scratch_a[DISTILL_THREADS / 32], scratch_b[DISTILL_THREADS / 32];
    __shared__ unsigned tmax[DISTILL_THREADS];
    __shared__ unsigned cand_key[TOPK_CAND];
    __shared__ int cand_idx[TOPK_CAND];
    __shared__ float cand_z[TOPK_CAND];
    __shared__ unsigned bound, count;
    __shared__ long long sel_idx[TOPK_MAX];
    __shared__ float sel_z[TOPK_MAX];
    const long long r = blockIdx.x, i = p.row0 + r, v = p.vocab;
    const int t = (int)threadIdx.x;
    const float *z = p.z + r * p.ld;
    const float lse = distill_lse(p.part_m + r * p.splits, p.part_s + r * p.splits, p.splits, scratch_a, scratch_b);
    float ez = 0.f; // E_p[z/T] over the pass's logits: the splits' Σ exp(z − m)·z scaled to the lse
    for (int u = t; u < p.splits; u += DISTILL_THREADS) {
        const long long at = r * p.splits + u;
        if (p.part_s[at] > 0.f) ez += p.part_t[at] * __expf(p.part_m[at] - lse);
    }
    ez = distill_block_sum(ez, scratch_a);
    // 1. each thread's largest key, 4 columns at a time (ld is a multiple of 8: rows are 16-byte
    //    aligned; the columns past v are padding); a thread with no column offers key 0, below all
    unsigned mx = 0u;
    for (long long j = 4 * (long long)t; j < v; j += 4 * DISTILL_THREADS) {
        const float4 q = *(const float4 *)(z + j);
        const float e[4] = {q.x, q.y, q.z, q.w};
        for (int u = 0; u < 4; u++) {
            const unsigned key = topk_key(e[u]);
            if (j + u < v && key > mx) mx = key;
        }
    }
    tmax[t] = mx;
    if (t == 0) count = 0u;
    __syncthreads();
    int above = 0; // the k-th largest of the 256 (equal ones in thread order) is the bound
    for (int u = 0; u < DISTILL_THREADS; u++) above += tmax[u] > mx || (tmax[u] == mx && u < t);
    if (above == p.k - 1) bound = mx;
    __syncthreads();
    const unsigned lo = bound;
    // 2. every column at or above the bound, in any order
    for (long long j = 4 * (long long)t; j < v; j += 4 * DISTILL_THREADS) {
        const float4 q = *(const float4 *)(z + j);
        const float e[4] = {q.x, q.y, q.z, q.w};
        for (int u = 0; u < 4; u++) {
            const unsigned key = topk_key(e[u]);
            if (j + u < v && key >= lo) {
                const unsigned slot = atomicAdd(&count, 1u);
                if (slot < (unsigned)TOPK_CAND) cand_key[slot] = key, cand_idx[slot] = (int)(j + u), cand_z[slot] = e[u];
            }
        }
    }
    __syncthreads();
    const int c = (int)count; // the same in every thread: the branch is uniform
    if (c > TOPK_CAND) {
        topk_row_radix(p, z, sel_idx, sel_z);
    } else {
        // 3. ranked by (logit descending, index ascending); the k first are the row's
        for (int a = t; a < c; a += DISTILL_THREADS) {
            const unsigned key = cand_key[a];
            const int idx = cand_idx[a];
            int rank = 0;
            for (int m = 0; m < c; m++) rank += cand_key[m] > key || (cand_key[m] == key && cand_idx[m] < idx);
            if (rank < p.k) sel_idx[rank] = idx, sel_z[rank] = cand_z[a];
        }
        __syncthreads();
    }
    topk_row_out(p, i, sel_idx, sel_z, lse, ez);
}

// ---- the vocab-parallel merge (flce_topk_finish; flce_topk_logprobs with tensors.comm) -------------
// One CTA per token over the tp_size blocks in rank order, which are the same bytes on every rank, so
// every rank writes the same outputs, bit for bit:
//   lse = log Σ_r exp(lse_r)                  in fp64 (NaN when one is; ±inf when the largest is)
//   the k largest of the tp_size·k candidates by (logit descending, lower global id first)
//   log p = logit − lse                       in fp64, rounded once
// Each rank's list is in that order already (topk_row_out), so a candidate's place is its place in
// its own list plus, in every other list, the count that come before it (a binary search). Equal
// (logit, id) in two lists — only when shards overlap, which the header check reports — go by rank
// order, so the k places always hold k different candidates.

// The headers checked (distill_tp_check_headers)
__device__ void topk_check_headers(const flce_topk_params &p)
{
    distill_tp_check_headers((const float *)p.gathered, topk_block_words(p), p.tp_size, p.vocab_total, p.tokens,
                             p.flag);
}

// How many of a list's k candidates come before (key, id) of another list: those with a larger key,
// an equal key and a lower id, or an equal (key, id) when the list's rank is lower (list_first).
__device__ __forceinline__ int topk_count_before(const float *rec, int k, unsigned key, int id, bool list_first)
{
    const float *logit = rec + 2;
    const int *ids = (const int *)rec + 2 + k;
    int lo = 0, hi = k; // the list is ordered: those before form a prefix
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const unsigned km = topk_key(logit[mid]);
        const bool before = km > key || (km == key && (ids[mid] < id || (ids[mid] == id && list_first)));
        if (before) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(DISTILL_THREADS) flce_topk_merge(const flce_topk_params p)
{
    __shared__ double lse_s;
    const long long i = p.row0 + blockIdx.x, words = topk_block_words(p), at = topk_record_at(p, i);
    const int t = (int)threadIdx.x, k = p.k;
    if (blockIdx.x == 0 && t == 0) topk_check_headers(p);
    if (t == 0) { // in rank order, one thread: the same bits on every rank
        double m = (double)DISTILL_NEG_INF, nan = 0.0;
        bool has_nan = false;
        for (int r = 0; r < p.tp_size; r++) {
            const double x = (double)p.gathered[r * words + at];
            if (x != x) has_nan = true, nan = x;
            else if (x > m) m = x;
        }
        double l = has_nan ? nan : m;
        if (!has_nan && isfinite(m)) {
            double s = 0.0;
            for (int r = 0; r < p.tp_size; r++) s += exp((double)p.gathered[r * words + at] - m);
            l = m + log(s);
        }
        lse_s = l;
        if (p.lse) p.lse[i] = (float)l;
    }
    __syncthreads();
    const double lse = lse_s;
    for (int c = t; c < p.tp_size * k; c += DISTILL_THREADS) {
        const int r = c / k, u = c % k;
        const float *rec = p.gathered + r * words + at;
        const float x = rec[2 + u];
        const int id = ((const int *)rec)[2 + k + u];
        const unsigned key = topk_key(x);
        int place = u;
        for (int q = 0; q < p.tp_size && place < k; q++)
            if (q != r) place += topk_count_before(p.gathered + q * words + at, k, key, id, q < r);
        if (place < k) {
            p.indices[i * k + place] = id;
            p.logprobs[i * k + place] = (float)((double)x - lse);
        }
    }
}
