/* emu.cpp — runs templates/distill.cu's row kernels on the host (shim.h) the way runtime/distill.c
 * launches them (the same argument struct: chunks, row stride, count, rows, reduce), between
 * host fp32 GEMMs standing in for the CE path's (logits of both models at T into fp32 blocks of row
 * stride ld > V with per-split statistics, dHs and dWs from the dZs block), on small random fp32 data, and compares loss,
 * per-token divergence, dHs and dWs with testing/ref.c ref_distill in fp64. Odd chunks write dZs in
 * place of the student's logits (as fp32 calls do), even ones into a block of their own. The case is compiled in (distill_emu.sh writes k.cu: the generated
 * constants, then the template); argv[1] is the token chunk. Exit 0 when every error < 1e-5. */
#include "shim.h"
#include <ucontext.h>
emu_dim threadIdx;
emu_dim emu_block, gridDim;
emu_bar emu_block_bar, emu_warp_bar[8];
float emu_shfl[256];
#include "k.cu"
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
extern "C" {
#include "ref.h"
}
/* One launch: the CTAs in order, each as 256 coroutines (shim.h) started at the kernel and run
 * round-robin from one barrier to the next; the CTA ends when all 256 have returned. */
enum { EMU_THREADS = 256, EMU_STACK = 1 << 17 };
static ucontext_t emu_main_ctx, emu_ctx[EMU_THREADS];
static bool emu_done[EMU_THREADS];
static int emu_cur, emu_left;
static char *emu_stack;
static void *emu_job;

static int emu_next(int me)
{
    int next = me;
    do next = (next + 1) % EMU_THREADS;
    while (emu_done[next] && next != me);
    return next;
}

void emu_yield()
{
    const int me = emu_cur, next = emu_next(me);
    if (next != me) {
        emu_cur = next, threadIdx = {(unsigned)next, 0, 0};
        swapcontext(&emu_ctx[me], &emu_ctx[next]);
    }
    emu_cur = me, threadIdx = {(unsigned)me, 0, 0};
}

template <class P> struct emu_launch {
    void (*fn)(P);
    P p;
};
template <class P> static void emu_entry()
{
    const emu_launch<P> *l = (const emu_launch<P> *)emu_job;
    l->fn(l->p);
    const int me = emu_cur;
    emu_done[me] = true;
    if (--emu_left == 0) setcontext(&emu_main_ctx); // the CTA is done (does not return)
    const int next = emu_next(me);
    emu_cur = next, threadIdx = {(unsigned)next, 0, 0};
    setcontext(&emu_ctx[next]);
}

template <class P> static void run(void (*fn)(P), long long grid, P p)
{
    gridDim = {(unsigned)grid, 1, 1};
    static emu_launch<P> l;
    l = {fn, p};
    emu_job = &l;
    if (!emu_stack && !(emu_stack = (char *)malloc((size_t)EMU_THREADS * EMU_STACK))) {
        fprintf(stderr, "emu: out of memory for the coroutines' stacks\n");
        exit(2);
    }
    for (long long b = 0; b < grid; b++) {
        emu_block = {(unsigned)b, 0, 0};
        for (int t = 0; t < EMU_THREADS; t++) {
            getcontext(&emu_ctx[t]);
            emu_ctx[t].uc_stack.ss_sp = emu_stack + (size_t)t * EMU_STACK;
            emu_ctx[t].uc_stack.ss_size = EMU_STACK;
            emu_ctx[t].uc_link = nullptr;
            makecontext(&emu_ctx[t], (void (*)())emu_entry<P>, 0);
            emu_done[t] = false;
        }
        emu_left = EMU_THREADS, emu_cur = 0, threadIdx = {0, 0, 0};
        swapcontext(&emu_main_ctx, &emu_ctx[0]);
    }
}
static double rnd() { return (rand() / (double)RAND_MAX - 0.5) * 2; }
/* flce_topk_row against a sort of fp64 logits (argv[1] "topk"): hidden and weight rows of width 16,
 * the stored logits at T as a GPU pass on 16-bit inputs errs: z·(1 − ε) with ε a row's own (0 to
 * 6e-5, ten times the wgmma sums' bias, so that an lse left uncorrected misses the tolerance by far),
 * each column also off by up to 2e-7·|z| at random, then rounded to fp32 (the tie rows exact: equal
 * logits stay equal in a pass). The kernel forms the k logits again in fp64 and corrects the lse by
 * their differences and by the bias they reveal on the other columns. Rows with ties (values on a coarse grid, unbiased), −inf (unbiased: its entropy
 * statistic is NaN, 0·−inf, so the kernel leaves the bias term out), a NaN row, k from 1 to 64 and to
 * the whole vocab; indices exact, log-probs and lse within 1e-6 of fp64 (the stored logits' sums are
 * fp32). */
static const float TOPK_T = 1.5f;

struct topk_data {
    long long v, rows, row0, tokens, ld, d;
    std::vector<float> z, h, w;                // z: rows × ld, the stored fp32 logits at T (biased)
    std::vector<double> ze;                    // rows × v, the exact ones
    std::vector<std::vector<long long>> order; // each row's ids by (fp64 logit desc, NaN first, lower id)
};

static topk_data topk_make(long long v, long long rows, long long row0)
{
    topk_data t;
    t.v = v, t.rows = rows, t.row0 = row0, t.tokens = row0 + rows, t.ld = (v + 7) / 8 * 8, t.d = 16;
    const long long d = t.d, ld = t.ld;
    t.z.assign(rows * ld, NAN), t.h.resize(t.tokens * d), t.w.resize(v * d), t.ze.resize(rows * v), t.order.resize(rows);
    for (long long j = 0; j < v; j++) { // column 0 a coarse grid (the tie rows read it alone)
        t.w[j * d] = (float)(rand() % 7) * 0.75f;
        for (long long q = 1; q < d; q++) t.w[j * d + q] = (float)rnd();
    }
    for (long long r = 0; r < rows; r++)
        for (long long q = 0; q < d; q++)
            t.h[(row0 + r) * d + q] = r % 3 == 0 ? (q == 0) : q == 0 ? 0.f : (float)rnd() * 3;
    for (long long r = 0; r < rows; r++)
        for (long long j = 0; j < v; j++) {
            double a = 0;
            for (long long q = 0; q < d; q++) a += (double)t.h[(row0 + r) * d + q] * t.w[j * d + q];
            double x = a / TOPK_T;
            if (r == 4 && j % 5 == 0) x = -INFINITY;
            if (r == 5 && j == v / 2) x = NAN;
            const bool tie = r % 3 == 0; // equal logits stay equal in a pass: neither bias nor noise
            const double eps = tie || r == 4 ? 0.0 : 2e-5 * (double)(r % 4), noise = tie ? 0.0 : 2e-7 * rnd();
            t.ze[r * v + j] = x, t.z[r * ld + j] = (float)(x * (1 - eps + noise));
        }
    for (long long r = 0; r < rows; r++) {
        std::vector<long long> &order = t.order[r];
        order.resize(v);
        for (long long j = 0; j < v; j++) order[j] = j;
        auto key = [&](long long j) { double x = t.ze[r * v + j]; return std::isnan(x) ? INFINITY : x; };
        std::stable_sort(order.begin(), order.end(), [&](long long a, long long b) {
            const bool na = std::isnan(t.ze[r * v + a]), nb = std::isnan(t.ze[r * v + b]);
            if (na != nb) return na;
            return key(a) > key(b);
        });
    }
    return t;
}

/* Columns [c0, c0 + n) of the stored logits at row stride ldo (the padding NaN) and their per-split
 * max, Σ exp and Σ exp·z as the logits epilogue forms them (the sums in fp64 here: a GPU's tree sums
 * err by ~1e-7, a serial fp32 sum of thousands by more); fmaxf leaves NaN out, the sums keep it. */
static void topk_shard(const topk_data &t, long long c0, long long n, long long ldo, int splits, std::vector<float> &z,
                       std::vector<float> &pm, std::vector<float> &ps, std::vector<float> &pt)
{
    z.assign(t.rows * ldo, NAN), pm.resize(t.rows * splits), ps.resize(t.rows * splits), pt.resize(t.rows * splits);
    for (long long r = 0; r < t.rows; r++)
        for (long long j = 0; j < n; j++) z[r * ldo + j] = t.z[r * t.ld + c0 + j];
    const long long per = (n + splits - 1) / splits;
    for (long long r = 0; r < t.rows; r++)
        for (int s = 0; s < splits; s++) {
            float m = -INFINITY;
            double sum = 0, sz = 0;
            for (long long j = s * per; j < n && j < (s + 1) * per; j++) m = fmaxf(m, z[r * ldo + j]);
            for (long long j = s * per; j < n && j < (s + 1) * per; j++) {
                const double x = z[r * ldo + j], e = x == -INFINITY ? 0.0 : exp(x - m);
                sum += e, sz += e * x; // 0·−inf: NaN, as the GPU's e·z
            }
            pm[r * splits + s] = m, ps[r * splits + s] = (float)sum, pt[r * splits + s] = (float)sz;
        }
}

/* Token rows' outputs against the fp64 sort: indices exact, log-probs and lse within 1e-6. */
static int topk_compare(const topk_data &t, int k, const long long *idx, const float *lp, const float *lse)
{
    int bad = 0;
    const long long v = t.v;
    for (long long r = 0; r < t.rows; r++) {
        const std::vector<long long> &order = t.order[r];
        double m = -INFINITY, sum = 0; // the exact lse
        for (long long j = 0; j < v; j++) m = fmax(m, t.ze[r * v + j]);
        for (long long j = 0; j < v; j++) sum += exp(t.ze[r * v + j] - m);
        const double l = m + log(sum);
        const long long i = t.row0 + r;
        for (int q = 0; q < k; q++) {
            const long long want = order[q];
            if (idx[i * k + q] != want) {
                if (bad++ < 5) printf("row %lld rank %d: index %lld, want %lld\n", r, q, idx[i * k + q], want);
                continue;
            }
            const double e = t.ze[r * v + want] - l, got = lp[i * k + q];
            if (!(std::isnan(e) ? std::isnan(got) : got == e || fabs(got - e) <= 1e-6 * (1 + fabs(e))) && bad++ < 5)
                printf("row %lld rank %d: log-prob %.9g, want %.9g\n", r, q, got, e);
        }
        if (!(std::isnan(l) ? std::isnan(lse[i]) : fabs(lse[i] - l) <= 1e-6 * (1 + fabs(l))) && bad++ < 5)
            printf("row %lld: lse %.9g, want %.9g\n", r, lse[i], l);
    }
    return bad;
}

static int topk_case(long long v, int k, int splits)
{
    const long long rows = 9, row0 = 3;
    topk_data t = topk_make(v, rows, row0);
    std::vector<float> z, pm, ps, pt, lse(t.tokens, -1.f), lp(t.tokens * k, -1.f);
    std::vector<long long> idx(t.tokens * k, -1);
    topk_shard(t, 0, v, t.ld, splits, z, pm, ps, pt);
    flce_topk_params tp = {z.data(), pm.data(), ps.data(), pt.data(), idx.data(), lp.data(), lse.data(),
                           row0, v, t.ld, splits, k, t.h.data(), t.w.data(), t.d, TOPK_T};
    run(flce_topk_row, rows, tp);
    int bad = topk_compare(t, k, idx.data(), lp.data(), lse.data());
    for (long long i = 0; i < row0; i++) bad += lse[i] != -1.f || idx[i * k] != -1; // rows outside the chunk untouched
    printf("topk v=%lld k=%d splits=%d: %s\n", v, k, splits, bad ? "FAIL" : "ok");
    return bad;
}

/* Tensor parallelism (argv[1] "topktp"): the vocab cut into shards, each rank's flce_topk_row over
 * its columns (its weight rows, its vocab_offset) in two token chunks writing its block, the blocks
 * concatenated in rank order (the all-gather), flce_topk_merge of them against the fp64 sort of the
 * whole vocab (ids global), run twice (two ranks' merges): bitwise the same outputs, flag[1] clear.
 * Then the headers altered (a gap, an overlap, another vocab_total, another token count): the merge
 * raises the CE path's FLCE_FLAG_TP_* bits. */
static int topk_merge_into(const topk_data &t, int k, const std::vector<float> &gathered, int tp, int *flag,
                           std::vector<long long> &idx, std::vector<float> &lp, std::vector<float> &lse)
{
    idx.assign(t.tokens * k, -1), lp.assign(t.tokens * k, -1.f), lse.assign(t.tokens, -1.f);
    flce_topk_params mp = {};
    mp.indices = idx.data(), mp.logprobs = lp.data(), mp.lse = lse.data(), mp.k = k, mp.gathered = gathered.data();
    mp.flag = flag, mp.vocab_total = t.v, mp.tokens = t.tokens, mp.tp_size = tp;
    run(flce_topk_merge, t.tokens, mp);
    return flag[1];
}

static int topk_tp_case(const char *name, long long v, int k, std::vector<long long> shards, int splits)
{
    const long long rows = 9, chunk = 5;
    topk_data t = topk_make(v, rows, 0);
    const int tp = (int)shards.size();
    const long long words = FLCE_TP_HEADER + t.tokens * (2 + 2 * (long long)k);
    std::vector<float> gathered(tp * words, NAN);
    long long off = 0;
    for (int r = 0; r < tp; r++) {
        const long long n = shards[r], ldo = (n + 7) / 8 * 8;
        std::vector<float> z, pm, ps, pt;
        topk_shard(t, off, n, ldo, splits, z, pm, ps, pt);
        flce_topk_params sp = {z.data(), pm.data(), ps.data(), pt.data(), nullptr, nullptr, nullptr,
                               0, n, ldo, splits, k, t.h.data(), t.w.data() + off * t.d, t.d, TOPK_T};
        sp.block = gathered.data() + r * words, sp.vocab_offset = off, sp.vocab_total = v, sp.tokens = t.tokens;
        sp.tp_size = tp;
        for (long long c0 = 0; c0 < rows; c0 += chunk) { // token chunks: z, pm, ps are each chunk's rows
            sp.row0 = c0, sp.z = z.data() + c0 * ldo, sp.part_m = pm.data() + c0 * splits, sp.part_s = ps.data() + c0 * splits;
            sp.part_t = pt.data() + c0 * splits;
            run(flce_topk_row, std::min(chunk, rows - c0), sp);
        }
        off += n;
    }
    int flag[2] = {0, 0}, bad = 0;
    std::vector<long long> idx, idx2;
    std::vector<float> lp, lp2, lse, lse2;
    bad += topk_merge_into(t, k, gathered, tp, flag, idx, lp, lse) != 0;
    bad += topk_compare(t, k, idx.data(), lp.data(), lse.data());
    topk_merge_into(t, k, gathered, tp, flag, idx2, lp2, lse2); // another rank's merge: the same bits
    bad += idx != idx2 || memcmp(lp.data(), lp2.data(), lp.size() * 4) || memcmp(lse.data(), lse2.data(), lse.size() * 4);
    printf("topk tp %s: v=%lld k=%d shards", name, v, k);
    for (long long n : shards) printf(" %lld", n);
    printf(": %s\n", bad ? "FAIL" : "ok");
    return bad;
}

/* The merge's header checks on two ranks' blocks (their records unused): each altered header raises
 * its bit, and the good ones none. */
static int topk_tp_headers(void)
{
    const int k = 2, tp = 2;
    const long long tokens = 3, v = 100, words = FLCE_TP_HEADER + tokens * (2 + 2 * k);
    topk_data t;
    t.v = v, t.tokens = tokens, t.rows = tokens, t.row0 = 0;
    std::vector<float> good(tp * words, 0.f);
    for (int r = 0; r < tp; r++) {
        long long *h = (long long *)(good.data() + r * words);
        h[0] = r * 40, h[1] = r == 0 ? 40 : 60, h[2] = v, h[3] = tokens;
        for (long long i = 0; i < tokens; i++) // ordered candidates, distinct ids
            for (int u = 0; u < k; u++) {
                float *rec = good.data() + r * words + FLCE_TP_HEADER + i * (2 + 2 * k);
                rec[2 + u] = (float)(10 - u - r), ((int *)rec)[2 + k + u] = (int)(h[0] + u);
            }
    }
    struct alter {
        const char *name;
        int rank, field;
        long long delta;
        int want;
    } cases[] = {
        {"good", 0, 0, 0, 0},
        {"a gap", 1, 0, 1, FLCE_FLAG_TP_SHARDS},
        {"an overlap", 1, 0, -1, FLCE_FLAG_TP_SHARDS},
        {"a short last shard", 1, 1, -1, FLCE_FLAG_TP_SHARDS},
        {"another vocab_total", 1, 2, 5, FLCE_FLAG_TP_TOTAL},
        {"another token count", 0, 3, 1, FLCE_FLAG_TP_TOKENS},
    };
    int bad = 0;
    for (const alter &c : cases) {
        std::vector<float> g = good;
        ((long long *)(g.data() + c.rank * words))[c.field] += c.delta;
        int flag[2] = {0, 0};
        std::vector<long long> idx;
        std::vector<float> lp, lse;
        const int got = topk_merge_into(t, k, g, tp, flag, idx, lp, lse);
        if (got != c.want) printf("headers, %s: flag[1] = %d, want %d\n", c.name, got, c.want), bad++;
        if (!c.want) // the merged order: rank 0's 10, 9 then rank 1's 9 (id 40 > id 1)
            bad += idx[0] != 0 || idx[1] != 1 || lse[0] != lse[0];
    }
    printf("topk tp headers (gap, overlap, short, vocab_total, tokens): %s\n", bad ? "FAIL" : "ok");
    return bad;
}

/* flce_distill_row_topk (argv[1] "topkkl", in the forward-KL builds): the teacher given as each
 * token's k (id, log p) pairs — the k largest of a random teacher's log-softmax, in a shuffled
 * order — against the same formulas in double on the same fp32 student logits: D_i, loss_i (the
 * build's CE term, labels, reduction) and dZs, written beside the logits and in place of them. Token
 * 3 repeats an id and token 5 names one outside [0, V): their D and dZs rows must be NaN. */
/* Each split's (max, Σ exp(z − max)) of rows × v logits at row stride ld, as the logits epilogue forms
 * them in fp32: a NaN anywhere in the split makes Σ NaN (the max leaves it out, as fmaxf does). */
static void split_stats(const float *z, float *pm, float *ps, long long rows, long long v, long long ld, int splits)
{
    const long long per = (v + splits - 1) / splits;
    for (long long i = 0; i < rows; i++)
        for (int k = 0; k < splits; k++) {
            float m = -INFINITY, sum = 0.f;
            for (long long j = k * per; j < v && j < (k + 1) * per; j++) m = fmaxf(m, z[i * ld + j]);
            for (long long j = k * per; j < v && j < (k + 1) * per; j++) sum += expf(z[i * ld + j] - m);
            pm[i * splits + k] = m, ps[i * splits + k] = sum;
        }
}

/* The row sums' all-reduce of the TP emulations: every rank's aw[0 .. count) summed in rank order
 * (every rank the same bits, as NCCL's and tests/fake_nccl.c's). */
template <class Rank> static void sum_in_rank_order(std::vector<Rank> &rk, long long count)
{
    for (long long e = 0; e < count; e++) {
        float sum = 0.f;
        for (const Rank &k : rk) sum += k.aw[e];
        for (Rank &k : rk) k.aw[e] = sum;
    }
}

/* The fp32 top-k row kernel under tensor parallelism (runtime/distill.c run_all, tp_fp32_sums): the
 * columns cut into `shards`; per rank its logits' columns and splits, its CE label logit, its block
 * (flce_distill_tp_pack), the blocks in rank order, its merge, its first read (tp_sums), the sums
 * added in rank order, its second read; its dZs put back at its columns of dz (row stride ld).
 * Outputs from rank 0; 1 when another rank's differ or the headers' flag rises. */
static int topkkl_tp(const flce_distill_params &one, const std::vector<float> &zs, const std::vector<int> &lab,
                     const std::vector<long long> &shards, float *dz)
{
    const long long n = one.rows, v = one.vocab, ld = one.ld;
    const int tp = (int)shards.size(), splits = 2;
    std::vector<float> gathered(tp * (FLCE_TP_HEADER + n * 4), NAN);
    struct rank_data {
        long long off, vr, ldr;
        std::vector<float> z, pm, ps, target, lse_s, x, aw, lossrows, loss, div;
        float count = -1;
        flce_distill_params rp;
    };
    std::vector<rank_data> rk(tp);
    int flag[2] = {0, 0};
    long long off = 0;
    for (int r = 0; r < tp; r++) {
        rank_data &k = rk[r];
        k.off = off, k.vr = shards[r], k.ldr = (k.vr + 7) / 8 * 8, off += k.vr;
        k.z.assign(n * k.ldr, NAN), k.pm.resize(n * splits), k.ps.resize(n * splits), k.target.resize(n);
        k.lse_s.resize(n), k.x.resize(n), k.aw.resize(2 * n), k.lossrows.resize(n), k.loss.resize(one.tokens);
        k.div.resize(n);
        for (long long i = 0; i < n; i++) {
            for (long long j = 0; j < k.vr; j++) k.z[i * k.ldr + j] = zs[i * ld + k.off + j];
            const long long y = DISTILL_LABELS ? lab[i] - k.off : -1;
            k.target[i] = y >= 0 && y < k.vr ? k.z[i * k.ldr + y] : 0.f;
        }
        split_stats(k.z.data(), k.pm.data(), k.ps.data(), n, k.vr, k.ldr, splits);
        k.rp = one;
        k.rp.zs = k.z.data(), k.rp.dz = k.z.data(), k.rp.part_ms = k.pm.data(), k.rp.part_ss = k.ps.data();
        k.rp.splits_s = splits, k.rp.vocab = k.vr, k.rp.ld = k.ldr, k.rp.divergence = k.div.data();
        k.rp.loss_rows = k.lossrows.data(), k.rp.loss = k.loss.data(), k.rp.count = &k.count, k.rp.flag = flag;
        k.rp.target_s = k.target.data(), k.rp.lse_s_rows = k.lse_s.data(), k.rp.x_rows = k.x.data();
        k.rp.tp_aw = k.aw.data(), k.rp.tp_send = gathered.data() + r * (FLCE_TP_HEADER + n * 4);
        k.rp.tp_recv = gathered.data(), k.rp.vocab_offset = k.off, k.rp.tp_size = tp;
        run(flce_distill_count, 1, k.rp);
        run(flce_distill_tp_pack, (n + 255) / 256, k.rp);
    }
    for (int r = 0; r < tp; r++) {
        run(flce_distill_tp_merge, (n + 255) / 256, rk[r].rp);
        rk[r].rp.tp_sums = 1;
        run(flce_distill_row_topk, n, rk[r].rp);
        rk[r].rp.tp_sums = 0;
    }
    sum_in_rank_order(rk, 2 * n);
    int bad = 0;
    for (int r = 0; r < tp; r++) {
        rank_data &k = rk[r];
        run(flce_distill_row_topk, n, k.rp); // (in place: dZs over the rank's logits)
        for (long long i = 0; i < n; i++) {
            for (long long j = 0; j < k.vr; j++) dz[i * ld + k.off + j] = k.z[i * k.ldr + j];
            for (long long j = k.vr; j < k.ldr; j++) bad += k.z[i * k.ldr + j] != 0.f; // each rank's padding
        }
        if (r > 0) bad += memcmp(k.div.data(), rk[0].div.data(), 4 * n) != 0 ||
                          memcmp(k.lossrows.data(), rk[0].lossrows.data(), 4 * n) != 0;
    }
    for (long long i = 0; i < n; i++)
        for (long long j = v; j < ld; j++) dz[i * ld + j] = 0.f; // (the whole row's padding is no rank's)
    memcpy(one.divergence, rk[0].div.data(), 4 * n), memcpy(one.loss_rows, rk[0].lossrows.data(), 4 * n);
    *one.count = rk[0].count;
    return bad + (flag[1] != 0);
}

static int topkkl_case(int k, bool in_place, std::vector<long long> shards = {})
{
    const long long n = 12, ds = 16, v = 90, ld = 96;
    const int splits = 3;
    std::vector<float> hs(n * ds), ws(v * ds), zs(n * ld, NAN), dzb(n * ld, NAN), pm(n * splits), ps(n * splits);
    for (auto &x : hs) x = rnd();
    for (auto &x : ws) x = rnd() * 0.8;
    for (long long i = 0; i < n; i++)
        for (long long j = 0; j < v; j++) {
            float a = 0.f;
            for (long long l = 0; l < ds; l++) a += hs[i * ds + l] * ws[j * ds + l];
            zs[i * ld + j] = a * INV_TEMP;
        }
    split_stats(zs.data(), pm.data(), ps.data(), n, v, ld, splits);
    std::vector<long long> idx(n * k);
    std::vector<float> lp(n * k);
    for (long long i = 0; i < n; i++) {
        std::vector<double> zt(v);
        double m = -INFINITY, sum = 0;
        for (auto &x : zt) x = rnd() * 3, m = fmax(m, x);
        for (auto x : zt) sum += exp(x - m);
        std::vector<long long> order(v);
        for (long long j = 0; j < v; j++) order[j] = j;
        std::sort(order.begin(), order.end(), [&](long long a, long long b) { return zt[a] > zt[b]; });
        std::reverse(order.begin(), order.begin() + k); // any order of the k
        for (int q = 0; q < k; q++) idx[i * k + q] = order[q], lp[i * k + q] = (float)(zt[order[q]] - m - log(sum));
    }
    if (k >= 2) idx[3 * k + 1] = idx[3 * k];
    idx[5 * k + k - 1] = v + 2;
    std::vector<int> lab(n);
    for (long long i = 0; i < n; i++) lab[i] = i % 7 == 6 ? -100 : rand() % v;
    const long long nl = FLCE_REDUCTION == 2 ? n : 1;
    std::vector<float> go(nl), lossrows(n), loss(nl), div(n);
    for (auto &x : go) x = 0.5f + (float)(rand() % 100) / 100;
    float count = -1;
    const std::vector<float> z0 = zs; // the logits as the reference reads them
    flce_distill_params rp = {zs.data(), nullptr, in_place ? zs.data() : dzb.data(), pm.data(), ps.data(), nullptr,
                              nullptr, DISTILL_LABELS ? lab.data() : nullptr, go.data(), div.data(), lossrows.data(),
                              loss.data(), &count, 0, n, n, v, -100, ld, splits, 0};
    rp.tk_idx = idx.data(), rp.tk_lp = lp.data(), rp.topk = k;
    rp.vocab_total = v; // labels and ids lie in [0, V) without TP (runtime/distill.c sets it so)
    int bad = 0;
    if (!shards.empty()) {
        bad += topkkl_tp(rp, z0, lab, shards, dzb.data());
        in_place = false;
    } else {
        run(flce_distill_count, 1, rp);
        run(flce_distill_row_topk, n, rp);
    }
    const float *dz = in_place ? zs.data() : dzb.data();
    for (long long i = 0; i < n; i++) {
        const bool valid = !DISTILL_LABELS || lab[i] != -100;
        if (!valid) {
            for (long long j = 0; j < ld; j++) bad += dz[i * ld + j] != 0.f;
            bad += div[i] != 0.f;
            continue;
        }
        for (long long j = v; j < ld; j++) bad += dz[i * ld + j] != 0.f; // padding zeroed
        if ((i == 3 && k >= 2) || i == 5) {
            bad += !std::isnan(div[i]) || !std::isnan(dz[i * ld]);
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (long long j = 0; j < v; j++) mx = fmax(mx, z0[i * ld + j]);
        for (long long j = 0; j < v; j++) sum += exp(z0[i * ld + j] - mx);
        const double lse = mx + log(sum);
        double d = 0, pk = 0;
        std::vector<double> pj(v, 0.0);
        for (int q = 0; q < k; q++) {
            const double p = exp((double)lp[i * k + q]);
            d += p * (lp[i * k + q] - (z0[i * ld + idx[i * k + q]] - lse)), pk += p, pj[idx[i * k + q]] = p;
        }
        double g = FLCE_REDUCTION == 2 ? go[i] : go[0];
        if (FLCE_REDUCTION == 0) g /= count;
        double e2 = 0, r2 = 0;
        for (long long j = 0; j < v; j++) {
            const double qj = exp(z0[i * ld + j] - lse);
            double want = (qj * pk - pj[j]) * INV_TEMP;
            if (DISTILL_LABELS && CE_WEIGHT != 0.f) want += CE_WEIGHT * (qj - (j == lab[i] ? 1.0 : 0.0));
            want *= g;
            e2 += (dz[i * ld + j] - want) * (dz[i * ld + j] - want), r2 += want * want;
        }
        double lw = d + (DISTILL_LABELS && CE_WEIGHT != 0.f ? CE_WEIGHT * (lse - z0[i * ld + lab[i]]) : 0.0);
        if (!(fabs(div[i] - d) <= 1e-5 * (1 + fabs(d))) || !(sqrt(e2) <= 1e-5 * sqrt(r2) + 1e-12) ||
            !(fabs(lossrows[i] - lw) <= 1e-5 * (1 + fabs(lw)))) {
            if (bad++ < 5) printf("token %lld: D %g want %g, loss %g want %g, dz err %.2e\n", i, div[i], d, lossrows[i], lw,
                                  sqrt(e2 / (r2 + 1e-300)));
        }
    }
    printf("topkkl k=%d %s: %s\n", k, !shards.empty() ? "tp" : in_place ? "in place" : "beside", bad ? "FAIL" : "ok");
    return bad;
}

/* The distillation's data (argv[1]: the token chunk): 40 tokens, Ds 24, Dt 32, V 150, every 7th
 * label ignored, and fp64 copies for testing/ref.c. */
struct distill_data {
    long long n = 40, ds = 24, dt = 32, v = 150, nl = FLCE_REDUCTION == 2 ? 40 : 1, ld = (150 + 7) / 8 * 8;
    std::vector<float> hs, ws, ht, wt, go;
    std::vector<double> dhs, dws, dht, dwt, god;
    std::vector<int> lab;
    std::vector<int64_t> lab64;
};

static distill_data distill_make()
{
    distill_data t;
    const long long n = t.n, ds = t.ds, dt = t.dt, v = t.v;
    t.hs.resize(n * ds), t.ws.resize(v * ds), t.ht.resize(n * dt), t.wt.resize(v * dt);
    t.dhs.resize(n * ds), t.dws.resize(v * ds), t.dht.resize(n * dt), t.dwt.resize(v * dt);
    for (long long i = 0; i < n * ds; i++) t.hs[i] = rnd(), t.dhs[i] = t.hs[i];
    for (long long i = 0; i < v * ds; i++) t.ws[i] = rnd() * 0.6, t.dws[i] = t.ws[i];
    for (long long i = 0; i < n * dt; i++) t.ht[i] = rnd(), t.dht[i] = t.ht[i];
    for (long long i = 0; i < v * dt; i++) t.wt[i] = rnd() * 0.7, t.dwt[i] = t.wt[i];
    if (NANROW >= 0) t.ht[NANROW * dt + 2] = NAN, t.dht[NANROW * dt + 2] = NAN;
    t.lab.resize(n), t.lab64.resize(n);
    for (long long i = 0; i < n; i++) { t.lab[i] = i % 7 == 3 ? -100 : rand() % v; t.lab64[i] = t.lab[i]; }
    t.go.resize(t.nl), t.god.resize(t.nl);
    for (long long i = 0; i < t.nl; i++) t.go[i] = 0.5f + (float)(rand() % 100) / 100, t.god[i] = t.go[i];
    return t;
}

// the logits kernel's epilogue over `v` columns: z/T in place, then each split's statistics
static void logits_pass(float *z, float *pm, float *ps, long long rows, long long v, long long ld, int splits)
{
    for (long long i = 0; i < rows; i++)
        for (long long j = 0; j < v; j++) z[i * ld + j] *= INV_TEMP;
    split_stats(z, pm, ps, rows, v, ld, splits);
}

// C[m × nn] (row stride ldc) = A[m × k] · B[nn × k]ᵀ in fp32, as the logits GEMM
static void gemm_nt(const float *a, const float *b, float *c, long long m, long long nn, long long k, long long ldc)
{
    for (long long i = 0; i < m; i++)
        for (long long j = 0; j < nn; j++) {
            float acc = 0.f;
            for (long long l = 0; l < k; l++) acc += a[i * k + l] * b[j * k + l];
            c[i * ldc + j] = acc;
        }
}

// dHs rows (+= when `add`: the ranks' shards summed in rank order) and dWs += dZsᵀ·Hs over a chunk's
// dZs block of `v` columns; the padding must be zeros (dH's loads read it), else 1
static int grad_gemms(const distill_data &t, const float *dz, long long r0, long long rows, long long v, long long ld,
                      const float *ws, float *dh, float *dw, bool add)
{
    const long long ds = t.ds;
    for (long long i = 0; i < rows; i++) {
        for (long long j = v; j < ld; j++)
            if (dz[i * ld + j] != 0.f) { printf("padding (%lld, %lld) = %g\n", i, j, dz[i * ld + j]); return 1; }
        for (long long k = 0; k < ds; k++) { // dHs = dZs · Ws
            float acc = 0.f;
            for (long long j = 0; j < v; j++) acc += dz[i * ld + j] * ws[j * ds + k];
            dh[(r0 + i) * ds + k] = add ? dh[(r0 + i) * ds + k] + acc : acc;
        }
    }
    for (long long j = 0; j < v; j++) // dWs += dZsᵀ · Hs
        for (long long k = 0; k < ds; k++) {
            float acc = 0.f;
            for (long long i = 0; i < rows; i++) acc += dz[i * ld + j] * t.hs[(r0 + i) * ds + k];
            dw[j * ds + k] += acc;
        }
    return 0;
}

// The outputs against testing/ref.c ref_distill in fp64 (every error < 1e-5), or the NaN row's
// containment; 0 when they pass
static int distill_compare(const distill_data &t, const std::vector<float> &loss, const std::vector<float> &div,
                           const std::vector<float> &dh, const std::vector<float> &dw, float count, const char *what)
{
    const long long n = t.n, ds = t.ds, dt = t.dt, v = t.v, nl = t.nl;
    ref_distill_problem p = {(ref_divergence)DIVP, BETAD, 1.0 / (double)INV_TEMP, (double)CE_WEIGHT, -100, (flce_reduction)FLCE_REDUCTION};
    std::vector<double> rl(nl), rdh(n * ds), rdw(v * ds);
    int rc = ref_distill(&p, n, ds, dt, v, t.dhs.data(), t.dws.data(), t.dht.data(), t.dwt.data(),
                         DISTILL_LABELS ? t.lab64.data() : nullptr, t.god.data(), rl.data(), rdh.data(), rdw.data());
    std::vector<double> gl(loss.begin(), loss.end()), gdh(dh.begin(), dh.end()), gdw(dw.begin(), dw.end());
    // per-token divergence via ref_distill_row
    std::vector<double> rdiv(n), gdiv(div.begin(), div.end()), zsr(v), ztr(v);
    for (long long i = 0; i < n; i++) {
        if (DISTILL_LABELS && t.lab[i] == -100) { rdiv[i] = 0; continue; }
        for (long long j = 0; j < v; j++) {
            double a = 0, b = 0;
            for (long long k = 0; k < ds; k++) a += t.dhs[i * ds + k] * t.dws[j * ds + k];
            for (long long k = 0; k < dt; k++) b += t.dht[i * dt + k] * t.dwt[j * dt + k];
            zsr[j] = a, ztr[j] = b;
        }
        ref_distill_row_out o;
        ref_distill_row(&p, v, zsr.data(), ztr.data(), DISTILL_LABELS ? t.lab64[i] : -1, &o, nullptr);
        rdiv[i] = o.divergence;
    }
    if (NANROW >= 0) {
        int bad = 0;
        for (long long i = 0; i < n; i++) {
            if (i == NANROW) { bad += !std::isnan(gdiv[i]) || !std::isnan(gdh[i * ds]); continue; }
            bad += !(fabs(gdiv[i] - rdiv[i]) <= 1e-4 * (1 + fabs(rdiv[i])));
            bad += ref_rel_l2(rdh.data() + i * ds, gdh.data() + i * ds, ds) > 1e-4;
        }
        printf("%snan row %d: bad %d count %g\n", what, NANROW, bad, count);
        return bad != 0;
    }
    double el = ref_rel_l2(rl.data(), gl.data(), nl), ed = ref_rel_l2(rdiv.data(), gdiv.data(), n);
    double eh = ref_rel_l2(rdh.data(), gdh.data(), n * ds), ew = ref_rel_l2(rdw.data(), gdw.data(), v * ds);
    printf("%src %d count %g loss %g vs %g: loss %.2e div %.2e dh %.2e dw %.2e\n", what, rc, count, gl[0], rl[0], el, ed,
           eh, ew);
    return !(el < 1e-5 && ed < 1e-5 && eh < 1e-5 && ew < 1e-5);
}

/* The fp32 path on one device (runtime/distill.c run_all): per chunk both logits passes, the row
 * kernel, dHs and dWs. */
static int distill_case(long long chunk)
{
    const distill_data t = distill_make();
    const long long n = t.n, ds = t.ds, dt = t.dt, v = t.v, ld = t.ld;
    std::vector<float> zs(chunk * ld, NAN), zt(chunk * ld, NAN), dzb(chunk * ld, NAN), dh(n * ds), dw(v * ds, 0.f),
        lossrows(n), loss(t.nl), div(n);
    float count = -1;
    // the logits passes' statistics: per (row, vocab split) max and Σ exp(z/T − max), the student's
    // vocab in 3 splits and the teacher's in 2 (as the CE logits kernel's gridDim.y)
    const int splits_s = 3, splits_t = 2;
    std::vector<float> pms(chunk * splits_s), pss(chunk * splits_s), pmt(chunk * splits_t), pst(chunk * splits_t);
    flce_distill_params rp = {zs.data(), zt.data(), nullptr, pms.data(), pss.data(), pmt.data(), pst.data(),
                              DISTILL_LABELS ? t.lab.data() : nullptr, t.go.data(), div.data(),
                              lossrows.data(), loss.data(), &count, 0, 0, n, v, -100, ld, splits_s, splits_t};
    rp.vocab_total = v; // labels lie in [0, V) without TP
    run(flce_distill_count, 1, rp);
    for (long long r0 = 0; r0 < n; r0 += chunk) {
        long long rows = n - r0 < chunk ? n - r0 : chunk;
        rp.row0 = r0, rp.rows = rows;
        gemm_nt(t.ht.data() + r0 * dt, t.wt.data(), zt.data(), rows, v, dt, ld);
        gemm_nt(t.hs.data() + r0 * ds, t.ws.data(), zs.data(), rows, v, ds, ld);
        logits_pass(zt.data(), pmt.data(), pst.data(), rows, v, ld, splits_t);
        logits_pass(zs.data(), pms.data(), pss.data(), rows, v, ld, splits_s);
        float *dz = (r0 / chunk) % 2 ? zs.data() : dzb.data();
        rp.dz = dz;
        run(flce_distill_row, rows, rp);
        if (grad_gemms(t, dz, r0, rows, v, ld, t.ws.data(), dh.data(), dw.data(), false)) return 1;
    }
    run(flce_distill_reduce, 1, rp);
    return distill_compare(t, loss, div, dh, dw, count, "");
}

/* The fp32 path under tensor parallelism (runtime/distill.c run_all with tp_fp32_sums): the vocab cut
 * into `shards`, each rank's logits passes over its columns, its teacher lse (flce_distill_lse), its
 * block (flce_distill_tp_pack; the CE term's label logit where it holds the label), the blocks
 * concatenated in rank order (the all-gather), each rank's merge, each rank's first read (tp_sums),
 * the sums added in rank order (the all-reduce), the second read (dZs, outputs); dHs summed over the
 * ranks, dWs each rank's rows. Rank 0's outputs against fp64 of the whole vocab, every rank's the
 * same bits. */
static int distill_tp_case(long long chunk, std::vector<long long> shards)
{
    const distill_data t = distill_make();
    const long long n = t.n, ds = t.ds, dt = t.dt, v = t.v;
    const int tp = (int)shards.size(), splits_s = 3, splits_t = 2;
    const long long words = FLCE_TP_HEADER + chunk * 4;
    struct rank_data {
        long long off, vr, ld;
        std::vector<float> zs, zt, dzb, pms, pss, pmt, pst, target, lse_t, lse_s, x, aw, lossrows, loss, div;
        float count = -1;
        flce_distill_params rp;
    };
    std::vector<rank_data> rk(tp);
    std::vector<float> gathered(tp * words, NAN), dh(n * ds), dw(v * ds, 0.f);
    long long off = 0;
    for (int r = 0; r < tp; r++) {
        rank_data &k = rk[r];
        k.off = off, k.vr = shards[r], k.ld = (k.vr + 7) / 8 * 8, off += k.vr;
        k.zs.assign(chunk * k.ld, NAN), k.zt.assign(chunk * k.ld, NAN), k.dzb.assign(chunk * k.ld, NAN);
        k.pms.resize(chunk * splits_s), k.pss.resize(chunk * splits_s), k.pmt.resize(chunk * splits_t);
        k.pst.resize(chunk * splits_t), k.target.assign(chunk, NAN), k.lse_t.resize(chunk), k.lse_s.resize(chunk);
        k.x.resize(chunk), k.aw.resize(2 * chunk), k.lossrows.resize(n), k.loss.resize(t.nl), k.div.resize(n);
        k.rp = {k.zs.data(), k.zt.data(), nullptr, k.pms.data(), k.pss.data(), k.pmt.data(), k.pst.data(),
                DISTILL_LABELS ? t.lab.data() : nullptr, t.go.data(), k.div.data(), k.lossrows.data(), k.loss.data(),
                &k.count, 0, 0, n, k.vr, -100, k.ld, splits_s, splits_t};
        k.rp.vocab_total = v, k.rp.target_s = k.target.data(), k.rp.lse_t = k.lse_t.data();
        k.rp.lse_s_rows = k.lse_s.data(), k.rp.x_rows = k.x.data(), k.rp.tp_aw = k.aw.data();
        k.rp.tp_recv = gathered.data();
        k.rp.vocab_offset = k.off, k.rp.tp_size = tp;
        run(flce_distill_count, 1, k.rp);
    }
    int flag[2] = {0, 0};
    for (long long r0 = 0; r0 < n; r0 += chunk) {
        const long long rows = n - r0 < chunk ? n - r0 : chunk, blocks = (rows + 255) / 256;
        for (int r = 0; r < tp; r++) {
            rank_data &k = rk[r];
            k.rp.row0 = r0, k.rp.rows = rows, k.rp.flag = flag;
            k.rp.tp_send = gathered.data() + r * (FLCE_TP_HEADER + rows * 4); // blocks of this chunk's rows
            gemm_nt(t.ht.data() + r0 * dt, t.wt.data() + k.off * dt, k.zt.data(), rows, k.vr, dt, k.ld);
            gemm_nt(t.hs.data() + r0 * ds, t.ws.data() + k.off * ds, k.zs.data(), rows, k.vr, ds, k.ld);
            logits_pass(k.zt.data(), k.pmt.data(), k.pst.data(), rows, k.vr, k.ld, splits_t);
            logits_pass(k.zs.data(), k.pms.data(), k.pss.data(), rows, k.vr, k.ld, splits_s);
            for (long long i = 0; i < rows; i++) { // the CE pass's label logit (at T), where this shard holds it
                const long long y = DISTILL_LABELS ? t.lab[r0 + i] - k.off : -1;
                k.target[i] = y >= 0 && y < k.vr ? k.zs[i * k.ld + y] : 0.f;
            }
            run(flce_distill_lse, blocks, k.rp);
            run(flce_distill_tp_pack, blocks, k.rp);
        }
        for (int r = 0; r < tp; r++) {
            rank_data &k = rk[r];
            run(flce_distill_tp_merge, blocks, k.rp);
            k.rp.tp_sums = 1;
            run(flce_distill_row, rows, k.rp);
            k.rp.tp_sums = 0;
        }
        sum_in_rank_order(rk, 2 * rows);
        for (int r = 0; r < tp; r++) {
            rank_data &k = rk[r];
            float *dz = (r0 / chunk) % 2 ? k.zs.data() : k.dzb.data();
            k.rp.dz = dz;
            run(flce_distill_row, rows, k.rp);
            if (grad_gemms(t, dz, r0, rows, k.vr, k.ld, t.ws.data() + k.off * ds, dh.data(), dw.data() + k.off * ds,
                           r > 0))
                return 1;
        }
    }
    int bad = flag[1] != 0;
    for (int r = 0; r < tp; r++) {
        run(flce_distill_reduce, 1, rk[r].rp);
        if (r > 0) bad += memcmp(rk[r].loss.data(), rk[0].loss.data(), 4 * t.nl) != 0 ||
                          memcmp(rk[r].div.data(), rk[0].div.data(), 4 * n) != 0;
    }
    char what[64];
    snprintf(what, sizeof what, "tp %d shards%s: ", tp, bad ? " (ranks differ or flag raised)" : "");
    return distill_compare(t, rk[0].loss, rk[0].div, dh, dw, rk[0].count, what) || bad;
}

#if DISTILL_DIV == 2
/* JSD's log-ratios against the mixture (distill_jsd_logs, argv[1] "jsdlogs") against long double on a
 * grid of log-probabilities from 0 to −200 and −inf on each side (|lq − lp| past fp32's exp range,
 * where the other term's weight is 0 in fp32), and NaN on either side staying NaN. Both −inf (a weight
 * of 0 on both sides, never read) is left out. */
static int jsd_logs_case()
{
    const float inf = INFINITY, grid[] = {0.f, -1e-3f, -0.7f, -5.f, -20.f, -60.f, -87.f, -88.f, -100.f, -200.f, -inf};
    const long double lb = logl((long double)DISTILL_BETA), l1b = log1pl(-(long double)DISTILL_BETA);
    int bad = 0, n = 0;
    for (float lp : grid)
        for (float lq : grid) {
            if (lp == -inf && lq == -inf) continue;
            const long double a = lb + lp, b = l1b + lq, hi = fmaxl(a, b), lo = fminl(a, b);
            const long double lm = hi + log1pl(expl(lo - hi)); // log(βp + (1−β)q), stable
            const long double ep = lp - lm, eq = lq - lm;
            float gp, gq;
            distill_jsd_logs(lp, lq, gp, gq);
            auto off = [](float got, long double want) {
                return std::isinf((double)want) ? got != (float)want : !(fabsl(got - want) <= 2e-6L * (1 + fabsl(want)));
            };
            n++;
            if ((off(gp, ep) || off(gq, eq)) && bad++ < 5)
                printf("lp %g lq %g: lp − log m %.9g vs %.9Lg, lq − log m %.9g vs %.9Lg\n", lp, lq, gp, ep, gq, eq);
        }
    for (float x : {-3.f, 0.f}) {
        float gp, gq;
        distill_jsd_logs(NAN, x, gp, gq);
        bad += !std::isnan(gp) || !std::isnan(gq);
        distill_jsd_logs(x, NAN, gp, gq);
        bad += !std::isnan(gp) || !std::isnan(gq);
        n += 2;
    }
    printf("jsd logs beta %g: %d pairs, %d off\n", (double)DISTILL_BETA, n, bad);
    return bad != 0;
}
#endif

int main(int argc, char **argv)
{
#if DISTILL_DIV == 2
    if (argc > 1 && !strcmp(argv[1], "jsdlogs")) return jsd_logs_case();
#endif
    if (argc > 1 && !strcmp(argv[1], "topkkl")) {
        int bad = 0;
        bad += topkkl_case(1, false);
        bad += topkkl_case(16, true);
        bad += topkkl_case(64, false);
        bad += topkkl_case(16, false, {30, 60}); // tensor parallelism: ids on both shards
        bad += topkkl_case(64, false, {20, 41, 29});
        return bad != 0;
    }
    if (argc > 1 && !strcmp(argv[1], "topk")) {
        int bad = 0;
        bad += topk_case(1000, 1, 3);
        bad += topk_case(1000, 64, 2);
        bad += topk_case(777, 17, 1);
        bad += topk_case(40, 40, 4); // k = V: the whole row, ordered
        bad += topk_case(5000, 64, 7);
        bad += topk_case(20000, 64, 3); // the shared ranking on distinct rows, the radix on tie rows
        return bad != 0;
    }
    if (argc > 1 && !strcmp(argv[1], "topktp")) {
        int bad = 0;
        bad += topk_tp_case("even", 1000, 64, {500, 500}, 2);
        bad += topk_tp_case("uneven", 777, 17, {300, 477}, 1);
        bad += topk_tp_case("k = a shard's vocab", 200, 40, {40, 160}, 3);
        bad += topk_tp_case("radix in a shard (tie rows)", 20000, 64, {12000, 8000}, 3);
        bad += topk_tp_case("3 ranks", 3001, 64, {1000, 900, 1101}, 2);
        bad += topk_tp_headers();
        return bad != 0;
    }
    const long long chunk = atoi(argv[1]);
    if (argc > 2 && !strcmp(argv[2], "tp")) { // the fp32 path under tensor parallelism: 2 and 3 shards
        int bad = 0;
        bad += distill_tp_case(chunk, {70, 80});
        bad += distill_tp_case(chunk, {41, 64, 45});
        return bad != 0;
    }
    return distill_case(chunk);
}
