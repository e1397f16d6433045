/* emu.cpp — runs templates/distill.cu's row kernels on the host (shim.h) the way runtime/distill.c
 * launches them (the same argument struct: chunks, row stride, count, rows, reduce), between
 * host fp32 GEMMs standing in for the CE path's (logits of both models at T into fp32 blocks of row
 * stride ld > V with per-split statistics, dHs and dWs from the dZs block), on small random fp32 data, and compares loss,
 * per-token divergence, dHs and dWs with testing/ref.c ref_distill in fp64. Odd chunks write dZs in
 * place of the student's logits (as fp32 calls do), even ones into a block of their own. The case is compiled in (distill_emu.sh writes k.cu: the generated
 * constants, then the template); argv[1] is the token chunk. Exit 0 when every error < 1e-5. */
#include "shim.h"
thread_local emu_dim threadIdx;
emu_dim emu_block, gridDim;
pthread_barrier_t emu_block_bar, emu_warp_bar[8];
float emu_shfl[256];
#include "k.cu"
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
extern "C" {
#include "ref.h"
}
/* One launch: 256 threads for the whole grid, walking the CTAs in order (a barrier between two). */
template <class P> struct job {
    void (*fn)(P);
    P p;
    unsigned tid;
    long long grid;
};
template <class P> static void *body(void *a)
{
    job<P> *j = (job<P> *)a;
    threadIdx = {j->tid, 0, 0};
    for (long long b = 0; b < j->grid; b++) {
        if (j->tid == 0) emu_block = {(unsigned)b, 0, 0};
        pthread_barrier_wait(&emu_block_bar);
        j->fn(j->p);
        pthread_barrier_wait(&emu_block_bar);
    }
    return nullptr;
}
template <class P> static void run(void (*fn)(P), long long grid, P p)
{
    gridDim = {(unsigned)grid, 1, 1};
    pthread_t th[256];
    static job<P> jobs[256];
    for (unsigned t = 0; t < 256; t++) {
        jobs[t] = {fn, p, t, grid};
        pthread_create(&th[t], nullptr, body<P>, &jobs[t]);
    }
    for (int t = 0; t < 256; t++) pthread_join(th[t], nullptr);
}
static double rnd() { return (rand() / (double)RAND_MAX - 0.5) * 2; }
/* flce_topk_row against a sort of fp64 logits (argv[1] "topk"): hidden and weight rows of width 16,
 * the stored logits their fp32 roundings at T, the exact top-k's raised by up to 1e-4 (as a GPU
 * pass's fp32 sums err: the kernel forms the k logits again in fp64 and corrects the lse; raised,
 * they stay the top k, and near ones change order there). Rows with ties (values on a coarse grid),
 * −inf, a NaN row, k from 1 to 64 and to the whole vocab; indices exact, log-probs and lse within
 * 1e-6 of fp64 (the stored logits' sums are fp32). */
static int topk_case(long long v, int k, int splits)
{
    const long long rows = 9, ld = (v + 7) / 8 * 8, row0 = 3, tokens = row0 + rows, d = 16;
    const float inv_temp = 1.f / 1.5f;
    std::vector<float> z(rows * ld, NAN), pm(rows * splits), ps(rows * splits), lse(tokens, -1.f), lp(tokens * k, -1.f);
    std::vector<float> h(tokens * d), w(v * d);
    std::vector<double> ze(rows * v);
    std::vector<long long> idx(tokens * k, -1);
    for (long long j = 0; j < v; j++) { // column 0 a coarse grid (the tie rows read it alone)
        w[j * d] = (float)(rand() % 7) * 0.75f;
        for (long long q = 1; q < d; q++) w[j * d + q] = (float)rnd();
    }
    for (long long r = 0; r < rows; r++)
        for (long long q = 0; q < d; q++) h[(row0 + r) * d + q] = r % 3 == 0 ? (q == 0) : q == 0 ? 0.f : (float)rnd() * 3;
    for (long long r = 0; r < rows; r++)
        for (long long j = 0; j < v; j++) {
            double a = 0;
            for (long long q = 0; q < d; q++) a += (double)h[(row0 + r) * d + q] * w[j * d + q];
            double x = a * inv_temp;
            if (r == 4 && j % 5 == 0) x = -INFINITY;
            if (r == 5 && j == v / 2) x = NAN;
            ze[r * v + j] = x, z[r * ld + j] = (float)x;
        }
    std::vector<std::vector<long long>> orders(rows);
    for (long long r = 0; r < rows; r++) {
        std::vector<long long> &order = orders[r];
        order.resize(v);
        for (long long j = 0; j < v; j++) order[j] = j;
        auto key = [&](long long j) { double x = ze[r * v + j]; return std::isnan(x) ? INFINITY : x; };
        std::stable_sort(order.begin(), order.end(), [&](long long a, long long b) {
            const bool na = std::isnan(ze[r * v + a]), nb = std::isnan(ze[r * v + b]);
            if (na != nb) return na;
            return key(a) > key(b);
        });
        if (r % 3 != 0) // the stored top k raised, as a pass's rounding might
            for (int q = 0; q < k; q++) {
                float &x = z[r * ld + order[q]];
                if (std::isfinite(x)) x += (float)(fabs(rnd()) * 1e-4);
            }
    }
    const long long per = (v + splits - 1) / splits;
    for (long long r = 0; r < rows; r++)
        for (int s = 0; s < splits; s++) { // as the logits epilogue (its sums in fp64 here: a GPU's tree sums err
            float m = -INFINITY;           // by ~1e-7, a serial fp32 sum of thousands by more); fmaxf leaves NaN
            double sum = 0;                // out, the sum keeps it
            for (long long j = s * per; j < v && j < (s + 1) * per; j++) m = fmaxf(m, z[r * ld + j]);
            for (long long j = s * per; j < v && j < (s + 1) * per; j++)
                sum += z[r * ld + j] == -INFINITY ? 0.0 : exp((double)z[r * ld + j] - m);
            pm[r * splits + s] = m, ps[r * splits + s] = (float)sum;
        }
    flce_topk_params tp = {z.data(), pm.data(), ps.data(), idx.data(), lp.data(), lse.data(), row0, v, ld, splits, k,
                           h.data(), w.data(), d, inv_temp};
    run(flce_topk_row, rows, tp);
    int bad = 0;
    for (long long r = 0; r < rows; r++) {
        const std::vector<long long> &order = orders[r];
        double m = -INFINITY, sum = 0; // the exact lse
        for (long long j = 0; j < v; j++) m = fmax(m, ze[r * v + j]);
        for (long long j = 0; j < v; j++) sum += exp(ze[r * v + j] - m);
        const double l = m + log(sum);
        const long long i = row0 + r;
        for (int q = 0; q < k; q++) {
            const long long want = order[q];
            if (idx[i * k + q] != want) {
                if (bad++ < 5) printf("row %lld rank %d: index %lld, want %lld\n", r, q, idx[i * k + q], want);
                continue;
            }
            const double e = ze[r * v + want] - l, got = lp[i * k + q];
            if (!(std::isnan(e) ? std::isnan(got) : got == e || fabs(got - e) <= 1e-6 * (1 + fabs(e))) && bad++ < 5)
                printf("row %lld rank %d: log-prob %.9g, want %.9g\n", r, q, got, e);
        }
        if (!(std::isnan(l) ? std::isnan(lse[i]) : fabs(lse[i] - l) <= 1e-6 * (1 + fabs(l))) && bad++ < 5)
            printf("row %lld: lse %.9g, want %.9g\n", r, lse[i], l);
    }
    for (long long i = 0; i < row0; i++) bad += lse[i] != -1.f || idx[i * k] != -1; // rows outside the chunk untouched
    printf("topk v=%lld k=%d splits=%d: %s\n", v, k, splits, bad ? "FAIL" : "ok");
    return bad;
}

/* flce_distill_row_topk (argv[1] "topkkl", in the forward-KL builds): the teacher given as each
 * token's k (id, log p) pairs — the k largest of a random teacher's log-softmax, in a shuffled
 * order — against the same formulas in double on the same fp32 student logits: D_i, loss_i (the
 * build's CE term, labels, reduction) and dZs, written beside the logits and in place of them. Token
 * 3 repeats an id and token 5 names one outside [0, V): their D and dZs rows must be NaN. */
static int topkkl_case(int k, bool in_place)
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
    const long long per = (v + splits - 1) / splits;
    for (long long i = 0; i < n; i++)
        for (int s = 0; s < splits; s++) {
            float m = -INFINITY, sum = 0.f;
            for (long long j = s * per; j < v && j < (s + 1) * per; j++) m = fmaxf(m, zs[i * ld + j]);
            for (long long j = s * per; j < v && j < (s + 1) * per; j++) sum += expf(zs[i * ld + j] - m);
            pm[i * splits + s] = m, ps[i * splits + s] = sum;
        }
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
    run(flce_distill_count, 1, rp);
    run(flce_distill_row_topk, n, rp);
    const float *dz = in_place ? zs.data() : dzb.data();
    int bad = 0;
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
    printf("topkkl k=%d %s: %s\n", k, in_place ? "in place" : "beside", bad ? "FAIL" : "ok");
    return bad;
}

int main(int argc, char **argv)
{
    pthread_barrier_init(&emu_block_bar, nullptr, 256);
    for (int w = 0; w < 8; w++) pthread_barrier_init(&emu_warp_bar[w], nullptr, 32);
    if (argc > 1 && !strcmp(argv[1], "topkkl")) {
        int bad = 0;
        bad += topkkl_case(1, false);
        bad += topkkl_case(16, true);
        bad += topkkl_case(64, false);
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
    const long long n = 40, ds = 24, dt = 32, v = 150, chunk = atoi(argv[1]);
    std::vector<float> hs(n * ds), ws(v * ds), ht(n * dt), wt(v * dt);
    std::vector<double> dhs(n * ds), dws(v * ds), dht(n * dt), dwt(v * dt);
    for (long long i = 0; i < n * ds; i++) hs[i] = rnd(), dhs[i] = hs[i];
    for (long long i = 0; i < v * ds; i++) ws[i] = rnd() * 0.6, dws[i] = ws[i];
    for (long long i = 0; i < n * dt; i++) ht[i] = rnd(), dht[i] = ht[i];
    for (long long i = 0; i < v * dt; i++) wt[i] = rnd() * 0.7, dwt[i] = wt[i];
    if (NANROW >= 0) ht[NANROW * dt + 2] = NAN, dht[NANROW * dt + 2] = NAN;
    std::vector<int> lab(n); std::vector<int64_t> lab64(n);
    for (long long i = 0; i < n; i++) { lab[i] = i % 7 == 3 ? -100 : rand() % v; lab64[i] = lab[i]; }
    const long long nl = FLCE_REDUCTION == 2 ? n : 1;
    std::vector<float> go(nl); std::vector<double> god(nl);
    for (long long i = 0; i < nl; i++) go[i] = 0.5f + (float)(rand() % 100) / 100, god[i] = go[i];
    const long long ld = (v + 7) / 8 * 8;
    std::vector<float> zs(chunk * ld, NAN), zt(chunk * ld, NAN), dzb(chunk * ld, NAN), dh(n * ds), dw(v * ds, 0.f),
        lossrows(n), loss(nl), div(n);
    float count = -1;
    // the logits passes' statistics: per (row, vocab split) max and Σ exp(z/T − max), the student's
    // vocab in 3 splits and the teacher's in 2 (as the CE logits kernel's gridDim.y)
    const int splits_s = 3, splits_t = 2;
    std::vector<float> pms(chunk * splits_s), pss(chunk * splits_s), pmt(chunk * splits_t), pst(chunk * splits_t);
    flce_distill_params rp = {zs.data(), zt.data(), nullptr, pms.data(), pss.data(), pmt.data(), pst.data(),
                              DISTILL_LABELS ? lab.data() : nullptr, go.data(), div.data(),
                              lossrows.data(), loss.data(), &count, 0, 0, n, v, -100, ld, splits_s, splits_t};
    // the logits kernel's epilogue: z/T in place, then each split's (max, Σ exp(z − max)), a NaN
    // anywhere in the split making Σ NaN (the max leaves it out, as fmaxf does)
    auto logits_pass = [&](float *z, float *pm, float *ps, long long rows, int splits) {
        const long long per = (v + splits - 1) / splits;
        for (long long i = 0; i < rows; i++) {
            for (long long j = 0; j < v; j++) z[i * ld + j] *= INV_TEMP;
            for (int k = 0; k < splits; k++) {
                float m = -INFINITY, sum = 0.f;
                for (long long j = k * per; j < v && j < (k + 1) * per; j++) m = fmaxf(m, z[i * ld + j]);
                for (long long j = k * per; j < v && j < (k + 1) * per; j++) sum += expf(z[i * ld + j] - m);
                pm[i * splits + k] = m, ps[i * splits + k] = sum;
            }
        }
    };
    // C[m × nn] (row stride ldc) = A[m × k] · B[nn × k]ᵀ in fp32, as the logits GEMM
    auto nt = [](const float *a, const float *b, float *c, long long m, long long nn, long long k, long long ldc) {
        for (long long i = 0; i < m; i++)
            for (long long j = 0; j < nn; j++) {
                float acc = 0.f;
                for (long long l = 0; l < k; l++) acc += a[i * k + l] * b[j * k + l];
                c[i * ldc + j] = acc;
            }
    };
    run(flce_distill_count, 1, rp);
    for (long long r0 = 0; r0 < n; r0 += chunk) {
        long long rows = n - r0 < chunk ? n - r0 : chunk;
        rp.row0 = r0, rp.rows = rows;
        nt(ht.data() + r0 * dt, wt.data(), zt.data(), rows, v, dt, ld);
        nt(hs.data() + r0 * ds, ws.data(), zs.data(), rows, v, ds, ld);
        logits_pass(zt.data(), pmt.data(), pst.data(), rows, splits_t);
        logits_pass(zs.data(), pms.data(), pss.data(), rows, splits_s);
        float *dz = (r0 / chunk) % 2 ? zs.data() : dzb.data();
        rp.dz = dz;
        run(flce_distill_row, rows, rp);
        for (long long i = 0; i < rows; i++) { // the padding is written (zeros): dH's loads read it
            for (long long j = v; j < ld; j++)
                if (dz[i * ld + j] != 0.f) { printf("padding (%lld, %lld) = %g\n", i, j, dz[i * ld + j]); return 1; }
            for (long long k = 0; k < ds; k++) { // dHs = dZs · Ws
                float acc = 0.f;
                for (long long j = 0; j < v; j++) acc += dz[i * ld + j] * ws[j * ds + k];
                dh[(r0 + i) * ds + k] = acc;
            }
        }
        for (long long j = 0; j < v; j++) // dWs += dZsᵀ · Hs
            for (long long k = 0; k < ds; k++) {
                float acc = 0.f;
                for (long long i = 0; i < rows; i++) acc += dz[i * ld + j] * hs[(r0 + i) * ds + k];
                dw[j * ds + k] += acc;
            }
    }
    run(flce_distill_reduce, 1, rp);
    ref_distill_problem p = {(ref_divergence)DIVP, BETAD, 1.0 / (double)INV_TEMP, (double)CE_WEIGHT, -100, (flce_reduction)FLCE_REDUCTION};
    std::vector<double> rl(nl), rdh(n * ds), rdw(v * ds);
    int rc = ref_distill(&p, n, ds, dt, v, dhs.data(), dws.data(), dht.data(), dwt.data(), DISTILL_LABELS ? lab64.data() : nullptr,
                         god.data(), rl.data(), rdh.data(), rdw.data());
    std::vector<double> gl(loss.begin(), loss.end()), gdh(dh.begin(), dh.end()), gdw(dw.begin(), dw.end());
    // per-token divergence via ref_distill_row
    std::vector<double> rdiv(n), gdiv(div.begin(), div.end()), zsr(v), ztr(v);
    for (long long i = 0; i < n; i++) {
        if (DISTILL_LABELS && lab[i] == -100) { rdiv[i] = 0; continue; }
        for (long long j = 0; j < v; j++) {
            double a = 0, b = 0;
            for (long long k = 0; k < ds; k++) a += dhs[i * ds + k] * dws[j * ds + k];
            for (long long k = 0; k < dt; k++) b += dht[i * dt + k] * dwt[j * dt + k];
            zsr[j] = a, ztr[j] = b;
        }
        ref_distill_row_out o;
        ref_distill_row(&p, v, zsr.data(), ztr.data(), DISTILL_LABELS ? lab64[i] : -1, &o, nullptr);
        rdiv[i] = o.divergence;
    }
    if (NANROW >= 0) {
        int bad = 0;
        for (long long i = 0; i < n; i++) {
            if (i == NANROW) { bad += !std::isnan(gdiv[i]) || !std::isnan(gdh[i * ds]); continue; }
            bad += !(fabs(gdiv[i] - rdiv[i]) <= 1e-4 * (1 + fabs(rdiv[i])));
            bad += ref_rel_l2(rdh.data() + i * ds, gdh.data() + i * ds, ds) > 1e-4;
        }
        printf("nan row %d: bad %d count %g\n", NANROW, bad, count);
        return bad != 0;
    }
    double el = ref_rel_l2(rl.data(), gl.data(), nl), ed = ref_rel_l2(rdiv.data(), gdiv.data(), n);
    double eh = ref_rel_l2(rdh.data(), gdh.data(), n * ds), ew = ref_rel_l2(rdw.data(), gdw.data(), v * ds);
    printf("rc %d count %g loss %g vs %g: loss %.2e div %.2e dh %.2e dw %.2e\n", rc, count, gl[0], rl[0], el, ed, eh, ew);
    return !(el < 1e-5 && ed < 1e-5 && eh < 1e-5 && ew < 1e-5);
}
